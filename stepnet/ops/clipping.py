"""Gradient clipping ops that Caffe2's GradientClipping net modifier emits: LpNorm (+ LpNormGradient) and
ClipTensorByScaling.

GradientClipping(by_norm) builds, per dense gradient g: n = LpNorm(g, p) (for p = 2 followed by
Pow(exponent=0.5), since LpNorm(p=2) is the *squared* norm), optionally the parameter's norm the same way,
then ClipTensorByScaling([g, n(, param_norm)], [g], threshold): g·threshold/n when n > threshold. by_value
uses Clip. The optimizers' global-norm clipping (max_gradient_norm) needs no op of its own: SumSqrElements,
EnsureCPUOutput, Sum, Pow, Max, Div and a Mul of the learning rate.
"""
from __future__ import annotations

from ..core.errors import ArgumentError, ShapeError
from ..core.spec import spec
from .base import check_float, like, size_of
from .optim import check_scalar, const
from .registry import SHOULD_NOT_DO_GRADIENT, op


def _check_lp(op_type: str, X, p: int, average: bool) -> None:
    check_float(op_type, X=X)
    if p not in (1, 2):
        raise ArgumentError(f"{op_type}: p must be 1 or 2, got {p}")
    if average and size_of(X) == 0:
        raise ShapeError(f"{op_type}: average=1 needs a non-empty X, got shape {tuple(X.shape)}")


def _lp_norm_gradient_maker(g) -> None:
    g.op("LpNormGradient", [g.I(0), g.GO(0)], [g.GI(0)])


def _lp_norm_shape(specs, p=2, average=False):
    _check_lp("LpNorm", specs[0], p, average)
    return [spec((1,), specs[0].dtype)]


@op("LpNorm", inputs=1, outputs=1, inplace=(), args={"p": 2, "average": False},
    gradient=_lp_norm_gradient_maker, shape=_lp_norm_shape)
def lp_norm(xp, X, *, p, average):
    """Z = Σ|x| (p=1) or Σx² (p=2, the squared L2 norm: no square root), divided by X's size when average=1;
    a 1-element 1-D tensor."""
    _check_lp("LpNorm", X, p, average)
    size = const(X.dtype, size_of(X) if average else 1)
    total = xp.sum(xp.abs(X) if p == 1 else X * X, dtype=X.dtype)
    return xp.asarray(total / size).reshape(1)


def _check_lp_gradient(X, dnorm, p, average) -> None:
    _check_lp("LpNormGradient", X, p, average)
    check_float("LpNormGradient", dnorm=dnorm)
    if len(dnorm.shape) != 1 or dnorm.shape[0] != 1:
        raise ShapeError(f"LpNormGradient: dnorm must be a 1-D tensor of one element, got "
                         f"{tuple(dnorm.shape)}")


def _lp_norm_gradient_shape(specs, p=2, average=False):
    _check_lp_gradient(*specs, p, average)
    return [like(specs[0])]


@op("LpNormGradient", inputs=2, outputs=1, inplace=(), args={"p": 2, "average": False},
    shape=_lp_norm_gradient_shape)
def lp_norm_gradient(xp, X, dnorm, *, p, average):
    """dX = sign(x)·dnorm/size (p=1; sign is 0 for |x| <= 1e-12) or 2x·dnorm/size (p=2)."""
    _check_lp_gradient(X, dnorm, p, average)
    dt = X.dtype
    scale = dnorm.reshape(()).astype(dt) / const(dt, size_of(X) if average else 1)
    if p == 1:
        eps = const(dt, 1e-12)
        sign = (X > eps).astype(dt) - (X < -eps).astype(dt)
        return xp.asarray(sign * scale)
    return xp.asarray(X * const(dt, 2) * scale)


def _check_clip_by_scaling(threshold, X, val, extra=None) -> None:
    t = "ClipTensorByScaling"
    if not threshold > 0:
        raise ArgumentError(f"{t}: threshold must be > 0, got {threshold}")
    check_float(t, input_tensor=X)
    if size_of(X) == 0:
        raise ShapeError(f"{t}: the input tensor is empty (shape {tuple(X.shape)})")
    check_scalar(t, "val", val)
    if extra is not None:
        check_scalar(t, "additional_threshold", extra)


def _clip_by_scaling_shape(specs, threshold=0.0):
    _check_clip_by_scaling(threshold, *specs)
    return [like(specs[0])]


@op("ClipTensorByScaling", inputs=(2, 3), outputs=1, inplace=[(0, 0)], args={"threshold": 0.0},
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_clip_by_scaling_shape)
def clip_tensor_by_scaling(xp, X, val, *extra, threshold):
    """clipped = X·(t/val) when val > t, else a copy of X, with t = threshold (·additional_threshold when the
    third input is given). val is usually a precomputed norm of X."""
    _check_clip_by_scaling(threshold, X, val, *extra)
    dt = X.dtype
    t = const(dt, threshold)
    if extra:
        t = t * extra[0].reshape(()).astype(dt)
    v = val.reshape(()).astype(dt)
    ratio = xp.where(v > t, t / v, const(dt, 1))
    return xp.asarray(X * ratio.astype(dt))
