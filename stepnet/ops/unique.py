"""Unique: the distinct values of an index vector, and optionally where each input value went.

Semantics from caffe2/operators/utility_ops.{h,cc} (UniqueOp, CPU): int32 or int64 indices, a vector; the
distinct values come out sorted ascending (Caffe2 promises no order, and its CPU kernel sorts), in the input's
dtype; the optional second output is an int32 vector like the input with REMAPPING[i] the position of
INDICES[i] among them, so Gather(UNIQUE, REMAPPING) gives INDICES back. Caffe2 declares no gradient
(SHOULD_NOT_DO_GRADIENT). Its shape inference knows the first output's length only for inputs of 0 or 1
values; here a known input value gives it too.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .base import out_spec, value_dependent
from .registry import SHOULD_NOT_DO_GRADIENT, op


def _check(indices) -> None:
    if indices.dtype is not None and indices.dtype not in (np.int32, np.int64):
        raise DTypeError(f"Unique needs int32 or int64 indices, got {indices.dtype}; Cast them first")
    if len(indices.shape) != 1:
        raise ShapeError(f"Unique: indices must be a vector, got shape {tuple(indices.shape)}")


def _unique_shape(specs):
    x = specs[0]
    _check(x)
    n = x.shape[0]
    if x.value is not None:
        count = np.unique(np.asarray(x.value)).size
    else:
        count = n if n <= 1 else None
    return [value_dependent((count,), x.dtype), out_spec(x.shape, np.int32)]


@op("Unique", inputs=1, outputs=(1, 2), inplace=(), shape=_unique_shape, gradient=SHOULD_NOT_DO_GRADIENT)
def unique(xp, indices):
    """INDICES (int32/int64 vector) -> its distinct values sorted ascending, and the int32 REMAPPING with
    UNIQUE[REMAPPING[i]] == INDICES[i]."""
    _check(indices)
    values, remapping = xp.unique(indices, return_inverse=True)
    return values.astype(indices.dtype), remapping.reshape(-1).astype(np.int32)
