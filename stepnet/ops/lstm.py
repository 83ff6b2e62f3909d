"""Recurrent cell ops: LSTMUnit (one timestep of the element-wise cell) and its gradient, the checks and
helpers GRUUnit (gru.py) shares, and the saved-activation forms RecurrentNetwork substitutes in step nets.

After Caffe2's lstm_unit_op / gru_unit_op (spec §4). The gates arrive pre-activation, 1×N×4D for the LSTM
(order i, f, o, g) and 1×N×3D for the GRU (reset, update, output). Batch row n is valid at timestep t when
t < seq_lengths[n]; an invalid row carries the previous state through (or zeroes it with drop_states) and,
backward, passes the state gradients straight through with zero gate gradients. These ops run once per
timestep inside step nets, so every kernel is a handful of whole-array operations, with no Python loop
over rows or elements. seq_lengths and timestep may live on the host even for GPU ops (Caffe2 reads the
timestep from a CPU tensor).
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArityError, DTypeError, ShapeError
from ..core.spec import TensorSpec
from ..kernels import jit
from ..kernels import lstm as cell
from ..kernels.seq_rows import past_end
from .base import check_float
from .registry import NO_GRADIENT, op

NOT_IN_PLACE = ()   # Caffe2's schemas for these ops allow no in-place use

LSTM_HEAD = ("hidden_t_prev", "cell_t_prev", "gates")
LSTM_GRAD_TAIL = ("hidden_t", "cell_t", "hidden_t_grad", "cell_t_grad")
LSTM_STATES = ("cell_t_prev", "hidden_t_prev", "hidden_t", "cell_t", "hidden_t_grad", "cell_t_grad")

LSTM_ARGS = {"forget_bias": 0.0, "drop_states": False, "sequence_lengths": True}


# --------------------------------------------------------------------------------------------- checks
# They take arrays or TensorSpecs (both have .shape and .dtype), so shape functions and kernels share them.

def _unpack(inputs, sequence_lengths: bool, head: tuple, tail: tuple = ()):
    """(head inputs, seq_lengths or None, timestep, tail inputs), after checking the input count against
    the form that `sequence_lengths` selects."""
    names = [*head, *(["seq_lengths"] if sequence_lengths else []), "timestep", *tail]
    if len(inputs) != len(names):
        if sequence_lengths and len(inputs) == len(names) - 1:
            fix = ("an input is missing (usually the timestep); pass it, or set sequence_lengths=0 if the op "
                   "has no seq_lengths input")
        elif not sequence_lengths and len(inputs) == len(names) + 1:
            fix = "set sequence_lengths=1 (the default) to use a seq_lengths input"
        else:
            fix = "give exactly these inputs"
        raise ArityError(f"with sequence_lengths={int(sequence_lengths)} the op takes {len(names)} inputs "
                         f"({', '.join(names)}), got {len(inputs)}; {fix}")
    k = len(head)
    seq = inputs[k] if sequence_lengths else None
    t_at = k + (1 if sequence_lengths else 0)
    return tuple(inputs[:k]), seq, inputs[t_at], tuple(inputs[t_at + 1:])


def _gates_shape(n: int, d: int, n_gates: int, block_major: bool) -> tuple[int, int, int]:
    return (n_gates, n, d) if block_major else (1, n, n_gates * d)


def _check_cell(states: dict, gates, n_gates: int, order: str, block_major: bool = False) -> tuple[int, int]:
    """States all 1×N×D, gates 1×N×(n_gates·D) (or n_gates×N×D, block_major); returns (N, D)."""
    first, ref = next(iter(states.items()))
    shape = tuple(ref.shape)
    if len(shape) != 3 or shape[0] != 1:
        raise ShapeError(f"{first} must be 1×N×D (3-D with a leading 1), got shape {shape}; "
                         "add the leading axis with ExpandDims(dims=[0])")
    for name, x in states.items():
        if tuple(x.shape) != shape:
            raise ShapeError(f"{name} has shape {tuple(x.shape)} but {first} has {shape}; "
                             "the states and their gradients must all be 1×N×D")
    _, n, d = shape
    want = _gates_shape(n, d, n_gates, block_major)
    if tuple(gates.shape) != want:
        layout = f"{n_gates}×N×D" if block_major else f"1×N×{n_gates}D"
        raise ShapeError(f"gates must be {layout} = {want} for N={n}, D={d} ({n_gates} gate "
                         f"blocks of D, order {order}), got shape {tuple(gates.shape)}; the gates' last dim "
                         f"must be {n_gates}× the state's")
    check_float("LSTMUnit" if n_gates == 4 else "GRUUnit", **states, gates=gates)
    return n, d


def _check_int32(name: str, x, size: int, what: str) -> None:
    if x.dtype is not None and x.dtype != np.int32:
        raise DTypeError(f"{name} must be int32, got {x.dtype}; Cast it to int32 (Cast to=2), as "
                         "Caffe2 reads it as int32 data")
    count = 1
    for dim in x.shape:
        count *= dim
    if count != size:
        raise ShapeError(f"{name} has {count} entries but must hold {what} ({size}), shape "
                         f"{tuple(x.shape)}")


def _check_steps(seq, timestep, n: int) -> None:
    if seq is not None:
        _check_int32("seq_lengths", seq, n, "one length per batch row N")
    _check_int32("timestep", timestep, 1, "a single value")


def _cell_dims(names, states, gates, n_gates: int, order: str, seq, timestep,
               block_major: bool = False) -> tuple[int, int]:
    """(N, D) after the checks of _check_cell and _check_steps on a kernel's arrays. These ops run once per
    timestep, so the well-formed case is settled with a few comparisons; anything else gets the full checks
    and their messages. Block-major activations may come as a row of the op's T×4×N×D tensor (1×4×N×D)."""
    if block_major and len(gates.shape) == 4 and gates.shape[0] == 1:
        gates = gates[0]
    shape, dt = states[0].shape, states[0].dtype
    if (len(shape) == 3 and shape[0] == 1 and dt.kind == "f" and gates.dtype == dt
            and gates.shape == _gates_shape(shape[1], shape[2], n_gates, block_major)
            and all(x.shape == shape and x.dtype == dt for x in states)
            and (seq is None or (seq.dtype == np.int32 and seq.size == shape[1]))
            and timestep.dtype == np.int32 and timestep.size == 1):
        return shape[1], shape[2]
    n, d = _check_cell(dict(zip(names, states)), gates, n_gates, order, block_major)
    _check_steps(seq, timestep, n)
    return n, d


def _forward(xp, inputs, forget_bias, drop_states, sequence_lengths, saving: bool):
    """LSTMUnit (and, saving, its saved-activation form): the checks, new outputs, kernels.lstm.forward."""
    (h_prev, c_prev, gates), seq, timestep, _ = _unpack(inputs, sequence_lengths, LSTM_HEAD)
    n, d = _cell_dims(LSTM_STATES[:2], (c_prev, h_prev), gates, 4, "i, f, o, g", seq, timestep)
    dt = c_prev.dtype
    h, c = xp.empty((1, n, d), dt), xp.empty((1, n, d), dt)
    acts, tmp = xp.empty((4, n, d), dt), xp.empty((n, d), dt)
    h, c = cell.forward(xp, gates, h_prev, c_prev, forget_bias, drop_states, past_end(xp, seq, timestep, n), h, c,
                        acts, tmp)
    return (h, c, acts) if saving else (h, c)


def _backward(xp, inputs, forget_bias, drop_states, sequence_lengths, saved: bool):
    """LSTMUnitGradient (saved: reading the saved activations, 4×N×D, instead of the gates): the checks, new
    outputs and scratch, kernels.lstm.backward (tanh(c) from the cell state either way)."""
    (h_prev, c_prev, gates), seq, timestep, (h, c, dh, dc) = _unpack(
        inputs, sequence_lengths, LSTM_HEAD, LSTM_GRAD_TAIL)
    if saved:      # (4×N×D, or a row of the op's T×4×N×D tensor of activations: _cell_dims takes both)
        n, d = _cell_dims(LSTM_STATES, (c_prev, h_prev, h, c, dh, dc), gates, 4, "i, f, o, g", seq,
                          timestep, block_major=True)
        acts = gates.reshape(4, n, d)
    else:
        n, d = _cell_dims(LSTM_STATES, (c_prev, h_prev, h, c, dh, dc), gates, 4, "i, f, o, g", seq, timestep)
        acts = xp.empty((4, n, d), gates.dtype)
        cell.gate_activations(xp, gates, n, d, forget_bias, acts)
    tanh_c = xp.tanh(c.reshape(n, d))
    dt = c_prev.dtype
    dh_prev, dc_prev, dgates = xp.empty((1, n, d), dt), xp.empty((1, n, d), dt), xp.empty((1, n, 4 * d), dt)
    scratch = xp.empty((n, d), dt), xp.empty((4, n, d), dt), xp.empty((3, n, d), dt)
    return cell.backward(xp, acts, tanh_c, c_prev, dh, dc, drop_states, past_end(xp, seq, timestep, n), dh_prev,
                         dc_prev, dgates, *scratch)


# --------------------------------------------------------------------------------------------- LSTMUnit

def _lstm_shape(specs, forget_bias, drop_states, sequence_lengths):
    (h_prev, c_prev, gates), seq, timestep, _ = _unpack(specs, sequence_lengths, LSTM_HEAD)
    n, _ = _check_cell({"cell_t_prev": c_prev, "hidden_t_prev": h_prev}, gates, 4, "i, f, o, g")
    _check_steps(seq, timestep, n)
    out = TensorSpec(tuple(c_prev.shape), c_prev.dtype)
    return [out, out]


def lstm_unit_gradient_maker(g) -> None:
    """LSTMUnitGradient(h_prev, c_prev, gates, [seq_lengths,] timestep, h, c, dh, dc) -> (dh_prev, dc_prev,
    dgates): the 9- or 8-input form, as `sequence_lengths` says; the forward arguments are copied."""
    k = 5 if g.arg("sequence_lengths", True) else 4
    ins = [g.I(i) for i in range(k)] + [g.O(0), g.O(1), g.GO(0), g.GO(1)]
    g.op("LSTMUnitGradient", ins, [g.GI(0), g.GI(1), g.GI(2)])


def fused(step, regular, dims, outputs, argnames: tuple, *flags):
    """The fused_kernel of a cell op record: regular's checks (dims(inputs, args) -> (N, D, dtype)), then the
    jitted arithmetic (`step`: kernels.lstm.jit_step and the like; outputs(N, D) -> their shapes) for float32
    host arrays; otherwise the regular kernel."""
    def kernel(xp, *inputs, **args):
        n, d, dtype = dims(inputs, args)
        k = jit.load()
        if k is None or xp is not np or dtype != jit.F32:
            return regular(xp, *inputs, **args)
        run = step(k, *flags, *(args[a] for a in argnames), n, d)[0]
        outs = [np.empty(shape, dtype) for shape in outputs(n, d)]
        run(list(inputs), outs)
        return tuple(outs) if len(outs) > 1 else outs[0]
    kernel.__doc__ = f"{regular.__name__} with the fused float32 cell arithmetic (Workspace.fused_cells)."
    return kernel


def _lstm_dims(grad: bool, n_gates: int = 4, order: str = "i, f, o, g", block_major: bool = False):
    """dims(inputs, args) -> (N, D, dtype) after the kernel's checks, for fused()."""
    def dims(inputs, args):
        (h_prev, c_prev, gates), seq, timestep, rest = _unpack(
            inputs, args["sequence_lengths"], LSTM_HEAD, LSTM_GRAD_TAIL if grad else ())
        names = LSTM_STATES if grad else LSTM_STATES[:2]
        n, d = _cell_dims(names, (c_prev, h_prev, *rest), gates, n_gates, order, seq, timestep, block_major)
        return n, d, c_prev.dtype
    return dims


_LSTM_PARAMS = ("forget_bias", "drop_states", "sequence_lengths")


def _lstm_grad_outputs(n: int, d: int) -> list:
    return [(1, n, d), (1, n, d), (1, n, 4 * d)]


@op("LSTMUnit", inputs=(4, 5), outputs=2, args=LSTM_ARGS, inplace=NOT_IN_PLACE, host_inputs=(3, 4),
    gradient=lstm_unit_gradient_maker, shape=_lstm_shape,
    fused=lambda k: fused(cell.jit_step, k, _lstm_dims(False), lambda n, d: [(1, n, d)] * 2, _LSTM_PARAMS, False),
    shapes_from_inputs=True)
def lstm_unit(xp, *inputs, forget_bias=0.0, drop_states=False, sequence_lengths=True):
    """One LSTM step: c = σ(f+forget_bias)·c_prev + σ(i)·tanh(g), h = σ(o)·tanh(c) -> (hidden_t, cell_t).

    Inputs: hidden_t_prev, cell_t_prev (1×N×D), gates (1×N×4D, order i, f, o, g), seq_lengths (int32 N;
    omitted when sequence_lengths=0), timestep (int32, 1 element). Rows with t >= seq_lengths[n] copy the
    previous state, or become 0 with drop_states.
    """
    return _forward(xp, inputs, forget_bias, drop_states, sequence_lengths, saving=False)


def _grad_specs(specs, sequence_lengths, n_gates: int, order: str, block_major: bool = False):
    """The gradient forms' checks on TensorSpecs: (h_prev, c_prev, gates or activations, N, D)."""
    (h_prev, c_prev, gates), seq, timestep, (h, c, dh, dc) = _unpack(
        specs, sequence_lengths, LSTM_HEAD, LSTM_GRAD_TAIL)
    states = dict(zip(LSTM_STATES, (c_prev, h_prev, h, c, dh, dc)))
    n, d = _check_cell(states, gates, n_gates, order, block_major)
    _check_steps(seq, timestep, n)
    return h_prev, c_prev, gates, n, d


def _lstm_grad_shape(specs, forget_bias, drop_states, sequence_lengths):
    h_prev, c_prev, gates, _, _ = _grad_specs(specs, sequence_lengths, 4, "i, f, o, g")
    return [TensorSpec(tuple(x.shape), x.dtype) for x in (h_prev, c_prev, gates)]


@op("LSTMUnitGradient", inputs=(8, 9), outputs=3, args=LSTM_ARGS, inplace=NOT_IN_PLACE, host_inputs=(3, 4),
    shape=_lstm_grad_shape,
    fused=lambda k: fused(cell.jit_grad_step, k, _lstm_dims(True), _lstm_grad_outputs, _LSTM_PARAMS, False),
    shapes_from_inputs=True)
def lstm_unit_gradient(xp, *inputs, forget_bias=0.0, drop_states=False, sequence_lengths=True):
    """Gradients of LSTMUnit -> (hidden_t_prev_grad, cell_t_prev_grad, gates_grad).

    Valid rows: dc = dC + dH·o·(1 − tanh²c) (c read from cell_t), dc_prev = dc·f, gate gradients through the
    activations, and dh_prev = 0, since h_prev reaches the cell only through the gates' FC. Invalid rows:
    zero gate gradients, and dh_prev = dH, dc_prev = dC (or both 0 with drop_states).
    """
    return _backward(xp, inputs, forget_bias, drop_states, sequence_lengths, saved=False)


# --------------------------------------------------------------------------------------------- saved forms
# RecurrentNetwork substitutes these for an LSTMUnit / LSTMUnitGradient pair of its step nets that reads one
# gates blob no other op writes (passes.step_nets.save_lstm_activations): the forward keeps the activations in a
# step-workspace blob, 4×N×D (block-major), which the gradient reads instead of recomputing them from the gates
# (tanh(c) it recomputes from the cell state). Same inputs, arguments and results as the public pair; the forward
# has that blob as a third output.

def _saved_shape(specs, forget_bias, drop_states, sequence_lengths):
    out = _lstm_shape(specs, forget_bias, drop_states, sequence_lengths)
    n, d = out[0].shape[1:]
    return out + [TensorSpec((4, n, d), specs[2].dtype)]


@op("rnn_internal_lstm_unit", inputs=(4, 5), outputs=3, args=LSTM_ARGS, inplace=NOT_IN_PLACE,
    host_inputs=(3, 4), gradient=NO_GRADIENT, shape=_saved_shape,
    fused=lambda k: fused(cell.jit_step, k, _lstm_dims(False), lambda n, d: [(1, n, d)] * 2 + [(4, n, d)],
                          _LSTM_PARAMS, True))
def lstm_unit_saving(xp, *inputs, forget_bias=0.0, drop_states=False, sequence_lengths=True):
    """LSTMUnit that also outputs [σ(i), σ(f + forget_bias), σ(o), tanh(g)] (4×N×D) for its gradient."""
    return _forward(xp, inputs, forget_bias, drop_states, sequence_lengths, saving=True)


def _saved_grad_shape(specs, forget_bias, drop_states, sequence_lengths):
    h_prev, c_prev, acts, n, d = _grad_specs(specs, sequence_lengths, 4, "i, f, o, g", block_major=True)
    return [TensorSpec(tuple(x.shape), x.dtype) for x in (h_prev, c_prev)] + [TensorSpec((1, n, 4 * d), acts.dtype)]


@op("rnn_internal_lstm_unit_gradient", inputs=(8, 9), outputs=3, args=LSTM_ARGS, inplace=NOT_IN_PLACE,
    host_inputs=(3, 4), gradient=NO_GRADIENT, shape=_saved_grad_shape,
    fused=lambda k: fused(cell.jit_grad_step, k, _lstm_dims(True, 4, "i, f, o, g", block_major=True),
                          _lstm_grad_outputs, _LSTM_PARAMS, True))
def lstm_unit_gradient_saved(xp, *inputs, forget_bias=0.0, drop_states=False, sequence_lengths=True):
    """LSTMUnitGradient reading rnn_internal_lstm_unit's saved activations (input 2) instead of the gates."""
    return _backward(xp, inputs, forget_bias, drop_states, sequence_lengths, saved=True)
