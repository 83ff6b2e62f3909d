"""Gradient ops of the image-layout ops, as Caffe2 registers them (pad_op.cc, resize_op.cc,
channel_shuffle_op.cc); their makers are in image.py.

PadImageGradient(dY) -> dX (the image size is dY's minus the pads), ResizeNearestGradient(dY, X[, scales]) ->
dX, ChannelShuffleGradient(dY) -> dX. Padding and nearest resizing copy pixels along each spatial axis
independently, so their gradients are two GEMMs with 0/1 selection matrices (dX = R^T dY C): every output
pixel adds into the pixel it was copied from, with no Python loop over pixels. The stylizer ops have no
gradient in Caffe2.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ..core import backend
from ..core.errors import ShapeError
from .base import Meta, check_float, like, out_spec
from .image import PAD_ARGS, host_floats, image_pads, nearest_index, pad_plan, resize_plan, shuffle, shuffle_layout
from .registry import op


def _selection(index, inside, size: int, dtype):
    """A (len(index), size) host matrix, 1 at [i, index[i]] where inside[i]: output i copies that input."""
    m = np.zeros((index.size, size), dtype=dtype)
    rows = np.nonzero(inside)[0]
    m[rows, index[rows]] = 1
    return m


def _spread(xp, dY, rows, cols, order: str):
    """dX = rows^T dY cols on the two spatial axes of a 4-d image in either order (host 0/1 matrices)."""
    r, c = xp.asarray(rows.T), xp.asarray(cols)
    d = dY if order == "NCHW" else xp.moveaxis(dY, -1, 1)
    dx = xp.matmul(xp.matmul(r, d), c)
    return dx if order == "NCHW" else xp.ascontiguousarray(xp.moveaxis(dx, 1, -1))


# ----------------------------------------------------------------------------------------------- PadImage
def _pad_gradient_plan(dY, args):
    """(row plan, column plan, X's shape) of the PadImage that produced a dY of this shape."""
    check_float(dY=dY)
    if len(dY.shape) != 4:
        raise ShapeError(f"PadImageGradient needs a 4-d dY ({args['order']}), got shape {tuple(dY.shape)}")
    t, left, b, r = image_pads(*(args[k] for k in ("pad", "pad_t", "pad_l", "pad_b", "pad_r", "pads")))
    h_axis = 2 if args["order"] == "NCHW" else 1
    x_shape = list(dY.shape)
    x_shape[h_axis:h_axis + 2] = [dY.shape[h_axis] - t - b, dY.shape[h_axis + 1] - left - r]
    if min(x_shape[h_axis:h_axis + 2]) < 1:
        raise ShapeError(f"dY of shape {tuple(dY.shape)} is smaller than the pads ({t}, {left}, {b}, {r}) "
                         "(top, left, bottom, right): it cannot come from this PadImage")
    rows, cols, _ = pad_plan(Meta(SimpleNamespace(shape=x_shape, dtype=dY.dtype)), **args)
    return rows, cols, tuple(x_shape)


def _pad_shape(specs, **args):
    return [out_spec(_pad_gradient_plan(Meta(specs[0]), args)[2], specs[0].dtype)]


@op("PadImageGradient", inputs=1, outputs=1, inplace=(), args=PAD_ARGS, shape=_pad_shape)
def pad_image_gradient(xp, dY, **args):
    """dY -> dX: each padded pixel's gradient goes to the pixel it was copied from (none for the constant
    border; mirrored pixels for "reflect"; the edge for "edge")."""
    (hi, h_in), (wi, w_in), x_shape = _pad_gradient_plan(dY, args)
    h_axis = 2 if args["order"] == "NCHW" else 1
    every = args["mode"] != "constant"
    rows = _selection(hi, h_in | every, x_shape[h_axis], dY.dtype)
    cols = _selection(wi, w_in | every, x_shape[h_axis + 1], dY.dtype)
    return _spread(xp, dY, rows, cols, args["order"])


# ------------------------------------------------------------------------------------------- ResizeNearest
def _resize_plan(dY, X, scales, width_scale, height_scale, order):
    """(height axis, row and column source indices) after checking dY against the forward's output shape."""
    h_axis, hs, ws = resize_plan(X, scales, width_scale, height_scale, order)
    check_float(dY=dY)
    if hs is None:
        return h_axis, None, None
    rows, cols = nearest_index(X.shape[h_axis], hs), nearest_index(X.shape[h_axis + 1], ws)
    want = list(X.shape)
    want[h_axis:h_axis + 2] = [rows.size, cols.size]
    if tuple(dY.shape) != tuple(want):
        raise ShapeError(f"dY has shape {tuple(dY.shape)} but resizing X {tuple(X.shape)} by (height "
                         f"{hs}, width {ws}) gives {tuple(want)}; pass the forward's X and arguments")
    return h_axis, rows, cols


def _resize_shape(specs, *, width_scale, height_scale, order):
    scales = (specs[2].shape, host_floats(specs[2].value)) if len(specs) > 2 else None
    _resize_plan(Meta(specs[0]), Meta(specs[1]), scales, width_scale, height_scale, order)
    return [like(specs[1])]


@op("ResizeNearestGradient", inputs=(2, 3), outputs=1, inplace=(), shape=_resize_shape,
    args={"width_scale": 1.0, "height_scale": 1.0, "order": "NCHW"})
def resize_nearest_gradient(xp, dY, X, *scales, width_scale, height_scale, order):
    """dY, X[, scales] -> dX (X's shape): each output pixel's gradient goes to the input pixel it copied."""
    scales = (scales[0].shape, host_floats(backend.to_host(scales[0]))) if scales else None
    h_axis, rows, cols = _resize_plan(dY, X, scales, width_scale, height_scale, order)
    return _spread(xp, dY, _selection(rows, np.ones(rows.size, bool), X.shape[h_axis], dY.dtype),
                   _selection(cols, np.ones(cols.size, bool), X.shape[h_axis + 1], dY.dtype), order)


# ------------------------------------------------------------------------------------------- ChannelShuffle
def _shuffle_shape(specs, *, group, order, kernel):
    shuffle_layout(Meta(specs[0]), group, order)
    return [like(specs[0])]


@op("ChannelShuffleGradient", inputs=1, outputs=1, inplace=(), shape=_shuffle_shape,
    args={"group": 1, "order": "NCHW", "kernel": 1})
def channel_shuffle_gradient(xp, dY, *, group, order, kernel):
    """dY -> dX: the inverse permutation, a shuffle with C/group groups."""
    check_float(dY=dY)
    _, c, _ = shuffle_layout(dY, group, order)
    return shuffle(xp, dY, c // group, order)
