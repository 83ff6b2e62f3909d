"""Layout operators: reshape and flatten, transpose, squeeze/expand, the copy/alias family, shape queries and
the NCHW/NHWC switches. Semantics follow Caffe2's reshape_op.h, flatten_op.h, utility_ops.h, transpose_op.h,
expand_squeeze_dims_op.h, shape_op.h and order_switch_ops.cc (both eras). Gradient makers and no-gradient
kinds are declared with the ops; what the makers emit is listed in shape_grad.py, with the gradient kernels."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, GradientError, ShapeError
from .base import GradientSlice, folding, host_ints, known_ints, on_device, out_spec, single_gradient
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op
from .shape import IN_PLACE_0, NOT_IN_PLACE


# --------------------------------------------------------------------------------------------- reshapes
def _new_shape(old: tuple, spec: list[int]) -> list[int]:
    """Caffe2's reshape rule: 0 copies the input's dimension, one -1 is inferred from the element count."""
    total = math.prod(old)
    shape = [old[i] if (d == 0 and i < len(old) and total) else d for i, d in enumerate(spec)]
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ArgumentError(f"new shape {spec}: at most one -1 and no other negative sizes")
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if total == 0:
            shape[shape.index(-1)] = 0
        elif known == 0 or total % known:
            raise ShapeError(f"cannot reshape {tuple(old)} ({total} elements) to {spec}: the other sizes "
                             f"multiply to {known}, which does not divide {total}")
        else:
            shape[shape.index(-1)] = total // known
    elif known != total:
        raise ShapeError(f"cannot reshape {tuple(old)} ({total} elements) to {spec} ({known} elements)")
    return shape


def _reshape_request(shape, shape_input, read):
    """The requested shape (None when it comes from an input of unknown value) and the dtype of the
    old-shape output (int64, or the shape input's type)."""
    if shape_input is not None:
        if shape is not None:
            raise ArgumentError("the new shape comes from input 1; do not also pass the 'shape' argument")
        if len(shape_input.shape) != 1:
            raise ShapeError(f"the new-shape input must be 1-D, got shape {tuple(shape_input.shape)}")
        return read(shape_input, "the new-shape input"), shape_input.dtype
    if shape is None:
        raise ArgumentError("Reshape needs the 'shape' argument or a second input holding the new shape")
    return list(shape), np.dtype(np.int64)


def _reshape_shape(specs, *, shape):
    x, s_in = specs[0], (specs[1] if len(specs) > 1 else None)
    request, dtype = _reshape_request(shape, s_in, known_ints)
    new = _new_shape(x.shape, request) if request is not None else [None] * s_in.shape[0]
    return [out_spec(new, x.dtype), out_spec((len(x.shape),), dtype, x.shape)]


def _reshape_gradient(g):
    gi = g.GI(0)
    g.op("Reshape", [g.GO(0), g.O(1)], [gi, f"_{gi}_dims"], copy_args=False)


@op("Reshape", inputs=(1, 2), outputs=2, inplace=IN_PLACE_0, host_inputs=(1,),
    args={"shape": Arg("ints", None)}, shape=folding(_reshape_shape, lambda: reshape), gradient=_reshape_gradient)
def reshape(xp, x, *shape_input, shape):
    """Y = X with a new shape (argument `shape` or a 1-D int input); old_shape = X's shape (int64, or the
    shape input's type)."""
    request, dtype = _reshape_request(shape, shape_input[0] if shape_input else None, host_ints)
    new = _new_shape(tuple(x.shape), request)
    return xp.reshape(x, new).copy(), on_device(xp, list(x.shape), dtype)


def _flat2d(shape, axis) -> tuple[int, int]:
    if not 0 <= axis <= len(shape):
        raise ShapeError(f"axis={axis} needs 0 <= axis <= rank; X has rank {len(shape)}")
    return math.prod(shape[:axis]), math.prod(shape[axis:])


_RESIZE_LIKE_X = single_gradient("ResizeLike", ["GO0", "I0"])


@op("Flatten", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axis": 1}, gradient=_RESIZE_LIKE_X,
    shape=folding(lambda s, *, axis: [out_spec(_flat2d(s[0].shape, axis), s[0].dtype)], lambda: flatten))
def flatten(xp, x, axis):
    """2-D view [prod(dims[:axis]), prod(dims[axis:])], copied."""
    return xp.reshape(x, _flat2d(x.shape, axis)).copy()


def _vector_of(shape) -> tuple[int]:
    if len(shape) < 1:
        raise ShapeError("X must have rank >= 1 (a 0-D scalar cannot be flattened to a vector)")
    return (math.prod(shape),)


@op("FlattenToVec", inputs=1, outputs=1, inplace=NOT_IN_PLACE, gradient=_RESIZE_LIKE_X,
    shape=folding(lambda s: [out_spec(_vector_of(s[0].shape), s[0].dtype)], lambda: flatten_to_vec))
def flatten_to_vec(xp, x):
    """All elements as a 1-D vector."""
    return xp.reshape(x, _vector_of(x.shape)).copy()


def _resized(shape, like_shape) -> tuple:
    size, like_size = math.prod(shape), math.prod(like_shape)
    if size != like_size:
        raise ShapeError(f"data has {size} elements {tuple(shape)} but the shape tensor has {like_size} "
                         f"{tuple(like_shape)}; they must match")
    return tuple(like_shape)


# `axis` is accepted and ignored: Flatten's gradient is a ResizeLike that carries Flatten's arguments.
@op("ResizeLike", inputs=2, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT,
    args={"axis": Arg("int", None)},
    shape=lambda s, *, axis: [out_spec(_resized(s[0].shape, s[1].shape), s[0].dtype)])
def resize_like(xp, x, like, axis):
    """X's data with the shape of the second input (same element count)."""
    return xp.reshape(x, _resized(x.shape, like.shape)).copy()


def _permutation(ndim: int, axes) -> list[int]:
    axes = list(range(ndim))[::-1] if not axes else list(axes)
    if sorted(axes) != list(range(len(axes))):
        raise ArgumentError(f"axes {axes} must be a permutation of 0..{len(axes) - 1}")
    if len(axes) != ndim:
        raise ShapeError(f"axes {axes} has {len(axes)} entries but X has rank {ndim}")
    return axes


def _permuted(s, axes):
    return out_spec([s.shape[a] for a in _permutation(len(s.shape), axes)], s.dtype)


def _transpose_gradient(g):
    axes = g.arg("axes")
    if not axes:   # the default (reversed) order is its own inverse
        g.op("Transpose", [g.GO(0)], [g.GI(0)])
        return
    axes = list(axes)
    if sorted(axes) != list(range(len(axes))):
        raise GradientError(f"axes {axes} is not a permutation, so it has no inverse", at=g.label)
    g.op("Transpose", [g.GO(0)], [g.GI(0)], axes=[axes.index(i) for i in range(len(axes))])


@op("Transpose", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axes": Arg("ints", None)},
    shape=lambda s, *, axes: [_permuted(s[0], axes)], gradient=_transpose_gradient, shapes_from_inputs=True)
def transpose(xp, x, axes):
    """Permute dimensions by `axes` (default: reversed)."""
    return xp.transpose(x, _permutation(x.ndim, axes)).copy()


def _dims(dims) -> list[int]:
    dims = sorted(set(dims))
    if not dims:
        raise ArgumentError("argument 'dims' must list at least one dimension")
    if dims[0] < 0:
        raise ArgumentError(f"dims {dims} must be non-negative")
    return dims


def _squeezed(shape, dims) -> list[int]:
    dims = _dims(dims)
    if dims[-1] >= len(shape):
        raise ShapeError(f"dims {dims} need X of rank >= {dims[-1] + 1}, got shape {tuple(shape)}")
    bad = [d for d in dims if shape[d] != 1]
    if bad:
        raise ShapeError(f"dimension {bad[0]} of X {tuple(shape)} is {shape[bad[0]]}, not 1; only size-1 "
                         "dimensions can be squeezed")
    return [s for d, s in enumerate(shape) if d not in dims]


def _expanded(shape, dims) -> list[int]:
    dims = _dims(dims)
    if dims[-1] >= len(shape) + len(dims):
        raise ShapeError(f"dims {dims} need X of rank >= {dims[-1] + 1 - len(dims)}, "
                         f"got shape {tuple(shape)}")
    shape = list(shape)
    for d in dims:
        shape.insert(d, 1)
    return shape


@op("Squeeze", inputs=1, outputs=1, inplace=IN_PLACE_0, args={"dims": Arg("ints")},
    gradient=single_gradient("ExpandDims", ["GO0"]),
    shape=folding(lambda s, *, dims: [out_spec(_squeezed(s[0].shape, dims), s[0].dtype)], lambda: squeeze),
    shapes_from_inputs=True)
def squeeze(xp, x, dims):
    """Remove the listed size-1 dimensions."""
    return xp.reshape(x, _squeezed(x.shape, dims)).copy()


@op("ExpandDims", inputs=1, outputs=1, inplace=IN_PLACE_0, args={"dims": Arg("ints")},
    gradient=single_gradient("Squeeze", ["GO0"]),
    shape=folding(lambda s, *, dims: [out_spec(_expanded(s[0].shape, dims), s[0].dtype)],
                  lambda: expand_dims), shapes_from_inputs=True)
def expand_dims(xp, x, dims):
    """Insert size-1 dimensions at the listed positions (as seen in the output)."""
    return xp.reshape(x, _expanded(x.shape, dims)).copy()


# --------------------------------------------------------------------------------------------- copies
def _identity(specs):
    return [specs[0]]   # the same data: the value (if known) carries over


@op("Copy", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_identity,
    gradient=single_gradient("CopyOnDeviceLike", ["GO0", "I0"]), shapes_from_inputs=True)
def copy_op(xp, x):
    """A deep copy on the op's device."""
    return xp.copy(x)


def _alias_gradient(g):
    g.set_dense(0, g.GO(0))


@op("Alias", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_identity, gradient=_alias_gradient,
    shapes_from_inputs=True)
def alias_op(xp, x):
    """Y is X: the same storage, so writes through either are seen by both."""
    return x


@op("StopGradient", inputs=1, outputs=1, inplace=IN_PLACE_0, gradient=NO_GRADIENT, shape=_identity)
def stop_gradient(xp, x):
    """Identity forward (a copy); blocks gradients."""
    return xp.copy(x)


def _dense(shape) -> None:
    if len(shape) < 1:
        raise ShapeError("input has to be at least a vector, got a 0-D tensor")


def _dense_shape(specs):
    _dense(specs[0].shape)
    return [specs[0]]


def _ensure_dense_gradient(g):
    if isinstance(g.g_output[0], GradientSlice):
        go = g.GO_sparse(0)
        g.op("SparseToDense", [go.indices, go.values, g.I(0)], [g.GI(0)])
    else:
        g.set_dense(0, g.GO(0))


@op("EnsureDense", inputs=1, outputs=1, inplace=IN_PLACE_0, shape=_dense_shape, gradient=_ensure_dense_gradient)
def ensure_dense(xp, x):
    """Identity forward (a copy) for dense tensors; its gradient densifies sparse gradients."""
    _dense(x.shape)
    return xp.copy(x)


# --------------------------------------------------------------------------------------------- shape queries
def _shape_dims(shape, axes) -> list[int]:
    dims = list(shape)
    if axes:
        bad = [a for a in axes if not 0 <= a < len(shape)]
        if bad:
            raise ArgumentError(f"axes {list(axes)}: axis {bad[0]} is not in 0..{len(shape) - 1} "
                                f"(X has rank {len(shape)})")
        dims = [dims[a] for a in axes]
    return dims


def _shape_of_shape(specs, *, axes):
    dims = _shape_dims(specs[0].shape, axes)
    return [out_spec((len(dims),), np.int64, dims)]


@op("Shape", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axes": Arg("ints", None)},
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_shape_of_shape)
def shape_of(xp, x, axes):
    """X's dimensions as a 1-D int64 tensor (only those in `axes` when given)."""
    return on_device(xp, _shape_dims(x.shape, axes), np.int64)


@op("Size", inputs=1, outputs=1, inplace=NOT_IN_PLACE, gradient=NO_GRADIENT,
    shape=lambda s: [out_spec((), np.int64, math.prod(s[0].shape))])
def size_of(xp, x):
    """X's element count as a 0-D int64 tensor."""
    return on_device(xp, x.size, np.int64)

# -------------------------------------------------------------------------------------------- layout switches
def _layout(shape, name: str) -> list[int]:
    """The axis permutation of NCHW2NHWC / NHWC2NCHW for this shape."""
    nd = len(shape)
    if nd < 3:
        raise ShapeError(f"{name} needs an input of rank >= 3 (N, C, spatial...), got shape {tuple(shape)}")
    return [0, *range(2, nd), 1] if name == "NCHW2NHWC" else [0, nd - 1, *range(1, nd - 1)]


def _layout_shape(name: str):
    def shape(specs):
        return [out_spec([specs[0].shape[a] for a in _layout(specs[0].shape, name)], specs[0].dtype)]
    return shape


@op("NCHW2NHWC", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_layout_shape("NCHW2NHWC"),
    gradient=single_gradient("NHWC2NCHW", ["GO0"]))
def nchw2nhwc(xp, x):
    """N C H1..Hk -> N H1..Hk C."""
    return xp.transpose(x, _layout(x.shape, "NCHW2NHWC")).copy()


@op("NHWC2NCHW", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_layout_shape("NHWC2NCHW"),
    gradient=single_gradient("NCHW2NHWC", ["GO0"]))
def nhwc2nchw(xp, x):
    """N H1..Hk C -> N C H1..Hk."""
    return xp.transpose(x, _layout(x.shape, "NHWC2NCHW")).copy()
