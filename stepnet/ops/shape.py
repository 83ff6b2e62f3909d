"""Shape operators: concatenate/split, slice, reshape and flatten, transpose, squeeze/expand, tile, the layout
switches, and the copy/alias family. Semantics follow Caffe2's concat_split_op.h, slice_op.h, reshape_op.h,
flatten_op.h, utility_ops.h, transpose_op.h, expand_squeeze_dims_op.h, shape_op.h, tile_op.h and
order_switch_ops.cc (both the facebookarchive/caffe2 and the later pytorch/pytorch era).

Every op has a shape function next to its kernel; both call the same helpers (which take shapes, or anything
with .shape/.dtype), so static inference and the kernels cannot disagree. This module also holds the small
tools the other families' shape functions use (out_spec, like, Meta, known_ints, folding)."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError, ArityError, DTypeError, ShapeError
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op

NOT_IN_PLACE = ()          # Caffe2's default: an output may not reuse an input's blob
IN_PLACE_0 = [(0, 0)]      # AllowInplace({{0, 0}})
UNKNOWN_VALUE = object()   # a scalar input whose value a shape function cannot see


# --------------------------------------------------------------------------------------------- helpers
def check_int_dtype(dtype, what: str) -> None:
    if dtype is not None and np.dtype(dtype).kind not in "iu":
        raise DTypeError(f"{what} must hold integers (int32/int64), got {dtype}")


def host_ints(x, what: str) -> list[int]:
    """The values of a small integer tensor (on any device) as Python ints: shapes, sizes, starts/ends."""
    check_int_dtype(x.dtype, what)
    return [int(v) for v in x.reshape(-1).tolist()]


def known_ints(s, what: str) -> list[int] | None:
    """host_ints for a TensorSpec: the values it carries, or None when they are not known statically."""
    check_int_dtype(s.dtype, what)
    return None if s.value is None else [int(v) for v in np.asarray(s.value).reshape(-1).tolist()]


def canonical_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """axis in [0, ndim), counting negative values from the end as Caffe2's canonical_axis_index does."""
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"{what}={axis} is out of range for a {ndim}-D tensor "
                            f"(valid: {-ndim}..{ndim - 1})")
    return axis + ndim if axis < 0 else axis


def on_device(xp, values, dtype):
    """A small host-computed array (sizes, shapes) moved to the op's device."""
    return xp.asarray(np.asarray(values, dtype=dtype))


# ------------------------------------------------------------------------------------ shape-function tools
def out_spec(shape, dtype, value=None):
    """An output TensorSpec: None dims stand for sizes that depend on unknown input values, dtype may be
    unknown (None); a value is kept only for small integer tensors, as TensorSpec.of does."""
    from ..shapes import SMALL_VALUE, TensorSpec

    dt = None if dtype is None else np.dtype(dtype)
    if value is not None:
        value = np.asarray(value, dtype=dt)
        if dt is None or dt.kind not in "iub" or value.size > SMALL_VALUE:
            value = None
    return TensorSpec(tuple(None if d is None else int(d) for d in shape), dt, value)


def like(s, dtype=False):
    """s's shape and dtype (or the given dtype), without its value: for ops that keep the shape only."""
    return out_spec(s.shape, s.dtype if dtype is False else dtype)


def result_dtype(*dtypes):
    """numpy's promotion of the known dtypes (None if one is unknown)."""
    return None if any(d is None for d in dtypes) else np.result_type(*dtypes)


class Meta:
    """A shape-only stand-in for an array (shape, dtype, ndim, size) so the kernels' check helpers, written
    for arrays, run on TensorSpecs too."""
    __slots__ = ("shape", "dtype")

    def __init__(self, s):
        self.shape, self.dtype = tuple(s.shape), s.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def _small_int(s) -> bool:
    from ..shapes import SMALL_VALUE

    return (s is not None and s.shape is not None and None not in s.shape and s.dtype is not None
            and s.dtype.kind in "iub" and math.prod(s.shape) <= SMALL_VALUE)


def folding(shape_fn, kernel):
    """shape_fn plus constant folding: when every input carries its value, small integer outputs get theirs
    by running the kernel on the host (so Shape -> Slice/Gather -> Concat -> Reshape chains resolve before
    anything runs). `kernel` is a zero-argument callable returning the kernel (it is defined after the
    decorator that names this function)."""
    def shape(specs, **args):
        outs = list(shape_fn(specs, **args))
        if not specs or any(s.value is None for s in specs) or not any(map(_small_int, outs)):
            return outs
        got = kernel()(np, *(np.asarray(s.value) for s in specs), **args)
        got = got if isinstance(got, tuple) else (got,)
        return [out_spec(o.shape, o.dtype, g) if _small_int(o) and g is not None else o
                for o, g in zip(outs, got, strict=False)]
    return shape


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
def _concat_axis(xs, axis, order, add_axis) -> tuple[int, bool]:
    """(axis, stacking?) of a Concat over xs (arrays or specs), after Caffe2's type and shape checks."""
    add = bool(add_axis) and axis is not None   # Caffe2 ignores add_axis when the axis comes from `order`
    s0, d0 = tuple(xs[0].shape), xs[0].dtype
    ax = canonical_axis(_axis_from(axis, order), len(s0) + add)
    for i, x in enumerate(xs[1:], 1):
        s = tuple(x.shape)
        if x.dtype is not None and d0 is not None and x.dtype != d0:
            raise DTypeError(f"all inputs must have the same type: input 0 is {d0}, input {i} is {x.dtype}")
        same = s == s0 if add else (len(s) == len(s0) and s[:ax] + s[ax + 1:] == s0[:ax] + s0[ax + 1:])
        if not same:
            where = "all dimensions" if add else f"every dimension except axis {ax}"
            raise ShapeError(f"input {i} has shape {s} but input 0 has {s0}; they must agree in {where}")
    return ax, add


def _concat_shape(specs, *, axis, order, add_axis):
    ax, add = _concat_axis(specs, axis, order, add_axis)
    shape = list(specs[0].shape)
    if add:
        shape.insert(ax, len(specs))
        sizes = [1] * len(specs)
    else:
        sizes = [s.shape[ax] for s in specs]
        shape[ax] = sum(sizes)
    return [out_spec(shape, specs[0].dtype), out_spec((len(specs),), np.int32, sizes)]


@op("Concat", inputs=(1, None), outputs=(1, 2), inplace=NOT_IN_PLACE,
    args={"axis": Arg("int", None), "order": Arg("str", None), "add_axis": 0},
    shape=folding(_concat_shape, lambda: concat))
def concat(xp, *xs, axis, order, add_axis):
    """Join inputs along `axis` (or stack them on a new axis with add_axis=1); also the int32 sizes along
    it."""
    ax, add = _concat_axis(xs, axis, order, add_axis)
    if add:
        return xp.stack(xs, axis=ax), on_device(xp, [1] * len(xs), np.int32)
    return xp.concatenate(xs, axis=ax), on_device(xp, [x.shape[ax] for x in xs], np.int32)


def _split_sizes(dim: int, ax: int, n: int, add: bool, split, split_input, read):
    """The part sizes of a Split into n outputs (None entries when they come from an input whose values are
    unknown; None with add_axis, where each part drops the axis). `read` gets the sizes input's ints."""
    if add:
        if dim != n:
            raise ShapeError(f"with add_axis=1, dimension {ax} of X ({dim}) must equal the number of "
                             f"outputs ({n})")
        return None
    if split_input is not None:
        if split:
            raise ArgumentError("the split sizes come from input 1; do not also pass the 'split' argument")
        sizes, source = read(split_input, "the split input"), "the split input"
        if sizes is None:
            return [None] * n
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
    return sizes


def _split_shape(specs, *, split, axis, order, add_axis):
    """The number of outputs is not given to shape functions: it is taken from add_axis (the axis size), the
    sizes input or `split`; with equal parts it is unknown, and so are the outputs."""
    x, s_in = specs[0], (specs[1] if len(specs) > 1 else None)
    add = bool(add_axis) and axis is not None
    ax = canonical_axis(_axis_from(axis, order), len(x.shape))
    dim = x.shape[ax]
    n = dim if add else math.prod(s_in.shape) if s_in is not None else len(split) if split else None
    if n is None:
        return []
    sizes = _split_sizes(dim, ax, n, add, split, s_in, known_ints)
    if add:
        return [out_spec(x.shape[:ax] + x.shape[ax + 1:], x.dtype)] * n
    return [out_spec(x.shape[:ax] + (s,) + x.shape[ax + 1:], x.dtype) for s in sizes]


@op("Split", inputs=(1, 2), outputs=(1, None), inplace=NOT_IN_PLACE, context=True, host_inputs=(1,),
    args={"split": Arg("ints", None), "axis": Arg("int", None), "order": Arg("str", None), "add_axis": 0},
    shape=_split_shape)
def split(ctx, xp, x, *split_input, split, axis, order, add_axis):
    """Cut X along `axis` into parts of the sizes in `split` (argument or int32 input), equal parts otherwise;
    with add_axis=1 each part is one slice with the axis removed (the gradient of a stacking Concat)."""
    n = len(ctx.outputs)
    add = bool(add_axis) and axis is not None
    ax = canonical_axis(_axis_from(axis, order), x.ndim)
    sizes = _split_sizes(x.shape[ax], ax, n, add, split, split_input[0] if split_input else None, host_ints)
    if add:
        return tuple(xp.take(x, i, axis=ax) for i in range(n))
    bounds = np.cumsum(sizes)[:-1].tolist()
    return tuple(part.copy() for part in xp.split(x, bounds, axis=ax))


# --------------------------------------------------------------------------------------------- slice
def _slice_request(bounds, starts, ends, read):
    """(starts, ends) from the arguments or from the two bound inputs (None where their values are
    unknown)."""
    if len(bounds) == 1:
        raise ArityError("Slice takes the data alone (bounds as arguments) or data, starts and ends")
    if bounds:
        return read(bounds[0], "starts"), read(bounds[1], "ends")
    if starts is None or ends is None:
        raise ArgumentError("Slice needs 'starts' and 'ends' (as arguments or as inputs 1 and 2)")
    return list(starts), list(ends)


def _slice_rank(count: int, ndim: int) -> None:
    if count > ndim:
        raise ShapeError(f"starts/ends give {count} dimensions but the data has only {ndim}")


def _slice_bounds(shape, starts, ends) -> tuple:
    if len(starts) != len(ends):
        raise ArgumentError(f"starts {starts} and ends {ends} must have the same length")
    _slice_rank(len(starts), len(shape))
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


def _slice_shape(specs, *, starts, ends):
    x, bounds = specs[0], specs[1:]
    lo, hi = _slice_request(bounds, starts, ends, known_ints)
    if lo is None or hi is None:   # bounds from inputs of unknown value: the sliced dims are unknown
        count = math.prod(bounds[0].shape)
        _slice_rank(count, len(x.shape))
        return [out_spec([None if d < count else n for d, n in enumerate(x.shape)], x.dtype)]
    index = _slice_bounds(x.shape, lo, hi)
    return [out_spec([len(range(n)[sl]) for n, sl in zip(x.shape, index, strict=True)], x.dtype)]


@op("Slice", inputs=(1, 3), outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1, 2),
    args={"starts": Arg("ints", None), "ends": Arg("ints", None)},
    shape=folding(_slice_shape, lambda: slice_))
def slice_(xp, x, *bounds, starts, ends):
    """X[starts:ends] per leading dimension; bounds from arguments or from 2 int inputs (used when given)."""
    starts, ends = _slice_request(bounds, starts, ends, host_ints)
    return x[_slice_bounds(x.shape, starts, ends)].copy()


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


@op("Reshape", inputs=(1, 2), outputs=2, inplace=IN_PLACE_0, host_inputs=(1,),
    args={"shape": Arg("ints", None)}, shape=folding(_reshape_shape, lambda: reshape))
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


@op("Flatten", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axis": 1},
    shape=folding(lambda s, *, axis: [out_spec(_flat2d(s[0].shape, axis), s[0].dtype)], lambda: flatten))
def flatten(xp, x, axis):
    """2-D view [prod(dims[:axis]), prod(dims[axis:])], copied."""
    return xp.reshape(x, _flat2d(x.shape, axis)).copy()


def _vector_of(shape) -> tuple[int]:
    if len(shape) < 1:
        raise ShapeError("X must have rank >= 1 (a 0-D scalar cannot be flattened to a vector)")
    return (math.prod(shape),)


@op("FlattenToVec", inputs=1, outputs=1, inplace=NOT_IN_PLACE,
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


@op("ResizeLike", inputs=2, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=lambda s: [out_spec(_resized(s[0].shape, s[1].shape), s[0].dtype)])
def resize_like(xp, x, like):
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


@op("Transpose", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axes": Arg("ints", None)},
    shape=lambda s, *, axes: [_permuted(s[0], axes)])
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
    shape=folding(lambda s, *, dims: [out_spec(_squeezed(s[0].shape, dims), s[0].dtype)], lambda: squeeze))
def squeeze(xp, x, dims):
    """Remove the listed size-1 dimensions."""
    return xp.reshape(x, _squeezed(x.shape, dims)).copy()


@op("ExpandDims", inputs=1, outputs=1, inplace=IN_PLACE_0, args={"dims": Arg("ints")},
    shape=folding(lambda s, *, dims: [out_spec(_expanded(s[0].shape, dims), s[0].dtype)],
                  lambda: expand_dims))
def expand_dims(xp, x, dims):
    """Insert size-1 dimensions at the listed positions (as seen in the output)."""
    return xp.reshape(x, _expanded(x.shape, dims)).copy()


# --------------------------------------------------------------------------------------------- copies
def _identity(specs):
    return [specs[0]]   # the same data: the value (if known) carries over


@op("Copy", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_identity)
def copy_op(xp, x):
    """A deep copy on the op's device."""
    return xp.copy(x)


@op("Alias", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_identity)
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


@op("EnsureDense", inputs=1, outputs=1, inplace=IN_PLACE_0, shape=_dense_shape)
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


@op("Size", inputs=1, outputs=1, inplace=NOT_IN_PLACE,
    shape=lambda s: [out_spec((), np.int64, math.prod(s[0].shape))])
def size_of(xp, x):
    """X's element count as a 0-D int64 tensor."""
    return on_device(xp, x.size, np.int64)


# --------------------------------------------------------------------------------------------- tiling, layout
def _scalar_input(t, what: str, read):
    if len(t.shape) != 1 or math.prod(t.shape) != 1:
        raise ShapeError(f"input `{what}` must be a vector of size 1, got shape {tuple(t.shape)}")
    values = read(t, f"input `{what}`")
    return UNKNOWN_VALUE if values is None else values[0]


def _tile_request(params, tiles, axis, read):
    """(tiles, axis) from the arguments, overridden by inputs 1 and 2 (UNKNOWN_VALUE for unknown inputs)."""
    if params:
        tiles = _scalar_input(params[0], "tiles", read)
    if len(params) > 1:
        axis = _scalar_input(params[1], "axis", read)
    missing = [n for n, v in (("tiles", tiles), ("axis", axis)) if v is None]
    if missing:
        raise ArgumentError(f"argument {missing[0]!r} is missing and not given as an input")
    if tiles is not UNKNOWN_VALUE and tiles < 0:
        raise ArgumentError(f"tiles={tiles} must be >= 0")
    return tiles, axis


def _tile_shape(specs, *, tiles, axis):
    x = specs[0]
    tiles, axis = _tile_request(specs[1:], tiles, axis, known_ints)
    if axis is UNKNOWN_VALUE:
        return [out_spec([None] * len(x.shape), x.dtype)]
    shape = list(x.shape)
    ax = canonical_axis(axis, len(shape))
    shape[ax] = None if tiles is UNKNOWN_VALUE else shape[ax] * tiles
    return [out_spec(shape, x.dtype)]


@op("Tile", inputs=(1, 3), outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1, 2),
    args={"tiles": Arg("int", None), "axis": Arg("int", None)}, shape=folding(_tile_shape, lambda: tile))
def tile(xp, x, *params, tiles, axis):
    """Repeat X `tiles` times along `axis` (whole blocks from axis on); inputs 1 and 2 override the args."""
    tiles, axis = _tile_request(params, tiles, axis, host_ints)
    reps = [1] * x.ndim
    reps[canonical_axis(axis, x.ndim)] = tiles
    return xp.tile(x, reps)


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


@op("NCHW2NHWC", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_layout_shape("NCHW2NHWC"))
def nchw2nhwc(xp, x):
    """N C H1..Hk -> N H1..Hk C."""
    return xp.transpose(x, _layout(x.shape, "NCHW2NHWC")).copy()


@op("NHWC2NCHW", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_layout_shape("NHWC2NCHW"))
def nhwc2nchw(xp, x):
    """N H1..Hk C -> N C H1..Hk."""
    return xp.transpose(x, _layout(x.shape, "NHWC2NCHW")).copy()
