"""Compiled forms of the LSTM cell ops (LSTMUnit, rnn_internal_lstm_unit and their gradients): the kernels of
ops/lstm.py with every pass writing into the output views (the state rows of the link windows) or into scratch
allocated once, the same operations in the same order, so results are bit-identical."""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_minimum = np.minimum.reduce


class Fast(NamedTuple):
    """fn(ins, outs): the op on input arrays, writing its output arrays (or, with `blobs`, setting its output
    Blobs itself: the link op). rebind(bop) -> fn: the same form on another step workspace's bound op (for
    forms that call the bound kernel). fuse(later_bop, ins, outs) -> Fast | None: a form of this op and a later
    one together (its fn takes both ops' inputs, then both ops' outputs), where it has one."""
    fn: Callable
    blobs: bool = False
    rebind: Callable | None = None
    begin: tuple | None = None   # (input index, fn(array)): called once per run with that input's array
    fuse: Callable | None = None


def _begin(ended, index: int, has_seq: bool) -> tuple | None:
    return (index, ended.begin) if has_seq else None


def bound_args(bop) -> dict:
    """The arguments a bound op's kernel is called with."""
    call = bop.plain
    return getattr(call, "call", call).keywords   # executor.Specialized keeps the plain call


def same_floats(*arrays) -> bool:
    """Whether the arrays share one float dtype (float32 or float64)."""
    dt = arrays[0].dtype
    return dt in FLOATS and all(a.dtype == dt for a in arrays)


def shaped(out, shape):
    """out seen with `shape` (a view: compiled outputs are contiguous)."""
    return out if out.shape == shape else out.reshape(shape)


def _args(bop):
    a = bound_args(bop)
    return float(a["forget_bias"]), bool(a["drop_states"]), bool(a["sequence_lengths"])


class _Ended:
    """Indices of the batch rows whose sequence has ended at a timestep, or None. `begin(seq)`, called once per
    run with the run's seq_lengths (Fast.begin), records the shortest length, so a timestep before it costs one
    comparison; without it (the step net writes seq_lengths itself) every timestep checks the lengths."""
    __slots__ = ("before",)

    def __init__(self):
        self.before = 0

    def begin(self, seq) -> None:
        if seq.dtype != np.int32 or not seq.size:
            self.before = 0
        else:
            self.before = seq.item() if seq.size == 1 else int(_minimum(seq, axis=None))

    def __call__(self, seq, timestep):
        if seq is None or not seq.size:
            return None
        t = timestep.item() if timestep.size == 1 else int(timestep.flat[0])
        if t < self.before:
            return None
        if seq.size == 1:                     # B=1 (sampling): no temporary arrays
            return None if int(seq.flat[0]) > t else np.zeros(1, np.intp)
        if _minimum(seq, axis=None) > t:      # no sequence has ended: one reduction, no temporaries
            return None
        return np.flatnonzero(seq.reshape(-1) <= t)


def _fits(ins, outs, n_in: int, states, blocks_shape) -> bool:
    """The well-formed case the compiled form handles: 1×N×D float states, gates/activations of blocks_shape,
    int32 seq_lengths and timestep on the host, outputs of the right sizes."""
    if len(ins) != n_in:
        return False
    ref = ins[states[0]]
    if ref.ndim != 3 or ref.shape[0] != 1 or ref.dtype not in FLOATS:
        return False
    if any(ins[i].shape != ref.shape or ins[i].dtype != ref.dtype for i in states):
        return False
    g = ins[2]
    if g.shape != blocks_shape(ref.shape[1], ref.shape[2]) or g.dtype != ref.dtype:
        return False
    host = ins[3:n_in - 4] if n_in in (8, 9) else ins[3:]
    if any(type(x) is not np.ndarray or x.dtype != np.int32 for x in host):
        return False
    return all(o.dtype == ref.dtype for o in outs)


def lstm_params(bop, ins, outs, saving: bool) -> tuple | None:
    """(forget_bias, drop_states, has_seq, N, D) of an LSTMUnit (saving: rnn_internal_lstm_unit) whose arrays
    the compiled forms handle, else None."""
    fb, drop, has_seq = _args(bop)
    if not _fits(ins, outs, 5 if has_seq else 4, (0, 1), lambda n, d: (1, n, 4 * d)):
        return None
    _, n, d = ins[0].shape
    if outs[0].size != n * d or outs[1].size != n * d or (saving and outs[2].shape != (5, n, d)):
        return None
    return fb, drop, has_seq, n, d


def lstm_grad_params(bop, ins, outs, saved: bool) -> tuple | None:
    """(forget_bias, drop_states, has_seq, N, D) of an LSTMUnitGradient (saved: its saved-activation form) whose
    arrays the compiled forms handle, else None."""
    fb, drop, has_seq = _args(bop)
    n_in = 9 if has_seq else 8
    blocks = (lambda n, d: (5, n, d)) if saved else (lambda n, d: (1, n, 4 * d))
    if not _fits(ins, outs, n_in, (0, 1, n_in - 4, n_in - 3, n_in - 2, n_in - 1), blocks):
        return None
    _, n, d = ins[0].shape
    if outs[0].size != n * d or outs[1].size != n * d or outs[2].size != 4 * n * d:
        return None
    return fb, drop, has_seq, n, d


def lstm_unit(saving: bool):
    def make(bop, ins, outs):
        params = lstm_params(bop, ins, outs, saving)
        if params is None:
            return None
        fb, drop, has_seq, n, d = params
        dt = ins[0].dtype
        half, fbh = dt.type(0.5), dt.type(fb) * dt.type(0.5)
        tmp, own = np.empty((n, d), dt), (None if saving else np.empty((4, n, d), dt))
        nd, state, _ended = (n, d), (1, n, d), _Ended()

        def run(ins, outs):
            h_prev, c_prev, gates = ins[0], ins[1], ins[2]
            hv, cv = outs[0].reshape(state), outs[1].reshape(state)
            h, c = hv.reshape(nd), cv.reshape(nd)
            acts = outs[2] if saving else own
            _gate_activations(gates.reshape(n, 4, d).transpose(1, 0, 2), acts, half, fbh)
            np.multiply(acts[0], acts[3], out=c)
            np.multiply(acts[1], c_prev.reshape(nd), out=tmp)
            c += tmp
            if saving:
                np.tanh(c, out=acts[4])
                np.multiply(acts[4], acts[2], out=h)
            else:
                np.tanh(c, out=h)
                h *= acts[2]
            ended = _ended(ins[3] if has_seq else None, ins[-1])
            if ended is not None:
                hv[:, ended] = 0 if drop else h_prev.reshape(state)[:, ended]
                cv[:, ended] = 0 if drop else c_prev.reshape(state)[:, ended]
        return run, _begin(_ended, 3, has_seq)
    return _fast(make)


def _gate_activations(blocks, acts, half, fbh) -> None:
    """acts[:3] = σ(i), σ(f + forget_bias), σ(o) as 0.5·tanh(x/2) + 0.5, and acts[3] = tanh(g), from the gate
    blocks (4, N, D); fbh is forget_bias / 2."""
    sig = acts[:3]
    np.multiply(blocks[:3], half, out=sig)
    if fbh:
        sig[1] += fbh
    np.tanh(sig, out=sig)
    sig *= half
    sig += half
    np.tanh(blocks[3], out=acts[3])


def lstm_unit_gradient(saved: bool):
    def make(bop, ins, outs):
        params = lstm_grad_params(bop, ins, outs, saved)
        if params is None:
            return None
        fb, drop, has_seq, n, d = params
        n_in = 9 if has_seq else 8
        dt = ins[0].dtype
        one, half, fbh = dt.type(1), dt.type(0.5), dt.type(fb) * dt.type(0.5)
        dct, grads, dsig = np.empty((n, d), dt), np.empty((4, n, d), dt), np.empty((3, n, d), dt)
        own = None if saved else np.empty((5, n, d), dt)
        nd, state, _ended = (n, d), (1, n, d), _Ended()

        def activations(gates, c):
            """acts (σ(i), σ(f + forget_bias), σ(o), tanh(g), tanh(c)) from the gates, as the kernel does."""
            _gate_activations(gates.reshape(n, 4, d).transpose(1, 0, 2), own, half, fbh)
            np.tanh(c.reshape(nd), out=own[4])
            return own

        def run(ins, outs):
            c_prev, dh, dc = ins[1].reshape(nd), ins[-2].reshape(nd), ins[-1].reshape(nd)
            acts = ins[2] if saved else activations(ins[2], ins[-3])
            dc_total = dct
            i, f, o, g, tanh_c = acts[0], acts[1], acts[2], acts[3], acts[4]
            np.multiply(tanh_c, tanh_c, out=dc_total)
            np.subtract(one, dc_total, out=dc_total)
            dc_total *= o
            dc_total *= dh
            dc_total += dc
            np.multiply(dc_total, g, out=grads[0])
            np.multiply(dc_total, c_prev, out=grads[1])
            np.multiply(dh, tanh_c, out=grads[2])
            np.subtract(one, acts[:3], out=dsig)
            np.multiply(dsig, acts[:3], out=dsig)
            grads[:3] *= dsig
            dg = grads[3]
            np.multiply(g, g, out=dg)
            np.subtract(one, dg, out=dg)
            dg *= i
            dg *= dc_total
            dh_prev, dc_prev = outs[0].reshape(state), outs[1].reshape(state)
            dgates = outs[2].reshape(1, n, 4 * d)
            # contiguous scratch, then one copy: the passes above on the strided gate blocks of dgates itself
            # measured 1.4x slower at N=32 (numpy iterates the N rows of each block)
            np.copyto(dgates.reshape(n, 4, d), grads.transpose(1, 0, 2))
            np.multiply(dc_total, f, out=dc_prev.reshape(nd))
            dh_prev.fill(0)
            ended = _ended(ins[3] if has_seq else None, ins[n_in - 5])
            if ended is not None:
                dgates[:, ended] = 0
                dh_prev[:, ended] = 0 if drop else ins[-2].reshape(state)[:, ended]
                dc_prev[:, ended] = 0 if drop else ins[-1].reshape(state)[:, ended]
        return run, _begin(_ended, 3, has_seq)
    return _fast(make)


def _fast(make):
    def wrapped(bop, ins, outs):
        made = make(bop, ins, outs)
        return None if made is None else Fast(made[0], begin=made[1])
    return wrapped


def _gru_fits(ins, outs, n_in: int, states) -> bool:
    """1×N×D float states, 1×N×3D gates of their dtype, int32 host seq_lengths/timestep, outputs' dtypes."""
    if len(ins) != n_in:
        return False
    ref, g = ins[0], ins[1]
    if ref.ndim != 3 or ref.shape[0] != 1 or ref.dtype not in FLOATS or g.dtype != ref.dtype:
        return False
    if g.shape != (1, ref.shape[1], 3 * ref.shape[2]) or any(ins[i].shape != ref.shape for i in states):
        return False
    if any(ins[i].dtype != ref.dtype for i in states) or any(o.dtype != ref.dtype for o in outs):
        return False
    host = ins[2:n_in - len(states) + 1]
    return all(type(x) is np.ndarray and x.dtype == np.int32 for x in host)


def _gru_args(bop):
    a = bound_args(bop)
    return bool(a["drop_states"]), bool(a["sequence_lengths"])


def gru_params(bop, ins, outs) -> tuple | None:
    """(drop_states, has_seq, N, D) of a GRUUnit whose arrays the compiled forms handle, else None."""
    drop, has_seq = _gru_args(bop)
    if not _gru_fits(ins, outs, 4 if has_seq else 3, (0,)) or outs[0].size != ins[0].size:
        return None
    return drop, has_seq, *ins[0].shape[1:]


def gru_grad_params(bop, ins, outs) -> tuple | None:
    """(drop_states, has_seq, N, D) of a GRUUnitGradient whose arrays the compiled forms handle, else None."""
    drop, has_seq = _gru_args(bop)
    n_in = 6 if has_seq else 5
    if not _gru_fits(ins, outs, n_in, (0, n_in - 2, n_in - 1)) or outs[0].size != ins[0].size \
            or outs[1].size != ins[1].size:
        return None
    return drop, has_seq, *ins[0].shape[1:]


def gru_unit(bop, ins, outs):
    """GRUUnit's passes (σ(u) through tanh, tanh(o), h = out + u·(h_prev − out)) into scratch and the output."""
    params = gru_params(bop, ins, outs)
    if params is None:
        return None
    drop, has_seq, n, d = params
    dt = ins[0].dtype
    half, state, _ended = dt.type(0.5), (1, n, d), _Ended()
    u, o = np.empty(state, dt), np.empty(state, dt)

    def run(ins, outs):
        h_prev, gates = ins[0], ins[1]
        h = outs[0].reshape(state)
        _gru_activations(gates, d, half, u, o)
        np.subtract(h_prev, o, out=h)
        h *= u
        h += o
        ended = _ended(ins[2] if has_seq else None, ins[-1])
        if ended is not None:
            h[:, ended] = 0 if drop else h_prev[:, ended]
    return Fast(run, begin=_begin(_ended, 2, has_seq))


def _gru_activations(gates, d: int, half, u, o) -> None:
    """u = σ(the update block) as 0.5·tanh(x/2) + 0.5 and o = tanh(the output block), from gates (1, N, 3D)."""
    np.multiply(gates[..., d:2 * d], half, out=u)
    np.tanh(u, out=u)
    np.multiply(u, half, out=u)
    np.add(u, half, out=u)
    np.tanh(gates[..., 2 * d:], out=o)


def gru_unit_gradient(bop, ins, outs):
    """GRUUnitGradient's passes into scratch and the outputs (dh_prev, dgates)."""
    params = gru_grad_params(bop, ins, outs)
    if params is None:
        return None
    drop, has_seq, n, d = params
    n_in = 6 if has_seq else 5
    dt = ins[0].dtype
    one, zero, half, state, _ended = dt.type(1), dt.type(0), dt.type(0.5), (1, n, d), _Ended()
    u, o, omu = np.empty(state, dt), np.empty(state, dt), np.empty(state, dt)

    def run(ins, outs):
        h_prev, gates, dh = ins[0], ins[1], ins[-1]
        dh_prev, dgates = outs[0].reshape(state), outs[1].reshape(1, n, 3 * d)
        _gru_activations(gates, d, half, u, o)
        np.subtract(one, u, out=omu)
        dgates[..., :d] = zero
        block = dgates[..., d:2 * d]            # du = dH·(h_prev − out)·u·(1 − u)
        np.subtract(h_prev, o, out=block)
        block *= dh
        block *= u
        block *= omu
        block = dgates[..., 2 * d:]             # do = dH·(1 − u)·(1 − out²)
        np.multiply(o, o, out=block)
        np.subtract(one, block, out=block)
        block *= omu
        block *= dh
        np.multiply(dh, u, out=dh_prev)
        ended = _ended(ins[2] if has_seq else None, ins[n_in - 3])
        if ended is not None:
            dh_prev[:, ended] = 0 if drop else dh[:, ended]
            dgates[:, ended] = 0
    return Fast(run, begin=_begin(_ended, 2, has_seq))
