"""Shape operators: concatenate/split, slice and tile, PrependDim/MergeDim and LengthsToShape. Semantics follow
Caffe2's concat_split_op.h, slice_op.h, tile_op.h, prepend_dim_op.h and utility_ops.h (both the
facebookarchive/caffe2 and the later pytorch/pytorch era); reshapes, transposes, copies and the layout
switches are in layout.py, the gradient kernels of both in shape_grad.py (gradient makers are declared with
the ops).

Every op has a shape function next to its kernel; both call the same helpers (which take shapes, or anything
with .shape/.dtype), so static inference and the kernels cannot disagree. The small tools these shape
functions share with the other families (out_spec, like, Meta, known_ints, folding) are in base.py."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, ArityError, DTypeError, GradientError, ShapeError
from .base import canonical_axis, folding, host_ints, known_ints, on_device, out_spec
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op

NOT_IN_PLACE = ()          # Caffe2's default: an output may not reuse an input's blob
IN_PLACE_0 = [(0, 0)]      # AllowInplace({{0, 0}})
UNKNOWN_VALUE = object()   # a scalar input whose value a shape function cannot see


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


def _concat_shape(specs, *, axis, order, add_axis, split):
    ax, add = _concat_axis(specs, axis, order, add_axis)
    shape = list(specs[0].shape)
    if add:
        shape.insert(ax, len(specs))
        sizes = [1] * len(specs)
    else:
        sizes = [s.shape[ax] for s in specs]
        shape[ax] = sum(sizes)
    return [out_spec(shape, specs[0].dtype), out_spec((len(specs),), np.int32, sizes)]


def _concat_gradient(g):
    if not g.has_grad(0):
        return
    if g.n_outputs < 2:
        raise GradientError("Concat's gradient splits dY by the sizes in its second output "
                            "(split_info), but this Concat has one output; give it a second output", at=g.label)
    g.op("Split", [g.GO(0), g.O(1)], [g.GI(i) for i in range(g.n_inputs)])


# `split` is accepted and ignored: Split's gradient is a Concat that carries Split's arguments.
@op("Concat", inputs=(1, None), outputs=(1, 2), inplace=NOT_IN_PLACE, aliases=("DepthConcat",), host_outputs=(1,),
    args={"axis": Arg("int", None), "order": Arg("str", None), "add_axis": 0, "split": Arg("ints", None)},
    shape=folding(_concat_shape, lambda: concat), gradient=_concat_gradient, shapes_from_inputs=True, grows="shapes")
def concat(xp, *xs, axis, order, add_axis, split):
    """Join inputs along `axis` (or stack them on a new axis with add_axis=1); also the int32 sizes along
    it, on the host whatever the op's device (Caffe2's GPU Concat writes split_info to a CPU tensor; Split reads
    it from there)."""
    ax, add = _concat_axis(xs, axis, order, add_axis)
    if add:
        return xp.stack(xs, axis=ax), np.ones(len(xs), np.int32)
    return xp.concatenate(xs, axis=ax), np.array([x.shape[ax] for x in xs], np.int32)


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


def _split_shape(specs, *, split, axis, order, add_axis, dimensions):
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


def _split_gradient(g):
    missing = [g.O(i) for i in range(g.n_outputs) if not g.has_grad(i)]
    if len(missing) == g.n_outputs:
        return
    if missing:
        raise GradientError(
           f"outputs {', '.join(map(repr, missing))} of Split have no gradient; Caffe2 would "
           "concatenate only the others and give the input a gradient of the wrong size. Add a "
           "ZeroGradient op on each unused output", at=g.label)
    gi = g.GI(0)
    g.op("Concat", [g.GO(i) for i in range(g.n_outputs)], [gi, f"_{gi}_dims"])


@op("Split", inputs=(1, 2), outputs=(1, None), inplace=NOT_IN_PLACE, context="structure", host_inputs=(1,),
    aliases=("DepthSplit",),
    args={"split": Arg("ints", None), "axis": Arg("int", None), "order": Arg("str", None), "add_axis": 0,
          "dimensions": Arg("ints", None, "ignored, as Caffe2 ignores it (brew's group_conv_deprecated passes it "
                                          "to DepthSplit)")},
    shape=_split_shape, gradient=_split_gradient, shapes_from_inputs=True)
def split(ctx, xp, x, *split_input, split, axis, order, add_axis, dimensions):
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


def _slice_gradient(g):
    if g.n_inputs == 2:
        raise GradientError("Slice takes the data alone or data, starts and ends, not 2 inputs", at=g.label)
    inputs = [g.I(0), g.I(1), g.I(2), g.GO(0)] if g.n_inputs > 1 else [g.I(0), g.GO(0)]
    g.op("SliceGradient", inputs, [g.GI(0)])


@op("Slice", inputs=(1, 3), outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1, 2),
    args={"starts": Arg("ints", None), "ends": Arg("ints", None)},
    shape=folding(_slice_shape, lambda: slice_), gradient=_slice_gradient)
def slice_(xp, x, *bounds, starts, ends):
    """X[starts:ends] per leading dimension; bounds from arguments or from 2 int inputs (used when given)."""
    starts, ends = _slice_request(bounds, starts, ends, host_ints)
    return x[_slice_bounds(x.shape, starts, ends)].copy()


# --------------------------------------------------------------------------------------------- tiling
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


def _tile_gradient(g):
    g.op("TileGradient", [g.GO(0), *(g.I(i) for i in range(1, g.n_inputs))], [g.GI(0)])


@op("Tile", inputs=(1, 3), outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1, 2), gradient=_tile_gradient,
    args={"tiles": Arg("int", None), "axis": Arg("int", None)}, shape=folding(_tile_shape, lambda: tile),
    grows="values")
def tile(xp, x, *params, tiles, axis):
    """Repeat X `tiles` times along `axis` (whole blocks from axis on); inputs 1 and 2 override the args."""
    tiles, axis = _tile_request(params, tiles, axis, host_ints)
    reps = [1] * x.ndim
    reps[canonical_axis(axis, x.ndim)] = tiles
    return xp.tile(x, reps)


# --------------------------------------------------------------------------------------------- leading dims
def _prepended(shape, dim_size: int) -> tuple:
    if dim_size <= 0:
        raise ArgumentError(f"PrependDim: dim_size must be > 0, got {dim_size}")
    if len(shape) < 1:
        raise ShapeError("PrependDim: the input must be at least 1-D, got a 0-D tensor")
    if shape[0] % dim_size:
        raise ShapeError(f"PrependDim: the first dim of {tuple(shape)} is not a multiple of dim_size {dim_size}")
    return (dim_size, shape[0] // dim_size, *shape[1:])


def _merged(shape) -> tuple:
    if len(shape) < 2:
        raise ShapeError(f"MergeDim: the input must be at least 2-D, got shape {tuple(shape)}")
    return (shape[0] * shape[1], *shape[2:])


def _prepend_dim_gradient(g):
    g.op("MergeDim", [g.GO(0)], [g.GI(0)], copy_args=False)


@op("PrependDim", inputs=1, outputs=1, inplace=IN_PLACE_0, args={"dim_size": 0}, gradient=_prepend_dim_gradient,
    shape=folding(lambda s, *, dim_size: [out_spec(_prepended(s[0].shape, dim_size), s[0].dtype)],
                  lambda: prepend_dim), shapes_from_inputs=True)
def prepend_dim(xp, x, *, dim_size):
    """X reshaped to (dim_size, dims[0] / dim_size, dims[1:]...), copied (Caffe2's prepend_dim_op.h)."""
    return xp.reshape(x, _prepended(x.shape, dim_size)).copy()


# Caffe2 registers no gradient for MergeDim (it is PrependDim's gradient).
@op("MergeDim", inputs=1, outputs=1, inplace=IN_PLACE_0, shapes_from_inputs=True,
    shape=folding(lambda s: [out_spec(_merged(s[0].shape), s[0].dtype)], lambda: merge_dim))
def merge_dim(xp, x):
    """X with its first two dims merged into one of size dims[0] * dims[1], copied."""
    return xp.reshape(x, _merged(x.shape)).copy()


def _lengths_to_shape_checks(lengths, values) -> None:
    if lengths.dtype is not None and lengths.dtype != np.int32:
        raise DTypeError(f"LengthsToShape: the lengths must be int32, got {lengths.dtype}")
    if len(lengths.shape) != 1 or lengths.shape[0] == 0:
        raise ShapeError(f"LengthsToShape: the input must be a non-empty vector of lengths, got shape "
                         f"{tuple(lengths.shape)}")
    if values is not None and len(set(values)) > 1:
        raise ShapeError(f"LengthsToShape: all lengths must be equal, got {sorted(set(values))[:4]}")


def _lengths_to_shape_shape(specs):
    _lengths_to_shape_checks(specs[0], known_ints(specs[0], "LengthsToShape: lengths"))
    return [out_spec((2,), np.int32)]


@op("LengthsToShape", inputs=1, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=folding(_lengths_to_shape_shape, lambda: lengths_to_shape))
def lengths_to_shape(xp, lengths):
    """[len(lengths), lengths[0]] (int32) for lengths that are all equal: the shape to Reshape their
    concatenated segments into (Caffe2's utility_ops.h)."""
    values = host_ints(lengths, "LengthsToShape: lengths")
    _lengths_to_shape_checks(lengths, values)
    return on_device(xp, [len(values), values[0]], np.int32)
