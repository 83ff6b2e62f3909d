"""Ops that fuse a few steps into one: ConvRelu (caffe2/operators/conv_relu_op.cc: Conv with Conv's arguments,
then max(0, .); Caffe2 registers no gradient for it) and RMSNorm (rms_norm_op.cc, after Zhang & Sennrich,
"Root Mean Square Layer Normalization": Y = X / sqrt(mean(X^2) + eps) * gamma + beta over the dims from
`axis`, and rrms = 1 / sqrt(mean(X^2) + eps) per row) with its gradient RMSNormGradient(dY, X, gamma, rrms) ->
(dX, dgamma, dbeta), as Caffe2's maker emits it. RMSNorm reads its epsilon from the argument `eps` (default 0),
as the kernel does; the schema's documented `epsilon` is not read by Caffe2 either.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from .base import canonical_axis, check_float, like, out_spec, single_gradient
from .conv import _conv_shape, conv
from .registry import REGISTRY, op

# ConvRelu takes exactly Conv's arguments (its Caffe2 op constructs a Conv from its own OperatorDef).
CONV_ARGS = dict(REGISTRY.get("Conv").args)


def _check_ranks(X, W) -> None:
    """Conv's own checks assume images: X and the filter of one rank, at least 3 (N, C, spatial...)."""
    if len(X.shape) < 3 or len(W.shape) != len(X.shape):
        raise ShapeError(f"ConvRelu needs an image X (N x C x spatial dims, or N x spatial x C) and a filter of the "
                         f"same rank; got X {tuple(X.shape)} and filter {tuple(W.shape)}")


def _conv_relu_shape(specs, **args):
    _check_ranks(*specs[:2])
    return _conv_shape(specs, **args)


@op("ConvRelu", inputs=(2, 3), outputs=1, inplace=(), args=CONV_ARGS, shape=_conv_relu_shape, grows="shapes")
def conv_relu(xp, X, W, b=None, **args):
    """max(0, Conv(X, filter, bias)) with every Conv argument (kernel, stride, pad, dilation, group, order)."""
    _check_ranks(X, W)
    y = conv(xp, X, W, b, **args)
    return xp.maximum(y, y.dtype.type(0))


# --------------------------------------------------------------------------------------------- RMSNorm
def _rms_geometry(x, gamma, beta, axis, op_type="RMSNorm"):
    """(M rows, N values per row, canonical axis) after the checks."""
    check_float(op_type, X=x, gamma=gamma, beta=beta)
    if len(x.shape) < 2:
        raise ShapeError(f"{op_type} needs an input of at least 2 dimensions, got shape {tuple(x.shape)}")
    ax = canonical_axis(axis, len(x.shape))
    rows, cols = math.prod(x.shape[:ax]), math.prod(x.shape[ax:])
    for name, t in (("gamma", gamma), ("beta", beta)):
        if t is not None and math.prod(t.shape) != cols:
            raise ShapeError(f"{op_type}: {name} has shape {tuple(t.shape)} ({math.prod(t.shape)} values) but X "
                             f"{tuple(x.shape)} has {cols} values per row from axis {ax}; they must match")
    return rows, cols, ax


def _rms_shape(specs, *, axis, eps):
    x, gamma, beta = specs
    _, _, ax = _rms_geometry(x, gamma, beta, axis)
    return [like(x), out_spec(x.shape[:ax], x.dtype)]


@op("RMSNorm", inputs=3, outputs=2, inplace=(), args={"axis": 1, "eps": 0.0}, shape=_rms_shape,
    gradient=single_gradient("RMSNormGradient", ["GO0", "I0", "I1", "O1"], ["GI0", "GI1", "GI2"]))
def rms_norm(xp, x, gamma, beta, *, axis, eps):
    """X, gamma, beta -> Y = X * rrms * gamma + beta and rrms = 1 / sqrt(mean(X^2) + eps), each row being X
    flattened from `axis` (gamma and beta hold one value per element of a row)."""
    rows, cols, ax = _rms_geometry(x, gamma, beta, axis)
    x2 = x.reshape(rows, cols)
    with np.errstate(divide="ignore", invalid="ignore"):
        rrms = 1 / xp.sqrt((x2 * x2).mean(axis=1) + x.dtype.type(eps)) if cols else xp.full(rows, np.nan, x.dtype)
    y = x2 * rrms[:, None] * gamma.reshape(1, cols) + beta.reshape(1, cols)
    return y.astype(x.dtype).reshape(x.shape), rrms.astype(x.dtype).reshape(x.shape[:ax])


def _rms_grad_checks(dy, x, gamma, rrms, axis):
    rows, cols, ax = _rms_geometry(x, gamma, None, axis, "RMSNormGradient")
    check_float("RMSNormGradient", dY=dy, X=x, rrms=rrms)
    if tuple(dy.shape) != tuple(x.shape) or math.prod(rrms.shape) != rows:
        raise ShapeError(f"RMSNormGradient: dY {tuple(dy.shape)} must match X {tuple(x.shape)} and rrms "
                         f"{tuple(rrms.shape)} must hold one value per row ({rows})")
    return rows, cols


def _rms_grad_shape(specs, *, axis, eps):
    _rms_grad_checks(*specs, axis)
    return [like(specs[1]), like(specs[2]), like(specs[2])]


@op("RMSNormGradient", inputs=4, outputs=3, inplace=(), args={"axis": 1, "eps": 0.0}, shape=_rms_grad_shape)
def rms_norm_gradient(xp, dy, x, gamma, rrms, *, axis, eps):
    """dY, X, gamma, rrms -> dX = rrms dY gamma - (rrms^3 / N) sum(dY X gamma) X per row, dgamma = sum over rows
    of dY X rrms, dbeta = sum over rows of dY. (eps, copied from RMSNorm, is not needed: rrms holds it.)"""
    rows, cols = _rms_grad_checks(dy, x, gamma, rrms, axis)
    d2, x2, g = dy.reshape(rows, cols), x.reshape(rows, cols), gamma.reshape(1, cols)
    r = rrms.reshape(rows, 1)
    ds = (d2 * x2 * g).sum(axis=1, keepdims=True)
    dx = r * d2 * g - ds * (r * r * r) * x.dtype.type(1.0 / max(cols, 1)) * x2
    dgamma = (d2 * x2 * r).sum(axis=0)
    dbeta = d2.sum(axis=0)
    return dx.reshape(x.shape), dgamma.reshape(gamma.shape).astype(gamma.dtype), \
        dbeta.reshape(gamma.shape).astype(gamma.dtype)
