"""The GRU cell's arithmetic, once, for every runner (spec §4; Caffe2's gru_unit_op): GRUUnit over gates 1×N×3D
(order reset, update, output; the reset gate is applied to the recurrent term before this op, so it is not
read) and its gradient, written into outputs and scratch the caller gives (the interpreted kernels in
stepnet.ops.gru allocate them, the compiled forms pass their buffers), and the jitted variant."""
from __future__ import annotations

import functools

import numpy as np

from .activations import sigmoid_tanh_
from .jit import flat_views, via_scratch
from .seq_rows import Ended, bound_step, hold, past_end, timestep_of


def activations(xp, gates, d: int, u, o) -> None:
    """u = σ(the update block) as 0.5·tanh(x/2) + 0.5 and o = tanh(the output block), from gates 1×N×3D."""
    xp.multiply(gates[..., d:2 * d], gates.dtype.type(0.5), out=u)
    sigmoid_tanh_(xp, u)
    xp.tanh(gates[..., 2 * d:], out=o)


def forward(xp, h_prev, gates, drop: bool, ended, h, u, o):
    """h = h_prev·u + o·(1 − u), computed as o + u·(h_prev − o), into h (1×N×D); u, o: scratch 1×N×D.
    Returns h (a new array only where a device mask selects the ended rows)."""
    activations(xp, gates, h_prev.shape[-1], u, o)
    xp.subtract(h_prev, o, out=h)
    h *= u
    h += o
    return hold(xp, ended, drop, (h, h_prev))[0]


def backward(xp, h_prev, gates, dh, drop: bool, ended, dh_prev, dgates, u, o, omu):
    """dh_prev = dH·u, du = dH·(h_prev − o)·u·(1 − u), do = dH·(1 − u)·(1 − o²) and a zero reset-gate gradient,
    into dh_prev (1×N×D) and dgates (1×N×3D); u, o, omu: scratch 1×N×D. Ended rows: zero gate gradients and
    dh_prev = dH (0 with drop). Returns (dh_prev, dgates)."""
    d = h_prev.shape[-1]
    one = gates.dtype.type(1)
    activations(xp, gates, d, u, o)
    xp.subtract(one, u, out=omu)
    dgates[..., :d] = 0
    block = dgates[..., d:2 * d]
    xp.subtract(h_prev, o, out=block)
    block *= dh
    block *= u
    block *= omu
    block = dgates[..., 2 * d:]
    xp.multiply(o, o, out=block)
    xp.subtract(one, block, out=block)
    block *= omu
    block *= dh
    xp.multiply(dh, u, out=dh_prev)
    if ended is None:
        return dh_prev, dgates
    return hold(xp, ended, drop, (dh_prev, dh))[0], ended.patch(xp, dgates)


# ------------------------------------------------------------------------------------------- jitted variant
def jit_step(k, drop: bool, has_seq: bool, n: int, d: int):
    state, ended_at = (1, n, d), Ended()

    def ends(ins, outs) -> None:
        ended = past_end(np, ins[2], ins[-1], n, ended_at)
        if ended is not None:
            hold(np, ended, drop, (outs[0].reshape(state), ins[0].reshape(state)))

    def run(ins, outs):
        h = outs[0]
        if not h.flags.c_contiguous:
            return via_scratch(run, ins, outs)
        k.gru_forward(ins[0].ravel(), ins[1].ravel(), h.ravel(), n, d)
        if has_seq:
            ends(ins, outs)

    def bind(ins, outs):
        flat = flat_views([ins[0], ins[1], outs[0]])
        if flat is None:
            return None
        return bound_step(k.gru_forward, (*flat, n, d), ended_at, timestep_of(ins[-1]) if has_seq else 0,
                          functools.partial(ends, ins, outs) if has_seq else None)
    return run, ended_at, bind


def jit_grad_step(k, drop: bool, has_seq: bool, n: int, d: int):
    state, ended_at, t_at = (1, n, d), Ended(), 3 if has_seq else 2

    def ends(ins, outs) -> None:
        ended = past_end(np, ins[2], ins[t_at], n, ended_at)
        if ended is not None:
            ended.patch(np, outs[1].reshape(1, n, 3 * d))
            hold(np, ended, drop, (outs[0].reshape(state), ins[-1].reshape(state)))

    def run(ins, outs):
        dh_prev, dgates = outs
        if not (dh_prev.flags.c_contiguous and dgates.flags.c_contiguous):
            return via_scratch(run, ins, outs)
        k.gru_backward(ins[0].ravel(), ins[1].ravel(), ins[-1].ravel(), dh_prev.ravel(), dgates.ravel(), n, d)
        if has_seq:
            ends(ins, outs)

    def bind(ins, outs):
        flat = flat_views([ins[0], ins[1], ins[-1], outs[0], outs[1]])
        if flat is None:
            return None
        return bound_step(k.gru_backward, (*flat, n, d), ended_at, timestep_of(ins[t_at]) if has_seq else 0,
                          functools.partial(ends, ins, outs) if has_seq else None)
    return run, ended_at, bind
