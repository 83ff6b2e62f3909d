"""SoftmaxWithLoss and SpatialSoftmaxWithLoss with their gradient ops (softmax_with_loss_op.cc,
spatial_softmax_with_loss_op.cc): the softmax of the logits and the (weighted) average cross entropy against
int32 labels or class probabilities, in one op.

Caffe2 quirks kept on purpose: probabilities are clamped at 1e-20 before a log; the gradient stays unscaled
when the weights do not sum to a positive number; the spatial form ignores `scale` in the forward loss but
applies it in the gradient.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, ShapeError
from .base import check_float, like, out_spec
from .loss import DONT_CARE, LOG_THRESHOLD, check_int32_labels, check_label_values, check_one_element, numel, onehot
from .registry import op


def _canonical_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"axis {axis} is out of range for {ndim}-D logits (valid: {-ndim} to {ndim - 1})")
    return axis + ndim if axis < 0 else axis


def _swl_check(X, T, W, label_prob, axis, scale, order, spatial, op_type="SoftmaxWithLoss"):
    """Argument, dtype and shape checks of SoftmaxWithLoss and its gradient; (N, D) of the 2-D view (for the
    spatial form: N, D, H, W)."""
    if scale < 0:
        raise ArgumentError(f"scale must be >= 0, got {scale}")
    if order != "NCHW":
        raise ArgumentError(f"{op_type} supports only order 'NCHW', got {order!r}; transpose the logits")
    check_float(logits=X)
    if W is not None:
        check_float(weights=W)
    xs, ts = tuple(X.shape), tuple(T.shape)
    if spatial:
        if label_prob:
            raise ArgumentError("label_prob=1 cannot be used with spatial=1; give int32 labels per position")
        if axis != 1:
            raise ArgumentError(f"spatial mode needs axis 1 (channels), got axis {axis}")
        check_int32_labels(T)
        if len(xs) != 4 or ts != (xs[0],) + xs[2:]:
            raise ShapeError(f"spatial mode needs logits N x C x H x W and labels N x H x W, got logits {xs} "
                             f"and labels {ts}")
        if W is not None and numel(W.shape) != numel(ts):
            raise ShapeError(f"weights {tuple(W.shape)} must hold one weight per position: {numel(ts)} "
                             f"values (the labels' shape {ts})")
        return xs
    a = _canonical_axis(axis, len(xs))
    n, d = numel(xs[:a]), numel(xs[a:])
    if label_prob:
        check_float(**{"label probabilities (label_prob=1)": T})
        if len(ts) < max(2, a) or numel(ts[:a]) != n or numel(ts[a:]) != d:
            raise ShapeError(f"label probabilities {ts} must match logits {xs}: {n} rows of {d} "
                             f"probabilities split at axis {a}")
    else:
        check_int32_labels(T, hint=" (float labels are class probabilities: set label_prob=1)"
                           if T.dtype is not None and T.dtype.kind == "f" else "")
        ok = numel(ts) == n if len(ts) == a else len(ts) > a and numel(ts[:a]) == n and numel(ts[a:]) == 1
        if not ok:
            raise ShapeError(f"labels {ts} do not fit logits {xs}: expected {n} labels, shaped {xs[:a]} or "
                             f"{xs[:a] + (1,)} (one class index per row of the 2-D view at axis {a})")
    if W is not None and numel(W.shape) != n:
        raise ShapeError(f"weights {tuple(W.shape)} must hold one weight per example: {n} values")
    return n, d


def _log_softmax(xp, x):
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))


def _check_probabilities(xp, t) -> None:
    if t.size and bool((t < 0).any()):
        raise ShapeError(f"label probabilities must be non-negative, found {float(t.min())}")
    sums = t.astype(np.float64).sum(axis=1)
    off = xp.abs(sums - 1) >= 1e-5
    if sums.size and bool(off.any()):
        i = int(xp.nonzero(off)[0][0])
        raise ShapeError(f"label probabilities of row {i} sum to {float(sums[i]):.7g}, not 1 (+/- 1e-5)")


def _swl_forward(xp, X, T, W, n, d, label_prob, scale):
    logp = _log_softmax(xp, X.reshape(n, d))
    if label_prob:
        t = T.reshape(n, d)
        _check_probabilities(xp, t)
        p = xp.exp(logp)
        rows = -(xp.log(xp.maximum(p, X.dtype.type(LOG_THRESHOLD))) * t).sum(axis=1)
    else:
        labels = T.reshape(-1)
        check_label_values(xp, labels, d)
        rows = -xp.take_along_axis(logp, labels.reshape(n, 1), axis=1).reshape(n)
        p = xp.exp(logp)
    w = xp.ones((n,), X.dtype) if W is None else W.reshape(n).astype(X.dtype)
    num, den = (rows * w).sum(keepdims=True), w.sum(keepdims=True)
    loss = xp.where(den != 0, num * X.dtype.type(scale) / xp.where(den != 0, den, 1), 0).astype(X.dtype)
    return p.reshape(X.shape), loss.reshape(())


def _spatial_forward(xp, X, T, W):
    """Softmax over channels at every position; the loss averages -log p[label] over positions whose label is
    not -1, weighted per position. No `scale` here: Caffe2's spatial forward never applied it."""
    p = xp.exp(X - X.max(axis=1, keepdims=True))
    p = p / p.sum(axis=1, keepdims=True)
    check_label_values(xp, T, X.shape[1], dont_care=True)
    valid = T != DONT_CARE
    picked = xp.take_along_axis(p, xp.expand_dims(xp.where(valid, T, 0), 1), axis=1)[:, 0]
    w = xp.ones(T.shape, X.dtype) if W is None else W.reshape(T.shape).astype(X.dtype)
    w = xp.where(valid, w, 0)
    num = (-xp.log(xp.maximum(picked, X.dtype.type(LOG_THRESHOLD))) * w).sum(keepdims=True).reshape(1)
    den = w.sum(keepdims=True).reshape(1)
    loss = xp.where(den != 0, num / xp.where(den != 0, den, 1), 0).astype(X.dtype)
    return p, loss.reshape(())


def _swl_shape(spatial_op=False):
    def shape(specs, label_prob=0, axis=1, scale=1.0, order="NCHW", spatial=0):
        X, T, spatial = specs[0], specs[1], spatial or spatial_op
        dims = _swl_check(X, T, specs[2] if len(specs) > 2 else None, label_prob, axis, scale, order, spatial)
        if T.value is not None and T.dtype == np.int32:
            check_label_values(np, T.value, dims[1], dont_care=bool(spatial))
        return [like(X), out_spec((), X.dtype)]
    return shape


def _swl_gradient_maker(type_):
    def maker(g):
        names = [g.I(0), g.I(1), g.O(0), g.GO(1)]
        if g.n_inputs == 3:
            names.insert(2, g.I(2))
        g.op(type_, names, [g.GI(0)])
    return maker


SWL_ARGS = {"label_prob": 0, "axis": 1, "scale": 1.0, "order": "NCHW", "spatial": 0}


@op("SoftmaxWithLoss", inputs=(2, 3), outputs=2, inplace=(), args=SWL_ARGS, shape=_swl_shape(),
    gradient=_swl_gradient_maker("SoftmaxWithLossGradient"))
def softmax_with_loss(xp, X, T, W=None, label_prob=0, axis=1, scale=1.0, order="NCHW", spatial=0):
    """Softmax of the logits' 2-D view at `axis` and the (weighted) average cross entropy against int32 class
    labels, or against class probabilities with label_prob=1: outputs P (logits' shape) and a 0-D loss,
    scale * sum_i w_i * loss_i / sum_i w_i (0 when the weights sum to 0). spatial=1 (older Caffe2) takes
    N x C x H x W logits and N x H x W labels, -1 meaning "don't care"."""
    dims = _swl_check(X, T, W, label_prob, axis, scale, order, spatial)
    if spatial:
        return _spatial_forward(xp, X, T, W)
    return _swl_forward(xp, X, T, W, *dims, label_prob, scale)


@op("SpatialSoftmaxWithLoss", inputs=(2, 3), outputs=2, inplace=(), args={"scale": 1.0, "order": "NCHW"},
    shape=_swl_shape(True), gradient=_swl_gradient_maker("SpatialSoftmaxWithLossGradient"))
def spatial_softmax_with_loss(xp, X, T, W=None, scale=1.0, order="NCHW"):
    """SoftmaxWithLoss's spatial form as its own op (later Caffe2): softmax over C at every position of
    N x C x H x W logits, labels N x H x W (-1 = don't care), optional per-position weights."""
    _swl_check(X, T, W, 0, 1, scale, order, 1, "SpatialSoftmaxWithLoss")
    return _spatial_forward(xp, X, T, W)


def _swl_backward(xp, X, T, rest, label_prob, axis, scale, order, spatial, op_type):
    W = rest[0] if len(rest) == 3 else None
    P, dloss = rest[-2], rest[-1]
    dims = _swl_check(X, T, W, label_prob, axis, scale, order, spatial, op_type)
    check_float(**{"P (the softmax output)": P})
    if P.size != X.size:
        raise ShapeError(f"P {tuple(P.shape)} must be the forward op's softmax output, shaped like the "
                         f"logits {tuple(X.shape)}")
    check_one_element(dloss, "the loss gradient")
    dt = X.dtype
    dl = dloss.reshape(1).astype(dt)
    if spatial:
        check_label_values(xp, T, dims[1], dont_care=True)
        valid = T != DONT_CARE
        dx = P.reshape(X.shape) - onehot(xp, xp.where(valid, T, 0), dims[1], dt)
        w = xp.ones(T.shape, dt) if W is None else W.reshape(T.shape).astype(dt)
        w = xp.where(valid, w, 0)
        dx = dx * xp.expand_dims(w, 1)
        total = w.sum(keepdims=True).reshape(1)
        dx = xp.where(total > 0, dx * (dt.type(scale) / xp.where(total > 0, total, 1)), dx)
        return dx * dl
    n, d = dims
    p = P.reshape(n, d)
    if label_prob:
        dx = p - T.reshape(n, d).astype(dt)
    else:
        labels = T.reshape(n)
        check_label_values(xp, labels, d)
        dx = p - onehot(xp, labels, d, dt)
    if W is None:
        if n:
            dx = dx * (dl * dt.type(scale / n))
    else:
        w = W.reshape(n, 1).astype(dt)
        dx = dx * w
        total = w.sum(keepdims=True).reshape(1)
        dx = xp.where(total > 0, dx * (dl * dt.type(scale) / xp.where(total > 0, total, 1)), dx)
    return dx.reshape(X.shape)


def _like_input(i=0):
    return lambda specs, **_: [like(specs[i])]


@op("SoftmaxWithLossGradient", inputs=(4, 5), outputs=1, inplace=(), args=SWL_ARGS, shape=_like_input(0))
def softmax_with_loss_gradient(xp, X, T, *rest, label_prob=0, axis=1, scale=1.0, order="NCHW", spatial=0):
    """(logits, labels, [weights,] P, dLoss) -> dlogits = scale * dLoss * w_i * (P - target) / sum(w); left
    unscaled (P - target, weighted) when the weights do not sum to a positive number, as in Caffe2."""
    return _swl_backward(xp, X, T, rest, label_prob, axis, scale, order, spatial, "SoftmaxWithLossGradient")


@op("SpatialSoftmaxWithLossGradient", inputs=(4, 5), outputs=1, inplace=(),
    args={"scale": 1.0, "order": "NCHW"}, shape=_like_input(0))
def spatial_softmax_with_loss_gradient(xp, X, T, *rest, scale=1.0, order="NCHW"):
    """(logits, labels, [weights,] P, dLoss) -> dlogits of the spatial form; zero at don't-care positions."""
    return _swl_backward(xp, X, T, rest, 0, 1, scale, order, 1, "SpatialSoftmaxWithLossGradient")
