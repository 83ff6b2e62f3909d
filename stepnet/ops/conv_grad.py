"""Gradients of Conv and ConvTranspose, as Caffe2 registers them (conv_gradient_op.cc, conv_op_impl.h,
conv_transpose_gradient_op.cc, conv_transpose_op_impl.h).

The makers (conv.py) emit <forward type>Gradient(X, filter, dY) -> (dfilter, dbias, dX): dbias only when the forward
has a bias (otherwise no_bias=1 is added and the outputs are (dfilter, dX)), dX unless the forward says
no_gradient_to_input=1. Conv1D/2D/3D get Conv1DGradient/... (the PyTorch-era maker; the 2017 one always
said ConvGradient, which stepnet also runs). Kernels are GEMMs over the im2col columns of the forward, one
batched matmul per group, and col2im (the adjoint of im2col) for the image gradients.
"""
from __future__ import annotations

import math

from ..core.errors import ArgumentError, ShapeError
from .base import Meta, check_float, like, out_spec
from .conv import canonical_filter, conv_geometry, conv_transpose_geometry
from .registry import op
from .window import channels_first, col2im, from_channels_first, im2col, in_order, window_args

DIMS = ("1D", "2D", "3D")


def _check_outputs(name, n_out, no_bias):
    if not no_bias and n_out < 2:
        raise ArgumentError(f"{name} without no_bias writes the filter and bias gradients, so it needs 2 "
                            f"or 3 outputs (dfilter, dbias[, dX]), got {n_out}; add dbias or set no_bias=1")
    if no_bias and n_out > 2:
        raise ArgumentError(f"{name} with no_bias=1 has outputs (dfilter[, dX]), got {n_out}")


def _check_dy(name, dY, want):
    check_float(name, dY=dY)
    if tuple(dY.shape) != tuple(want):
        raise ShapeError(f"dY has shape {tuple(dY.shape)} but the forward output is {tuple(want)}; pass the "
                         "forward op's X, filter and output gradient, with the forward's arguments")


def _gradient_specs(X, W, no_bias):
    """(dfilter, dbias, dX) or (dfilter, dX) specs."""
    bias = [] if no_bias else [out_spec((W.shape[0],), W.dtype)]
    return [like(W), *bias, like(X)]


def _group_rows(a, group: int):
    """A channels-first (N, C, *spatial) array as (G, N*pixels, C/G): the GEMM layout of one group."""
    n, c, pixels = a.shape[0], a.shape[1], math.prod(a.shape[2:])   # explicit sizes: N may be 0
    return a.reshape(n, group, c // group, pixels).transpose(1, 0, 3, 2).reshape(group, n * pixels, c // group)


def _ungroup_rows(m, shape):
    """The inverse of _group_rows: (G, N*pixels, C/G) back to a channels-first array of the given shape."""
    n, c, group, pixels = shape[0], shape[1], m.shape[0], math.prod(shape[2:])
    return m.reshape(group, n, pixels, c // group).transpose(1, 0, 3, 2).reshape(shape)


def _weight_gradient(xp, rows, cols):
    """rows^T cols per group for rows (G, K, a) and cols (G, K, b), K = N*pixels: (G, a, b), computed as
    (cols^T rows)^T because BLAS is many times faster on that form of the long-K product."""
    return xp.matmul(cols.transpose(0, 2, 1), rows).transpose(0, 2, 1)


def _results(xp, order, dw, db, dx, n_out, no_bias):
    """The outputs in Caffe2's order, dfilter back in the order's filter layout."""
    dw = from_channels_first(xp, dw, order)
    outs = [dw] if no_bias else [dw, db]
    return tuple(outs + ([dx] if n_out > len(outs) else []))


# --------------------------------------------------------------------------------------------- Conv
CONV_GRAD_ARGS = {**window_args("kernel", "stride", "pad", "dilation"), "group": 1, "float16_compute": False,
                  "no_gradient_to_input": False, "no_bias": False}


def _conv_gradient_shape(specs, *, order, group, float16_compute, no_gradient_to_input, no_bias, **args):
    X, W, dY = map(Meta, specs)
    order, g = conv_geometry(X, W, None, order, group, args)
    _check_dy("ConvGradient", dY, in_order(X.shape[0], W.shape[0], g.out, order))
    return _gradient_specs(specs[0], specs[1], no_bias)


@op("ConvGradient", inputs=3, outputs=(1, 3), inplace=(), context=True, shape=_conv_gradient_shape,
    aliases=tuple(f"Conv{d}Gradient" for d in DIMS), args=CONV_GRAD_ARGS)
def conv_gradient(ctx, xp, X, W, dY, *, order, group, float16_compute, no_gradient_to_input, no_bias, **args):
    """X, filter, dY -> dfilter = dY^T cols, dbias = dY summed over batch and pixels, dX = col2im(dY W),
    per group; dX only when the op has an output for it."""
    n_out = len(ctx.opdef.output)
    _check_outputs("ConvGradient", n_out, no_bias)
    order, g = conv_geometry(X, W, None, order, group, args)
    xc, wc, dyc = channels_first(xp, X, order), canonical_filter(xp, W, order), channels_first(xp, dY, order)
    _check_dy("ConvGradient", dY, in_order(X.shape[0], W.shape[0], g.out, order))
    dy_rows = _group_rows(dyc, group)                                  # G x N*P x Mg
    cols = im2col(xp, xc, g, group)                                    # G x N*P x Cg*K
    dw = _weight_gradient(xp, dy_rows, cols).reshape(wc.shape)
    db = dyc.sum(axis=(0, *range(2, dyc.ndim)))
    dx = None
    if n_out == (2 if no_bias else 3):
        dcols = xp.matmul(dy_rows, wc.reshape(group, wc.shape[0] // group, math.prod(wc.shape[1:])))
        dx = from_channels_first(xp, col2im(xp, dcols, xc.shape, g, group), order)
    return _results(xp, order, dw, db, dx, n_out, no_bias)


# --------------------------------------------------------------------------------------------- ConvTranspose
CONV_T_GRAD_ARGS = {**window_args("kernel", "stride", "pad", "adj"), "group": 1,
                    "no_gradient_to_input": False, "no_bias": False}


def _conv_transpose_gradient_shape(specs, *, order, group, legacy_pad, no_gradient_to_input, no_bias, **args):
    X, W, dY = map(Meta, specs)
    order, c, _, out = conv_transpose_geometry(X, W, None, order, group, legacy_pad, args)
    _check_dy("ConvTransposeGradient", dY, in_order(X.shape[0], c, out, order))
    return [like(specs[1]), *([] if no_bias else [out_spec((c,), specs[1].dtype)]), like(specs[0])]


@op("ConvTransposeGradient", inputs=3, outputs=(1, 3), inplace=(), context=True, args=CONV_T_GRAD_ARGS,
    shape=_conv_transpose_gradient_shape)
def conv_transpose_gradient(ctx, xp, X, W, dY, *, order, group, legacy_pad, no_gradient_to_input, no_bias,
                            **args):
    """X, filter, dY -> dfilter = X^T im2col(dY), dbias = dY summed over batch and pixels,
    dX = im2col(dY) filter^T, per group: ConvTranspose's GEMM + col2im read backwards."""
    n_out = len(ctx.opdef.output)
    _check_outputs("ConvTransposeGradient", n_out, no_bias)
    order, c, g, out = conv_transpose_geometry(X, W, None, order, group, legacy_pad, args)
    _check_dy("ConvTransposeGradient", dY, in_order(X.shape[0], c, out, order))
    xc, wc, dyc = channels_first(xp, X, order), canonical_filter(xp, W, order), channels_first(xp, dY, order)
    m = xc.shape[1]
    wmat = wc.reshape(group, m // group, (c // group) * math.prod(g.kernel))   # G x Mg x Cg*K
    dcols = im2col(xp, dyc, g, group)                                          # G x N*P x Cg*K
    x_rows = _group_rows(xc, group)                                            # G x N*P x Mg
    dw = _weight_gradient(xp, x_rows, dcols).reshape(wc.shape)
    db = dyc.sum(axis=(0, *range(2, dyc.ndim)))
    dx = None
    if n_out == (2 if no_bias else 3):
        dx_rows = xp.matmul(dcols, wmat.transpose(0, 2, 1))                   # G x N*P x Mg
        dx = from_channels_first(xp, _ungroup_rows(dx_rows, xc.shape), order)
    return _results(xp, order, dw, db, dx, n_out, no_bias)
