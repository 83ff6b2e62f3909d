"""Gradient ops of the lengths and segment operators (segments.py, where the makers are), which emit what the
later Caffe2's makers emit (LengthsOpGetGradient in segment_reduction_op.h, registered by segment_reduction_op.cc and
lengths_reducer_ops.cc; lengths_tile_op.cc; sparse_to_dense_op.cc):

- LengthsSum / LengthsMean -> Lengths{IndicesInGradient}{Sum,Mean}Gradient([dY, LENGTHS, DATA]) -> dDATA (DATA
  stands in for the indices the CUDA kernels want; the 2017 LengthsMean emitted LengthsMeanGradient([dY,
  LENGTHS])).
- LengthsMax -> LengthsMaxWithMainInputAndForwardOutputGradient([Y, dY, LENGTHS, DATA]) -> dDATA: dY goes to
  every element equal to its segment's max (ties all get it).
- SparseLengthsSum / SparseLengthsMean -> SparseLengthsIndicesInGradient{Sum,Mean}Gradient([dY, LENGTHS,
  INDICES]) -> "<DATA>_grad_values"; DATA's gradient is the GradientSlice (INDICES, those values).
- SparseLengthsWeightedSum -> SparseLengthsIndicesInGradientWeightedSumGradient([WEIGHTS, dY, LENGTHS,
  INDICES]) -> values; with grad_on_weights=1 the ...WeightedSumWithMainInputGradient([WEIGHTS, dY, LENGTHS,
  DATA, INDICES]) -> [values, dWEIGHTS] instead. DATA's gradient is sparse as above.
- LengthsTile -> LengthsSum([dY, LENGTHS]) -> dDATA; SparseToDense -> Gather([dY, INDICES]) -> dVALUES.

The gradient ops without "IndicesInGradient" (the 2-input forms older nets hold) are registered too; the
index input of the others is not read on the CPU, as in Caffe2. LengthsToSegmentIds and SegmentIdsToLengths
are SHOULD_NOT_DO_GRADIENT; LengthsToRanges has no gradient registered (as in Caffe2).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from .index import NOT_IN_PLACE, check_bounds, check_vector, read_lengths, require_int, total
from .base import check_float, host_ints, known_ints, on_device, out_spec
from .registry import op


# --------------------------------------------------------------------------------------------- kernels
def _segments(go, lengths, read) -> list[int] | None:
    """The checks every lengths gradient shares: LENGTHS a non-negative vector and one dY row per segment.
    The lengths (None when a spec's value is unknown)."""
    lens = read_lengths(lengths, "LENGTHS", read)
    if len(go.shape) < 1 or go.shape[0] != lengths.shape[0]:
        raise ShapeError(f"dY {tuple(go.shape)} must have one row per segment ({lengths.shape[0]} LENGTHS); "
                         "pass the gradient of the reduction's output")
    return lens


def _per_position(what: str, t, lens) -> None:
    """t has one row per reduced position (sum(LENGTHS) rows)."""
    if lens is not None and (len(t.shape) < 1 or t.shape[0] != sum(lens)):
        raise ShapeError(f"{what} {tuple(t.shape)} must have one row per position: LENGTHS sum to "
                         f"{sum(lens)}")


def _spread(xp, go, lens, scale=None):
    """Row k is dY of the segment holding position k, times scale[k] when given (a vector on the device)."""
    seg = np.repeat(np.arange(len(lens)), lens)
    rows = xp.take(go, on_device(xp, seg, np.int64), axis=0)
    if scale is None:
        return rows
    return rows * xp.reshape(scale.astype(go.dtype, copy=False), (-1,) + (1,) * (go.ndim - 1))


def _mean_scale(xp, lens, dtype):
    """1 / length of each position's segment."""
    return on_device(xp, np.repeat(1.0 / np.maximum(np.asarray(lens, dtype=np.float64), 1.0), lens), dtype)


def _scaled_by_floats(kind: str, go) -> None:
    """A mean's or weighted sum's dY is float (it is scaled: Caffe2 registers these gradients for float)."""
    if kind != "Sum":
        check_float(f"the gradient of a segment {'mean' if kind == 'Mean' else 'weighted sum'}", dY=go)


def _plain_shape(kind: str):
    def shape(specs, **_):
        if kind == "WeightedSum":
            weights, go, lengths = specs[:3]
        else:
            go, lengths = specs[:2]
        _scaled_by_floats(kind, go)
        lens = _segments(go, lengths, known_ints)
        if kind == "WeightedSum":
            check_vector(weights, "WEIGHTS")
            _per_position("WEIGHTS", weights, lens)
        return [out_spec((total(lens), *go.shape[1:]), go.dtype)]
    return shape


def _plain_kernel(kind: str):
    """[(WEIGHTS,) dY, LENGTHS, (INDICES)] -> the gradient of every reduced position."""
    def kernel(xp, *inputs, **_):
        if kind == "WeightedSum":
            weights, go, lengths = inputs[:3]
            _scaled_by_floats(kind, go)
            lens = _segments(go, lengths, host_ints)
            check_vector(weights, "WEIGHTS")
            _per_position("WEIGHTS", weights, lens)
            return _spread(xp, go, lens, weights)
        go, lengths = inputs[:2]
        _scaled_by_floats(kind, go)
        lens = _segments(go, lengths, host_ints)
        return _spread(xp, go, lens, _mean_scale(xp, lens, go.dtype) if kind == "Mean" else None)
    kernel.__doc__ = {"Sum": "dY of each segment copied to each of its positions.",
                      "Mean": "dY of each segment divided by its length, at each of its positions.",
                      "WeightedSum": "dY of each segment times each position's weight."}[kind]
    return kernel


for _kind in ("Sum", "Mean", "WeightedSum"):
    _args = {"grad_on_weights": 0} if _kind == "WeightedSum" else {}
    _base = 3 if _kind == "WeightedSum" else 2
    for _name, _n in ((f"Lengths{_kind}Gradient", _base),
                      (f"LengthsIndicesInGradient{_kind}Gradient", _base + 1),
                      (f"SparseLengths{_kind}Gradient", _base),
                      (f"SparseLengthsIndicesInGradient{_kind}Gradient", _base + 1)):
        if _name.startswith("Lengths") and _kind == "WeightedSum":
            continue   # stepnet has no LengthsWeightedSum
        op(_name, inputs=_n, outputs=1, inplace=NOT_IN_PLACE, args=_args, shape=_plain_shape(_kind))(
            _plain_kernel(_kind))


def _main_input_checks(weights, go, lengths, data, indices, read):
    """SparseLengths...WeightedSumWithMainInputGradient's checks; the lengths (None if unknown)."""
    lens = _segments(go, lengths, read)
    check_vector(weights, "WEIGHTS")
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    _per_position("WEIGHTS", weights, lens)
    _per_position("INDICES", indices, lens)
    if len(data.shape) < 1 or tuple(data.shape[1:]) != tuple(go.shape[1:]):
        raise ShapeError(f"DATA {tuple(data.shape)} and dY {tuple(go.shape)} must agree after the first "
                         "dimension")
    return lens


def _main_input_shape(specs, **_):
    weights, go, lengths, data, indices = specs
    _main_input_checks(weights, go, lengths, data, indices, known_ints)
    return [out_spec((indices.shape[0], *go.shape[1:]), go.dtype), out_spec(weights.shape, go.dtype)]


def _weighted_sum_with_main_input(xp, weights, go, lengths, data, indices, **_):
    """[WEIGHTS, dY, LENGTHS, DATA, INDICES] -> (dY of each position's segment times its weight, and the
    weights' gradient: that dY dotted with the DATA row the position picked)."""
    lens = _main_input_checks(weights, go, lengths, data, indices, host_ints)
    check_bounds(xp, indices, data.shape[0], "INDICES", f" for DATA of shape {tuple(data.shape)}")
    rows = _spread(xp, go, lens)
    n = rows.shape[0]
    block = math.prod(data.shape[1:])       # (not -1: reshaping 0 rows needs the block size)
    picked = xp.take(xp.reshape(data, (data.shape[0], block)), indices, axis=0).astype(go.dtype, copy=False)
    d_weights = (xp.reshape(rows, (n, block)) * picked).sum(axis=1)
    return _spread(xp, go, lens, weights), d_weights.astype(go.dtype, copy=False)


for _name in ("SparseLengthsWeightedSumWithMainInputGradient",
              "SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient"):
    op(_name, inputs=5, outputs=2, inplace=NOT_IN_PLACE, args={"grad_on_weights": 0},
       shape=_main_input_shape)(_weighted_sum_with_main_input)


def _max_checks(out, go, lengths, data, read):
    lens = _segments(go, lengths, read)
    if tuple(out.shape) != tuple(go.shape):
        raise ShapeError(f"the forward output {tuple(out.shape)} and dY {tuple(go.shape)} must have one "
                         "shape")
    _per_position("DATA", data, lens)
    if tuple(data.shape[1:]) != tuple(go.shape[1:]):
        raise ShapeError(f"DATA {tuple(data.shape)} and dY {tuple(go.shape)} must agree after the first "
                         "dimension")
    return lens


def _max_shape(specs):
    _max_checks(*specs, known_ints)
    return [out_spec(specs[3].shape, specs[1].dtype)]


@op("LengthsMaxWithMainInputAndForwardOutputGradient", inputs=4, outputs=1, inplace=NOT_IN_PLACE,
    shape=_max_shape)
def lengths_max_gradient(xp, out, go, lengths, data):
    """[Y, dY, LENGTHS, DATA] -> dDATA: each element equal to its segment's max gets the segment's dY, the
    others 0 (every tied element gets it, as in Caffe2's MaxReducerGradient)."""
    lens = _max_checks(out, go, lengths, data, host_ints)
    hit = data == _spread(xp, out, lens)
    return xp.where(hit, _spread(xp, go, lens), xp.zeros((), dtype=go.dtype)).astype(go.dtype, copy=False)
