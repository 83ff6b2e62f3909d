"""Accuracy (stepnet/ops/metrics.py) against a sort-based reference, on every device, and its bad inputs."""
import math

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.io.proto import OperatorDef
from stepnet.testing import DEVICES, run_op

rng = np.random.default_rng(11)


def accuracy_ref(scores, labels, top_k=1):
    """Sort each row's classes by (descending score, ascending index) and look for the label in the first
    top_k: Caffe2's definition, written as a sort."""
    n = len(labels)
    if n == 0:
        return math.nan
    hits = 0
    for row, label in zip(scores.tolist(), labels.tolist(), strict=True):
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))
        hits += label in order[:top_k]
    return hits / n


def scores(n, d):
    return rng.standard_normal((n, d)).astype(np.float32)


def labels(n, d):
    return rng.integers(0, d, n).astype(np.int32)


TIES = np.array([[0.1, 0.5, 0.5, 0.2], [1.0, 1.0, 1.0, 1.0], [0.3, 0.3, 0.9, 0.3], [2.0, -1.0, 2.0, 2.0]],
                np.float32)
CASES = [
    (scores(8, 5), labels(8, 5), 1),
    (scores(8, 5), labels(8, 5), 2),
    (scores(8, 5), labels(8, 5), 5),
    (scores(8, 5), labels(8, 5), 9),   # top_k beyond D: every row counts
    (scores(1, 3), labels(1, 3), 1),
    (scores(64, 10), labels(64, 10), 3),
    (TIES, np.array([2, 0, 1, 3], np.int32), 1),   # the lower index wins a tie
    (TIES, np.array([2, 3, 3, 2], np.int32), 2),
    (TIES, np.array([1, 1, 1, 0], np.int32), 1),
    (np.zeros((0, 4), np.float32), np.zeros(0, np.int32), 1),  # an empty batch: 0 / 0, as Caffe2
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_accuracy(device, case):
    X, label, top_k = CASES[case]
    got = run_op("Accuracy", [X, label], device=device, top_k=top_k)
    assert got.shape == () and got.dtype == np.float32
    np.testing.assert_allclose(got, accuracy_ref(X, label, top_k), rtol=1e-6)


def test_default_top_k_is_one():
    X, label, _ = CASES[0]
    np.testing.assert_allclose(run_op("Accuracy", [X, label]), accuracy_ref(X, label, 1), rtol=1e-6)


def test_the_tester_an_argmax_accuracy_misses_ties(broken):
    """A kernel that breaks ties by the label (a common mistake) must fail the reference comparison."""
    def generous(xp, X, label, *, top_k):
        best = X.max(axis=1)
        picked = xp.take_along_axis(X, label.reshape(-1, 1).astype(np.int64), axis=1).reshape(-1)
        return (picked >= best).mean(keepdims=True).astype(np.float32).reshape(())

    broken("Accuracy", generous)
    X, label, top_k = CASES[8]
    got = run_op("Accuracy", [X, label], top_k=top_k)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got, accuracy_ref(X, label, top_k), rtol=1e-6)


@pytest.mark.parametrize("X, label, args, error, words", [
    (scores(4, 3).astype(np.float64), labels(4, 3), {}, DTypeError, "float32 scores, got float64"),
    (scores(4, 3), labels(4, 3).astype(np.int64), {}, DTypeError, "int32 class indices, got int64"),
    (scores(4, 3).reshape(-1), labels(12, 3), {}, ShapeError, r"2-D \(N x D scores\), got shape \(12,\)"),
    (scores(4, 3), labels(3, 3), {}, ShapeError, r"labels \(3,\) must be 1-D .* shape \(4,\)"),
    (scores(4, 3), labels(4, 3).reshape(4, 1), {}, ShapeError, r"labels \(4, 1\)"),
    (scores(4, 3), np.array([0, 1, 3, 0], np.int32), {}, ShapeError, "label 3 at position 2 is out of range"),
    (scores(4, 3), np.array([0, -1, 1, 0], np.int32), {}, ShapeError, "label -1 at position 1"),
    (scores(4, 3), labels(4, 3), {"top_k": 0}, ArgumentError, "top_k must be >= 1, got 0"),
])
@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(X, label, args, error, words, device):
    with pytest.raises(error, match=words):
        run_op("Accuracy", [X, label], device=device, **args)


def test_accuracy_has_no_gradient():
    op = OperatorDef(type="Accuracy", input=["p", "l"], output=["acc"])
    with pytest.raises(GradientError, match="not differentiable"):
        backward_ops([op], ["acc"])
