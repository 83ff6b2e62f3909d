"""Per-channel statistics for batch normalization over several devices: ChannelStats (the sum and the sum of
squares of each channel) and ChannelBackpropStats (the scale and bias gradients of SpatialBN from its saved
mean and inverse standard deviation). Their results are summed across devices and fed to SpatialBN and
SpatialBNGradient, which then see the larger batch.

Semantics from caffe2/operators/channel_stats_op.cc and channel_backprop_stats_op.cc: X is NCHW with 1 to 3
spatial dims (3-D to 5-D in all). Neither has a gradient (SHOULD_NOT_DO_GRADIENT).
"""
from __future__ import annotations

from ..core.errors import ShapeError
from .base import check_float, out_spec
from .registry import SHOULD_NOT_DO_GRADIENT, op


def _channels(op_type: str, X) -> int:
    """C of an NCHW X of 3 to 5 dims, checked."""
    if not 3 <= len(X.shape) <= 5:
        raise ShapeError(f"{op_type}: X must be N x C x H (x W (x D)), 3 to 5 dims, got shape {tuple(X.shape)}")
    return int(X.shape[1])


def _channel_sums(X):
    """(sum over N and spatial dims) axes of an NCHW array."""
    return (0,) + tuple(range(2, X.ndim))


def _stats_shape(specs):
    check_float("ChannelStats", X=specs[0])
    c = _channels("ChannelStats", specs[0])
    return [out_spec((c,), specs[0].dtype)] * 2


@op("ChannelStats", inputs=1, outputs=2, inplace=(), shape=_stats_shape, shapes_from_inputs=True,
    gradient=SHOULD_NOT_DO_GRADIENT)
def channel_stats(xp, X):
    """X (NCHW) -> sum and sumsq, each of size C: the sum of X's elements of each channel and the sum of
    their squares."""
    check_float("ChannelStats", X=X)
    _channels("ChannelStats", X)
    axes = _channel_sums(X)
    return X.sum(axis=axes, dtype=X.dtype), (X * X).sum(axis=axes, dtype=X.dtype)


def _backprop_checks(X, mean, inv_std, dY) -> int:
    check_float("ChannelBackpropStats", X=X, mean=mean, inv_std=inv_std, output_grad=dY)
    c = _channels("ChannelBackpropStats", X)
    if tuple(dY.shape) != tuple(X.shape):
        raise ShapeError(f"ChannelBackpropStats: output_grad {tuple(dY.shape)} must have X's shape "
                         f"{tuple(X.shape)}")
    for name, v in (("mean", mean), ("inv_std", inv_std)):
        if tuple(v.shape) != (c,):
            raise ShapeError(f"ChannelBackpropStats: {name} must be a vector of the {c} channels, got shape "
                             f"{tuple(v.shape)}")
    return c


def _backprop_shape(specs):
    c = _backprop_checks(*specs)
    return [out_spec((c,), specs[0].dtype)] * 2


@op("ChannelBackpropStats", inputs=4, outputs=2, inplace=(), shape=_backprop_shape, shapes_from_inputs=True,
    gradient=SHOULD_NOT_DO_GRADIENT)
def channel_backprop_stats(xp, X, mean, inv_std, output_grad):
    """X (NCHW), mean, inv_std (C each), dY (X's shape) -> scale_grad[c] = sum over channel c of
    (X - mean[c]) * inv_std[c] * dY, and bias_grad[c] = the sum of dY over channel c."""
    c = _backprop_checks(X, mean, inv_std, output_grad)
    view = (1, c) + (1,) * (X.ndim - 2)
    axes = _channel_sums(X)
    normalized = (X - mean.reshape(view)) * inv_std.reshape(view)
    return ((normalized * output_grad).sum(axis=axes, dtype=X.dtype),
            output_grad.sum(axis=axes, dtype=X.dtype))
