"""Evaluation metrics: Accuracy (Caffe2's caffe2/operators/accuracy_op.cc).

Accuracy counts a row as correct when its label is among the top_k scores, ranking classes as a stable sort
by descending score would (on a tie the lower class index comes first), and outputs correct / N as a float32
0-D tensor. Like Caffe2 it takes float32 scores (N x D) and int32 labels (N,), and an empty batch gives NaN
(Caffe2 divides 0 by 0 too). A label outside [0, D) is an error here (Caffe2 reads out of bounds).
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import out_spec
from .loss import check_int32_labels, check_label_values
from .registry import SHOULD_NOT_DO_GRADIENT, op


def _check(X, label, top_k: int) -> tuple[int, int]:
    if top_k < 1:
        raise ArgumentError(f"top_k must be >= 1, got {top_k}")
    if X.dtype is not None and X.dtype != np.float32:
        raise DTypeError(f"predictions must be float32 scores, got {X.dtype}; Cast them (to=1, FLOAT) first")
    check_int32_labels(label, "labels")
    if len(X.shape) != 2:
        raise ShapeError(f"predictions must be 2-D (N x D scores), got shape {tuple(X.shape)}; Reshape or "
                         "FC(axis=...) them to N x D first")
    n, d = (int(x) for x in X.shape)
    if tuple(label.shape) != (n,):
        raise ShapeError(f"labels {tuple(label.shape)} must be 1-D with one label per row of predictions: "
                         f"shape ({n},)")
    return n, d


def _accuracy_shape(specs, top_k=1):
    _check(specs[0], specs[1], top_k)
    return [out_spec((), np.float32)]


@op("Accuracy", inputs=2, outputs=1, inplace=(), args={"top_k": 1}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_accuracy_shape)
def accuracy(xp, X, label, *, top_k):
    """The fraction of rows of X (N x D float32 scores) whose int32 label is among the top_k scores (ties:
    the lower class index ranks first), as a float32 0-D tensor."""
    n, d = _check(X, label, top_k)
    if n == 0:
        return xp.full((), np.nan, dtype=np.float32)
    check_label_values(xp, label, d)
    lab = label.reshape(n, 1)
    score = xp.take_along_axis(X, lab.astype(np.int64), axis=1)
    classes = xp.arange(d, dtype=np.int32).reshape(1, d)
    ahead = (X > score) | ((X == score) & (classes < lab))  # classes a stable descending sort puts first
    correct = (ahead.sum(axis=1) < top_k).sum(keepdims=True)  # 1-D: 0-D arithmetic would leave the device
    return (correct.astype(np.float32) / np.float32(n)).reshape(())
