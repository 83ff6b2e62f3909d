"""Gradient ops of pointwise.py's ops, as Caffe2 registers them (caffe2/operators/log1p_op.cc, gelu_op.cc,
mean_op.cc): Log1pGradient(X, dY) -> dY / (1 + X); GeluGradient(dY, X) -> dY * (Phi(X) + X phi(X)) (exact) or
the derivative of the tanh form (fast_gelu); MeanGradient(dY) -> one dY / n per output. The makers that emit
them are in pointwise.py, next to the forward ops."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from .base import check_dtypes, like
from .pointwise import FAST_ALPHA, FAST_COEFF, mean_scale, normal_cdf
from .registry import op

INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _check_pair(op_type, names, a, b) -> None:
    """Two float inputs of one dtype and one shape (arrays or TensorSpecs)."""
    check_dtypes([a, b], ("float16", "float32", "float64"), f"the inputs of {op_type}")
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{op_type}: {names[0]} has shape {tuple(a.shape)} but {names[1]} has {tuple(b.shape)}; "
                         "they must match (both come from one forward op)")


def _pair_shape(op_type, names, out: int):
    def shape(specs, **_):
        _check_pair(op_type, names, *specs)
        return [like(specs[out])]
    return shape


@op("Log1pGradient", inputs=2, outputs=1, inplace=(), shape=_pair_shape("Log1pGradient", ("X", "dY"), 1))
def log1p_gradient(xp, X, dY):
    """X, dY -> dX = dY / (1 + X)."""
    _check_pair("Log1pGradient", ("X", "dY"), X, dY)
    with np.errstate(divide="ignore", invalid="ignore"):
        return dY / (1 + X)


@op("GeluGradient", inputs=2, outputs=1, inplace=(), args={"fast_gelu": False},
    shape=_pair_shape("GeluGradient", ("dY", "X"), 0))
def gelu_gradient(xp, dY, X, *, fast_gelu):
    """dY, X -> dX = dY * d/dX Gelu(X): Phi(X) + X phi(X) for the exact form; for fast_gelu, with
    t = tanh(a (X + c X^3)), 0.5 (1 + t + X (1 - t^2) a (1 + 3 c X^2))."""
    _check_pair("GeluGradient", ("dY", "X"), dY, X)
    if fast_gelu:
        t = X.dtype.type
        th = xp.tanh((X + X * X * X * t(FAST_COEFF)) * t(FAST_ALPHA))
        slope = X * (1 - th * th) * (X * X * t(3 * FAST_COEFF * FAST_ALPHA) + t(FAST_ALPHA))
        return (1 + th + slope) * dY * t(0.5)
    x64 = X.astype(np.float64)
    d = normal_cdf(xp, X) + x64 * xp.exp(-0.5 * x64 * x64) * INV_SQRT_2PI
    return (d * dY.astype(np.float64)).astype(dY.dtype)


# Shape functions do not see the op's output count; inference keeps as many of these as the op has outputs.
MAX_MEAN_INPUTS = 256


def _mean_grad_shape(specs):
    check_dtypes(specs, ("float32", "float64"), "the input of MeanGradient")
    return [like(specs[0])] * MAX_MEAN_INPUTS


@op("MeanGradient", inputs=1, outputs=(1, None), inplace=[(0, 0)], context=True, shape=_mean_grad_shape)
def mean_gradient(ctx, xp, dY):
    """dY -> one dY * float32(1/n) per output, n being the number of outputs (the forward Mean's inputs)."""
    check_dtypes([dY], ("float32", "float64"), "the input of MeanGradient")
    n = len(ctx.outputs)
    scaled = dY * mean_scale(n, dY.dtype)
    return tuple(scaled if i == 0 else scaled.copy() for i in range(n))
