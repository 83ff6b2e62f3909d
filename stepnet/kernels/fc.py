"""FC's arithmetic on 2-D views, for every runner: `fc_into` computes Y = X·Wᵀ + b and `input_gradient_into`
dX = dY·W (the interpreted kernels call them with new outputs, compiled forms with their buffers), and `FcForms`
are the other ways of computing the same product that a compiled step may take instead, each only where it gives
`fc_into`'s bits on this machine (checked at run time: which forms sum in the same order depends on the CPU and
the BLAS kernel, never on a test run elsewhere).

A product with a few rows (M ≤ 32: a step FC's batch) is one GEMM per block of rows of its long operand where
numpy's BLAS has OpenBLAS's small-matrix kernel (kernels.blas): each block small enough for that kernel, which
reads the operands in place instead of packing W on every call (1.3-3× faster at M = 2-16 with H = 256-1024 on
SkylakeX kernels; benchmarks/RESULTS.md). Which blocks is a function of the sizes, the layout and the BLAS core
alone, so every runner computes the same sums."""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import numpy as np

from .blas import small_matrix_kernels
from .onehot import gather_fc

_SMALL_MN, _SMALL_MNK = 1024, 1 << 19      # within OpenBLAS's small-matrix limits (M·N ≤ 1200, M·N·K ≤ 10⁶)
_DIRECT_MNK = 3 << 18      # within OpenBLAS's direct SGEMM range (M·N·K up to about 10⁶; measured, with a margin)


def block_rows(m: int, k: int, n: int) -> int:
    """Rows per block of an n×k operand A for the product A·Bᵀ with B m×k (the n×m result, in blocks of rows)
    that OpenBLAS's small-matrix kernel takes: the largest power of two r with m·r ≤ 1024 and m·r·k ≤ 2¹⁹; 0
    (one product) where that leaves fewer than 32 rows (too many calls), all n rows, or a block under 2¹⁴
    elements (too little to gain)."""
    if m < 2:
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
    gain, 11 → 6 µs, costs the interpreted kernel 2×: 10 → 19 µs; not taken.)"""
    rows = block_rows(m, k, n)      # (first: 0 for one row, the per-character case, at once)
    if (not rows or xp is not np or w.dtype != np.float32 or x.dtype != np.float32 or not w.flags.c_contiguous
            or not (small_matrix_kernels() if small is None else small)):
        return 0
    if m >= 8 and m * k * n <= _DIRECT_MNK:
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


class Form(NamedTuple):
    """One way to compute an FC of fixed sizes (M, K, N) on host arrays, W given as the op's input (N·K
    elements of any shape; w2 below). biased(x2, w, b, out): x2·w2ᵀ + b into out (M×N); product(x2, w) -> the
    M×N product without the bias (an array of the form's own, for a pass that adds the bias itself); begin(w):
    per-run setup from the run's weights (None: none needed)."""
    biased: Callable
    product: Callable
    begin: Callable | None = None


def _matrix(w, shape):
    return w if w.shape == shape else w.reshape(shape)


def kernel_form(m: int, k: int, n: int, dtype) -> Form:
    """fc_into itself (the interpreted kernel's computation), one-hot gather aside. One row is never blocked
    (block_rows): its product is product_into's one GEMM, called straight (a sampled character's FCs)."""
    scratch, ws = np.empty((m, n), dtype), (n, k)
    into = product_into if m > 1 else (lambda xp, x2, wt, out: xp.matmul(x2, wt, out=out))

    def biased(x2, w, b, out):
        into(np, x2, _matrix(w, ws).T, out)
        out += b

    def product(x2, w):
        return into(np, x2, _matrix(w, ws).T, scratch)
    return Form(biased, product)


def w_first_form(m: int, k: int, n: int, dtype) -> Form:
    """W·Xᵀ into N×M scratch, then its transpose plus the bias into the output in one pass (OpenBLAS's NN
    product; on some CPUs much faster than fc_into's, with the same sums)."""
    yt, ws = np.empty((n, m), dtype), (n, k)

    def product(x2, w):
        np.matmul(_matrix(w, ws), x2.T, out=yt)
        return yt.T

    def biased(x2, w, b, out):
        np.add(product(x2, w), b, out=out)
    return Form(biased, product)


def blocks_form(m: int, k: int, n: int, dtype, parts: int) -> Form:
    """X·Wᵀ straight into `parts` column blocks of the output from a Wᵀ copied once per run (begin) into
    contiguous K × N/parts blocks, then the bias: no transposed pass, and each block's product can be small
    enough for OpenBLAS's small-matrix kernel, which skips packing W on every call. Until begin has copied this
    W (or when the step writes W), fc_into's computation."""
    c = n // parts
    blocks, copied = [np.empty((k, c), dtype) for _ in range(parts)], [None]
    fallback, scratch = kernel_form(m, k, n, dtype), np.empty((m, n), dtype)

    def into(x2, w, out) -> bool:
        if w is not copied[0]:
            return False
        for i, block in enumerate(blocks):
            np.matmul(x2, block, out=out if parts == 1 else out[:, i * c:(i + 1) * c])
        return True

    def biased(x2, w, b, out):
        if not into(x2, w, out):
            return fallback.biased(x2, w, b, out)
        out += b

    def product(x2, w):
        return scratch if into(x2, w, scratch) else fallback.product(x2, w)

    def begin(w):
        wt = _matrix(w, (n, k)).T
        for i, block in enumerate(blocks):
            np.copyto(block, wt[:, i * c:(i + 1) * c])
        copied[0] = w
    return Form(biased, product, begin)


def forms(m: int, k: int, n: int, dtype) -> dict:
    """The candidate forms for these sizes by key: 'kernel', 'w first', and p ≥ 1 column blocks where each
    block's product has at most 2^20 multiply-adds (OpenBLAS's small-matrix kernel) and N/p ≥ 8."""
    found = {"kernel": kernel_form(m, k, n, dtype), "w first": w_first_form(m, k, n, dtype)}
    for p in (1, 2, 4, 8, 16):
        if p == 1 or (n % p == 0 and n // p >= 8 and m * k * (n // p) <= 1 << 20):
            found[p] = blocks_form(m, k, n, dtype, p)
    return found


def same_sums(m: int, k: int, n: int, dtype, candidates: dict) -> list:
    """The keys of the candidate forms that give fc_into's bits on random data of these sizes (the order in
    which BLAS sums K depends on the sizes, layouts and the CPU's kernel, not on the values)."""
    rng = np.random.default_rng(0)
    x2, w2, b = (rng.standard_normal(s, dtype=dtype) for s in ((m, k), (n, k), (n,)))
    want = fc_into(np, x2, w2.T, b)
    same = []
    for key, form in candidates.items():
        if form.begin is not None:
            form.begin(w2)
        out = np.empty((m, n), dtype)
        form.biased(x2, w2, b, out)
        if np.array_equal(out, want, equal_nan=True):
            same.append(key)
    return same


def fastest(m: int, k: int, n: int, dtype, candidates: dict | None = None):
    """The key of the fastest candidate with fc_into's bits here ('kernel' when no other has them or the
    product is too small to be worth timing: below 2^16 multiply-adds, or one row). Each form is timed as a
    run uses it, 8 calls in a row, best of 3 batches interleaved between the forms, with its per-run Wᵀ copy
    spread over 8 timesteps."""
    if m < 2 or m * k * n < 1 << 16:
        return "kernel"
    candidates = forms(m, k, n, dtype) if candidates is None else candidates
    fine = same_sums(m, k, n, dtype, candidates)
    if len(fine) < 2:
        return "kernel"
    rng = np.random.default_rng(1)
    x2, w2, b = (rng.standard_normal(s, dtype=dtype) for s in ((m, k), (n, k), (n,)))
    out = np.empty((m, n), dtype)
    setup = {key: min(_seconds(candidates[key].begin, 1, w2) for _ in range(3)) if candidates[key].begin else 0.0
             for key in fine}
    times = {key: [] for key in fine}
    for _ in range(3):
        for key in fine:
            times[key].append(_seconds(candidates[key].biased, 8, x2, w2, b, out) / 8)
    return min(fine, key=lambda key: min(times[key]) + setup[key] / 8)


def _seconds(fn, calls: int, *args) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return time.perf_counter() - start
