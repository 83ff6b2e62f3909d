"""Lengths and segment operators: lengths/segment-id bookkeeping, LengthsTile, the dense and sparse
lengths reductions (Lengths{Sum,Mean,Max}, SparseLengths{Sum,Mean,WeightedSum}) and SparseToDense. Semantics
follow Caffe2's utility_ops.h, lengths_tile_op.cc, segment_reduction_op.h, lengths_reducer_ops.h and
sparse_to_dense_op.h. Lengths are read on the host, as Caffe2 does; a reduction is one gather of the rows of
every segment into an (M, L) layout and one masked reduction. The gradient makers are declared with the ops;
what they emit is described in segment_grad.py, with the gradient kernels."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, ShapeError
from .index import (
    NOT_IN_PLACE, check_bounds, check_vector, float_data, known_lengths, read_lengths, require_int, spec_value,
    total)
from .base import host_ints, known_ints, on_device, out_spec, single_gradient
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op


def segment_layout(xp, lengths: list[int]):
    """For consecutive segments of the given lengths: an (M, L) matrix of positions (L = longest segment) and
    the mask of the real ones, so a segment reduction is one gather and one masked reduction."""
    width = max(lengths, default=0)
    starts = np.cumsum([0, *lengths])[:-1]
    pos = np.arange(width)
    mask = pos[None, :] < np.asarray(lengths, dtype=np.int64).reshape(-1, 1)
    rows = np.where(mask, starts.reshape(-1, 1) + pos[None, :], 0)
    return xp.asarray(rows.astype(np.int64)), xp.asarray(mask)


def reduce_rows(xp, data, rows, mask, kind: str, out_dtype, weights=None):
    """Reduce the rows of DATA picked by `rows` (M, L) under `mask` into M blocks shaped like DATA[0];
    `weights` (M, L) scale the picked rows first."""
    block = tuple(data.shape[1:])
    flat = xp.reshape(data, (data.shape[0], math.prod(block)))
    picked = xp.take(flat, rows, axis=0).astype(out_dtype)          # (M, L, D)
    keep = mask[:, :, None]
    if weights is not None:
        picked = picked * weights.astype(out_dtype)[:, :, None]
    counts = mask.sum(axis=1)
    if kind == "max":
        if rows.shape[1] == 0:
            out = xp.zeros((rows.shape[0], flat.shape[1]), dtype=out_dtype)
        else:
            out = xp.where(keep, picked, -np.inf).max(axis=1)
            out = xp.where(counts[:, None] > 0, out, 0).astype(out_dtype)   # an empty segment gives 0
    else:
        out = xp.where(keep, picked, 0).sum(axis=1).astype(out_dtype)
        if kind == "mean":
            out = out / xp.maximum(counts, 1).astype(out_dtype)[:, None]
    return xp.reshape(out, (rows.shape[0], *block))


def scatter_rows(xp, targets, values, n: int):
    """(n, *VALUES.shape[1:]) zeros with VALUES[k] added into row targets[k] (host ints in [0, n); duplicates
    sum): the rows sorted by target become segments, summed by reduce_rows, then written once each."""
    order = np.argsort(targets, kind="stable")
    unique, counts = np.unique(targets, return_counts=True)
    pos, mask = segment_layout(xp, counts.tolist())
    sums = reduce_rows(xp, values, xp.take(on_device(xp, order, np.int64), pos, axis=0), mask, "sum",
                       values.dtype)
    out = xp.zeros((n, *values.shape[1:]), dtype=values.dtype)
    if unique.size:
        out[on_device(xp, unique, np.int64)] = sums
    return out


# ------------------------------------------------------------------------------------- lengths / segments
@op("LengthsToSegmentIds", inputs=1, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT, grows="values",
    shape=lambda s: [out_spec((total(known_lengths(s[0], "lengths")),), np.int32)])
def lengths_to_segment_ids(xp, lengths):
    """[1, 3, 0, 2] -> int32 [0, 1, 1, 1, 3, 3]."""
    lens = read_lengths(lengths, "lengths")
    return on_device(xp, np.repeat(np.arange(len(lens)), lens), np.int32)


def _ranges_shape(specs):
    known_lengths(specs[0], "lengths")
    return [out_spec((specs[0].shape[0], 2), np.int32)]


@op("LengthsToRanges", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_ranges_shape)
def lengths_to_ranges(xp, lengths):
    """[1, 3, 0, 2] -> int32 (offset, length) rows [[0, 1], [1, 3], [4, 0], [4, 2]]."""
    lens = read_lengths(lengths, "lengths")
    offsets = np.cumsum([0, *lens])[:-1]
    pairs = np.stack([offsets, np.asarray(lens, dtype=np.int64)], axis=1).reshape(-1, 2)
    return on_device(xp, pairs, np.int32)


def _segment_count(segment_ids, data, read) -> int | None:
    """The number of segments: the second input's first dimension when given, else last id + 1 (None when
    that needs ids of unknown value); the ids are checked to be sorted and within it."""
    ss = tuple(segment_ids.shape)
    if not (len(ss) == 1 or (len(ss) == 2 and 1 in ss)):
        raise ShapeError(f"segment_ids must be a vector, got shape {ss}")
    ids = read(segment_ids, "segment_ids")
    prev = 0
    for i, v in enumerate(ids or ()):
        if v < prev:
            raise ShapeError(f"segment_ids must be sorted and non-negative: segment_ids[{i}] = {v} "
                             f"follows {prev}")
        prev = v
    count = None if ids is None else ids[-1] + 1 if ids else 0
    if data:
        if len(data[0].shape) < 1:
            raise ShapeError("the second input must be at least 1-D (its first dimension is the segment "
                             "count)")
        if count is not None and count > data[0].shape[0]:
            raise ShapeError(f"segment ids go up to {count - 1} but the second input has only "
                             f"{data[0].shape[0]} rows")
        count = data[0].shape[0]
    return count


@op("SegmentIdsToLengths", inputs=(1, 2), outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT,
    grows="values",
    shape=lambda s: [out_spec((_segment_count(s[0], s[1:], known_ints),), np.int32)])
def segment_ids_to_lengths(xp, segment_ids, *data):
    """Sorted segment ids -> int32 length of every segment; the number of segments is the second input's first
    dimension when given, else last id + 1."""
    count = _segment_count(segment_ids, data, host_ints)
    ids = np.asarray(host_ints(segment_ids, "segment_ids"), dtype=np.int64)
    return on_device(xp, np.bincount(ids, minlength=count), np.int32)


def _tile_rows(data, lengths, read) -> int | None:
    """LengthsTile's checks; the output's row count (None when the lengths are unknown)."""
    lens = read_lengths(lengths, "LENGTHS", read)
    if len(data.shape) < 1 or data.shape[0] != lengths.shape[0]:
        raise ShapeError(f"LENGTHS has {lengths.shape[0]} entries but DATA has shape {tuple(data.shape)}; "
                         "they must match in the first dimension")
    return total(lens)


@op("LengthsTile", inputs=2, outputs=1, inplace=NOT_IN_PLACE, gradient=single_gradient("LengthsSum", ["GO0", "I1"]),
    grows="values",
    shape=lambda s: [out_spec((_tile_rows(*s, known_ints), *s[0].shape[1:]), s[0].dtype)])
def lengths_tile(xp, data, lengths):
    """Repeat row i of DATA lengths[i] times."""
    _tile_rows(data, lengths, host_ints)
    return xp.repeat(data, host_ints(lengths, "LENGTHS"), axis=0)


def _segments_of(data, lengths, read) -> list[int] | None:
    """The checks of the dense lengths reductions; the lengths (None if unknown)."""
    float_data(data)
    lens = read_lengths(lengths, "LENGTHS", read)
    if lens is not None and sum(lens) != data.shape[0]:
        raise ShapeError(f"LENGTHS sum to {sum(lens)} but DATA has {data.shape[0]} rows (shape "
                         f"{tuple(data.shape)}); they must be equal")
    return lens


def _lengths_reduce(xp, data, lengths, kind):
    lens = _segments_of(data, lengths, host_ints)
    rows, mask = segment_layout(xp, lens)
    return reduce_rows(xp, data, rows, mask, kind, data.dtype)


def _lengths_reduce_shape(specs):
    data, lengths = specs
    _segments_of(data, lengths, known_ints)
    return [out_spec((lengths.shape[0], *data.shape[1:]), data.dtype)]


def _sparse_checks(data, indices, lengths, weights, read):
    """The checks of the sparse lengths reductions (bounds aside); the lengths (None if unknown) and the
    output dtype (half embeddings reduce to float)."""
    float_data(data)
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    lens = read_lengths(lengths, "LENGTHS", read)
    count = math.prod(indices.shape)
    if lens is not None and sum(lens) != count:
        raise ShapeError(f"LENGTHS sum to {sum(lens)} but there are {count} INDICES; they must be equal")
    if weights is not None:
        check_vector(weights, "WEIGHTS")
        if math.prod(weights.shape) != count:
            raise ShapeError(f"WEIGHTS has {math.prod(weights.shape)} entries but INDICES has {count}")
    return lens, (np.dtype(np.float32) if data.dtype == np.float16 else data.dtype)


def _sparse_reduce(xp, data, indices, lengths, kind, weights=None):
    lens, out_dtype = _sparse_checks(data, indices, lengths, weights, host_ints)
    check_bounds(xp, indices, data.shape[0], "INDICES", f" for DATA of shape {tuple(data.shape)}")
    pos, mask = segment_layout(xp, lens)
    w = None if weights is None else xp.take(weights, pos, axis=0)
    return reduce_rows(xp, data, xp.take(indices, pos, axis=0), mask, kind, out_dtype, w)


def _sparse_shape(specs):
    data, *weights, indices, lengths = specs
    _, dtype = _sparse_checks(data, indices, lengths, weights[0] if weights else None, known_ints)
    check_bounds(np, spec_value(indices), data.shape[0], "INDICES", f" for DATA of shape {tuple(data.shape)}")
    return [out_spec((lengths.shape[0], *data.shape[1:]), dtype)]


def _sparse_gradient(kind: str):
    """SparseLengths{Sum,Mean}(DATA, INDICES, LENGTHS): values op, then the slice (INDICES, values)."""
    def maker(g):
        values = g.I(0) + "_grad_values"
        g.op(f"SparseLengthsIndicesInGradient{kind}Gradient", [g.GO(0), g.I(2), g.I(1)], [values])
        g.set_sparse(0, g.I(1), values)
    maker.__name__ = f"sparse_lengths_{kind.lower()}_gradient"
    return maker


def _sparse_weighted_gradient(g):
    """SparseLengthsWeightedSum(DATA, WEIGHTS, INDICES, LENGTHS)."""
    values = g.I(0) + "_grad_values"
    if g.arg("grad_on_weights", 0):
        g.op("SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
             [g.I(1), g.GO(0), g.I(3), g.I(0), g.I(2)], [values, g.GI(1)])
    else:
        g.op("SparseLengthsIndicesInGradientWeightedSumGradient", [g.I(1), g.GO(0), g.I(3), g.I(2)], [values])
    g.set_sparse(0, g.I(2), values)


@op("LengthsSum", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_lengths_reduce_shape,
    gradient=single_gradient("LengthsIndicesInGradientSumGradient", ["GO0", "I1", "I0"]))
def lengths_sum(xp, data, lengths):
    """Sum of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "sum")


@op("LengthsMean", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_lengths_reduce_shape,
    gradient=single_gradient("LengthsIndicesInGradientMeanGradient", ["GO0", "I1", "I0"]))
def lengths_mean(xp, data, lengths):
    """Mean of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "mean")


@op("LengthsMax", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_lengths_reduce_shape,
    gradient=single_gradient("LengthsMaxWithMainInputAndForwardOutputGradient", ["O0", "GO0", "I1", "I0"]))
def lengths_max(xp, data, lengths):
    """Elementwise max of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "max")


@op("SparseLengthsSum", inputs=3, outputs=1, inplace=NOT_IN_PLACE, shape=_sparse_shape,
    gradient=_sparse_gradient("Sum"))
def sparse_lengths_sum(xp, data, indices, lengths):
    """Sum of DATA[INDICES[k]] over each run of lengths[i] consecutive indices (embedding bags)."""
    return _sparse_reduce(xp, data, indices, lengths, "sum")


@op("SparseLengthsMean", inputs=3, outputs=1, inplace=NOT_IN_PLACE, shape=_sparse_shape,
    gradient=_sparse_gradient("Mean"))
def sparse_lengths_mean(xp, data, indices, lengths):
    """Mean of DATA[INDICES[k]] over each run of lengths[i] consecutive indices."""
    return _sparse_reduce(xp, data, indices, lengths, "mean")


@op("SparseLengthsWeightedSum", inputs=4, outputs=1, inplace=NOT_IN_PLACE, args={"grad_on_weights": 0},
    gradient=_sparse_weighted_gradient,
    shape=lambda s, *, grad_on_weights: _sparse_shape(s))
def sparse_lengths_weighted_sum(xp, data, weights, indices, lengths, grad_on_weights):
    """Sum of WEIGHTS[k] * DATA[INDICES[k]] over each run of lengths[i] consecutive indices."""
    return _sparse_reduce(xp, data, indices, lengths, "sum", weights)


def _positional_shape(specs):
    data, weights, indices, lengths = specs
    lens, dtype = _sparse_checks(data, indices, lengths, None, known_ints)
    _positional_weights(weights, lens)
    check_bounds(np, spec_value(indices), data.shape[0], "INDICES", f" for DATA of shape {tuple(data.shape)}")
    return [out_spec((lengths.shape[0], *data.shape[1:]), dtype)]


def _positional_weights(weights, lens) -> None:
    check_vector(weights, "WEIGHT")
    if weights.dtype is not None and weights.dtype.kind != "f":
        raise ShapeError(f"WEIGHT must be a float vector, got {weights.dtype}")
    if lens and max(lens) > weights.shape[0]:
        raise ShapeError(f"WEIGHT has {weights.shape[0]} weights but a segment has {max(lens)} positions; give "
                         "one weight per position of the longest segment")


@op("SparseLengthsPositionalWeightedSum", inputs=4, outputs=1, inplace=NOT_IN_PLACE, shape=_positional_shape)
def sparse_lengths_positional_weighted_sum(xp, data, weights, indices, lengths):
    """Sum of WEIGHT[j] * DATA[INDICES[k]] over each run of lengths[i] consecutive indices, j the position of k
    within its run (LengthsRangeFill, Gather and SparseLengthsWeightedSum fused); no gradient, as in Caffe2."""
    lens, out_dtype = _sparse_checks(data, indices, lengths, None, host_ints)
    _positional_weights(weights, lens)
    check_bounds(xp, indices, data.shape[0], "INDICES", f" for DATA of shape {tuple(data.shape)}")
    pos, mask = segment_layout(xp, lens)
    w = xp.broadcast_to(weights[:pos.shape[1]].astype(out_dtype)[None, :], pos.shape)
    return reduce_rows(xp, data, xp.take(indices, pos, axis=0), mask, "sum", out_dtype, w)


def _dense_rows(indices, values, extra, output_first_dim, read) -> int | None:
    """SparseToDense's checks; the output's first dimension (None when it is max(INDICES) + 1 of unknown
    indices)."""
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    count = math.prod(indices.shape)
    if len(values.shape) < 1 or values.shape[0] != count:
        raise ShapeError(f"VALUES {tuple(values.shape)} must have one row per index ({count} INDICES)")
    ids = read(indices, "INDICES")
    if output_first_dim > 0:
        if extra:
            raise ArgumentError("give either output_first_dim or the data_to_infer_dim input, not both")
        return output_first_dim
    if extra:
        if len(extra[0].shape) < 1:
            raise ShapeError("data_to_infer_dim must be at least 1-D (its first dimension sizes the output)")
        return extra[0].shape[0]
    return None if ids is None else max(ids) + 1 if ids else 0


def _sparse_to_dense_shape(specs, *, output_first_dim, **_gather):
    indices, values, *extra = specs
    rows = _dense_rows(indices, values, extra, output_first_dim, known_ints)
    if rows is not None:
        check_bounds(np, spec_value(indices), rows, "INDICES", f" for an output with {rows} rows")
    return [out_spec((rows, *values.shape[1:]), values.dtype)]


# Gather's arguments are accepted and ignored: Gather's dense gradient is a SparseToDense that carries them.
GATHER_ARGS = {"axis": Arg("int", None), "dense_gradient": Arg("bool", None),
               "wrap_indices": Arg("bool", None), "match_outer": Arg("bool", None)}


@op("SparseToDense", inputs=(2, 3), outputs=1, inplace=NOT_IN_PLACE,
    args={"output_first_dim": 0, **GATHER_ARGS}, shape=_sparse_to_dense_shape, grows="values",
    gradient=single_gradient("Gather", ["GO0", "I0"], ["GI1"]))
def sparse_to_dense(xp, indices, values, *data_to_infer_dim, output_first_dim, **_gather):
    """Dense tensor with VALUES[k] added into row INDICES[k] (duplicates sum); its first dimension is
    output_first_dim, else the third input's first dimension, else max(INDICES) + 1."""
    rows = _dense_rows(indices, values, data_to_infer_dim, output_first_dim, host_ints)
    ids = np.asarray(host_ints(indices, "INDICES"), dtype=np.int64)
    check_bounds(xp, indices, rows, "INDICES", f" for an output with {rows} rows")
    return scatter_rows(xp, ids, values, rows)
