"""numba's LSTM and GRU cell kernels (the `fast` extra; re-exported by kernels/jitted.py, which the runners load
through stepnet.kernels.jit.load()): one pass over the batch rows per step op, float32 only. Arrays arrive flat
(C-contiguous views); n rows of d.

Each kernel computes a row into scratch it allocated itself, then copies the scratch into its outputs. Written
straight into the outputs, LLVM guards the vectorized loop with run-time overlap checks between the arrays,
which failed for some placements of the arrays in memory (adjacent state rows, neighbouring buffers) and fell
back to scalar code: the same kernel took 12 or 57 µs at n=32, d=128 by where numpy had put its arrays. Stores
into the kernel's own allocation need no check. Each row's blocks are slices indexed by the loop variable alone
(_part): an index such as gates[gb + 2·d + j] is a signed sum numba must wrap when negative, and that
per-element select kept LLVM from vectorizing the loops well (the same arithmetic, the same bits, ran 1.4–3×
slower).

tanh is Eigen's float32 rational approximation (a 13th/6th-degree ratio of polynomials in x, clamped at ±7.905:
under 3e-7 from the exact tanh), written out so that LLVM vectorizes the loops; numba's own tanh is a scalar
libm call per element. σ(x) = 0.5·tanh(x/2) + 0.5, as the numpy kernels compute it. fastmath without
'nnan'/'ninf': a NaN or inf in the gates propagates as it does in numpy."""
from __future__ import annotations

import numpy as np
from numba import float32, njit

_FLAGS = {"contract", "arcp", "nsz", "reassoc"}
_JIT = {"fastmath": _FLAGS, "boundscheck": False, "error_model": "numpy", "cache": True}
_CLAMP = float32(7.90531110763549805)


@njit(inline="always", **_JIT)
def tanh32(x):
    if x > _CLAMP:
        x = _CLAMP
    elif x < -_CLAMP:
        x = -_CLAMP
    x2 = x * x
    p = float32(-2.76076847742355e-16)
    p = p * x2 + float32(2.00018790482477e-13)
    p = p * x2 + float32(-8.60467152213735e-11)
    p = p * x2 + float32(5.12229709037114e-08)
    p = p * x2 + float32(1.48572235717979e-05)
    p = p * x2 + float32(6.37261928875436e-04)
    p = p * x2 + float32(4.89352455891786e-03)
    q = float32(1.19825839466702e-06)
    q = q * x2 + float32(1.18534705686654e-04)
    q = q * x2 + float32(2.26843463243900e-03)
    q = q * x2 + float32(4.89352518554385e-03)
    return x * p / q


@njit(inline="always", **_JIT)
def _sigmoid(x, shift):
    return float32(0.5) * tanh32(x * float32(0.5) + shift) + float32(0.5)


@njit(**_JIT)
def tanh_into(x, out):
    """out = tanh(x), elementwise (the approximation on its own)."""
    for k in range(x.size):
        out[k] = tanh32(x[k])


@njit(inline="always", **_JIT)
def _part(a, start, step, m, d):
    """a[start + m·step:][:d], the m-th block of a row: the loops below index such slices by their loop variable
    alone (see the module doc)."""
    at = start + m * step
    return a[at:at + d]


@njit(inline="always", **_JIT)
def _four(a, start, step, d):
    """Blocks 0..3 of a row (_part)."""
    return _part(a, start, step, 0, d), _part(a, start, step, 1, d), _part(a, start, step, 2, d), \
        _part(a, start, step, 3, d)


@njit(**_JIT)
def lstm_forward(gates, c_prev, fbh, h, c, acts, save, n, d):
    """c = σ(i)·tanh(g) + σ(f + forget_bias)·c_prev, h = σ(o)·tanh(c) from gates (n, 4d) in blocks i, f, o, g
    (fbh = forget_bias / 2); with save, acts (4 blocks of n·d) = σ(i), σ(f + fb), σ(o), tanh(g)."""
    zero, nd = float32(0), n * d
    row = np.empty((7, d), np.float32)
    r0, r1, r2, r3, r4, r5, r6 = row[0], row[1], row[2], row[3], row[4], row[5], row[6]
    for r in range(n):
        gb, ob = r * 4 * d, r * d
        gi, gf, go, gg = _four(gates, gb, d, d)
        cp = c_prev[ob:ob + d]
        for j in range(d):
            i = _sigmoid(gi[j], zero)
            f = _sigmoid(gf[j], fbh)
            o = _sigmoid(go[j], zero)
            g = tanh32(gg[j])
            cc = i * g + f * cp[j]
            tc = tanh32(cc)
            r0[j], r1[j], r2[j], r3[j], r4[j] = i, f, o, g, tc
            r5[j], r6[j] = cc, tc * o
        cr, hr = c[ob:ob + d], h[ob:ob + d]
        for j in range(d):
            cr[j] = r5[j]
            hr[j] = r6[j]
        if save:
            for m in range(4):
                dst, src = _part(acts, ob, nd, m, d), row[m]
                for j in range(d):
                    dst[j] = src[j]


@njit(**_JIT)
def lstm_activations(gates, fbh, acts, n, d):
    """acts (4 blocks of n·d) from gates (n, 4d): what lstm_forward saves."""
    zero, nd = float32(0), n * d
    row = np.empty((4, d), np.float32)
    r0, r1, r2, r3 = row[0], row[1], row[2], row[3]
    for r in range(n):
        gb, ob = r * 4 * d, r * d
        gi, gf, go, gg = _four(gates, gb, d, d)
        for j in range(d):
            r0[j] = _sigmoid(gi[j], zero)
            r1[j] = _sigmoid(gf[j], fbh)
            r2[j] = _sigmoid(go[j], zero)
            r3[j] = tanh32(gg[j])
        for m in range(4):
            dst, src = _part(acts, ob, nd, m, d), row[m]
            for j in range(d):
                dst[j] = src[j]


@njit(**_JIT)
def lstm_backward(acts, c, c_prev, dh, dc, dgates, dh_prev, dc_prev, n, d):
    """LSTMUnitGradient from the activations and the step's cell state c (tanh(c) recomputed, as the forward
    computed it): dgates (n, 4d) in blocks i, f, o, g, dc_prev, and dh_prev = 0."""
    one, nd = float32(1), n * d
    row = np.empty((5, d), np.float32)
    r0, r1, r2, r3, r4 = row[0], row[1], row[2], row[3], row[4]
    for r in range(n):
        gb, ob = r * 4 * d, r * d
        ai, af, ao, ag = _four(acts, ob, nd, d)
        cr, cpr, dhr, dcr = c[ob:ob + d], c_prev[ob:ob + d], dh[ob:ob + d], dc[ob:ob + d]
        for j in range(d):
            i, f, o, g, tc = ai[j], af[j], ao[j], ag[j], tanh32(cr[j])
            dct = (one - tc * tc) * o * dhr[j] + dcr[j]
            r0[j] = dct * g * ((one - i) * i)
            r1[j] = dct * cpr[j] * ((one - f) * f)
            r2[j] = dhr[j] * tc * ((one - o) * o)
            r3[j] = (one - g * g) * i * dct
            r4[j] = dct * f
        for m in range(4):
            dst, src = _part(dgates, gb, d, m, d), row[m]
            for j in range(d):
                dst[j] = src[j]
        dcp, dhp = dc_prev[ob:ob + d], dh_prev[ob:ob + d]
        for j in range(d):
            dcp[j] = r4[j]
            dhp[j] = float32(0)


@njit(**_JIT)
def gru_forward(h_prev, gates, h, n, d):
    """h = (h_prev − tanh(o))·σ(u) + tanh(o) from gates (n, 3d) in blocks r, u, o (GRUUnit; r was used before)."""
    zero = float32(0)
    row = np.empty(d, np.float32)
    for r in range(n):
        gb, ob = r * 3 * d, r * d
        gu, go, hp = _part(gates, gb, d, 1, d), _part(gates, gb, d, 2, d), h_prev[ob:ob + d]
        for j in range(d):
            u = _sigmoid(gu[j], zero)
            o = tanh32(go[j])
            row[j] = (hp[j] - o) * u + o
        hr = h[ob:ob + d]
        for j in range(d):
            hr[j] = row[j]


@njit(**_JIT)
def gru_backward(h_prev, gates, dh, dh_prev, dgates, n, d):
    """GRUUnitGradient: dgates (n, 3d) = 0, dh·(h_prev − o)·u·(1 − u), dh·(1 − u)·(1 − o²); dh_prev = dh·u."""
    zero, one = float32(0), float32(1)
    row = np.empty((3, d), np.float32)
    r0, r1, r2 = row[0], row[1], row[2]
    for r in range(n):
        gb, ob = r * 3 * d, r * d
        gu, go, hp, dhr = _part(gates, gb, d, 1, d), _part(gates, gb, d, 2, d), h_prev[ob:ob + d], dh[ob:ob + d]
        for j in range(d):
            u = _sigmoid(gu[j], zero)
            o = tanh32(go[j])
            r0[j] = (hp[j] - o) * dhr[j] * u * (one - u)
            r1[j] = (one - o * o) * (one - u) * dhr[j]
            r2[j] = dhr[j] * u
        g0, g1, g2, dhp = _part(dgates, gb, d, 0, d), _part(dgates, gb, d, 1, d), _part(dgates, gb, d, 2, d), \
            dh_prev[ob:ob + d]
        for j in range(d):
            g0[j] = zero
            g1[j] = r0[j]
            g2[j] = r1[j]
            dhp[j] = r2[j]
