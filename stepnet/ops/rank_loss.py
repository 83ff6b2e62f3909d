"""Learning-to-rank losses: PairWiseLoss (the logistic loss of every mis-ordered pair in a session, averaged)
and LambdaRankNdcg (LambdaRank's NDCG-weighted pairwise loss of one list), with Caffe2's gradient ops.

Semantics from caffe2/operators/rank_loss_op.cc and listwise_l2r_op.cc. Both loop over pairs on the host, as
Caffe2 has them on the CPU only, and put their results on the op's device. LambdaRankNdcg returns the
gradient of its loss with its loss (output 1, dY); its gradient op only scales that by dLoss. That dY is
LambdaRank's lambda, not the exact derivative: each unordered pair is counted once in it but twice in the
loss, so it is half the loss's derivative (the discounts, which depend on the ranks, are held fixed).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import DTypeError, ShapeError
from .base import check_float, like, on_device, out_spec
from .registry import op

FLOAT32_EPS = float(np.finfo(np.float32).eps)
MIN_LOG_DIFF = math.log(FLOAT32_EPS)   # log(x) below which log(1 + e^x) is 0 in float


def _host(x):
    return np.asarray(backend.to_host(x))


# --------------------------------------------------------------------------------------------- PairWiseLoss
def _pairwise_rows(op_type, X, label, lengths) -> int:
    """N after the checks of X (N or N x 1 scores), label (N or N x 1) and lengths (int32, summing to N)."""
    check_float(op_type, X=X, label=label)
    n = X.shape[0] if len(X.shape) else 0
    if n and math.prod(X.shape) != n:
        raise ShapeError(f"{op_type}: X {tuple(X.shape)} must hold one score per row (N or N x 1)")
    if not (len(label.shape) == 1 or (len(label.shape) == 2 and label.shape[1] == 1)) or label.shape[0] != n:
        raise ShapeError(f"{op_type}: label {tuple(label.shape)} must be ({n},) or ({n}, 1), one per row of X")
    if lengths is not None:
        if lengths.dtype is not None and lengths.dtype != np.int32:
            raise DTypeError(f"{op_type}: lengths must be int32, got {lengths.dtype}")
        if len(lengths.shape) != 1:
            raise ShapeError(f"{op_type}: lengths must be 1-D, got shape {tuple(lengths.shape)}")
    return n


def _sessions(op_type, n, lengths) -> list[int]:
    if lengths is None:
        return [n]
    lens = [int(v) for v in _host(lengths).tolist()]
    if any(v < 0 for v in lens) or sum(lens) != n:
        raise ShapeError(f"{op_type}: lengths {lens} must be non-negative and sum to the {n} rows of X")
    return lens


def _log_logit(x):
    """log(1 + e^x), computed as Caffe2 does: 0 below log(eps), x above -log(eps)."""
    mid = np.log1p(np.exp(np.clip(x, MIN_LOG_DIFF, -MIN_LOG_DIFF)))
    return np.where(x < MIN_LOG_DIFF, 0.0, np.where(x > -MIN_LOG_DIFF, x, mid))


def _pairs(x, lab):
    """The session's ordered pairs j < i with different labels: (mask, sign, x_j - x_i), each N x N."""
    n = x.size
    lower = np.tril(np.ones((n, n), bool), -1)
    differ = np.abs(lab[:, None] - lab[None, :]) >= FLOAT32_EPS
    mask = lower & differ
    sign = np.where(lab[:, None] > lab[None, :], 1.0, -1.0)
    return mask, sign, x[None, :] - x[:, None]


def _pairwise_shape(specs):
    X, label, lengths = (*specs, None)[:3]
    n = _pairwise_rows("PairWiseLoss", X, label, lengths)
    if n == 0:
        return [out_spec((0,), X.dtype)]
    return [out_spec((1,) if lengths is None else lengths.shape, X.dtype)]


def _pairwise_gradient(g):
    ins = [g.I(0), g.I(1), g.GO(0)] + ([g.I(2)] if g.n_inputs == 3 else [])
    g.op("PairWiseLossGradient", ins, [g.GI(0)])


@op("PairWiseLoss", inputs=(2, 3), outputs=1, inplace=(), shape=_pairwise_shape, gradient=_pairwise_gradient)
def pair_wise_loss(xp, X, label, lengths=None):
    """Per session (lengths splits the N rows; one session without it): the mean over pairs j < i with
    different labels of log(1 + exp(s * (X[j] - X[i]))), s = 1 if label[i] > label[j] else -1 (0 for a
    session without such pairs). X holds one score per row."""
    n = _pairwise_rows("PairWiseLoss", X, label, lengths)
    if n == 0:
        return xp.zeros((0,), X.dtype)
    x, lab = _host(X).reshape(n).astype(np.float64), _host(label).reshape(n).astype(np.float64)
    out, start = [], 0
    for size in _sessions("PairWiseLoss", n, lengths):
        mask, sign, diff = _pairs(x[start:start + size], lab[start:start + size])
        pairs = int(mask.sum())
        total = float(_log_logit(sign * diff)[mask].sum())
        out.append(total / pairs if pairs else total)
        start += size
    return on_device(xp, out, X.dtype)


def _pairwise_grad_checks(X, label, dY, lengths) -> int:
    n = _pairwise_rows("PairWiseLossGradient", X, label, lengths)
    check_float("PairWiseLossGradient", X=X, dY=dY)
    want = 1 if lengths is None else lengths.shape[0]
    if n and (len(dY.shape) != 1 or dY.shape[0] != want):
        raise ShapeError(f"PairWiseLossGradient: dY {tuple(dY.shape)} must be 1-D with one value per session "
                         f"({want},)")
    return n


def _pairwise_grad_shape(specs):
    _pairwise_grad_checks(*(*specs, None)[:4])
    return [like(specs[0])]


@op("PairWiseLossGradient", inputs=(3, 4), outputs=1, inplace=(), shape=_pairwise_grad_shape)
def pair_wise_loss_gradient(xp, X, label, dY, lengths=None):
    """X, label, dY (one per session), [lengths] -> dX: each counted pair (j < i, labels differ) adds
    g = s dY / (1 + exp(-s (X[j] - X[i]))) to dX[j] and -g to dX[i]; a session's dX is then divided by its
    number of pairs."""
    n = _pairwise_grad_checks(X, label, dY, lengths)
    if n == 0:
        return xp.zeros(X.shape, X.dtype)
    x, lab = _host(X).reshape(n).astype(np.float64), _host(label).reshape(n).astype(np.float64)
    dy = _host(dY).reshape(-1).astype(np.float64)
    dx, start = np.zeros(n), 0
    for k, size in enumerate(_sessions("PairWiseLossGradient", n, lengths)):
        mask, sign, diff = _pairs(x[start:start + size], lab[start:start + size])
        g = np.where(mask, sign * dy[k] / (1 + np.exp(-sign * diff)), 0.0)     # g[i, j]
        part = g.sum(axis=0) - g.sum(axis=1)
        pairs = int(mask.sum())
        dx[start:start + size] = part / pairs if pairs else part
        start += size
    return on_device(xp, dx.reshape(X.shape), X.dtype)


# --------------------------------------------------------------------------------------------- LambdaRankNdcg
def _ndcg_checks(y, r) -> int:
    check_float("LambdaRankNdcg", y=y, r=r)
    if len(y.shape) != 1 or math.prod(r.shape) != y.shape[0]:
        raise ShapeError(f"LambdaRankNdcg: y must be 1-D and r hold as many values, got y {tuple(y.shape)} and "
                         f"r {tuple(r.shape)}")
    return y.shape[0]


def _ndcg_shape(specs):
    n = _ndcg_checks(*specs)
    return [out_spec((1,), specs[0].dtype), out_spec((n,), specs[0].dtype)]


def _ndcg_gradient(g):
    g.op("LambdaRankNdcgGradient", [g.I(0), g.O(1), g.GO(0)], [g.GI(0)])


def _discounts(values):
    """1 / log2(rank + 2) for each element, rank 0 the largest value (ties in their order)."""
    order = np.argsort(-values, kind="stable")
    d = np.empty(values.size)
    d[order] = math.log(2.0) / np.log(np.arange(values.size) + 2.0)
    return d


@op("LambdaRankNdcg", inputs=2, outputs=2, inplace=(), shape=_ndcg_shape, gradient=_ndcg_gradient)
def lambda_rank_ndcg(xp, y, r):
    """Scores y and relevances r of one list -> loss (1 value) and dY (one per element). With gains 2^r,
    discounts 1 / log2(rank + 2) (by y for the list, by r for the ideal order, whose DCG is idcg, 1 when
    below 1e-5), weights w_ij = |(d_i - d_j)(2^r_i - 2^r_j)| and s_ij = 1 if r_i > r_j else -1:
    loss = -sum_ij w_ij log sigmoid(s_ij (y_i - y_j)) / idcg and dY_i = -sum_j w_ij s_ij
    sigmoid(-s_ij (y_i - y_j)) / idcg (the log sigmoid is 0 above 100 and its argument below -100)."""
    n = _ndcg_checks(y, r)
    yv, rv = _host(y).astype(np.float64), _host(r).reshape(n).astype(np.float64)
    gain = np.exp2(rv)
    idcg = float((gain * _discounts(rv)).sum())
    idcg = 1.0 if idcg < 1e-5 else idcg
    d = _discounts(yv)
    w = np.abs((d[:, None] - d[None, :]) * (gain[:, None] - gain[None, :]))
    s = np.where(rv[:, None] - rv[None, :] > 0, 1.0, -1.0)
    v = s * (yv[:, None] - yv[None, :])
    with np.errstate(over="ignore"):
        log_sig = np.where(v > 100, 0.0, np.where(v < -100, v, -np.log1p(np.exp(-np.clip(v, -100, 100)))))
        dy = -(w * s / (1 + np.exp(v))).sum(axis=1) / idcg
    loss = -(w * log_sig).sum() / idcg
    return on_device(xp, [loss], y.dtype), on_device(xp, dy, y.dtype)


def _ndcg_grad_checks(y, dy, dloss) -> None:
    check_float("LambdaRankNdcgGradient", y=y, dY=dy, dLoss=dloss)
    if len(y.shape) != 1 or len(dy.shape) != 1 or dy.shape[0] != y.shape[0] or dy.shape[0] == 0:
        raise ShapeError(f"LambdaRankNdcgGradient: y {tuple(y.shape)} and dY {tuple(dy.shape)} must be 1-D of "
                         "one non-zero size")
    if math.prod(dloss.shape) != 1:
        raise ShapeError(f"LambdaRankNdcgGradient: dLoss must hold one value, got shape {tuple(dloss.shape)}")


def _ndcg_grad_shape(specs):
    _ndcg_grad_checks(*specs)
    return [like(specs[1])]


@op("LambdaRankNdcgGradient", inputs=3, outputs=1, inplace=(), shape=_ndcg_grad_shape)
def lambda_rank_ndcg_gradient(xp, y, dY, dLoss):
    """y, dY (LambdaRankNdcg's output 1), dLoss -> dLoss * dY."""
    _ndcg_grad_checks(y, dY, dLoss)
    return dY * dLoss.reshape(())

