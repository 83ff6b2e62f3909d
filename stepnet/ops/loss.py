"""Class-probability losses: LabelCrossEntropy, CrossEntropy and AveragedLoss, each with Caffe2's gradient op,
and the label checks the loss families share. SoftmaxWithLoss (and its spatial form) is in softmax_loss.py;
row-wise losses of two same-shaped tensors (sigmoid cross entropies, distances, similarities) and MakeTwoClass
are in rowwise_loss.py.

Caffe2 quirk kept on purpose: probabilities are clamped at 1e-20 before a log and the gradient divides by the
clamped value. Labels must be int32.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .base import check_float, like, out_spec
from .registry import op

LOG_THRESHOLD = 1e-20
DONT_CARE = -1


# --------------------------------------------------------------------------------------------- checks
def check_int32_labels(t, what: str = "labels", hint: str = "") -> None:
    if t.dtype is not None and t.dtype != np.int32:
        raise DTypeError(f"{what} must be int32 class indices, got {t.dtype}; Cast them to int32 first "
                         f"(Cast with to=2, INT32){hint}")


def check_label_values(xp, labels, n_classes: int, dont_care: bool = False) -> None:
    """ShapeError naming the first label outside [0, n_classes) (-1 is allowed when dont_care)."""
    flat = labels.reshape(-1)
    if not flat.size:
        return
    if not dont_care and flat.dtype.kind == "i" and int(flat.view(f"u{flat.dtype.itemsize}").max()) < n_classes:
        return     # (one pass: seen unsigned, a negative label is above every class count)
    bad = (flat < 0) | (flat >= n_classes)
    if dont_care:
        bad = bad & (flat != DONT_CARE)
    if bool(bad.any()):
        i = int(xp.nonzero(bad)[0][0])
        also = f" or {DONT_CARE} (don't care)" if dont_care else ""
        raise ShapeError(f"label {int(flat[i])} at position {i} is out of range: labels must be in "
                         f"[0, {n_classes}){also} for {n_classes} classes")


def numel(dims) -> int:
    """The number of elements of a shape."""
    return math.prod(int(d) for d in dims)


def check_one_element(d, what: str) -> None:
    """A loss gradient holds one value (any shape of one element)."""
    if numel(d.shape) != 1:
        raise ShapeError(f"{what} must hold one value (the loss gradient), got shape {tuple(d.shape)}")


def onehot(xp, labels, d: int, dtype):
    """N x D (or N x D x H x W for labels N x H x W) indicator of the labels (all zero at don't-care)."""
    classes = xp.arange(d).reshape((1, d) + (1,) * (labels.ndim - 1))
    return (classes == xp.expand_dims(labels, 1)).astype(dtype)


# --------------------------------------------------------------------------------------------- cross entropy
def _xent_dims(X, label, soft: bool):
    """N, D of X (a 1-D X is one row) after checking the label's dtype and shape."""
    check_float(X=X)
    xs, ls = tuple(X.shape), tuple(label.shape)
    if not xs:
        raise ShapeError("X must be at least 1-D (N x D probabilities), got a 0-D tensor")
    n, d = (xs[0], numel(xs[1:])) if len(xs) > 1 else (1, xs[0])
    if soft:
        check_float(label=label)
        ok = ls == (n, d) or (ls == (n,) and d == 1)
        want = f"({n}, {d})"
    else:
        check_int32_labels(label, "label")
        ok = ls in ((n,), (n, 1))
        want = f"({n},) or ({n}, 1)"
    if not ok:
        raise ShapeError(f"label {ls} does not fit X {xs}: expected shape {want}")
    return n, d


def _dy_check(dY, n):
    check_float(dY=dY)
    if tuple(dY.shape) != (n,):
        raise ShapeError(f"dY {tuple(dY.shape)} must have one gradient per example: shape ({n},)")


def _xent_shape(soft):
    def shape(specs):
        n, d = _xent_dims(specs[0], specs[1], soft)
        if not soft and specs[1].value is not None:
            check_label_values(np, specs[1].value, d)
        return [out_spec((n,), specs[0].dtype)]
    return shape


def _xent_grad_shape(soft):
    def shape(specs):
        n, _ = _xent_dims(specs[0], specs[1], soft)
        _dy_check(specs[2], n)
        return [like(specs[0])]
    return shape


def _label_xent_gradient(g):
    g.op("LabelCrossEntropyGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@op("LabelCrossEntropy", inputs=2, outputs=1, inplace=(), shape=_xent_shape(False),
    gradient=_label_xent_gradient, shapes_from_inputs=True)
def label_cross_entropy(xp, X, label):
    """Y[i] = -log(max(X[i, label[i]], 1e-20)) for probabilities X (N x D, or 1-D for one row) and int32
    labels of shape (N,) or (N, 1)."""
    n, d = _xent_dims(X, label, False)
    labels = label.reshape(n)
    check_label_values(xp, labels, d)
    return xent_values(xp, X.reshape(n, d)[xp.arange(n), labels])


def xent_values(xp, picked, out=None):
    """-log(max(p, 1e-20)) of the probabilities picked by the labels (into `out` when given): the arithmetic of
    LabelCrossEntropy, its compiled form's too."""
    t = xp.maximum(picked, picked.dtype.type(LOG_THRESHOLD), out=out)
    xp.log(t, out=t)
    return xp.negative(t, out=t)


def xent_gradient_values(xp, dY, picked):
    """-dY / max(p, 1e-20) at the labels' entries: LabelCrossEntropyGradient's arithmetic, its compiled
    form's too."""
    return -dY.reshape(picked.shape).astype(picked.dtype) / xp.maximum(picked, picked.dtype.type(LOG_THRESHOLD))


@op("LabelCrossEntropyGradient", inputs=3, outputs=1, inplace=(), shape=_xent_grad_shape(False),
    shapes_from_inputs=True)
def label_cross_entropy_gradient(xp, X, label, dY):
    """dX is zero except dX[i, label[i]] = -dY[i] / max(X[i, label[i]], 1e-20): Caffe2's kernel writes only the
    label entries, so X elsewhere (even NaN) never reaches dX."""
    n, d = _xent_dims(X, label, False)
    _dy_check(dY, n)
    labels = label.reshape(n)
    check_label_values(xp, labels, d)
    rows = xp.arange(n)
    dX = xp.zeros((n, d), X.dtype)
    dX[rows, labels] = xent_gradient_values(xp, dY, X.reshape(n, d)[rows, labels])
    return dX.reshape(X.shape)


def _divided(xp, numerator, dY, x, n):
    """numerator * dY[row] / max(x, 1e-20): the cross entropies' gradient, with Caffe2's clamp."""
    return numerator * dY.reshape(n, 1).astype(x.dtype) / xp.maximum(x, x.dtype.type(LOG_THRESHOLD))


def _check_soft_labels(xp, t) -> None:
    if t.size and bool(((t < 0) | (t > 1)).any()):
        raise ShapeError("soft labels must be probabilities in [0, 1]; for int32 class indices use "
                         "LabelCrossEntropy")


def _cross_entropy_gradient(g):
    g.op("CrossEntropyGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)])


@op("CrossEntropy", inputs=2, outputs=1, inplace=(), shape=_xent_shape(True),
    gradient=_cross_entropy_gradient)
def cross_entropy(xp, X, label):
    """Y[i] = -sum_j label[i, j] * log(max(X[i, j], 1e-20)) for probabilities X and soft labels of X's 2-D
    shape (N x D)."""
    n, d = _xent_dims(X, label, True)
    t = label.reshape(n, d).astype(X.dtype)
    _check_soft_labels(xp, t)
    return -(t * xp.log(xp.maximum(X.reshape(n, d), X.dtype.type(LOG_THRESHOLD)))).sum(axis=1)


@op("CrossEntropyGradient", inputs=3, outputs=1, inplace=(), shape=_xent_grad_shape(True))
def cross_entropy_gradient(xp, X, label, dY):
    """dX[i, j] = -dY[i] * label[i, j] / max(X[i, j], 1e-20)."""
    n, d = _xent_dims(X, label, True)
    _dy_check(dY, n)
    x, t = X.reshape(n, d), label.reshape(n, d).astype(X.dtype)
    return _divided(xp, -t, dY, x, n).reshape(X.shape)


# --------------------------------------------------------------------------------------------- AveragedLoss
def _averaged_loss_gradient(g):
    g.op("AveragedLossGradient", [g.I(0), g.GO(0)], [g.GI(0)])


def _averaged_shape(specs):
    check_float(X=specs[0])
    return [out_spec((), specs[0].dtype)]


@op("AveragedLoss", inputs=1, outputs=1, inplace=(), shape=_averaged_shape, gradient=_averaged_loss_gradient,
    shapes_from_inputs=True)
def averaged_loss(xp, X):
    """The mean of all elements as a 0-D tensor (0 for an empty X, as stepnet's SumElements average=1 gives;
    Caffe2 divided by zero there)."""
    check_float(X=X)
    return mean_into(xp, X, None).reshape(())


def mean_into(xp, X, out):
    """The mean of X's elements as a 1-element array (into `out` when given; 0 for an empty X): AveragedLoss's
    arithmetic, its compiled form's too."""
    total = xp.sum(X.reshape(-1), dtype=X.dtype, keepdims=True, out=out)
    if X.size:
        xp.multiply(total, X.dtype.type(1) / X.dtype.type(X.size), out=total)
    return total


def _averaged_grad_shape(specs):
    check_float(X=specs[0])
    check_one_element(specs[1], "dLoss")
    return [like(specs[0])]


@op("AveragedLossGradient", inputs=2, outputs=1, inplace=(), shape=_averaged_grad_shape, shapes_from_inputs=True)
def averaged_loss_gradient(xp, X, dLoss):
    """(X, dLoss) -> dX with every element dLoss / numel(X)."""
    check_float(X=X)
    check_one_element(dLoss, "dLoss")
    return xp.broadcast_to(mean_gradient(X, dLoss).reshape((1,) * X.ndim), X.shape).copy()


def mean_gradient(X, dLoss):
    """dLoss / numel(X) as a 1-element array of X's dtype: every element of AveragedLossGradient's dX (its
    compiled form's too)."""
    return dLoss.reshape(1).astype(X.dtype) * (X.dtype.type(1) / X.dtype.type(max(X.size, 1)))
