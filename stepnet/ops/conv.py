"""Convolution: Conv (+ Conv1D/2D/3D) and ConvTranspose, on the window geometry of window.py.

Conv is im2col + one GEMM per group; ConvTranspose is its adjoint (GEMM + col2im). Arrays are handled
channels-first inside, so one code path serves NCHW and NHWC and 1-, 2- and 3-D images. The shape functions
run the same checks and the same geometry on shapes alone. The gradient maker (here) emits <forward
type>Gradient(X, filter, dY) -> (dfilter, dbias, dX); the gradient kernels are in conv_grad.py.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, ShapeError
from .base import Meta, check_float, out_spec
from .registry import op
from .window import (
    CAFFE_LEGACY_POOLING, LEGACY_NAMES, SAME, VALID, Geometry, args_key, channels_first, check_order, col2im, family,
    filter_gradient, from_channels_first, geometry, im2col, image_dims, in_order, positive, window_args, window_view)

# the window helpers stay importable from here, where they used to live
__all__ = ["canonical_filter", "col2im", "conv_geometry", "conv_transpose_geometry", "geometry", "im2col",
           "window_view"]

# --------------------------------------------------------------------------------------------- Conv
def _order_hint(x_shape, w_shape, order, group, transpose=False):
    """A sentence suggesting the other order when the shapes fit it better, else ''."""
    other = "NHWC" if order == "NCHW" else "NCHW"

    def chans(shape, o, filt):
        if filt and transpose:
            return shape[0]
        if filt:
            return (shape[1] if o == "NCHW" else shape[-1]) * group
        return shape[1] if o == "NCHW" else shape[-1]
    if transpose:
        fits = [(chans(x_shape, other, False) == w_shape[0], "the input looks like " + other)]
    else:
        fits = [(chans(x_shape, order, False) == chans(w_shape, other, True),
                 f"the filter looks like {other} layout (M x kernel x C/group)"),
                (chans(x_shape, other, False) == chans(w_shape, other, True),
                 f"the input and the filter look like {other}"),
                (chans(x_shape, other, False) == chans(w_shape, order, True),
                 f"the input looks like {other}")]
    for ok, why in fits:
        if ok:
            return f"; {why}: set order=\"{other}\" or transpose the data"
    return ""


def canonical_filter(xp, w, order):
    """A filter as (first dim, channels, *kernel) whatever the order."""
    return w if order == "NCHW" else xp.moveaxis(w, -1, 1)


def _conv_checks(X, W, b, order, group):
    if W.ndim != X.ndim:
        raise ShapeError(f"the filter must have the input's rank {X.ndim}, got filter shape {tuple(W.shape)}")
    if group < 1:
        raise ArgumentError(f"group must be positive, got {group}")
    C = X.shape[1] if order == "NCHW" else X.shape[-1]
    M, Cg = W.shape[0], (W.shape[1] if order == "NCHW" else W.shape[-1])
    if M % group:
        raise ShapeError(f"group {group} does not divide the {M} filters (filter shape {tuple(W.shape)})")
    if Cg * group != C:
        also = f"; group {group} does not divide the {C} input channels" if C % group else ""
        hint = _order_hint(X.shape, W.shape, order, group)
        raise ShapeError(f"the input has {C} channels ({order}) but the filter {tuple(W.shape)} expects "
                         f"{Cg} x group {group} = {Cg * group}{also}{hint}")
    if b is not None and (b.ndim != 1 or b.shape[0] != M):
        raise ShapeError(f"the bias must be a vector of the {M} output channels, got shape {tuple(b.shape)}")


def _kernel_of(args, W, order):
    """Kernel sizes taken from the filter, checked against the kernel arguments when these are given."""
    ks = tuple(int(v) for v in (W.shape[2:] if order == "NCHW" else W.shape[1:-1]))
    given = family(dict(args_key(args)), "kernel", len(ks))
    if given is not None and tuple(given) != ks:
        raise ShapeError(f"the kernel arguments say {list(given)} but the filter {tuple(W.shape)} has "
                         f"spatial dims {list(ks)}")
    return ks


def conv_geometry(X, W, b, order, group, args) -> tuple[str, Geometry]:
    """Conv's checks on arrays or specs; (canonical order, window geometry)."""
    order = check_order(order)
    check_float("Conv", X=X, filter=W, bias=b)
    _conv_checks(X, W, b, order, group)
    return order, geometry(args, image_dims(X.shape, order)[2], _kernel_of(args, W, order))


def _conv_shape(specs, *, order, group, float16_compute, no_gradient_to_input, **args):
    X, W, b = (*map(Meta, specs), None)[:3]
    order, g = conv_geometry(X, W, b, order, group, args)
    return [out_spec(in_order(X.shape[0], W.shape[0], g.out, order), X.dtype)]


def _conv_specialize(X, W, b=None, *, order, group, float16_compute, no_gradient_to_input, **args):
    """Conv's checks and geometry once per input signature; the returned kernel only computes."""
    order, g = conv_geometry(X, W, b, order, group, args)

    def fast(X, W, b=None):
        return _conv(np, X, W, b, order, g, group)
    return fast


@op("Conv", inputs=(2, 3), outputs=1, inplace=(), aliases=("Conv1D", "Conv2D", "Conv3D"), shape=_conv_shape,
    gradient=filter_gradient, specialize=_conv_specialize, grows="shapes",
    args={**window_args("kernel", "stride", "pad", "dilation"), "group": 1, "float16_compute": False,
          "no_gradient_to_input": False})
def conv(xp, X, W, b=None, *, order, group, float16_compute, no_gradient_to_input, **args):
    """N-D convolution Y = X * filter + bias (filter M x C/group x kernel in NCHW, M x kernel x C/group in
    NHWC): im2col + one GEMM per group."""
    order, g = conv_geometry(X, W, b, order, group, args)
    return _conv(xp, X, W, b, order, g, group)


def _conv(xp, X, W, b, order, g, group):
    xc, wc = channels_first(xp, X, order), canonical_filter(xp, W, order)
    n, m = xc.shape[0], wc.shape[0]
    cols = _columns(xp, xc, g, group)                                 # N x G x Cg*K x P
    y = xp.matmul(wc.reshape(group, m // group, cols.shape[2]), cols)  # N x G x Mg x P: channels first already
    y = y.reshape((n, m) + g.out)
    if b is not None:
        y += b.reshape((m,) + (1,) * g.ndim)
    return from_channels_first(xp, y, order)


def _columns(xp, xc, g, group):
    """The GEMM's right-hand side (N, G, C/G*kernel, out pixels) of a channels-first input: for a 1×1 kernel
    with stride 1 and no padding the input itself (a view), otherwise one copy of its strided window view."""
    n, c = xc.shape[:2]
    pixels = math.prod(g.out)
    if (all(k == 1 for k in g.kernel) and all(st == 1 for st in g.stride) and not any(g.pad_begin)
            and not any(g.pad_end)):
        return xc.reshape(n, group, c // group, pixels)
    nd = g.ndim
    v = window_view(xp, xc, g).reshape((n, group, c // group) + g.out + g.kernel)
    v = v.transpose((0, 1, 2) + tuple(range(3 + nd, 3 + 2 * nd)) + tuple(range(3, 3 + nd)))
    return v.reshape(n, group, (c // group) * math.prod(g.kernel), pixels)


# --------------------------------------------------------------------------------------------- ConvTranspose
def conv_transpose_geometry(X, W, b, order, group, legacy_pad, args):
    """ConvTranspose's checks on arrays or specs; (canonical order, output channels, geometry, output
    spatial sizes)."""
    order = check_order(order)
    check_float("ConvTranspose", X=X, filter=W, bias=b)
    if W.ndim != X.ndim:
        raise ShapeError(f"the filter must have the input's rank {X.ndim}, got filter shape {tuple(W.shape)}")
    if group < 1:
        raise ArgumentError(f"group must be positive, got {group}")
    _, m, spatial = image_dims(X.shape, order)
    first, cg = W.shape[0], (W.shape[1] if order == "NCHW" else W.shape[-1])
    if first != m:
        raise ShapeError(f"the filter's first dim must equal the {m} input channels ({order}), got filter "
                         f"{tuple(W.shape)}{_order_hint(X.shape, W.shape, order, group, transpose=True)}")
    if m % group:
        raise ShapeError(f"group {group} does not divide the {m} input channels")
    c = cg * group
    if b is not None and (b.ndim != 1 or b.shape[0] != c):
        raise ShapeError(f"the bias must be a vector of the {c} output channels, got shape {tuple(b.shape)}")
    return (order, c, *_transpose_geometry(args, legacy_pad, spatial, _kernel_of(args, W, order)))


def _conv_transpose_shape(specs, *, order, group, legacy_pad, no_gradient_to_input, **args):
    X, W, b = (*map(Meta, specs), None)[:3]
    order, c, _, out = conv_transpose_geometry(X, W, b, order, group, legacy_pad, args)
    return [out_spec(in_order(X.shape[0], c, out, order), X.dtype)]


@op("ConvTranspose", inputs=(2, 3), outputs=1, inplace=(), shape=_conv_transpose_shape, gradient=filter_gradient,
    grows="shapes",
    args={**window_args("kernel", "stride", "pad", "adj"), "group": 1, "no_gradient_to_input": False})
def conv_transpose(xp, X, W, b=None, *, order, group, legacy_pad, no_gradient_to_input, **args):
    """The adjoint of Conv: X (N x M x in) with filter M x C/group x kernel (NCHW) gives
    Y of size (in-1)*stride + kernel + adj - pads; GEMM then col2im."""
    order, c, g, out_sizes = conv_transpose_geometry(X, W, b, order, group, legacy_pad, args)
    xc, wc = channels_first(xp, X, order), canonical_filter(xp, W, order)
    n, m, cg = xc.shape[0], xc.shape[1], c // group
    pixels, taps = math.prod(xc.shape[2:]), math.prod(wc.shape[2:])
    mg = m // group
    xmat = xc.reshape((n, group, mg, pixels)).transpose(1, 0, 3, 2).reshape(group, n * pixels, mg)
    cols = xp.matmul(xmat, wc.reshape(group, mg, cg * taps))         # G x N*P x Cg*K
    y = col2im(xp, cols, (n, c) + out_sizes, g, group)
    if b is not None:
        y += b.reshape((c,) + (1,) * g.ndim)
    return from_channels_first(xp, y, order)


def _transpose_geometry(args, legacy, spatial, ks):
    """conv_transpose_unpool_op_base.h: out = (in-1)*stride + kernel + adj - pad_begin - pad_end; VALID and
    SAME both mean no padding."""
    nd, key = len(spatial), dict(args_key(args))
    if legacy == CAFFE_LEGACY_POOLING:
        raise ArgumentError("ConvTranspose does not support legacy_pad=3 (CAFFE_LEGACY_POOLING)")
    if legacy not in LEGACY_NAMES:
        raise ArgumentError(f"legacy_pad must be 0, 1 or 2 for ConvTranspose, got {legacy}")
    pads = family(key, "pad", nd)
    if legacy in (VALID, SAME) and pads is not None:
        raise ArgumentError(f"legacy_pad={legacy} sets the padding to 0; remove the explicit pad arguments")
    stride = positive("stride", family(key, "stride", nd) or (1,) * nd)
    adj = positive("adj", family(key, "adj", nd) or (0,) * nd, minimum=0)
    pads = positive("pads", pads or (0,) * (2 * nd), minimum=0)
    for a, s in zip(adj, stride, strict=True):
        if a > s:
            raise ArgumentError(f"adj must not exceed stride (adjs {list(adj)}, strides {list(stride)})")
    out = tuple((spatial[i] - 1) * stride[i] + ks[i] + adj[i] - pads[i] - pads[nd + i] for i in range(nd))
    if any(o < 1 for o in out):
        raise ShapeError(f"the pads {list(pads)} remove the whole output (sizes before padding "
                         f"{[o + pads[i] + pads[nd + i] for i, o in enumerate(out)]})")
    geom = Geometry(tuple(ks), tuple(stride), (1,) * nd, tuple(pads[:nd]), tuple(pads[nd:]),
                    tuple(int(v) for v in spatial))
    return geom, out
