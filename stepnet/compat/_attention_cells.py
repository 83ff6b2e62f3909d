"""Caffe2's AttentionCell (a decoder cell plus attention over encoder outputs, compat.attention), its LSTM and
MILSTM forms, and the LSTMWithAttention layer.

Per step: the decoder cell runs with the previous attention context as an extra input of its recurrent FC; its
output attends over the encoder outputs; the states are the decoder's (its output state renamed
`<name>/hidden_t_external`, a Copy) plus the new context (and the coverage, for SoftCoverage). The cell's output
is the decoder output concatenated with the context (`states_and_context_combination`).
"""
from __future__ import annotations

from . import brew, scope
from ._lstm_cells import LSTMCell, MILSTMCell
from ._rnn_cell_base import RNNCell
from .attention import (AttentionType, apply_dot_attention, apply_recurrent_attention, apply_regular_attention,
                        apply_soft_coverage_attention)
from ..io.proto import CUDA

ATTENTION_TYPES = (AttentionType.Regular, AttentionType.Recurrent, AttentionType.Dot, AttentionType.SoftCoverage)


class AttentionCell(RNNCell):
    def __init__(self, encoder_output_dim, encoder_outputs, encoder_lengths, decoder_cell, decoder_state_dim,
                 attention_type, weighted_encoder_outputs, attention_memory_optimization, **kwargs):
        super().__init__(**kwargs)
        if attention_type not in ATTENTION_TYPES:
            raise ValueError(f"unknown attention_type {attention_type!r}: one of AttentionType.Regular (0), "
                             "Recurrent (1), Dot (2), SoftCoverage (3)")
        self.encoder_output_dim = encoder_output_dim
        self.encoder_outputs = encoder_outputs
        self.encoder_lengths = encoder_lengths
        self.decoder_cell = decoder_cell
        self.decoder_state_dim = decoder_state_dim
        self.weighted_encoder_outputs = weighted_encoder_outputs
        self.encoder_outputs_transposed = None
        self.attention_type = attention_type
        self.attention_memory_optimization = attention_memory_optimization

    @property
    def _coverage(self) -> bool:
        return self.attention_type == AttentionType.SoftCoverage

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        if extra_inputs is not None:
            raise ValueError("an AttentionCell takes no extra_inputs (its context is the decoder's extra input)")
        extra = 2 if self._coverage else 1
        decoder_prev_states, context_prev = states[:-extra], states[-extra]
        decoder_states = self.decoder_cell._apply(model, input_t, seq_lengths, decoder_prev_states, timestep,
                                                  extra_inputs=[(context_prev, self.encoder_output_dim)])
        self.hidden_t_intermediate = self.decoder_cell._prepare_output(model, decoder_states)
        common = dict(model=model, encoder_output_dim=self.encoder_output_dim,
                      encoder_outputs_transposed=self.encoder_outputs_transposed,
                      decoder_hidden_state_t=self.hidden_t_intermediate,
                      decoder_hidden_state_dim=self.decoder_state_dim, scope=self.name,
                      encoder_lengths=self.encoder_lengths)
        coverage_t = None
        if self.attention_type == AttentionType.Recurrent:
            context, self.attention_weights_3d, blobs = apply_recurrent_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs,
                attention_weighted_encoder_context_t_prev=context_prev, **common)
        elif self.attention_type == AttentionType.Regular:
            context, self.attention_weights_3d, blobs = apply_regular_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs, **common)
        elif self.attention_type == AttentionType.Dot:
            context, self.attention_weights_3d, blobs = apply_dot_attention(**common)
        else:
            context, self.attention_weights_3d, blobs, coverage_t = apply_soft_coverage_attention(
                weighted_encoder_outputs=self.weighted_encoder_outputs, coverage_t_prev=states[-1],
                coverage_weights=self.coverage_weights, **common)
        if self.attention_memory_optimization:
            self.recompute_blobs.extend(blobs)
        output = list(decoder_states) + [context] + ([coverage_t] if coverage_t is not None else [])
        k = self.decoder_cell.get_output_state_index()
        output[k] = model.Copy(output[k], self.scope("hidden_t_external"))
        model.net.AddExternalOutputs(*output)
        return output

    def get_attention_weights(self):
        """N x T_enc x 1, the last step's."""
        return self.attention_weights_3d

    def prepare_input(self, model, input_blob):
        """encoder_outputs transposed to N x D x T once; weighted_encoder_outputs (an FC of encoder_outputs)
        unless given or Dot; then the decoder cell's own input projection."""
        if self.encoder_outputs_transposed is None:
            self.encoder_outputs_transposed = brew.transpose(model, self.encoder_outputs,
                                                             self.scope("encoder_outputs_transposed"),
                                                             axes=[1, 2, 0])
        if self.weighted_encoder_outputs is None and self.attention_type != AttentionType.Dot:
            self.weighted_encoder_outputs = brew.fc(model, self.encoder_outputs,
                                                    self.scope("weighted_encoder_outputs"),
                                                    dim_in=self.encoder_output_dim,
                                                    dim_out=self.encoder_output_dim, axis=2)
        return self.decoder_cell.prepare_input(model, input_blob)

    def build_initial_coverage(self, model):
        """SoftCoverage: sets coverage_weights (an FC of encoder_outputs) and returns the initial coverage,
        zeros of shape [T_enc] made at run time from encoder_outputs' shape."""
        if not self._coverage:
            raise ValueError("build_initial_coverage is for AttentionType.SoftCoverage")
        self.coverage_weights = brew.fc(model, self.encoder_outputs, self.scope("coverage_weights"),
                                        dim_in=self.encoder_output_dim, dim_out=self.encoder_output_dim, axis=2)
        encoder_length = model.net.Slice(model.net.Shape(self.encoder_outputs), starts=[0], ends=[1])
        device = scope.CurrentDeviceScope()
        if device is not None and device.device_type == CUDA:
            encoder_length = model.net.CopyGPUToCPU(encoder_length, "encoder_length_cpu")
        return model.net.ConstantFill(encoder_length, self.scope("initial_coverage"), value=0.0, input_as_shape=1)

    def get_state_names(self):
        names = list(self.decoder_cell.get_state_names())
        names[self.get_output_state_index()] = self.scope("hidden_t_external")
        names.append(self.scope("attention_weighted_encoder_context_t"))
        if self._coverage:
            names.append(self.scope("coverage_t"))
        return names

    def get_output_dim(self):
        return self.decoder_state_dim + self.encoder_output_dim

    def get_output_state_index(self):
        return self.decoder_cell.get_output_state_index()

    def _combine(self, model, decoder_output, context):
        with scope.NameScope(self.name or ""):
            return brew.concat(model, [decoder_output, context], "states_and_context_combination", axis=2)

    def _prepare_output(self, model, states):
        return self._combine(model, self.hidden_t_intermediate, states[-2 if self._coverage else -1])

    def _prepare_output_sequence(self, model, state_outputs):
        extra = 2 if self._coverage else 1
        decoder_output = self.decoder_cell._prepare_output_sequence(model, state_outputs[:-2 * extra])
        context_index = 2 * (len(self.get_state_names()) - extra)
        return self._combine(model, decoder_output, state_outputs[context_index])


class LSTMWithAttentionCell(AttentionCell):
    """An AttentionCell over an LSTMCell named `<name>/decoder`."""

    decoder_class = LSTMCell

    def __init__(self, encoder_output_dim, encoder_outputs, encoder_lengths, decoder_input_dim, decoder_state_dim,
                 name, attention_type, weighted_encoder_outputs, forget_bias, lstm_memory_optimization,
                 attention_memory_optimization, forward_only=False):
        decoder_cell = self.decoder_class(input_size=decoder_input_dim, hidden_size=decoder_state_dim,
                                          forget_bias=forget_bias, memory_optimization=lstm_memory_optimization,
                                          name=f"{name}/decoder", forward_only=False, drop_states=False)
        super().__init__(encoder_output_dim=encoder_output_dim, encoder_outputs=encoder_outputs,
                         encoder_lengths=encoder_lengths, decoder_cell=decoder_cell,
                         decoder_state_dim=decoder_state_dim, name=name, attention_type=attention_type,
                         weighted_encoder_outputs=weighted_encoder_outputs,
                         attention_memory_optimization=attention_memory_optimization, forward_only=forward_only)


class MILSTMWithAttentionCell(LSTMWithAttentionCell):
    """An AttentionCell over a MILSTMCell named `<name>/decoder` (encoder_lengths: None unless given)."""

    decoder_class = MILSTMCell

    def __init__(self, encoder_output_dim, encoder_outputs, decoder_input_dim, decoder_state_dim, name,
                 attention_type, weighted_encoder_outputs, forget_bias, lstm_memory_optimization,
                 attention_memory_optimization, forward_only=False, encoder_lengths=None):
        super().__init__(encoder_output_dim, encoder_outputs, encoder_lengths, decoder_input_dim,
                         decoder_state_dim, name, attention_type, weighted_encoder_outputs, forget_bias,
                         lstm_memory_optimization, attention_memory_optimization, forward_only)


def LSTMWithAttention(model, decoder_inputs, decoder_input_lengths, initial_decoder_hidden_state,
                      initial_decoder_cell_state, initial_attention_weighted_encoder_context, encoder_output_dim,
                      encoder_outputs, encoder_lengths, decoder_input_dim, decoder_state_dim, scope,
                      attention_type=AttentionType.Regular, outputs_with_grads=(0, 4), weighted_encoder_outputs=None,
                      lstm_memory_optimization=False, attention_memory_optimization=False, forget_bias=0.0,
                      forward_only=False):
    """An LSTM decoder with attention over encoder_outputs (T_enc x N x encoder_output_dim) as one
    RecurrentNetwork op; returns (hidden_all, hidden_last, cell_all, cell_last, context_all, context_last
    [, coverage_all, coverage_last])."""
    cell = LSTMWithAttentionCell(
        encoder_output_dim=encoder_output_dim, encoder_outputs=encoder_outputs, encoder_lengths=encoder_lengths,
        decoder_input_dim=decoder_input_dim, decoder_state_dim=decoder_state_dim, name=scope,
        attention_type=attention_type, weighted_encoder_outputs=weighted_encoder_outputs, forget_bias=forget_bias,
        lstm_memory_optimization=lstm_memory_optimization,
        attention_memory_optimization=attention_memory_optimization, forward_only=forward_only)
    initial_states = [initial_decoder_hidden_state, initial_decoder_cell_state,
                      initial_attention_weighted_encoder_context]
    if attention_type == AttentionType.SoftCoverage:
        initial_states.append(cell.build_initial_coverage(model))
    _, result = cell.apply_over_sequence(model=model, inputs=decoder_inputs, seq_lengths=decoder_input_lengths,
                                         initial_states=initial_states, outputs_with_grads=outputs_with_grads)
    return result
