"""compat.attention (each attention type against a float64 numpy definition written from Caffe2's docs) and the
cells built on it and on Caffe2's RNNCell API: AttentionCell / LSTMWithAttention, MILSTM, DropoutCell,
MultiRNNCell with residual layers, UnrolledCell, and GRU given dim_out as a list."""
import numpy as np
import pytest

from stepnet.compat import attention, gru_cell, model_helper, rnn_cell, workspace
from stepnet.compat.attention import AttentionType

T_ENC, N, D_ENC, D_DEC = 3, 2, 4, 5
RNG = np.random.default_rng(7)


def _feed(name, shape):
    value = RNG.normal(size=shape).astype(np.float32)
    workspace.FeedBlob(name, value)
    return value.astype(np.float64)


def _softmax_over_encoder(logits):       # logits: N x T_enc
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _fc(model, name):
    return [workspace.FetchBlob(f"{name}_{p}").astype(np.float64) for p in ("w", "b")]


def _setup(dim_dec=D_DEC):
    model = model_helper.ModelHelper(name="attend")
    enc = _feed("enc", (T_ENC, N, D_ENC))
    weighted = _feed("weighted", (T_ENC, N, D_ENC))
    hidden = _feed("hidden", (1, N, dim_dec))
    transposed = model.net.Transpose("enc", "enc_t", axes=[1, 2, 0])
    return model, enc, weighted, hidden, transposed


def _run(model):
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)


def _check(context, weights, enc, expected_weights):
    np.testing.assert_allclose(workspace.FetchBlob(weights)[:, :, 0], expected_weights, rtol=1e-5, atol=1e-6)
    expected_context = np.einsum("nt,tnd->nd", expected_weights, enc)[None]
    np.testing.assert_allclose(workspace.FetchBlob(context), expected_context, rtol=1e-5, atol=1e-6)


def _v_tanh(model, summed):                    # summed: T_enc x N x D_enc; v has no bias that learns (0)
    v, b = _fc(model, "s/attention_logits")
    return (np.tanh(summed) @ v.T + b)[..., 0].T


def test_regular_attention():
    model, enc, weighted, hidden, transposed = _setup()
    context, weights, recompute = attention.apply_regular_attention(model, D_ENC, transposed, "weighted", "hidden",
                                                                    D_DEC, "s")
    _run(model)
    w, b = _fc(model, "s/weighted_decoder_hidden_state")
    logits = _v_tanh(model, weighted + (hidden[0] @ w.T + b))
    _check(context, weights, enc, _softmax_over_encoder(logits))
    assert recompute == ["s/decoder_hidden_encoder_outputs_sum"] and context == "s/attention_weighted_encoder_context"


def test_recurrent_attention_adds_the_previous_context():
    model, enc, weighted, hidden, transposed = _setup()
    prev = _feed("prev", (1, N, D_ENC))
    context, weights, _ = attention.apply_recurrent_attention(model, D_ENC, transposed, "weighted", "hidden", D_DEC,
                                                              "prev", "s")
    _run(model)
    wh, bh = _fc(model, "s/weighted_decoder_hidden_state")
    wp, bp = _fc(model, "s/weighted_prev_attention_context")
    logits = _v_tanh(model, weighted + (hidden[0] @ wh.T + bh) + (prev[0] @ wp.T + bp))
    _check(context, weights, enc, _softmax_over_encoder(logits))


@pytest.mark.parametrize("dim_dec", [D_ENC, D_DEC])
def test_dot_attention(dim_dec):
    model, enc, _, hidden, transposed = _setup(dim_dec)
    context, weights, recompute = attention.apply_dot_attention(model, D_ENC, transposed, "hidden", dim_dec, "s")
    _run(model)
    query = hidden[0]
    if dim_dec != D_ENC:                         # projected to the encoder's width first
        w, b = _fc(model, "s/weighted_decoder_hidden_state")
        query = query @ w.T + b
    _check(context, weights, enc, _softmax_over_encoder(np.einsum("tnd,nd->nt", enc, query)))
    assert recompute == []


def test_soft_coverage_attention_returns_the_next_coverage():
    model, enc, weighted, hidden, transposed = _setup()
    coverage_weights = _feed("coverage_weights", (T_ENC, N, D_ENC))
    coverage = np.abs(_feed("coverage", (1, N, T_ENC)))
    workspace.FeedBlob("coverage", coverage.astype(np.float32))
    context, weights, _, coverage_t = attention.apply_soft_coverage_attention(
        model, D_ENC, transposed, "weighted", "hidden", D_DEC, "s", None, "coverage", "coverage_weights")
    _run(model)
    w, b = _fc(model, "s/weighted_decoder_hidden_state")
    summed = weighted + (hidden[0] @ w.T + b) + coverage_weights * coverage[0].T[:, :, None]
    expected = _softmax_over_encoder(_v_tanh(model, summed))
    _check(context, weights, enc, expected)
    np.testing.assert_allclose(workspace.FetchBlob(coverage_t), coverage + expected[None], rtol=1e-5, atol=1e-6)


def test_encoder_lengths_mask_the_logits():
    model, enc, weighted, hidden, transposed = _setup()
    workspace.FeedBlob("lengths", np.array([1, 3], np.int32))
    _, weights, _ = attention.apply_regular_attention(model, D_ENC, transposed, "weighted", "hidden", D_DEC, "s",
                                                      encoder_lengths="lengths")
    _run(model)
    got = workspace.FetchBlob(weights)[:, :, 0]
    np.testing.assert_allclose(got[0], [1.0, 0.0, 0.0], atol=1e-6)
    assert np.all(got[1] > 0)


@pytest.mark.parametrize("kind", [AttentionType.Regular, AttentionType.SoftCoverage])
def test_lstm_with_attention_layer(kind):
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="decoder")
    T_DEC, D_IN = 4, 3
    _feed("dec_in", (T_DEC, N, D_IN))
    _feed("enc", (T_ENC, N, D_ENC))
    workspace.FeedBlob("dec_len", np.array([T_DEC, 2], np.int32))
    for name, dim in (("h0", D_DEC), ("c0", D_DEC), ("ctx0", D_ENC)):
        _feed(name, (1, N, dim))
    outs = rnn_cell.LSTMWithAttention(model, "dec_in", "dec_len", "h0", "c0", "ctx0", D_ENC, "enc", None, D_IN,
                                      D_DEC, "att", attention_type=kind, outputs_with_grads=[0])
    assert len(outs) == (8 if kind == AttentionType.SoftCoverage else 6)
    assert outs[0] == "att/hidden_t_external_all" and outs[4] == "att/attention_weighted_encoder_context_all"
    loss = model.AveragedLoss(model.SumElements(outs[0], "total"), "loss")
    model.AddGradientOperators([loss])
    _run(model)
    contexts = workspace.FetchBlob(outs[4])
    assert contexts.shape == (T_DEC, N, D_ENC)
    np.testing.assert_array_equal(contexts[-1], workspace.FetchBlob(outs[5])[0])
    assert np.abs(workspace.FetchBlob(model.param_to_grad["att/decoder/gates_t_w"])).sum() > 0
    if kind == AttentionType.SoftCoverage:      # coverage: the running sum of attention weights, 1 per step
        np.testing.assert_allclose(workspace.FetchBlob(outs[7]).sum(axis=2), np.full((1, N), T_DEC), rtol=1e-5)


def _stack(model, unroll=None, residual=False, dropout=None):
    cells = [rnn_cell.MILSTMCell(input_size=3 if i == 0 else 4, hidden_size=4, forget_bias=0.0,
                                 memory_optimization=False, name=f"mi_{i}") for i in range(2)]
    cell = rnn_cell.MultiRNNCell(cells, residual_output_layers=[1] if residual else None, name="stack")
    if dropout is not None:
        cell = rnn_cell.DropoutCell(cell, dropout_ratio=dropout, name="drop", is_test=False)
    if unroll:
        cell = rnn_cell.UnrolledCell(cell, unroll)
    return cell.apply_over_sequence(model, "seq", "lens", ["h0", "c0", "h1", "c1"])


def test_unrolled_milstm_stack_matches_the_recurrent_op():
    workspace.ResetWorkspace()
    _feed("seq", (3, N, 3))
    workspace.FeedBlob("lens", np.array([3, 2], np.int32))
    for name in ("h0", "c0", "h1", "c1"):
        _feed(name, (1, N, 4))
    built = []
    for unroll in (None, 3):
        model = model_helper.ModelHelper(name="mi")
        out, states = _stack(model, unroll, residual=True)
        built.append((model, [out] + list(states)))
    workspace.RunNetOnce(model.param_init_net)          # both use the same parameter blobs
    results = []
    for model, blobs in built:
        workspace.RunNetOnce(model.net)
        results.append([workspace.FetchBlob(b) for b in blobs])
    assert "stack/layer_1/mi_1/alpha" in [str(p) for p in model.params]
    for dynamic, unrolled in zip(*results):
        np.testing.assert_allclose(dynamic, unrolled, rtol=1e-5, atol=1e-6)
    # the residual output is the sum of both layers' hidden sequences
    np.testing.assert_allclose(results[0][0], results[0][1] + results[0][5], rtol=1e-6)


def test_dropout_cell_drops_the_output_only():
    model = model_helper.ModelHelper(name="drop")
    out, states = _stack(model, dropout=0.5)
    assert str(out).startswith("drop/") and "with_dropout_mask0" in str(out)
    assert [op.type for op in model.net.Proto().op][-1] == "Dropout"
    model0 = model_helper.ModelHelper(name="nodrop")
    out0, states0 = _stack(model0, dropout=0.0)       # ratio 0: no op, as in Caffe2
    assert out0 == states0[4]


def test_gru_takes_dim_out_as_a_list_of_one():
    workspace.ResetWorkspace()
    _feed("seq", (3, N, 3))
    _feed("h0", (1, N, 4))
    model = model_helper.ModelHelper(name="g")
    h_all, h_last = gru_cell.GRU(model, "seq", None, ["h0"], 3, [4], scope="gru")
    assert (h_all, h_last) == ("gru/hidden_t_all", "gru/hidden_t_last")
    _run(model)
    np.testing.assert_array_equal(workspace.FetchBlob(h_all)[-1], workspace.FetchBlob(h_last)[0])
