"""Looking values up by key or by row: Find and GatherFused8BitRowwise.

Find (Caffe2's find_op.h) gives, for every query element, the last position of that value in the INDEX
vector, or `missing_value` (-1) where it does not occur; INDEX and the queries are int32 or int64 of one type,
and so is the result. Caffe2 registers no gradient for it.

GatherFused8BitRowwise follows facebookarchive/caffe2's gather_fused_8bit_rowwise_op.h (the version its
gather_ops_test.py checks): the rows of a fused 8-bit tensor (FloatToFused8BitRowwiseQuantized's uint8 rows:
codes, then a float32 scale and bias) picked by INDICES and dequantized, scale * code + bias, to float32 rows
of cols - 8 values. (PyTorch-era Caffe2 later made it copy the fused rows without dequantizing.) No gradient
is registered for it.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import DTypeError, ShapeError
from .base import like, on_device, out_spec
from .fused_rowwise import dequantize_rows, fused_input
from .index import check_bounds, check_vector, require_int
from .registry import op


# --------------------------------------------------------------------------------------------- Find
def _find_checks(index, query) -> None:
    for what, t in (("INDEX", index), ("query", query)):
        if t.dtype is not None and t.dtype.name not in ("int32", "int64"):
            raise DTypeError(f"Find: {what} must be int32 or int64, got {t.dtype}")
    if index.dtype is not None and query.dtype is not None and index.dtype != query.dtype:
        raise DTypeError(f"Find: INDEX is {index.dtype} but the query is {query.dtype}; they must share one type")


def _find_shape(specs, *, missing_value):
    _find_checks(*specs)
    return [like(specs[1], specs[0].dtype)]


@op("Find", inputs=2, outputs=1, inplace=(), args={"missing_value": -1}, shape=_find_shape)
def find(xp, index, query, *, missing_value):
    """For each query element, the last position of its value in INDEX (flattened), else missing_value;
    shaped like the query, of INDEX's type."""
    _find_checks(index, query)
    keys = np.asarray(backend.to_host(index)).reshape(-1)
    wanted = np.asarray(backend.to_host(query))
    if keys.size == 0:
        return on_device(xp, np.full(wanted.shape, missing_value), index.dtype)
    order = np.argsort(keys, kind="stable")             # equal keys keep their order: the last one is the last
    ordered = keys[order]
    at = np.maximum(np.searchsorted(ordered, wanted, side="right") - 1, 0)
    return on_device(xp, np.where(ordered[at] == wanted, order[at], missing_value), index.dtype)


# --------------------------------------------------------------------------------------------- fused gather
SCALE_BIAS_BYTES = 8     # a float32 scale and a float32 bias end each fused row


def _gather_fused_checks(data, indices) -> None:
    fused_input(data, "GatherFused8BitRowwise")
    if len(data.shape) != 2:
        raise ShapeError(f"GatherFused8BitRowwise: DATA must be a matrix of fused rows, got shape "
                         f"{tuple(data.shape)}")
    if data.shape[1] <= SCALE_BIAS_BYTES:
        raise ShapeError(f"GatherFused8BitRowwise: DATA rows have {data.shape[1]} bytes; a fused 8-bit row has "
                         f"more than {SCALE_BIAS_BYTES} (codes, then a float32 scale and bias)")
    require_int(indices, "GatherFused8BitRowwise: INDICES")
    check_vector(indices, "GatherFused8BitRowwise: INDICES")


def _gather_fused_shape(specs):
    data, indices = specs
    _gather_fused_checks(data, indices)
    if indices.value is not None:
        check_bounds(np, np.asarray(indices.value), data.shape[0], "GatherFused8BitRowwise: INDICES")
    return [out_spec((indices.shape[0], data.shape[1] - SCALE_BIAS_BYTES), np.float32)]


@op("GatherFused8BitRowwise", inputs=2, outputs=1, inplace=(), shape=_gather_fused_shape,
    shapes_from_inputs=True)
def gather_fused_8bit_rowwise(xp, data, indices):
    """The fused rows of DATA at INDICES, dequantized: float32 (len(INDICES), cols - 8)."""
    _gather_fused_checks(data, indices)
    check_bounds(xp, indices, data.shape[0], "GatherFused8BitRowwise: INDICES")
    rows = xp.take(data, indices.astype(np.int64), axis=0)
    return dequantize_rows(xp, rows, 8, np.float32)
