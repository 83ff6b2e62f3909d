"""FC's arithmetic on 2-D views, for every runner: `fc_into` computes Y = X·Wᵀ + b and `input_gradient_into`
dX = dY·W (the interpreted kernels call them with new outputs, compiled forms with their buffers; the other ways
of computing the same products that a compiled step may take, where they give these bits, are in fc_forms.py).

A product with a few rows (M ≤ 32: a step FC's batch) is one GEMM per block of rows of its long operand where
numpy's BLAS has OpenBLAS's small-matrix kernel (kernels.blas): each block small enough for that kernel, which
reads the operands in place instead of packing W on every call (1.3-3× faster at M = 2-16 with H = 256-1024 on
SkylakeX kernels; benchmarks/HISTORY.md). Which blocks is a function of the sizes, the layout and the BLAS core
alone, so every runner computes the same sums."""
from __future__ import annotations

import functools

import numpy as np

from .blas import small_matrix_kernels
from .onehot import gather_fc

_SMALL_MN, _SMALL_MNK = 1024, 1 << 19      # within OpenBLAS's small-matrix limits (M·N ≤ 1200, M·N·K ≤ 10⁶)
_DIRECT_MNK = 3 << 18      # within OpenBLAS's direct SGEMM range (M·N·K up to about 10⁶; measured, with a margin)
_FEW_ROWS = (8, 64)        # rows of an unblocked X·Wᵀ computed as W·Xᵀ (_blocked)


def block_rows(m: int, k: int, n: int) -> int:
    """Rows per block of an n×k operand A for the product A·Bᵀ with B m×k (the n×m result, in blocks of rows)
    that OpenBLAS's small-matrix kernel takes: the largest power of two r with m·r ≤ 1024 and m·r·k ≤ 2¹⁹; 0
    (one product) where that leaves fewer than 32 rows (too many calls), all n rows, or a block under 2¹⁴
    elements (too little to gain)."""
    if m < 2 or k == 0:     # (K = 0: an empty sum, one GEMM of zeros)
        return 0
    r = min(_SMALL_MN // m, _SMALL_MNK // (m * k))
    r = 1 << (r.bit_length() - 1) if r > 0 else 0
    return r if 32 <= r < n and r * k >= 1 << 14 else 0


def _blocked(xp, w, x, rhs, m: int, k: int, n: int, small: bool | None) -> int:
    """Rows per block of rhsᵀ for the product x·rhs (rhs: a view of W, C-contiguous, the layout measured), or
    0 where one GEMM x·rhs runs: block_rows(m, k, n), except 0 where the sizes are not blocked, not numpy, not
    float32, or a BLAS without the small-matrix kernel (small: that fact; None: kernels.blas's). Those
    SkylakeX-family cores have OpenBLAS's direct SGEMM too, which computes a row-major product of two contiguous
    operands of up to about 10⁶ multiply-adds in place: where the sizes would block and are in that range
    (8 ≤ m, m·k·n ≤ 3·2¹⁸), a contiguous rhs (dY·W) takes one GEMM, and Wᵀ (X·Wᵀ) one block, W·Xᵀ, whose sums
    a compiled step gets from a contiguous Wᵀ copy (blocks_form) about twice as fast as from the small kernel's
    blocks (8×128·128×512: 10 against 19 µs), while the interpreted W·Xᵀ takes 24 µs. (At 4 rows the compiled
    gain, 11 → 6 µs, costs the interpreted kernel 2×: 10 → 19 µs; not taken.)
    Where the rule does not block a product of 8 to 64 rows with K ≥ 128 (blocks too small or too many), X·Wᵀ
    is W·Xᵀ too, one block: with few rows OpenBLAS's X·Wᵀ runs its kernel on the short side (W·Xᵀ then the
    transposed copy, over the kernel's X·Wᵀ: 0.49–0.85 of its time at 16–64 rows for K×N of 128×512, 256×1024,
    1024×1024, 1024×4096, 2048×512; 0.84–1.18 at 128 rows, where one GEMM stays)."""
    rows = block_rows(m, k, n)      # (first: 0 for one row, the per-character case, at once)
    whole = not rows and _FEW_ROWS[0] <= m <= _FEW_ROWS[1] and k >= 128 and m * k * n >= 1 << 16
    if ((not rows and not whole) or xp is not np or w.dtype != np.float32 or x.dtype != np.float32
            or not w.flags.c_contiguous or not (small_matrix_kernels() if small is None else small)):
        return 0
    if whole or (m >= 8 and m * k * n <= _DIRECT_MNK):
        return 0 if rhs.flags.c_contiguous else n
    return rows


def _rows_product(a, bt, rows: int, out):
    """out (n×m) = a (n×k) · bt (k×m), one GEMM per block of `rows` rows."""
    for i in range(0, a.shape[0], rows):
        np.matmul(a[i:i + rows], bt, out=out[i:i + rows])
    return out


def _product(xp, x, rhs, w, out, small):
    """x (M×K) · rhs (K×N, a view of the weight matrix w as stored) into out (M×N C-contiguous, or a new array
    when None): one GEMM, or rhsᵀ·xᵀ in blocks of rhsᵀ's rows (_blocked) transposed into out."""
    m, k, n = x.shape[0], x.shape[1], rhs.shape[1]
    rows = _blocked(xp, w, x, rhs, m, k, n, small)
    if not rows:
        return xp.matmul(x, rhs, out=out)
    yt = _rows_product(rhs.T, x.T, rows, np.empty((n, m), x.dtype))
    if out is None:
        out = np.empty((m, n), x.dtype)
    np.copyto(out, yt.T)
    return out


def bound_product(x, rhs, w, out):
    """call() -> out: _product(np, x, rhs, w, out) on these host arrays, its blocking decided now (a function of
    the sizes, the layout and the BLAS core): one GEMM called straight, or the blocks."""
    if not _blocked(np, w, x, rhs, x.shape[0], x.shape[1], rhs.shape[1], None):
        return functools.partial(np.matmul, x, rhs, out=out)
    return functools.partial(_product, np, x, rhs, w, out, None)


def product_into(xp, x2, wt, out=None, small: bool | None = None):
    """x2 (M×K) · wt (K×N: W's transpose) into out (M×N C-contiguous, or a new array when None): one GEMM, or
    W·Xᵀ in blocks of W's rows transposed into out (block_rows)."""
    return _product(xp, x2, wt, wt.T, out, small)


def fc_into(xp, x2, wt, b, out=None, small: bool | None = None):
    """x2 (M×K) · wt (K×N: W's transpose, a view of any layout) + b (N) into out (M×N C-contiguous, or a new
    array when None); returns it. One-hot rows of host arrays are gathered (onehot.gather_fc: the GEMM's
    values without the GEMM); otherwise product_into, then the bias added in place."""
    y = gather_fc(x2, wt, b, out) if xp is np else None
    if y is None:
        y = product_into(xp, x2, wt, out, small)
        y += b
    return y


def input_gradient_into(xp, g, w2, out=None, small: bool | None = None):
    """FC's input gradient dX = g (M×N) · w2 (N×K) into out (M×K C-contiguous, or a new array when None): one
    GEMM, or dXᵀ = w2ᵀ·gᵀ in blocks of its rows (block_rows) transposed into out."""
    return _product(xp, g, w2, w2, out, small)
