"""The fused cell arithmetic: LSTMUnit, GRUUnit, RecurrentNetwork's saved-activation LSTM forms and their
gradients as one numba pass per op (fused_kernels) instead of ~20 numpy passes. A workspace choice
(`Workspace(fused_cells=)`; None, the default: whenever numba, the `fast` extra, is installed): there every
float32 call of these ops on the CPU uses it, interpreted (the records' fused_kernel, which the executor binds)
or compiled (the forms below), so a net gives the same bits whichever way its timesteps run. Results agree with
the numpy kernels within float32 rounding (the tanh approximation is within 3e-7); fused_cells=False keeps the
numpy arithmetic, the reference. Other dtypes and devices use the numpy kernels. The same switch gives Softmax,
SoftmaxGradient (`rows`), FC of one row (ops/math.py, products.fc_row) and the one-hot FC weight gradient
(stepnet.kernels.onehot) their numba kernels."""
from __future__ import annotations

import functools
import importlib.util
import math
import warnings

import numpy as np

from .products import fc_row
from .cell_forms import (
    Fast, _begin, _Ended, bound_args, gru_grad_params, gru_params, lstm_grad_params, lstm_params, shaped)

_F32 = np.dtype(np.float32)


@functools.cache
def installed() -> bool:
    """Whether numba can be imported (without importing it; asked once: every step workspace binds its cells)."""
    return importlib.util.find_spec("numba") is not None


def enabled(ws) -> bool:
    """Whether the cell ops of nets bound in ws use the fused arithmetic."""
    return installed() if ws.fused_cells is None else bool(ws.fused_cells)


@functools.cache
def kernels():
    """The compiled kernel module, or None without a working numba (imported once, on the first fused call;
    then every cell op keeps the numpy arithmetic, interpreted and compiled alike)."""
    if not installed():
        return None
    try:
        from ..kernels import jit as fused_kernels
    except Exception as e:  # noqa: BLE001 - a numba that cannot compile or cache here: warn, run numpy
        warnings.warn(f"the fused cell kernels are unavailable ({type(e).__name__}: {e}); the LSTM/GRU cells run "
                      "in numpy", RuntimeWarning, stacklevel=2)
        return None
    return fused_kernels


def rows(name: str, *matrices) -> np.ndarray | None:
    """The fused row kernel `name` (softmax_grad_rows) over float32 host matrices of one shape
    (m × k) into a new m × k array; None without numba or for other arrays (then the numpy kernel runs)."""
    k = kernels()
    if k is None or any(type(a) is not np.ndarray or a.dtype != _F32 for a in matrices):
        return None
    out = np.empty(matrices[0].shape, _F32)
    getattr(k, name)(*(np.ascontiguousarray(a) for a in matrices), out)
    return out


def _flat(a):
    """a's elements as a contiguous 1-D array: a view of a C-contiguous a, else a copy."""
    return a.ravel()


def _via_scratch(run, ins, outs) -> None:
    """run into contiguous scratch, then copy into outputs that are not C-contiguous."""
    scratch = [np.empty(o.shape, o.dtype) for o in outs]
    run(ins, scratch)
    for o, s in zip(outs, scratch):
        np.copyto(o, s)


def _hold(ended, drop: bool, *pairs) -> None:
    """Rows whose sequence has ended: each output keeps its previous value (or 0 with drop_states)."""
    for out, prev in pairs:
        out[:, ended] = 0 if drop else prev[:, ended]


# ------------------------------------------------------------------------------------------- steps
# step(k, args..., n, d) -> (run(ins, outs), ended): ins and outs in the op's order, float32, states 1×N×D.

def lstm_step(k, saving: bool, fb: float, drop: bool, has_seq: bool, n: int, d: int):
    fbh, state, ended_at, unused = np.float32(fb) * np.float32(0.5), (1, n, d), _Ended(), np.empty(1, _F32)

    def run(ins, outs):
        h, c = outs[0], outs[1]
        if not (h.flags.c_contiguous and c.flags.c_contiguous) or (saving and not outs[2].flags.c_contiguous):
            return _via_scratch(run, ins, outs)
        c_prev = ins[1]
        k.lstm_forward(_flat(ins[2]), _flat(c_prev), fbh, h.ravel(), c.ravel(),
                       outs[2].ravel() if saving else unused, saving, n, d)
        ended = ended_at(ins[3], ins[-1]) if has_seq else None
        if ended is not None:
            _hold(ended, drop, (h.reshape(state), ins[0].reshape(state)), (c.reshape(state), c_prev.reshape(state)))
    return run, ended_at


def lstm_grad_step(k, saved: bool, fb: float, drop: bool, has_seq: bool, n: int, d: int):
    fbh, state, ended_at = np.float32(fb) * np.float32(0.5), (1, n, d), _Ended()
    own = None if saved else np.empty(5 * n * d, _F32)
    t_at = 4 if has_seq else 3

    def run(ins, outs):
        dh_prev, dc_prev, dgates = outs
        if not (dh_prev.flags.c_contiguous and dc_prev.flags.c_contiguous and dgates.flags.c_contiguous):
            return _via_scratch(run, ins, outs)
        dh, dc = ins[-2], ins[-1]
        acts = _flat(ins[2])
        if not saved:
            k.lstm_activations(acts, _flat(ins[-3]), fbh, own, n, d)
            acts = own
        k.lstm_backward(acts, _flat(ins[1]), _flat(dh), _flat(dc), dgates.ravel(), dh_prev.ravel(),
                        dc_prev.ravel(), n, d)
        ended = ended_at(ins[3] if has_seq else None, ins[t_at])
        if ended is not None:
            dgates.reshape(1, n, 4 * d)[:, ended] = 0
            _hold(ended, drop, (dh_prev.reshape(state), dh.reshape(state)), (dc_prev.reshape(state), dc.reshape(state)))
    return run, ended_at


def gru_step(k, drop: bool, has_seq: bool, n: int, d: int):
    state, ended_at = (1, n, d), _Ended()

    def run(ins, outs):
        h = outs[0]
        if not h.flags.c_contiguous:
            return _via_scratch(run, ins, outs)
        h_prev = ins[0]
        k.gru_forward(_flat(h_prev), _flat(ins[1]), h.ravel(), n, d)
        ended = ended_at(ins[2] if has_seq else None, ins[-1])
        if ended is not None:
            _hold(ended, drop, (h.reshape(state), h_prev.reshape(state)))
    return run, ended_at


def gru_grad_step(k, drop: bool, has_seq: bool, n: int, d: int):
    state, ended_at, t_at = (1, n, d), _Ended(), 3 if has_seq else 2

    def run(ins, outs):
        dh_prev, dgates = outs
        if not (dh_prev.flags.c_contiguous and dgates.flags.c_contiguous):
            return _via_scratch(run, ins, outs)
        dh = ins[-1]
        k.gru_backward(_flat(ins[0]), _flat(ins[1]), _flat(dh), dh_prev.ravel(), dgates.ravel(), n, d)
        ended = ended_at(ins[2] if has_seq else None, ins[t_at])
        if ended is not None:
            dgates.reshape(1, n, 3 * d)[:, ended] = 0
            _hold(ended, drop, (dh_prev.reshape(state), dh.reshape(state)))
    return run, ended_at


def interpreted(step, xp, dtype, *params):
    """run(ins, outs) of a step for an interpreted kernel call (its checks passed), or None where the fused
    arithmetic does not apply: not numpy, not float32, or no numba."""
    k = kernels()
    if k is None or xp is not np or dtype != _F32:
        return None
    return step(k, *params)[0]


# ------------------------------------------------------------------------------------------- compiled forms
def _fused_form(step, params_of, seq_at: int, *flags):
    """The compiled maker of a fused step: the numpy forms' checks (params_of -> the step's parameters, the
    has_seq flag third from the end), float32 only."""
    def make(bop, ins, outs):
        k = kernels()
        params = params_of(bop, ins, outs, *flags)
        if k is None or params is None or ins[0].dtype != _F32:
            return None
        run, ended_at = step(k, *flags, *params)
        return Fast(run, begin=_begin(ended_at, seq_at, params[-3]))
    return make


def softmax(bop, ins, outs):
    """Softmax's row kernel straight into its output (the fused interpreted kernel's bits), float32."""
    k, x, a = kernels(), ins[0], bound_args(bop)["axis"]
    if k is None or x.dtype != _F32 or outs[0].dtype != _F32 or not -x.ndim <= a < x.ndim:
        return None
    a %= x.ndim
    rows2 = (math.prod(x.shape[:a]), math.prod(x.shape[a:]))
    if not x.size or outs[0].size != x.size:
        return None
    kernel = k.softmax_rows

    def run(ins, outs):
        kernel(np.ascontiguousarray(ins[0]).reshape(rows2), shaped(outs[0], rows2))
    return Fast(run)


FUSED = {
    "LSTMUnit": _fused_form(lstm_step, lstm_params, 3, False),
    "rnn_internal_lstm_unit": _fused_form(lstm_step, lstm_params, 3, True),
    "LSTMUnitGradient": _fused_form(lstm_grad_step, lstm_grad_params, 3, False),
    "rnn_internal_lstm_unit_gradient": _fused_form(lstm_grad_step, lstm_grad_params, 3, True),
    "GRUUnit": _fused_form(gru_step, gru_params, 2), "GRUUnitGradient": _fused_form(gru_grad_step, gru_grad_params, 2),
    "Softmax": softmax, "FC": fc_row,
}
