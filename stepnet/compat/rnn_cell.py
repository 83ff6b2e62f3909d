"""Caffe2's rnn_cell: LSTM, BasicRNN (GRU is gru_cell.GRU, also here) and the cells LSTMCell, BasicRNNCell,
GRUCell and MultiRNNCell with apply_over_sequence, built by stepnet.builders.rnn and stepnet.builders.cells, which lay
out Caffe2's step nets, parameters and blob names. `model` is a model_helper.ModelHelper."""
from __future__ import annotations

from ..builders import rnn as _rnn
from ..builders import cells as step_cells
from . import core
from .scope import CurrentDeviceScope

STEP_NETS = ("step_net", "backward_step_net")


def on_device(net, build):
    """build(), then the current device scope stamped on the ops of the step nets it added to net that have no
    device option (Caffe2 creates step ops under the scope; stepnet.builders.rnn builds them without one)."""
    before, device = len(net.Proto().op), CurrentDeviceScope()
    result = build()
    if device is not None:
        for op in net.Proto().op[before:]:
            for arg in op.arg:
                if arg.name in STEP_NETS and arg.HasField("n"):
                    for step_op in arg.n.op:
                        if not step_op.HasField("device_option"):
                            step_op.device_option.CopyFrom(device)
    return result


def _refs(model, blobs) -> tuple:
    return tuple(core.BlobReference(str(b), model.net) for b in blobs)


def _no_extras(return_params, cell_kwargs, allowed=()) -> None:
    if return_params:
        raise NotImplementedError("return_params is not supported: the parameters are in model.params")
    unknown = sorted(set(cell_kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"unexpected cell arguments {unknown}")


def LSTM(model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope=None, outputs_with_grads=(0,),
         return_params=False, memory_optimization=False, forget_bias=0.0, forward_only=False, drop_states=False,
         return_last_layer_only=True, static_rnn_unroll_size=None, **cell_kwargs):
    """One RecurrentNetwork over the T x N x dim_in input (dim_out: an int, or one per layer); returns
    (hidden_all, hidden_last, cell_all, cell_last) of the last layer (of every layer without
    return_last_layer_only). initial_states: (h0, c0) per layer, or None for trainable zero states."""
    _no_extras(return_params, cell_kwargs)
    return _refs(model, on_device(model.net, lambda: _rnn.lstm(
        model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope=scope,
        outputs_with_grads=outputs_with_grads, memory_optimization=memory_optimization, forget_bias=forget_bias,
        forward_only=forward_only, drop_states=drop_states, return_last_layer_only=return_last_layer_only,
        static_rnn_unroll_size=static_rnn_unroll_size)))


def BasicRNN(model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope=None, outputs_with_grads=(0,),
             return_params=False, memory_optimization=False, forget_bias=0.0, forward_only=False, drop_states=False,
             return_last_layer_only=True, static_rnn_unroll_size=None, activation=None):
    """h_t = activation(FC(h_{t-1}) + i2h(x_t)), activation 'tanh' or 'relu' (required, as in Caffe2); one
    layer; returns (hidden_all, hidden_last)."""
    _no_extras(return_params, {})
    if activation not in ("relu", "tanh"):
        raise RuntimeError(f"BasicRNNCell with unknown activation function ({activation})")
    return _refs(model, on_device(model.net, lambda: _rnn.basic_rnn(
        model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope=scope, activation=activation,
        outputs_with_grads=outputs_with_grads, forward_only=forward_only, drop_states=drop_states,
        static_rnn_unroll_size=static_rnn_unroll_size)))


def GRU(model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope=None, outputs_with_grads=(0,),
        return_params=False, memory_optimization=False, forget_bias=0.0, forward_only=False, drop_states=False,
        return_last_layer_only=True, static_rnn_unroll_size=None, linear_before_reset=False):
    """gru_cell.GRU: one layer; returns (hidden_all, hidden_last)."""
    _no_extras(return_params, {})
    return _refs(model, on_device(model.net, lambda: _rnn.gru(
        model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope=scope,
        outputs_with_grads=outputs_with_grads, forward_only=forward_only, drop_states=drop_states,
        linear_before_reset=linear_before_reset, static_rnn_unroll_size=static_rnn_unroll_size)))


class RNNCell:
    """A cell over one of stepnet's step cells; apply_over_sequence adds its RecurrentNetwork to model.net."""

    def __init__(self, cell, forward_only=False):
        self._cell = cell
        self.forward_only = forward_only

    @property
    def name(self):
        return self._cell.name

    def apply_over_sequence(self, model, inputs, seq_lengths=None, initial_states=None, outputs_with_grads=None):
        """(output sequence, (state_1_all, state_1_last, ...)) for the T x N x D inputs."""
        states = _refs(model, on_device(model.net, lambda: _rnn.apply_over_sequence(
            model, self._cell, inputs, seq_lengths, initial_states, outputs_with_grads,
            forward_only=self.forward_only)))
        return states[2 * self.get_output_state_index()], states

    def get_state_names(self) -> list:
        return self._cell.get_state_names()

    def get_output_state_index(self) -> int:
        return self._cell.output_index

    def get_output_dim(self) -> int:
        return self._cell.hidden_size


def _no_initializer(initializer) -> None:
    if initializer is not None:
        raise NotImplementedError("custom initializers are not supported: pass initial_states, or None for "
                                  "trainable zero states")


class LSTMCell(RNNCell):
    def __init__(self, input_size, hidden_size, forget_bias=0.0, memory_optimization=False, drop_states=False,
                 initializer=None, name=None, forward_only=False):
        _no_initializer(initializer)
        super().__init__(step_cells.LSTMCell(input_size, hidden_size, forget_bias, memory_optimization,
                                             drop_states, name), forward_only)


class BasicRNNCell(RNNCell):
    def __init__(self, input_size, hidden_size, forget_bias=0.0, memory_optimization=False, drop_states=False,
                 initializer=None, activation=None, name=None, forward_only=False):
        _no_initializer(initializer)
        if activation not in ("relu", "tanh"):
            raise RuntimeError(f"BasicRNNCell with unknown activation function ({activation})")
        super().__init__(step_cells.BasicRNNCell(input_size, hidden_size, activation, drop_states, name),
                         forward_only)


class GRUCell(RNNCell):
    def __init__(self, input_size, hidden_size, forget_bias=0.0, memory_optimization=False, drop_states=False,
                 linear_before_reset=False, name=None, forward_only=False):
        super().__init__(step_cells.GRUCell(input_size, hidden_size, drop_states, linear_before_reset, name),
                         forward_only)


class MultiRNNCell(RNNCell):
    """Cells stacked in one step net (each layer's output is the next one's input)."""

    def __init__(self, cells, residual_output_layers=None, name=None, forward_only=False):
        if residual_output_layers:
            raise NotImplementedError("residual_output_layers is not supported")
        super().__init__(step_cells.MultiRNNCell([c._cell for c in cells], name), forward_only)
