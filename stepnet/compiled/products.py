"""The compiled forms of the step nets' matrix products: the step FC (the fastest of W·Xᵀ and X·Wᵀ in column
blocks for its sizes, timed once) and the deferred FC gradient (the input gradient per timestep; the weight
gradient's rows gathered for one GEMM after the loop). Same contract as kernels.py: same sums as the kernels."""
from __future__ import annotations

import math
import time

import numpy as np

from ..errors import ShapeError
from ..ops.fc_onehot import ONE_HOT_ROWS, gather_fc
from .cells import Fast, bound_args, same_floats, shaped


def fc(bop, ins, outs, parts: int | None = None):
    """FC in the fastest of these forms for its sizes, timed once here (same sums: checked on random data;
    parts picks one):
    parts=0: W·Xᵀ into scratch, then its transpose plus the bias into the output (OpenBLAS's NN product);
    parts=p ≥ 1: X·Wᵀ straight into p column blocks of the output, from Wᵀ copied once per run (Fast.begin)
    into p contiguous K × N/p blocks, then the bias. No transposed pass; and with p blocks each product can be
    small enough for OpenBLAS's small-matrix kernel, which skips packing W on every call (at 32×128×512, 4
    blocks take 46 µs against 58 for one)."""
    sizes = _fc_sizes(bop, ins, outs)
    if sizes is None:
        return None
    x = ins[0]
    m, k, n = sizes
    xs, ws, ys = (m, k), (n, k), (m, n)
    yt = np.empty((n, m), x.dtype)
    if m == 1:     # one row: numpy's matrix-vector product, the kernel's bits (np.dot has less overhead)
        vec, xk = yt.reshape(n), (k,)
        product = yt.T

        def w_first(x, w):
            np.dot(shaped(w, ws), shaped(x, xk), out=vec)
            return product
    else:
        def w_first(x, w):
            np.matmul(shaped(w, ws), shaped(x, xs).T, out=yt)
            return yt.T

    def by_w(ins, outs):
        x, w, b = ins
        np.add(w_first(x, w), b, out=shaped(outs[0], ys))      # the transposed copy and the bias in one pass

    def by_x(p: int):
        c = n // p
        blocks, copied = [np.empty((k, c), x.dtype) for _ in range(p)], [None]

        def x_first(x, w, out) -> bool:
            """X·Wᵀ into out; False when there is no Wᵀ of this W (the step net writes W)."""
            if w is not copied[0]:
                return False
            x2 = shaped(x, xs)
            if p == 1:
                np.matmul(x2, blocks[0], out=out)
            else:
                for i, block in enumerate(blocks):
                    np.matmul(x2, block, out=out[:, i * c:(i + 1) * c])
            return True

        def run(ins, outs):
            x, w, b = ins
            out = shaped(outs[0], ys)
            if not x_first(x, w, out):
                return by_w(ins, outs)
            out += b

        def begin(w):
            wt = shaped(w, ws).T
            for i, block in enumerate(blocks):
                np.copyto(block, wt[:, i * c:(i + 1) * c])
            copied[0] = w
        return run, begin, x_first
    if parts is None:
        parts = _fastest(m, k, n, x.dtype, by_w, by_x)
    run, begin, x_first = by_x(parts) if parts else (by_w, None, None)
    if m >= ONE_HOT_ROWS and k <= m:      # one-hot rows (a char-rnn's input) gathered, as the FC kernel does
        product = run

        def run(ins, outs):
            x, w, b = ins
            if gather_fc(np.ascontiguousarray(shaped(x, xs)), shaped(w, ws).T, b, shaped(outs[0], ys)) is None:
                product(ins, outs)
        return Fast(run, begin=None if begin is None else (1, begin))

    def fuse(next_bop, ins, outs):
        """FC bias + the Sum that reads its output, in one pass (see _with_sum)."""
        return _with_sum(bop, next_bop, ins, outs, ys, w_first, x_first)
    return Fast(run, begin=None if begin is None else (1, begin), fuse=fuse)


def _fc_sizes(bop, ins, outs) -> tuple | None:
    """(M, K, N) of an FC on float arrays of one dtype that the compiled forms handle, else None."""
    x, w, b = ins
    args = bound_args(bop)
    if not same_floats(x, w, b) or args.get("float16_compute") or b.ndim != 1:
        return None
    a, aw = args["axis"], args["axis_w"]
    a, aw = a + x.ndim if a < 0 else a, aw + w.ndim if aw < 0 else aw
    if not (0 < a < x.ndim and 0 < aw < w.ndim):
        return None
    m, k, n = math.prod(x.shape[:a]), math.prod(x.shape[a:]), math.prod(w.shape[:aw])
    if w.size != n * k or b.size != n or outs[0].size != m * n:
        return None
    return m, k, n


def fc_row(bop, ins, outs):
    """FC of one float32 row with the fused kernels (the FC fused kernel's arithmetic: numba's fc_row, the
    product and the bias in one pass over W), straight into the output; with the Sum after it, fc_row_sum."""
    from .fused import kernels

    compiled, sizes = kernels(), _fc_sizes(bop, ins, outs)
    if compiled is None or sizes is None or sizes[0] != 1 or ins[0].dtype != np.float32 or outs[0].dtype != np.float32:
        return None
    _, k, n = sizes
    ws, row = (n, k), compiled.fc_row

    def run(ins, outs):       # (ravel: x as its k values; the output, contiguous, as a view of its n)
        x, w, b = ins
        row(shaped(w, ws), x.ravel(), b, outs[0].ravel())

    def fuse(next_bop, ins, outs):
        pair = _sum_pair(bop, next_bop, ins, outs, n)
        if pair is None:
            return None
        other, into = pair
        row_sum = compiled.fc_row_sum

        def both(ins, outs):
            y = outs[0].ravel()
            row_sum(shaped(ins[1], ws), ins[0].ravel(), ins[2], ins[3 + other].ravel(), y,
                    y if into else outs[1].ravel())
        return Fast(both)
    return Fast(run, fuse=fuse)


def _sum_pair(fc_bop, sum_bop, ins, outs, size: int) -> tuple | None:
    """(which Sum input is not the FC's output, whether the Sum writes in place over it) for an FC followed by
    Sum(y, z) -> s (either input order; s may be z or y) that one pass may compute: float32, two inputs of the
    FC output's size, no partial overlap between y, z and s. None otherwise."""
    y = fc_bop.outputs[0]
    if (len(sum_bop.inputs) != 2 or sum(b is y for b in sum_bop.inputs) != 1
            or any(a.dtype != np.float32 for a in (*ins, outs[0])) or any(a.size != size for a in (*ins[3:], outs[0]))):
        return None
    other = 1 if sum_bop.inputs[0] is y else 0
    y_now, z_now, s_now = ins[4 - other], ins[3 + other], outs[0]     # (the values the Sum saw)
    if np.may_share_memory(z_now, y_now) or (s_now is not y_now and s_now is not z_now and any(
            np.may_share_memory(s_now, a) for a in (y_now, z_now))):
        return None      # one pass over overlapping arrays would read values the two ops never see
    return other, sum_bop.outputs[0] is y


def _with_sum(fc_bop, sum_bop, ins, outs, ys, w_first, x_first):
    """The form of FC(x, W, b) -> y followed by Sum(y, z) -> s (either input order; s may be z or y): the
    product as the FC form computes it, then one numba pass (no fast-math: the same float32 additions in the
    same order as the two ops) writes y = product + b and s = y + z. None unless float32, a Sum of two inputs,
    one of them y and the other of y's size, no partial overlap between y, z and s, and numba's kernels load."""
    from .fused import kernels

    compiled = kernels()
    pair = None if compiled is None else _sum_pair(fc_bop, sum_bop, ins, outs, ys[0] * ys[1])
    if pair is None:
        return None
    other, into = pair       # into: Sum in place over y (the LSTM step nets' gates): y = (p + b) + z
    kernel = compiled.bias_sum_into if into else compiled.bias_sum
    scratch = None if x_first is None else np.empty(ys, np.float32)   # the X·Wᵀ forms' product

    def run(ins, outs):
        x, w, b, z = ins[0], ins[1], ins[2], shaped(ins[3 + other], ys)
        p = scratch if x_first is not None and x_first(x, w, scratch) else w_first(x, w)
        if into:
            kernel(p, b, z, shaped(outs[0], ys))
        else:
            kernel(p, b, z, shaped(outs[0], ys), shaped(outs[1], ys))
    return Fast(run)


def _fastest(m, k, n, dtype, by_w, by_x) -> int:
    """The parts of the fastest form that gives by_w's bits on random data, with its per-run Wᵀ copy spread
    over 8 timesteps. Each form is timed as a run uses it, 8 calls in a row (its first calls run cold), best
    of 3 such batches interleaved between the forms; block forms are tried only where each block's product
    has at most 2^20 multiply-adds (OpenBLAS's small-matrix kernel). 0 (by_w) when none is faster. With one
    row numpy calls a matrix-vector product whose sums depend on the orientation, and below 2^18
    multiply-adds the difference is not worth timing: W·Xᵀ then."""
    if m < 2 or m * k * n < 1 << 18:
        return 0
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(shape, dtype=dtype) for shape in ((m, k), (n, k), (n,))]
    forms = {0: (by_w, None, [np.empty((m, n), dtype)])}
    for p in (1, 2, 4, 8, 16):
        if p == 1 or (n % p == 0 and n // p >= 8 and m * k * (n // p) <= 1 << 20):
            forms[p] = (*by_x(p)[:2], [np.empty((m, n), dtype)])
    copy = {p: min(_seconds(begin, 1, ins[1]) for _ in range(3)) if begin else 0.0
            for p, (_, begin, _) in forms.items()}
    times = {p: [] for p in forms}
    for _ in range(3):
        for p, (run, _, out) in forms.items():
            times[p].append(_seconds(run, 8, ins, out) / 8)
    want = forms[0][2][0]
    fine = [p for p in forms if np.array_equal(forms[p][2][0], want)]
    return min(fine, key=lambda p: min(times[p]) + copy[p] / 8)


def _seconds(fn, calls: int, *args) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return time.perf_counter() - start


def fc_gradient_deferred(bop, ins, outs):
    _, sequence, x, w, dy, xs, dys = ins
    args = bound_args(bop)
    a, aw = args["axis"], args["axis_w"]
    a, aw = a + x.ndim if a < 0 else a, aw + w.ndim if aw < 0 else aw
    m, k, n = math.prod(x.shape[:a]), math.prod(x.shape[a:]), math.prod(w.shape[:aw])
    T = sequence.shape[0]
    if (not same_floats(x, w, dy, xs, dys) or dy.size != m * n or w.size != n * k
            or xs.shape != (T * m, k) or dys.shape != (T * m, n) or outs[0].size != x.size):
        return None
    x2, w2, y2 = (m, k), (n, k), (m, n)

    def run(ins, outs):
        timestep, _, x, w, dy, xs, dys = ins
        t = int(timestep.flat[0])
        if not 0 <= t < T:
            raise ShapeError(f"timestep {t} is outside the {T} steps of the sequence")
        block = (T - 1 - t) * m
        dy = shaped(dy, y2)
        xs[block:block + m] = shaped(x, x2)
        dys[block:block + m] = dy
        np.matmul(dy, shaped(w, w2), out=shaped(outs[0], x2))
    return Fast(run)
