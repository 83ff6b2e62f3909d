"""RecurrentNetwork exported as an ONNX Scan or one LSTM / GRU node: LSTM predict nets in Caffe2's layout (full
and short sequences, every initial-state rank, forget_bias, drop_states), a 2-layer LSTM, GRU layers and step nets
of other shapes, BasicRNN's masking ops, windowed links,
and a training net whose forward part is exported — each against stepnet (rtol 1e-4)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from onnx_check import compare, one_op  # noqa: E402

from stepnet import NetDef, Workspace  # noqa: E402
from stepnet.builders.builder import BlobRef  # noqa: E402
from stepnet.builders.model import ModelBuilder  # noqa: E402
from stepnet.export.onnx import UnsupportedOpError, export_onnx  # noqa: E402
from stepnet.builders.rnn import basic_rnn, gru, lstm  # noqa: E402
from stepnet.testing import make_op  # noqa: E402

F = np.float32
T, N, D, H = 6, 3, 4, 5


def random_params(m: ModelBuilder, seed: int) -> dict:
    """Every parameter the builder's init net makes, uniform in [-0.5, 0.5) instead of its fills."""
    ws = Workspace(seed=0)
    ws.run_net_once(m.init_net.proto())
    rng = np.random.default_rng(seed)
    names = [o for op in m.init_net.proto().op for o in op.output]
    return {n: rng.uniform(-0.5, 0.5, ws.fetch(n).shape).astype(F) for n in names}


def net_of(m: ModelBuilder, outs) -> NetDef:
    net = m.net.proto()
    net.external_output.extend(outs)
    return net


def feeds_for(seq, init_shape, names, seed=4) -> dict:
    rng = np.random.default_rng(seed)
    out = {"X": rng.uniform(-1, 1, (T, N, D)).astype(F), "seq": np.asarray(seq, np.int32)}
    out.update({n: rng.uniform(-1, 1, init_shape).astype(F) for n in names})
    return out


FULL, SHORT = [T] * N, [T, 2, 1]


@pytest.mark.parametrize("seq", [FULL, SHORT], ids=["full", "short"])
@pytest.mark.parametrize("init_shape", [(N, H), (1, N, H), (H,)], ids=["2d", "3d", "1d"])
@pytest.mark.parametrize("forget_bias, drop_states", [(0.0, False), (1.5, True)])
def test_lstm_predict_net(seq, init_shape, forget_bias, drop_states):
    m = ModelBuilder("lstm_predict")
    outs = lstm(m, "X", "seq", ("h0", "c0"), D, H, scope="LSTM", forward_only=True, forget_bias=forget_bias,
                drop_states=drop_states)
    result, worst = compare(net_of(m, outs), feeds=feeds_for(seq, init_shape, ("h0", "c0")),
                            params=random_params(m, 1))
    assert [n.op_type for n in result.model.graph.node].count("Scan") == 1   # cell_state_all: not an ONNX LSTM
    assert worst < 1e-5


@pytest.mark.parametrize("seq", [FULL, SHORT], ids=["full", "short"])
@pytest.mark.parametrize("forget_bias", [0.0, 1.5])
@pytest.mark.parametrize("rnn", ["auto", "scan"])
def test_an_lstm_layer_becomes_one_onnx_lstm_node(seq, forget_bias, rnn):
    m = ModelBuilder("lstm_predict")
    outs = lstm(m, "X", "seq", ("h0", "c0"), D, H, scope="LSTM", forward_only=True, forget_bias=forget_bias)
    outputs = [outs[0], outs[1], outs[3]]   # h_all, h_last, c_last: what an ONNX LSTM gives
    result, worst = compare(net_of(m, outputs), feeds=feeds_for(seq, (1, N, H), ("h0", "c0")),
                            params=random_params(m, 1), rnn=rnn)
    kinds = [n.op_type for n in result.model.graph.node]
    assert kinds.count("LSTM" if rnn == "auto" else "Scan") == 1
    assert ("Gemm" in kinds) == (rnn == "scan")   # the i2h FC folded into the LSTM's input weights
    assert worst < 1e-5


def test_short_sequences_carry_the_last_state_past_their_end():
    m = ModelBuilder("lstm_predict")
    outs = lstm(m, "X", "seq", ("h0", "c0"), D, H, scope="LSTM", forward_only=True)
    feeds = feeds_for(SHORT, (N, H), ("h0", "c0"))
    result = export_onnx(net_of(m, outs), inputs=feeds, params=random_params(m, 1))
    from onnx_check import ort_run
    got = ort_run(result, feeds)
    h_all, h_last = got["LSTM/hidden_state_all"], got["LSTM/hidden_state_last"]
    np.testing.assert_array_equal(h_all[1:, 2], np.broadcast_to(h_all[0, 2], (T - 1, H)))  # length 1: kept
    np.testing.assert_array_equal(h_last[0, 1], h_all[1, 1])                              # length 2
    np.testing.assert_array_equal(h_last[0, 0], h_all[-1, 0])                             # full length


def test_two_layer_lstm():
    m = ModelBuilder("lstm2")
    outs = lstm(m, "X", "seq", None, D, [H, H + 1], scope="LSTM", forward_only=True,
                return_last_layer_only=False)
    compare(net_of(m, outs), feeds=feeds_for(SHORT, (H,), ()), params=random_params(m, 2))


def gru_net(linear_before_reset=False, drop_states=False, edit=None):
    """(builder, predict net) of gru_cell's GRU layer; edit(step net) changes its step net in place."""
    m = ModelBuilder("gru")
    outs = gru(m, "X", "seq", ("h0",), D, H, scope="GRU", forward_only=True, linear_before_reset=linear_before_reset,
               drop_states=drop_states)
    net = net_of(m, outs)
    if edit is not None:
        edit(next(a.n for a in net.op[1].arg if a.name == "step_net"))
    return m, net


@pytest.mark.parametrize("linear_before_reset", [False, True])
@pytest.mark.parametrize("seq", [FULL, SHORT], ids=["full", "short"])
@pytest.mark.parametrize("rnn", ["auto", "scan"])
def test_a_gru_layer_becomes_one_onnx_gru_node(linear_before_reset, seq, rnn):
    m, net = gru_net(linear_before_reset)
    result, worst = compare(net, feeds=feeds_for(seq, (N, H), ("h0",)), params=random_params(m, 3), rnn=rnn)
    kinds = [n.op_type for n in result.model.graph.node]
    assert kinds.count("GRU" if rnn == "auto" else "Scan") == 1 and ("Gemm" in kinds) == (rnn == "scan")
    if rnn == "auto":
        gru_node = next(n for n in result.model.graph.node if n.op_type == "GRU")
        assert {a.name: a.i for a in gru_node.attribute}["linear_before_reset"] == linear_before_reset
    assert worst < 1e-5


def _split_rotated(step):
    """input_t's blocks read in another order: reset from block 1, update from 2, output from 0."""
    split = next(op for op in step.op if op.type == "Split")
    r, u, o = list(split.output)
    del split.output[:]
    split.output.extend([o, r, u])


def _concat_swapped(step):
    """GRUUnit's update part made from the gate whose sigmoid resets: another cell, not ONNX's GRU."""
    concat = next(op for op in step.op if op.type == "Concat")
    concat.input[0], concat.input[1] = concat.input[1], concat.input[0]


def _extra_op(step):
    """One more op reading the reset gate: the step net is no longer exactly the layer."""
    step.op.insert(len(step.op) - 1, make_op("Scale", ["GRU/reset_gate_t_sigmoid"], ["GRU/unused"], scale=2.0))


def test_a_gru_step_weight_of_another_rank_keeps_the_scan():
    """A step FC's W of shape H×H×1 (FC's axis_w=1 reads it as H×H) is no GRU node's recurrence weight: Scan."""
    m, net = gru_net()
    params = random_params(m, 3)
    params["GRU/update_gate_t_w"] = params["GRU/update_gate_t_w"].reshape(H, H, 1)
    result, _ = compare(net, feeds=feeds_for(SHORT, (N, H), ("h0",)), params=params)
    assert [n.op_type for n in result.model.graph.node].count("Scan") == 1


@pytest.mark.parametrize("edit, drop_states, kind", [
    (_split_rotated, False, "GRU"), (_concat_swapped, False, "Scan"), (_extra_op, False, "Scan"),
    (None, True, "Scan")], ids=["split-rotated", "concat-swapped", "extra-op", "drop-states"])
@pytest.mark.parametrize("linear_before_reset", [False, True])
def test_gru_step_nets_of_other_shapes(edit, drop_states, kind, linear_before_reset):
    """A permutation the GRU node can express is exported as one; anything else keeps the Scan, and both agree
    with stepnet."""
    m, net = gru_net(linear_before_reset, drop_states, edit)
    result, _ = compare(net, feeds=feeds_for(SHORT, (N, H), ("h0",)), params=random_params(m, 3))
    assert [n.op_type for n in result.model.graph.node].count(kind) == 1


@pytest.mark.parametrize("drop_states", [False, True])
def test_basic_rnn_masking_ops(drop_states):
    m = ModelBuilder("rnn")
    outs = basic_rnn(m, "X", "seq", ("h0",), D, H, forward_only=True, drop_states=drop_states)
    compare(net_of(m, outs), feeds=feeds_for(SHORT, (N, H), ("h0",)), params=random_params(m, 5))


def test_training_net_exports_its_forward_part():
    m = ModelBuilder("train")
    outs = lstm(m, "X", "seq", ("h0", "c0"), D, H, scope="LSTM")
    m.net.add_gradient_ops({outs[0]: outs[0] + "_in_grad"})
    net = net_of(m, outs[:2])
    assert any(op.type == "RecurrentNetworkGradient" for op in net.op)
    feeds = feeds_for(SHORT, (N, H), ("h0", "c0"))
    params = {**random_params(m, 6), outs[0] + "_in_grad": np.ones((T, N, H), F)}   # for stepnet's backward pass
    result, _ = compare(net, feeds=feeds, params=params)
    assert any("training part" in n and "RecurrentNetworkGradient" in n for n in result.notes)


def windowed_net(offset_all: int) -> NetDef:
    """A hand-written RecurrentNetwork: 2 initial state rows read as one window, a 2-row window of a longer input,
    the step writing row t + 2: s[t+2] = 0.5 * (s[t] + s[t+1]) + x[t] + y[t] + y[t+1]."""
    step = NetDef(name="step", external_input=["prev", "xt", "yt", "timestep"], external_output=["cur"])
    step.op.extend([make_op("ReduceFrontSum", ["prev"], ["ps"]), make_op("Scale", ["ps"], ["half"], scale=0.5),
                    make_op("ReduceFrontSum", ["yt"], ["ys"]), make_op("Add", ["half", "ys"], ["hy"]),
                    make_op("ExpandDims", ["hy"], ["hy3"], dims=[0]), make_op("Add", ["hy3", "xt"], ["cur"])])
    rnn = make_op("RecurrentNetwork", ["x", "s0", "y"], ["s_all", "s_last", "s_from", "ws"], step_net=step,
                  recurrent_states=["s_states"], initial_recurrent_state_ids=[1],
                  link_internal=["prev", "cur", "xt", "yt"], link_external=["s_states", "s_states", "x", "y"],
                  link_offset=[0, 2, 0, 0], link_window=[2, 1, 1, 2],
                  alias_src=["s_states"] * 3, alias_dst=["s_all", "s_last", "s_from"], alias_offset=[2, -1, offset_all],
                  timestep="timestep")
    return NetDef(name="windowed", op=[rnn], external_input=["x", "s0", "y"],
                  external_output=["s_all", "s_last", "s_from"])


@pytest.mark.parametrize("offset", [0, 1, 3, -2])
def test_windowed_links_and_aliases(offset):
    rng = np.random.default_rng(7)
    feeds = {"x": rng.uniform(-1, 1, (T, N, D)).astype(F), "s0": rng.uniform(-1, 1, (2, N, D)).astype(F),
             "y": rng.uniform(-1, 1, (T + 1, N, D)).astype(F)}
    compare(windowed_net(offset), feeds=feeds)


def test_cell_ops_alone():
    rng = np.random.default_rng(8)
    h, c, gates = (rng.uniform(-1, 1, s).astype(F) for s in ((1, N, H), (1, N, H), (1, N, 4 * H)))
    seq, t = np.array([3, 1, 2], np.int32), np.array([1], np.int32)
    compare(one_op("LSTMUnit", {"h": h, "c": c, "g": gates, "seq": seq, "t": t}, 2, forget_bias=0.5),
            feeds={"h": h, "c": c, "g": gates, "seq": seq, "t": t})
    compare(one_op("LSTMUnit", {"h": h, "c": c, "g": gates, "t": t}, 2, sequence_lengths=0),
            feeds={"h": h, "c": c, "g": gates, "t": t})
    g3 = rng.uniform(-1, 1, (1, N, 3 * H)).astype(F)
    compare(one_op("GRUUnit", {"h": h, "g": g3, "seq": seq, "t": t}, 1, drop_states=1),
            feeds={"h": h, "g": g3, "seq": seq, "t": t})


def test_a_step_net_writing_its_input_view_is_refused():
    net = windowed_net(2)
    step = net.op[0].arg[[a.name for a in net.op[0].arg].index("step_net")].n
    step.op.append(make_op("Scale", ["xt"], ["xt"], scale=2.0))
    feeds = {"x": (T, N, D), "s0": (2, N, D), "y": (T + 1, N, D)}
    with pytest.raises(UnsupportedOpError, match=r"op #0 \(RecurrentNetwork\): the step net writes 'xt', a view"):
        export_onnx(net, inputs=feeds)


def test_a_link_name_that_is_not_utf8_is_a_clean_error():
    """Blob names in a file are bytes: ones that are not UTF-8 are an ArgumentError naming the argument (a
    UnicodeDecodeError escaped once)."""
    from stepnet.core.errors import ArgumentError

    net = windowed_net(2)
    links = next(a for a in net.op[0].arg if a.name == "link_internal")
    links.strings[0] = b"\xff" + links.strings[0]
    feeds = {"x": (T, N, D), "s0": (2, N, D), "y": (T + 1, N, D)}
    with pytest.raises(ArgumentError, match="argument 'link_internal' holds bytes that are not UTF-8"):
        export_onnx(net, inputs=feeds)


@pytest.mark.parametrize("name, value, what", [("link_internal", 3.0, "a list of blob names"),
                                               ("timestep", [1, 2], "a blob name")])
def test_a_link_argument_of_another_kind_is_a_clean_error(name, value, what):
    """link_internal and timestep are read before the op's converter checks its arguments (to find what the
    step net reads from the outer net): another kind there is an ArgumentError naming the net, op and argument
    (a TypeError escaped once; fuzz seed 973 case 2410)."""
    from stepnet.core.errors import ArgumentError
    from stepnet.io.proto import make_argument

    net = windowed_net(2)
    args = [a for a in net.op[0].arg if a.name != name]
    del net.op[0].arg[:]
    net.op[0].arg.extend(args + [make_argument(name, value)])
    feeds = {"x": (T, N, D), "s0": (2, N, D), "y": (T + 1, N, D)}
    with pytest.raises(ArgumentError, match=rf"net '.*', op #0 \(RecurrentNetwork\): argument '{name}' must be {what}"):
        export_onnx(net, inputs=feeds)


def test_the_gradient_seed_is_left_out_with_the_training_part():
    """AddGradientOperators' seed (ConstantFill of the loss's shape, read by the loss's gradient only) sits just
    before the first gradient op: it goes with the training part, not into the exported forward part; a fill the
    forward part reads stays."""
    from stepnet.export.onnx.exporter import forward_part

    m = ModelBuilder("train")
    m.net.ConstantFill([], "bias_init", shape=[H], value=0.5)
    y = m.net.Add([BlobRef("X"), BlobRef("bias_init")], "y", broadcast=1)
    loss = m.net.AveragedLoss(m.net.Tanh(y, BlobRef("t")), BlobRef("loss"))
    m.net.add_gradient_ops([loss])
    net = m.net.proto()
    seed = [o for o in net.op if o.type == "ConstantFill" and o.input]
    assert len(seed) == 1
    kept, note = forward_part(net)
    assert [o.type for o in kept] == ["ConstantFill", "Add", "Tanh", "AveragedLoss"]
    assert "ConstantFill×1" in note and not any(o.input for o in kept if o.type == "ConstantFill")


def layer_case(layer: str) -> tuple:
    """(builder, predict net, initial-state feeds (shape, names)) of one LSTM or GRU layer over SHORT sequences."""
    if layer == "gru":
        m, net = gru_net()
        return m, net, ((N, H), ("h0",))
    m = ModelBuilder("lstm_predict")
    outs = lstm(m, "X", "seq", ("h0", "c0"), D, H, scope="LSTM", forward_only=True)
    return m, net_of(m, [outs[0], outs[1], outs[3]]), ((1, N, H), ("h0", "c0"))


@pytest.mark.parametrize("where", ["step", "outer"])
@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_a_layer_fc_with_an_unreadable_argument_is_refused_with_its_place(layer, where):
    """The layer matchers read the FCs' arguments (the step FC's, the outer i2h FC's); one that does not read
    leaves the op to its own converter, whose error names the net, the step net and the op."""
    m, net, init = layer_case(layer)
    step = next(a.n for a in net.op[1].arg if a.name == "step_net")
    fc = next(op for op in step.op if op.type == "FC") if where == "step" else net.op[0]
    axis = next(a for a in fc.arg if a.name == "axis")
    axis.ClearField("i")
    axis.s = b"two"
    place = r"op #1 \(RecurrentNetwork\), step net .*\(FC\)" if where == "step" else r"op #0 \(FC\)"
    with pytest.raises(Exception, match=place + r".*argument 'axis'"):
        export_onnx(net, inputs=feeds_for(SHORT, *init), params=random_params(m, 1))


@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_a_layer_step_fc_missing_its_bias_is_refused_with_its_place(layer):
    """A step FC with two inputs is no layer's: the op goes to the Scan's converters, whose arity error names
    the net, the step net and the op."""
    m, net, init = layer_case(layer)
    step = next(a.n for a in net.op[1].arg if a.name == "step_net")
    del next(op for op in step.op if op.type == "FC").input[2]
    with pytest.raises(Exception, match=r"op #1 \(RecurrentNetwork\), step net .*\(FC\): FC takes 3 inputs, got 2"):
        export_onnx(net, inputs=feeds_for(SHORT, *init), params=random_params(m, 1))
