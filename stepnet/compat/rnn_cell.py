"""Caffe2's rnn_cell: the RNNCell classes (_rnn_cell_base, _lstm_cells, _attention_cells, gru_cell's GRUCell)
and the layers built from them: LSTM, BasicRNN, MILSTM, LayerNormLSTM, LayerNormMILSTM (one cell per layer,
several layers as a MultiRNNCell in one RecurrentNetwork op, or statically unrolled), LSTMWithAttention, and the
parameter helpers of Caffe2's cuDNN LSTM. `model` is a model_helper.ModelHelper."""
from __future__ import annotations

import functools

import numpy as np

from . import workspace
from ._attention_cells import (AttentionCell, LSTMWithAttention, LSTMWithAttentionCell,  # noqa: F401
                               MILSTMWithAttentionCell)
from ._lstm_cells import (BasicRNNCell, LayerNormLSTMCell, LayerNormMILSTMCell, LSTMCell,  # noqa: F401
                          MILSTMCell)
from ._rnn_cell_base import (DropoutCell, LSTMInitializer, MultiRNNCell, MultiRNNCellInitializer,  # noqa: F401
                             RNNCell, UnrolledCell)
from ._rnn_cell_base import _rectify_name as _RectifyName, _rectify_names as _RectifyNames  # noqa: F401
from .attention import AttentionType  # noqa: F401
from .recurrent import on_device  # noqa: F401 - kept where it was


def _LSTM(cell_class, model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope=None,
          outputs_with_grads=(0,), return_params=False, memory_optimization=False, forget_bias=0.0,
          forward_only=False, drop_states=False, return_last_layer_only=True, static_rnn_unroll_size=None,
          **cell_kwargs):
    """A recurrent layer of cell_class over the T x N x dim_in input_blob (dim_out: an int, or one per layer).

    As in Caffe2, the outputs are counted 4 per layer (an LSTM's h_all, h_last, c_all, c_last):
    outputs_with_grads index the last layer's, offset by 4 x (layers - 1), and return_last_layer_only returns
    the outputs from that offset on. initial_states: 2 per layer (h, c), or None for trainable zero states.
    return_params adds {'input': ..., 'recurrent': ...} parameter names (LSTMCell's)."""
    dims = list(dim_out) if isinstance(dim_out, (list, tuple)) else [dim_out]
    if not dims:
        raise ValueError("dim_out is empty: give the hidden size of each layer")
    layers = len(dims)
    cells = [cell_class(input_size=dim_in if i == 0 else dims[i - 1], hidden_size=dims[i], forget_bias=forget_bias,
                        memory_optimization=memory_optimization, name=scope if layers == 1 else None,
                        forward_only=forward_only, drop_states=drop_states, **cell_kwargs)
             for i in range(layers)]
    cell = MultiRNNCell(cells, name=scope, forward_only=forward_only) if layers > 1 else cells[0]
    if static_rnn_unroll_size is not None:
        cell = UnrolledCell(cell, static_rnn_unroll_size)
    offset = 4 * (layers - 1)
    _, result = cell.apply_over_sequence(model=model, inputs=input_blob, seq_lengths=seq_lengths,
                                         initial_states=initial_states,
                                         outputs_with_grads=[offset + i for i in outputs_with_grads])
    if return_last_layer_only:
        result = result[offset:]
    if return_params:
        result = list(result) + [{"input": cell.get_input_params(), "recurrent": cell.get_recurrent_params()}]
    return tuple(result)


LSTM = functools.partial(_LSTM, LSTMCell)
BasicRNN = functools.partial(_LSTM, BasicRNNCell)
MILSTM = functools.partial(_LSTM, MILSTMCell)
LayerNormLSTM = functools.partial(_LSTM, LayerNormLSTMCell)
LayerNormMILSTM = functools.partial(_LSTM, LayerNormMILSTMCell)


def _layered_LSTM(model, input_blob, seq_lengths, initial_states, dim_in, dim_out, scope, outputs_with_grads=(0,),
                  return_params=False, memory_optimization=False, forget_bias=0.0, forward_only=False,
                  drop_states=False, create_lstm=None):
    """Layers as separate ops: each layer's (h_all, h_last, c_all, c_last) feeds the next (scope
    `<scope>_layer_<i>` from the second on)."""
    params = dict(model=model, input_blob=input_blob, seq_lengths=seq_lengths, initial_states=initial_states,
                  dim_in=dim_in, dim_out=dim_out, scope=scope, outputs_with_grads=outputs_with_grads,
                  return_params=return_params, memory_optimization=memory_optimization, forget_bias=forget_bias,
                  forward_only=forward_only, drop_states=drop_states)
    if not isinstance(dim_out, list):
        return create_lstm(**params)
    if len(dim_out) == 1:
        return create_lstm(**{**params, "dim_out": dim_out[0]})
    if not dim_out:
        raise ValueError("dim_out list can't be empty")
    if return_params:
        raise ValueError("return_params not supported for layering")
    for i, dim in enumerate(dim_out):
        output, last_output, all_states, last_state = create_lstm(**{**params, "dim_out": dim})
        params.update(input_blob=output, dim_in=dim, initial_states=(last_output, last_state),
                      scope=f"{scope}_layer_{i + 1}")
    return output, last_output, all_states, last_state


layered_LSTM = functools.partial(_layered_LSTM, create_lstm=LSTM)


def GetLSTMParamNames() -> dict:
    return {"weights": ["input_gate_w", "forget_gate_w", "output_gate_w", "cell_w"],
            "biases": ["input_gate_b", "forget_gate_b", "output_gate_b", "cell_b"]}


def InitFromLSTMParams(lstm_pblobs, param_values) -> None:
    """Feed the LSTM parameter blobs (lstm_pblobs[input_type]['weights' / 'biases']) from per-gate values
    (param_values[input_type][<gate param name>]), concatenated in GetLSTMParamNames' order."""
    names = GetLSTMParamNames()
    for input_type, values in param_values.items():
        for kind in ("weights", "biases"):
            flat = np.concatenate([np.asarray(values[p]).ravel() for p in names[kind]])
            blob = lstm_pblobs[input_type][kind]
            current = workspace.FetchBlob(blob)
            workspace.FeedBlob(blob, flat.reshape(current.shape).astype(np.float32))


def cudnn_LSTM(model, input_blob, initial_states, dim_in, dim_out, scope, recurrent_params=None,
               input_params=None, num_layers=1, return_params=False):
    """Caffe2's cuDNN LSTM (the Recurrent op with its packed weight blob): not available in stepnet."""
    raise NotImplementedError("cudnn_LSTM needs cuDNN's Recurrent op, which stepnet does not have: use "
                              "rnn_cell.LSTM (the same layer as a RecurrentNetwork op)")
