"""Picking elements by value or by indicator: TopK (+ TopKGradient), FlexibleTopK (+ FlexibleTopKGradient),
RowWiseArgMax and FillExamplesWithIndicator.

TopK follows pytorch/pytorch caffe2/operators/top_k.cc: the k largest elements along `axis` (default the
last), largest first, equal values in index order; k > the axis length pads values with 0 and indices with
-1; k comes from the argument or, when the argument is absent (-1), from an int64 input 1 read on the host.
Indices are int64; an optional third output holds each picked element's index into the flattened input. The
output shapes depend on k's value when it is an input. TopK's gradient is TopKGradient(dValues, Indices, X)
-> dX, dValues scattered back into zeros shaped like X.

FillExamplesWithIndicator(DATA, INDICATOR) is Facebook's op that Glow imports (it is not in the open Caffe2
tree): row i of the output is the next row of DATA where INDICATOR[i] is non-zero, zeros elsewhere. No
gradient is registered for it here (its Caffe2 registration is not public).

FlexibleTopK (flexible_top_k.cc) picks a different number of elements from each row (last dimension) of a
float X: K (int64, one k in 1..r per row) says how many; the values and int64 in-row indices of all rows come
out concatenated (sum(K) elements), ordered as TopK's. FlexibleTopKGradient(X, K, dValues, Indices) scatters
dValues back into zeros shaped like X. RowWiseArgMax (arg_max_op.cc) gives the int32 column of each float32
row's first maximum as an (N, 1) tensor; Caffe2 registers no gradient for it.
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import (
    canonical_axis, check_dims, check_float, host_ints, known_ints, like, on_device, out_spec, single_gradient,
    value_dependent)
from .registry import NO_GRADIENT, op


# --------------------------------------------------------------------------------------------- TopK
def _k_of(k, k_input, read):
    """k from the argument, else from input 1 (None when that input's value is unknown)."""
    if k == -1 and k_input:
        t = k_input[0]
        if t.dtype is not None and t.dtype.kind not in "iu":
            raise DTypeError(f"TopK input 1 (k) must hold an integer (int64), got {t.dtype}")
        if math.prod(t.shape) < 1:
            raise ShapeError("TopK input 1 (k) is empty; it must hold k")
        values = read(t, "TopK input 1 (k)")
        if values is None:
            return None
        k = values[0]
    if k < 1:
        where = "argument k" if not k_input or k != -1 else "argument k (and input 1)"
        raise ArgumentError(f"TopK needs k >= 1, got {k} from {where}; give k as an argument or as input 1")
    return k


def _topk_geometry(x, axis):
    """(prev, n, next, canonical axis) of X around `axis`."""
    check_float("TopK", X=x)
    if len(x.shape) < 1:
        raise ShapeError("TopK needs an input of at least 1 dimension, got a 0-D tensor")
    ax = canonical_axis(axis, len(x.shape))
    return math.prod(x.shape[:ax]), x.shape[ax], math.prod(x.shape[ax + 1:]), ax


def _topk_shape(specs, *, k, axis):
    x, *k_input = specs
    _, _, _, ax = _topk_geometry(x, axis)
    k = _k_of(k, k_input, known_ints)
    dims = tuple(x.shape[:ax]) + (k,) + tuple(x.shape[ax + 1:])
    if k is not None and None not in dims:
        check_dims(dims, f"TopK's outputs for k={k}: shape")
    flat = None if k is None else math.prod(dims)
    return [value_dependent(dims, x.dtype), value_dependent(dims, np.int64), value_dependent((flat,), np.int64)]


@op("TopK", inputs=(1, 2), outputs=(2, 3), inplace=(), host_inputs=(1,), args={"k": -1, "axis": -1},
    shape=_topk_shape, gradient=single_gradient("TopKGradient", ["GO0", "O1", "I0"]))
def top_k(xp, x, *k_input, k, axis):
    """Values (largest first; ties by lower index) and int64 Indices of the k largest elements of X along
    `axis`, and their int64 indices into the flattened X; padded with 0 / -1 where k exceeds the axis."""
    prev, n, nxt, ax = _topk_geometry(x, axis)
    k = _k_of(k, k_input, host_ints)
    check_dims(tuple(x.shape[:ax]) + (k,) + tuple(x.shape[ax + 1:]), f"TopK's outputs for k={k}: shape")
    kept = min(k, n)
    x3 = x.reshape(prev, n, nxt)
    order = xp.argsort(-x3, axis=1, kind="stable")[:, :kept, :]               # (prev, kept, next)
    values = xp.zeros((prev, k, nxt), dtype=x.dtype)
    indices = xp.full((prev, k, nxt), -1, dtype=np.int64)
    flat = xp.full((prev, k, nxt), -1, dtype=np.int64)
    values[:, :kept, :] = xp.take_along_axis(x3, order, axis=1)
    indices[:, :kept, :] = order
    rows = on_device(xp, np.arange(prev).reshape(-1, 1, 1) * n, np.int64)
    cols = on_device(xp, np.arange(nxt).reshape(1, 1, -1), np.int64)
    flat[:, :kept, :] = (rows + order) * nxt + cols
    dims = tuple(x.shape[:ax]) + (k,) + tuple(x.shape[ax + 1:])
    return values.reshape(dims), indices.reshape(dims), flat.reshape(-1)


def _topk_grad_geometry(values, indices, x, axis):
    check_float("TopKGradient", dValues=values, X=x)
    if indices.dtype is not None and indices.dtype.kind not in "iu":
        raise DTypeError(f"TopKGradient: Indices must be int64 (TopK's output 1), got {indices.dtype}")
    if len(values.shape) != len(x.shape) or len(values.shape) < 1:
        raise ShapeError(f"TopKGradient: dValues {tuple(values.shape)} and X {tuple(x.shape)} must have the same "
                         "number of dimensions (at least 1)")
    ax = canonical_axis(axis, len(x.shape))
    other = tuple(values.shape[:ax]) + tuple(values.shape[ax + 1:])
    if other != tuple(x.shape[:ax]) + tuple(x.shape[ax + 1:]) or tuple(indices.shape) != tuple(values.shape):
        raise ShapeError(f"TopKGradient: dValues {tuple(values.shape)}, Indices {tuple(indices.shape)} and X "
                         f"{tuple(x.shape)} must agree except on axis {ax}, where Indices match dValues")
    return math.prod(x.shape[:ax]), x.shape[ax], values.shape[ax], math.prod(x.shape[ax + 1:])


def _check_picks(idx, n: int) -> None:
    """Indices in -1..n-1 (-1: TopK's padding); idx an array on any device."""
    if idx.size and bool(((idx < -1) | (idx >= n)).any()):
        raise ShapeError(f"TopKGradient: Indices hold values outside -1..{n - 1} (the axis of X has {n} elements)")


def _topk_grad_shape(specs, *, axis, k):
    _, n, _, _ = _topk_grad_geometry(*specs, axis)
    if specs[1].value is not None:
        _check_picks(np.asarray(specs[1].value), n)
    return [out_spec(specs[2].shape, specs[0].dtype)]


@op("TopKGradient", inputs=3, outputs=1, inplace=(), args={"axis": -1, "k": -1}, shape=_topk_grad_shape)
def top_k_gradient(xp, values, indices, x, *, axis, k):
    """dValues, Indices, X -> dX: zeros shaped like X with dValues written at the picked positions (indices
    of -1, TopK's padding, are skipped). k (copied from TopK by the maker) is not read: dValues has it."""
    prev, n, k, nxt = _topk_grad_geometry(values, indices, x, axis)
    idx = indices.reshape(prev, k, nxt).astype(np.int64)
    _check_picks(idx, n)
    rows = on_device(xp, np.arange(prev).reshape(-1, 1, 1) * n, np.int64)
    cols = on_device(xp, np.arange(nxt).reshape(1, 1, -1), np.int64)
    dump = prev * n * nxt                                           # padded picks land in one extra slot
    flat = xp.where(idx >= 0, (rows + idx) * nxt + cols, dump).reshape(-1)
    out = xp.zeros(dump + 1, dtype=values.dtype)
    out[flat] = values.reshape(-1)
    return out[:dump].reshape(x.shape)


# --------------------------------------------------------------------------------------------- indicator
def _flags(x) -> list[bool]:
    """INDICATOR's values as host booleans (an array on any device, or a spec's known value)."""
    return [bool(v) for v in x.reshape(-1).tolist()]


def _indicator_checks(data, indicator, flags) -> None:
    if indicator.dtype is not None and indicator.dtype.kind not in "iub":
        raise DTypeError(f"FillExamplesWithIndicator: INDICATOR must be int32, int64 or bool, got {indicator.dtype}")
    if len(indicator.shape) != 1:
        raise ShapeError(f"FillExamplesWithIndicator: INDICATOR must be a 1-D vector, got shape "
                         f"{tuple(indicator.shape)}")
    if len(data.shape) < 1:
        raise ShapeError("FillExamplesWithIndicator: DATA must be at least 1-D (one row per example)")
    if flags is not None and sum(flags) != data.shape[0]:
        raise ShapeError(f"FillExamplesWithIndicator: INDICATOR has {sum(flags)} non-zero entries but DATA "
                         f"{tuple(data.shape)} has {data.shape[0]} rows; they must be equal")


def _indicator_shape(specs):
    data, indicator = specs
    _indicator_checks(data, indicator, None if indicator.value is None else _flags(np.asarray(indicator.value)))
    return [out_spec((indicator.shape[0], *data.shape[1:]), data.dtype)]


@op("FillExamplesWithIndicator", inputs=2, outputs=1, inplace=(), shape=_indicator_shape)
def fill_examples_with_indicator(xp, data, indicator):
    """(len(INDICATOR), *DATA.shape[1:]): the rows of DATA, in order, at the positions where INDICATOR is
    non-zero; zeros at the others."""
    flags = _flags(indicator) if len(indicator.shape) == 1 else None
    _indicator_checks(data, indicator, flags)
    picked = np.asarray(flags, dtype=bool)
    source = np.where(picked, np.cumsum(picked) - 1, data.shape[0])      # a DATA row, or the zero row after them
    padded = xp.concatenate([data, xp.zeros((1, *data.shape[1:]), dtype=data.dtype)])
    return xp.take(padded, on_device(xp, source, np.int64), axis=0)


# --------------------------------------------------------------------------------------------- FlexibleTopK
def _flexible_geometry(op_type: str, x, k) -> tuple[int, int]:
    """(rows, r) of X seen as rows of its last dimension, after the checks on X and K's shape and type."""
    check_float(op_type, X=x)
    if len(x.shape) < 1:
        raise ShapeError(f"{op_type}: X must be at least 1-D, got a 0-D tensor")
    if k.dtype is not None and k.dtype != np.int64:
        raise DTypeError(f"{op_type}: K must be int64, got {k.dtype}")
    rows = math.prod(x.shape[:-1])
    if math.prod(k.shape) != rows:
        raise ShapeError(f"{op_type}: K has {math.prod(k.shape)} elements but X {tuple(x.shape)} has {rows} rows "
                         "(the product of all but its last dimension); they must be equal")
    return rows, x.shape[-1]


def _flexible_ks(op_type: str, ks, r: int) -> None:
    for i, k in enumerate(ks):
        if not 0 < k <= r:
            raise ArgumentError(f"{op_type}: K[{i}] = {k}, but every k must be in 1..{r} (the last dimension of X)")


def _flexible_shape(specs):
    x, k = specs
    _, r = _flexible_geometry("FlexibleTopK", x, k)
    ks = known_ints(k, "FlexibleTopK: K")
    if ks is not None:
        _flexible_ks("FlexibleTopK", ks, r)
    total = None if ks is None else sum(ks)
    return [value_dependent((total,), x.dtype), value_dependent((total,), np.int64)]


@op("FlexibleTopK", inputs=2, outputs=2, inplace=(), shape=_flexible_shape,
    gradient=single_gradient("FlexibleTopKGradient", ["I0", "I1", "GO0", "O1"]))
def flexible_top_k(xp, x, k):
    """For row i of X (its last dimension), the K[i] largest values (largest first, ties by lower index) and
    their int64 indices in the row, all rows' picks concatenated into two vectors of sum(K) elements."""
    rows, r = _flexible_geometry("FlexibleTopK", x, k)
    ks = host_ints(k, "FlexibleTopK: K")
    _flexible_ks("FlexibleTopK", ks, r)
    x2 = x.reshape(rows, r)
    order = xp.argsort(-x2, axis=1, kind="stable")
    keep = on_device(xp, np.arange(r)[None, :] < np.asarray(ks, dtype=np.int64)[:, None], np.bool_)
    return xp.take_along_axis(x2, order, axis=1)[keep], order[keep].astype(np.int64)


def _flexible_grad_checks(x, k, values, indices, ks) -> int:
    rows, r = _flexible_geometry("FlexibleTopKGradient", x, k)
    check_float("FlexibleTopKGradient", X=x, dValues=values)
    if indices.dtype is not None and indices.dtype != np.int64:
        raise DTypeError(f"FlexibleTopKGradient: Indices must be int64 (FlexibleTopK's output 1), got {indices.dtype}")
    if len(values.shape) != 1 or tuple(indices.shape) != tuple(values.shape):
        raise ShapeError(f"FlexibleTopKGradient: dValues {tuple(values.shape)} and Indices {tuple(indices.shape)} "
                         "must be vectors of the same length")
    if ks is not None:
        _flexible_ks("FlexibleTopKGradient", ks, r)
        if sum(ks) != values.shape[0]:
            raise ShapeError(f"FlexibleTopKGradient: K sums to {sum(ks)} but dValues has {values.shape[0]} "
                             "elements; they must be equal")
    return r


def _flexible_grad_shape(specs):
    _flexible_grad_checks(*specs, known_ints(specs[1], "FlexibleTopKGradient: K"))
    return [like(specs[0], specs[2].dtype)]


@op("FlexibleTopKGradient", inputs=4, outputs=1, inplace=(), shape=_flexible_grad_shape)
def flexible_top_k_gradient(xp, x, k, values, indices):
    """X, K, dValues, Indices -> dX: zeros shaped like X with each row's dValues written at its Indices."""
    ks = host_ints(k, "FlexibleTopKGradient: K")
    r = _flexible_grad_checks(x, k, values, indices, ks)
    idx = np.asarray(backend.to_host(indices))
    if idx.size and bool(((idx < 0) | (idx >= r)).any()):
        raise ShapeError(f"FlexibleTopKGradient: Indices hold values outside 0..{r - 1} (the last dimension of X)")
    row_of = np.repeat(np.arange(len(ks), dtype=np.int64), ks)
    out = xp.zeros(x.size, dtype=values.dtype)
    out[on_device(xp, row_of * r + idx, np.int64)] = values
    return out.reshape(x.shape)


# --------------------------------------------------------------------------------------------- RowWiseArgMax
def _rowwise_checks(x) -> None:
    if x.dtype is not None and x.dtype != np.float32:
        raise DTypeError(f"RowWiseArgMax: X must be float32, got {x.dtype}")
    if len(x.shape) != 2:
        raise ShapeError(f"RowWiseArgMax: X must be a 2-D (N x D) tensor, got shape {tuple(x.shape)}")
    if x.shape[1] == 0 and x.shape[0]:
        raise ShapeError(f"RowWiseArgMax: X {tuple(x.shape)} has empty rows, which have no maximum")


def _rowwise_shape(specs):
    _rowwise_checks(specs[0])
    return [out_spec((specs[0].shape[0], 1), np.int32)]


@op("RowWiseArgMax", inputs=1, outputs=1, inplace=(), shape=_rowwise_shape, gradient=NO_GRADIENT)
def row_wise_arg_max(xp, x):
    """(N, 1) int32: the column of each row's maximum, the first one when it repeats. As in Caffe2's scan
    (a later element wins only if it is greater), NaN past column 0 is passed over, and a row starting with
    NaN gives 0."""
    _rowwise_checks(x)
    if x.shape[0] == 0:
        return xp.zeros((0, 1), dtype=np.int32)
    best = xp.argmax(xp.where(xp.isnan(x), -np.inf, x), axis=1)
    return xp.where(xp.isnan(x[:, 0]), 0, best).astype(np.int32).reshape(-1, 1)
