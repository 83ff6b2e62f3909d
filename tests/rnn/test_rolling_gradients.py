"""State gradients kept as 2 rows (stepnet.graph.step_nets.rolling_gradients): a backward step touches rows
t and t + 1 of a state's gradient only, so where every link into it is one of those rows (and nothing reads the
tensor whole) the gradient op keeps 2 rows, linked at rows (t + offset) mod 2, the offset-0 row zeroed when
pointed at. Every gradient is bit for bit what the full (T + 1)-row tensors give, compiled and op by op."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.rnn import basic_rnn, gru, lstm
from stepnet.testing import make_op

from .test_compiled import loss_of, run_model

F = np.float32
T, N, D, H = 6, 3, 4, 5


def build(cell):
    def make(m):
        if cell == "lstm":
            out = lstm(m, "X", "seq", ["h0", "c0"], D, H)
        elif cell == "gru":
            out = gru(m, "X", "seq", ["h0"], D, H)
        else:
            out = basic_rnn(m, "X", None, ["h0"], D, H)
        m.add_gradient_ops([loss_of(m, out[0])])
    return make


def feeds(rng):
    return {"X": rng.uniform(-1, 1, (T, N, D)).astype(F), "seq": np.array([T, 2, T - 1], np.int32),
            "h0": rng.uniform(-1, 1, (1, N, H)).astype(F), "c0": rng.uniform(-1, 1, (1, N, H)).astype(F)}


def gradients(ws) -> dict:
    return {b: ws.fetch(b) for b in ws.blobs() if b.endswith("_grad") and not b.endswith("_states_grad")
            and isinstance(ws.find(b).value, np.ndarray)}


def state_grad_rows(ws) -> set:
    return {ws.fetch(b).shape[0] for b in ws.blobs() if b.endswith("_states_grad")}


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_rolling_state_gradients_give_the_full_tensors_bits(cell, compiled, monkeypatch):
    import stepnet.ops.recurrent_grad as recurrent_grad

    rng = np.random.default_rng(5)
    data = feeds(rng)
    ws_roll, _ = run_model(build(cell), data, runs=3, compile_steps=compiled, fused_cells=False)
    assert state_grad_rows(ws_roll) == {2}
    monkeypatch.setattr(recurrent_grad, "rolling_gradients", lambda *a: ())
    ws_full, _ = run_model(build(cell), data, runs=3, compile_steps=compiled, fused_cells=False)
    assert state_grad_rows(ws_full) == {T + 1}
    got, want = gradients(ws_roll), gradients(ws_full)
    assert set(got) == set(want) and len(want) >= 5
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_wrong_rolling_row_is_caught(monkeypatch, broken):
    """Proof for the test above: the output gradient accumulated into row t mod 2 instead of t + 1 changes the
    gradients."""
    import stepnet.ops.recurrent_grad as recurrent_grad
    from stepnet.ops.registry import REGISTRY

    data = feeds(np.random.default_rng(6))
    with monkeypatch.context() as m:
        m.setattr(recurrent_grad, "rolling_gradients", lambda *a: ())
        ws_full, _ = run_model(build("lstm"), data, runs=1, compile_steps=False, fused_cells=False)
    real = REGISTRY.get("rnn_internal_accumulate_gradient_input").kernel

    def off_by_one(xp, timestep, og, g, *, offset, cyclic):
        return real(xp, timestep, og, g, offset=offset - 1 if cyclic else offset, cyclic=cyclic)
    broken("rnn_internal_accumulate_gradient_input", off_by_one)
    ws_bad, _ = run_model(build("lstm"), data, runs=1, compile_steps=False, fused_cells=False)
    got, want = gradients(ws_bad), gradients(ws_full)
    assert any(not np.array_equal(got[n], want[n]) for n in want)


def test_links_and_accumulation_in_rolling_rows():
    """rnn_internal_apply_links with cyclic / zeroed flags and rnn_internal_accumulate_gradient_input with
    cyclic, op by op: rows (t + offset) mod 2, the zeroed view filled with zeros (against numpy indexing)."""
    ws = Workspace()
    g = np.arange(2 * 3, dtype=F).reshape(2, 1, 3) + 1
    og = np.full((5, 1, 3), 10, F)
    ws.feed("g", g.copy())
    ws.feed("og", og)
    for t in range(5):
        ws.feed("timestep", np.array([t], np.int32))
        before = ws.fetch("g").copy()
        ws.run_operator_once(make_op("rnn_internal_accumulate_gradient_input", ["timestep", "og", "g"], ["g"],
                                     offset=1, cyclic=1))
        want = before.copy()
        want[(t + 1) % 2] += og[t]
        np.testing.assert_array_equal(ws.fetch("g"), want)
        ws.run_operator_once(make_op("rnn_internal_apply_links", ["timestep", "g", "g"], ["dh", "dh_prev"],
                                     offsets=[1, 0], windows=[1, 1], keep=[1, 1], cyclic=[1, 1], zeroed=[0, 1]))
        np.testing.assert_array_equal(ws.fetch("dh"), want[(t + 1) % 2][None])
        np.testing.assert_array_equal(ws.fetch("dh_prev"), np.zeros((1, 1, 3), F))
        assert not ws.fetch("g")[t % 2].any() and np.array_equal(ws.fetch("g")[(t + 1) % 2], want[(t + 1) % 2])


@pytest.mark.parametrize("compiled", [True, False])
def test_a_previous_state_gradient_no_op_writes_reads_as_zeros(compiled):
    """A step that ignores its previous state (h_t = tanh(x_t)) never writes h_prev_grad: in a full gradient
    tensor that row stays 0 until the output gradient is added to it, so a rolling one must zero it when pointed
    at (not keep the row of two steps later). Against the float64 loop, compiled and op by op."""
    from stepnet.io.proto import NetDef, OperatorDef, make_argument

    step = NetDef(name="step", op=[make_op("Tanh", ["input_t"], ["h_t"])],
                  external_input=["input_t", "h_prev"], external_output=["h_t"])
    backward = NetDef(name="back", op=[make_op("TanhGradient", ["h_t", "h_t_grad"], ["input_t_grad"])],
                      external_input=["h_t", "h_t_grad"])
    args = dict(step_net=step, backward_step_net=backward, recurrent_states=["h_states"],
                initial_recurrent_state_ids=[1], link_internal=["h_prev", "h_t", "input_t"],
                link_external=["h_states", "h_states", "x"], link_offset=[0, 1, 0],
                alias_src=["h_states", "h_states"], alias_dst=["h_all", "h_last"], alias_offset=[1, -1],
                outputs_with_grads=[0, 1], backward_link_internal=["h_t_grad", "h_prev_grad", "input_t_grad"],
                backward_link_external=["h_states_grad", "h_states_grad", "x_grad"],
                backward_link_offset=[1, 0, 0], timestep="timestep")
    fwd = OperatorDef(type="RecurrentNetwork", input=["x", "h0"], output=["h_all", "h_last", "ws"],
                      arg=[make_argument(k, v) for k, v in args.items()])
    grad = OperatorDef(type="RecurrentNetworkGradient", input=["h_all_grad", "h_last_grad", "x", "h0", "h_all",
                                                              "h_last", "ws"],
                       output=["x_grad", "h0_grad"], arg=list(fwd.arg))
    rng = np.random.default_rng(7)
    x, h0 = rng.uniform(-1, 1, (T, N, H)).astype(F), rng.uniform(-1, 1, (1, N, H)).astype(F)
    dall, dlast = rng.uniform(-1, 1, (T, N, H)).astype(F), rng.uniform(-1, 1, (1, N, H)).astype(F)
    ws = Workspace(compile_steps=compiled)
    for name, value in (("x", x), ("h0", h0), ("h_all_grad", dall), ("h_last_grad", dlast)):
        ws.feed(name, value)
    net = ws.create_net(NetDef(name="n", op=[fwd, grad]))
    for _ in range(3):
        net.run()
    dh = dall.astype(np.float64)
    dh[-1] += dlast[0]
    want = dh * (1 - np.tanh(x.astype(np.float64)) ** 2)
    assert ws.fetch("h_states_grad").shape[0] == 2
    np.testing.assert_allclose(ws.fetch("x_grad"), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ws.fetch("h0_grad"), np.zeros((1, N, H), F))
