"""Caffe2's seq2seq_util: what the seq2seq programs (train.py, translate.py) build their models from.

- vocabularies: `gen_vocab` (token -> id, the four special tokens first) and `get_numberized_sentence`;
- the encoder, `build_embedding_encoder`: embedded inputs (T x N, int32 ids; the programs feed sources reversed)
  through LSTM layers, the first one bidirectional if asked (`rnn_bidirectional_layer`: a forward LSTM and one
  over ReversePackedSegs of the input, concatenated on the feature axis);
- the decoder, `build_embedding_decoder`: LSTM layers in one MultiRNNCell, with attention over the encoder
  outputs (`LSTMWithAttentionDecoder`), started from the encoder's final states (`build_initial_rnn_decoder_states`);
- `output_projection`: the logits over the target vocabulary.

Blob and parameter names are Caffe2's (`encoder/layer0/fw/lstm/...`, `decoder/layer_0/...`,
`attention_decoder/...`, `output_projection_w`): translate.py loads a train.py checkpoint by those names and
drives the decoder's step net through `<scope>/<state>_prev` blobs.
"""
from __future__ import annotations

import collections

from ... import attention, brew, core, rnn_cell
from ....io.proto import CPU

PAD_ID, PAD = 0, "<PAD>"
GO_ID, GO = 1, "<GO>"
EOS_ID, EOS = 2, "<EOS>"
UNK_ID, UNK = 3, "<UNK>"

ATTENTION_TYPES = {"regular": attention.AttentionType.Regular, "recurrent": attention.AttentionType.Recurrent,
                   "dot": attention.AttentionType.Dot}


def gen_vocab(corpus, unk_threshold):
    """{token: id} for the corpus file (one sentence a line, tokens split on whitespace): the special tokens take
    ids 0-3, then every token seen more than unk_threshold times, in order of first appearance. As in Caffe2 it
    is a defaultdict: looking up a missing token gives it the next id."""
    vocab = collections.defaultdict(lambda: len(vocab))
    for token in (PAD, GO, EOS, UNK):
        vocab[token]
    counts = collections.Counter()
    with open(corpus) as f:
        for sentence in f:
            counts.update(sentence.split())
    for token, count in counts.items():
        if count > unk_threshold:
            vocab[token]
    return vocab


def get_numberized_sentence(sentence, vocab):
    """The ids of the sentence's tokens, UNK's id for a token the vocabulary lacks."""
    return [vocab[token] if token in vocab else vocab[UNK] for token in sentence.split()]


def _scoped(scope, name):
    return f"{scope}/{name}" if scope else name


def rnn_unidirectional_layer(model, inputs, input_lengths, input_size, num_units, dropout_keep_prob, forward_only,
                             return_sequence_output, return_final_state, scope=None):
    """One LSTM layer (`<scope>/lstm`, dropout on its output when dropout_keep_prob is given) from zero states.
    Returns (the T x N x num_units outputs, the final hidden state, the final cell state); only the outputs asked
    for get gradients."""
    with core.NameScope(scope):
        initial_cell = model.param_init_net.ConstantFill([], "initial_cell_state", shape=[num_units], value=0.0)
        initial_hidden = model.param_init_net.ConstantFill([], "initial_hidden_state", shape=[num_units],
                                                           value=0.0)
    cell = rnn_cell.LSTMCell(input_size=input_size, hidden_size=num_units, forget_bias=0.0,
                             memory_optimization=False, name=_scoped(scope, "lstm"), forward_only=forward_only)
    if dropout_keep_prob is not None:
        cell = rnn_cell.DropoutCell(internal_cell=cell, dropout_ratio=1.0 - dropout_keep_prob,
                                    name=_scoped(scope, "dropout"), forward_only=forward_only, is_test=False)
    with_grads = ([0] if return_sequence_output else []) + ([1, 3] if return_final_state else [])
    outputs, (_, final_hidden, _, final_cell) = cell.apply_over_sequence(
        model=model, inputs=inputs, seq_lengths=input_lengths, initial_states=(initial_hidden, initial_cell),
        outputs_with_grads=with_grads)
    return outputs, final_hidden, final_cell


def rnn_bidirectional_layer(model, inputs, input_lengths, input_size, num_units, dropout_keep_prob, forward_only,
                            return_sequence_output, return_final_state, scope=None):
    """A forward LSTM (`<scope>/fw`) and a backward one (`<scope>/bw`, over each sequence reversed within its
    length, its outputs reversed back), joined on axis 2: outputs and final states have 2 x num_units features
    (None where not asked for)."""
    args = dict(input_lengths=input_lengths, input_size=input_size, num_units=num_units,
                dropout_keep_prob=dropout_keep_prob, forward_only=forward_only,
                return_sequence_output=return_sequence_output, return_final_state=return_final_state)
    outputs_fw, hidden_fw, cell_fw = rnn_unidirectional_layer(model, inputs, scope=_scoped(scope, "fw"), **args)
    with core.NameScope(scope):
        reversed_inputs = model.net.ReversePackedSegs([inputs, input_lengths], ["reversed_inputs"])
    outputs_bw, hidden_bw, cell_bw = rnn_unidirectional_layer(model, reversed_inputs, scope=_scoped(scope, "bw"),
                                                              **args)
    with core.NameScope(scope):
        outputs_bw = model.net.ReversePackedSegs([outputs_bw, input_lengths], ["outputs_bw"])

    def join(fw, bw, name):
        with core.NameScope(scope):
            return model.net.Concat([fw, bw], [name, name + "_dim"], axis=2)[0]

    outputs = join(outputs_fw, outputs_bw, "outputs") if return_sequence_output else None
    if not return_final_state:
        return outputs, None, None
    return (outputs, join(hidden_fw, hidden_bw, "final_hidden_state"),
            join(cell_fw, cell_bw, "final_cell_state"))


def build_embeddings(model, vocab_size, embedding_size, name, freeze_embeddings):
    """A vocab_size x embedding_size table, Gaussian (std 0.1); a trained parameter unless frozen."""
    embeddings = model.param_init_net.GaussianFill([], name, shape=[vocab_size, embedding_size], std=0.1)
    if not freeze_embeddings:
        model.params.append(embeddings)
    return embeddings


def get_layer_scope(scope, layer_type, i):
    return f"{_scoped(scope, layer_type)}/layer{i}"


def _embed(model, embeddings, inputs, name, num_gpus, scope):
    """Gather of the ids' rows (on the CPU, then copied to the GPU, when num_gpus > 0)."""
    with core.NameScope(scope or ""):
        if num_gpus == 0:
            return model.net.Gather([embeddings, inputs], [name])
        with core.DeviceScope(core.DeviceOption(CPU)):
            on_cpu = model.net.Gather([embeddings, inputs], [name + "_cpu"])
        return model.CopyCPUToGPU(on_cpu, name)


def build_embedding_encoder(model, encoder_params, num_decoder_layers, inputs, input_lengths, vocab_size,
                            embeddings, embedding_size, use_attention, num_gpus=0, forward_only=False, scope=None):
    """The encoder of encoder_params['encoder_layer_configs'] (num_units, dropout_keep_prob per layer; the first
    layer bidirectional with use_bidirectional_encoder). The last num_decoder_layers layers return their final
    states (to start the decoder), the last layer its sequence output only when use_attention.

    Returns (encoder outputs, weighted encoder outputs (None: the attention cell makes them), final hidden states,
    final cell states (one per layer, None where not returned), output units per layer)."""
    layer_inputs = _embed(model, embeddings, inputs, "embedded_encoder_inputs", num_gpus, scope)
    layer_input_size = embedding_size
    configs = encoder_params["encoder_layer_configs"]
    bidirectional = encoder_params.get("use_bidirectional_encoder", False)
    units, final_hidden, final_cell = [], [], []
    for i, config in enumerate(configs):
        first_bidirectional = bidirectional and i == 0
        layer = rnn_bidirectional_layer if first_bidirectional else rnn_unidirectional_layer
        output_dims = config["num_units"] * (2 if first_bidirectional else 1)
        units.append(output_dims)
        last = i == len(configs) - 1
        outputs, hidden, cell = layer(
            model=model, inputs=layer_inputs, input_lengths=input_lengths, input_size=layer_input_size,
            num_units=config["num_units"], dropout_keep_prob=config.get("dropout_keep_prob"),
            forward_only=forward_only, return_sequence_output=not last or use_attention,
            return_final_state=i >= len(configs) - num_decoder_layers, scope=get_layer_scope(scope, "encoder", i))
        if not last:
            layer_inputs, layer_input_size = outputs, output_dims
        final_hidden.append(hidden)
        final_cell.append(cell)
    return outputs, None, final_hidden, final_cell, units


class LSTMWithAttentionDecoder:
    """The decoder's cell: the LSTM layers as one MultiRNNCell (`<name>/decoder`), wrapped in an AttentionCell
    (`<name>/attention_decoder`) unless attention_type is 'none'. Its output is the last layer's hidden state,
    with the attention context appended (decoder_num_units + encoder_output_dim features) when attending."""

    def scope(self, name):
        return _scoped(self.name, name)

    def _get_attention_type(self, attention_type_as_string):
        if attention_type_as_string not in ATTENTION_TYPES:
            raise ValueError(f"unknown attention type {attention_type_as_string!r}: one of 'none', "
                             + ", ".join(repr(t) for t in ATTENTION_TYPES))
        return ATTENTION_TYPES[attention_type_as_string]

    def __init__(self, encoder_outputs, encoder_output_dim, encoder_lengths, vocab_size, attention_type,
                 embedding_size, decoder_num_units, decoder_cells, residual_output_layers=None, name=None,
                 weighted_encoder_outputs=None):
        self.name = name
        self.num_layers = len(decoder_cells)
        layers = rnn_cell.MultiRNNCell(decoder_cells, name=self.scope("decoder"),
                                       residual_output_layers=residual_output_layers)
        self.use_attention = attention_type != "none"
        if not self.use_attention:
            self.cell, self.decoder_output_dim = layers, decoder_num_units
            self.output_indices = list(layers.output_indices)
            return
        self.cell = rnn_cell.AttentionCell(
            encoder_output_dim=encoder_output_dim, encoder_outputs=encoder_outputs, encoder_lengths=encoder_lengths,
            decoder_cell=layers, decoder_state_dim=decoder_num_units, name=self.scope("attention_decoder"),
            attention_type=self._get_attention_type(attention_type),
            weighted_encoder_outputs=weighted_encoder_outputs, attention_memory_optimization=True)
        self.decoder_output_dim = decoder_num_units + encoder_output_dim
        # the context is the state after the layers' (two per layer: hidden, cell)
        self.output_indices = list(layers.output_indices) + [2 * self.num_layers]

    def get_state_names(self):
        return self.cell.get_state_names()

    def get_outputs_with_grads(self):
        """The RecurrentNetwork outputs that get gradients: each state's sequence output is at twice its index."""
        return [2 * i for i in self.output_indices]

    def get_output_dim(self):
        return self.decoder_output_dim

    def get_attention_weights(self):
        """N x T_enc x 1, of the step last applied."""
        if not self.use_attention:
            raise ValueError("this decoder has no attention (attention_type 'none'): no attention weights")
        return self.cell.get_attention_weights()

    def apply(self, model, input_t, seq_lengths, states, timestep):
        return self.cell.apply(model=model, input_t=input_t, seq_lengths=seq_lengths, states=states,
                               timestep=timestep)

    def apply_over_sequence(self, model, inputs, seq_lengths, initial_states):
        return self.cell.apply_over_sequence(model=model, inputs=inputs, seq_lengths=seq_lengths,
                                             initial_states=initial_states,
                                             outputs_with_grads=self.get_outputs_with_grads())


def _initial_state(model, final_states, index, encoder_units, units, name):
    """A decoder layer's initial state: the encoder's final state (through an FC when the sizes differ), or a
    trained zero vector when that encoder layer has none."""
    final = final_states[index] if final_states and len(final_states) > index else None
    if final is None:
        state = model.param_init_net.ConstantFill([], name, shape=[units], value=0.0)
        model.params.append(state)
        return state
    if units != encoder_units[index]:
        return brew.fc(model, final, name, encoder_units[index], units, axis=2)
    return final


def build_initial_rnn_decoder_states(model, encoder_units_per_layer, decoder_units_per_layer,
                                     final_encoder_hidden_states, final_encoder_cell_states, use_attention):
    """The decoder's initial states, (hidden, cell) per layer, then the initial attention context (a trained zero
    vector) when use_attention. Decoder layer i starts from encoder layer i + offset, the encoders' last layers
    lining up with the decoder's."""
    offset = max(len(encoder_units_per_layer) - len(decoder_units_per_layer), 0)
    states = []
    for i, units in enumerate(decoder_units_per_layer):
        states.append(_initial_state(model, final_encoder_hidden_states, i + offset, encoder_units_per_layer, units,
                                     f"decoder_initial_hidden_state_{i}"))
        states.append(_initial_state(model, final_encoder_cell_states, i + offset, encoder_units_per_layer, units,
                                     f"decoder_initial_cell_state_{i}"))
    if use_attention:
        context = model.param_init_net.ConstantFill([], "initial_attention_weighted_encoder_context",
                                                    shape=[encoder_units_per_layer[-1]], value=0.0)
        model.params.append(context)
        states.append(context)
    return states


def build_embedding_decoder(model, decoder_layer_configs, inputs, input_lengths, encoder_lengths, encoder_outputs,
                            weighted_encoder_outputs, final_encoder_hidden_states, final_encoder_cell_states,
                            encoder_units_per_layer, vocab_size, embeddings, embedding_size, attention_type,
                            forward_only, num_gpus=0, scope=None):
    """The decoder over the embedded inputs (teacher forcing: the targets shifted right behind GO). Returns (its
    outputs flattened to (T x N) x output dim, the output dim)."""
    embedded = _embed(model, embeddings, inputs, "embedded_decoder_inputs", num_gpus, scope)
    cells, units = [], []
    for i, config in enumerate(decoder_layer_configs):
        units.append(config["num_units"])
        cell = rnn_cell.LSTMCell(forward_only=forward_only,
                                 input_size=embedding_size if i == 0 else cells[-1].get_output_dim(),
                                 hidden_size=config["num_units"], forget_bias=0.0, memory_optimization=False)
        keep = config.get("dropout_keep_prob")
        if keep is not None:
            cell = rnn_cell.DropoutCell(internal_cell=cell, dropout_ratio=1.0 - keep, forward_only=forward_only,
                                        is_test=False, name=get_layer_scope(scope, "decoder_dropout", i))
        cells.append(cell)
    states = build_initial_rnn_decoder_states(
        model=model, encoder_units_per_layer=encoder_units_per_layer, decoder_units_per_layer=units,
        final_encoder_hidden_states=final_encoder_hidden_states,
        final_encoder_cell_states=final_encoder_cell_states, use_attention=attention_type != "none")
    decoder = LSTMWithAttentionDecoder(
        encoder_outputs=encoder_outputs, encoder_output_dim=encoder_units_per_layer[-1],
        encoder_lengths=encoder_lengths, vocab_size=vocab_size, attention_type=attention_type,
        embedding_size=embedding_size, decoder_num_units=units[-1], decoder_cells=cells,
        weighted_encoder_outputs=weighted_encoder_outputs, name=scope)
    outputs, _ = decoder.apply_over_sequence(model=model, inputs=embedded, seq_lengths=input_lengths,
                                             initial_states=states)
    flattened, _ = model.net.Reshape(
        [outputs], ["decoder_outputs_flattened", "decoder_outputs_and_contexts_combination_old_shape"],
        shape=[-1, decoder.get_output_dim()])
    return flattened, decoder.get_output_dim()


def output_projection(model, decoder_outputs, decoder_output_size, target_vocab_size, decoder_softmax_size):
    """Logits over the target vocabulary: an FC (Xavier-initialized `output_projection_w` / `_b`), after an FC to
    decoder_softmax_size features when that is given."""
    if decoder_softmax_size is not None:
        decoder_outputs = brew.fc(model, decoder_outputs, "decoder_outputs_scaled", dim_in=decoder_output_size,
                                  dim_out=decoder_softmax_size)
        decoder_output_size = decoder_softmax_size
    weights = model.param_init_net.XavierFill([], "output_projection_w",
                                              shape=[target_vocab_size, decoder_output_size])
    bias = model.param_init_net.XavierFill([], "output_projection_b", shape=[target_vocab_size])
    model.params.extend([weights, bias])
    return model.net.FC([decoder_outputs, weights, bias], ["output_logits"])
