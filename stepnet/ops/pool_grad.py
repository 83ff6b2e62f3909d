"""Gradient ops of the pooling family and LRN, as Caffe2 registers them (pool_gradient_op.cc, lp_pool_op.cc,
local_response_normalization_op.cc); the makers are in pool.py.

<Pool>Gradient(X, Y, dY) -> dX for MaxPool, AveragePool (and their 1D/2D/3D forms: the maker appends
"Gradient" to the forward type) and LpPool; LRNGradient(X, Y, dY) -> dX recomputes the scale from X, as
Caffe2 does (the scale output of LRN is not an input). A pooling gradient is the adjoint of its forward's
window reads: scatter_windows adds one strided slab per kernel position, so no Python loop runs over pixels,
and pixels read from the padding (or the CAFFE_LEGACY_POOLING tail) fall away as in the forward.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .base import Meta, check_float, like
from .pool import POOL_ARGS, channel_window_sum, index_geometry, lrn_axis, pool_geometry, valid_counts
from .registry import op
from .window import channels_first, from_channels_first, in_order, scatter_windows, window_view

DIMS = ("1D", "2D", "3D")


def _checks(X, Y, dY, name, args):
    """The forward's argument checks on X, plus Y and dY of the pooled shape; (order, geometry)."""
    order, n, c, geom = pool_geometry(X, name, args)
    check_float(name, X=X, Y=Y, dY=dY)
    want = in_order(n, c, geom.out, order)
    for what, a in (("Y", Y), ("dY", dY)):
        if tuple(a.shape) != want:
            raise ShapeError(f"{what} has shape {tuple(a.shape)} but pooling X {tuple(X.shape)} ({order}) "
                             f"gives {want}; pass the forward op's input, output and output gradient")
    return order, geom


def _shape(name):
    def shape(specs, *, count_include_pad=None, p=None, **args):
        _checks(*map(Meta, specs), name, args)
        return [like(specs[0])]
    return shape


def _backward(xp, X, Y, dY, name, args, make_part):
    """dX = the scatter of make_part(xc, yc, dyc, geom)(tap) over every kernel position, in X's order."""
    order, geom = _checks(X, Y, dY, name, args)
    xc, yc, dyc = (channels_first(xp, a, order) for a in (X, Y, dY))
    dx = scatter_windows(xp, make_part(xc, yc, dyc, geom), xc.shape, geom, X.dtype)
    return from_channels_first(xp, dx, order)


def _index_gradient_checks(X, dY, index, args) -> None:
    n, c, _, g = index_geometry(X, dict(args))
    check_float("MaxPoolWithIndexGradient", X=X, dY=dY)
    if tuple(dY.shape) != (n, c, *g.out):
        raise ShapeError(f"dY has shape {tuple(dY.shape)} but pooling X {tuple(X.shape)} gives {(n, c, *g.out)}")
    if index.dtype is not None and np.dtype(index.dtype) != np.int32:
        raise DTypeError(f"Index must be int32 (MaxPoolWithIndex's second output), got {index.dtype}")
    if tuple(index.shape) != (n * c * math.prod(g.out),):
        raise ShapeError(f"Index has shape {tuple(index.shape)}; MaxPoolWithIndex of X {tuple(X.shape)} gives "
                         f"({n * c * math.prod(g.out)},): pass the forward op's second output")


def _index_gradient_shape(specs, **args):
    _index_gradient_checks(*map(Meta, specs), args)
    return [like(specs[0])]


@op("MaxPoolWithIndexGradient", inputs=3, outputs=1, inplace=(), args=POOL_ARGS, shape=_index_gradient_shape)
def max_pool_with_index_gradient(xp, X, dY, index, **args):
    """X, dY, Index -> dX: each dY goes to the pixel its Index names in its (n, c) plane (sums where windows
    overlap, in float64 then rounded to X's type); an Index of -1 (a window with no maximum) gives nothing."""
    _index_gradient_checks(X, dY, index, args)
    n, c, h, w = X.shape
    plane = h * w
    bad = (index < -1) | (index >= plane)
    if bool(bad.any()):
        k = int(xp.argmax(bad))
        raise ShapeError(f"Index[{k}] = {int(index[k])} is outside its {h}x{w} plane (-1 or 0..{plane - 1}): "
                         "pass the forward op's second output")
    per_plane = index.size // max(n * c, 1)
    base = xp.repeat(xp.arange(n * c, dtype=np.int64) * plane, per_plane)
    keep = index >= 0
    flat = (base + index.astype(np.int64))[keep]
    dx = xp.bincount(flat, weights=dY.reshape(-1)[keep].astype(np.float64), minlength=n * c * plane)
    return dx.astype(X.dtype).reshape(X.shape)


@op("MaxPoolGradient", inputs=3, outputs=1, inplace=(), aliases=tuple(f"MaxPool{d}Gradient" for d in DIMS),
    args=POOL_ARGS, shape=_shape("MaxPoolGradient"))
def max_pool_gradient(xp, X, Y, dY, **args):
    """X, Y, dY -> dX: each window's dY goes to every pixel of the window equal to its maximum Y (Caffe2's
    rule in both eras: tied pixels each get the whole gradient, not only the first)."""
    nan = X.dtype.type("nan")  # padding never equals a maximum

    def make(xc, yc, dyc, geom):
        v, zero = window_view(xp, xc, geom, fill=nan), dyc.dtype.type(0)
        return lambda tap: xp.where(v[(Ellipsis,) + tap] == yc, dyc, zero)
    return _backward(xp, X, Y, dY, "MaxPoolGradient", args, make)


@op("AveragePoolGradient", inputs=3, outputs=1, inplace=(),
    aliases=tuple(f"AveragePool{d}Gradient" for d in DIMS), args={**POOL_ARGS, "count_include_pad": False},
    shape=_shape("AveragePoolGradient"))
def average_pool_gradient(xp, X, Y, dY, *, count_include_pad, **args):
    """X, Y, dY -> dX: each window's dY divided by its pixel count (valid pixels, or the whole kernel with
    count_include_pad) goes to each of its pixels. Y is not read (Caffe2 passes it for the common form)."""
    def make(xc, yc, dyc, geom):
        if count_include_pad:
            share = dyc / dyc.dtype.type(math.prod(geom.kernel))
        else:
            share = dyc / valid_counts(xp, geom, xc.shape[2:], dyc.dtype)
        return lambda tap: share
    return _backward(xp, X, Y, dY, "AveragePoolGradient", args, make)


@op("LpPoolGradient", inputs=3, outputs=1, inplace=(), args={**POOL_ARGS, "p": 2.0},
    shape=_shape("LpPoolGradient"))
def lp_pool_gradient(xp, X, Y, dY, *, p, **args):
    """X, Y, dY -> dX: d(sum |x|^p)^(1/p)/dx = sign(x)|x|^(p-1) / Y^(p-1), times each window's dY (Caffe2
    writes x|x|^(p-2), equal except at x = 0 where it is NaN for p < 2)."""
    def make(xc, yc, dyc, geom):
        v, coef = window_view(xp, xc, geom), dyc / yc ** (p - 1)

        def part(tap):
            x = v[(Ellipsis,) + tap]
            return xp.sign(x) * xp.abs(x) ** (p - 1) * coef
        return part
    return _backward(xp, X, Y, dY, "LpPoolGradient", args, make)


# ------------------------------------------------------------------------------------------------ LRN
def _lrn_checks(X, Y, dY, size, order) -> int:
    axis = lrn_axis(X, size, order)
    check_float("LRNGradient", X=X, Y=Y, dY=dY)
    for what, a in (("Y", Y), ("dY", dY)):
        if tuple(a.shape) != tuple(X.shape):
            raise ShapeError(f"{what} has shape {tuple(a.shape)} but X has {tuple(X.shape)}; LRNGradient "
                             "takes the forward's X, Y and dY, all of one shape")
    return axis


def _lrn_shape(specs, *, size, alpha, beta, bias, order):
    _lrn_checks(*map(Meta, specs), size, order)
    return [like(specs[0])]


@op("LRNGradient", inputs=3, outputs=1, inplace=(), shape=_lrn_shape,
    args={"size": 0, "alpha": 0.0, "beta": 0.0, "bias": 1.0, "order": "NCHW"})
def lrn_gradient(xp, X, Y, dY, *, size, alpha, beta, bias, order):
    """X, Y, dY -> dX = dY * scale^-beta - (2 alpha beta / size) * X * S, where scale is recomputed from X and
    S sums dY*Y/scale over the channels whose window holds c (the window of LRN read backwards)."""
    axis = _lrn_checks(X, Y, dY, size, order)
    before = (size - 1) // 2
    scale = channel_window_sum(xp, X * X, axis, size, before) * (alpha / size) + bias
    ratios = channel_window_sum(xp, dY * Y / scale, axis, size, size - 1 - before)
    return dY * scale ** -beta - (2.0 * alpha * beta / size) * X * ratios
