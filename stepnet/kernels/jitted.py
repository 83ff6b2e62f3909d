"""numba's fused kernels (the `fast` extra), float32 only: the LSTM/GRU cell kernels (kernels/jitted_cells.py,
re-exported here), the row kernels of Softmax and its gradient, Sigmoid's pass, the one-hot FC weight gradient
(add_rows), the step FC's bias + Sum (bias_sum), FC of one row and Adam's update (adam, numpy's roundings
exactly). Imported only through stepnet.kernels.jit.load(), so stepnet runs without numba.

Kernels that write several outputs compute into scratch they allocated themselves first (jitted_cells says
why). fastmath without 'nnan'/'ninf': a NaN or inf propagates as it does in numpy. The 2-D kernels index
x[i, j] by their loop variables; flat arrays are C-contiguous views."""
from __future__ import annotations

import numpy as np
from numba import float32, njit

from .jitted_cells import _JIT
# the cell kernels, re-exported: jit.load()'s module holds every kernel
from .jitted_cells import (  # noqa: F401
    gru_backward, gru_forward, lstm_activations, lstm_backward, lstm_forward, tanh_into)


@njit(**_JIT)
def add_rows(g, idx, k, transpose):
    """out (k × g's columns, zeroed) with out[idx[r]] += g[r] for every row r of g, in row order (the one-hot
    FC's weight gradient, stepnet.ops.math_grad); every idx[r] < k. transpose: out's transpose instead (FC's
    N × K weight layout), the same sums written through a tiled transpose (numpy's transposed copy of a 65 × 512
    result took 70 µs, this one about 20)."""
    m, n = g.shape
    out = np.zeros((k, n), np.float32)
    for r in range(m):
        v = idx[r]
        for j in range(n):
            out[v, j] += g[r, j]
    if not transpose:
        return out
    t = np.empty((n, k), np.float32)
    for j0 in range(0, n, 32):
        j1 = min(j0 + 32, n)
        for i in range(k):
            for j in range(j0, j1):
                t[j, i] = out[i, j]
    return t


_SIGN = np.int32(0x7FFFFFFF)
_TWO_M64 = float32(5.421010862427522e-20)     # 2^−64


@njit(inline="always", **_JIT)
def _exp_parts(z):
    """exp(z) for z ≤ 0 (or NaN) as (y, bits): Cephes' expf, a Cody–Waite reduction z = n·ln2 + r and a
    degree-7 polynomial y in r (within 3e-7 relative of exp), with bits those of the float 2^(n+64), so that
    exp(z) = (y · 2^(n+64)) · 2^−64 rounds once into the subnormals below 2^−126; z < −104 gives 0. The bits go
    through an int32 array viewed as float32 (a vectorizable reinterpretation)."""
    z = float32(-104.0) if z < float32(-104.0) else z          # a NaN stays NaN
    fx = np.floor(z * float32(1.44269504088896341) + float32(0.5))
    r = z - fx * float32(0.693359375) - fx * float32(-2.12194440e-4)
    p = float32(1.9875691500e-4)
    p = p * r + float32(1.3981999507e-3)
    p = p * r + float32(8.3334519073e-3)
    p = p * r + float32(4.1665795894e-2)
    p = p * r + float32(1.6666665459e-1)
    p = p * r + float32(5.0000001201e-1)
    return p * (r * r) + r + float32(1.0), ((np.int32(fx) if fx == fx else np.int32(0)) + np.int32(191)) << 23


@njit(**_JIT)
def sigmoid(x, out, y, bits):
    """out = 1 / (1 + exp(−x)) elementwise over flat float32 arrays, as numpy's kernel defines it: e = exp(−|x|)
    (_exp_parts), then 1/(1 + e) for x ≥ 0 and e/(1 + e) for x < 0, never an overflow; within 4e-7 relative of
    the exact value wherever it is a normal float. y (float32) and bits (int32): scratch of x's size. The first
    pass keeps x's sign in y's (the polynomial is positive), so the second reads scratch alone: out may be x."""
    n = x.size
    for j in range(n):
        v = x[j]
        p, bits[j] = _exp_parts(-abs(v))
        y[j] = -p if v < float32(0) else p
    scale = bits.view(np.float32)
    for j in range(n):
        p = y[j]
        e = (abs(p) * scale[j]) * _TWO_M64
        out[j] = (e if p < float32(0) else float32(1)) / (float32(1) + e)


@njit(**_JIT)
def softmax_rows(x, out):
    """out[i] = softmax of row i of x (m × k, float32, C-contiguous). The row max is found on
    the float bits mapped to monotone int32 (a vectorizable integer max; any NaN in a row makes the row's sum
    and so the whole row NaN, as numpy's does); exp(z) for z = x − max ≤ 0 is _exp_parts'."""
    m, k = x.shape
    xi = x.view(np.int32)
    y = np.empty(k, np.float32)
    bits = np.empty(k + 1, np.int32)
    scale = bits.view(np.float32)
    for i in range(m):
        best = np.int32(-2147483648)
        for j in range(k):
            v = xi[i, j]
            best = max(best, v ^ ((v >> 31) & _SIGN))
        bits[k] = best ^ ((best >> 31) & _SIGN)
        mx = scale[k]
        for j in range(k):
            y[j], bits[j] = _exp_parts(x[i, j] - mx)
        s = float32(0.0)
        for j in range(k):
            e = (y[j] * scale[j]) * _TWO_M64
            y[j] = e
            s += e
        for j in range(k):
            out[i, j] = y[j] / s


@njit(**_JIT)
def softmax_grad_rows(y, dy, out):
    """out[i] = y[i] ⊙ (dy[i] − Σ_j dy[i, j]·y[i, j]) for every row (m × k, float32)."""
    m, k = y.shape
    row = np.empty(k, np.float32)
    for i in range(m):
        s = float32(0.0)
        for j in range(k):
            s += dy[i, j] * y[i, j]
        for j in range(k):
            row[j] = y[i, j] * (dy[i, j] - s)
        for j in range(k):
            out[i, j] = row[j]


_EXACT = {"boundscheck": False, "error_model": "numpy", "cache": True}   # no fast-math: numpy's additions


@njit(**_EXACT)
def bias_sum(p, b, z, y, s):
    """y = p + b (b per column) and s = y + z in one pass: an FC's bias and the Sum after it (m × n; p, the
    product, is its own array: W·Xᵀ's transposed, or scratch, so that no store can overlap a load)."""
    m, n = y.shape
    for i in range(m):
        for j in range(n):
            v = p[i, j] + b[j]
            y[i, j] = v
            s[i, j] = v + z[i, j]


@njit(**_EXACT)
def bias_sum_into(p, b, z, y):
    """y = (p + b) + z: bias_sum for a Sum written in place over the FC's output."""
    m, n = y.shape
    for i in range(m):
        for j in range(n):
            y[i, j] = (p[i, j] + b[j]) + z[i, j]


@njit(**_EXACT)
def adam(w, g, m1, m2, lr, corr, b1, b2, eps, eg, keep):
    """Adam's update in place, one pass: m1 = b1·m1 + (1−b1)·g, m2 = (1−b2)·g² + b2·m2, s = corr·m1/(√m2 + eps),
    w = w + lr·s (s into eg when keep), each operation rounded as stepnet.ops.optim.adam_step_into rounds it
    (no fast-math), so the bits are numpy's. Unlike the kernels above it writes its arrays themselves: w, m1, m2
    are each read and written at one index at a time and g, eg are other memory (the caller's check), so LLVM's
    overlap checks pass and the loop runs vectorized (262,144 elements: 0.1 ms; numpy's passes 0.9)."""
    c1, c2 = float32(1) - b1, float32(1) - b2
    for i in range(w.size):
        gi = g[i]
        a = m1[i] * b1 + gi * c1
        b = (gi * gi) * c2 + m2[i] * b2
        s = (a / (np.sqrt(b) + eps)) * corr
        if keep:
            eg[i] = s
        m1[i], m2[i], w[i] = a, b, w[i] + s * lr


@njit(inline="always", **_JIT)
def _dot4(W, x, i, k):
    """The dot products of rows i..i+3 of W with x (fast-math: LLVM vectorizes the sums over k)."""
    a0, a1, a2, a3 = float32(0), float32(0), float32(0), float32(0)
    for j in range(k):
        xj = x[j]
        a0 += W[i, j] * xj
        a1 += W[i + 1, j] * xj
        a2 += W[i + 2, j] * xj
        a3 += W[i + 3, j] * xj
    return a0, a1, a2, a3


@njit(inline="always", **_JIT)
def _dot(W, x, i, k):
    acc = float32(0)
    for j in range(k):
        acc += W[i, j] * x[j]
    return acc


@njit(**_JIT)
def fc_row(W, x, b, y):
    """y = W·x + b for one row x (k) and W (n × k): an FC of one row (sampling at batch 1) in one pass over W,
    four rows at a time, the bias added to each sum (no separate pass). Sums in another order than BLAS's
    matrix-vector product: within float32 rounding of it; a NaN or inf in W or x propagates (0·inf is NaN) as
    in the BLAS product."""
    n, k = W.shape
    i = 0
    while i + 4 <= n:
        a0, a1, a2, a3 = _dot4(W, x, i, k)
        y[i], y[i + 1], y[i + 2], y[i + 3] = a0 + b[i], a1 + b[i + 1], a2 + b[i + 2], a3 + b[i + 3]
        i += 4
    for r in range(i, n):
        y[r] = _dot(W, x, r, k) + b[r]


@njit(**_JIT)
def fc_row_sum(W, x, b, z, y, s):
    """fc_row's y, and s = y + z (the Sum after the FC; s may be y or z itself: each element is read before it
    is written)."""
    n, k = W.shape
    i = 0
    while i + 4 <= n:
        a0, a1, a2, a3 = _dot4(W, x, i, k)
        for r, a in ((i, a0), (i + 1, a1), (i + 2, a2), (i + 3, a3)):
            v = a + b[r]
            zr = z[r]
            y[r] = v
            s[r] = v + zr
        i += 4
    for r in range(i, n):
        v = _dot(W, x, r, k) + b[r]
        zr = z[r]
        y[r] = v
        s[r] = v + zr


@njit(inline="always", **_EXACT)
def _copy(dst, src):
    for j in range(src.size):
        dst[j] = src[j]


@njit(**_EXACT)
def gru_gates(x, pr, pu, br, bu, h, xr, xu, xo, r, u, s, mh, y, bits, mul):
    """Caffe2's GRU step up to its output product (n × d blocks; x: n × 3d): Split(x) into xr, xu, xo, the
    reset and update FCs' bias and Sum, r = (pr + br) + xr and u = (pu + bu) + xu (bias_sum_into's additions),
    s = σ(r) (sigmoid's pass, on scratch y and bits of n·d) and, with mul, mh = s·h (the reset-first layout's
    Mul): each value rounded as its op rounds it (no fast-math here; sigmoid keeps its own flags), so the bits
    are the ops'. pr, pu: the products, arrays of their own. Each loop touches few arrays, indexed by the loop
    variable alone, so LLVM vectorizes it (one loop over all of them ran scalar: its run-time overlap checks
    were too many)."""
    n, d = r.shape
    for i in range(n):
        xi = x[i]
        a, b, c = xi[:d], xi[d:2 * d], xi[2 * d:3 * d]
        xri, xui, xoi, ri, ui = xr[i], xu[i], xo[i], r[i], u[i]
        _copy(xri, a)
        _copy(xui, b)
        _copy(xoi, c)
        pri, pui = pr[i], pu[i]
        for j in range(d):
            ri[j] = (pri[j] + br[j]) + a[j]
        for j in range(d):
            ui[j] = (pui[j] + bu[j]) + b[j]
    sigmoid(r.ravel(), s.ravel(), y, bits)
    if mul:
        sf, hf, mf = s.ravel(), h.ravel(), mh.ravel()
        for k in range(sf.size):
            mf[k] = sf[k] * hf[k]


@njit(**_EXACT)
def gru_concat(po, bo, xo, r, u, o, os, gates, sizes, s, om, lbr):
    """The rest of the step before GRUUnit: the output FC's bias o = po + bo, its Sum os = o + xo (with lbr,
    linear_before_reset's om = s·o first and os = om + xo), and Concat's gates = [r, u, os] (n × 3d) with its
    part sizes (d, d, d)."""
    n, d = o.shape
    for i in range(n):
        oi, osi, poi, xoi, gi = o[i], os[i], po[i], xo[i], gates[i]
        for j in range(d):
            oi[j] = poi[j] + bo[j]
        if lbr:
            si, omi = s[i], om[i]
            for j in range(d):
                omi[j] = si[j] * oi[j]
            for j in range(d):
                osi[j] = omi[j] + xoi[j]
        else:
            for j in range(d):
                osi[j] = oi[j] + xoi[j]
        g0, g1, g2 = gi[:d], gi[d:2 * d], gi[2 * d:3 * d]
        _copy(g0, r[i])
        _copy(g1, u[i])
        _copy(g2, osi)
    for k in range(3):
        sizes[k] = d
