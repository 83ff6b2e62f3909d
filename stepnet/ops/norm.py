"""Normalisation and dropout: SpatialBN, LayerNorm, InstanceNorm, GroupNorm, Dropout, Normalize, NormalizeL1.

Training-mode forms return the statistics their gradients consume (saved mean and inverse std, masks), in
the layouts Caffe2's gradient ops read them. Each op's checks are one function that the kernel runs on arrays
and the shape function on Meta stand-ins of the input specs (norm_grad.py reuses them for the gradient
kernels). The gradient makers, next to the ops, emit what Caffe2's emit.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, GradientError, ShapeError
from .base import Meta, check_float, like, out_spec, result_dtype, single_gradient
from .registry import op

ORDERS = ("NCHW", "NHWC")


def check_order(order: str) -> None:
    if order not in ORDERS:
        raise ArgumentError(f"order must be 'NCHW' or 'NHWC', got {order!r}")


def channel_layout(x, order: str, min_ndim: int = 2):
    """(N, C, spatial size, channel axis) of x in the given storage order."""
    check_order(order)
    if x.ndim < min_ndim:
        raise ShapeError(f"input must have at least {min_ndim} dimensions (N, C, ...), got shape {x.shape}")
    axis = 1 if order == "NCHW" else x.ndim - 1
    n, c = x.shape[0], x.shape[axis]
    hxw = x.size // (n * c) if n * c else 0
    return n, c, hxw, axis


def per_channel(v, x, axis: int):
    """A length-C vector shaped to broadcast along `axis` of x."""
    shape = [1] * x.ndim
    shape[axis] = -1
    return v.reshape(shape)


def check_vector(name: str, v, c: int, what: str = "C") -> None:
    if v.size != c:
        raise ShapeError(f"{name} must hold {what} = {c} values (one per channel), got shape {v.shape}")


def n_outputs(ctx) -> int:
    return len(ctx.opdef.output)


# ----------------------------------------------------------------------------------------------- SpatialBN
def _bn_checks(x, scale, bias, mean, var, sums, *, is_test, epsilon, momentum, order, num_batches):
    """SpatialBN's argument, type and shape checks; (N, C, spatial size, channel axis)."""
    check_float(X=x)
    if epsilon <= 0:
        raise ArgumentError(f"epsilon must be > 0, got {epsilon}")
    if not 0 <= momentum <= 1:
        raise ArgumentError(f"momentum must lie in [0, 1], got {momentum}")
    n, c, hxw, axis = channel_layout(x, order)
    check_vector("scale", scale, c)
    check_vector("bias", bias, c)
    if is_test:
        check_vector("mean", mean, c)
        check_vector("var", var, c)
    elif num_batches > 1:
        if len(sums) != 2:
            raise ArgumentError(f"num_batches={num_batches} needs the 7-input form "
                                "(X, scale, bias, mean, var, sums, sumsq)")
        check_vector("sums", sums[0], c)
        check_vector("sumsq", sums[1], c)
    return n, c, hxw, axis


def _bn_shape(specs, **args):
    """Test mode: Y only. Training: Y, the running stats (promoted with X's type; restarted as X's type when
    of the wrong size) and the saved statistics (X's type, or that of the sums)."""
    x, scale, bias, mean, var, *sums = map(Meta, specs)
    _, c, _, _ = _bn_checks(x, scale, bias, mean, var, sums, **args)
    if args["is_test"]:
        return [like(x, result_dtype(x.dtype, scale.dtype, bias.dtype, mean.dtype, var.dtype))]
    stat = result_dtype(*(s.dtype for s in sums)) if args["num_batches"] > 1 else x.dtype
    run = [result_dtype(v.dtype if v.size == c else x.dtype, x.dtype, stat) for v in (mean, var)]
    return [like(x, result_dtype(x.dtype, scale.dtype, bias.dtype, stat)), out_spec((c,), run[0]),
            out_spec((c,), run[1]), out_spec((c,), stat), out_spec((c,), stat)]


def _spatial_bn_gradient(g):
    """GetSpatialBNGradient: (X, scale, dY, saved_mean, saved_inv_std) -> (dX, dscale, dbias); in test mode
    the running mean/var take the saved statistics' places; num_batches > 1 adds the summed dscale/dbias."""
    is_test, num_batches = g.arg("is_test", 0), g.arg("num_batches", 1)
    if is_test and (g.n_inputs, g.n_outputs) != (5, 1):
        raise GradientError("a test-mode SpatialBN needs 5 inputs and 1 output for a gradient", at=g.label)
    if not is_test and (g.n_inputs, g.n_outputs) != ((7 if num_batches > 1 else 5), 5):
        raise GradientError(f"a training SpatialBN (num_batches={num_batches}) needs "
                            f"{7 if num_batches > 1 else 5} inputs and 5 outputs for its gradient", at=g.label)
    outputs = [g.GI(0), g.GI(1), g.GI(2)]
    if is_test:
        inputs = [g.I(0), g.I(1), g.GO(0), g.I(3), g.I(4)]
    else:
        inputs = [g.I(0), g.I(1), g.GO(0), g.O(3), g.O(4)] + (outputs[1:] if num_batches > 1 else [])
    g.op("SpatialBNGradient", inputs, outputs)


@op("SpatialBN", inputs=(5, 7), outputs=(1, 5), inplace=[(0, 0)], enforce_inplace=[(3, 1), (4, 2)],
    context=True, shape=_bn_shape, gradient=_spatial_bn_gradient,
    args={"is_test": 0, "epsilon": 1e-5, "momentum": 0.9, "order": "NCHW", "num_batches": 1})
def spatial_bn(ctx, xp, x, scale, bias, mean, var, *sums, is_test, epsilon, momentum, order, num_batches):
    """Batch normalisation over every axis but the channel axis.

    Test mode: Y from the given mean/var (1 output). Training mode (5 outputs): batch statistics (biased
    variance), running stats updated in place as running·momentum + batch·(1−momentum), and the saved
    mean and saved inverse std 1/sqrt(var+epsilon) for SpatialBNGradient.
    """
    outs = n_outputs(ctx)
    if (is_test and outs != 1) or (not is_test and outs != 5):
        want = ("1 output (Y)" if is_test
                else "5 outputs (Y, running_mean, running_var, saved_mean, saved_inv_std)")
        raise ArgumentError(f"with is_test={int(bool(is_test))} SpatialBN takes {want}, got {outs}; "
                            "set is_test to match the outputs")
    n, c, hxw, axis = _bn_checks(x, scale, bias, mean, var, sums, is_test=is_test, epsilon=epsilon,
                                 momentum=momentum, order=order, num_batches=num_batches)
    reduce_axes = tuple(a for a in range(x.ndim) if a != axis)
    if is_test:
        inv_std = 1 / xp.sqrt(var.reshape(-1) + epsilon)
        return affine(x, scale.reshape(-1) * inv_std, mean.reshape(-1), bias.reshape(-1), axis)
    if num_batches > 1:
        count = n * num_batches * hxw
        batch_mean = sums[0].reshape(-1) / count
        batch_var = sums[1].reshape(-1) / count - batch_mean * batch_mean
    else:
        batch_mean = xp.mean(x, axis=reduce_axes)
        dev = x - per_channel(batch_mean, x, axis)
        batch_var = xp.mean(dev * dev, axis=reduce_axes)
    # Caffe2 starts running statistics that are empty (or of the wrong size) at zero.
    run_mean = mean.reshape(-1) if mean.size == c else xp.zeros(c, x.dtype)
    run_var = var.reshape(-1) if var.size == c else xp.zeros(c, x.dtype)
    keep = np.dtype(x.dtype).type(momentum)
    new_mean = run_mean * keep + batch_mean * (1 - keep)
    new_var = run_var * keep + batch_var * (1 - keep)
    inv_std = 1 / xp.sqrt(batch_var + epsilon)
    y = affine(x, scale.reshape(-1) * inv_std, batch_mean, bias.reshape(-1), axis)
    return y, new_mean, new_var, batch_mean, inv_std


def affine(x, gain, mean, bias, axis):
    """(x − mean)·gain + bias with per-channel vectors, fused as x·gain + (bias − mean·gain)."""
    return x * per_channel(gain, x, axis) + per_channel(bias - mean * gain, x, axis)


# ----------------------------------------------------------------------------------------------- LayerNorm
def ln_checks(x, affine_params, axis, elementwise_affine) -> int:
    """LayerNorm's checks; the canonical axis."""
    check_float(X=x)
    if x.ndim < 2:
        raise ShapeError(f"LayerNorm needs an input of at least 2 dimensions, got shape {x.shape}")
    if not -x.ndim <= axis < x.ndim:
        raise ArgumentError(f"axis {axis} is out of range for a {x.ndim}-d input")
    axis %= x.ndim
    if elementwise_affine:
        if len(affine_params) != 2:
            raise ArgumentError("elementwise_affine=1 needs 3 inputs (X, gamma, beta), got "
                                f"{1 + len(affine_params)}")
        cols = math.prod(x.shape[axis:])
        check_vector("gamma", affine_params[0], cols, "prod(X.shape[axis:])")
        check_vector("beta", affine_params[1], cols, "prod(X.shape[axis:])")
    return axis


def _ln_shape(specs, *, axis, epsilon, elementwise_affine):
    x, *params = map(Meta, specs)
    axis = ln_checks(x, params, axis, elementwise_affine)
    y = result_dtype(x.dtype, *(p.dtype for p in params)) if elementwise_affine else x.dtype
    stats = out_spec(x.shape[:axis] + (1,), x.dtype)
    return [like(x, y), stats, stats]


def _layer_norm_gradient(g):
    """GetLayerNormGradient: (dY, Y, mean, std, X[, gamma]) -> dX[, dgamma, dbeta]."""
    inputs = [g.GO(0), g.O(0), g.O(1), g.O(2), g.I(0)]
    if g.arg("elementwise_affine", 0):
        g.op("LayerNormGradient", inputs + [g.I(1)], [g.GI(0), g.GI(1), g.GI(2)])
    else:
        g.op("LayerNormGradient", inputs, [g.GI(0)])


@op("LayerNorm", inputs=(1, 3), outputs=3, inplace=[], shape=_ln_shape, gradient=_layer_norm_gradient,
    args={"axis": 1, "epsilon": 1e-5, "elementwise_affine": False}, shapes_from_inputs=True)
def layer_norm(xp, x, *affine_params, axis, epsilon, elementwise_affine):
    """Normalise each row of x flattened at `axis`: Y = (x − mean)/std with std = sqrt(var + epsilon).

    Outputs Y, mean and std, the statistics shaped x.shape[:axis] + (1,). With elementwise_affine (the
    later Caffe2 form) Y is then scaled by gamma and shifted by beta, both of x.shape[axis:] elements.
    """
    axis = ln_checks(x, affine_params, axis, elementwise_affine)
    x2 = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))   # explicit: rows may be 0
    mean = xp.mean(x2, axis=1, keepdims=True)
    dev = x2 - mean
    std = xp.sqrt(xp.mean(dev * dev, axis=1, keepdims=True) + epsilon)
    y = dev / std
    if elementwise_affine:
        gamma, beta = affine_params
        y = y * gamma.reshape(1, -1) + beta.reshape(1, -1)
    stats = tuple(x.shape[:axis]) + (1,)
    return y.reshape(x.shape), mean.reshape(stats), std.reshape(stats)


# ----------------------------------------------------------------------------------------------- InstanceNorm
def in_checks(x, scale, bias, epsilon, order):
    """InstanceNorm's checks; (N, C, spatial size, channel axis)."""
    check_float(X=x)
    if epsilon < 0:
        raise ArgumentError(f"epsilon must be >= 0, got {epsilon}")
    layout = channel_layout(x, order, min_ndim=3)
    check_vector("scale", scale, layout[1])
    check_vector("bias", bias, layout[1])
    return layout


def _in_shape(specs, *, epsilon, order):
    x, scale, bias = map(Meta, specs)
    n, c, _, _ = in_checks(x, scale, bias, epsilon, order)
    stats = out_spec((n, c), x.dtype)
    return [like(x, result_dtype(x.dtype, scale.dtype, bias.dtype)), stats, stats]


def _instance_norm_gradient(g):
    """GetInstanceNormGradient: (X, scale, bias, dY[, saved_mean[, saved_inv_std]]) -> (dX, dscale, dbias)."""
    inputs = [g.I(0), g.I(1), g.I(2), g.GO(0)] + [g.O(i) for i in (1, 2) if g.n_outputs > i]
    g.op("InstanceNormGradient", inputs, [g.GI(0), g.GI(1), g.GI(2)])


@op("InstanceNorm", inputs=3, outputs=(1, 3), inplace=[(0, 0)], args={"epsilon": 1e-5, "order": "NCHW"},
    shape=_in_shape, gradient=_instance_norm_gradient)
def instance_norm(xp, x, scale, bias, *, epsilon, order):
    """Normalise each (sample, channel) plane over its spatial positions, then scale and shift per channel.

    Optional outputs: the saved mean and saved inverse std, both of shape (N, C).
    """
    n, c, _, axis = in_checks(x, scale, bias, epsilon, order)
    spatial = tuple(a for a in range(1, x.ndim) if a != axis)
    mean = xp.mean(x, axis=spatial, keepdims=True)
    dev = x - mean
    inv_std = 1 / xp.sqrt(xp.mean(dev * dev, axis=spatial, keepdims=True) + epsilon)
    y = dev * inv_std * per_channel(scale.reshape(-1), x, axis) + per_channel(bias.reshape(-1), x, axis)
    return y, mean.reshape(n, c), inv_std.reshape(n, c)


# ----------------------------------------------------------------------------------------------- GroupNorm
def gn_checks(x, gamma, beta, group, order):
    """GroupNorm's type and shape checks; (N, C, spatial size, channel axis)."""
    check_float(X=x)
    layout = channel_layout(x, order)
    c = layout[1]
    if group <= 0 or c % group:
        raise ShapeError(f"group={group} must divide the {c} channels of X (shape {x.shape})")
    check_vector("gamma", gamma, c)
    check_vector("beta", beta, c)
    return layout


def _gn_shape(specs, *, group, epsilon, order, is_test):
    x, gamma, beta = map(Meta, specs)
    n = gn_checks(x, gamma, beta, group, order)[0]
    stats = out_spec((n, group), x.dtype)
    return [like(x, result_dtype(x.dtype, gamma.dtype, beta.dtype)), stats, stats]


def _group_norm_gradient(g):
    """GetGroupNormGradient: (dY, X, gamma, beta, mean, inv_std) -> (dX, dgamma, dbeta)."""
    if g.n_outputs < 3:
        raise GradientError("GroupNorm's gradient reads its mean and inv_std outputs; give the "
                            "forward 3 outputs (Y, mean, inv_std) and is_test=0 for training", at=g.label)
    g.op("GroupNormGradient", [g.GO(0), g.I(0), g.I(1), g.I(2), g.O(1), g.O(2)], [g.GI(0), g.GI(1), g.GI(2)])


@op("GroupNorm", inputs=3, outputs=(1, 3), inplace=[], context=True, shape=_gn_shape, gradient=_group_norm_gradient,
    args={"group": 32, "epsilon": 1e-5, "order": "NCHW", "is_test": 1})
def group_norm(ctx, xp, x, gamma, beta, *, group, epsilon, order, is_test):
    """Normalise each sample over groups of C/group channels and all spatial positions; Y = gamma·x̂ + beta.

    Outputs Y and (for training, is_test=0, where all three are required) the mean and the inverse std
    1/sqrt(var + epsilon), both of shape (N, group).
    """
    check_float(X=x)
    if not is_test and n_outputs(ctx) != 3:
        raise ArgumentError(f"with is_test=0 GroupNorm takes 3 outputs (Y, mean, inv_std), "
                            f"got {n_outputs(ctx)}")
    n, c, hxw, axis = gn_checks(x, gamma, beta, group, order)
    k = c // group
    xc = x.reshape(n, group, k * hxw) if order == "NCHW" else x.reshape(n, hxw, group, k)
    axes = (2,) if order == "NCHW" else (1, 3)
    mean = xp.mean(xc, axis=axes, keepdims=True)
    dev = xc - mean
    inv_std = 1 / xp.sqrt(xp.mean(dev * dev, axis=axes, keepdims=True) + epsilon)
    y = (dev * inv_std).reshape(x.shape)
    y = y * per_channel(gamma.reshape(-1), x, axis) + per_channel(beta.reshape(-1), x, axis)
    return y, mean.reshape(n, group), inv_std.reshape(n, group)


# ----------------------------------------------------------------------------------------------- Dropout
def dropout_checks(x, ratio) -> None:
    check_float(X=x)
    if not 0 <= ratio < 1:
        raise ArgumentError(f"ratio must lie in [0, 1), got {ratio}")


def _dropout_shape(specs, *, ratio, is_test, rng):
    """Y like X; in training also the bool mask (in test mode the mask output is left untouched)."""
    dropout_checks(specs[0], ratio)
    return [like(specs[0])] if is_test else [like(specs[0]), like(specs[0], np.bool_)]


def _dropout_gradient(g):
    """GetDropoutGradient (PyTorch era): DropoutGrad(dY, mask), or DropoutGrad(dY) in test mode."""
    inputs = [g.GO(0)] if g.arg("is_test", 0) else [g.GO(0), g.O(1)]
    g.op("DropoutGrad", inputs, [g.GI(0)])


@op("Dropout", inputs=1, outputs=(1, 2), inplace=[(0, 0)], random=True, context=True, shape=_dropout_shape,
    args={"ratio": 0.5, "is_test": 0}, gradient=_dropout_gradient)
def dropout(ctx, xp, x, *, ratio, is_test, rng):
    """Training: keep each element with probability 1−ratio (bool mask, True = kept) and scale the kept
    ones: Y = X·(1/(1−ratio))·mask. Test: Y is a copy of X; the mask output is left untouched.
    The mask is drawn on the host."""
    dropout_checks(x, ratio)
    if is_test:
        return xp.array(x, copy=True), None
    if n_outputs(ctx) != 2:
        raise ArgumentError("training-mode Dropout (is_test=0) needs 2 outputs (Y, mask); add the mask "
                            "output or set is_test=1")
    mask = xp.asarray(rng.random(x.shape) < 1.0 - ratio)
    scale = x.dtype.type(np.float32(1.0 / (1.0 - float(np.float32(ratio)))))
    return x * scale * mask.astype(x.dtype), mask


# ----------------------------------------------------------------------------------------------- Normalize
def lp_checks(x, axis) -> None:
    check_float(X=x)
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise ArgumentError(f"axis {axis} is out of range for input of shape {x.shape}")


def _lp_shape(specs, *, axis):
    lp_checks(Meta(specs[0]), axis)
    return [like(specs[0])]


def _lp_normalize(xp, x, axis, p):
    lp_checks(x, axis)
    if p == 2:
        norm = xp.sqrt(xp.sum(x * x, axis=axis, keepdims=True))
        return x / xp.maximum(norm, x.dtype.type(1e-12))
    norm = xp.sum(xp.abs(x), axis=axis, keepdims=True)
    return x / xp.where(norm == 0, x.dtype.type(1), norm)  # an all-zero slice stays zero


@op("Normalize", inputs=1, outputs=1, inplace=[], args={"axis": -1}, shape=_lp_shape,
    gradient=single_gradient("NormalizeGradient", ["I0", "GO0"]))
def normalize(xp, x, *, axis):
    """L2-normalise x along `axis`: x / max(||x||₂, 1e-12), so all-zero slices stay zero."""
    return _lp_normalize(xp, x, axis, 2)


@op("NormalizeL1", inputs=1, outputs=1, inplace=[], args={"axis": -1}, shape=_lp_shape)
def normalize_l1(xp, x, *, axis):
    """L1-normalise x along `axis`: x / ||x||₁; all-zero slices stay zero."""
    return _lp_normalize(xp, x, axis, 1)
