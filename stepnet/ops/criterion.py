"""Elementwise criteria of Torch's kind: CosineEmbeddingCriterion (a similarity and a +1/-1 label),
MarginRankingCriterion (two scores and which should rank higher) and BernoulliJSD (the Jensen-Shannon
divergence of two Bernoulli distributions), each with Caffe2's gradient op.

Semantics from caffe2/operators/{cosine_embedding_criterion,margin_ranking_criterion,jsd}_op.{h,cc}. Labels
are int32; a label other than 1 takes CosineEmbeddingCriterion's "-1" branch, and MarginRankingCriterion
multiplies by the label as given, as Caffe2's kernels do. Inputs are compared by element count (any shapes);
outputs have the first input's shape.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .base import check_float, like, single_gradient, size_of
from .registry import op

LOG_THRESHOLD = 1e-20


def _labels(op_type: str, y) -> None:
    if y.dtype is not None and y.dtype != np.int32:
        raise DTypeError(f"{op_type}: the label must be int32 (1 or -1), got {y.dtype}; Cast it to int32")


def _same_size(op_type: str, named: dict) -> None:
    (first, ref), *rest = named.items()
    for name, x in rest:
        if size_of(x) != size_of(ref):
            raise ShapeError(f"{op_type}: {name} {tuple(x.shape)} must have as many elements as {first} "
                             f"{tuple(ref.shape)}")


# --------------------------------------------------------------------------------------------- cosine embedding
def _cosine_checks(S, Y, dOut=None) -> None:
    op_type = "CosineEmbeddingCriterion" + ("Gradient" if dOut is not None else "")
    check_float(op_type, S=S, dOutput=dOut)
    _labels(op_type, Y)
    _same_size(op_type, {"S": S, "Y": Y, **({} if dOut is None else {"dOutput": dOut})})


def _cosine_shape(specs, *, margin):
    _cosine_checks(*specs)
    return [like(specs[0])]


@op("CosineEmbeddingCriterion", inputs=2, outputs=1, inplace=(), args={"margin": 0.0}, shape=_cosine_shape,
    shapes_from_inputs=True, gradient=single_gradient("CosineEmbeddingCriterionGradient", ["I0", "I1", "GO0"]))
def cosine_embedding_criterion(xp, S, Y, *, margin):
    """loss = 1 - S where Y == 1, else max(0, S - margin), elementwise (S a cosine similarity)."""
    _cosine_checks(S, Y)
    t = S.dtype.type
    return xp.where(Y.reshape(S.shape) == 1, t(1) - S, xp.maximum(S - t(margin), t(0)))


@op("CosineEmbeddingCriterionGradient", inputs=3, outputs=1, inplace=(), args={"margin": 0.0},
    shape=_cosine_shape, shapes_from_inputs=True)
def cosine_embedding_criterion_gradient(xp, S, Y, dOutput, *, margin):
    """S, Y, dOutput -> dS = -dOutput where Y == 1, else dOutput where S >= margin, else 0."""
    _cosine_checks(S, Y, dOutput)
    t = S.dtype.type
    d = dOutput.reshape(S.shape)
    return xp.where(Y.reshape(S.shape) == 1, -d, xp.where(S >= t(margin), d, t(0)))


# --------------------------------------------------------------------------------------------- margin ranking
def _ranking_checks(X1, X2, Y, dLoss=None) -> None:
    op_type = "MarginRankingCriterion" + ("Gradient" if dLoss is not None else "")
    check_float(op_type, X1=X1, X2=X2, dLoss=dLoss)
    _labels(op_type, Y)
    _same_size(op_type, {"X1": X1, "X2": X2, "Y": Y, **({} if dLoss is None else {"dLoss": dLoss})})


def _ranking_shape(specs, *, margin):
    _ranking_checks(*specs)
    return [like(specs[0])] if len(specs) == 3 else [like(specs[0]), like(specs[1])]


def _signed_gap(xp, X1, X2, Y, margin):
    """-Y * (X1 - X2) + margin, in X1's shape."""
    return -Y.reshape(X1.shape).astype(X1.dtype) * (X1 - X2.reshape(X1.shape)) + X1.dtype.type(margin)


@op("MarginRankingCriterion", inputs=3, outputs=1, inplace=(), args={"margin": 1.0}, shape=_ranking_shape,
    shapes_from_inputs=True,
    gradient=single_gradient("MarginRankingCriterionGradient", ["I0", "I1", "I2", "GO0"], ["GI0", "GI1"]))
def margin_ranking_criterion(xp, X1, X2, Y, *, margin):
    """loss = max(0, -Y * (X1 - X2) + margin) elementwise: Y = 1 says X1 should score higher than X2, Y = -1
    the reverse."""
    _ranking_checks(X1, X2, Y)
    return xp.maximum(_signed_gap(xp, X1, X2, Y, margin), X1.dtype.type(0))


@op("MarginRankingCriterionGradient", inputs=4, outputs=2, inplace=(), args={"margin": 1.0},
    shape=_ranking_shape, shapes_from_inputs=True)
def margin_ranking_criterion_gradient(xp, X1, X2, Y, dLoss, *, margin):
    """X1, X2, Y, dLoss -> dX1 = -Y * dLoss and dX2 = Y * dLoss where -Y * (X1 - X2) + margin >= 0, else 0."""
    _ranking_checks(X1, X2, Y, dLoss)
    active = _signed_gap(xp, X1, X2, Y, margin) >= 0
    yd = Y.reshape(X1.shape).astype(X1.dtype) * dLoss.reshape(X1.shape)
    zero = X1.dtype.type(0)
    return xp.where(active, -yd, zero), xp.where(active, yd, zero).reshape(X2.shape)


# --------------------------------------------------------------------------------------------- Bernoulli JSD
def _entropy(xp, p):
    """-p log p - (1 - p) log(1 - p), 0 within 1e-20 of 0 or 1."""
    q = 1 - p
    inside = (p >= LOG_THRESHOLD) & (q >= LOG_THRESHOLD)
    safe_p, safe_q = xp.where(inside, p, 0.5), xp.where(inside, q, 0.5)
    return xp.where(inside, -safe_p * xp.log(safe_p) - safe_q * xp.log(safe_q), 0.0)


def _logit(xp, p):
    """log(x / (1 - x)) with x = p clamped to [1e-20, 1 - 1e-20] (+inf at 1, as Caffe2's float gives)."""
    x = xp.minimum(xp.maximum(p, LOG_THRESHOLD), 1 - LOG_THRESHOLD)
    with np.errstate(divide="ignore"):
        return -xp.log(1.0 / x - 1.0)


def _jsd_checks(op_type, X, T, go=None) -> None:
    check_float(op_type, X=X, T=T, dL=go)
    _same_size(op_type, {"X": X, "T": T, **({} if go is None else {"dL": go})})


def _jsd_shape(specs):
    _jsd_checks("BernoulliJSD", *specs)
    return [like(specs[0])]


def _jsd_grad_shape(specs):
    _jsd_checks("BernoulliJSDGradient", specs[1], specs[2], specs[0])
    return [like(specs[1])]


@op("BernoulliJSD", inputs=2, outputs=1, inplace=(), shape=_jsd_shape, shapes_from_inputs=True,
    gradient=single_gradient("BernoulliJSDGradient", ["GO0", "I0", "I1"]))
def bernoulli_jsd(xp, X, T):
    """L = H((X + T) / 2) - (H(X) + H(T)) / 2 elementwise, H the entropy of a Bernoulli distribution: the
    Jensen-Shannon divergence between predicted probabilities X and target probabilities T."""
    _jsd_checks("BernoulliJSD", X, T)
    p, q = X.astype(np.float64), T.reshape(X.shape).astype(np.float64)
    return (_entropy(xp, (p + q) / 2) - (_entropy(xp, p) + _entropy(xp, q)) / 2).astype(X.dtype)


@op("BernoulliJSDGradient", inputs=3, outputs=1, inplace=(), shape=_jsd_grad_shape, shapes_from_inputs=True)
def bernoulli_jsd_gradient(xp, dL, X, T):
    """dL, X, T -> dX = dL * (logit(X) - logit((X + T) / 2)) / 2, logits clamped at 1e-20 from 0 and 1."""
    _jsd_checks("BernoulliJSDGradient", X, T, dL)
    p, q = X.astype(np.float64), T.reshape(X.shape).astype(np.float64)
    g = (_logit(xp, p) - _logit(xp, (p + q) / 2)) / 2
    return (dL.reshape(X.shape).astype(np.float64) * g).astype(X.dtype)
