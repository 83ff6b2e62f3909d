"""Pooling: MaxPool, AveragePool (+ 1D/2D/3D aliases), LpPool, MaxPoolWithIndex, and LRN (local response
normalization).

Windows come from window.window_view (the same geometry as Conv, see conv_pool_op_base.h); only the reduction
differs. Caffe2 pools over the valid pixels of a window only: padding never wins a max, and an average
divides by the number of valid pixels unless count_include_pad=1 (pool_op.cc; the argument appeared in the
PyTorch era, before it the count always excluded padding). Pooling rejects dilation and pads >= kernel, as
Caffe2 does. Shape functions run the same checks and geometry on the input's shape. Gradient makers
(pool_gradient_op.cc, lp_pool_op.cc, local_response_normalization_op.cc): <forward type>Gradient(X, Y, dY) -> dX,
whose kernels are in pool_grad.py.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError
from .base import check_float, like, out_spec, single_gradient
from .registry import op
from .window import (
    channels_first, check_order, from_channels_first, geometry, image_dims, in_order, window_args, window_view)

POOL_ARGS = window_args("kernel", "stride", "pad", "dilation", global_pooling=True)


def pool_geometry(X, name, args):
    """The argument and dtype checks of a pooling op on an array or a spec; (order, N, C, window geometry).
    Takes `order` out of args."""
    order = check_order(args.pop("order"))
    check_float(name, X=X)
    n, c, spatial = image_dims(X.shape, order)
    return order, n, c, geometry(args, spatial, pool=True)


def _pool_shape(name):
    def shape(specs, *, count_include_pad=None, p=None, **args):
        order, n, c, g = pool_geometry(specs[0], name, args)
        return [out_spec(in_order(n, c, g.out, order), specs[0].dtype)]
    return shape


def _windows(xp, X, name, args):
    """(X viewed channels-first, its window geometry, the order), after the argument and dtype checks."""
    order, _, _, g = pool_geometry(X, name, args)
    return channels_first(xp, X, order), g, order


def _reduce(xp, v, g, how):
    """Max or sum of a window view over its kernel axes: one whole-array op per kernel position (much faster
    than a strided reduction), or a direct reduction for global / very large windows."""
    if math.prod(g.out) == 1 or math.prod(g.kernel) > 64:
        axes = tuple(range(2 + g.ndim, 2 + 2 * g.ndim))
        return xp.max(v, axis=axes) if how == "max" else xp.sum(v, axis=axes)
    acc = None
    for tap in itertools.product(*(range(k) for k in g.kernel)):
        part = v[(Ellipsis,) + tap]
        if acc is None:
            acc = part.copy()
        elif how == "max":
            xp.maximum(acc, part, out=acc)
        else:
            acc += part
    return acc


def valid_counts(xp, g, spatial, dtype):
    """Per output position, the number of window pixels inside the image (outer product of per-dim counts)."""
    count = np.ones((), dtype=np.int64)
    for i in range(g.ndim):
        start = np.arange(g.out[i]) * g.stride[i] - g.pad_begin[i]
        n = np.clip(np.minimum(start + g.kernel[i], spatial[i]) - np.maximum(start, 0), 0, None)
        count = np.multiply.outer(count, n)
    return xp.asarray(np.maximum(count, 1).astype(dtype))


def _pool_gradient(g):
    """GetPoolGradient: <forward type>Gradient(X, Y, dY) -> dX (MaxPool2D -> MaxPool2DGradient, ...)."""
    g.op(g.def_.type + "Gradient", [g.I(0), g.O(0), g.GO(0)], [g.GI(0)])


@op("MaxPool", inputs=1, outputs=1, inplace=(), aliases=("MaxPool1D", "MaxPool2D", "MaxPool3D"),
    args=POOL_ARGS, shape=_pool_shape("MaxPool"), gradient=_pool_gradient, grows="shapes")
def max_pool(xp, X, **args):
    """Maximum over each window; padding never wins (it holds the dtype's lowest value, Caffe2's start)."""
    xc, g, order = _windows(xp, X, "MaxPool", args)
    lowest = float(xp.finfo(X.dtype).min)
    y = _reduce(xp, window_view(xp, xc, g, fill=lowest), g, "max")
    return from_channels_first(xp, y, order)


def index_geometry(X, args):
    """MaxPoolWithIndex's checks (max_pool_with_index.cu: 4-D NCHW float32 / float16; float64 here too) on an
    array or a spec; (N, C, (H, W), geometry)."""
    if len(X.shape) != 4:
        raise ArgumentError(f"MaxPoolWithIndex takes a 4-D NCHW X, got shape {tuple(X.shape)}")
    if X.dtype is not None and np.dtype(X.dtype) not in (np.float32, np.float16, np.float64):
        raise DTypeError(f"MaxPoolWithIndex takes float32, float16 or float64, got {X.dtype}")
    order, n, c, g = pool_geometry(X, "MaxPoolWithIndex", args)
    if order != "NCHW":
        raise ArgumentError("MaxPoolWithIndex computes on NCHW only (Caffe2's kernel reads X as NCHW); "
                            "transpose with NHWC2NCHW first")
    return n, c, tuple(int(d) for d in X.shape[2:]), g


def _index_shape(specs, **args):
    n, c, _, g = index_geometry(specs[0], args)
    return [out_spec((n, c, *g.out), specs[0].dtype), out_spec((n * c * math.prod(g.out),), np.int32)]


def _index_gradient(g):
    """GetMaxPoolWithIndexGradient: MaxPoolWithIndexGradient(X, dY, Index) -> dX."""
    g.op("MaxPoolWithIndexGradient", [g.I(0), g.GO(0), g.O(1)], [g.GI(0)])


@op("MaxPoolWithIndex", inputs=1, outputs=2, inplace=(), args=POOL_ARGS, shape=_index_shape,
    gradient=_index_gradient, grows="shapes")
def max_pool_with_index(xp, X, **args):
    """Y: each window's maximum, as MaxPool; Index (int32, one per element of Y, flat): where it was, h·W + w in
    its (n, c) plane, the first in row-major window order on ties. Caffe2's CUDA kernel, computed in float32
    from a start of -FLT_MAX with a strict >: a window with nothing above that (all -inf or NaN) gives
    Y = -FLT_MAX (-inf in float16) and Index -1. Caffe2 has it for CUDA only; here on every device, and for
    float64 too (computed in float64 from its lowest value)."""
    _, _, (h, w), g = index_geometry(X, dict(args))
    compute = np.float64 if X.dtype == np.float64 else np.float32
    v = window_view(xp, X.astype(compute, copy=False), g, fill=float("nan"))   # padding never wins
    rows = np.arange(g.out[0]) * g.stride[0] - g.pad_begin[0]
    cols = np.arange(g.out[1]) * g.stride[1] - g.pad_begin[1]
    best = xp.full(v.shape[:4], np.finfo(compute).min, compute)
    index = xp.full(v.shape[:4], -1, np.int32)
    for kh, kw in itertools.product(range(g.kernel[0]), range(g.kernel[1])):
        part = v[..., kh, kw]
        wins = part > best
        best = xp.where(wins, part, best)
        at = xp.asarray(((rows + kh)[:, None] * w + (cols + kw)[None, :]).astype(np.int32))
        index = xp.where(wins, at, index)
    return best.astype(X.dtype), index.reshape(-1)


@op("AveragePool", inputs=1, outputs=1, inplace=(),
    aliases=("AveragePool1D", "AveragePool2D", "AveragePool3D"),
    args={**POOL_ARGS, "count_include_pad": False}, shape=_pool_shape("AveragePool"), gradient=_pool_gradient,
    grows="shapes")
def average_pool(xp, X, *, count_include_pad, **args):
    """Mean over each window: divided by its valid pixels, or by the kernel size with count_include_pad."""
    xc, g, order = _windows(xp, X, "AveragePool", args)
    y = _reduce(xp, window_view(xp, xc, g), g, "sum")
    if count_include_pad:
        y = y / float(np.prod(g.kernel))
    else:
        y = y / valid_counts(xp, g, xc.shape[2:], X.dtype)
    return from_channels_first(xp, y, order)


@op("LpPool", inputs=1, outputs=1, inplace=(), args={**POOL_ARGS, "p": 2.0}, shape=_pool_shape("LpPool"),
    gradient=_pool_gradient, grows="shapes")
def lp_pool(xp, X, *, p, **args):
    """(sum over each window of |x|^p)^(1/p) (lp_pool_op.cc); padding contributes nothing."""
    xc, g, order = _windows(xp, X, "LpPool", args)
    y = _reduce(xp, window_view(xp, xp.abs(xc) ** p, g), g, "sum") ** (1.0 / p)
    return from_channels_first(xp, y, order)


def lrn_axis(X, size, order) -> int:
    """LRN's checks on an array or a spec; the channel axis."""
    order = check_order(order)
    check_float("LRN", X=X)
    if size < 1:
        raise ArgumentError(f"LRN needs a positive (odd) size, got size={size}")
    if len(X.shape) < 2:
        raise ArgumentError(f"LRN needs a channel axis, got a {len(X.shape)}-D input")
    return 1 if order == "NCHW" else len(X.shape) - 1


def _lrn_shape(specs, *, size, alpha, beta, bias, order):
    lrn_axis(specs[0], size, order)
    return [like(specs[0]), like(specs[0])]


@op("LRN", inputs=1, outputs=(1, 2), inplace=(), shape=_lrn_shape,
    args={"size": 0, "alpha": 0.0, "beta": 0.0, "bias": 1.0, "order": "NCHW"},
    gradient=single_gradient("LRNGradient", ["I0", "O0", "GO0"]))
def lrn(xp, X, *, size, alpha, beta, bias, order):
    """Across-channel LRN (local_response_normalization_op.cc): scale = bias + alpha/size * (sum of x^2 over
    `size` channels starting (size-1)/2 before c, zeros outside), Y = X * scale^-beta. Outputs Y and scale."""
    axis = lrn_axis(X, size, order)
    scale = channel_window_sum(xp, X * X, axis, size, (size - 1) // 2) * (alpha / size) + bias
    return X * scale ** -beta, scale


def channel_window_sum(xp, a, axis: int, size: int, before: int):
    """For each channel c, the sum of a over channels c-before .. c-before+size-1 (zero outside): one
    shifted add per window position."""
    channels = a.shape[axis]
    widths = [(0, 0)] * a.ndim
    widths[axis] = (before, size - 1 - before)
    padded = xp.pad(a, widths, mode="constant")
    total = xp.zeros_like(a)
    for j in range(size):
        index = [slice(None)] * a.ndim
        index[axis] = slice(j, j + channels)
        total += padded[tuple(index)]
    return total
