"""The LSTM built like Caffe2's rnn_cell.LSTM (spec §3.16) against an independent numpy LSTM + BPTT."""
import itertools

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.model import ModelBuilder
from stepnet.ops import REGISTRY
from stepnet.builders.rnn import lstm

from .reference import lstm_backward, lstm_forward

OUTS = ["LSTM/hidden_state_all", "LSTM/hidden_state_last", "LSTM/cell_state_all", "LSTM/cell_state_last"]


def build(D, H, seq=True, forward_only=False, outputs_with_grads=(0,), **kw):
    m = ModelBuilder("m")
    outs = lstm(m, "X", "seq" if seq else None, ("h0", "c0"), D, H, scope="LSTM", forward_only=forward_only,
                outputs_with_grads=outputs_with_grads, **kw)
    assert outs == OUTS
    grads = None
    if not forward_only:
        grads = m.net.add_gradient_ops({OUTS[k]: OUTS[k] + "_in_grad" for k in outputs_with_grads})
    return m, grads


def data(T, N, D, H, seed, init_rank=2):
    rng = np.random.default_rng(seed)
    f = np.float32
    v = dict(X=rng.uniform(-1, 1, (T, N, D)).astype(f), Wi=rng.uniform(-.5, .5, (4 * H, D)).astype(f),
             bi=rng.uniform(-.5, .5, 4 * H).astype(f), Wg=rng.uniform(-.5, .5, (4 * H, H)).astype(f),
             bg=rng.uniform(-.5, .5, 4 * H).astype(f), h0=rng.uniform(-1, 1, (N, H)).astype(f),
             c0=rng.uniform(-1, 1, (N, H)).astype(f), seq=rng.integers(1, T + 1, N).astype(np.int32))
    v["up"] = [rng.standard_normal(s).astype(f) for s in ((T, N, H), (1, N, H), (T, N, H), (1, N, H))]
    v["init_shape"] = (N, H) if init_rank == 2 else (1, N, H)
    return v


def run(m, v, outputs_with_grads, seq=True):
    ws = Workspace()
    feeds = {"X": v["X"], "LSTM/i2h_w": v["Wi"], "LSTM/i2h_b": v["bi"], "LSTM/gates_t_w": v["Wg"],
             "LSTM/gates_t_b": v["bg"], "h0": v["h0"].reshape(v["init_shape"]),
             "c0": v["c0"].reshape(v["init_shape"])}
    if seq:
        feeds["seq"] = v["seq"]
    for k in outputs_with_grads:
        feeds[OUTS[k] + "_in_grad"] = v["up"][k]
    for name, value in feeds.items():
        ws.feed(name, value)
    ws.run_net_once(m.net.proto())
    return ws


CASES = list(itertools.product([(0,), (1,), (0, 1, 2, 3)], [True, False], [0.0, 1.5], [False, True],
                               [False, True], [2, 3]))


@pytest.mark.parametrize("owg, seq, forget_bias, drop_states, memopt, init_rank", CASES[::3] + CASES[1::7])
def test_lstm_outputs_and_every_gradient(owg, seq, forget_bias, drop_states, memopt, init_rank):
    T, N, D, H = 4, 3, 2, 3
    v = data(T, N, D, H, seed=len(owg) * 7 + int(seq) + int(drop_states) * 3 + init_rank, init_rank=init_rank)
    m, grads = build(D, H, seq=seq, outputs_with_grads=owg, forget_bias=forget_bias, drop_states=drop_states,
                     memory_optimization=memopt)
    ws = run(m, v, owg, seq)
    h_all, c_all, cache = lstm_forward(v["X"].astype(np.float64), v["h0"], v["c0"], v["Wi"], v["bi"], v["Wg"],
                                       v["bg"], v["seq"] if seq else None, forget_bias, drop_states)
    for name, want in zip(OUTS, (h_all, h_all[-1:], c_all, c_all[-1:])):
        np.testing.assert_allclose(ws.fetch(name), want, rtol=1e-4, atol=1e-5, err_msg=name)
    up = [v["up"][k] if k in owg else np.zeros_like(v["up"][k]) for k in range(4)]
    ref = lstm_backward(v["X"].astype(np.float64), v["Wi"], v["Wg"], cache, up[0], up[1][0], up[2], up[3][0],
                        drop_states)
    names = ["X", "LSTM/i2h_w", "LSTM/i2h_b", "LSTM/gates_t_w", "LSTM/gates_t_b", "h0", "c0"]
    for name, want in zip(names, ref):
        got = ws.fetch(grads[name])
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-3, atol=1e-4, err_msg=f"d{name}")
        if name in ("h0", "c0"):
            assert got.shape == v["init_shape"]


def test_forward_only_matches_and_has_no_backward_net():
    T, N, D, H = 5, 2, 3, 4
    v = data(T, N, D, H, seed=3)
    m, _ = build(D, H, forward_only=True)
    op = m.net.proto().op[-1]
    assert op.type == "RecurrentNetwork" and "backward_step_net" not in [a.name for a in op.arg]
    ws = run(m, v, ())
    h_all, c_all, _ = lstm_forward(v["X"].astype(np.float64), v["h0"], v["c0"], v["Wi"], v["bi"], v["Wg"],
                                   v["bg"], v["seq"])
    np.testing.assert_allclose(ws.fetch(OUTS[0]), h_all, rtol=1e-4, atol=1e-5)
    assert len(ws.get_blob("LSTM/step_workspaces").value.steps) == 2


def test_layout_matches_caffe2():
    """The op, its arguments and both step nets carry exactly the names and order of spec §3.16."""
    m, _ = build(5, 3, outputs_with_grads=(0,))
    ops = m.net.proto().op
    assert [o.type for o in ops[:2]] == ["FC", "RecurrentNetwork"]
    rnn = ops[1]
    assert list(rnn.input) == ["LSTM/i2h", "h0", "c0", "LSTM/gates_t_w", "LSTM/gates_t_b", "seq"]
    assert list(rnn.output) == OUTS + ["LSTM/step_workspaces"]
    a = {x.name: x for x in rnn.arg}
    strs = lambda n: [s.decode() for s in a[n].strings]  # noqa: E731
    assert strs("recurrent_states") == ["LSTM/LSTM/hidden_t_prev_states", "LSTM/LSTM/cell_t_prev_states"]
    assert list(a["initial_recurrent_state_ids"].ints) == [1, 2]
    assert strs("link_internal") == ["LSTM/hidden_t_prev", "LSTM/hidden_state", "LSTM/cell_t_prev",
                                     "LSTM/cell_state", "input_t"]
    h, c = "LSTM/LSTM/hidden_t_prev_states", "LSTM/LSTM/cell_t_prev_states"
    assert strs("link_external") == [h, h, c, c, "LSTM/i2h"]
    assert list(a["link_offset"].ints) == [0, 1, 0, 1, 0]
    assert list(a["alias_offset"].ints) == [1, -1, 1, -1]
    assert list(a["param"].ints) == [3, 4]
    assert strs("param_grads") == ["LSTM/gates_t_w_grad", "LSTM/gates_t_b_grad"]
    assert strs("backward_link_internal") == ["LSTM/hidden_state_grad", "LSTM/hidden_t_prev_grad",
                                              "LSTM/cell_state_grad", "LSTM/cell_t_prev_grad", "LSTM/gates_t_grad"]
    assert strs("backward_link_external") == [h + "_grad", h + "_grad", c + "_grad", c + "_grad", "LSTM/i2h_grad"]
    assert list(a["backward_link_offset"].ints) == [1, 0, 1, 0, 0]
    step = a["step_net"].n
    assert [o.type for o in step.op] == ["FC", "Sum", "LSTMUnit"]
    assert list(step.external_input) == ["input_t", "timestep", "LSTM/hidden_t_prev", "LSTM/cell_t_prev",
                                         "LSTM/gates_t_w", "LSTM/gates_t_b", "seq"]
    back = a["backward_step_net"].n
    assert [(o.type, list(o.output)) for o in back.op] == [
        ("LSTMUnitGradient", ["LSTM/hidden_t_prev_grad", "LSTM/cell_t_prev_grad", "LSTM/gates_t_grad"]),
        ("FCGradient", ["LSTM/gates_t_w_grad", "LSTM/gates_t_b_grad", "_LSTM/hidden_t_prev_grad_autosplit_0"]),
        ("Sum", ["LSTM/hidden_t_prev_grad"])]
    assert list(back.external_input[:3]) == ["LSTM/gates_t", "LSTM/hidden_state_grad", "LSTM/cell_state_grad"]
    grad_op = [o for o in ops if o.type == "RecurrentNetworkGradient"][0]
    assert list(grad_op.output) == ["LSTM/i2h_grad", "LSTM/gates_t_w_grad", "LSTM/gates_t_b_grad", "h0_grad",
                                    "c0_grad"]
    assert ops[-1].type == "FCGradient" and list(ops[-1].output) == ["LSTM/i2h_w_grad", "LSTM/i2h_b_grad",
                                                                      "X_grad"]


@pytest.mark.parametrize("op_type, memopt", [("rnn_internal_lstm_unit_gradient", False), ("LSTMUnitGradient", True)])
def test_the_reference_comparison_catches_a_wrong_cell_gradient(broken, op_type, memopt):
    """The RNN runs the saved-activation gradient, or LSTMUnitGradient when the gates are recomputed."""
    kernel = REGISTRY.get(op_type).kernel

    def off_by_one_percent(xp, *args, **kw):
        dh, dc, dg = kernel(xp, *args, **kw)
        return dh, dc, dg * 1.01
    broken(op_type, off_by_one_percent)
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        test_lstm_outputs_and_every_gradient((0,), False, 0.0, False, memopt, 2)


def test_the_gradient_reads_the_activations_the_forward_saved(broken):
    """Spoiling the saved σ(o) block (not the outputs) spoils only the gradients: they are read, not
    recomputed."""
    from stepnet.ops import REGISTRY
    kernel = REGISTRY.get("rnn_internal_lstm_unit").kernel

    def spoiled(xp, *args, **kw):
        h, c, acts = kernel(xp, *args, **kw)
        acts[2] *= 0.9
        return h, c, acts
    broken("rnn_internal_lstm_unit", spoiled)
    with pytest.raises(AssertionError, match="dX"):
        test_lstm_outputs_and_every_gradient((0,), False, 0.0, False, False, 2)


def test_saved_activations_stay_per_step_when_an_outer_blob_has_their_name():
    """Caffe2 binds a step net's output to an outer blob of the same name; the saved activations must not be
    shared across steps that way, or every step's gradient would read the last step's activations."""
    T, N, D, H = 4, 3, 2, 3
    v = data(T, N, D, H, seed=5)
    m, grads = build(D, H)
    ws = Workspace()
    ws.feed("LSTM/gates_t_rnn_activations", np.zeros(1, np.float32))
    feeds = {"X": v["X"], "LSTM/i2h_w": v["Wi"], "LSTM/i2h_b": v["bi"], "LSTM/gates_t_w": v["Wg"],
             "LSTM/gates_t_b": v["bg"], "h0": v["h0"], "c0": v["c0"], "seq": v["seq"],
             OUTS[0] + "_in_grad": v["up"][0]}
    for name, value in feeds.items():
        ws.feed(name, value)
    ws.run_net_once(m.net.proto())
    _, _, cache = lstm_forward(v["X"].astype(np.float64), v["h0"], v["c0"], v["Wi"], v["bi"], v["Wg"], v["bg"],
                               v["seq"])
    zero = np.zeros((1, N, H))
    ref = lstm_backward(v["X"].astype(np.float64), v["Wi"], v["Wg"], cache, v["up"][0], zero[0], 0 * v["up"][0],
                        zero[0])
    np.testing.assert_allclose(ws.fetch(grads["LSTM/gates_t_w"]), ref[3], rtol=1e-3, atol=1e-4)


def test_saved_activations_run_unless_the_gates_are_recomputed():
    T, N, D, H = 3, 2, 2, 3
    v = data(T, N, D, H, seed=1)
    saved, public = {"rnn_internal_lstm_unit", "rnn_internal_lstm_unit_gradient"}, {"LSTMUnit", "LSTMUnitGradient"}
    for memopt in (False, True):
        m, _ = build(D, H, memory_optimization=memopt)
        ws = run(m, v, (0,))
        step = ws.get_blob("LSTM/step_workspaces").value.steps[0]
        ran = {o.type for name in step.nets() for o in step.net(name).netdef.op}
        assert ran & (saved | public) == (public if memopt else saved)
        assert (step.find("LSTM/gates_t_rnn_activations") is None) == memopt


@pytest.mark.parametrize("copied", [False, True])
def test_the_reference_comparison_catches_a_wrong_deferred_weight_gradient(broken, monkeypatch, copied):
    """The step net's FCGradient dW/db are computed after the loop in one GEMM, from the rows of the tensors the
    step's X and dY link into (or, copied: from rows each step copies, where they are not such links); a wrong
    one is caught either way."""
    from stepnet.graph import step_nets

    if copied:
        monkeypatch.setattr(step_nets, "_row_links", lambda *a: None)
    name = "rnn_internal_fc_weight_gradient" + ("" if copied else "_linked")
    original = REGISTRY.get(name).kernel

    def off(xp, *ins, **args):
        dw, db = original(xp, *ins, **args)
        return dw * 1.01, db
    broken(name, off)
    with pytest.raises(AssertionError, match="dLSTM/gates_t_w"):
        test_lstm_outputs_and_every_gradient((0,), False, 0.0, False, False, 2)


@pytest.mark.parametrize("owg, seq", [((0,), True), ((0, 1, 2, 3), False)])
def test_lstm_gradients_with_the_weight_gradient_rows_copied(monkeypatch, owg, seq):
    """Where X and dY are not links whose tensors keep every step's rows, each step copies them (the
    rnn_internal_fc_gradient_deferred path): forced here, the same comparison with the reference holds."""
    from stepnet.graph import step_nets

    monkeypatch.setattr(step_nets, "_row_links", lambda *a: None)
    test_lstm_outputs_and_every_gradient(owg, seq, 1.5, False, False, 3)


def test_a_gradient_op_that_disagrees_with_its_forward_about_saved_activations_says_so():
    """The forward and gradient ops decide the saved-activation pairs from the same arguments; a hand-edited
    forward that recomputes the gates (so saves nothing) leaves its gradient without the blob it expects."""
    from stepnet.core.errors import MissingBlobError
    from stepnet.io.proto import make_argument

    T, N, D, H = 3, 2, 2, 3
    v = data(T, N, D, H, seed=2)
    m, _ = build(D, H)
    net = m.net.proto()
    fwd = next(o for o in net.op if o.type == "RecurrentNetwork")
    kept = [a for a in fwd.arg if a.name != "recompute_blobs_on_backward"]
    del fwd.arg[:]
    fwd.arg.extend(kept + [make_argument("recompute_blobs_on_backward", ["LSTM/gates_t"])])
    m.net.proto = lambda: net
    with pytest.raises(MissingBlobError, match=r"kept no 'LSTM/gates_t_rnn_activations' \(the activations of its "
                       r"LSTMUnit over 'LSTM/gates_t'\).*must have the same step_net, backward_step_net and "
                       r"recompute_blobs_on_backward arguments"):
        run(m, v, (0,))


def test_step_net_ops_take_the_models_device_scope():
    """Under a CUDA device scope the step net's ops run on the device too (Caffe2's DeviceScope covers them)."""
    from stepnet.io.proto import DeviceOption
    m = ModelBuilder("m")
    with m.device_scope(DeviceOption(device_type=1)):
        lstm(m, "X", "seq", ("h0", "c0"), 2, 3, scope="LSTM")
    rnn = next(o for o in m.net.proto().op if o.type == "RecurrentNetwork")
    step = next(a.n for a in rnn.arg if a.name == "step_net")
    assert step.op and all(o.device_option.device_type == 1 for o in step.op)
