"""Segment reductions by sorted segment ids, the range reductions SortedSegmentRange{Sum,LogSumExp,LogMeanExp,
Mean,Max} with their gradient ops, and the segment-id checks the other segment reductions (segment_reducers.py)
share.

Semantics follow pytorch/pytorch caffe2/operators/segment_reduction_op.{h,cc} and reducer_functors.h: row i
of DATA belongs to segment SEGMENT_IDS[i]. The sorted ops need ids that start at 0 and step by 0 or 1 ("sorted
and without gaps"); the output has ids[-1] + 1 rows. The unsorted ops take ids in any order, with
num_segments rows (default max id + 1; segments without rows give 0). Ids are read on the host, as Caffe2
does, so the output's first dimension depends on their values.

Gradients, as Caffe2's makers emit them: SortedSegmentRange<R> -> SortedSegmentRange<R>Gradient(DATA, Y, dY,
SEGMENT_IDS) -> dDATA: Sum dY, Mean dY / length, LogSumExp dY exp(x - y), LogMeanExp dY exp(x - y) / length,
Max dY where x equals the segment's max (every tie gets it, as Caffe2's loop gives it).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from .base import check_float, host_ints, known_ints, on_device, out_spec, single_gradient, value_dependent
from .index import require_int
from .registry import op
from .segments import reduce_rows, segment_layout

RANGE_REDUCERS = ("Sum", "LogSumExp", "LogMeanExp", "Mean", "Max")


# --------------------------------------------------------------------------------------------- checks
def segment_id_values(segment_ids, rows, read, op_type):
    """SEGMENT_IDS checked to be an integer vector with one id per DATA row (rows: None to skip); its values
    (None when unknown)."""
    require_int(segment_ids, f"{op_type}: SEGMENT_IDS")
    if len(segment_ids.shape) != 1:
        raise ShapeError(f"{op_type}: SEGMENT_IDS must be a vector, got shape {tuple(segment_ids.shape)}")
    if rows is not None and segment_ids.shape[0] != rows:
        raise ShapeError(f"{op_type}: SEGMENT_IDS has {segment_ids.shape[0]} ids but DATA has {rows} rows; give "
                         "one id per row")
    return read(segment_ids, "SEGMENT_IDS")


def sorted_lengths(ids, op_type) -> list[int]:
    """The length of every segment of sorted ids without gaps (0, 0, 1, 2, 2, ...)."""
    if ids and ids[0] != 0:
        raise ShapeError(f"{op_type}: segment ids must be sorted and without gaps, starting at 0; the first is "
                         f"{ids[0]}")
    for i in range(1, len(ids)):
        if ids[i] - ids[i - 1] not in (0, 1):
            raise ShapeError(f"{op_type}: segment ids must be sorted and without gaps: SEGMENT_IDS[{i}] = "
                             f"{ids[i]} follows {ids[i - 1]}")
    return np.bincount(np.asarray(ids, dtype=np.int64), minlength=0).tolist() if ids else []


def data_rows(data, op_type) -> int:
    check_float(op_type, DATA=data)
    if len(data.shape) < 1:
        raise ShapeError(f"{op_type}: DATA must be at least 1-D, got a 0-D tensor")
    return data.shape[0]


def unsorted_count(ids, num_segments, op_type) -> int | None:
    """num_segments, or max id + 1; every id checked to lie in range."""
    if ids is None:
        return None if num_segments == -1 else num_segments
    count = num_segments if num_segments != -1 else max(ids, default=-1) + 1
    for i, v in enumerate(ids):
        if not 0 <= v < count:
            raise ShapeError(f"{op_type}: SEGMENT_IDS[{i}] = {v} is out of range 0..{count - 1}"
                             + (f" (num_segments={num_segments})" if num_segments != -1 else ""))
    return count


# --------------------------------------------------------------------------------------------- forward
def _sorted_shape(op_type):
    def shape(specs, **_):
        data, segment_ids = specs
        ids = segment_id_values(segment_ids, data_rows(data, op_type), known_ints, op_type)
        count = None if ids is None else len(sorted_lengths(ids, op_type))
        return [value_dependent((count, *data.shape[1:]), data.dtype)]
    return shape


def _log_exp(xp, data, rows, mask, mean: bool):
    """log(sum (or mean) of exp(x)) per segment, shifted by the segment's max."""
    block = tuple(data.shape[1:])
    flat = xp.reshape(data, (data.shape[0], math.prod(block)))
    picked = xp.take(flat, rows, axis=0)                                # (M, L, D)
    keep = mask[:, :, None]
    top = xp.where(keep, picked, -np.inf).max(axis=1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        total = xp.where(keep, xp.exp(picked - top[:, None, :]), 0).sum(axis=1)
        if mean:
            total = total / mask.sum(axis=1).astype(data.dtype)[:, None]
        out = xp.log(total) + top
    return xp.reshape(out.astype(data.dtype), (rows.shape[0], *block))


def _range_reduce(xp, data, segment_ids, kind, op_type):
    ids = segment_id_values(segment_ids, data_rows(data, op_type), host_ints, op_type)
    lengths = sorted_lengths(ids, op_type)
    if not lengths:
        return xp.zeros((0, *data.shape[1:]), dtype=data.dtype)
    rows, mask = segment_layout(xp, lengths)
    if kind in ("LogSumExp", "LogMeanExp"):
        return _log_exp(xp, data, rows, mask, kind == "LogMeanExp")
    return reduce_rows(xp, data, rows, mask, kind.lower(), data.dtype)


def _range_op(kind):
    op_type = f"SortedSegmentRange{kind}"

    def kernel(xp, data, segment_ids):
        return _range_reduce(xp, data, segment_ids, kind, op_type)

    kernel.__name__ = kernel.__qualname__ = f"sorted_segment_range_{kind.lower()}"
    what = {"Sum": "sum", "LogSumExp": "log of the sum of exp", "LogMeanExp": "log of the mean of exp",
            "Mean": "mean", "Max": "elementwise max"}[kind]
    op(op_type, inputs=2, outputs=1, inplace=(), shape=_sorted_shape(op_type),
       gradient=single_gradient(f"{op_type}Gradient", ["I0", "O0", "GO0", "I1"], reads_inputs=True),
       doc=f"The {what} of the DATA rows of each segment; SEGMENT_IDS sorted from 0 without gaps (every "
           "segment non-empty), ids[-1] + 1 rows out.")(kernel)


for _kind in RANGE_REDUCERS:
    _range_op(_kind)


# --------------------------------------------------------------------------------------------- gradients
def grad_checks(dy, segment_ids, read, op_type, sorted_ids):
    """The checks of the gradient ops; (ids, segment lengths or None)."""
    check_float(op_type, dY=dy)
    if len(dy.shape) < 1:
        raise ShapeError(f"{op_type}: dY must be at least 1-D (one row per segment)")
    ids = segment_id_values(segment_ids, None, read, op_type)
    if ids is None:
        return None, None
    if not sorted_ids:
        unsorted_count(ids, dy.shape[0], op_type)
        return ids, None
    lengths = sorted_lengths(ids, op_type)
    if ids and len(lengths) != dy.shape[0]:
        raise ShapeError(f"{op_type}: dY {tuple(dy.shape)} has {dy.shape[0]} rows but the segment ids make "
                         f"{len(lengths)} segments")
    return ids, lengths


def _range_grad_checks(x, y, dy, segment_ids, read, op_type):
    check_float(op_type, DATA=x, Y=y, dY=dy)
    ids, lengths = grad_checks(dy, segment_ids, read, op_type, True)
    if tuple(y.shape) != tuple(dy.shape) or tuple(x.shape) != (segment_ids.shape[0], *dy.shape[1:]):
        raise ShapeError(f"{op_type}: DATA {tuple(x.shape)}, Y {tuple(y.shape)} and dY {tuple(dy.shape)} do not "
                         f"fit {segment_ids.shape[0]} segment ids (DATA needs one row per id, Y the shape of dY)")
    return ids, lengths


def _range_grad(kind):
    op_type = f"SortedSegmentRange{kind}Gradient"

    def shape(specs):
        _range_grad_checks(*specs, known_ints, op_type)
        return [out_spec(specs[0].shape, specs[2].dtype)]

    def kernel(xp, x, y, dy, segment_ids):
        ids, lengths = _range_grad_checks(x, y, dy, segment_ids, host_ints, op_type)
        at = on_device(xp, ids, np.int64)
        g = xp.take(dy, at, axis=0)
        if kind in ("Mean", "LogMeanExp"):
            per_row = np.repeat(1.0 / np.maximum(np.asarray(lengths, dtype=np.float64), 1), lengths)
            g = g * on_device(xp, per_row, dy.dtype).reshape((-1,) + (1,) * (dy.ndim - 1))
        if kind in ("LogSumExp", "LogMeanExp"):
            with np.errstate(over="ignore", invalid="ignore"):
                g = g * xp.exp(x - xp.take(y, at, axis=0))
        if kind == "Max":
            g = xp.where(x == xp.take(y, at, axis=0), g, dy.dtype.type(0))
        return g.astype(dy.dtype)

    kernel.__name__ = kernel.__qualname__ = f"sorted_segment_range_{kind.lower()}_gradient"
    op(op_type, inputs=4, outputs=1, inplace=(), shape=shape,
       doc=f"DATA, Y, dY, SEGMENT_IDS -> dDATA of SortedSegmentRange{kind}.")(kernel)


for _kind in RANGE_REDUCERS:
    _range_grad(_kind)
