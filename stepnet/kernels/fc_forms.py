"""The other ways a compiled step may compute FC's products (stepnet.kernels.fc's `fc_into` and
`input_gradient_into`), each taken only where it gives their bits on this machine: which forms sum in the same
order depends on the sizes, the layouts, the CPU and the BLAS kernel, never on the values, so it is checked at
run time (`same_sums`, `gradient_same_sums`), once per signature, on random data of the product's sizes; of
those, the fastest here is taken (`fastest`, `gradient_fastest`), its per-run setup (a copy of W) counted.

Most of these forms read a contiguous Wᵀ that their `begin` copies once per run from the run's W: OpenBLAS then
streams W once through its kernel with the batch as the short side instead of packing it on every call."""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import numpy as np

from .fc import bound_product, fc_into, input_gradient_into, product_into


class Form(NamedTuple):
    """One way to compute an FC of fixed sizes (M, K, N) on host arrays, W given as the op's input (N·K
    elements of any shape; w2 below). biased(x2, w, b, out): x2·w2ᵀ + b into out (M×N); product(x2, w) -> the
    M×N product without the bias (an array of the form's own, for a pass that adds the bias itself); begin(w):
    per-run setup from the run's weights (None: none needed)."""
    biased: Callable
    product: Callable
    begin: Callable | None = None


class GradientForm(NamedTuple):
    """One way to compute FC's input gradient dX = dY·W of fixed sizes (dY M×N, W N×K): product(dy2, w, out)
    into out (M×K, C-contiguous); begin(w): per-run setup from the run's weights (None: none needed);
    bind(dy2, w, out) -> call(): product on these very arrays, what depends on them alone decided once."""
    product: Callable
    begin: Callable | None = None
    bind: Callable | None = None


def _matrix(w, shape):
    return w if w.shape == shape else w.reshape(shape)


def transposed_copy(a, out):
    """out (K×N, C-contiguous) = aᵀ for a (N×K), copied in strips of 16 rows of a: one copy of the transposed
    view walks the output across the whole of a (4096×1024 float32: 30 ms; in strips 5 ms). Up to 2^16
    elements (within the caches) one copy is the quicker (512×128: 41 against 56 µs)."""
    if a.size <= 1 << 16:
        np.copyto(out, a.T)
        return out
    for i in range(0, a.shape[0], 16):
        np.copyto(out[:, i:i + 16], a[i:i + 16].T)
    return out


# ------------------------------------------------------------------------------------------- X·Wᵀ + b
def kernel_form(m: int, k: int, n: int, dtype) -> Form:
    """fc_into itself (the interpreted kernel's computation), one-hot gather aside. One row is never blocked
    (block_rows): its product is product_into's one GEMM, called straight (a sampled character's FCs)."""
    scratch, ws = [], (n, k)       # (the product's output: made at its first use, as fusing with a Sum needs)
    into = product_into if m > 1 else (lambda xp, x2, wt, out: xp.matmul(x2, wt, out=out))

    def biased(x2, w, b, out):
        into(np, x2, _matrix(w, ws).T, out)
        out += b

    def product(x2, w):
        if not scratch:
            scratch.append(np.empty((m, n), dtype))
        return into(np, x2, _matrix(w, ws).T, scratch[0])
    return Form(biased, product)


def w_first_form(m: int, k: int, n: int, dtype) -> Form:
    """W·Xᵀ into N×M scratch, then its transpose plus the bias into the output in one pass (OpenBLAS's NN
    product; on some CPUs much faster than fc_into's, with the same sums). For an X of another layout than the
    C-contiguous one its sums were checked with, fc_into's computation."""
    yt, ws, fallback = np.empty((n, m), dtype), (n, k), kernel_form(m, k, n, dtype)

    def product(x2, w):
        if not x2.flags.c_contiguous:
            return fallback.product(x2, w)
        np.matmul(_matrix(w, ws), x2.T, out=yt)
        return yt.T

    def biased(x2, w, b, out):
        if not x2.flags.c_contiguous:
            return fallback.biased(x2, w, b, out)
        np.add(product(x2, w), b, out=out)
    return Form(biased, product)


def blocks_form(m: int, k: int, n: int, dtype, parts: int) -> Form:
    """X·Wᵀ straight into `parts` column blocks of the output from a Wᵀ copied once per run (begin) into
    contiguous K × N/parts blocks, then the bias: no transposed pass, and each block's product can be small
    enough for OpenBLAS's small-matrix kernel, which skips packing W on every call. Until begin has copied this
    W (or when the step writes W), and for an X of another layout than the C-contiguous one its sums were checked
    with, fc_into's computation."""
    c = n // parts
    blocks, copied = [np.empty((k, c), dtype) for _ in range(parts)], [None]
    fallback, scratch = kernel_form(m, k, n, dtype), np.empty((m, n), dtype)

    def into(x2, w, out) -> bool:
        if w is not copied[0] or not x2.flags.c_contiguous:
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
        w2 = _matrix(w, (n, k))
        for i, block in enumerate(blocks):
            transposed_copy(w2[i * c:(i + 1) * c], block)
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


def _fc_case(m: int, k: int, n: int, dtype, seed: int):
    """(call(form) -> its result, w2): random X, W, b of these sizes and an output for each form to write."""
    rng = np.random.default_rng(seed)
    x2, w2, b = (rng.standard_normal(s, dtype=dtype) for s in ((m, k), (n, k), (n,)))
    out = np.empty((m, n), dtype)

    def call(form):
        form.biased(x2, w2, b, out)
        return out
    return call, w2, fc_into(np, x2, w2.T, b)


def same_sums(m: int, k: int, n: int, dtype, candidates: dict) -> list:
    """The keys of the candidate FC forms that give fc_into's bits on random data of these sizes."""
    call, w2, want = _fc_case(m, k, n, dtype, 0)
    return _exact(candidates, call, w2, want)


def fastest(m: int, k: int, n: int, dtype, candidates: dict | None = None, steps: int = 8):
    """The key of the fastest FC form with fc_into's bits here ('kernel' when no other has them or the product
    is too small to be worth timing: below 2^16 multiply-adds, or one row), for runs of `steps` products each;
    see _quickest."""
    return _choose(m, k, n, dtype, candidates, forms, _fc_case, steps)


# ------------------------------------------------------------------------------------------- dY·W
def gradient_kernel_form(m: int, k: int, n: int, dtype) -> GradientForm:
    """input_gradient_into itself (the interpreted kernel's computation)."""
    ws = (n, k)

    def product(dy2, w, out):
        input_gradient_into(np, dy2, _matrix(w, ws), out)

    def bind(dy2, w, out):
        w2 = _matrix(w, ws)
        return bound_product(dy2, w2, w2, out)
    return GradientForm(product, bind=bind)


def gradient_wt_form(m: int, k: int, n: int, dtype) -> GradientForm:
    """dXᵀ = Wᵀ·dYᵀ from a Wᵀ copied once per run (begin) into a contiguous K×N array, transposed into the
    output: the batch is then the product's short side and W is streamed once (8×4096 by 4096×1024: 1.6–1.9 ms
    where dY·W takes 2.1–2.6, and its per-run copy 4.7). Until begin has copied this W, or for a dY of another
    layout than the C-contiguous one its sums were checked with, the kernel's computation."""
    ws, wt, dxt, copied = (n, k), np.empty((k, n), dtype), np.empty((k, m), dtype), [None]

    def product(dy2, w, out):
        if w is not copied[0] or not dy2.flags.c_contiguous:
            input_gradient_into(np, dy2, _matrix(w, ws), out)
            return
        np.matmul(wt, dy2.T, out=dxt)
        np.copyto(out, dxt.T)

    def begin(w):
        transposed_copy(_matrix(w, ws), wt)
        copied[0] = w
    return GradientForm(product, begin)


def gradient_forms(m: int, k: int, n: int, dtype) -> dict:
    """The candidate input-gradient forms by key: 'kernel' and 'w transposed'."""
    return {"kernel": gradient_kernel_form(m, k, n, dtype), "w transposed": gradient_wt_form(m, k, n, dtype)}


def _gradient_case(m: int, k: int, n: int, dtype, seed: int):
    rng = np.random.default_rng(seed)
    dy2, w2 = (rng.standard_normal(s, dtype=dtype) for s in ((m, n), (n, k)))
    out = np.empty((m, k), dtype)

    def call(form):
        form.product(dy2, w2, out)
        return out
    return call, w2, input_gradient_into(np, dy2, w2)


def gradient_same_sums(m: int, k: int, n: int, dtype, candidates: dict) -> list:
    """The keys of the candidate input-gradient forms that give input_gradient_into's bits on random data."""
    call, w2, want = _gradient_case(m, k, n, dtype, 0)
    return _exact(candidates, call, w2, want)


def gradient_fastest(m: int, k: int, n: int, dtype, candidates: dict | None = None, steps: int = 8):
    """The key of the fastest input-gradient form with input_gradient_into's bits here ('kernel' when no other
    has them or the product is below 2^16 multiply-adds, or one row), for runs of `steps` products each; see
    _quickest."""
    return _choose(m, k, n, dtype, candidates, gradient_forms, _gradient_case, steps)


# ------------------------------------------------------------------------------------------- choosing
TRIAL_BYTES = 48 << 20    # the most memory a trial of the product forms may take (its transient peak)


def _choose(m: int, k: int, n: int, dtype, candidates: dict | None, make, case, steps: int):
    """'kernel' for one row, under 2^16 multiply-adds, or where the trial's arrays (random X and W, the kernel's
    result, each candidate's output and scratch) would pass TRIAL_BYTES; else the quickest of the candidates
    (make(m, k, n, dtype) when None) whose results on case's random data are the kernel's bits."""
    if m < 2 or m * k * n < 1 << 16:
        return "kernel"
    candidates = make(m, k, n, dtype) if candidates is None else candidates
    if (m * k + n * k + m * n * (2 + len(candidates))) * np.dtype(dtype).itemsize > TRIAL_BYTES:
        return "kernel"
    call, w2, want = case(m, k, n, dtype, 0)
    fine = _exact(candidates, call, w2, want)
    call, w2, _ = case(m, k, n, dtype, 1)
    return _quickest(candidates, fine, call, w2, steps)


def _exact(candidates: dict, call, w2, want) -> list:
    same = []
    for key, form in candidates.items():
        if form.begin is not None:
            form.begin(w2)
        if np.array_equal(call(form), want, equal_nan=True):
            same.append(key)
    return same


def _quickest(candidates: dict, fine: list, call, w2, steps: int):
    """The fastest of the forms `fine` ('kernel' when fewer than two): each timed as a run uses it, 8 calls in a
    row, best of 3 batches interleaved between the forms, with its per-run setup spread over the `steps`
    products of a run (a step net's timesteps; 1 for a plain net's run)."""
    if len(fine) < 2:
        return "kernel"
    setup = {key: min(_seconds(candidates[key].begin, 1, w2) for _ in range(3)) if candidates[key].begin else 0.0
             for key in fine}
    # (timing a setup leaves it made: each form below runs as after its begin)
    times = {key: [] for key in fine}
    for _ in range(3):
        for key in fine:
            times[key].append(_seconds(call, 8, candidates[key]) / 8)
    return min(fine, key=lambda key: min(times[key]) + setup[key] / max(steps, 1))


def _seconds(fn, calls: int, *args) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return time.perf_counter() - start
