"""PairWiseLoss and LambdaRankNdcg (stepnet/ops/rank_loss.py) against pair loops written here from Caffe2's
docs (Python's math module) on every device; PairWiseLoss's gradient against float64 finite differences;
LambdaRankNdcg's dY against half the finite-difference derivative of its loss (LambdaRank's lambdas); bad
inputs; broken kernels caught."""
import math

import numpy as np
import pytest

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.testing import DEVICES, check_gradient, infer_static, run_op

rng = np.random.default_rng(29)
EPS32 = float(np.finfo(np.float32).eps)


def pairwise_ref(x, label, lengths=None):
    x, label = x.ravel().tolist(), label.ravel().tolist()
    lengths = [len(x)] if lengths is None else lengths.tolist()
    out, start = [], 0
    for size in lengths:
        total, pairs = 0.0, 0
        for i in range(start, start + size):
            for j in range(start, i):
                if abs(label[i] - label[j]) < EPS32:
                    continue
                pairs += 1
                s = 1 if label[i] > label[j] else -1
                total += math.log1p(math.exp(s * (x[j] - x[i])))
        out.append(total / pairs if pairs else total)
        start += size
    return np.array(out)


def ndcg_ref(y, r):
    """Loss and lambdas from the definitions (discounts 1 / log2(rank + 2), gains 2^r)."""
    n = len(y)

    def discounts(v):
        d = [0.0] * n
        for rank, i in enumerate(sorted(range(n), key=lambda k: -v[k])):
            d[i] = 1 / math.log2(rank + 2)
        return d
    gain = [2.0 ** v for v in r]
    idcg = sum(g * d for g, d in zip(gain, discounts(r), strict=True))
    idcg = 1.0 if idcg < 1e-5 else idcg
    d = discounts(y)
    loss, dy = 0.0, [0.0] * n
    for i in range(n):
        for j in range(n):
            w = abs((d[i] - d[j]) * (gain[i] - gain[j]))
            s = 1 if r[i] > r[j] else -1
            loss += w * math.log1p(math.exp(-s * (y[i] - y[j]))) / idcg
            dy[i] -= w * s / (1 + math.exp(s * (y[i] - y[j]))) / idcg
    return loss, np.array(dy)


CASES = [
    (rng.standard_normal((6, 1)), np.array([0, 1, 1, 2, 0, 3], np.float32).reshape(6, 1), None),
    (rng.standard_normal(7), rng.integers(0, 3, 7).astype(np.float64), np.array([3, 0, 4], np.int32)),
    (rng.standard_normal(4), np.ones(4), None),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_pair_wise_loss(case, device):
    x, label, lengths = CASES[case]
    inputs = [x, label.astype(x.dtype)] + ([] if lengths is None else [lengths])
    got = run_op("PairWiseLoss", inputs, device=device)
    np.testing.assert_allclose(got, pairwise_ref(x, label, lengths), rtol=1e-12)
    check_gradient("PairWiseLoss", inputs, wrt=[0], device=device)


def test_pair_wise_loss_large_gaps_and_empty():
    x, label = np.array([60.0, -60.0, 0.0]), np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(run_op("PairWiseLoss", [x, label]), pairwise_ref(x, label), rtol=1e-9)
    assert run_op("PairWiseLoss", [np.zeros((0, 1)), np.zeros(0)]).shape == (0,)
    assert infer_static("PairWiseLoss", [x, label, np.array([1, 2], np.int32)])[0].shape == (2,)


def test_pair_wise_loss_bad_inputs():
    x, label = np.ones(4), np.ones(4)
    with pytest.raises(ShapeError, match="sum to the 4 rows"):
        run_op("PairWiseLoss", [x, label, np.array([1, 2], np.int32)])
    with pytest.raises(DTypeError, match="lengths must be int32"):
        run_op("PairWiseLoss", [x, label, np.array([4], np.int64)])
    with pytest.raises(ShapeError, match="one score per row"):
        run_op("PairWiseLoss", [np.ones((4, 2)), label])
    with pytest.raises(ShapeError, match="one per row of X"):
        run_op("PairWiseLoss", [x, np.ones(3)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_lambda_rank_ndcg(n, device):
    y = rng.random(n).astype(np.float32)
    r = rng.integers(0, 4, n).astype(np.float32)
    loss, dy = run_op("LambdaRankNdcg", [y, r], 2, device=device)
    want_loss, want_dy = ndcg_ref(y.tolist(), r.tolist())
    assert loss.shape == (1,) and dy.shape == (n,)
    np.testing.assert_allclose(loss[0], want_loss, rtol=1e-5)
    np.testing.assert_allclose(dy, want_dy, rtol=1e-5, atol=1e-6)
    dloss = np.array([0.7], np.float32)
    np.testing.assert_allclose(run_op("LambdaRankNdcgGradient", [y, dy, dloss], device=device), 0.7 * dy, rtol=1e-6)


def test_lambda_rank_dy_is_half_the_loss_derivative():
    y, r = rng.standard_normal(6), np.array([0.0, 2, 1, 3, 0, 1])
    _, dy = run_op("LambdaRankNdcg", [y, r], 2)
    eps = 1e-6
    for i in range(6):
        up, down = y.copy(), y.copy()
        up[i] += eps
        down[i] -= eps
        loss_up, loss_down = run_op("LambdaRankNdcg", [up, r], 2)[0][0], run_op("LambdaRankNdcg", [down, r], 2)[0][0]
        numeric = (loss_up - loss_down) / (2 * eps)
        assert abs(dy[i] - numeric / 2) < 1e-6


def test_lambda_rank_bad_inputs():
    with pytest.raises(ShapeError, match="y must be 1-D"):
        run_op("LambdaRankNdcg", [np.ones((2, 2)), np.ones(4)], 2)
    with pytest.raises(ShapeError, match="dLoss must hold one value"):
        run_op("LambdaRankNdcgGradient", [np.ones(3), np.ones(3), np.ones(2)])


def test_broken_kernels_are_caught(broken):
    x, label, lengths = CASES[1]
    broken("PairWiseLossGradient", lambda xp, X, l, dY, L=None: X * 0)
    with pytest.raises(AssertionError, match="PairWiseLoss: gradient of input 0"):
        check_gradient("PairWiseLoss", [x, label, lengths], wrt=[0])
    broken("LambdaRankNdcg", lambda xp, y, r: (y[:1] * 0, y * 0))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(run_op("LambdaRankNdcg", [x, label], 2)[1], ndcg_ref(x.tolist(), label.tolist())[1])
