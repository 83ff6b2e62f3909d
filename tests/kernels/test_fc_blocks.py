"""FC's products in blocks for OpenBLAS's small-matrix kernel (stepnet.kernels.fc): the block rule stays within
the kernel's limits, and the blocked products (forced here, so they run on every CPU) are within float32
rounding of the float64 products, for FC (X·Wᵀ + b) and its input gradient (dY·W), blocks even or not."""
import numpy as np
import pytest

import stepnet.kernels.fc as fc

F = np.float32


def sum_bound(a, b, bias=0.0):
    """What float32 can get wrong in a·b (+ bias) summed in any order: (K + 1)·eps32 times the sum of the
    terms' magnitudes, per element (the standard bound on a recursive sum of K products and a bias)."""
    terms = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + np.abs(bias)
    return (a.shape[1] + 1) * np.finfo(F).eps * terms


def test_block_rows_stay_within_the_small_kernels_limits():
    """Over a grid of sizes: a block is a power of two ≥ 32 rows, fewer than all, with m·r ≤ 1024, m·r·k ≤ 2¹⁹
    and r·k ≥ 2¹⁴, and the largest such; one row (m = 1) is never blocked."""
    blocked = 0
    for m in (1, 2, 3, 4, 8, 16, 32, 64, 128):
        for k in (16, 128, 256, 512, 1024, 1536, 4096):
            for n in (64, 512, 1000, 2048, 4096):
                r = fc.block_rows(m, k, n)
                if m == 1 or r == 0:
                    continue
                blocked += 1
                assert r & (r - 1) == 0 and 32 <= r < n and m * r <= 1024 and m * r * k <= 1 << 19, (m, k, n, r)
                assert r * k >= 1 << 14
                assert 2 * m * r > 1024 or 2 * m * r * k > 1 << 19, (m, k, n, r)    # the largest
    assert blocked > 20
    assert fc.block_rows(1, 512, 2048) == 0 and fc.block_rows(128, 512, 2048) == 0


@pytest.mark.parametrize("m, k, n", [(8, 512, 2048), (4, 256, 1000), (2, 1024, 3000), (16, 1024, 96)])
def test_blocked_products_are_within_float32_rounding(m, k, n):
    """The forward product (with its bias) and the input gradient, blocked (where block_rows says so for
    these sizes) and not, against float64: every element within the rounding bound; blocked or not they use
    the same operands, shapes and outputs (into a given buffer, or new)."""
    rng = np.random.default_rng(m * k + n)
    x, w, b = (rng.standard_normal(s).astype(F) for s in ((m, k), (n, k), (n,)))
    g = rng.standard_normal((m, n)).astype(F)
    want_y = x.astype(np.float64) @ w.astype(np.float64).T + b
    want_dx = g.astype(np.float64) @ w.astype(np.float64)
    for small in (True, False):
        y = fc.fc_into(np, x, w.T, b, small=small)
        out = np.full((m, n), np.nan, F)
        assert fc.fc_into(np, x, w.T, b, out, small=small) is out
        np.testing.assert_array_equal(out, y)
        assert y.flags.c_contiguous and (np.abs(y - want_y) <= sum_bound(x, w.T, b)).all()
        dx = fc.input_gradient_into(np, g, w, small=small)
        into = np.full((m, k), np.nan, F)
        assert fc.input_gradient_into(np, g, w, into, small=small) is into
        np.testing.assert_array_equal(into, dx)
        assert dx.flags.c_contiguous and (np.abs(dx - want_dx) <= sum_bound(g, w)).all()


def test_a_wrong_block_fails_the_check(monkeypatch):
    """The check above fails a blocked product whose blocks overlap by one row (each block read from one row
    further on): the bound is tight enough to see a wrong block."""
    m, k, n = 8, 512, 2048
    assert fc.block_rows(m, k, n)
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(F) for s in ((m, k), (n, k), (n,)))

    def shifted(a, bt, rows, out):
        for i in range(0, a.shape[0], rows):
            part = a[i + 1:i + 1 + rows]
            np.matmul(part, bt, out=out[i:i + len(part)])
        return out
    monkeypatch.setattr(fc, "_rows_product", shifted)
    y = fc.fc_into(np, x, w.T, b, small=True)
    want = x.astype(np.float64) @ w.astype(np.float64).T + b
    assert not (np.abs(y - want) <= sum_bound(x, w.T, b)).all()


def test_only_float32_numpy_arrays_with_contiguous_weights_are_blocked():
    """float64, a transposed (K x N) weight layout and one row keep the one GEMM even where the kernel is
    asked for: the blocks were measured for float32 SGEMM on W's rows."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((8, 512)).astype(F), rng.standard_normal((2048, 512)).astype(F)
    assert fc._blocked(np, w, x, w.T, 8, 512, 2048, True) == 128
    w64 = w.astype(np.float64)
    assert fc._blocked(np, w64, x.astype(np.float64), w64.T, 8, 512, 2048, True) == 0
    assert fc._blocked(np, np.asfortranarray(w), x, np.asfortranarray(w).T, 8, 512, 2048, True) == 0
    assert fc._blocked(np, w, x, w.T, 8, 512, 2048, False) == 0
    assert fc._blocked(np, w, x[:1], w.T, 1, 512, 2048, True) == 0


@pytest.mark.parametrize("m, k, n", [(8, 128, 512), (8, 128, 384), (8, 160, 480)])
def test_products_in_the_direct_kernels_range_are_whole(m, k, n):
    """From 8 rows up, a product of at most 3·2¹⁸ multiply-adds (OpenBLAS's direct SGEMM's range) that the
    small kernel's rule would block is one GEMM: dY·W as it is (both operands contiguous), X·Wᵀ as W·Xᵀ (one
    block of all W's rows); the products are right (float64 bound) either way. Four rows, and larger
    products, keep the small kernel's blocks."""
    rng = np.random.default_rng(m + k)
    x, w, b = (rng.standard_normal(s).astype(F) for s in ((m, k), (n, k), (n,)))
    g = rng.standard_normal((m, n)).astype(F)
    assert fc._blocked(np, w, x, w.T, m, k, n, True) == n
    assert fc._blocked(np, w, g, w, m, n, k, True) == 0
    assert fc._blocked(np, w, x[:4], w.T, 4, k, n, True) == fc.block_rows(4, k, n) > 0
    assert fc._blocked(np, w, x, w.T, m, 4 * k, n, True) == fc.block_rows(m, 4 * k, n) > 0  # over the range
    y = fc.fc_into(np, x, w.T, b, small=True)
    assert (np.abs(y - (x.astype(np.float64) @ w.astype(np.float64).T + b)) <= sum_bound(x, w.T, b)).all()
    dx = fc.input_gradient_into(np, g, w, small=True)
    assert (np.abs(dx - g.astype(np.float64) @ w.astype(np.float64)) <= sum_bound(g, w)).all()


@pytest.mark.parametrize("m, k, n", [(32, 1024, 4096), (16, 2048, 512), (48, 128, 512), (64, 256, 1024)])
def test_unblocked_products_of_a_few_rows_are_one_w_first_block(m, k, n):
    """8 to 64 rows whose product the small kernel's rule does not block (and is not tiny) run as W·Xᵀ, one
    block of all W's rows, transposed into the output; dY·W (contiguous operands) stays one GEMM; 128 rows keep
    X·Wᵀ. Right against float64 either way."""
    rng = np.random.default_rng(m + k + n)
    x, w, b = (rng.standard_normal(s).astype(F) for s in ((m, k), (n, k), (n,)))
    assert fc.block_rows(m, k, n) == 0
    assert fc._blocked(np, w, x, w.T, m, k, n, True) == n
    assert fc._blocked(np, w, x, w.T, m, k, n, False) == 0
    g = rng.standard_normal((m, n)).astype(F)
    if fc.block_rows(m, n, k) == 0:
        assert fc._blocked(np, w, g, w, m, n, k, True) == 0
    big = np.concatenate([x] * 4)[:128]
    assert fc.block_rows(128, k, n) == 0 and fc._blocked(np, w, big, w.T, 128, k, n, True) == 0
    y = fc.fc_into(np, x, w.T, b, small=True)
    assert y.flags.c_contiguous
    assert (np.abs(y - (x.astype(np.float64) @ w.astype(np.float64).T + b)) <= sum_bound(x, w.T, b)).all()
