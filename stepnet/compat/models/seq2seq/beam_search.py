"""Caffe2's beam_search: beam search over a decoder's step, as one forward-only RecurrentNetwork op.

The caller writes one decoder step into `get_step_model()` (reading `get_previous_tokens()`, 1 x beam_size int32,
and `get_timestep()`), giving its log-probabilities over the vocabulary (beam_size x V) and attention weights
(beam_size x T_enc x 1). `apply` adds the search around it: per step, the beam_size best tokens of every
hypothesis, their scores plus the hypothesis' score (plus a per-token reward), the beam_size best of all those
(of the first hypothesis' only at step 0, when the beam holds GO alone), and the decoder states, tokens and
attention of the hypotheses they extend. The step net's recurrent blobs are `scores_t_prev`, `tokens_t_prev`,
`hypo_t_prev`, `attention_t_prev` and the decoder's states (`StateConfig`s).

The outputs are (max_output_seq_len + 1) x beam_size x 1 per step: the token (int32), the index of the
hypothesis it extends (int32), the hypothesis' score (float) and its attention (x T_enc); row 0 is the start
(GO, score 0). A translation is read back from a row's best hypothesis along the predecessor indices.
"""
from __future__ import annotations

from collections import namedtuple

from ... import core
from . import seq2seq_util
from .seq2seq_model_helper import Seq2SeqModelHelper

_FLOAT, _INT32, _INT64 = core.DataType.FLOAT, core.DataType.INT32, core.DataType.INT64
_SEARCH_STATES = ("scores", "tokens", "hypo", "attention")


class BeamSearchForwardOnly:
    """Beam search of width beam_size over a decoder step written into step_model (which shares model's
    parameters). post_eos_penalty: added to the scores of every hypothesis extending one that already ended
    (its last token eos_token_id).

    LinkConfig(blob, offset, window): how a step blob maps onto the op's sequence of a state (offset in time);
    StateConfig(initial_value, state_prev_link, state_link): a recurrent state, its value before step 0, the
    link the step reads it through (`<state>_prev`, offset 0) and the one it writes it to (offset 1)."""

    LinkConfig = namedtuple("LinkConfig", ["blob", "offset", "window"])
    StateConfig = namedtuple("StateConfig", ["initial_value", "state_prev_link", "state_link"])

    def __init__(self, beam_size, model, eos_token_id, go_token_id=seq2seq_util.GO_ID, post_eos_penalty=None):
        self.beam_size = beam_size
        self.model = model
        self.step_model = Seq2SeqModelHelper(name="step_model", param_model=self.model)
        self.go_token_id = go_token_id
        self.eos_token_id = eos_token_id
        self.post_eos_penalty = post_eos_penalty
        net = self.step_model.net
        (self.timestep, self.scores_t_prev, self.tokens_t_prev, self.hypo_t_prev,
         self.attention_t_prev) = net.AddExternalInputs("timestep", "scores_t_prev", "tokens_t_prev",
                                                        "hypo_t_prev", "attention_t_prev")
        tokens_int32 = net.Cast(self.tokens_t_prev, "tokens_t_prev_int32", to=_INT32)
        self.tokens_t_prev_int32_flattened, _ = net.Reshape(
            [tokens_int32], [tokens_int32, "input_t_int32_old_shape"], shape=[1, -1])

    def get_step_model(self):
        return self.step_model

    def get_previous_tokens(self):
        return self.tokens_t_prev_int32_flattened

    def get_timestep(self):
        return self.timestep

    def _constant(self, name, value, dtype, shape=(1,)):
        return self.model.param_init_net.ConstantFill([], name, shape=list(shape), value=value, dtype=dtype)

    def _penalize_after_eos(self, log_probs, on_initial_step):
        """log_probs plus post_eos_penalty on the rows of hypotheses whose last token is EOS (none at step 0)."""
        net = self.step_model.net
        eos_token = self._constant("eos_token", self.eos_token_id, _INT32, shape=[self.beam_size])
        penalty = self._constant("finished_penalty", float(self.post_eos_penalty), _FLOAT)
        zero = self._constant("ZERO_FLOAT", 0.0, _FLOAT)
        penalty = net.Conditional([on_initial_step, zero, penalty], "possible_finished_penalty")
        tokens = net.FlattenToVec(self.tokens_t_prev, "tokens_t_flat")
        tokens = net.Cast(tokens, "tokens_t_flat_int", to=_INT32)
        ended = net.EQ([tokens, eos_token], "predecessor_is_eos")
        ended = net.Cast(ended, "predecessor_is_eos_float", to=_FLOAT)
        row_penalty = net.Mul([ended, penalty], "predecessor_is_eos_penalty", broadcast=1)
        return net.Add([log_probs, row_penalty], "log_probs_penalized", broadcast=1, axis=0)

    def _choose_state_per_hypo(self, state_config, hypo_t_int32):
        """The state written by the step, rows gathered by the hypotheses the beam keeps."""
        net = self.step_model.net
        link = state_config.state_link
        flattened, _ = net.Reshape(link.blob, [link.blob, str(link.blob) + "_old_shape"], shape=[self.beam_size, -1])
        chosen = net.Gather([flattened, hypo_t_int32], str(link.blob) + "_chosen_per_hypo")
        return state_config._replace(state_link=self.LinkConfig(chosen, link.offset, link.window))

    def apply(self, inputs, length, log_probs, attentions, state_configs, data_dependencies, word_rewards=None,
              possible_translation_tokens=None, go_token_id=None):
        """Adds the search to model.net. inputs: the encoder inputs (T_enc x 1 ids); length: max_output_seq_len
        (an int64 blob of one value); log_probs and attentions: the step's blobs; word_rewards: V rewards added
        to a token's score; possible_translation_tokens: the vocabulary ids of log_probs' columns (a reduced
        vocabulary); go_token_id: a blob holding the first token (else the constant of __init__).
        data_dependencies: blobs the op must wait for (it reads them only as inputs).

        Returns (tokens, predecessor hypotheses, scores, attention weights), one row per step and the start."""
        net, beam = self.step_model.net, self.beam_size
        zero = self._constant("ZERO", 0, _INT32)
        on_initial_step = net.EQ([zero, self.timestep], "on_initial_step")
        if self.post_eos_penalty is not None:
            log_probs = self._penalize_after_eos(log_probs, on_initial_step)

        best_scores, best_tokens = net.TopK(log_probs, ["best_scores_per_hypo", "best_tokens_per_hypo_indices"],
                                            k=beam)                                    # beam x beam
        if possible_translation_tokens:
            best_tokens = net.Gather([possible_translation_tokens, best_tokens], ["best_tokens_per_hypo"])
        scores_prev, _ = net.Reshape(self.scores_t_prev, ["scores_t_prev_squeezed", "scores_t_prev_old_shape"],
                                     shape=[beam])
        scores = net.Add([best_scores, scores_prev], "output_scores", broadcast=1, axis=0)
        if word_rewards is not None:
            rewards = net.Gather([word_rewards, best_tokens], "word_rewards_for_best_tokens_per_hypo")
            scores = net.Add([scores, rewards], "output_scores")
        scores, _ = net.Reshape([scores], [scores, "output_scores_old_shape"], shape=[-1])   # beam * beam
        minus_one = self.model.param_init_net.ConstantFill([], "MINUS_ONE_INT32", value=-1, shape=[1], dtype=_INT32)
        beam_size_blob = self._constant("beam_size", beam, _INT32)
        # at step 0 all rows extend GO alike: only the first hypothesis' beam_size candidates count
        slice_end = net.Conditional([on_initial_step, beam_size_blob, minus_one], ["slice_end"])
        candidates = net.Slice([scores, zero, slice_end], "output_scores_flattened_slice")
        candidates, _ = net.Reshape(candidates, [candidates, "output_scores_flattened_slice_old_shape"],
                                    shape=[1, -1])
        scores_t, best_indices = net.TopK(candidates, ["scores_t", "best_indices"], k=beam)    # 1 x beam
        beam_size_64 = self.model.param_init_net.Cast(beam_size_blob, "BEAM_SIZE_64", to=_INT64)
        hypo_t_int32 = net.Div([best_indices, beam_size_64], "hypo_t_int32", broadcast=1)
        hypo_t = net.Cast(hypo_t_int32, "hypo_t", to=_FLOAT)
        attention_t = net.Gather([attentions, hypo_t_int32], "attention_t")
        attention_t, _ = net.Reshape(attention_t, [attention_t, "attention_t_old_shape"], shape=[1, beam, -1])
        tokens_flat, _ = net.Reshape(best_tokens, ["best_tokens_per_hypo_flatten", "best_tokens_per_hypo_old_shape"],
                                     shape=[-1])
        tokens_t_int32 = net.Gather([tokens_flat, best_indices], "tokens_t_int32")
        tokens_t = net.Cast(tokens_t_int32, "tokens_t", to=_FLOAT)

        state_configs = [self._choose_state_per_hypo(c, hypo_t_int32) for c in state_configs]
        state_configs += self._search_states(inputs, go_token_id, scores_t, tokens_t, hypo_t, attention_t)
        return self._recurrent_network(length, state_configs, data_dependencies,
                                       [scores_t, tokens_t, hypo_t, attention_t])

    def _search_states(self, inputs, go_token_id, scores_t, tokens_t, hypo_t, attention_t):
        """The search's own recurrent states: scores 0, the GO token, hypothesis 0, zero attention."""
        initial_scores = self._constant("initial_scores", 0.0, _FLOAT)
        if go_token_id:
            initial_tokens = self.model.net.Copy([go_token_id], "initial_tokens")
        else:
            initial_tokens = self._constant("initial_tokens", float(self.go_token_id), _FLOAT)
        initial_hypo = self._constant("initial_hypo", 0.0, _FLOAT)
        flattened, _ = self.model.net.Reshape(inputs, ["encoder_inputs_flattened", "encoder_inputs_old_shape"],
                                              shape=[-1])
        init_attention = self.model.net.ConstantFill(flattened, "init_attention", value=0.0, dtype=_FLOAT)
        return [self.StateConfig(initial, self.LinkConfig(prev, 0, 1), self.LinkConfig(now, 1, 1))
                for initial, prev, now in ((initial_scores, self.scores_t_prev, scores_t),
                                           (initial_tokens, self.tokens_t_prev, tokens_t),
                                           (initial_hypo, self.hypo_t_prev, hypo_t),
                                           (init_attention, self.attention_t_prev, attention_t))]

    def _recurrent_network(self, length, state_configs, data_dependencies, search_blobs):
        """The RecurrentNetwork op over the step net, for `length` steps (a fake input of length x beam x 1)."""
        fake_input = self.model.net.ConstantFill(length, "beam_search_fake_input", input_as_shape=True,
                                                 extra_shape=[self.beam_size, 1], value=0.0, dtype=_FLOAT)
        params = self.step_model.params
        all_inputs = [fake_input] + params + [c.initial_value for c in state_configs] + data_dependencies
        links, recurrent_states = [], []
        for config in state_configs:
            state_name = str(config.state_prev_link.blob) + "_states"
            recurrent_states.append(state_name)
            for link in (config.state_prev_link, config.state_link):
                links.append((str(link.blob), state_name, link.offset, link.window))
        internal, external, offsets, windows = zip(*links)
        all_outputs = [str(b) + "_all" for b in search_blobs]
        results = self.model.net.RecurrentNetwork(
            all_inputs, all_outputs + ["step_workspaces"],
            param=[all_inputs.index(p) for p in params],
            alias_src=[str(b) + "_states" for b in (self.scores_t_prev, self.tokens_t_prev, self.hypo_t_prev,
                                                    self.attention_t_prev)],
            alias_dst=all_outputs, alias_offset=[0] * len(_SEARCH_STATES), recurrent_states=recurrent_states,
            initial_recurrent_state_ids=[all_inputs.index(c.initial_value) for c in state_configs],
            link_internal=list(internal), link_external=list(external), link_offset=offsets, link_window=windows,
            backward_link_internal=[], backward_link_external=[], backward_link_offset=[],
            step_net=self.step_model.net.Proto(), timestep=str(self.timestep), outputs_with_grads=[],
            enable_rnn_executor=1, rnn_executor_debug=0)
        scores_all, tokens_all, hypo_all, attention_all = results[:4]
        tokens = self.model.net.Cast(tokens_all, "output_token_beam_list", to=_INT32)
        hypos = self.model.net.Cast(hypo_all, "output_prev_index_beam_list", to=_INT32)
        scores = self.model.net.Alias(scores_all, "output_score_beam_list")
        attention = self.model.net.Alias(attention_all, "output_attention_weights_beam_list")
        return tokens, hypos, scores, attention
