"""Caffe2's gru_cell: GRUCell and GRU (rnn_cell._LSTM over GRUCells: as in Caffe2 it counts 4 outputs per layer,
which is exact for one layer, h_all and h_last)."""
from __future__ import annotations

import functools

from . import brew
from ._rnn_cell_base import RNNCell
from .rnn_cell import _LSTM


class GRUCell(RNNCell):
    """Per step: the projected input split into reset, update and output parts; reset and update gates FC(h_prev)
    plus their part; the output gate an FC of reset_sigmoid * h_prev (or reset_sigmoid * FC(h_prev) with
    linear_before_reset, cuDNN's form) plus its part; GRUUnit of the concatenated gates. forget_bias is
    passed to GRUUnit, which does not read it (as in Caffe2)."""

    def __init__(self, input_size, hidden_size, forget_bias, memory_optimization, drop_states=False,
                 linear_before_reset=False, **kwargs):
        super().__init__(**kwargs)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.linear_before_reset = linear_before_reset

    def _fc(self, model, blob, name):
        return brew.fc(model, blob, self.scope(name), dim_in=self.hidden_size, dim_out=self.hidden_size, axis=2)

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev = states[0]
        x_reset, x_update, x_output = model.net.Split(
            [input_t], [self.scope("input_t_reset"), self.scope("input_t_update"), self.scope("input_t_output")],
            axis=2)
        reset = self._fc(model, hidden_t_prev, "reset_gate_t")
        update = self._fc(model, hidden_t_prev, "update_gate_t")
        reset = model.net.Sum([reset, x_reset], self.scope("reset_gate_t"))
        reset_sigmoid = model.net.Sigmoid(reset, self.scope("reset_gate_t_sigmoid"))
        if self.linear_before_reset:
            output = model.net.Mul([reset_sigmoid, self._fc(model, hidden_t_prev, "output_gate_t")],
                                   self.scope("output_gate_t_mul"))
        else:
            modified = model.net.Mul([reset_sigmoid, hidden_t_prev], self.scope("modified_hidden_t_prev"))
            output = self._fc(model, modified, "output_gate_t")
        update = model.net.Sum([update, x_update], self.scope("update_gate_t"))
        output = model.net.Sum([output, x_output], self.scope("output_gate_t_summed"))
        gates_t, _ = model.net.Concat([reset, update, output],
                                      [self.scope("gates_t"), self.scope("_gates_t_concat_dims")], axis=2)
        lengths = [seq_lengths] if seq_lengths is not None else []
        hidden_t = model.net.GRUUnit([hidden_t_prev, gates_t] + lengths + [timestep], list(self.get_state_names()),
                                     forget_bias=self.forget_bias, drop_states=self.drop_states,
                                     sequence_lengths=seq_lengths is not None)
        model.net.AddExternalOutputs(hidden_t)
        return (hidden_t,)

    def prepare_input(self, model, input_blob):
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size, dim_out=3 * self.hidden_size,
                       axis=2)

    def get_state_names(self):
        return (self.scope("hidden_t"),)

    def get_output_dim(self):
        return self.hidden_size


GRU = functools.partial(_LSTM, GRUCell)
