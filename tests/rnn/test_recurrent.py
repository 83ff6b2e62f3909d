"""RecurrentNetwork forward semantics (spec §3.2–§3.8) against step-by-step loops."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import ArgumentError, MissingBlobError, ShapeError
from stepnet.io.proto import NetDef, OperatorDef, make_argument
from stepnet.ops.recurrent import StepWorkspaces
from stepnet.testing import make_op


def sum_mul_step(name="step"):
    step = NetDef(name=name)
    step.op.extend([make_op("Sum", ["input_t", "o_prev"], ["o_int"]), make_op("Mul", ["input_t", "o_int"], ["o_t"])])
    step.external_input.extend(["input_t", "o_prev"])
    step.external_output.append("o_t")
    return step


def rnn_op(step, inputs=("x", "o_init"), backward=None, **over):
    args = dict(step_net=step, recurrent_states=["o_states"], initial_recurrent_state_ids=[1],
                link_internal=["o_prev", "o_t", "input_t"], link_external=["o_states", "o_states", "x"],
                link_offset=[0, 1, 0], alias_src=["o_states", "o_states"], alias_dst=["o_all", "o_last"],
                alias_offset=[1, -1], timestep="timestep", outputs_with_grads=[0])
    if backward is not None:
        args["backward_step_net"] = backward
    args.update(over)
    op = OperatorDef(type="RecurrentNetwork", input=list(inputs), output=["o_all", "o_last", "step_ws"])
    op.arg.extend(make_argument(k, v) for k, v in args.items())
    return op


def reference(x, h0):
    o = np.broadcast_to(h0.reshape(-1, x.shape[-1]) if h0.ndim > 1 else h0, x.shape[1:]).astype(np.float64)
    out = []
    for t in range(x.shape[0]):
        o = x[t] * (x[t] + o)
        out.append(o)
    return np.stack(out)


def run(op, x, h0, ws=None):
    ws = ws or Workspace()
    ws.feed("x", x)
    ws.feed("o_init", h0)
    net = NetDef(name="outer")
    net.op.append(op)
    ws.run_net_once(net)
    return ws


@pytest.mark.parametrize("T, N, D", [(1, 1, 1), (4, 3, 2), (3, 5, 4)])
@pytest.mark.parametrize("init_rank", [1, 2, 3])
def test_sum_mul_matches_loop(T, N, D, init_rank):
    rng = np.random.default_rng(T * 100 + N * 10 + D)
    x = rng.uniform(-1, 1, (T, N, D)).astype(np.float32)
    h0 = rng.uniform(-1, 1, {1: (D,), 2: (N, D), 3: (1, N, D)}[init_rank]).astype(np.float32)
    ws = run(rnn_op(sum_mul_step()), x, h0)
    ref = reference(x, h0)
    np.testing.assert_allclose(ws.fetch("o_all"), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ws.fetch("o_last"), ref[-1:], rtol=1e-5, atol=1e-6)
    states = ws.fetch("o_states")
    assert states.shape == (T + 1, N, D)
    np.testing.assert_allclose(states[0], np.broadcast_to(h0.reshape(-1, D), (N, D)))


def test_outputs_are_views_of_the_state_tensor():
    x = np.ones((3, 2, 2), np.float32)
    ws = run(rnn_op(sum_mul_step()), x, np.zeros((1, 2, 2), np.float32))
    states = ws.get_blob("o_states").value
    assert ws.get_blob("o_all").view and np.shares_memory(ws.get_blob("o_all").value, states)
    assert ws.get_blob("o_last").value.shape == (1, 2, 2)


def test_forward_only_rotates_two_workspaces_and_training_keeps_one_per_step():
    x = np.ones((5, 2, 2), np.float32)
    ws = run(rnn_op(sum_mul_step()), x, np.zeros((1, 2, 2), np.float32))
    scratch = ws.get_blob("step_ws").value
    assert isinstance(scratch, StepWorkspaces) and len(scratch.steps) == 2
    bwd = NetDef(name="RecurrentBackwardStep", op=[make_op("MulGradient", ["input_t", "o_int", "o_t_grad"],
                                                           ["input_t_grad", "o_int_grad"])])
    ws2 = run(rnn_op(sum_mul_step(), backward=bwd), x, np.zeros((1, 2, 2), np.float32))
    steps = ws2.get_blob("step_ws").value.steps
    assert len(steps) == 5
    # every timestep keeps its own activations the backward step net reads (o_int) and its own timestep value
    assert [int(s.fetch("timestep")[0]) for s in steps] == [0, 1, 2, 3, 4]
    assert all(s.local_blobs().count("o_int") == 1 for s in steps)
    # an activation no backward op reads is kept once, in the shared workspace (graph.step_nets.shared_scratch)
    ws3 = run(rnn_op(sum_mul_step(), backward=NetDef(name="RecurrentBackwardStep")), x, np.zeros((1, 2, 2), np.float32))
    scratch = ws3.get_blob("step_ws").value
    assert not any("o_int" in s.local_blobs() for s in scratch.steps) and "o_int" in scratch.shared.local_blobs()
    np.testing.assert_array_equal(ws3.fetch("o_all"), ws2.fetch("o_all"))


def test_variable_length_runs_of_one_created_net_match_fresh_runs():
    rng = np.random.default_rng(5)
    ws = Workspace()
    net = NetDef(name="outer")
    net.op.append(rnn_op(sum_mul_step(), backward=NetDef(name="back")))
    ws.feed("x", np.zeros((2, 3, 2), np.float32))
    ws.feed("o_init", np.zeros((1, 3, 2), np.float32))
    created = ws.create_net(net)
    for T in (6, 3, 4, 6, 4):
        x = rng.uniform(-1, 1, (T, 3, 2)).astype(np.float32)
        h0 = rng.uniform(-1, 1, (1, 3, 2)).astype(np.float32)
        ws.feed("x", x)
        ws.feed("o_init", h0)
        created.run()
        fresh = run(rnn_op(sum_mul_step(), backward=NetDef(name="back")), x, h0)
        np.testing.assert_array_equal(ws.fetch("o_all"), fresh.fetch("o_all"))
        assert ws.fetch("o_all").shape == (T, 3, 2)


def test_ancestor_blob_with_a_step_blob_name_is_shared_across_steps():
    """Caffe2 binding rule (§3.8): a step output whose name exists in an ancestor is that ancestor's blob."""
    ws = Workspace()
    ws.feed("o_int", np.zeros((1, 2, 2), np.float32))
    run(rnn_op(sum_mul_step(), backward=NetDef(name="back")), np.ones((3, 2, 2), np.float32),
        np.zeros((1, 2, 2), np.float32), ws)
    steps = ws.get_blob("step_ws").value.steps
    assert all("o_int" not in s.local_blobs() for s in steps)


def test_step_net_as_text_in_argument_s():
    from stepnet.io.proto import to_text
    op = rnn_op(sum_mul_step())
    for a in op.arg:
        if a.name == "step_net":
            a.ClearField("n")
            a.s = to_text(sum_mul_step()).encode()
    x = np.random.default_rng(1).uniform(-1, 1, (3, 2, 2)).astype(np.float32)
    h0 = np.zeros((1, 2, 2), np.float32)
    np.testing.assert_allclose(run(op, x, h0).fetch("o_all"), reference(x, h0), rtol=1e-6)


def test_windowed_links_and_multi_row_initial_state():
    """A step that sums a window of the last w inputs (like Caffe2's stateful convolution test)."""
    T, N, D, w = 5, 2, 3, 3
    step = NetDef(name="win")
    step.op.extend([make_op("Copy", ["input_t"], ["state_t"]),
                    make_op("ReduceSum", ["window_t"], ["s_t"], axes=[0], keepdims=1)])
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (T, N, D)).astype(np.float32)
    init = np.zeros((w - 1, N, D), np.float32)
    op = OperatorDef(type="RecurrentNetwork", input=["x", "init", "sinit"], output=["sums_all", "sums_last",
                                                                                     "st_all", "ws"])
    args = dict(step_net=step, recurrent_states=["states", "sums"], initial_recurrent_state_ids=[1, 2],
                link_internal=["window_t", "state_t", "input_t", "s_t"],
                link_external=["states", "states", "x", "sums"], link_offset=[0, w - 1, 0, 1],
                link_window=[w, 1, 1, 1], alias_src=["sums", "sums", "states"],
                alias_dst=["sums_all", "sums_last", "st_all"], alias_offset=[1, -1, w - 1])
    op.arg.extend(make_argument(k, v) for k, v in args.items())
    ws = Workspace()
    ws.feed("x", x)
    ws.feed("init", init)
    ws.feed("sinit", np.zeros((1, N, D), np.float32))
    net = NetDef(name="outer")
    net.op.append(op)
    ws.run_net_once(net)
    padded = np.concatenate([init, x])
    ref = np.stack([padded[t:t + w].sum(axis=0) for t in range(T)])
    np.testing.assert_allclose(ws.fetch("sums_all"), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ws.fetch("st_all"), x)


@pytest.mark.parametrize("change, error, message", [
    (dict(link_offset=[0, 1, 1]), ShapeError, r"rows \[4, 5\).*run past the end of its 4 rows"),
    (dict(alias_offset=[1, -9]), ArgumentError, "alias 'o_last': offset -9 is outside"),
    (dict(link_offset=[0, -1, 0]), ArgumentError, "link_offset of 'o_t' is -1"),
    (dict(alias_src=["o_states", "nope"]), ArgumentError, "'nope', which is not a recurrent state"),
    (dict(backward_step_net=sum_mul_step()), ArgumentError, "both named 'step'"),
])
def test_bad_arguments(change, error, message):
    with pytest.raises(error, match=message):
        run(rnn_op(sum_mul_step(), **change), np.ones((4, 2, 2), np.float32), np.zeros((1, 2, 2), np.float32))


@pytest.mark.parametrize("h0, message", [
    (np.zeros((1, 1, 2, 2), np.float32), "rank 4"),
    (np.zeros((1, 3, 2), np.float32), "batch size 3 but the input sequence has N = 2"),
])
def test_bad_initial_states(h0, message):
    with pytest.raises(ShapeError, match=message):
        run(rnn_op(sum_mul_step()), np.ones((4, 2, 2), np.float32), h0)


def test_gradient_without_kept_workspaces():
    op = OperatorDef(type="RecurrentNetworkGradient", input=["o_all_grad", "x", "o_init", "o_all", "o_last",
                                                              "step_ws"], output=["x_grad", "o_init_grad"])
    fwd = rnn_op(sum_mul_step())  # forward-only: 2 rotating workspaces
    op.arg.extend(list(fwd.arg) + [make_argument("backward_step_net", NetDef(name="back", op=[]))])
    ws = run(fwd, np.ones((4, 2, 2), np.float32), np.zeros((1, 2, 2), np.float32))
    ws.feed("o_all_grad", np.ones((4, 2, 2), np.float32))
    net = NetDef(name="g")
    net.op.append(op)
    with pytest.raises(MissingBlobError, match="kept 2 step workspaces.*needs 4"):
        ws.run_net_once(net)
