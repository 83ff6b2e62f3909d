"""compat.rnn_cell, gru_cell and recurrent: the layers are stepnet.builders.rnn's (same nets op for op), the cell
classes' apply_over_sequence, a hand-written step net through recurrent_net, and what is not supported."""
import numpy as np
import pytest

from stepnet.builders import rnn as stepnet_rnn
from stepnet.compat import core, gru_cell, model_helper, recurrent, rnn_cell, workspace
from stepnet.builders.model import ModelBuilder
from stepnet.io.proto import arguments

T, N, D, H = 3, 2, 4, 5


def feed_sequence(hidden_layers=1):
    rng = np.random.default_rng(0)
    workspace.FeedBlob("seq", rng.normal(size=(T, N, D)).astype(np.float32))
    workspace.FeedBlob("lengths", np.full(N, T, np.int32))
    for i in range(hidden_layers):
        for state in ("h0", "c0"):
            workspace.FeedBlob(f"{state}_{i}", np.zeros((1, N, H), np.float32))


def run(model):
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)


def _layout(ops):
    """Each op's type, inputs and outputs, and those of its step nets (argument values and net names aside)."""
    out = []
    for op in ops:
        nets = [arguments(op.arg)[n] for n in ("step_net", "backward_step_net") if n in arguments(op.arg)]
        out.append((op.type, list(op.input), list(op.output), [_layout(n.op) for n in nets]))
    return out


def test_lstm_builds_stepnets_own_layer():
    """The Caffe2-style cells lay out the same ops and names as stepnet.builders.rnn's (brew.fc adds the model's
    arg_scope arguments to each FC, as in Caffe2)."""
    model = model_helper.ModelHelper(name="m")
    outs = rnn_cell.LSTM(model, "seq", "lengths", ["h0_0", "c0_0"], D, H, scope="LSTM")
    reference = ModelBuilder("m")
    ref_outs = stepnet_rnn.lstm(reference, "seq", "lengths", ["h0_0", "c0_0"], D, H, scope="LSTM")
    assert list(outs) == [str(o) for o in ref_outs]
    assert all(isinstance(o, core.BlobReference) and o.Net() is model.net for o in outs)
    assert _layout(model.net.Proto().op) == _layout(reference.net.proto().op)
    assert _layout(model.param_init_net.Proto().op) == _layout(reference.init_net.proto().op)
    assert model.params == ["LSTM/i2h_w", "LSTM/i2h_b", "LSTM/gates_t_w", "LSTM/gates_t_b"]


def test_lstm_trains_through_the_recurrent_op():
    model = model_helper.ModelHelper(name="lstm")
    h_all, h_last, c_all, c_last = rnn_cell.LSTM(model, "seq", "lengths", ["h0_0", "c0_0"], D, H, scope="LSTM")
    loss = model.AveragedLoss(model.SumElements(h_all, "total"), "loss")
    model.AddGradientOperators([loss])
    feed_sequence()
    run(model)
    assert workspace.FetchBlob(h_all).shape == (T, N, H) and workspace.FetchBlob(c_last).shape == (1, N, H)
    np.testing.assert_array_equal(workspace.FetchBlob(h_all)[-1], workspace.FetchBlob(h_last)[0])
    assert set(model.param_to_grad) == set(model.params)
    assert np.abs(workspace.FetchBlob(model.param_to_grad["LSTM/gates_t_w"])).sum() > 0


def test_step_nets_get_the_device_scope():
    """Caffe2 makes step ops under the current device scope; so does compat (stepnet.builders.rnn alone does not)."""
    gpu = core.DeviceOption(1, 0)
    model = model_helper.ModelHelper(name="gpu")
    with core.DeviceScope(gpu):
        rnn_cell.LSTM(model, "seq", "lengths", ["h0_0", "c0_0"], D, H, scope="LSTM")
        gru_cell.GRUCell(D, H, 0.0, False, name="gru").apply_over_sequence(model, "seq", None, ["h0_0"])
    rnn_ops = [op for op in model.net.Proto().op if op.type == "RecurrentNetwork"]
    nets = [arguments(op.arg)[name] for op in rnn_ops for name in ("step_net", "backward_step_net")]
    assert len(nets) == 4 and all(op.device_option == gpu for net in nets for op in net.op)
    plain = model_helper.ModelHelper(name="cpu")
    rnn_cell.LSTM(plain, "seq", "lengths", ["h0_0", "c0_0"], D, H, scope="LSTM")
    step = arguments(plain.net.Proto().op[-1].arg)["step_net"]
    assert not any(op.HasField("device_option") for op in step.op)


def test_layers_and_trainable_initial_states():
    model = model_helper.ModelHelper(name="layers")
    every = rnn_cell.LSTM(model, "seq", "lengths", None, D, [H, H], scope="stack", return_last_layer_only=False)
    assert len(every) == 8 and every[4] == "stack/layer_1/hidden_state_all"
    assert "stack/layer_0/initial_hidden_state" in model.params
    feed_sequence()
    run(model)
    assert workspace.FetchBlob(every[4]).shape == (T, N, H)


def test_basic_rnn_and_gru():
    model = model_helper.ModelHelper(name="small")
    with pytest.raises(RuntimeError, match="unknown activation function \\(None\\)"):
        rnn_cell.BasicRNN(model, "seq", None, ["h0_0"], D, H, scope="rnn")
    h_all, h_last = rnn_cell.BasicRNN(model, "seq", None, ["h0_0"], D, H, scope="rnn", activation="relu")
    g_all, g_last = gru_cell.GRU(model, "seq", "lengths", ["h0_0"], D, H, scope="gru", linear_before_reset=True)
    feed_sequence()
    run(model)
    assert workspace.FetchBlob(h_all).min() >= 0 and workspace.FetchBlob(g_last).shape == (1, N, H)
    assert gru_cell.GRU.func is rnn_cell._LSTM and gru_cell.GRU.args == (gru_cell.GRUCell,)


def test_cells_apply_over_sequence():
    model = model_helper.ModelHelper(name="cells")
    lstm = rnn_cell.LSTMCell(D, H, forget_bias=1.0, memory_optimization=False, name="single")
    out, states = lstm.apply_over_sequence(model, "seq", "lengths", ["h0_0", "c0_0"])
    assert out == states[0] == "single/hidden_state_all" and len(states) == 4
    assert lstm.get_state_names() == ["single/hidden_t", "single/cell_t"] and lstm.get_output_dim() == H
    stack = rnn_cell.MultiRNNCell([rnn_cell.LSTMCell(D, H, 0.0, False), gru_cell.GRUCell(H, H, 0.0, False)],
                                  name="mixed")
    out2, states2 = stack.apply_over_sequence(model, "seq", initial_states=["h0_0", "c0_0", "h0_0"])
    assert out2 == states2[4] == "mixed/layer_1/hidden_t_all" and stack.get_output_state_index() == 2
    basic = rnn_cell.BasicRNNCell(D, H, 0.0, False, activation="tanh", name="basic", forward_only=True)
    out3, _ = basic.apply_over_sequence(model, "seq", None, ["h0_0"])
    ops = model.net.Proto().op
    rnn_ops = [op for op in ops if op.type == "RecurrentNetwork"]
    assert len(rnn_ops) == 3 and "backward_step_net" not in arguments(rnn_ops[2].arg)
    feed_sequence()
    run(model)
    for blob in (out, out2, out3):
        assert workspace.FetchBlob(blob).shape == (T, N, H)


def test_params_and_what_is_refused():
    model = model_helper.ModelHelper(name="no")
    *outs, params = rnn_cell.LSTM(model, "seq", "lengths", None, D, H, scope="x", return_params=True)
    assert len(outs) == 4 and params == {"input": {"weights": "x/i2h_w", "biases": "x/i2h_b"},
                                         "recurrent": {"weights": "x/gates_t_w", "biases": "x/gates_t_b"}}
    with pytest.raises(TypeError, match="something"):
        rnn_cell.LSTM(model, "seq", "lengths", None, D, H, scope="y", something=1)
    with pytest.raises(ValueError, match="1 initial state values given for the 2 states"):
        rnn_cell.LSTM(model, "seq", "lengths", ["h0_0"], D, H, scope="z")
    with pytest.raises(NotImplementedError, match="cuDNN"):
        rnn_cell.cudnn_LSTM(model, "seq", ("h", "c"), D, H, scope="c")
    with pytest.raises(ValueError, match="unknown attention_type 7"):
        rnn_cell.AttentionCell(2, "enc", None, rnn_cell.LSTMCell(D, H, 0.0, False), H, 7, None, False)


def test_recurrent_net_over_a_hand_written_step_net():
    """h_t = h_{t-1} + x_t: the outputs are running sums; the step net is a compat core.Net."""
    step = core.Net("step")
    x_t, h_prev = step.AddExternalInputs("x_t", "h_prev")
    h = step.Sum([h_prev, x_t], "h")
    step.AddExternalOutput(h)
    net = core.Net("outer")
    h_all, h_last = recurrent.recurrent_net(net, step, [(x_t, "xs")], [(h_prev, "h0")], {h_prev: h},
                                            scope="sum", forward_only=True)
    assert (h_all, h_last) == ("h_all", "h_last") and h_all.Net() is net
    recurrent.set_rnn_executor_config(net.Proto().op[0], num_threads=2, max_cuda_streams=1)
    assert arguments(net.Proto().op[0].arg)["rnn_executor.num_threads"] == 2
    with pytest.raises(ValueError, match="RecurrentNetwork"):
        recurrent.set_rnn_executor_config(core.CreateOperator("Relu", ["a"], ["b"]))
    xs = np.arange(12, dtype=np.float32).reshape(4, 1, 3)
    workspace.FeedBlob("xs", xs)
    workspace.FeedBlob("h0", np.zeros((1, 1, 3), np.float32))
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("h_all"), np.cumsum(xs, axis=0))
    names = recurrent.retrieve_step_blobs(net, "rnn")
    # forward-only: two step workspaces in turn, so the last two steps' blobs remain (Caffe2's num_workspaces)
    assert all(isinstance(n, bytes) for n in names)     # a string tensor's elements, as Caffe2 fetches them
    assert [n.decode() for n in names] == ["rnn_h0", "rnn_h_prev0", "rnn_timestep0", "rnn_x_t0", "rnn_h1",
                                           "rnn_h_prev1", "rnn_timestep1", "rnn_x_t1"]
    assert workspace.FetchBlob("rnn_h0").tolist() == [[[9.0, 12.0, 15.0]]]
    assert workspace.FetchBlob("rnn_h1").tolist() == [[[18.0, 22.0, 26.0]]]


def test_lstms_of_several_devices_have_their_own_initial_states_and_step_workspaces():
    """As data_parallel_model builds one copy per device: under NameScope('cpu_<k>') a string initial state is
    that scope's blob (cpu_0/h0_0), and the op's step_workspaces output gets the name scope before the LSTM's own
    (cpu_0/partest/step_workspaces), so the copies share neither. Both backward passes are built, and with the
    same parameters and feeds the two devices' gradients are the same."""
    model = model_helper.ModelHelper(name="devices")
    losses = []
    for k in range(2):
        with core.NameScope(f"cpu_{k}"):
            out, _, _, _ = rnn_cell.LSTM(model, "seq", "lengths", ("h0_0", "c0_0"), D, H, scope="partest")
            losses.append(model.net.AveragedLoss(out, "loss"))
    rnn_ops = [op for op in model.net.Proto().op if op.type == "RecurrentNetwork"]
    for k, op in enumerate(rnn_ops):
        assert {f"cpu_{k}/h0_0", f"cpu_{k}/c0_0"} <= set(op.input)
        assert op.output[-1] == f"cpu_{k}/partest/step_workspaces"
    model.AddGradientOperators(losses)
    rng = np.random.default_rng(1)
    feeds = {"seq": rng.normal(size=(T, N, D)).astype(np.float32), "lengths": np.full(N, T, np.int32),
             "h0_0": rng.normal(size=(1, N, H)).astype(np.float32), "c0_0": np.zeros((1, N, H), np.float32)}
    for k in range(2):
        for name, value in feeds.items():
            workspace.FeedBlob(f"cpu_{k}/{name}", value)
    workspace.RunNetOnce(model.param_init_net)
    params = [str(p) for p in model.params if str(p).startswith("cpu_0/")]
    assert params
    for p in params:
        workspace.FeedBlob(p.replace("cpu_0/", "cpu_1/", 1), workspace.FetchBlob(p))
    workspace.RunNetOnce(model.net)
    for p in params:
        g0 = workspace.FetchBlob(str(model.param_to_grad[p]))
        g1 = workspace.FetchBlob(str(model.param_to_grad[core.BlobReference(p.replace("cpu_0/", "cpu_1/", 1))]))
        assert np.abs(g0).sum() > 0
        np.testing.assert_array_equal(g0, g1)
