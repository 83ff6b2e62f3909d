"""GRU (gru_cell.GRU layout) and BasicRNN (rnn_cell.BasicRNN layout) against independent numpy references:
outputs, and every gradient by central differences of the float64 reference."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import ArgumentError
from stepnet.passes.gradients import GradientError
from stepnet.builders.model import ModelBuilder
from stepnet.builders.rnn import basic_rnn, gru

from .reference_multi import basic_rnn_forward, gru_forward, numeric_grads

F = np.float32
GRU_PARAMS = ["GRU/i2h_w", "GRU/i2h_b", "GRU/reset_gate_t_w", "GRU/reset_gate_t_b", "GRU/update_gate_t_w",
              "GRU/update_gate_t_b", "GRU/output_gate_t_w", "GRU/output_gate_t_b"]
RNN_PARAMS = ["BasicRNN/i2h_w", "BasicRNN/i2h_b", "BasicRNN/gates_t_w", "BasicRNN/gates_t_b"]


def feed_all(ws, values):
    for k, v in values.items():
        ws.feed(k, v)


def gru_values(T, N, D, H, rng, init_shape):
    shapes = [(3 * H, D), (3 * H,), (H, H), (H,), (H, H), (H,), (H, H), (H,)]
    v = {n: rng.uniform(-.7, .7, s).astype(F) for n, s in zip(GRU_PARAMS, shapes, strict=True)}
    v["X"] = rng.uniform(-1, 1, (T, N, D)).astype(F)
    v["h0"] = rng.uniform(-1, 1, init_shape).astype(F)
    return v


def gru_reference(v, seq, drop_states, lbr):
    def f(X, h0, **p):
        h = gru_forward(X, h0, *(p[k.replace("/", "_")] for k in GRU_PARAMS), seq=seq, drop_states=drop_states,
                        linear_before_reset=lbr)
        return h, h[-1:]
    return f, {"X": v["X"], "h0": v["h0"], **{k.replace("/", "_"): v[k] for k in GRU_PARAMS}}


@pytest.mark.parametrize("seq, drop_states, lbr, owg, init_shape", [
    (True, False, False, (0,), (1, 2, 3)),
    (True, True, True, (0, 1), (2, 3)),
    (False, False, True, (1,), (1, 2, 3)),
    (True, False, False, (0, 1), (3,)),
])
def test_gru_outputs_and_gradients(seq, drop_states, lbr, owg, init_shape):
    T, N, D, H = 3, 2, 2, 3
    rng = np.random.default_rng(len(owg) + 3 * int(lbr) + len(init_shape))
    v = gru_values(T, N, D, H, rng, init_shape)
    lengths = np.array([T, 1], np.int32)
    up = [rng.standard_normal((T, N, H)).astype(F), rng.standard_normal((1, N, H)).astype(F)]
    m = ModelBuilder("m")
    outs = gru(m, "X", "seq" if seq else None, ["h0"], D, H, outputs_with_grads=owg, drop_states=drop_states,
               linear_before_reset=lbr)
    assert outs == ["GRU/hidden_t_all", "GRU/hidden_t_last"]
    grads = m.net.add_gradient_ops({outs[k]: f"up{k}" for k in owg})
    ws = Workspace()
    feed_all(ws, v)
    feed_all(ws, {f"up{k}": up[k] for k in owg})
    if seq:
        ws.feed("seq", lengths)
    ws.run_net_once(m.net.proto())
    f, args = gru_reference(v, lengths if seq else None, drop_states, lbr)
    want = f(**args)
    np.testing.assert_allclose(ws.fetch(outs[0]), want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ws.fetch(outs[1]), want[1], rtol=1e-4, atol=1e-5)
    numeric = numeric_grads(f, args, [up[k] if k in owg else None for k in range(2)])
    for name in ["X", "h0"] + GRU_PARAMS:
        np.testing.assert_allclose(ws.fetch(grads[name]), numeric[name.replace("/", "_")], rtol=1e-3, atol=1e-4,
                                   err_msg=f"d{name}")


def test_gru_layout_matches_caffe2_gru_cell():
    m = ModelBuilder("m")
    gru(m, "X", "seq", ["h0"], 4, 3)
    fc, rnn = m.net.proto().op
    assert fc.type == "FC" and list(fc.output) == ["GRU/i2h"]
    a = {x.name: x for x in rnn.arg}
    step = a["step_net"].n
    assert [(o.type, list(o.output)) for o in step.op] == [
        ("Split", ["GRU/input_t_reset", "GRU/input_t_update", "GRU/input_t_output"]),
        ("FC", ["GRU/reset_gate_t"]), ("FC", ["GRU/update_gate_t"]), ("Sum", ["GRU/reset_gate_t"]),
        ("Sigmoid", ["GRU/reset_gate_t_sigmoid"]), ("Mul", ["GRU/modified_hidden_t_prev"]),
        ("FC", ["GRU/output_gate_t"]), ("Sum", ["GRU/update_gate_t"]), ("Sum", ["GRU/output_gate_t_summed"]),
        ("Concat", ["GRU/gates_t", "GRU/_gates_t_concat_dims"]), ("GRUUnit", ["GRU/hidden_t"])]
    assert list(step.op[-1].input) == ["GRU/hidden_t_prev", "GRU/gates_t", "seq", "timestep"]
    assert [s.decode() for s in a["recurrent_states"].strings] == ["GRU/GRU/hidden_t_prev_states"]
    assert list(rnn.output) == ["GRU/hidden_t_all", "GRU/hidden_t_last", "GRU/step_workspaces"]


def test_gru_without_initial_states_makes_a_trainable_zero_state():
    m = ModelBuilder("m")
    gru(m, "X", None, None, 2, 3, forward_only=True)
    assert "GRU/initial_hidden_state" in m.params
    assert list(m.net.proto().op[1].input[:2]) == ["GRU/i2h", "GRU/initial_hidden_state"]


def rnn_reference(v, seq, drop_states, activation):
    def f(X, h0, BasicRNN_i2h_w, BasicRNN_i2h_b, BasicRNN_gates_t_w, BasicRNN_gates_t_b):
        h = basic_rnn_forward(X, h0, BasicRNN_i2h_w, BasicRNN_i2h_b, BasicRNN_gates_t_w, BasicRNN_gates_t_b, seq,
                              drop_states, activation)
        return h, h[-1:]
    return f, {"X": v["X"], "h0": v["h0"], **{k.replace("/", "_"): v[k] for k in RNN_PARAMS}}


def rnn_values(T, N, D, H, rng):
    v = {n: rng.uniform(-.8, .8, s).astype(F) for n, s in zip(RNN_PARAMS, [(H, D), (H,), (H, H), (H,)], strict=True)}
    v["X"] = rng.uniform(-1, 1, (T, N, D)).astype(F)
    v["h0"] = rng.uniform(-1, 1, (1, N, H)).astype(F)
    return v


@pytest.mark.parametrize("activation, drop_states", [("tanh", False), ("tanh", True), ("relu", False)])
def test_basic_rnn_forward_with_seq_lengths(activation, drop_states):
    T, N, D, H = 4, 3, 2, 3
    rng = np.random.default_rng(7)
    v = rnn_values(T, N, D, H, rng)
    lengths = np.array([4, 2, 1], np.int32)
    m = ModelBuilder("m")
    outs = basic_rnn(m, "X", "seq", ["h0"], D, H, activation=activation, drop_states=drop_states,
                     forward_only=True)
    assert outs == ["BasicRNN/hidden_valid_all" if drop_states else "BasicRNN/hidden_t_all",
                    "BasicRNN/hidden_valid_last" if drop_states else "BasicRNN/hidden_t_last"]
    ws = Workspace()
    feed_all(ws, v)
    ws.feed("seq", lengths)
    ws.run_net_once(m.net.proto())
    f, args = rnn_reference(v, lengths, drop_states, activation)
    want = f(**args)
    np.testing.assert_allclose(ws.fetch(outs[0]), want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ws.fetch(outs[1]), want[1], rtol=1e-4, atol=1e-5)
    step = {a.name: a for a in m.net.proto().op[1].arg}["step_net"].n
    assert [o.type for o in step.op] == (["FC", "Sum", "Tanh" if activation == "tanh" else "Relu",
                                          "CopyFromCPUInput", "GT", "LE", "Cast", "Cast", "Mul"]
                                         + ([] if drop_states else ["Mul", "Add"]))


@pytest.mark.parametrize("activation, owg", [("tanh", (0,)), ("tanh", (0, 1)), ("relu", (1,))])
def test_basic_rnn_gradients_without_seq_lengths(activation, owg):
    T, N, D, H = 3, 2, 2, 3
    rng = np.random.default_rng(11 + len(owg))
    v = rnn_values(T, N, D, H, rng)
    up = [rng.standard_normal((T, N, H)).astype(F), rng.standard_normal((1, N, H)).astype(F)]
    m = ModelBuilder("m")
    outs = basic_rnn(m, "X", None, ["h0"], D, H, activation=activation, outputs_with_grads=owg)
    grads = m.net.add_gradient_ops({outs[k]: f"up{k}" for k in owg})
    ws = Workspace()
    feed_all(ws, v)
    feed_all(ws, {f"up{k}": up[k] for k in owg})
    ws.run_net_once(m.net.proto())
    f, args = rnn_reference(v, None, False, activation)
    np.testing.assert_allclose(ws.fetch(outs[0]), f(**args)[0], rtol=1e-4, atol=1e-5)
    numeric = numeric_grads(f, args, [up[k] if k in owg else None for k in range(2)])
    for name in ["X", "h0"] + RNN_PARAMS:
        np.testing.assert_allclose(ws.fetch(grads[name]), numeric[name.replace("/", "_")], rtol=1e-3, atol=1e-4,
                                   err_msg=f"d{name}")


def test_basic_rnn_with_seq_lengths_is_forward_only_as_in_caffe2():
    with pytest.raises(ArgumentError, match="basic_rnn with seq_lengths has no backward pass.*forward_only=True"):
        basic_rnn(ModelBuilder("m"), "X", "seq", ["h0"], 2, 3)
    with pytest.raises(ArgumentError, match="needs initial_states"):
        basic_rnn(ModelBuilder("m"), "X", None, None, 2, 3)
    with pytest.raises(ArgumentError, match="'tanh' or 'relu', got 'sigmoid'"):
        basic_rnn(ModelBuilder("m"), "X", None, ["h0"], 2, 3, activation="sigmoid")


def test_the_masking_itself_has_no_gradient_in_caffe2_either():
    """Building Caffe2's masked step net and differentiating it fails on the Cast (no from_type)."""
    from stepnet.builders.builder import BlobRef, NetBuilder
    from stepnet.passes.gradients import backward_ops
    from stepnet.builders.cells import BasicRNNCell
    m = ModelBuilder("m")
    step = NetBuilder("BasicRNN")
    (h,) = BasicRNNCell(2, 3, drop_states=True, name="BasicRNN").apply(
        m, step, BlobRef("input_t"), "seq", ["BasicRNN/hidden_t_prev"], "timestep")
    with pytest.raises(GradientError, match="from_type"):
        backward_ops(list(step.proto().op), {h: h + "_grad"})


def test_the_reference_comparison_catches_a_wrong_gru_unit(broken):
    from stepnet.ops import REGISTRY
    schema = REGISTRY.get("GRUUnitGradient")

    def wrong(xp, *args, **kw):
        dh, dg = schema.kernel(xp, *args, **kw)
        return dh * 1.01, dg
    broken("GRUUnitGradient", wrong)
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        test_gru_outputs_and_gradients(False, False, True, (1,), (1, 2, 3))
