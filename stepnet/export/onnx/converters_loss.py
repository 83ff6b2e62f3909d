"""Converters of the loss and metric families: cross entropies, averaged and row-wise losses, distances,
SoftmaxWithLoss and Accuracy, each written with the kernels' exact rules (log clamped at 1e-20, rows = dim 0,
Accuracy's tie order) out of plain ONNX ops.
"""
from __future__ import annotations

import math

import numpy as np

from ...ops.loss import LOG_THRESHOLD
from ...ops.math import canonical_axis
from .table import converts


def _rows(c, j: int) -> tuple[str, int, int]:
    """Input j as N x D rows (dim 0 and the rest; a 0-D input is one row of one)."""
    shape = c.shape(j)
    n = shape[0] if shape else 1
    d = math.prod(shape) // n if n else 0
    return c.e.reshape(c.x(j), [n, d]), n, d


def _neg_log(c, p: str) -> str:
    """-log(max(p, 1e-20))."""
    clamped = c.e.node("Max", [p, c.e.scalar(LOG_THRESHOLD, c.dtype(0))])
    return c.e.node("Neg", [c.e.node("Log", [clamped])])


def _picked(c, x2: str, labels: str, n: int) -> str:
    """x2[i, labels[i]] as an N vector."""
    index = c.e.reshape(c.e.cast(labels, np.int64), [n, 1])
    return c.e.reshape(c.e.node("GatherElements", [x2, index], axis=1), [n])


@converts("LabelCrossEntropy")
def label_cross_entropy(c):
    shape = c.shape(0)
    n, d = (shape[0], math.prod(shape[1:])) if len(shape) > 1 else (1, shape[0])
    x2 = c.e.reshape(c.x(0), [n, d])
    c.set(0, _neg_log(c, _picked(c, x2, c.x(1), n)))


@converts("CrossEntropy")
def cross_entropy(c):
    shape = c.shape(0)
    n, d = (shape[0], math.prod(shape[1:])) if len(shape) > 1 else (1, shape[0])
    x2, t = c.e.reshape(c.x(0), [n, d]), c.e.reshape(c.x(1), [n, d])
    if c.dtype(1) != c.dtype(0):
        t = c.e.cast(t, c.dtype(0))
    c.e.reduce("ReduceSum", c.e.node("Mul", [t, _neg_log(c, x2)]), [1], False, out=[c.out(0)])


@converts("AveragedLoss")
def averaged_loss(c):
    shape = c.shape(0)
    y = c.e.reduce("ReduceSum", c.x(0), list(range(len(shape))), False)
    if math.prod(shape):
        dt = c.dtype(0).type
        y = c.e.node("Mul", [y, c.e.scalar(dt(1) / dt(math.prod(shape)), c.dtype(0))])
    c.set(0, y)


@converts("SquaredL2Distance", "L1Distance", "DotProduct", "CosineSimilarity")
def row_distance(c):
    (x, _, _), (y, _, _) = _rows(c, 0), _rows(c, 1)
    t, dt = c.op.type, c.dtype(0)
    if t == "SquaredL2Distance":
        diff = c.e.node("Sub", [x, y])
        s = c.e.reduce("ReduceSumSquare", diff, [1], False)
        c.emit("Mul", [s, c.e.scalar(0.5, dt)], out=0)
    elif t == "L1Distance":
        c.e.reduce("ReduceL1", c.e.node("Sub", [x, y]), [1], False, out=[c.out(0)])
    elif t == "DotProduct":
        c.e.reduce("ReduceSum", c.e.node("Mul", [x, y]), [1], False, out=[c.out(0)])
    else:
        eps = c.e.scalar(1e-12, dt)
        norms = [c.e.node("Sqrt", [c.e.node("Max", [c.e.reduce("ReduceSumSquare", v, [1], False), eps])])
                 for v in (x, y)]
        xy = c.e.reduce("ReduceSum", c.e.node("Mul", [x, y]), [1], False)
        c.emit("Div", [xy, c.e.node("Mul", norms)], out=0)


@converts("SigmoidCrossEntropyWithLogits", "WeightedSigmoidCrossEntropyWithLogits")
def sigmoid_cross_entropy(c):
    """-mean over the last axis of t·l − softplus(l) (the log_D_trick and unjoined_lr_loss forms too)."""
    a, shape, dt = c.args, c.shape(0), c.dtype(0)
    lg, t = c.x(0), c.x(1) if c.dtype(1) == dt else c.e.cast(c.x(1), dt)
    sp = c.e.node("Softplus", [lg])
    tl = c.e.node("Mul", [t, lg])
    if a.get("unjoined_lr_loss"):
        term = c.e.node("Sub", [tl, c.e.node("Mul", [c.e.node("Sub", [c.e.scalar(1, dt), t]), sp])])
    elif a.get("log_D_trick"):
        two_t = c.e.node("Sub", [c.e.node("Mul", [t, c.e.scalar(2, dt)]), c.e.scalar(1, dt)])
        term = c.e.node("Mul", [two_t, c.e.node("Sub", [lg, sp])])
    else:
        term = c.e.node("Sub", [tl, sp])
    if c.op.type.startswith("Weighted"):
        term = c.e.node("Mul", [term, c.x(2) if c.dtype(2) == dt else c.e.cast(c.x(2), dt)])
    if not shape:
        c.emit("Neg", [term], out=0)
        return
    mean = c.e.reduce("ReduceMean", term, [len(shape) - 1], False)
    c.emit("Neg", [mean], out=0)


@converts("MakeTwoClass")
def make_two_class(c):
    x = c.e.unsqueeze(c.x(0), [len(c.shape(0))])
    c.emit("Concat", [c.e.node("Sub", [c.e.scalar(1, c.dtype(0)), x]), x], out=0, axis=-1)


def _weighted_mean(c, rows: str, w: str, dt, scale=None, out: int = 1) -> None:
    """Output `out` = sum(rows · w) (· scale) / sum(w), or 0 when the weights sum to 0."""
    num = c.e.reduce("ReduceSum", c.e.node("Mul", [rows, w]), [0], False)
    if scale is not None:
        num = c.e.node("Mul", [num, c.e.scalar(scale, dt)])
    den = c.e.reduce("ReduceSum", w, [0], False)
    zero = c.e.node("Equal", [den, c.e.scalar(0, dt)])
    safe = c.e.node("Where", [zero, c.e.scalar(1, dt), den])
    c.emit("Where", [zero, c.e.scalar(0, dt), c.e.node("Div", [num, safe])], out=out)


@converts("SpatialSoftmaxWithLoss")
def spatial_softmax_with_loss(c):
    """Softmax over channels at every position; -log p[label] averaged over positions whose label is not -1
    (weighted per position; no `scale` in the forward loss, as in Caffe2)."""
    n, ch, h, w = c.shape(0)
    dt = c.dtype(0)
    p = c.e.node("Softmax", [c.x(0)], axis=1)
    c.set(0, p)
    labels = c.e.reshape(c.x(1), [n * h * w])
    valid = c.e.node("Not", [c.e.node("Equal", [labels, c.e.scalar(-1, c.dtype(1))])])
    safe = c.e.node("Where", [valid, labels, c.e.scalar(0, c.dtype(1))])
    rows = c.e.reshape(c.e.transpose(p, [0, 2, 3, 1]), [n * h * w, ch])
    picked = _picked(c, rows, safe, n * h * w)
    weights = c.e.reshape(c.x(2), [n * h * w]) if len(c.inputs) > 2 else c.e.const(np.ones(n * h * w, dt))
    weights = c.e.node("Where", [valid, weights, c.e.scalar(0, dt)])
    _weighted_mean(c, _neg_log(c, picked), weights, dt)


@converts("SoftmaxWithLoss")
def softmax_with_loss(c):
    a, shape, dt = c.args, c.shape(0), c.dtype(0)
    if a["spatial"]:
        return spatial_softmax_with_loss(c)
    axis = canonical_axis(a["axis"], len(shape))
    n, d = math.prod(shape[:axis]), math.prod(shape[axis:])
    x2 = c.e.reshape(c.x(0), [n, d])
    logp = c.e.node("LogSoftmax", [x2], axis=1)
    p = c.e.node("Exp", [logp])
    if c.wants(0):
        c.e.reshape(p, shape, out=[c.out(0)])
    if a["label_prob"]:
        t = c.e.reshape(c.x(1), [n, d])
        rows = c.e.reduce("ReduceSum", c.e.node("Mul", [_neg_log(c, p), t]), [1], False)
    else:
        rows = c.e.node("Neg", [_picked(c, logp, c.e.reshape(c.x(1), [-1]), n)])
    w = c.e.reshape(c.x(2), [n]) if len(c.inputs) > 2 else c.e.const(np.ones(n, dt))
    _weighted_mean(c, rows, w, dt, a["scale"])


@converts("Accuracy")
def accuracy(c):
    """Rows whose label has fewer than top_k classes ahead of it (higher score, or equal and lower index)."""
    n, d = c.shape(0)
    x, label = c.x(0), c.e.reshape(c.x(1), [n, 1])
    score = c.e.node("GatherElements", [x, c.e.cast(label, np.int64)], axis=1)
    classes = c.e.const(np.arange(d, dtype=np.int32).reshape(1, d))
    tie = c.e.node("And", [c.e.node("Equal", [x, score]), c.e.node("Less", [classes, label])])
    ahead = c.e.cast(c.e.node("Or", [c.e.node("Greater", [x, score]), tie]), np.int64)
    count = c.e.reduce("ReduceSum", ahead, [1], False)
    hit = c.e.cast(c.e.node("Less", [count, c.e.scalar(c.args["top_k"], np.int64)]), np.float32)
    c.e.reduce("ReduceMean", hit, [0], False, out=[c.out(0)])
