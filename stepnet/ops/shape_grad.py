"""Gradient ops of the shape and layout families. The makers, declared with the ops in shape.py and
layout.py, emit exactly what Caffe2's makers emit (concat_split_op.cc, slice_op.cc, reshape_op.cc,
utility_ops.cc, flatten_op.cc, transpose_op.cc, expand_squeeze_dims_op.cc, order_switch_ops.cc, copy_op.cc,
tile_op.cc):

- Concat -> Split([dY, split_info]) -> one gradient per input (Concat's axis/order/add_axis copied).
- Split -> Concat(the output gradients) -> [dX, "_<dX>_dims"]. Caffe2 concatenates only the outputs that have
  a gradient, which gives dX the wrong size when some lack one; stepnet refuses that case instead.
- Slice -> SliceGradient([X, (starts, ends,) dY]) -> dX (the later era; 2017 Caffe2 refused Slice's gradient).
- Reshape -> Reshape([dY, old_shape]) -> [dX, "_<dX>_dims"] without Reshape's arguments.
- Flatten, FlattenToVec -> ResizeLike([dY, X]); Copy -> CopyOnDeviceLike([dY, X]).
- Transpose -> Transpose(dY) with the inverse axes; Squeeze <-> ExpandDims; NCHW2NHWC <-> NHWC2NCHW.
- Alias passes dY through; EnsureDense passes a dense dY through and densifies a sparse one with
  SparseToDense([indices, values, X]).
- Tile -> TileGradient([dY, (tiles, (axis))]), which sums the tiled copies.

StopGradient (NO_GRADIENT), Size (NO_GRADIENT), Shape and ResizeLike (SHOULD_NOT_DO_GRADIENT)."""
from __future__ import annotations

import math

from ..core.errors import ArgumentError, ArityError, ShapeError
from .base import canonical_axis, host_ints, known_ints, out_spec
from .registry import Arg, op
from .shape import NOT_IN_PLACE, UNKNOWN_VALUE, _slice_bounds, _slice_request, _tile_request


# --------------------------------------------------------------------------------------------- SliceGradient
def _slice_grad_parts(inputs, starts, ends, read):
    """(X, dY, starts, ends) of SliceGradient's inputs [X, (starts, ends,) dY]; bounds None when unknown."""
    if len(inputs) == 3:
        raise ArityError("SliceGradient takes X and dY, or X, starts, ends and dY")
    x, *bounds, dy = inputs
    lo, hi = _slice_request(bounds, starts, ends, read)
    return x, dy, lo, hi


def _check_region(x_shape, dy_shape, lo, hi) -> None:
    index = _slice_bounds(x_shape, lo, hi)
    region = tuple(len(range(n)[sl]) for n, sl in zip(x_shape, index, strict=True))
    if tuple(dy_shape) != region:
        raise ShapeError(f"dY has shape {tuple(dy_shape)} but the slice of X {tuple(x_shape)} by starts {lo} "
                         f"and ends {hi} has shape {region}; pass the gradient of the Slice's output")


def _slice_grad_shape(specs, *, starts, ends):
    x, dy, lo, hi = _slice_grad_parts(specs, starts, ends, known_ints)
    if lo is not None and hi is not None:
        _check_region(x.shape, dy.shape, lo, hi)
    return [out_spec(x.shape, dy.dtype)]


@op("SliceGradient", inputs=(2, 4), outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1, 2),
    args={"starts": Arg("ints", None), "ends": Arg("ints", None)}, shape=_slice_grad_shape)
def slice_gradient(xp, *inputs, starts, ends):
    """[X, (starts, ends,) dY] -> dX: zeros shaped like X with dY written over the sliced region."""
    x, dy, lo, hi = _slice_grad_parts(inputs, starts, ends, host_ints)
    _check_region(x.shape, dy.shape, lo, hi)
    dx = xp.zeros(x.shape, dtype=dy.dtype)
    dx[_slice_bounds(x.shape, lo, hi)] = dy
    return dx


# --------------------------------------------------------------------------------------------- TileGradient
def _untiled(shape, tiles, axis) -> tuple:
    """X's shape from dY's for Tile(tiles, axis): the axis divided by tiles (None entries when unknown)."""
    if axis is UNKNOWN_VALUE:
        return (None,) * len(shape)
    ax = canonical_axis(axis, len(shape))
    if tiles is UNKNOWN_VALUE:
        return shape[:ax] + (None,) + shape[ax + 1:]
    if tiles == 0:
        raise ArgumentError("tiles=0: dY is empty along the axis and X's size there cannot be recovered")
    if shape[ax] % tiles:
        raise ShapeError(f"dimension {ax} of dY {tuple(shape)} is not a multiple of tiles={tiles}")
    return shape[:ax] + (shape[ax] // tiles,) + shape[ax + 1:]


def _tile_grad_shape(specs, *, tiles, axis):
    tiles, axis = _tile_request(specs[1:], tiles, axis, known_ints)
    return [out_spec(_untiled(tuple(specs[0].shape), tiles, axis), specs[0].dtype)]


@op("TileGradient", inputs=(1, 3), outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1, 2),
    args={"tiles": Arg("int", None), "axis": Arg("int", None)}, shape=_tile_grad_shape)
def tile_gradient(xp, dy, *params, tiles, axis):
    """[dY, (tiles, (axis))] -> dX: the `tiles` consecutive blocks of dY along `axis` summed."""
    tiles, axis = _tile_request(params, tiles, axis, host_ints)
    shape = _untiled(tuple(dy.shape), tiles, axis)
    ax = canonical_axis(axis, dy.ndim)
    blocks = xp.reshape(dy, (math.prod(shape[:ax]), tiles, math.prod(shape[ax:])))
    return xp.reshape(blocks.sum(axis=1), shape).astype(dy.dtype, copy=False)
