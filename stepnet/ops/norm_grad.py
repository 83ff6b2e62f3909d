"""Gradient ops of the normalisation family and Dropout (their makers are in norm.py), as Caffe2 registers them
(spatial_batch_norm_gradient_op.cc, dropout_op.cc, layer_norm_op.cc, instance_norm_gradient_op.cc,
group_norm_op.cc, normalize_op.cc).

All read the statistics the forward saved: SpatialBNGradient(X, scale, dY, saved_mean, saved_inv_std),
LayerNormGradient(dY, Y, mean, std, X[, gamma]), InstanceNormGradient(X, scale, bias, dY[, mean[, inv_std]]),
GroupNormGradient(dY, X, gamma, beta, mean, inv_std), DropoutGrad(dY[, mask]). Each kernel is the exact
derivative written as dX = a*dY + b*X + c with per-statistic a, b, c (Caffe2's fused form), so no Python loop
runs over elements. Caffe2 quirk kept: a test-mode SpatialBN's gradient op gets the running mean and running
*variance* where the saved mean and inverse std go, and applies the batch formula to them.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import Meta, check_float, like
from .norm import channel_layout, check_vector, gn_checks, in_checks, ln_checks, lp_checks
from .registry import op



def _same_shape(name, a, ref, ref_name="X"):
    if tuple(a.shape) != tuple(ref.shape):
        raise ShapeError(f"{name} has shape {tuple(a.shape)} but {ref_name} has {tuple(ref.shape)}; they "
                         "come from one forward op and must match")


def _keep(x, axis: int):
    """The shape of a per-channel vector broadcast along `axis` of x."""
    return tuple(-1 if a == axis else 1 for a in range(x.ndim))


# ----------------------------------------------------------------------------------------------- SpatialBN
def _bn_checks(X, scale, dY, mean, rstd, sums, order, num_batches):
    check_float(X=X)
    check_float(dY=dY)
    n, c, hxw, axis = channel_layout(X, order)
    _same_shape("dY", dY, X)
    for name, v in (("scale", scale), ("saved_mean", mean), ("saved_inv_std", rstd)):
        check_vector(name, v, c)
    if num_batches > 1:
        if len(sums) != 2:
            raise ArgumentError(f"num_batches={num_batches} needs the 7-input form (X, scale, dY, "
                                "saved_mean, saved_inv_std, dscale_sum, dbias_sum)")
        check_vector("dscale_sum", sums[0], c)
        check_vector("dbias_sum", sums[1], c)
    return n, c, hxw, axis


def _bn_shape(specs, *, epsilon, order, num_batches, is_test, momentum):
    X, scale, dY, mean, rstd, *sums = map(Meta, specs)
    _bn_checks(X, scale, dY, mean, rstd, sums, order, num_batches)
    stats = specs[5:7] if num_batches > 1 else specs[1:2] * 2
    return [like(specs[0]), like(stats[0], specs[0].dtype), like(stats[1], specs[0].dtype)]


@op("SpatialBNGradient", inputs=(5, 7), outputs=3, inplace=[(5, 1), (6, 2)], shape=_bn_shape,
    args={"epsilon": 1e-5, "order": "NCHW", "num_batches": 1, "is_test": 0, "momentum": 0.9})
def spatial_bn_gradient(xp, X, scale, dY, mean, rstd, *sums, epsilon, order, num_batches, is_test, momentum):
    """-> dX, dscale, dbias of batch normalisation with the given saved mean and inverse std. dbias = sum dY,
    dscale = sum dY (X - mean) rstd (with num_batches > 1: the given sums / num_batches), and
    dX = scale rstd (dY - (dbias + (X - mean) rstd dscale) / (N*HxW))."""
    n, c, hxw, axis = _bn_checks(X, scale, dY, mean, rstd, sums, order, num_batches)
    keep = _keep(X, axis)
    mu, r, s = mean.reshape(-1), rstd.reshape(-1), scale.reshape(-1)
    if num_batches > 1:
        dscale, dbias = sums[0] / X.dtype.type(num_batches), sums[1] / X.dtype.type(num_batches)
    else:
        others = tuple(a for a in range(X.ndim) if a != axis)
        dbias = dY.sum(axis=others)
        dscale = (dY * (X - mu.reshape(keep))).sum(axis=others) * r
        dscale, dbias = dscale.reshape(scale.shape), dbias.reshape(scale.shape)
    if X.size == 0:
        return xp.zeros_like(X), xp.zeros_like(dscale), xp.zeros_like(dbias)
    inv_nhw = X.dtype.type(1.0 / (n * hxw))
    alpha = s * r
    beta = -alpha * dscale.reshape(-1) * r * inv_nhw
    gamma = alpha * (mu * dscale.reshape(-1) * r - dbias.reshape(-1)) * inv_nhw
    dx = dY * alpha.reshape(keep) + X * beta.reshape(keep) + gamma.reshape(keep)
    return dx, dscale, dbias


# ----------------------------------------------------------------------------------------------- Dropout
def _dropout_checks(dY, mask, is_test):
    check_float(dY=dY)
    if is_test:
        return
    if not mask:
        raise ArgumentError("training-mode DropoutGrad (is_test=0) needs the mask input (dY, mask)")
    if mask[0].dtype is not None and mask[0].dtype != np.bool_:
        raise DTypeError(f"the dropout mask must be bool, got {mask[0].dtype}")
    _same_shape("mask", mask[0], dY, "dY")


def _dropout_shape(specs, *, ratio, is_test):
    _dropout_checks(Meta(specs[0]), [Meta(s) for s in specs[1:]], is_test)
    return [like(specs[0])]


@op("DropoutGrad", inputs=(1, 2), outputs=1, inplace=[(0, 0)], args={"ratio": 0.5, "is_test": 0},
    shape=_dropout_shape)
def dropout_grad(xp, dY, *mask, ratio, is_test):
    """dY[, mask] -> dX = dY * mask / (1 - ratio) in training (the forward's float32 scale); a copy of dY in
    test mode, where the mask is not read."""
    _dropout_checks(dY, mask, is_test)
    if is_test:
        return xp.array(dY, copy=True)
    scale = dY.dtype.type(np.float32(1.0 / (1.0 - float(np.float32(ratio)))))
    return dY * scale * mask[0].astype(dY.dtype)


# ----------------------------------------------------------------------------------------------- LayerNorm
def _ln_grad_checks(dY, Y, mean, std, X, gamma, axis, elementwise_affine):
    if bool(gamma) != bool(elementwise_affine):
        raise ArgumentError("LayerNormGradient takes gamma as a 6th input exactly when elementwise_affine=1 "
                            f"(got {5 + len(gamma)} inputs, elementwise_affine={int(elementwise_affine)})")
    axis = ln_checks(X, [gamma[0], gamma[0]] if gamma else [], axis, elementwise_affine)
    check_float(dY=dY)
    _same_shape("dY", dY, X)
    rows = math.prod(X.shape[:axis])
    for name, v in (("mean", mean), ("std", std)):
        check_vector(name, v, rows, "prod(X.shape[:axis])")
    return axis


def _ln_shape(specs, *, axis, epsilon, elementwise_affine):
    dY, Y, mean, std, X, *gamma = map(Meta, specs)
    _ln_grad_checks(dY, Y, mean, std, X, gamma, axis, elementwise_affine)
    return [like(specs[4])] + ([like(specs[5]), like(specs[5])] if elementwise_affine else [])


@op("LayerNormGradient", inputs=(5, 6), outputs=(1, 3), inplace=(), shape=_ln_shape,
    args={"axis": 1, "epsilon": 1e-5, "elementwise_affine": False})
def layer_norm_gradient(xp, dY, Y, mean, std, X, *gamma, axis, epsilon, elementwise_affine):
    """dY, Y, mean, std, X[, gamma] -> dX[, dgamma, dbeta]: the derivative of (X - mean)/std through the row
    statistics (std includes epsilon); Y is not read. With gamma, dY is first scaled by it."""
    axis = _ln_grad_checks(dY, Y, mean, std, X, gamma, axis, elementwise_affine)
    rows, cols = math.prod(X.shape[:axis]), math.prod(X.shape[axis:])   # explicit: either may be 0
    x, dy = X.reshape(rows, cols), dY.reshape(rows, cols)
    mu, r = mean.reshape(rows, 1), 1 / std.reshape(rows, 1)
    dyg = dy * gamma[0].reshape(1, -1) if elementwise_affine else dy
    ds, db = (dyg * x).sum(axis=1, keepdims=True), dyg.sum(axis=1, keepdims=True)
    inv_n = X.dtype.type(1.0 / cols if cols else 0.0)
    x_scale = (db * mu - ds) * r * r * r * inv_n
    bias = -x_scale * mu - db * r * inv_n
    dx = (dyg * r + x * x_scale + bias).reshape(X.shape)
    if not elementwise_affine:
        return dx
    dgamma = (dy * (x - mu) * r).sum(axis=0).reshape(gamma[0].shape)
    return dx, dgamma, dy.sum(axis=0).reshape(gamma[0].shape)


# ------------------------------------------------------------------------------------ Instance/GroupNorm
def _in_grad_checks(X, scale, bias, dY, stats, epsilon, order):
    n, c, hxw, axis = in_checks(X, scale, bias, epsilon, order)
    check_float(dY=dY)
    _same_shape("dY", dY, X)
    for name, v in zip(("mean", "inv_std"), stats, strict=False):
        if tuple(v.shape) != (n, c):
            raise ShapeError(f"{name} must have shape (N, C) = {(n, c)}, got {tuple(v.shape)}")
    return n, c, hxw, axis


def _in_shape(specs, *, epsilon, order):
    _in_grad_checks(*map(Meta, specs[:4]), [Meta(s) for s in specs[4:]], epsilon, order)
    return [like(specs[0]), like(specs[1]), like(specs[2])]


@op("InstanceNormGradient", inputs=(4, 6), outputs=3, inplace=(), args={"epsilon": 1e-5, "order": "NCHW"},
    shape=_in_shape)
def instance_norm_gradient(xp, X, scale, bias, dY, *stats, epsilon, order):
    """X, scale, bias, dY[, mean[, inv_std]] -> dX, dscale, dbias; statistics not given are recomputed from X
    (the inverse std around the given mean)."""
    n, c, hxw, axis = _in_grad_checks(X, scale, bias, dY, stats, epsilon, order)
    spatial = tuple(a for a in range(1, X.ndim) if a != axis)
    keep = (n, c) + (1,) * len(spatial) if axis == 1 else (n,) + (1,) * len(spatial) + (c,)
    mu = stats[0].reshape(keep) if stats else xp.mean(X, axis=spatial, keepdims=True)
    if len(stats) > 1:
        rsig = stats[1].reshape(keep)
    else:
        dev = X - mu
        rsig = 1 / xp.sqrt(xp.mean(dev * dev, axis=spatial, keepdims=True) + X.dtype.type(epsilon))
    gain = scale.reshape(_keep(X, axis))
    ds, db = (dY * X).sum(axis=spatial, keepdims=True), dY.sum(axis=spatial, keepdims=True)
    dx = _fused_backward(dY, X, mu, rsig, gain, gain * ds, gain * db, hxw)
    dscale = ((ds - db * mu) * rsig).sum(axis=0).reshape(scale.shape)
    return dx, dscale, db.sum(axis=0).reshape(bias.shape)


def _fused_backward(dY, X, mu, rsig, gain, ds, db, count):
    """dX of Y = gain (X - mu) rsig + beta, mu and rsig being statistics over `count` elements and ds, db the
    sums of gain dY X and gain dY over those elements (all broadcastable against X)."""
    alpha = X.dtype.type(1.0 / count)
    x_scale = (db * mu - ds) * rsig * rsig * rsig * alpha
    bias = -x_scale * mu - db * rsig * alpha
    return dY * (gain * rsig) + X * x_scale + bias


def _gn_grad_checks(dY, X, gamma, beta, mu, rsig, group, order):
    n, c, hxw, axis = gn_checks(X, gamma, beta, group, order)
    check_float(dY=dY)
    _same_shape("dY", dY, X)
    for name, v in (("mean", mu), ("inv_std", rsig)):
        if tuple(v.shape) != (n, group):
            raise ShapeError(f"{name} must have shape (N, group) = {(n, group)}, got {tuple(v.shape)}")
    return n, c, hxw


def _gn_shape(specs, *, group, epsilon, order, is_test):
    _gn_grad_checks(*map(Meta, specs), group, order)
    return [like(specs[1]), like(specs[2]), like(specs[3])]


@op("GroupNormGradient", inputs=6, outputs=3, inplace=(), shape=_gn_shape,
    args={"group": 32, "epsilon": 1e-5, "order": "NCHW", "is_test": 1})
def group_norm_gradient(xp, dY, X, gamma, beta, mu, rsig, *, group, epsilon, order, is_test):
    """dY, X, gamma, beta, mean, inv_std -> dX, dgamma, dbeta (the (N, group) statistics of the forward)."""
    n, c, hxw = _gn_grad_checks(dY, X, gamma, beta, mu, rsig, group, order)
    k = c // group
    grouped = (n, group, k, hxw) if order == "NCHW" else (n, hxw, group, k)
    stat = (n, group, 1, 1) if order == "NCHW" else (n, 1, group, 1)
    gain_shape = (1, group, k, 1) if order == "NCHW" else (1, 1, group, k)
    elems = (3,) if order == "NCHW" else (1,)    # the pixel axis of the grouped view
    chans = (2, 3) if order == "NCHW" else (1, 3)  # pixels and the channels of one group
    x, dy = X.reshape(grouped), dY.reshape(grouped)
    m, r, gain = mu.reshape(stat), rsig.reshape(stat), gamma.reshape(gain_shape)
    ds, db = (dy * x).sum(axis=elems, keepdims=True), dy.sum(axis=elems, keepdims=True)
    gds = (gain * ds).sum(axis=chans, keepdims=True)
    gdb = (gain * db).sum(axis=chans, keepdims=True)
    dx = _fused_backward(dy, x, m, r, gain, gds, gdb, k * hxw).reshape(X.shape)
    dgamma = ((ds - db * m) * r).sum(axis=0).reshape(gamma.shape)
    return dx, dgamma, db.sum(axis=0).reshape(beta.shape)


# ----------------------------------------------------------------------------------------------- Normalize
def _normalize_shape(specs, *, axis):
    lp_checks(Meta(specs[0]), axis)
    _same_shape("dY", Meta(specs[1]), Meta(specs[0]))
    return [like(specs[0])]


@op("NormalizeGradient", inputs=2, outputs=1, inplace=(), args={"axis": -1}, shape=_normalize_shape)
def normalize_gradient(xp, X, dY, *, axis):
    """X, dY -> dX = dY/n - X (X.dY)/n^3 with n = max(||X||, 1e-12) along `axis` (normalize_op.cc)."""
    lp_checks(X, axis)
    _same_shape("dY", dY, X)
    norm = xp.maximum(xp.sqrt(xp.sum(X * X, axis=axis, keepdims=True)), X.dtype.type(1e-12))
    return dY / norm - X * (xp.sum(X * dY, axis=axis, keepdims=True) / (norm * norm * norm))
