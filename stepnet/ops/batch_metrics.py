"""Batch metrics beside Accuracy (metrics.py): Perplexity of a batch's target probabilities and
MultiClassAccuracy, the accuracy of each class.

Semantics from caffe2/operators/perplexity_op.cc and multi_class_accuracy_op.cc. Perplexity takes a float
vector of N probabilities and gives the float32 0-D prod(p_i ^ (-1/N)) (1 for an empty batch), computed in
double as Caffe2's pow is. MultiClassAccuracy takes float32 scores (N x D) and int32 labels (N,); a row's
prediction is its first highest score (a NaN never wins, as in Caffe2's `>` scan, and a row with no score
above float32's lowest predicts class 0); it gives float32 accuracies (D,), the fraction of each class's rows
predicted right (0 for a class without rows), and int32 amounts (D,), each class's row count. A label outside
[0, D) is an error (Caffe2 only DCHECKs it). Both are SHOULD_NOT_DO_GRADIENT in Caffe2.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .base import check_float, out_spec
from .loss import check_int32_labels, check_label_values
from .registry import SHOULD_NOT_DO_GRADIENT, op


# --------------------------------------------------------------------------------------------- Perplexity
def _check_probabilities(p) -> None:
    check_float("Perplexity", probabilities=p)
    if len(p.shape) != 1:
        raise ShapeError(f"Perplexity: probabilities must be a vector (one per sample), got shape "
                         f"{tuple(p.shape)}")


def _perplexity_shape(specs):
    _check_probabilities(specs[0])
    return [out_spec((), np.float32)]


@op("Perplexity", inputs=1, outputs=1, inplace=(), shape=_perplexity_shape, shapes_from_inputs=True,
    gradient=SHOULD_NOT_DO_GRADIENT)
def perplexity(xp, probabilities):
    """The perplexity of a batch, prod(p_i ^ (-1/N)) over its N target probabilities, as a float32 0-D
    tensor."""
    _check_probabilities(probabilities)
    n = probabilities.shape[0]
    if n == 0:
        return xp.ones((), dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        factors = xp.power(probabilities.astype(np.float64), -1.0 / n)
        return xp.prod(factors, keepdims=True).astype(np.float32).reshape(())   # (0-D arithmetic leaves the device)


# --------------------------------------------------------------------------------------------- per class
def _check_scores(X, labels) -> tuple[int, int]:
    if X.dtype is not None and X.dtype != np.float32:
        raise DTypeError(f"MultiClassAccuracy: prediction must be float32 scores, got {X.dtype}; Cast them first")
    check_int32_labels(labels, "MultiClassAccuracy: labels")
    if len(X.shape) != 2:
        raise ShapeError(f"MultiClassAccuracy: prediction must be 2-D (N x D scores), got shape {tuple(X.shape)}")
    n, d = (int(v) for v in X.shape)
    if tuple(labels.shape) != (n,):
        raise ShapeError(f"MultiClassAccuracy: labels {tuple(labels.shape)} must be a vector of one label per row "
                         f"of prediction, shape ({n},)")
    return n, d


def _per_class_shape(specs):
    _, d = _check_scores(*specs)
    return [out_spec((d,), np.float32), out_spec((d,), np.int32)]


@op("MultiClassAccuracy", inputs=2, outputs=2, inplace=(), shape=_per_class_shape, shapes_from_inputs=True,
    gradient=SHOULD_NOT_DO_GRADIENT)
def multi_class_accuracy(xp, X, labels):
    """prediction (N x D float32), labels (N int32) -> accuracies (D float32: per class, the fraction of its
    rows whose first highest score is that class) and amounts (D int32: the rows of each class)."""
    n, d = _check_scores(X, labels)
    if n == 0:
        return xp.zeros((d,), dtype=np.float32), xp.zeros((d,), dtype=np.int32)
    check_label_values(xp, labels, d)
    lowest = np.finfo(np.float32).min
    scores = xp.where(xp.isnan(X) | (X <= lowest), -np.inf, X.astype(np.float64))
    predicted = xp.argmax(scores, axis=1)
    lab = labels.astype(np.int64)
    amounts = xp.bincount(lab, minlength=d)
    hits = xp.bincount(lab, weights=(predicted == lab).astype(np.float64), minlength=d)
    accuracies = hits.astype(np.float32) / xp.maximum(amounts, 1).astype(np.float32)   # float32, as Caffe2 divides
    return accuracies, amounts.astype(np.int32)
