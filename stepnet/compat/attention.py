"""Caffe2's attention module: the attention step of a decoder over encoder outputs, as plain ops.

Shapes: encoder_outputs_transposed is N x D_enc x T_enc, weighted_encoder_outputs T_enc x N x D_enc, the
decoder's hidden state 1 x N x D_dec. Every attention type computes logits N x T_enc x 1, their softmax over the
encoder steps (attention_weights_3d, masked by encoder_lengths when given) and the context
`<scope>/attention_weighted_encoder_context` (1 x N x D_enc) = encoder_outputs_transposed x weights. Blob names are
`<scope>/<name>` written out, because the step's inputs and outputs live in different name scopes.

- Regular (arXiv:1409.0473): logits = v . tanh(weighted_encoder_outputs + W h_t)
- Recurrent (arXiv:1601.03317, 4.1): the previous context, through its own FC, is added inside the tanh
- Dot: logits = encoder_outputs . h_t (h_t through an FC first when the dimensions differ)
- SoftCoverage: coverage (the sum of past attention weights) times coverage_weights is added inside the tanh;
  returns the next coverage as well
"""
from __future__ import annotations

from . import brew


class AttentionType:
    Regular, Recurrent, Dot, SoftCoverage = tuple(range(4))


def s(scope, name):
    """`<scope>/<name>`, scoped by hand."""
    return f"{scope}/{name}"


def _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim, attention_weights_3d, scope):
    """The context, 1 x N x D_enc: BatchMatMul (N x D_enc x 1) reshaped in place."""
    context = brew.batch_mat_mul(model, [encoder_outputs_transposed, attention_weights_3d],
                                 s(scope, "attention_weighted_encoder_context"))
    context, _ = model.net.Reshape(context, [context, s(scope, "attention_weighted_encoder_context_old_shape")],
                                   shape=[1, -1, encoder_output_dim])
    return context


def _calc_attention_weights(model, attention_logits_transposed, scope, encoder_lengths=None):
    """Softmax over the encoder steps (axis 1) of the N x T_enc x 1 logits, masked past encoder_lengths."""
    if encoder_lengths is not None:
        attention_logits_transposed = model.net.SequenceMask([attention_logits_transposed, encoder_lengths],
                                                             ["masked_attention_logits"], mode="sequence")
    return brew.softmax(model, attention_logits_transposed, s(scope, "attention_weights_3d"), engine="CUDNN",
                        axis=1)


def _calc_attention_logits_from_sum_match(model, decoder_hidden_encoder_outputs_sum, encoder_output_dim, scope):
    """v . tanh(sum): Tanh in place, an FC to 1 (its bias frozen), transposed to N x T_enc x 1."""
    summed = model.net.Tanh(decoder_hidden_encoder_outputs_sum, decoder_hidden_encoder_outputs_sum)
    logits = brew.fc(model, summed, s(scope, "attention_logits"), dim_in=encoder_output_dim, dim_out=1, axis=2,
                     freeze_bias=True)
    return brew.transpose(model, logits, s(scope, "attention_logits_transposed"), axes=[1, 0, 2])


def _apply_fc_weight_for_sum_match(model, input, dim_in, dim_out, scope, name):  # noqa: A002 - Caffe2's name
    """FC(axis=2) of a 1 x N x dim_in blob, squeezed in place to N x dim_out."""
    output = brew.fc(model, input, s(scope, name), dim_in=dim_in, dim_out=dim_out, axis=2)
    return model.net.Squeeze(output, output, dims=[0])


def _weights_and_context(model, logits_transposed, encoder_outputs_transposed, encoder_output_dim, scope,
                         encoder_lengths):
    weights = _calc_attention_weights(model, logits_transposed, scope, encoder_lengths)
    context = _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim, weights, scope)
    return context, weights


def apply_recurrent_attention(model, encoder_output_dim, encoder_outputs_transposed, weighted_encoder_outputs,
                              decoder_hidden_state_t, decoder_hidden_state_dim,
                              attention_weighted_encoder_context_t_prev, scope, encoder_lengths=None):
    """Returns (context, attention_weights_3d, [blobs to recompute on backward])."""
    weighted_prev_context = _apply_fc_weight_for_sum_match(
        model, attention_weighted_encoder_context_t_prev, encoder_output_dim, encoder_output_dim, scope,
        "weighted_prev_attention_context")
    weighted_hidden = _apply_fc_weight_for_sum_match(model, decoder_hidden_state_t, decoder_hidden_state_dim,
                                                     encoder_output_dim, scope, "weighted_decoder_hidden_state")
    partial_sum = model.net.Add([weighted_prev_context, weighted_hidden],
                                s(scope, "decoder_hidden_encoder_outputs_sum_tmp"))
    total = model.net.Add([weighted_encoder_outputs, partial_sum], s(scope, "decoder_hidden_encoder_outputs_sum"),
                          broadcast=1)
    logits = _calc_attention_logits_from_sum_match(model, total, encoder_output_dim, scope)
    context, weights = _weights_and_context(model, logits, encoder_outputs_transposed, encoder_output_dim, scope,
                                            encoder_lengths)
    return context, weights, [total]


def apply_regular_attention(model, encoder_output_dim, encoder_outputs_transposed, weighted_encoder_outputs,
                            decoder_hidden_state_t, decoder_hidden_state_dim, scope, encoder_lengths=None):
    """Returns (context, attention_weights_3d, [blobs to recompute on backward])."""
    weighted_hidden = _apply_fc_weight_for_sum_match(model, decoder_hidden_state_t, decoder_hidden_state_dim,
                                                     encoder_output_dim, scope, "weighted_decoder_hidden_state")
    total = model.net.Add([weighted_encoder_outputs, weighted_hidden], s(scope, "decoder_hidden_encoder_outputs_sum"),
                          broadcast=1, use_grad_hack=1)
    logits = _calc_attention_logits_from_sum_match(model, total, encoder_output_dim, scope)
    context, weights = _weights_and_context(model, logits, encoder_outputs_transposed, encoder_output_dim, scope,
                                            encoder_lengths)
    return context, weights, [total]


def apply_dot_attention(model, encoder_output_dim, encoder_outputs_transposed, decoder_hidden_state_t,
                        decoder_hidden_state_dim, scope, encoder_lengths=None):
    """Returns (context, attention_weights_3d, [])."""
    hidden = decoder_hidden_state_t
    if decoder_hidden_state_dim != encoder_output_dim:
        hidden = brew.fc(model, decoder_hidden_state_t, s(scope, "weighted_decoder_hidden_state"),
                         dim_in=decoder_hidden_state_dim, dim_out=encoder_output_dim, axis=2)
    squeezed = model.net.Squeeze(hidden, s(scope, "squeezed_weighted_decoder_hidden_state"), dims=[0])
    column = model.net.ExpandDims(squeezed, squeezed, dims=[2])     # N x D x 1
    logits = model.net.BatchMatMul([encoder_outputs_transposed, column], s(scope, "attention_logits"), trans_a=1)
    context, weights = _weights_and_context(model, logits, encoder_outputs_transposed, encoder_output_dim, scope,
                                            encoder_lengths)
    return context, weights, []


def apply_soft_coverage_attention(model, encoder_output_dim, encoder_outputs_transposed, weighted_encoder_outputs,
                                  decoder_hidden_state_t, decoder_hidden_state_dim, scope, encoder_lengths,
                                  coverage_t_prev, coverage_weights):
    """Returns (context, attention_weights_3d, [blobs to recompute on backward], coverage_t)."""
    weighted_hidden = _apply_fc_weight_for_sum_match(model, decoder_hidden_state_t, decoder_hidden_state_dim,
                                                     encoder_output_dim, scope, "weighted_decoder_hidden_state")
    total = model.net.Add([weighted_encoder_outputs, weighted_hidden], s(scope, "decoder_hidden_encoder_outputs_sum"),
                          broadcast=1)
    coverage_2d = model.net.Squeeze(coverage_t_prev, s(scope, "coverage_t_prev_2d"), dims=[0])    # N x T_enc
    coverage_transposed = brew.transpose(model, coverage_2d, s(scope, "coverage_t_prev_transposed"))
    scaled_coverage = model.net.Mul([coverage_weights, coverage_transposed], s(scope, "scaled_coverage_weights"),
                                    broadcast=1, axis=0)
    # Caffe2 adds in place here (into decoder_hidden_encoder_outputs_sum), and the Tanh that follows overwrites it
    # again; stepnet's backward pass refuses AddGradient's read of a blob overwritten later (it reads A only for
    # its shape, which the Tanh keeps), so the sum with coverage gets a name of its own. Same values.
    total = model.net.Add([total, scaled_coverage], s(scope, "decoder_hidden_encoder_outputs_sum_with_coverage"))
    logits = _calc_attention_logits_from_sum_match(model, total, encoder_output_dim, scope)
    context, weights = _weights_and_context(model, logits, encoder_outputs_transposed, encoder_output_dim, scope,
                                            encoder_lengths)
    weights_2d = model.net.Squeeze(weights, s(scope, "attention_weights_2d"), dims=[2])
    coverage_t = model.net.Add([coverage_t_prev, weights_2d], s(scope, "coverage_t"), broadcast=1)
    return context, weights, [total], coverage_t
