"""Locally connected layers: LC (and LC1D / LC2D / LC3D), a convolution whose filter differs at every output
position, with their gradient ops (caffe2/operators/locally_connected_op{,_impl}.h, locally_connected_op.cc).

Shapes (NCHW, d spatial dims): X is N x C x in..., the filter out... x M x C/group x kernel..., the bias
out... x M, Y is N x M x out...; out... follows the window arguments as for Conv (conv_pool_op_base.h) and
must equal the filter's leading dims. NHWC is 2-D only and without groups: X N x H x W x C, filter
YH x YW x M x kH x kW x C, Y N x YH x YW x M.

The maker emits <type>Gradient(X, filter, dY) -> (dfilter, dbias, dX) as Conv's does: no dbias (and
no_bias=1) without a bias input, no dX with no_gradient_to_input.
"""
from __future__ import annotations

import math

from ..core.errors import ArgumentError, ShapeError
from .base import Meta, check_float, like, out_spec
from .registry import op
from .window import (args_key, channels_first, check_order, family, filter_gradient, from_channels_first, geometry,
                     image_dims, in_order, scatter_windows, window_args, window_view)

DIMS = ("1D", "2D", "3D")
LC_ARGS = {**window_args("kernel", "stride", "pad", "dilation"), "group": 1, "no_gradient_to_input": False}


class Layout:
    """What the checks found: order, group, the geometry, N, C, M and the spatial dims."""

    def __init__(self, order, group, geom, n, c, m):
        self.order, self.group, self.geom, self.n, self.c, self.m = order, group, geom, n, c, m

    @property
    def y_shape(self) -> tuple:
        return in_order(self.n, self.m, self.geom.out, self.order)

    @property
    def bias_shape(self) -> tuple:
        return (*self.geom.out, self.m)


def lc_layout(op_type: str, X, W, b, order, group, args) -> Layout:
    """LC's checks on arrays or specs (Caffe2's, with clear messages)."""
    order = check_order(order)
    check_float(op_type, X=X, filter=W, bias=b)
    n, c, spatial = image_dims(X.shape, order)
    nd = len(spatial)
    if len(W.shape) != len(X.shape) + nd:
        raise ShapeError(f"{op_type}: the filter must have {len(X.shape) + nd} dims (out... x M x C/group x "
                         f"kernel...) for a {len(X.shape)}-D input, got shape {tuple(W.shape)}")
    if group < 1:
        raise ArgumentError(f"{op_type}: group must be positive, got {group}")
    if order == "NHWC" and (nd != 2 or group != 1):
        raise ArgumentError(f"{op_type}: NHWC supports 2-D images without groups only (got {nd}-D, group {group})")
    m = int(W.shape[nd])
    if order == "NCHW":
        cg, ks = W.shape[nd + 1], tuple(int(k) for k in W.shape[nd + 2:])
    else:
        cg, ks = W.shape[-1], tuple(int(k) for k in W.shape[nd + 1:-1])
    if cg * group != c:
        raise ShapeError(f"{op_type}: the input has {c} channels ({order}) but the filter {tuple(W.shape)} holds "
                         f"{cg} per group x group {group} = {cg * group}")
    if m % group:
        raise ShapeError(f"{op_type}: group {group} does not divide the {m} outputs of the filter {tuple(W.shape)}")
    given = family(dict(args_key(args)), "kernel", nd)
    if given is not None and tuple(given) != ks:
        raise ShapeError(f"{op_type}: the kernel arguments say {list(given)} but the filter {tuple(W.shape)} has "
                         f"kernel dims {list(ks)}")
    geom = geometry(args, spatial, ks)
    if tuple(int(d) for d in W.shape[:nd]) != geom.out:
        raise ShapeError(f"{op_type}: the output is {list(geom.out)} but the filter {tuple(W.shape)} has "
                         f"positions {list(W.shape[:nd])}; give one filter per output position")
    layout = Layout(order, group, geom, n, c, m)
    if b is not None and tuple(b.shape) != layout.bias_shape:
        raise ShapeError(f"{op_type}: the bias must have shape {layout.bias_shape} (out... x M), got "
                         f"{tuple(b.shape)}")
    return layout


def _filter_rows(xp, W, lay: Layout):
    """The filter as (P, G, M/G, C/G, K): P output positions, K kernel taps."""
    nd = lay.geom.ndim
    wc = W if lay.order == "NCHW" else xp.moveaxis(W, -1, nd + 1)
    p, k = math.prod(lay.geom.out), math.prod(lay.geom.kernel)
    return wc.reshape(p, lay.group, lay.m // lay.group, lay.c // lay.group, k)


def _patches(xp, X, lay: Layout):
    """The input windows as (N, G, C/G, P, K)."""
    v = window_view(xp, channels_first(xp, X, lay.order), lay.geom)
    return v.reshape(lay.n, lay.group, lay.c // lay.group, math.prod(lay.geom.out), math.prod(lay.geom.kernel))


def _lc_shape(specs, *, order, group, no_gradient_to_input, **args):
    X, W, b = (*map(Meta, specs), None)[:3]
    lay = lc_layout("LC", X, W, b, order, group, args)
    return [out_spec(lay.y_shape, specs[0].dtype)]


@op("LC", inputs=(2, 3), outputs=1, inplace=(), aliases=tuple(f"LC{d}" for d in DIMS), args=LC_ARGS,
    shape=_lc_shape, shapes_from_inputs=True, grows="shapes", gradient=filter_gradient)
def locally_connected(xp, X, W, b=None, *, order, group, no_gradient_to_input, **args):
    """Y[n, m, p] = sum over c (of m's group) and kernel taps k of filter[p, m, c, k] * window_p(X)[n, c, k],
    plus bias[p, m]: a convolution with its own filter at every output position p."""
    lay = lc_layout("LC", X, W, b, order, group, args)
    y = xp.einsum("ngcpk,pgmck->ngmp", _patches(xp, X, lay), _filter_rows(xp, W, lay))
    y = y.reshape((lay.n, lay.m, math.prod(lay.geom.out)))
    if b is not None:
        y = y + b.reshape(-1, lay.m).T
    return from_channels_first(xp, y.reshape((lay.n, lay.m) + lay.geom.out), lay.order)


# --------------------------------------------------------------------------------------------- gradient
def _grad_outputs(op_type, n_out, no_bias) -> bool:
    """Whether dX is wanted, after checking the output count against no_bias."""
    if n_out > (2 if no_bias else 3) or (not no_bias and n_out < 2):
        raise ArgumentError(f"{op_type} writes (dfilter, dbias[, dX]), or (dfilter[, dX]) with no_bias=1; got "
                            f"{n_out} outputs with no_bias={int(no_bias)}")
    return n_out == (2 if no_bias else 3)


def _dy_rows(xp, dY, lay: Layout, op_type):
    check_float(op_type, dY=dY)
    if tuple(dY.shape) != lay.y_shape:
        raise ShapeError(f"{op_type}: dY has shape {tuple(dY.shape)} but the forward output is {lay.y_shape}")
    dyc = channels_first(xp, dY, lay.order)
    return dyc.reshape(lay.n, lay.group, lay.m // lay.group, math.prod(lay.geom.out))


def _lc_grad_shape(specs, *, order, group, no_gradient_to_input, no_bias, **args):
    X, W, dY = map(Meta, specs)
    lay = lc_layout("LCGradient", X, W, None, order, group, args)
    if tuple(dY.shape) != lay.y_shape:
        raise ShapeError(f"LCGradient: dY has shape {tuple(dY.shape)} but the forward output is {lay.y_shape}")
    bias = [] if no_bias else [out_spec(lay.bias_shape, specs[1].dtype)]
    return [like(specs[1]), *bias, like(specs[0])]


@op("LCGradient", inputs=3, outputs=(1, 3), inplace=(), context="structure",
    aliases=tuple(f"LC{d}Gradient" for d in DIMS), args={**LC_ARGS, "no_bias": False}, shape=_lc_grad_shape)
def locally_connected_gradient(ctx, xp, X, W, dY, *, order, group, no_gradient_to_input, no_bias, **args):
    """X, filter, dY -> dfilter[p, m, c, k] = sum_n dY[n, m, p] window_p(X)[n, c, k], dbias[p, m] = sum_n
    dY[n, m, p] (unless no_bias), and dX (when the op has an output for it): every window's share
    sum_m dY[n, m, p] filter[p, m, c, k] added back onto the pixels it read."""
    want_dx = _grad_outputs("LCGradient", len(ctx.opdef.output), no_bias)
    lay = lc_layout("LCGradient", X, W, None, order, group, args)
    dy = _dy_rows(xp, dY, lay, "LCGradient")                              # N, G, Mg, P
    nd = lay.geom.ndim
    dw = xp.einsum("ngmp,ngcpk->pgmck", dy, _patches(xp, X, lay))
    dw = dw.reshape(lay.geom.out + (lay.m, lay.c // lay.group) + lay.geom.kernel)
    if lay.order == "NHWC":
        dw = xp.moveaxis(dw, nd + 1, -1)
    outs = [xp.ascontiguousarray(dw)]
    if not no_bias:
        outs.append(xp.ascontiguousarray(dy.reshape(lay.n, lay.m, -1).sum(axis=0).T).reshape(lay.bias_shape))
    if want_dx:
        dv = xp.einsum("ngmp,pgmck->ngcpk", dy, _filter_rows(xp, W, lay))
        dv = dv.reshape((lay.n, lay.c) + lay.geom.out + lay.geom.kernel)
        lead = (slice(None),) * (2 + nd)
        x_shape = (lay.n, lay.c) + image_dims(X.shape, lay.order)[2]
        dx = scatter_windows(xp, lambda tap: dv[lead + tap], x_shape, lay.geom, X.dtype)
        outs.append(from_channels_first(xp, dx, lay.order))
    return tuple(outs)

