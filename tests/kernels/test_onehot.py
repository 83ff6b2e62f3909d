"""FC, FCTransposed and their gradients on one-hot rows (stepnet/kernels/onehot.py): the gather gives the GEMM's
values bit for bit, the scatter-add weight gradient (numba's, Workspace.fused_cells) agrees with a float64
reference; what is not one-hot, or not finite, takes the GEMM, NaNs included; a broken gather is caught."""
import importlib.util

import numpy as np
import pytest

from stepnet.kernels import onehot as fc_onehot
from stepnet.kernels.onehot import one_hot_columns
from stepnet.testing import run_op
from stepnet.runtime.workspace import Workspace

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # 0·inf in GEMMs
F = np.float32
needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="numba (the fast extra, in the test extra) is not installed")


def one_hot(rng, m, k, dtype=F):
    idx = rng.integers(0, k, m)
    return np.eye(k, dtype=dtype)[idx], idx


def dense(X, W, b, transposed=False):
    """The GEMM the FC kernel runs on dense rows, in numpy (X·Wᵀ + b, or X·W + b)."""
    return np.matmul(X, W if transposed else W.T) + b


@pytest.mark.parametrize("m, k", [(64, 2), (200, 65), (1000, 7)])
def test_one_hot_rows_found(m, k):
    X, idx = one_hot(np.random.default_rng(m), m, k)
    np.testing.assert_array_equal(one_hot_columns(X), idx)


def _spoiled(kind):
    X, _ = one_hot(np.random.default_rng(1), 100, 9)
    row = 0 if kind.startswith("first") else 57
    if kind.endswith("two"):
        X[row, (X[row].argmax() + 1) % 9] = 1
    elif kind.endswith("scaled"):
        X[row] *= 2
    elif kind.endswith("zero"):
        X[row] = 0
    elif kind.endswith("nan"):
        X[row, 3] = np.nan
    elif kind.endswith("negative"):
        X[row, (X[row].argmax() + 1) % 9] = -1e-30
    elif kind.endswith("minus-zero"):                  # one-hot in value; left to the GEMM, which adds -0.0
        X[row, (X[row].argmax() + 1) % 9] = -0.0
    return X


@pytest.mark.parametrize("kind", ["first-two", "first-scaled", "first-zero", "first-nan", "later-two",
                                  "later-scaled", "later-zero", "later-nan", "later-negative",
                                  "later-minus-zero"])
def test_rows_that_are_not_one_hot_are_refused(kind):
    assert one_hot_columns(_spoiled(kind)) is None


def test_small_batches_and_other_arrays_are_left_to_the_gemm():
    X, _ = one_hot(np.random.default_rng(2), fc_onehot.ONE_HOT_ROWS - 1, 5)
    assert one_hot_columns(X) is None
    assert one_hot_columns(X.tolist()) is None
    wide, _ = one_hot(np.random.default_rng(2), 100, 5)
    assert one_hot_columns(np.repeat(wide, 2, axis=1)[:, ::2]) is None         # not C-contiguous
    assert one_hot_columns(wide.astype(np.float16)) is not None


@pytest.mark.parametrize("op_type", ["FC", "FCTransposed"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_gives_the_gemm_bits_and_the_reference(op_type, dtype):
    rng = np.random.default_rng(3)
    X, idx = one_hot(rng, 300, 65, dtype)
    X = X.reshape(20, 15, 65)                         # axis=2, as char-rnn's i2h FC
    W = rng.standard_normal((65, 48) if op_type == "FCTransposed" else (48, 65)).astype(dtype)
    b = rng.standard_normal(48).astype(dtype)
    Y = run_op(op_type, [X, W, b], axis=2)
    want = dense(X.reshape(300, 65), W, b, op_type == "FCTransposed")
    np.testing.assert_array_equal(Y.reshape(300, 48), want)           # the GEMM's values, bit for bit
    rows = W.T if op_type == "FC" else W
    ref = np.array([rows[i].astype(np.float64) + b for i in idx])     # row idx of Wᵀ plus the bias
    np.testing.assert_allclose(Y.reshape(300, 48), ref, rtol=1e-6)


def test_a_vocabulary_wider_than_the_batch_takes_the_gemm(monkeypatch):
    """K > M: the K×N table of the gather would outgrow the result, so the GEMM runs (same values anyway)."""
    rng = np.random.default_rng(9)
    X, _ = one_hot(rng, 70, 300)
    W, b = rng.standard_normal((8, 300)).astype(F), rng.standard_normal(8).astype(F)
    calls = []
    monkeypatch.setattr(fc_onehot, "one_hot_columns", lambda X2: calls.append(X2.shape))
    np.testing.assert_array_equal(run_op("FC", [X, W, b]), dense(X, W, b))
    assert calls == []


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_weight_spreads_as_in_the_gemm(bad):
    rng = np.random.default_rng(4)
    X = np.eye(10, dtype=F)[rng.integers(0, 9, 100)]                  # column 9 picked by no row
    W, b = rng.standard_normal((6, 10)).astype(F), rng.standard_normal(6).astype(F)
    W[2, 9] = bad
    Y = run_op("FC", [X, W, b])
    want = dense(X, W, b)
    assert np.isnan(want[:, 2]).all()                                  # 0·inf (or NaN) in every row's sum
    np.testing.assert_array_equal(Y, want)


def test_a_broken_gather_is_caught(monkeypatch):
    rng = np.random.default_rng(5)
    X, _ = one_hot(rng, 100, 12)
    W, b = rng.standard_normal((8, 12)).astype(F), rng.standard_normal(8).astype(F)
    real = fc_onehot.one_hot_columns
    monkeypatch.setattr(fc_onehot, "one_hot_columns", lambda X2: (lambda i: None if i is None else (i + 1) % 12)(
        real(X2)))
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(run_op("FC", [X, W, b]), dense(X, W, b))


def _grad_reference(X, dY, transposed):
    """dW per its definition, in float64: row sums of dY per column of X (K×N), or its transpose (N×K)."""
    k = X.shape[1]
    dWt = np.zeros((k, dY.shape[1]))
    for r in range(X.shape[0]):
        for c in range(k):
            if X[r, c]:
                dWt[c] += X[r, c] * dY[r].astype(np.float64)
    return dWt if transposed else dWt.T


@pytest.mark.parametrize("fused", [pytest.param(True, marks=needs_numba), False])
@pytest.mark.parametrize("op_type", ["FCGradient", "FCTransposedGradient"])
def test_gradient_against_the_reference(fused, op_type):
    rng = np.random.default_rng(6)
    transposed = op_type == "FCTransposedGradient"
    X, _ = one_hot(rng, 400, 65)
    W = rng.standard_normal((65, 96) if transposed else (96, 65)).astype(F)
    dY = rng.standard_normal((400, 96)).astype(F)
    dW, db, dX = run_op(op_type, [X, W, dY], 3, ws=Workspace(fused_cells=fused))
    np.testing.assert_allclose(dW, _grad_reference(X, dY, transposed), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(db, dY.astype(np.float64).sum(axis=0), rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(dX, np.matmul(dY, W.T if transposed else W))


@needs_numba
@pytest.mark.parametrize("n", [1, 31, 100, 512])
def test_the_weight_layout_holds_the_same_sums(n):
    """FCGradient's dW (N × K, written through add_rows' tiled transpose, tiles of 32 columns with a partial
    last one) is, bit for bit, the transpose of FCTransposedGradient's (K × N, the sums as accumulated)."""
    rng = np.random.default_rng(n)
    X, _ = one_hot(rng, 200, 65)
    dY = rng.standard_normal((200, n)).astype(F)
    ws = Workspace(fused_cells=True)
    dW = run_op("FCGradient", [X, rng.standard_normal((n, 65)).astype(F), dY], 3, ws=ws)[0]
    dWt = run_op("FCTransposedGradient", [X, rng.standard_normal((65, n)).astype(F), dY], 3, ws=ws)[0]
    assert dW.shape == (n, 65) and dW.flags.c_contiguous
    np.testing.assert_array_equal(dW, dWt.T)
    np.testing.assert_allclose(dW, _grad_reference(X, dY, False), rtol=2e-5, atol=2e-5)


@needs_numba
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_non_finite_gradient_spreads_as_in_the_gemm(bad):
    rng = np.random.default_rng(7)
    X, _ = one_hot(rng, 100, 10)
    W, dY = rng.standard_normal((6, 10)).astype(F), rng.standard_normal((100, 6)).astype(F)
    dY[5, 3] = bad
    dW = run_op("FCGradient", [X, W, dY], 3, ws=Workspace(fused_cells=True))[0]
    want = np.matmul(dY.T, X)
    assert np.isnan(want[3]).sum() >= 9                                # 0·inf (or NaN) in all other columns
    np.testing.assert_array_equal(np.isnan(dW), np.isnan(want))


@needs_numba
def test_a_broken_scatter_is_caught(monkeypatch):
    from stepnet.kernels import jit as fused

    rng = np.random.default_rng(8)
    X, _ = one_hot(rng, 100, 10)
    W, dY = rng.standard_normal((6, 10)).astype(F), rng.standard_normal((100, 6)).astype(F)
    real = fused.load()
    broken = type("Broken", (), {"add_rows": staticmethod(
        lambda g, idx, k, transpose: real.add_rows(g[::-1].copy(), idx, k, transpose))})
    monkeypatch.setattr(fused, "load", lambda: broken)
    dW = run_op("FCGradient", [X, W, dY], 3, ws=Workspace(fused_cells=True))[0]
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(dW, _grad_reference(X, dY, False), rtol=2e-5, atol=2e-5)
