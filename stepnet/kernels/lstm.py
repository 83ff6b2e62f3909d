"""The LSTM cell's arithmetic, once, for every runner (spec §4; Caffe2's lstm_unit_op): one timestep forward
(LSTMUnit) and backward (LSTMUnitGradient) over gates 1×N×4D (order i, f, o, g) and states 1×N×D, written into
outputs and scratch the caller gives. The interpreted kernels (stepnet.ops.lstm) allocate them per call; the
compiled forms (stepnet.compiled.cell_forms) allocate them once and pass the state rows themselves. The jitted
variant (`jit_step`, `jit_grad_step`: numba's one pass per op, kernels/jitted.py) is the other arithmetic a
workspace may choose; both runners call it the same way too.

Activations are kept block-major (4 × N × D: σ(i), σ(f + forget_bias), σ(o), tanh(g)), so that every
element-wise pass runs on contiguous memory; the backward step recomputes tanh(c) from the cell state, as torch's
LSTM does, rather than keeping a fifth block per timestep."""
from __future__ import annotations

import functools

import numpy as np

from .activations import sigmoid_tanh_
from .jit import F32, flat_views, via_scratch
from .seq_rows import Ended, bound_step, hold, past_end, timestep_of


def gate_activations(xp, gates, n: int, d: int, forget_bias: float, acts) -> None:
    """acts[:4] = σ(i), σ(f + forget_bias), σ(o) (as 0.5·tanh(x/2) + 0.5) and tanh(g), from gates 1×N×4D."""
    dt = gates.dtype.type
    half = dt(0.5)
    blocks = gates.reshape(n, 4, d).transpose(1, 0, 2)
    sig = acts[:3]
    xp.multiply(blocks[:3], half, out=sig)
    if forget_bias:
        sig[1] += dt(forget_bias) * half
    sigmoid_tanh_(xp, sig)
    xp.tanh(blocks[3], out=acts[3])


def forward(xp, gates, h_prev, c_prev, forget_bias: float, drop: bool, ended, h, c, acts, tmp):
    """One step into h, c (1×N×D) and acts (4×N×D); tmp: N×D scratch. ended: the
    rows past their length (seq_rows.past_end) or None. Returns (h, c): the outputs (new arrays only where a
    device mask selects the ended rows)."""
    _, n, d = c_prev.shape
    h2, c2 = h.reshape(n, d), c.reshape(n, d)
    gate_activations(xp, gates, n, d, forget_bias, acts)
    xp.multiply(acts[0], acts[3], out=c2)                 # c = σ(i)·tanh(g) + σ(f)·c_prev
    xp.multiply(acts[1], c_prev.reshape(n, d), out=tmp)
    c2 += tmp
    xp.tanh(c2, out=h2)                                   # h = σ(o)·tanh(c)
    h2 *= acts[2]
    return tuple(hold(xp, ended, drop, (h, h_prev), (c, c_prev)))


def backward(xp, acts, tanh_c, c_prev, dh, dc, drop: bool, ended, dh_prev, dc_prev, dgates, dc_total, grads, dsig):
    """One step's gradients into dh_prev, dc_prev (1×N×D) and dgates (1×N×4D), from the activations (≥ 4×N×D)
    and tanh(c) (N×D); scratch: dc_total (N×D), grads (4×N×D), dsig (3×N×D). Valid rows: dc = dC + dH·o·
    (1 − tanh²c), dc_prev = dc·f, gate gradients through the activations, dh_prev = 0 (h_prev reaches the cell
    only through the gates' FC). Ended rows: zero gate gradients, dh_prev = dH, dc_prev = dC (0 with drop).
    Returns (dh_prev, dc_prev, dgates)."""
    _, n, d = acts.shape
    one = acts.dtype.type(1)
    i, f, o, g = acts[0], acts[1], acts[2], acts[3]
    c_prev2, dh2 = c_prev.reshape(n, d), dh.reshape(n, d)
    xp.multiply(tanh_c, tanh_c, out=dc_total)
    xp.subtract(one, dc_total, out=dc_total)
    dc_total *= o
    dc_total *= dh2
    dc_total += dc.reshape(n, d)
    xp.multiply(dc_total, g, out=grads[0])                # di = dc·g·σ'(i)
    xp.multiply(dc_total, c_prev2, out=grads[1])          # df = dc·c_prev·σ'(f)
    xp.multiply(dh2, tanh_c, out=grads[2])                # do = dH·tanh(c)·σ'(o)
    xp.subtract(one, acts[:3], out=dsig)                  # σ' = σ(1 − σ), the three sigmoid blocks at once
    dsig *= acts[:3]
    grads[:3] *= dsig
    dg = grads[3]                                         # dg = dc·i·(1 − g²)
    xp.multiply(g, g, out=dg)
    xp.subtract(one, dg, out=dg)
    dg *= i
    dg *= dc_total
    # contiguous scratch, then one copy: the passes above on the strided gate blocks of dgates itself measured
    # 1.4x slower at N=32 (numpy iterates the N rows of each block)
    dgates.reshape(n, 4, d)[...] = grads.transpose(1, 0, 2)
    xp.multiply(dc_total, f, out=dc_prev.reshape(n, d))
    dh_prev.fill(0)
    if ended is None:
        return dh_prev, dc_prev, dgates
    dgates = ended.patch(xp, dgates)
    dh_prev, dc_prev = hold(xp, ended, drop, (dh_prev, dh), (dc_prev, dc))
    return dh_prev, dc_prev, dgates


# ------------------------------------------------------------------------------------------- jitted variant
# jit_step(k, saving, forget_bias, drop, has_seq, n, d) -> (run(ins, outs), Ended, bind(ins, outs)): ins and outs
# in the op's order, float32 host arrays, states 1×N×D; k: the jitted module (jit.load()). bind -> call() | None:
# run on these very arrays with the flattening and the layout checks done once (None: one is not C-contiguous).

def jit_step(k, saving: bool, fb: float, drop: bool, has_seq: bool, n: int, d: int):
    fbh, ended_at, unused = np.float32(fb) * np.float32(0.5), Ended(), np.empty(1, F32)
    state = (1, n, d)

    def ends(ins, outs) -> None:
        ended = past_end(np, ins[3], ins[-1], n, ended_at)
        if ended is not None:
            hold(np, ended, drop, (outs[0].reshape(state), ins[0].reshape(state)),
                 (outs[1].reshape(state), ins[1].reshape(state)))

    def run(ins, outs):
        h, c = outs[0], outs[1]
        if not (h.flags.c_contiguous and c.flags.c_contiguous) or (saving and not outs[2].flags.c_contiguous):
            return via_scratch(run, ins, outs)
        k.lstm_forward(ins[2].ravel(), ins[1].ravel(), fbh, h.ravel(), c.ravel(),
                       outs[2].ravel() if saving else unused, saving, n, d)
        if has_seq:
            ends(ins, outs)

    def bind(ins, outs):
        flat = flat_views([ins[2], ins[1], outs[0], outs[1], *outs[2:3 if saving else 2]])
        if flat is None:
            return None
        g, c_prev, h, c, acts = *flat[:4], (flat[4] if saving else unused)
        t, held = (timestep_of(ins[-1]), functools.partial(ends, ins, outs)) if has_seq else (0, None)
        return bound_step(k.lstm_forward, (g, c_prev, fbh, h, c, acts, saving, n, d), ended_at, t, held)
    return run, ended_at, bind


def read_first(acts, dgates, own):
    """The saved activations as a gradient step may read them while it writes the gate gradients dgates: a copy
    in own (acts' shape) where the two share memory (the op's input gradient written over step t's activations,
    in the same rows), else acts itself."""
    if np.may_share_memory(acts, dgates):
        np.copyto(own, acts)
        return own
    return acts


def jit_grad_step(k, saved: bool, fb: float, drop: bool, has_seq: bool, n: int, d: int):
    fbh, ended_at = np.float32(fb) * np.float32(0.5), Ended()
    own = np.empty(4 * n * d, F32)
    t_at, state = 4 if has_seq else 3, (1, n, d)

    def ends(ins, outs) -> None:
        ended = past_end(np, ins[3], ins[t_at], n, ended_at)
        if ended is not None:
            ended.patch(np, outs[2].reshape(1, n, 4 * d))
            hold(np, ended, drop, (outs[0].reshape(state), ins[-2].reshape(state)),
                 (outs[1].reshape(state), ins[-1].reshape(state)))

    def run(ins, outs):
        dh_prev, dc_prev, dgates = outs
        if not (dh_prev.flags.c_contiguous and dc_prev.flags.c_contiguous and dgates.flags.c_contiguous):
            return via_scratch(run, ins, outs)
        acts = ins[2].ravel()
        if not saved:
            k.lstm_activations(acts, fbh, own, n, d)
            acts = own
        else:
            acts = read_first(acts, dgates, own)
        k.lstm_backward(acts, ins[-3].ravel(), ins[1].ravel(), ins[-2].ravel(), ins[-1].ravel(), dgates.ravel(),
                        dh_prev.ravel(), dc_prev.ravel(), n, d)
        if has_seq:
            ends(ins, outs)

    def bind(ins, outs):
        flat = flat_views([ins[2], ins[-3], ins[1], ins[-2], ins[-1], outs[2], outs[0], outs[1]])
        if flat is None:
            return None
        acts, rest = flat[0], flat[1:]
        copy = saved and np.may_share_memory(acts, outs[2])     # (read_first's test, for these arrays)
        backward, activations = k.lstm_backward, k.lstm_activations

        def step():
            if not saved:
                activations(acts, fbh, own, n, d)
            elif copy:
                np.copyto(own, acts)
            backward(own if copy or not saved else acts, *rest, n, d)
        t, held = (timestep_of(ins[t_at]), functools.partial(ends, ins, outs)) if has_seq else (0, None)
        return bound_step(step, (), ended_at, t, held)
    return run, ended_at, bind
