"""Row-wise losses and similarities of two same-shaped float tensors, with Caffe2's gradient ops:
SigmoidCrossEntropyWithLogits (and its weighted form), which average over the last axis, and
SquaredL2Distance, L1Distance, DotProduct, CosineSimilarity, which reduce every dim-0 row to one value; and
MakeTwoClass, which turns sigmoid probabilities into (1 - p, p) pairs for two-class losses.

Caffe2 conventions kept: a 0-D input is one row; DotProduct of an empty input has no rows at all;
L1Distance's gradient is 0 where |x - y| <= 1e-12; CosineSimilarity clamps squared norms at 1e-12 in the
forward pass and in its gradient formula alike.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, ShapeError
from .base import check_float, like, out_spec
from .registry import op

L1_EPS = 1e-12
COSINE_EPS = 1e-12


def _same_shape(a, b, names=("X", "Y")) -> None:
    check_float(**{names[0]: a})
    check_float(**{names[1]: b})
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{names[0]} {tuple(a.shape)} and {names[1]} {tuple(b.shape)} must have one shape")


def _stable_sigmoid(xp, x):
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(xp, x):
    """log(1 + exp(x)) without overflow."""
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


# --------------------------------------------------------------------------------------------- sigmoid xent
def _check_xent_args(log_D_trick, unjoined_lr_loss) -> None:
    if log_D_trick and unjoined_lr_loss:
        raise ArgumentError("log_D_trick and unjoined_lr_loss cannot both be set; choose one")


def _as_rows(x, dtype=None):
    """x as outer x inner rows over its last axis (a 0-D x is one row of one), in dtype."""
    inner = int(x.shape[-1]) if x.ndim else 1
    rows = x.reshape(math.prod(int(d) for d in x.shape[:-1]), inner)
    return rows if dtype is None else rows.astype(dtype)


def _grad_rows(dY, logits) -> None:
    check_float(dY=dY)
    outer = math.prod(int(d) for d in logits.shape[:-1])
    if math.prod(int(d) for d in dY.shape) != outer:
        raise ShapeError(f"dY {tuple(dY.shape)} must hold one gradient per row of logits "
                         f"{tuple(logits.shape)}: {outer} values")


def _xent_shape(n_inputs):
    def shape(specs, log_D_trick=False, unjoined_lr_loss=False):
        _check_xent_args(log_D_trick, unjoined_lr_loss)
        for k in range(1, n_inputs):
            _same_shape(specs[0], specs[k], ("logits", ("targets", "weights")[k - 1]))
        return [out_spec(tuple(specs[0].shape)[:-1], specs[0].dtype)]
    return shape


def _xent_grad_shape(n_inputs):
    def shape(specs, log_D_trick=False, unjoined_lr_loss=False):
        for k in range(2, n_inputs):
            _same_shape(specs[1], specs[k], ("logits", ("targets", "weights")[k - 2]))
        _grad_rows(specs[0], specs[1])
        return [like(specs[1])]
    return shape


def _sigmoid_xent_gradient(g):
    g.op("SigmoidCrossEntropyWithLogitsGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0)])


XENT_ARGS = {"log_D_trick": False, "unjoined_lr_loss": False}


@op("SigmoidCrossEntropyWithLogits", inputs=2, outputs=1, inplace=(), args=XENT_ARGS, shape=_xent_shape(2),
    gradient=_sigmoid_xent_gradient)
def sigmoid_cross_entropy_with_logits(xp, logits, targets, log_D_trick=False, unjoined_lr_loss=False):
    """-mean over the last axis of t*l - softplus(l) (the log-likelihood of targets t under sigmoid(l)); the
    output drops the last axis. log_D_trick uses (2t-1)*log(sigmoid(l)); unjoined_lr_loss t*l -
    (1-t)*softplus(l)."""
    _check_xent_args(log_D_trick, unjoined_lr_loss)
    _same_shape(logits, targets, ("logits", "targets"))
    lg, t = _as_rows(logits), _as_rows(targets, logits.dtype)
    if unjoined_lr_loss:
        term = t * lg - (1 - t) * _softplus(xp, lg)
    elif log_D_trick:
        term = (2 * t - 1) * (lg - _softplus(xp, lg))
    else:
        term = t * lg - _softplus(xp, lg)
    return _row_mean(-term, logits)


def _row_mean(rows, logits):
    """Mean of each row, shaped like logits without its last axis (NaN for empty rows: Caffe2's 0/0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rows.sum(axis=1) / rows.dtype.type(rows.shape[1])).reshape(logits.shape[:-1])


@op("SigmoidCrossEntropyWithLogitsGradient", inputs=3, outputs=1, inplace=(), args=XENT_ARGS,
    shape=_xent_grad_shape(3))
def sigmoid_cross_entropy_with_logits_gradient(xp, dY, logits, targets, log_D_trick=False,
                                               unjoined_lr_loss=False):
    """(dY, logits, targets) -> dlogits = -dY/inner * d(term)/dl, inner being the last axis' size."""
    _same_shape(logits, targets, ("logits", "targets"))
    _grad_rows(dY, logits)
    lg, t = _as_rows(logits), _as_rows(targets, logits.dtype)
    if unjoined_lr_loss:
        dterm = t - (1 - t) * _stable_sigmoid(xp, lg)
    elif log_D_trick:
        dterm = (2 * t - 1) * _stable_sigmoid(xp, -lg)
    else:
        dterm = t - _stable_sigmoid(xp, lg)
    return _row_scaled(dY, logits, dterm)


def _row_scaled(dY, logits, dterm):
    """-dY[row] / inner * dterm (rows), shaped like logits."""
    g = dY.reshape(dterm.shape[0], 1).astype(logits.dtype)
    return (-g * logits.dtype.type(1.0 / max(dterm.shape[1], 1)) * dterm).reshape(logits.shape)


def _weighted_xent_gradient(g):
    g.op("WeightedSigmoidCrossEntropyWithLogitsGradient", [g.GO(0), g.I(0), g.I(1), g.I(2)], [g.GI(0)])


@op("WeightedSigmoidCrossEntropyWithLogits", inputs=3, outputs=1, inplace=(), shape=_xent_shape(3),
    gradient=_weighted_xent_gradient)
def weighted_sigmoid_cross_entropy_with_logits(xp, logits, targets, weights):
    """-mean over the last axis of w * (t*l - softplus(l)), weights shaped like the logits."""
    _same_shape(logits, targets, ("logits", "targets"))
    _same_shape(logits, weights, ("logits", "weights"))
    lg, t, w = _as_rows(logits), _as_rows(targets, logits.dtype), _as_rows(weights, logits.dtype)
    return _row_mean(-(t * lg - _softplus(xp, lg)) * w, logits)


@op("WeightedSigmoidCrossEntropyWithLogitsGradient", inputs=4, outputs=1, inplace=(),
    shape=_xent_grad_shape(4))
def weighted_sigmoid_cross_entropy_with_logits_gradient(xp, dY, logits, targets, weights):
    """(dY, logits, targets, weights) -> dlogits = -dY/inner * w * (t - sigmoid(l))."""
    _same_shape(logits, targets, ("logits", "targets"))
    _same_shape(logits, weights, ("logits", "weights"))
    _grad_rows(dY, logits)
    lg, t, w = _as_rows(logits), _as_rows(targets, logits.dtype), _as_rows(weights, logits.dtype)
    return _row_scaled(dY, logits, (t - _stable_sigmoid(xp, lg)) * w)


# ------------------------------------------------------------------------------------------ MakeTwoClass
def _two_class_shape(specs):
    check_float(X=specs[0])
    return [out_spec(tuple(specs[0].shape) + (2,), specs[0].dtype)]


def _make_two_class_gradient(g):
    g.op("MakeTwoClassGradient", [g.GO(0)], [g.GI(0)])


@op("MakeTwoClass", inputs=1, outputs=1, inplace=(), shape=_two_class_shape,
    gradient=_make_two_class_gradient)
def make_two_class(xp, X):
    """Probabilities x -> pairs (1 - x, x) on a new last axis of size 2."""
    check_float(X=X)
    x = X[..., None]
    return xp.concatenate([1 - x, x], axis=-1)


def _two_class_grad_check(dY):
    check_float(dY=dY)
    if not dY.shape or dY.shape[-1] != 2:
        raise ShapeError(f"dY {tuple(dY.shape)} must end in a dimension of size 2 (MakeTwoClass's output)")


def _two_class_grad_shape(specs):
    _two_class_grad_check(specs[0])
    return [out_spec(tuple(specs[0].shape)[:-1], specs[0].dtype)]


@op("MakeTwoClassGradient", inputs=1, outputs=1, inplace=(), shape=_two_class_grad_shape)
def make_two_class_gradient(xp, dY):
    """dX = dY[..., 1] - dY[..., 0]."""
    _two_class_grad_check(dY)
    pairs = dY.reshape(-1, 2)
    return (pairs[:, 1] - pairs[:, 0]).reshape(dY.shape[:-1])



# --------------------------------------------------------------------------------------------- distances
def _rows(x, empty_has_no_rows=False) -> tuple[int, int]:
    """(N, D): dim 0 and the rest (a 0-D input is one row of one; DotProduct counts no rows when empty)."""
    size = math.prod(int(d) for d in x.shape)
    if empty_has_no_rows and size == 0:
        return 0, 0
    n = int(x.shape[0]) if len(x.shape) else 1
    return n, (size // n if n else 0)


def _pair_shape(empty_has_no_rows=False):
    def shape(specs):
        _same_shape(specs[0], specs[1])
        return [out_spec((_rows(specs[0], empty_has_no_rows)[0],), specs[0].dtype)]
    return shape


def _pair_grad_check(X, Y, dZ, empty_has_no_rows=False) -> tuple[int, int]:
    _same_shape(X, Y)
    check_float(**{"the output gradient": dZ})
    n, d = _rows(X, empty_has_no_rows)
    if tuple(dZ.shape) != (n,):
        raise ShapeError(f"the output gradient {tuple(dZ.shape)} must have one value per row of X "
                         f"{tuple(X.shape)}: shape ({n},)")
    return n, d


def _pair_grad_shape(empty_has_no_rows=False):
    def shape(specs):
        _pair_grad_check(*specs, empty_has_no_rows)
        return [like(specs[0]), like(specs[1])]
    return shape


def _pair_gradient(type_):
    def maker(g):
        g.op(type_, [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)])
    return maker


def _flat(x, n, d):
    return x.reshape(n, d)


@op("SquaredL2Distance", inputs=2, outputs=1, inplace=(), shape=_pair_shape(),
    gradient=_pair_gradient("SquaredL2DistanceGradient"))
def squared_l2_distance(xp, X, Y):
    """0.5 * ||x - y||^2 for every dim-0 row."""
    _same_shape(X, Y)
    n, d = _rows(X)
    diff = _flat(X, n, d) - _flat(Y, n, d)
    return (diff * diff).sum(axis=1) * X.dtype.type(0.5)


@op("SquaredL2DistanceGradient", inputs=3, outputs=2, inplace=(), shape=_pair_grad_shape())
def squared_l2_distance_gradient(xp, X, Y, dZ):
    """(X, Y, dDistance) -> dX = dDistance[row] * (x - y), dY = -dX."""
    n, d = _pair_grad_check(X, Y, dZ)
    dx = (_flat(X, n, d) - _flat(Y, n, d)) * dZ.reshape(n, 1).astype(X.dtype)
    return dx.reshape(X.shape), (-dx).reshape(Y.shape)


@op("L1Distance", inputs=2, outputs=1, inplace=(), shape=_pair_shape(),
    gradient=_pair_gradient("L1DistanceGradient"))
def l1_distance(xp, X, Y):
    """sum |x - y| for every dim-0 row (pytorch-era Caffe2; the 2018 snapshot summed everything into (1,))."""
    _same_shape(X, Y)
    n, d = _rows(X)
    return xp.abs(_flat(X, n, d) - _flat(Y, n, d)).sum(axis=1)


@op("L1DistanceGradient", inputs=3, outputs=2, inplace=(), shape=_pair_grad_shape())
def l1_distance_gradient(xp, X, Y, dZ):
    """(X, Y, dDistance) -> dX = dDistance[row] * sign(x - y) (0 within 1e-12), dY = -dX."""
    n, d = _pair_grad_check(X, Y, dZ)
    diff = _flat(X, n, d) - _flat(Y, n, d)
    sign = (diff > L1_EPS).astype(X.dtype) - (diff < -L1_EPS).astype(X.dtype)
    dx = sign * dZ.reshape(n, 1).astype(X.dtype)
    return dx.reshape(X.shape), (-dx).reshape(Y.shape)


@op("DotProduct", inputs=2, outputs=1, inplace=(), shape=_pair_shape(True),
    gradient=_pair_gradient("DotProductGradient"))
def dot_product(xp, X, Y):
    """x . y for every dim-0 row; an empty input gives an empty (0,) output."""
    _same_shape(X, Y)
    n, d = _rows(X, True)
    return (_flat(X, n, d) * _flat(Y, n, d)).sum(axis=1)


@op("DotProductGradient", inputs=3, outputs=2, inplace=(), shape=_pair_grad_shape(True))
def dot_product_gradient(xp, X, Y, dZ):
    """(X, Y, dDot) -> dX = dDot[row] * y, dY = dDot[row] * x."""
    n, d = _pair_grad_check(X, Y, dZ, True)
    g = dZ.reshape(n, 1).astype(X.dtype)
    return (g * _flat(Y, n, d)).reshape(X.shape), (g * _flat(X, n, d)).reshape(Y.shape)


def _norms(xp, x, y):
    """Clamped norms |x|, |y| and x . y per row."""
    eps = x.dtype.type(COSINE_EPS)
    xn = xp.sqrt(xp.maximum((x * x).sum(axis=1), eps))
    yn = xp.sqrt(xp.maximum((y * y).sum(axis=1), eps))
    return xn, yn, (x * y).sum(axis=1)


@op("CosineSimilarity", inputs=2, outputs=1, inplace=(), shape=_pair_shape(),
    gradient=_pair_gradient("CosineSimilarityGradient"))
def cosine_similarity(xp, X, Y):
    """x . y / sqrt(max(|x|^2, 1e-12) * max(|y|^2, 1e-12)) for every dim-0 row."""
    _same_shape(X, Y)
    n, d = _rows(X)
    xn, yn, xy = _norms(xp, _flat(X, n, d), _flat(Y, n, d))
    return xy / (xn * yn)


@op("CosineSimilarityGradient", inputs=3, outputs=2, inplace=(), shape=_pair_grad_shape())
def cosine_similarity_gradient(xp, X, Y, dZ):
    """(X, Y, dCos) -> dX = dCos * (y / (|x||y|) - (x.y) x / (|x|^3 |y|)), and symmetrically dY."""
    n, d = _pair_grad_check(X, Y, dZ)
    x, y = _flat(X, n, d), _flat(Y, n, d)
    xn, yn, xy = _norms(xp, x, y)
    g, xyn = dZ.reshape(n).astype(X.dtype), xn * yn
    dx = (g / xyn)[:, None] * y - (g * xy / (xn * xn * xyn))[:, None] * x
    dy = (g / xyn)[:, None] * x - (g * xy / (yn * yn * xyn))[:, None] * y
    return dx.reshape(X.shape), dy.reshape(Y.shape)
