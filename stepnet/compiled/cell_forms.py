"""Compiled forms of the cell ops (LSTMUnit, rnn_internal_lstm_unit, GRUUnit and their gradients): the cell
arithmetic of stepnet.kernels.lstm / .gru, the one the interpreted kernels call, writing into the output views
(the state rows of the link windows) and into scratch allocated once per signature. The checks that depend
only on shapes, dtypes and arguments are made here, once."""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from ..kernels import gru as gru_cell
from ..kernels import lstm as lstm_cell
from ..kernels.seq_rows import Ended, past_end

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


class Fast(NamedTuple):
    """fn(ins, outs): the op on input arrays, writing its output arrays (or, with `blobs`, setting its output
    Blobs itself: the link op). rebind(bop) -> fn: the same form on another step workspace's bound op (for
    forms that call the bound kernel). fuse(later_bop, ins, outs) -> Fast | None: a form of this op and a later
    one together (its fn takes both ops' inputs, then both ops' outputs), where it has one. reads_first: fn
    reads its inputs before writing an output that shares their memory (a view output may overlap them).
    prebind(ins, outs, fresh) -> call() | None: after fn(ins, outs) has run, the same computation on these very
    lists' arrays with the reshapes and checks done now; the inputs at the `fresh` positions are put into `ins`
    before each call (read them at call time). None: fn itself is called (compiled.prebound). fresh_inputs:
    inputs never to be held from one call to the next (tensors the op does not own). A form that sets its
    blobs: made_fresh, outputs it points at new views each call; sources, per output the input whose rows it
    views (None: any). begins: more per-run setups, ((op, input index, fn(array)), ...) with op the position in
    the entry's ops (a form of several ops: compiled.gru_step)."""
    fn: Callable
    blobs: bool = False
    rebind: Callable | None = None
    begin: tuple | None = None   # (input index, fn(array)): called once per run with that input's array
    fuse: Callable | None = None
    reads_first: bool = False
    prebind: Callable | None = None
    fresh_inputs: tuple = ()
    made_fresh: tuple = ()
    sources: tuple | None = None
    begins: tuple = ()


class Unsettled(Exception):
    """A plain net's op met values its compiled entry does not cover (redo: before the entry changed anything,
    and the op runs op by op too), or made outputs of other shapes than in the run its program was built from
    (its sizes follow its inputs' values): the rest of that run goes op by op (Program.routine)."""

    def __init__(self, redo: bool = False):
        super().__init__()
        self.redo = redo


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
    if outs[0].size != n * d or outs[1].size != n * d or (saving and (
            outs[2].size != 4 * n * d or not outs[2].flags.c_contiguous)):
        return None       # (the saved activations: 4×N×D, or a row of the op's T×4×N×D tensor)
    return fb, drop, has_seq, n, d


def lstm_grad_params(bop, ins, outs, saved: bool) -> tuple | None:
    """(forget_bias, drop_states, has_seq, N, D) of an LSTMUnitGradient (saved: its saved-activation form) whose
    arrays the compiled forms handle, else None."""
    fb, drop, has_seq = _args(bop)
    n_in = 9 if has_seq else 8
    blocks = (lambda n, d: (4, n, d)) if saved else (lambda n, d: (1, n, 4 * d))
    if saved and ins[2].ndim == 4 and ins[2].shape[0] == 1:     # a row of the op's T×4×N×D tensor
        ins = [*ins[:2], ins[2][0], *ins[3:]]
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
        tmp, own = np.empty((n, d), dt), (None if saving else np.empty((4, n, d), dt))
        state, ended_at = (1, n, d), Ended()

        def run(ins, outs):
            h, c = outs[0].reshape(state), outs[1].reshape(state)
            ended = past_end(np, ins[3], ins[-1], n, ended_at) if has_seq else None
            lstm_cell.forward(np, ins[2], ins[0].reshape(state), ins[1].reshape(state), fb, drop, ended, h, c,
                              outs[2].reshape(4, n, d) if saving else own, tmp)
        return run, _begin(ended_at, 3, has_seq)
    return _fast(make)


def lstm_unit_gradient(saved: bool):
    def make(bop, ins, outs):
        params = lstm_grad_params(bop, ins, outs, saved)
        if params is None:
            return None
        fb, drop, has_seq, n, d = params
        t_at = 4 if has_seq else 3
        dt = ins[0].dtype
        scratch = np.empty((n, d), dt), np.empty((4, n, d), dt), np.empty((3, n, d), dt)
        own, tanh_c = np.empty((4, n, d), dt), np.empty((n, d), dt)
        state, ended_at = (1, n, d), Ended()

        def run(ins, outs):
            if saved:
                acts = lstm_cell.read_first(ins[2].reshape(4, n, d), outs[2], own)
            else:
                acts = own
                lstm_cell.gate_activations(np, ins[2], n, d, fb, acts)
            tanh = np.tanh(ins[-3].reshape(n, d), out=tanh_c)
            ended = past_end(np, ins[3], ins[t_at], n, ended_at) if has_seq else None
            lstm_cell.backward(np, acts, tanh, ins[1].reshape(state), ins[-2].reshape(state), ins[-1].reshape(state),
                               drop, ended, outs[0].reshape(state), outs[1].reshape(state),
                               outs[2].reshape(1, n, 4 * d), *scratch)
        return run, _begin(ended_at, 3, has_seq)
    return _fast(make, reads_first=saved)   # (the saved activations: copied first where they share rows)


def _fast(make, reads_first: bool = False):
    def wrapped(bop, ins, outs):
        made = make(bop, ins, outs)
        return None if made is None else Fast(made[0], begin=made[1], reads_first=reads_first)
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
    """GRUUnit (kernels.gru.forward) into the output and scratch allocated once."""
    params = gru_params(bop, ins, outs)
    if params is None:
        return None
    drop, has_seq, n, d = params
    dt = ins[0].dtype
    state, ended_at = (1, n, d), Ended()
    u, o = np.empty(state, dt), np.empty(state, dt)

    def run(ins, outs):
        ended = past_end(np, ins[2], ins[-1], n, ended_at) if has_seq else None
        gru_cell.forward(np, ins[0], ins[1], drop, ended, outs[0].reshape(state), u, o)
    return Fast(run, begin=_begin(ended_at, 2, has_seq))


def gru_unit_gradient(bop, ins, outs):
    """GRUUnitGradient (kernels.gru.backward) into the outputs (dh_prev, dgates) and scratch allocated once."""
    params = gru_grad_params(bop, ins, outs)
    if params is None:
        return None
    drop, has_seq, n, d = params
    t_at = 3 if has_seq else 2
    dt = ins[0].dtype
    state, ended_at = (1, n, d), Ended()
    u, o, omu = np.empty(state, dt), np.empty(state, dt), np.empty(state, dt)

    def run(ins, outs):
        ended = past_end(np, ins[2], ins[t_at], n, ended_at) if has_seq else None
        gru_cell.backward(np, ins[0], ins[1], ins[-1], drop, ended, outs[0].reshape(state),
                          outs[1].reshape(1, n, 3 * d), u, o, omu)
    return Fast(run, begin=_begin(ended_at, 2, has_seq))
