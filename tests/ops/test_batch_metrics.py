"""Perplexity and MultiClassAccuracy (stepnet/ops/batch_metrics.py) against references written from Caffe2's
docs (Python's math, loops) on every device; ties, NaN and empty batches as Caffe2's loops treat them; bad
inputs; broken kernels caught."""
import math

import numpy as np
import pytest

from stepnet.core.errors import DTypeError, GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op

rng = np.random.default_rng(9)


def perplexity_ref(p):
    return math.prod(float(v) ** (-1.0 / len(p)) for v in p)


def per_class_ref(x, labels):
    n, d = x.shape
    hits, amounts = [0] * d, [0] * d
    for i in range(n):
        best, best_j = -np.inf, 0
        for j in range(d):
            if x[i, j] > best and x[i, j] > np.finfo(np.float32).min:   # Caffe2's `>` scan from float's lowest
                best, best_j = x[i, j], j
        hits[labels[i]] += best_j == labels[i]
        amounts[labels[i]] += 1
    return np.array([h / a if a else 0.0 for h, a in zip(hits, amounts)]), np.array(amounts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 10, 0])
def test_perplexity(n, device):
    p = rng.uniform(0.01, 1.0, n).astype(np.float32)
    got = run_op("Perplexity", [p], device=device)
    assert got.shape == () and got.dtype == np.float32
    np.testing.assert_allclose(got, perplexity_ref(p) if n else 1.0, rtol=1e-6)


def test_perplexity_by_hand():
    np.testing.assert_allclose(run_op("Perplexity", [np.array([0.5, 0.125], np.float32)]), 4.0, rtol=1e-7)
    np.testing.assert_allclose(run_op("Perplexity", [np.full(4, 0.25, np.float64)]), 4.0, rtol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_multi_class_accuracy(device):
    x = rng.random((12, 4)).astype(np.float32)
    x[3] = [0.5, 0.9, 0.9, 0.1]                               # a tie: the first highest wins
    x[5] = [np.nan, 0.2, 0.7, np.nan]                         # NaN never wins
    x[7] = [np.nan] * 4                                       # nothing wins: class 0
    labels = rng.integers(0, 3, 12).astype(np.int32)          # class 3 has no rows
    labels[[3, 5, 7]] = [1, 2, 0]
    acc, amounts = run_op("MultiClassAccuracy", [x, labels], 2, device=device)
    assert acc.dtype == np.float32 and amounts.dtype == np.int32 and acc.shape == amounts.shape == (4,)
    want_acc, want_amounts = per_class_ref(x, labels)
    np.testing.assert_allclose(acc, want_acc, rtol=1e-6)
    np.testing.assert_array_equal(amounts, want_amounts)


def test_multi_class_accuracy_by_hand_and_empty():
    x = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], np.float32)
    acc, amounts = run_op("MultiClassAccuracy", [x, np.array([1, 1, 1], np.int32)], 2)
    assert acc.tolist() == pytest.approx([0.0, 2 / 3]) and amounts.tolist() == [0, 3]
    acc, amounts = run_op("MultiClassAccuracy", [np.zeros((0, 3), np.float32), np.zeros(0, np.int32)], 2)
    assert acc.tolist() == [0.0] * 3 and amounts.tolist() == [0] * 3


def test_inference_bad_inputs_and_no_gradients():
    assert [s.shape for s in infer_static("MultiClassAccuracy", [np.ones((4, 5), np.float32),
                                                                 np.ones(4, np.int32)], 2)] == [(5,), (5,)]
    assert infer_static("Perplexity", [np.ones(3, np.float32)])[0].shape == ()
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="label 3 at position 1 is out of range"):
        run_op("MultiClassAccuracy", [x, np.array([0, 3], np.int32)], 2)
    with pytest.raises(ShapeError, match=r"one label per row of prediction, shape \(2,\)"):
        run_op("MultiClassAccuracy", [x, np.array([0], np.int32)], 2)
    with pytest.raises(DTypeError, match="int32"):
        run_op("MultiClassAccuracy", [x, np.array([0, 1], np.int64)], 2)
    with pytest.raises(DTypeError, match="float32"):
        run_op("MultiClassAccuracy", [x.astype(np.float64), np.array([0, 1], np.int32)], 2)
    with pytest.raises(ShapeError, match="vector"):
        run_op("Perplexity", [x])
    with pytest.raises(DTypeError, match="float"):
        run_op("Perplexity", [np.ones(2, np.int32)])
    for op_type, ins, outs in (("Perplexity", ["p"], ["y"]), ("MultiClassAccuracy", ["x", "l"], ["a", "n"])):
        with pytest.raises(GradientError):
            backward_ops([make_op(op_type, ins, outs)], {outs[0]: "g"})


def test_checkers_catch_broken_kernels(broken):
    broken("Perplexity", lambda xp, p: xp.asarray(np.float32(np.exp(-np.log(p).sum()))))   # forgot the 1/N
    with pytest.raises(AssertionError):
        test_perplexity(10, "cpu")
    broken("MultiClassAccuracy", lambda xp, x, l: (np.zeros(x.shape[1], np.float32),
                                                   np.bincount(l, minlength=x.shape[1]).astype(np.int32)))
    with pytest.raises(AssertionError):
        test_multi_class_accuracy("cpu")
