"""GRUUnit and GRUUnitGradient: one timestep of Caffe2's GRU cell (gru_unit_op, spec §4).

The gates arrive pre-activation, 1×N×3D (order reset, update, output); checks, seq_lengths masking and the
sigmoid are shared with the LSTM ops in rnn.py.
"""
from __future__ import annotations

from ..core.spec import TensorSpec
from ..kernels import gru as cell
from ..kernels.seq_rows import past_end
from .lstm import NOT_IN_PLACE, _cell_dims, _check_cell, _check_steps, _unpack, fused
from .registry import op

GRU_HEAD = ("hidden_t_prev", "gates")
GRU_GRAD_TAIL = ("hidden_t", "hidden_t_grad")
GRU_STATES = ("hidden_t_prev", "hidden_t", "hidden_t_grad")
# Caffe2's gru_cell.py puts forget_bias on GRUUnit, whose kernel never reads it: accepted and ignored.
GRU_ARGS = {"drop_states": False, "sequence_lengths": True, "forget_bias": 0.0}


_GRU_PARAMS = ("drop_states", "sequence_lengths")


def _gru_dims(grad: bool):
    """dims(inputs, args) -> (N, D, dtype) after the kernel's checks, for lstm.fused()."""
    def dims(inputs, args):
        (h_prev, gates), seq, timestep, rest = _unpack(inputs, args["sequence_lengths"], GRU_HEAD,
                                                       GRU_GRAD_TAIL if grad else ())
        names = GRU_STATES if grad else GRU_STATES[:1]
        n, d = _cell_dims(names, (h_prev, *rest), gates, 3, "reset, update, output", seq, timestep)
        return n, d, h_prev.dtype
    return dims


# --------------------------------------------------------------------------------------------- GRUUnit

def _gru_shape(specs, drop_states, sequence_lengths, forget_bias=0.0):
    (h_prev, gates), seq, timestep, _ = _unpack(specs, sequence_lengths, GRU_HEAD)
    n, _ = _check_cell({"hidden_t_prev": h_prev}, gates, 3, "reset, update, output")
    _check_steps(seq, timestep, n)
    return [TensorSpec(tuple(h_prev.shape), h_prev.dtype)]


def gru_unit_gradient_maker(g) -> None:
    """GRUUnitGradient(h_prev, gates, [seq_lengths,] timestep, h, dh) -> (dh_prev, dgates): the 6- or
    5-input form, as `sequence_lengths` says; the forward arguments are copied."""
    k = 4 if g.arg("sequence_lengths", True) else 3
    g.op("GRUUnitGradient", [g.I(i) for i in range(k)] + [g.O(0), g.GO(0)], [g.GI(0), g.GI(1)])


@op("GRUUnit", inputs=(3, 4), outputs=1, args=GRU_ARGS, inplace=NOT_IN_PLACE, host_inputs=(2, 3),
    gradient=gru_unit_gradient_maker, shape=_gru_shape,
    fused=lambda k: fused(cell.jit_step, k, _gru_dims(False), lambda n, d: [(1, n, d)], _GRU_PARAMS),
    shapes_from_inputs=True)
def gru_unit(xp, *inputs, drop_states=False, sequence_lengths=True, forget_bias=0.0):
    """One GRU step: h = h_prev·σ(u) + tanh(o)·(1 − σ(u)) -> hidden_t.

    Inputs: hidden_t_prev (1×N×D), gates (1×N×3D, order reset, update, output), seq_lengths (int32 N;
    omitted when sequence_lengths=0), timestep (int32, 1 element). The reset gate is not read: Caffe2's
    gru_cell applies it to the recurrent term before this op. Rows past their length copy h_prev (0 with
    drop_states).
    """
    (h_prev, gates), seq, timestep, _ = _unpack(inputs, sequence_lengths, GRU_HEAD)
    n, d = _cell_dims(GRU_STATES[:1], (h_prev,), gates, 3, "reset, update, output", seq, timestep)
    h, u, o = (xp.empty(h_prev.shape, h_prev.dtype) for _ in range(3))
    return cell.forward(xp, h_prev, gates, drop_states, past_end(xp, seq, timestep, n), h, u, o)


def _gru_grad_shape(specs, drop_states, sequence_lengths, forget_bias=0.0):
    (h_prev, gates), seq, timestep, (h, dh) = _unpack(specs, sequence_lengths, GRU_HEAD, GRU_GRAD_TAIL)
    states = {"hidden_t_prev": h_prev, "hidden_t": h, "hidden_t_grad": dh}
    n, _ = _check_cell(states, gates, 3, "reset, update, output")
    _check_steps(seq, timestep, n)
    return [TensorSpec(tuple(x.shape), x.dtype) for x in (h_prev, gates)]


@op("GRUUnitGradient", inputs=(5, 6), outputs=2, args=GRU_ARGS, inplace=NOT_IN_PLACE, host_inputs=(2, 3),
    shape=_gru_grad_shape,
    fused=lambda k: fused(cell.jit_grad_step, k, _gru_dims(True), lambda n, d: [(1, n, d), (1, n, 3 * d)],
                          _GRU_PARAMS), shapes_from_inputs=True)
def gru_unit_gradient(xp, *inputs, drop_states=False, sequence_lengths=True, forget_bias=0.0):
    """Gradients of GRUUnit -> (hidden_t_prev_grad, gates_grad).

    Valid rows: dh_prev = dH·u, du = dH·(h_prev − tanh o)·σ'(u), do = dH·(1 − u)·(1 − tanh²o), and a zero
    reset-gate gradient (the unit does not read it). Invalid rows: zero gate gradients and dh_prev = dH
    (0 with drop_states).
    """
    (h_prev, gates), seq, timestep, (h, dh) = _unpack(inputs, sequence_lengths, GRU_HEAD, GRU_GRAD_TAIL)
    n, d = _cell_dims(GRU_STATES, (h_prev, h, dh), gates, 3, "reset, update, output", seq, timestep)
    dh_prev, dgates = xp.empty(h_prev.shape, h_prev.dtype), xp.empty(gates.shape, gates.dtype)
    u, o, omu = (xp.empty(h_prev.shape, h_prev.dtype) for _ in range(3))
    return cell.backward(xp, h_prev, gates, dh, drop_states, past_end(xp, seq, timestep, n), dh_prev, dgates,
                         u, o, omu)
