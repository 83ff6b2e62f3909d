"""Reductions: ReduceSum/Mean/Max/Min/L1/L2 over listed axes, ReduceFront*/ReduceBack* over leading or
trailing dims (optionally only the first `lengths[i]` entries), SumElements & co. to a 0-D scalar, and
RowwiseMax/ColwiseMax on batches of matrices.

Caffe2 facts kept here: an empty input reduces to the identity of the reduction (0 for sums, the lowest
value for max, the highest for min); ReduceFront*/Back* give zeros when the input is empty; all-axes
reductions without keepdims and SumElements give 0-D tensors.

The gradient makers are here, next to their ops; the gradient kernels are in reduce_grad.py.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import fold, out_spec, size_of
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op

_REAL = tuple(np.dtype(t) for t in (np.int32, np.int64, np.float16, np.float32, np.float64))


def check_dtype(op_type: str, X, ints: bool) -> None:
    """Floating inputs always; int32/int64 too where Caffe2 registers them (ints=True). Arrays or TensorSpecs
    (an unknown dtype passes)."""
    if X.dtype is None or X.dtype.kind == "f" or (ints and X.dtype in _REAL):
        return
    kinds = "int32, int64 or floating-point" if ints else "floating-point"
    raise DTypeError(f"{op_type} needs {kinds} input, got {X.dtype}; Cast it first")


def _lowest(dtype):
    return np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min


def _highest(dtype):
    return np.finfo(dtype).max if dtype.kind == "f" else np.iinfo(dtype).max


# --------------------------------------------------------------------------------------------- Reduce*
def _axes(op_type: str, axes, ndim: int) -> tuple:
    """Sorted unique canonical axes; no axes means all of them."""
    if not axes:
        return tuple(range(ndim))
    bad = [a for a in axes if not -ndim <= a < ndim]
    if bad:
        raise ArgumentError(f"{op_type}: axes {list(axes)} out of range for a {ndim}-D input "
                            f"(valid: {-ndim} to {ndim - 1})")
    return tuple(sorted({a + ndim if a < 0 else a for a in axes}))


def reduce_shape(op_type, X, axes, keepdims, ints=True) -> tuple[tuple[int, ...], tuple]:
    """Reduce*'s checks on an array or a TensorSpec; (output shape, canonical axes)."""
    check_dtype(op_type, X, ints)
    shape = tuple(X.shape)
    ax = _axes(op_type, axes, len(shape))
    kept = tuple(1 if i in ax else d for i, d in enumerate(shape))
    return (kept if keepdims else tuple(d for i, d in enumerate(shape) if i not in ax)), ax


def _reduce_shape(op_type, ints=True):
    def shape(specs, axes=(), keepdims=1, allow_broadcast_fastpath=False):
        out, _ = reduce_shape(op_type, specs[0], axes, keepdims, ints)
        return [out_spec(out, specs[0].dtype)]
    return shape


def _reduce(xp, op_type, X, axes, keepdims, fn, empty_value, ints=True):
    out_shape, ax = reduce_shape(op_type, X, axes, keepdims, ints)
    if X.size == 0:
        return xp.full(out_shape, empty_value(X.dtype), dtype=X.dtype)
    if not ax:
        return X.copy().reshape(out_shape)
    return fn(X, ax).reshape(out_shape)


REDUCE_ARGS = {"axes": Arg("ints", []), "keepdims": 1, "allow_broadcast_fastpath": False}


def _reduce_gradient(g):
    """Reduce<X>Gradient(dY, X, Y) -> dX, forward args (axes, keepdims) copied (GetReduceGradient)."""
    g.op(g.def_.type + "Gradient", [g.GO(0), g.I(0), g.O(0)], [g.GI(0)])


@op("ReduceSum", args=REDUCE_ARGS, inplace=(), gradient=_reduce_gradient,
    shape=_reduce_shape("ReduceSum"))
def reduce_sum(xp, X, axes=(), keepdims=1, allow_broadcast_fastpath=False):
    """Sum over `axes` (all when empty); keepdims=1 keeps them as size-1 dims."""
    return _reduce(xp, "ReduceSum", X, axes, keepdims,
                   lambda x, ax: x.sum(axis=ax, dtype=x.dtype, keepdims=True), lambda d: 0)


@op("ReduceMean", args=REDUCE_ARGS, inplace=(), gradient=_reduce_gradient,
    shape=_reduce_shape("ReduceMean", ints=False))
def reduce_mean(xp, X, axes=(), keepdims=1, allow_broadcast_fastpath=False):
    """Mean over `axes` (all when empty); an empty input gives zeros."""
    return _reduce(xp, "ReduceMean", X, axes, keepdims,
                   lambda x, ax: x.mean(axis=ax, dtype=x.dtype, keepdims=True), lambda d: 0, ints=False)


@op("ReduceMax", args=REDUCE_ARGS, inplace=(), gradient=_reduce_gradient,
    shape=_reduce_shape("ReduceMax"))
def reduce_max(xp, X, axes=(), keepdims=1, allow_broadcast_fastpath=False):
    """Max over `axes` (all when empty); an empty input gives the dtype's lowest value."""
    return _reduce(xp, "ReduceMax", X, axes, keepdims, lambda x, ax: x.max(axis=ax, keepdims=True), _lowest)


@op("ReduceMin", args=REDUCE_ARGS, inplace=(), gradient=_reduce_gradient,
    shape=_reduce_shape("ReduceMin"))
def reduce_min(xp, X, axes=(), keepdims=1, allow_broadcast_fastpath=False):
    """Min over `axes` (all when empty); an empty input gives the dtype's highest value."""
    return _reduce(xp, "ReduceMin", X, axes, keepdims, lambda x, ax: x.min(axis=ax, keepdims=True), _highest)


@op("ReduceL1", args=REDUCE_ARGS, inplace=(), gradient=_reduce_gradient,
    shape=_reduce_shape("ReduceL1", ints=False))
def reduce_l1(xp, X, axes=(), keepdims=1, allow_broadcast_fastpath=False):
    """Sum of absolute values over `axes`."""
    return _reduce(xp, "ReduceL1", X, axes, keepdims,
                   lambda x, ax: xp.abs(x).sum(axis=ax, dtype=x.dtype, keepdims=True), lambda d: 0,
                   ints=False)


@op("ReduceL2", args=REDUCE_ARGS, inplace=(), gradient=_reduce_gradient,
    shape=_reduce_shape("ReduceL2", ints=False))
def reduce_l2(xp, X, axes=(), keepdims=1, allow_broadcast_fastpath=False):
    """Euclidean norm over `axes`."""
    return _reduce(xp, "ReduceL2", X, axes, keepdims,
                   lambda x, ax: xp.sqrt((x * x).sum(axis=ax, dtype=x.dtype, keepdims=True)), lambda d: 0,
                   ints=False)


# --------------------------------------------------------------------------------------------- Front/Back
def front_back_shape(op_type, X, lengths, n, front, kind) -> tuple[tuple[int, ...], int, int]:
    """ReduceFront*/Back*'s checks on arrays or TensorSpecs; (output shape, rows, cols) of X's matrix view."""
    check_dtype(op_type, X, ints=kind != "max")
    shape = tuple(X.shape)
    if not 0 <= n <= len(shape):
        raise ArgumentError(f"{op_type}: num_reduce_dim={n} must be in [0, {len(shape)}] for a "
                            f"{len(shape)}-D input")
    split = n if front else len(shape) - n
    rows, cols = math.prod(shape[:split]), math.prod(shape[split:])
    if lengths is not None and rows and cols:
        if lengths.dtype is not None and lengths.dtype.kind not in "iu":
            raise DTypeError(f"{op_type}: lengths must be an integer tensor (int32), got {lengths.dtype}")
        if n != 1:
            raise ArgumentError(f"{op_type}: with a lengths input, num_reduce_dim must be 1 (got {n})")
        if size_of(lengths) != (cols if front else rows):
            raise ShapeError(f"{op_type}: lengths {tuple(lengths.shape)} must have one entry per reduced "
                             f"vector ({cols if front else rows})")
    return (shape[split:] if front else shape[:split]), rows, cols


def check_lengths_range(op_type, lengths, size) -> None:
    """Every length within [0, size] (lengths: an array on any device, or known host values)."""
    if bool((lengths < 0).any()) or bool((lengths > size).any()):
        raise ShapeError(f"{op_type}: every length must be in [0, {size}] (the size of the reduced dim)")


def _front_back(xp, op_type, X, lengths, n, front, kind):
    """ReduceFront*/ReduceBack*: X as rows x cols, reducing rows (front) or cols (back), where the first
    (front) or last (back) `n` dims are reduced; lengths[j] limits batch entry j to its first lengths[j]."""
    out_shape, rows, cols = front_back_shape(op_type, X, lengths, n, front, kind)
    if rows == 0 or cols == 0:
        return xp.zeros(out_shape, dtype=X.dtype)
    X2 = X.reshape(rows, cols)
    axis = 0 if front else 1
    size = X2.shape[axis]
    if lengths is None:
        count = None
        mask = None
    else:
        count = xp.asarray(lengths).reshape(-1).astype(np.int64)
        check_lengths_range(op_type, count, size)
        steps = xp.arange(size)
        mask = steps[:, None] < count[None, :] if front else steps[None, :] < count[:, None]
    if kind == "max":
        if mask is not None:
            X2 = xp.where(mask, X2, X2.dtype.type(_lowest(X2.dtype)))
        return X2.max(axis=axis).reshape(out_shape)
    if mask is not None:
        X2 = xp.where(mask, X2, X2.dtype.type(0))
    total = X2.sum(axis=axis, dtype=X2.dtype)
    if kind == "sum":
        return total.reshape(out_shape)
    return _mean(xp, op_type, total, count, size).reshape(out_shape)


def _zero_count_error(op_type):
    return ArgumentError(f"{op_type}: a length of 0 makes an integer mean a division by zero")


def _mean(xp, op_type, total, count, size):
    """total / count, dividing like C++ does: true division for floats, truncation toward zero for ints."""
    if count is None:
        count = xp.full(total.shape, size, dtype=np.int64)
    if total.dtype.kind == "f":
        safe = xp.maximum(count, 1).astype(total.dtype)
        return xp.where(count > 0, total / safe, total.dtype.type(np.nan))
    if bool((count == 0).any()):
        raise _zero_count_error(op_type)
    c = count.astype(total.dtype)
    return xp.where(total >= 0, total // c, -((-total) // c))


def _front_back_shape(name, front, kind):
    def shape(specs, num_reduce_dim=1):
        X, lengths = specs[0], (specs[1] if len(specs) > 1 else None)
        out, rows, cols = front_back_shape(name, X, lengths, num_reduce_dim, front, kind)
        if lengths is not None and lengths.value is not None and rows and cols:
            check_lengths_range(name, lengths.value.reshape(-1), rows if front else cols)
            int_mean = kind == "mean" and X.dtype is not None and X.dtype.kind != "f"
            if int_mean and bool((lengths.value == 0).any()):
                raise _zero_count_error(name)
        return [out_spec(out, X.dtype)]
    return shape


def _front_back_gradient(g):
    """<type>Gradient(dY, X, [lengths]) for sums and means, (dY, X, Y, [lengths]) for max, args copied."""
    ins = [g.GO(0), g.I(0)] + ([g.O(0)] if g.def_.type.endswith("Max") else []) + list(g.def_.input[1:])
    g.op(g.def_.type + "Gradient", ins, [g.GI(0)])


def _front_back_op(name, front, kind):
    doc = (f"{'Sum' if kind == 'sum' else kind.capitalize()} over the {'first' if front else 'last'} "
           f"num_reduce_dim dims; an optional int lengths input limits each reduced vector to its first "
           f"lengths[j] entries (num_reduce_dim must then be 1).")

    def kernel(xp, X, lengths=None, num_reduce_dim=1):
        return _front_back(xp, name, X, lengths, num_reduce_dim, front, kind)

    kernel.__name__ = kernel.__qualname__ = name
    op(name, inputs=(1, 2), args={"num_reduce_dim": 1}, inplace=(), gradient=_front_back_gradient,
       shape=_front_back_shape(name, front, kind), doc=doc)(kernel)


for _name, _front, _kind in (("ReduceFrontSum", True, "sum"), ("ReduceBackSum", False, "sum"),
                             ("ReduceFrontMean", True, "mean"), ("ReduceBackMean", False, "mean"),
                             ("ReduceFrontMax", True, "max"), ("ReduceBackMax", False, "max")):
    _front_back_op(_name, _front, _kind)


# --------------------------------------------------------------------------------------------- scalars
def _total(x, average=False):
    """Sum (or mean) of all elements as a 0-D array, staying on x's device; 0 when empty.

    Caffe2 averages by scaling with 1/n computed in the element type. The work is done on a 1-element
    vector because numpy turns arithmetic on 0-D arrays into scalars.
    """
    total = x.reshape(-1).sum(dtype=x.dtype, keepdims=True)
    if average and x.size:
        total = total * (x.dtype.type(1) / x.dtype.type(x.size))
    return total.reshape(())


def _check_int(X) -> None:
    if X.dtype is not None and X.dtype.kind not in "iu":
        raise DTypeError(f"SumElementsInt needs an integer (int32) input, got {X.dtype}; use SumElements")


def _scalar_shape(op_type):
    """Shape function of the all-elements reductions: a 0-D tensor of X's dtype."""
    def shape(specs, average=False):
        if op_type == "SumElementsInt":
            _check_int(specs[0])
            return [out_spec((), specs[0].dtype, fold(sum_elements_int, specs))]
        check_dtype(op_type, specs[0], ints=False)
        return [out_spec((), specs[0].dtype)]
    return shape


def _sum_elements_gradient(g):
    g.op("SumElementsGradient", [g.I(0), g.GO(0)], [g.GI(0)])


@op("SumElements", args={"average": False}, inplace=(), shape=_scalar_shape("SumElements"),
    gradient=_sum_elements_gradient)
def sum_elements(xp, X, average=False):
    """Sum (or mean when average=1) of all elements, as a 0-D tensor; an empty input gives 0."""
    check_dtype("SumElements", X, ints=False)
    return _total(X, average)


@op("SumElementsInt", inplace=(), shape=_scalar_shape("SumElementsInt"), gradient=SHOULD_NOT_DO_GRADIENT)
def sum_elements_int(xp, X):
    """Sum of all elements of an integer tensor, as a 0-D tensor of the same type."""
    _check_int(X)
    return _total(X)


@op("SumSqrElements", args={"average": False}, inplace=(), shape=_scalar_shape("SumSqrElements"))
def sum_sqr_elements(xp, X, average=False):
    """Sum (or mean when average=1) of the squares of all elements, as a 0-D tensor. Caffe2 registers no
    gradient for it (asking for one is an error)."""
    check_dtype("SumSqrElements", X, ints=False)
    return _total(X * X, average)


def max_3d_shape(op_type, X, axis) -> tuple[int, ...]:
    """RowwiseMax/ColwiseMax's checks on an array or a TensorSpec; the output shape."""
    check_dtype(op_type, X, ints=False)
    shape = tuple(X.shape)
    if len(shape) != 3:
        raise ShapeError(f"{op_type} needs a 3-D input (batch x M x N), got {shape}")
    out_shape = shape[:axis] + shape[axis + 1:]
    if math.prod(out_shape) and shape[axis] == 0:
        raise ShapeError(f"{op_type}: cannot take the max over an empty dimension (input {shape})")
    return out_shape


def _max_3d(xp, op_type, X, axis):
    out_shape = max_3d_shape(op_type, X, axis)
    if math.prod(out_shape) == 0:
        return xp.zeros(out_shape, dtype=X.dtype)
    return X.max(axis=axis)


def _max_3d_shape(op_type, axis):
    def shape(specs):
        return [out_spec(max_3d_shape(op_type, specs[0], axis), specs[0].dtype)]
    return shape


def _max_3d_gradient(g):
    g.op(g.def_.type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])


@op("RowwiseMax", inplace=(), shape=_max_3d_shape("RowwiseMax", 2), gradient=_max_3d_gradient)
def rowwise_max(xp, X):
    """Max of each row of each matrix: batch x M x N -> batch x M."""
    return _max_3d(xp, "RowwiseMax", X, 2)


@op("ColwiseMax", inplace=(), shape=_max_3d_shape("ColwiseMax", 1), gradient=_max_3d_gradient)
def colwise_max(xp, X):
    """Max of each column of each matrix: batch x M x N -> batch x N."""
    return _max_3d(xp, "ColwiseMax", X, 1)
