"""Gradient kernels of the reductions, with Caffe2's inputs (the makers are in reduce.py):

- Reduce{Sum,Mean,Max,Min,L1,L2}Gradient(dY, X, Y) -> dX: dY spread over the reduced axes; max/min send it
  to every element equal to the result (ties all get it); L1 uses sign(x) with |x| <= 1e-12 counted as 0;
  L2 uses x / ‖x‖, or passes dY unchanged where the norm is below 1e-12 (Caffe2's choices).
- ReduceFront/Back{Sum,Mean}Gradient(dY, X, [lengths]) and ReduceFront/BackMaxGradient(dY, X, Y, [lengths]):
  entries past a vector's length get 0. Input 1 may also be X's shape as a 1-D int64 tensor (an older Caffe2
  form that Caffe2 still accepts: any 1-D int64 input 1 is read as a shape).
- SumElementsGradient(X, dY), RowwiseMaxGradient / ColwiseMaxGradient(X, Y, dY).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import DTypeError, ShapeError
from ..core.spec import TensorSpec
from .base import like, out_spec, size_of
from .reduce import REDUCE_ARGS, check_dtype, check_lengths_range, front_back_shape, max_3d_shape, reduce_shape
from .registry import op

EPS = 1e-12  # Caffe2's kEps of the L1/L2 reducers' backward passes


def _same_dtype(op_type, X, **others) -> None:
    for name, t in others.items():
        if t.dtype is not None and X.dtype is not None and t.dtype != X.dtype:
            raise DTypeError(f"{op_type}: {name} is {t.dtype} but X is {X.dtype}; they must have one dtype")


def _check_seed(op_type, X, dY) -> None:
    """dY may differ from X only as one float type from another (a float32 ConstantFill seed in a float64
    net); it is cast to X's dtype."""
    if dY.dtype is None or X.dtype is None or dY.dtype == X.dtype or (dY.dtype.kind == X.dtype.kind == "f"):
        return
    raise DTypeError(f"{op_type}: dY is {dY.dtype} but X is {X.dtype}; they must have one dtype")


def _check_sizes(op_type, what, n, **tensors) -> None:
    for name, t in tensors.items():
        if size_of(t) != n:
            raise ShapeError(f"{op_type}: {name} {tuple(t.shape)} must hold {n} elements: {what}")


# --------------------------------------------------------------------------------------------- Reduce*
def reduce_grad_shape(op_type, dY, X, Y, axes, ints) -> tuple[int, ...]:
    """Reduce*Gradient's checks on arrays or TensorSpecs; the reduced shape with kept (size-1) axes."""
    kept, ax = reduce_shape(op_type, X, axes, 1, ints)
    _same_dtype(op_type, X, Y=Y)
    _check_seed(op_type, X, dY)
    _check_sizes(op_type, f"X {tuple(X.shape)} reduced over axes {list(ax)} gives {kept}", math.prod(kept),
                 dY=dY, Y=Y)
    return kept


def _reduce_grad(xp, op_type, dY, X, Y, axes, kind, ints=True):
    kept = reduce_grad_shape(op_type, dY, X, Y, axes, ints)
    dY, Y = xp.asarray(dY).astype(X.dtype, copy=False), xp.asarray(Y)  # a 1-element dY may sit on the host
    if X.size == 0:
        return xp.zeros(X.shape, dtype=X.dtype)
    G = dY.reshape(kept)
    zero = X.dtype.type(0)
    if kind == "sum":
        return xp.broadcast_to(G, X.shape).copy()
    if kind == "mean":
        return xp.broadcast_to(G * X.dtype.type(G.size / X.size), X.shape).copy()
    if kind == "max":
        return xp.where(X == Y.reshape(kept), G, zero)
    if kind == "l1":
        return xp.where(X > EPS, G, xp.where(X < -EPS, -G, zero))
    norm = Y.reshape(kept)  # l2
    small = norm < EPS
    return xp.where(small, G, G * X / xp.where(small, X.dtype.type(1), norm))


def _reduce_grad_op(forward, kind, ints):
    name = forward + "Gradient"

    def kernel(xp, dY, X, Y, axes=(), keepdims=1, allow_broadcast_fastpath=False):
        return _reduce_grad(xp, name, dY, X, Y, axes, kind, ints)

    def shape(specs, axes=(), keepdims=1, allow_broadcast_fastpath=False):
        dY, X, Y = specs
        reduce_grad_shape(name, dY, X, Y, axes, ints)
        return [like(X)]

    kernel.__name__ = kernel.__qualname__ = name
    op(name, inputs=3, args=REDUCE_ARGS, inplace=(), shape=shape,
       doc=f"(dY, X, Y) -> dX, the gradient of {forward} over `axes` (all when empty).")(kernel)


for _forward, _kind, _ints in (("ReduceSum", "sum", True), ("ReduceMean", "mean", False),
                               ("ReduceMax", "max", True), ("ReduceMin", "max", True),
                               ("ReduceL1", "l1", False), ("ReduceL2", "l2", False)):
    _reduce_grad_op(_forward, _kind, _ints)


# --------------------------------------------------------------------------------------------- Front/Back
def _dx_spec(source, dtype) -> TensorSpec | None:
    """dX's spec from input 1: X itself, or (older form) X's shape as a 1-D int64 tensor; None when that
    shape is not known statically."""
    if len(source.shape) == 1 and source.dtype == np.int64:
        if isinstance(source, TensorSpec):
            return None if source.value is None else TensorSpec(tuple(int(d) for d in source.value), dtype)
        return TensorSpec(tuple(int(d) for d in np.asarray(backend.to_host(source))), dtype)
    return TensorSpec(tuple(source.shape), dtype)


def front_back_grad_check(op_type, dY, dX, Y, lengths, n, front, kind):
    """ReduceFront/Back*Gradient's checks; (rows, cols) of dX's matrix view."""
    out_shape, rows, cols = front_back_shape(op_type, dX, lengths, n, front, kind)
    others = {"dY": dY} if Y is None else {"dY": dY, "Y": Y}
    _same_dtype(op_type, dX, **others)
    _check_sizes(op_type, f"the reduced shape is {out_shape} (X {dX.shape}, num_reduce_dim={n})",
                 math.prod(out_shape), **others)
    return rows, cols


def _divide(xp, g, d):
    """g / d as C++ divides: true division for floats, truncation toward zero for integers."""
    if g.dtype.kind == "f":
        return g / d.astype(g.dtype)
    d = d.astype(g.dtype)
    return xp.where(g >= 0, g // d, -((-g) // d))


def _split(rest, with_y):
    """(Y, lengths) from the inputs after (dY, X)."""
    if with_y:
        return rest[0], (rest[1] if len(rest) > 1 else None)
    return None, (rest[0] if rest else None)


def _front_back_grad(xp, op_type, dY, source, Y, lengths, n, front, kind):
    # the max gradient reads X's values, so its input 1 is always X
    dX = TensorSpec(tuple(source.shape), dY.dtype) if kind == "max" else _dx_spec(source, dY.dtype)
    rows, cols = front_back_grad_check(op_type, dY, dX, Y, lengths, n, front, kind)
    dY = xp.asarray(dY)
    if rows == 0 or cols == 0:
        return xp.zeros(dX.shape, dtype=dY.dtype)
    view = (1, cols) if front else (rows, 1)
    G = dY.reshape(view)
    size = rows if front else cols
    steps = xp.arange(size)
    count, mask = None, None
    if lengths is not None:
        count = xp.asarray(lengths).reshape(view).astype(np.int64)
        check_lengths_range(op_type, count, size)
        mask = steps[:, None] < count if front else steps[None, :] < count
    zero = dY.dtype.type(0)
    if kind == "max":
        X2 = source.reshape(rows, cols)
        full = xp.where(X2 == xp.asarray(Y).reshape(view), G, zero)
    elif kind == "sum":
        full = xp.broadcast_to(G, (rows, cols))
    else:
        denom = xp.full(view, size, dtype=np.int64) if count is None else xp.maximum(count, 1)
        full = xp.broadcast_to(_divide(xp, G, denom), (rows, cols))
    if mask is not None:
        full = xp.where(mask, full, zero)
    return full.reshape(dX.shape).copy()


def _front_back_grad_op(forward, front, kind):
    name = forward + "Gradient"
    with_y = kind == "max"

    def kernel(xp, dY, source, *rest, num_reduce_dim=1):
        Y, lengths = _split(rest, with_y)
        return _front_back_grad(xp, name, dY, source, Y, lengths, num_reduce_dim, front, kind)

    def shape(specs, num_reduce_dim=1):
        dY, source = specs[0], specs[1]
        Y, lengths = _split(specs[2:], with_y)
        dX = TensorSpec(tuple(source.shape), dY.dtype) if with_y else _dx_spec(source, dY.dtype)
        if dX is None:
            return []
        front_back_grad_check(name, dY, dX, Y, lengths, num_reduce_dim, front, kind)
        return [out_spec(dX.shape, dY.dtype)]

    ins = "(dY, X, Y, [lengths])" if with_y else "(dY, X, [lengths])"
    kernel.__name__ = kernel.__qualname__ = name
    op(name, inputs=(3, 4) if with_y else (2, 3), args={"num_reduce_dim": 1}, inplace=(), shape=shape,
       doc=f"{ins} -> dX, the gradient of {forward}; entries past a vector's length get 0.")(kernel)


for _forward, _front, _kind in (("ReduceFrontSum", True, "sum"), ("ReduceBackSum", False, "sum"),
                                ("ReduceFrontMean", True, "mean"), ("ReduceBackMean", False, "mean"),
                                ("ReduceFrontMax", True, "max"), ("ReduceBackMax", False, "max")):
    _front_back_grad_op(_forward, _front, _kind)


# --------------------------------------------------------------------------------------------- scalars
def _check_sum_elements_grad(X, dY) -> None:
    check_dtype("SumElementsGradient", X, ints=False)
    _check_seed("SumElementsGradient", X, dY)
    _check_sizes("SumElementsGradient", "the gradient of a scalar", 1, dY=dY)


def _sum_elements_gradient_shape(specs, average=False):
    _check_sum_elements_grad(*specs)
    return [like(specs[0])]


@op("SumElementsGradient", inputs=2, args={"average": False}, inplace=(), shape=_sum_elements_gradient_shape)
def sum_elements_gradient(xp, X, dY, average=False):
    """(X, dY) -> dX filled with dY (divided by X's size when average=1)."""
    _check_sum_elements_grad(X, dY)
    if X.size == 0:
        return xp.zeros(X.shape, dtype=X.dtype)
    scale = 1.0 / X.size if average else 1.0  # Caffe2 scales in double, then casts
    value = (xp.asarray(dY).reshape(1).astype(np.float64) * scale).astype(X.dtype)
    return (xp.zeros(X.size, dtype=X.dtype) + value).reshape(X.shape)


def _check_max_3d_grad(op_type, X, Y, dY, axis) -> tuple[int, ...]:
    out_shape = max_3d_shape(op_type, X, axis)
    _same_dtype(op_type, X, Y=Y, dY=dY)
    _check_sizes(op_type, f"the {op_type[:-8]} of X {tuple(X.shape)} has shape {out_shape}",
                 math.prod(out_shape), Y=Y, dY=dY)
    return out_shape


def _max_3d_grad_op(forward, axis):
    name = forward + "Gradient"

    def kernel(xp, X, Y, dY):
        _check_max_3d_grad(name, X, Y, dY, axis)
        view = X.shape[:axis] + (1,) + X.shape[axis + 1:]
        if X.size == 0:
            return xp.zeros(X.shape, dtype=X.dtype)
        Y_, G = xp.asarray(Y).reshape(view), xp.asarray(dY).reshape(view)
        return xp.where(X == Y_, G, X.dtype.type(0))

    def shape(specs):
        _check_max_3d_grad(name, *specs, axis)
        return [like(specs[0])]

    kernel.__name__ = kernel.__qualname__ = name
    op(name, inputs=3, inplace=(), shape=shape,
       doc=f"(X, Y, dY) -> dX: dY goes to every element of X equal to its {forward} result Y.")(kernel)


_max_3d_grad_op("RowwiseMax", 2)
_max_3d_grad_op("ColwiseMax", 1)
