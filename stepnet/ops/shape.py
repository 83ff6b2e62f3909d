"""Shape operators: concatenate/split, slice, reshape and flatten, transpose, squeeze/expand, tile, the layout
switches, and the copy/alias family. Semantics follow Caffe2's concat_split_op.h, slice_op.h, reshape_op.h,
flatten_op.h, utility_ops.h, transpose_op.h, expand_squeeze_dims_op.h, shape_op.h, tile_op.h and
order_switch_ops.cc (both the facebookarchive/caffe2 and the later pytorch/pytorch era)."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError, ArityError, DTypeError, ShapeError
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op

NOT_IN_PLACE = ()          # Caffe2's default: an output may not reuse an input's blob
IN_PLACE_0 = [(0, 0)]      # AllowInplace({{0, 0}})


# --------------------------------------------------------------------------------------------- helpers
def host_ints(x, what: str) -> list[int]:
    """The values of a small integer tensor (on any device) as Python ints: shapes, sizes, starts/ends."""
    if x.dtype.kind not in "iu":
        raise DTypeError(f"{what} must hold integers (int32/int64), got {x.dtype}")
    return [int(v) for v in x.reshape(-1).tolist()]


def canonical_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """axis in [0, ndim), counting negative values from the end as Caffe2's canonical_axis_index does."""
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"{what}={axis} is out of range for a {ndim}-D tensor "
                            f"(valid: {-ndim}..{ndim - 1})")
    return axis + ndim if axis < 0 else axis


def on_device(xp, values, dtype):
    """A small host-computed array (sizes, shapes) moved to the op's device."""
    return xp.asarray(np.asarray(values, dtype=dtype))


def _axis_from(axis, order) -> int:
    """Concat/Split: `axis` if given, else the channel axis of `order` (NCHW -> 1, NHWC -> 3)."""
    if axis is not None and order is not None:
        raise ArgumentError("give either 'axis' or 'order', not both")
    if axis is not None:
        return axis
    order = "NCHW" if order is None else order
    if order.upper() not in ("NCHW", "NHWC"):
        raise ArgumentError(f"order={order!r} is not a storage order; use 'NCHW' or 'NHWC'")
    return 1 if order.upper() == "NCHW" else 3


# --------------------------------------------------------------------------------------------- concat / split
@op("Concat", inputs=(1, None), outputs=(1, 2), inplace=NOT_IN_PLACE,
    args={"axis": Arg("int", None), "order": Arg("str", None), "add_axis": 0})
def concat(xp, *xs, axis, order, add_axis):
    """Join inputs along `axis` (or stack them on a new axis with add_axis=1); also the int32 sizes along
    it."""
    add = bool(add_axis) and axis is not None   # Caffe2 ignores add_axis when the axis comes from `order`
    x0 = xs[0]
    ax = canonical_axis(_axis_from(axis, order), x0.ndim + add)
    for i, x in enumerate(xs[1:], 1):
        if x.dtype != x0.dtype:
            raise DTypeError(f"all inputs must have the same type: input 0 is {x0.dtype}, "
                             f"input {i} is {x.dtype}")
        same = x.shape == x0.shape if add else (
            x.ndim == x0.ndim and all(x.shape[d] == x0.shape[d] for d in range(x.ndim) if d != ax))
        if not same:
            where = "all dimensions" if add else f"every dimension except axis {ax}"
            raise ShapeError(f"input {i} has shape {tuple(x.shape)} but input 0 has {tuple(x0.shape)}; "
                             f"they must agree in {where}")
    if add:
        return xp.stack(xs, axis=ax), on_device(xp, [1] * len(xs), np.int32)
    return xp.concatenate(xs, axis=ax), on_device(xp, [x.shape[ax] for x in xs], np.int32)


@op("Split", inputs=(1, 2), outputs=(1, None), inplace=NOT_IN_PLACE, context=True, host_inputs=(1,),
    args={"split": Arg("ints", None), "axis": Arg("int", None), "order": Arg("str", None), "add_axis": 0})
def split(ctx, xp, x, *split_input, split, axis, order, add_axis):
    """Cut X along `axis` into parts of the sizes in `split` (argument or int32 input), equal parts otherwise;
    with add_axis=1 each part is one slice with the axis removed (the gradient of a stacking Concat)."""
    n = len(ctx.outputs)
    add = bool(add_axis) and axis is not None
    ax = canonical_axis(_axis_from(axis, order), x.ndim)
    dim = x.shape[ax]
    if add:
        if dim != n:
            raise ShapeError(f"with add_axis=1, dimension {ax} of X ({dim}) must equal the number of "
                             f"outputs ({n})")
        return tuple(xp.take(x, i, axis=ax) for i in range(n))
    if split_input:
        if split:
            raise ArgumentError("the split sizes come from input 1; do not also pass the 'split' argument")
        sizes = host_ints(split_input[0], "the split input")
        source = "the split input"
    elif not split:
        if dim % n:
            raise ShapeError(f"dimension {ax} of X ({dim}) cannot be split into {n} equal parts; "
                             "give 'split' sizes")
        sizes, source = [dim // n] * n, "equal split"
    else:
        sizes, source = list(split), "'split'"
    if len(sizes) != n:
        raise ArgumentError(f"{source} has {len(sizes)} sizes but the op has {n} outputs")
    if min(sizes) < 0 or sum(sizes) != dim:
        raise ShapeError(f"{source} sizes {sizes} must be non-negative and sum to dimension {ax} "
                         f"of X ({dim})")
    bounds = np.cumsum(sizes)[:-1].tolist()
    return tuple(part.copy() for part in xp.split(x, bounds, axis=ax))


# --------------------------------------------------------------------------------------------- slice
def _slice_bounds(shape, starts, ends) -> tuple:
    if len(starts) != len(ends):
        raise ArgumentError(f"starts {starts} and ends {ends} must have the same length")
    if len(starts) > len(shape):
        raise ShapeError(f"starts/ends give {len(starts)} dimensions but the data has only {len(shape)}")
    index = []
    for d, size in enumerate(shape):
        if d >= len(starts) or size == 0:
            index.append(slice(None))
            continue
        # Caffe2: a negative bound b means size + 1 + b (so -1 is the end); bounds past the end are clipped
        lo, hi = (min(size + 1 + b if b < 0 else b, size) for b in (starts[d], ends[d]))
        if lo < 0 or hi < lo:
            raise ShapeError(f"dimension {d} (size {size}): start {starts[d]} and end {ends[d]} give "
                             f"the range [{lo}, {hi}), which is negative or reversed; -1 means the end")
        index.append(slice(lo, hi))
    return tuple(index)


@op("Slice", inputs=(1, 3), outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1, 2),
    args={"starts": Arg("ints", None), "ends": Arg("ints", None)})
def slice_(xp, x, *bounds, starts, ends):
    """X[starts:ends] per leading dimension; bounds from arguments or from 2 int inputs (used when given)."""
    if len(bounds) == 1:
        raise ArityError("Slice takes the data alone (bounds as arguments) or data, starts and ends")
    if bounds:
        starts, ends = host_ints(bounds[0], "starts"), host_ints(bounds[1], "ends")
    elif starts is None or ends is None:
        raise ArgumentError("Slice needs 'starts' and 'ends' (as arguments or as inputs 1 and 2)")
    return x[_slice_bounds(x.shape, list(starts), list(ends))].copy()


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


@op("Reshape", inputs=(1, 2), outputs=2, inplace=IN_PLACE_0, host_inputs=(1,), args={"shape": Arg("ints", None)})
def reshape(xp, x, *shape_input, shape):
    """Y = X with a new shape (argument `shape` or a 1-D int input); old_shape = X's shape (int64, or the
    shape input's type)."""
    if shape_input:
        s = shape_input[0]
        if shape is not None:
            raise ArgumentError("the new shape comes from input 1; do not also pass the 'shape' argument")
        if s.ndim != 1:
            raise ShapeError(f"the new-shape input must be 1-D, got shape {tuple(s.shape)}")
        spec, dtype = host_ints(s, "the new-shape input"), s.dtype
    elif shape is None:
        raise ArgumentError("Reshape needs the 'shape' argument or a second input holding the new shape")
    else:
        spec, dtype = list(shape), np.int64
    new = _new_shape(tuple(x.shape), spec)
    return xp.reshape(x, new).copy(), on_device(xp, list(x.shape), dtype)


@op("Flatten", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axis": 1})
def flatten(xp, x, axis):
    """2-D view [prod(dims[:axis]), prod(dims[axis:])], copied."""
    if not 0 <= axis <= x.ndim:
        raise ShapeError(f"axis={axis} needs 0 <= axis <= rank; X has rank {x.ndim}")
    return xp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))).copy()


@op("FlattenToVec", inputs=1, outputs=1, inplace=NOT_IN_PLACE)
def flatten_to_vec(xp, x):
    """All elements as a 1-D vector."""
    if x.ndim < 1:
        raise ShapeError("X must have rank >= 1 (a 0-D scalar cannot be flattened to a vector)")
    return xp.reshape(x, (x.size,)).copy()


@op("ResizeLike", inputs=2, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT)
def resize_like(xp, x, like):
    """X's data with the shape of the second input (same element count)."""
    if x.size != like.size:
        raise ShapeError(f"data has {x.size} elements {tuple(x.shape)} but the shape tensor has {like.size} "
                         f"{tuple(like.shape)}; they must match")
    return xp.reshape(x, like.shape).copy()


@op("Transpose", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axes": Arg("ints", None)})
def transpose(xp, x, axes):
    """Permute dimensions by `axes` (default: reversed)."""
    axes = list(range(x.ndim))[::-1] if not axes else list(axes)
    if sorted(axes) != list(range(len(axes))):
        raise ArgumentError(f"axes {axes} must be a permutation of 0..{len(axes) - 1}")
    if len(axes) != x.ndim:
        raise ShapeError(f"axes {axes} has {len(axes)} entries but X has rank {x.ndim}")
    return xp.transpose(x, axes).copy()


def _dims(dims) -> list[int]:
    dims = sorted(set(dims))
    if not dims:
        raise ArgumentError("argument 'dims' must list at least one dimension")
    if dims[0] < 0:
        raise ArgumentError(f"dims {dims} must be non-negative")
    return dims


@op("Squeeze", inputs=1, outputs=1, inplace=IN_PLACE_0, args={"dims": Arg("ints")})
def squeeze(xp, x, dims):
    """Remove the listed size-1 dimensions."""
    dims = _dims(dims)
    if dims[-1] >= x.ndim:
        raise ShapeError(f"dims {dims} need X of rank >= {dims[-1] + 1}, got shape {tuple(x.shape)}")
    bad = [d for d in dims if x.shape[d] != 1]
    if bad:
        raise ShapeError(f"dimension {bad[0]} of X {tuple(x.shape)} is {x.shape[bad[0]]}, not 1; only size-1 "
                         "dimensions can be squeezed")
    return xp.reshape(x, [s for d, s in enumerate(x.shape) if d not in dims]).copy()


@op("ExpandDims", inputs=1, outputs=1, inplace=IN_PLACE_0, args={"dims": Arg("ints")})
def expand_dims(xp, x, dims):
    """Insert size-1 dimensions at the listed positions (as seen in the output)."""
    dims = _dims(dims)
    if dims[-1] >= x.ndim + len(dims):
        raise ShapeError(f"dims {dims} need X of rank >= {dims[-1] + 1 - len(dims)}, "
                         f"got shape {tuple(x.shape)}")
    shape = list(x.shape)
    for d in dims:
        shape.insert(d, 1)
    return xp.reshape(x, shape).copy()


# --------------------------------------------------------------------------------------------- copies
@op("Copy", inputs=1, outputs=1, inplace=NOT_IN_PLACE)
def copy_op(xp, x):
    """A deep copy on the op's device."""
    return xp.copy(x)


@op("Alias", inputs=1, outputs=1, inplace=NOT_IN_PLACE)
def alias_op(xp, x):
    """Y is X: the same storage, so writes through either are seen by both."""
    return x


@op("StopGradient", inputs=1, outputs=1, inplace=IN_PLACE_0, gradient=NO_GRADIENT)
def stop_gradient(xp, x):
    """Identity forward (a copy); blocks gradients."""
    return xp.copy(x)


@op("EnsureDense", inputs=1, outputs=1, inplace=IN_PLACE_0)
def ensure_dense(xp, x):
    """Identity forward (a copy) for dense tensors; its gradient densifies sparse gradients."""
    if x.ndim < 1:
        raise ShapeError("input has to be at least a vector, got a 0-D tensor")
    return xp.copy(x)


# --------------------------------------------------------------------------------------------- shape queries
@op("Shape", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axes": Arg("ints", None)},
    gradient=SHOULD_NOT_DO_GRADIENT)
def shape_of(xp, x, axes):
    """X's dimensions as a 1-D int64 tensor (only those in `axes` when given)."""
    dims = list(x.shape)
    if axes:
        bad = [a for a in axes if not 0 <= a < x.ndim]
        if bad:
            raise ArgumentError(f"axes {list(axes)}: axis {bad[0]} is not in 0..{x.ndim - 1} "
                                f"(X has rank {x.ndim})")
        dims = [dims[a] for a in axes]
    return on_device(xp, dims, np.int64)


@op("Size", inputs=1, outputs=1, inplace=NOT_IN_PLACE)
def size_of(xp, x):
    """X's element count as a 0-D int64 tensor."""
    return on_device(xp, x.size, np.int64)


# --------------------------------------------------------------------------------------------- tiling, layout
def _scalar_input(t, what: str) -> int:
    if t.ndim != 1 or t.size != 1:
        raise ShapeError(f"input `{what}` must be a vector of size 1, got shape {tuple(t.shape)}")
    return host_ints(t, f"input `{what}`")[0]


@op("Tile", inputs=(1, 3), outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1, 2),
    args={"tiles": Arg("int", None), "axis": Arg("int", None)})
def tile(xp, x, *params, tiles, axis):
    """Repeat X `tiles` times along `axis` (whole blocks from axis on); inputs 1 and 2 override the args."""
    if params:
        tiles = _scalar_input(params[0], "tiles")
    if len(params) > 1:
        axis = _scalar_input(params[1], "axis")
    missing = [n for n, v in (("tiles", tiles), ("axis", axis)) if v is None]
    if missing:
        raise ArgumentError(f"argument {missing[0]!r} is missing and not given as an input")
    if tiles < 0:
        raise ArgumentError(f"tiles={tiles} must be >= 0")
    reps = [1] * x.ndim
    reps[canonical_axis(axis, x.ndim)] = tiles
    return xp.tile(x, reps)


def _check_layout(x, name: str):
    if x.ndim < 3:
        raise ShapeError(f"{name} needs an input of rank >= 3 (N, C, spatial...), got shape {tuple(x.shape)}")


@op("NCHW2NHWC", inputs=1, outputs=1, inplace=NOT_IN_PLACE)
def nchw2nhwc(xp, x):
    """N C H1..Hk -> N H1..Hk C."""
    _check_layout(x, "NCHW2NHWC")
    return xp.transpose(x, [0, *range(2, x.ndim), 1]).copy()


@op("NHWC2NCHW", inputs=1, outputs=1, inplace=NOT_IN_PLACE)
def nhwc2nchw(xp, x):
    """N H1..Hk C -> N C H1..Hk."""
    _check_layout(x, "NHWC2NCHW")
    return xp.transpose(x, [0, x.ndim - 1, *range(1, x.ndim - 1)]).copy()
