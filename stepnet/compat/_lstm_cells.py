"""Caffe2's step cells of rnn_cell: BasicRNNCell, LSTMCell, LayerNormLSTMCell, MILSTMCell and LayerNormMILSTMCell.

Each writes Caffe2's ops and blob names: the input projection `<name>/i2h` (FC over all timesteps) in
prepare_input, then per step an FC of the previous hidden state (concatenated with any extra inputs, e.g. an
attention context) added to the projected input, and LSTMUnit (or the BasicRNN activation).
"""
from __future__ import annotations

from . import brew
from ._rnn_cell_base import LSTMInitializer, RNNCell
from .modeling.initializers import Initializer


def _recurrent_input(model, hidden_t_prev, hidden_size, extra_inputs, concat_name):
    """(the FC input, its width): hidden_t_prev, or it concatenated with the extra inputs along axis 2."""
    if extra_inputs is None:
        return hidden_t_prev, hidden_size
    blobs, sizes = zip(*extra_inputs)
    return brew.concat(model, [hidden_t_prev] + list(blobs), concat_name, axis=2), hidden_size + sum(sizes)


def _lstm_unit(model, cell, inputs, outputs, seq_lengths, always_lengths=False):
    """LSTMUnit(hidden_t_prev, cell_t_prev, gates_t, [seq_lengths,] timestep)."""
    hidden_t_prev, cell_t_prev, gates_t, timestep = inputs
    lengths = [seq_lengths] if seq_lengths is not None else []
    kwargs = {} if always_lengths and seq_lengths is not None else {"sequence_lengths": seq_lengths is not None}
    return model.net.LSTMUnit([hidden_t_prev, cell_t_prev, gates_t] + lengths + [timestep], outputs,
                              forget_bias=cell.forget_bias, drop_states=cell.drop_states, **kwargs)


class BasicRNNCell(RNNCell):
    """hidden_t = tanh or relu(FC(hidden_t_prev) + input_t); with seq_lengths rows past their length are masked
    (GT/LE -> Cast -> Mul, plus the carried state unless drop_states)."""

    def __init__(self, input_size, hidden_size, forget_bias, memory_optimization, drop_states=False,
                 initializer=None, activation=None, **kwargs):
        super().__init__(**kwargs)
        self.drop_states = drop_states
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.activation = activation
        if activation not in ("relu", "tanh"):
            raise RuntimeError(f"BasicRNNCell with unknown activation function ({activation})")

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev = states[0]
        gates_t = brew.fc(model, hidden_t_prev, "gates_t", dim_in=self.hidden_size, dim_out=self.hidden_size,
                          axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        hidden_t = (model.net.Tanh if self.activation == "tanh" else model.net.Relu)(gates_t, "hidden_t")
        if seq_lengths is not None:
            timestep = model.net.CopyFromCPUInput(timestep, "timestep_gpu")
            valid_b = model.net.GT([seq_lengths, timestep], "valid_b", broadcast=1)
            invalid_b = model.net.LE([seq_lengths, timestep], "invalid_b", broadcast=1)
            valid = model.net.Cast(valid_b, "valid", to="float")
            invalid = model.net.Cast(invalid_b, "invalid", to="float")
            hidden_valid = model.net.Mul([hidden_t, valid], "hidden_valid", broadcast=1, axis=1)
            if self.drop_states:
                hidden_t = hidden_valid
            else:
                hidden_invalid = model.net.Mul([hidden_t_prev, invalid], "hidden_invalid", broadcast=1, axis=1)
                hidden_t = model.net.Add([hidden_valid, hidden_invalid], hidden_t)
        return (hidden_t,)

    def prepare_input(self, model, input_blob):
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size, dim_out=self.hidden_size,
                       axis=2)

    def get_state_names(self):
        return (self.scope("hidden_t"),)

    def get_output_dim(self):
        return self.hidden_size


class LSTMCell(RNNCell):
    """gates_t = FC(hidden_t_prev [, extra inputs]) + input_t; LSTMUnit -> hidden_state, cell_state."""

    def __init__(self, input_size, hidden_size, forget_bias, memory_optimization, drop_states=False,
                 initializer=None, **kwargs):
        super().__init__(initializer=initializer, **kwargs)
        self.initializer = initializer or LSTMInitializer(hidden_size=hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.gates_size = 4 * hidden_size

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        fc_input, dim = _recurrent_input(model, hidden_t_prev, self.hidden_size, extra_inputs,
                                         "gates_concatenated_input_t")
        gates_t = brew.fc(model, fc_input, "gates_t", dim_in=dim, dim_out=self.gates_size, axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        hidden_t, cell_t = _lstm_unit(model, self, [hidden_t_prev, cell_t_prev, gates_t, timestep],
                                      ["hidden_state", "cell_state"], seq_lengths)
        model.net.AddExternalOutputs(hidden_t, cell_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t

    def get_input_params(self):
        return {"weights": self.scope("i2h") + "_w", "biases": self.scope("i2h") + "_b"}

    def get_recurrent_params(self):
        return {"weights": self.scope("gates_t") + "_w", "biases": self.scope("gates_t") + "_b"}

    def prepare_input(self, model, input_blob):
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size, dim_out=self.gates_size,
                       axis=2)

    def get_state_names_override(self):
        return ["hidden_t", "cell_t"]

    def get_output_dim(self):
        return self.hidden_size


class LayerNormLSTMCell(LSTMCell):
    """LSTMCell with layer normalization (learned scale and bias) of gates_t before LSTMUnit; names scoped by
    hand (its step is not run in the cell's name scope), states `<name>/hidden_t`, `<name>/cell_t`."""

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        fc_input, dim = _recurrent_input(model, hidden_t_prev, self.hidden_size, extra_inputs,
                                         self.scope("gates_concatenated_input_t"))
        gates_t = brew.fc(model, fc_input, self.scope("gates_t"), dim_in=dim, dim_out=self.gates_size, axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        gates_t, _, _ = brew.layer_norm(model, self.scope("gates_t"), self.scope("gates_t_norm"),
                                        dim_in=self.gates_size, axis=-1)
        hidden_t, cell_t = _lstm_unit(model, self, [hidden_t_prev, cell_t_prev, gates_t, timestep],
                                      list(self.get_state_names()), seq_lengths, always_lengths=True)
        model.net.AddExternalOutputs(hidden_t, cell_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t

    def get_recurrent_params(self):
        raise NotImplementedError("LayerNormLSTMCell has no get_recurrent_params in Caffe2")

    def get_output_dim(self):
        raise NotImplementedError("Abstract method")

    def get_state_names(self):
        return (self.scope("hidden_t"), self.scope("cell_t"))


class MILSTMCell(LSTMCell):
    """Multiplicative-integration LSTM (arXiv:1606.06630): with prev_t = FC(hidden_t_prev [, extras]),
    gates_t = (alpha * input_t + beta1) * prev_t + beta2 * input_t + b, parameters of width 4H."""

    layer_norm = False

    def _mi_param(self, model, name, value):
        return model.create_param(self.scope(name), shape=[self.gates_size],
                                  initializer=Initializer("ConstantFill", value=value))

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        fc_input, dim = _recurrent_input(model, hidden_t_prev, self.hidden_size, extra_inputs,
                                         self.scope("gates_concatenated_input_t"))
        prev_t = brew.fc(model, fc_input, self.scope("prev_t"), dim_in=dim, dim_out=self.gates_size, axis=2)
        alpha = self._mi_param(model, "alpha", 1.0)
        beta_h = self._mi_param(model, "beta1", 1.0)
        beta_i = self._mi_param(model, "beta2", 1.0)
        b = self._mi_param(model, "b", 0.0)
        scaled = model.net.ElementwiseLinear([input_t, alpha, beta_h], self.scope("alpha_by_input_t_plus_beta_h"),
                                             axis=2)
        product = model.net.Mul([scaled, prev_t], self.scope("alpha_by_input_t_plus_beta_h_by_prev_t"))
        linear = model.net.ElementwiseLinear([input_t, beta_i, b], self.scope("beta_i_by_input_t_plus_b"), axis=2)
        gates_t = brew.sum(model, [product, linear], self.scope("gates_t"))
        if self.layer_norm:
            gates_t, _, _ = brew.layer_norm(model, self.scope("gates_t"), self.scope("gates_t_norm"),
                                            dim_in=self.gates_size, axis=-1)
        hidden_t, cell_t = _lstm_unit(model, self, [hidden_t_prev, cell_t_prev, gates_t, timestep],
                                      [self.scope("hidden_t_intermediate"), self.scope("cell_t")], seq_lengths,
                                      always_lengths=True)
        model.net.AddExternalOutputs(cell_t, hidden_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t


class LayerNormMILSTMCell(MILSTMCell):
    """MILSTMCell with layer normalization of gates_t before LSTMUnit."""

    layer_norm = True
