"""Caffe2's own RecurrentNetwork acceptance tests (spec §9): Sum/Mul and Mul step nets with finite-difference
gradients through the whole op, step-blob extraction, one created net run with changing T (with gradients),
recompute on/off, and forward-only memory that does not grow with T."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.builder import BlobRef, NetBuilder
from stepnet.builders.model import ModelBuilder
from stepnet.io.proto import DeviceOption, arguments
from stepnet.builders.rnn import lstm, recurrent_net, retrieve_step_blobs
from stepnet.testing import DEVICES, check_gradient

F = np.float32


def simple_rnn(with_sum: bool):
    """recurrent_network_test.test_sum_mul / test_mul: o_t = x_t * (x_t + o_{t-1}) or o_t = x_t * o_{t-1}."""
    net = NetBuilder("external")
    net.add_external_inputs("input", "initial_input")
    step = NetBuilder("step")
    step.add_external_inputs("input_t", "output_t_prev")
    inner = step.Sum(["input_t", "output_t_prev"]) if with_sum else BlobRef("output_t_prev")
    out = step.Mul(["input_t", inner])
    step.add_external_outputs(out)
    recurrent_net(net, step, [(BlobRef("input_t"), BlobRef("input"))],
                  [(BlobRef("output_t_prev"), BlobRef("initial_input"))], {BlobRef("output_t_prev"): out},
                  scope="test_rnn_sum_mull")
    return net, net.proto().op[-1]


def loop_reference(x, h0, with_sum):
    o, out = h0.reshape(x.shape[1:]).astype(np.float64), []
    for t in range(x.shape[0]):
        o = x[t] * ((x[t] + o) if with_sum else o)
        out.append(o)
    return np.stack(out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_sum", [True, False])
@pytest.mark.parametrize("T, n, d", [(1, 1, 1), (2, 3, 2), (4, 2, 3)])
def test_sum_mul_and_mul_with_gradient_of_input_0(device, with_sum, T, n, d):
    rng = np.random.default_rng(T * 10 + n + d)
    x = rng.uniform(-1, 1, (T, n, d)).astype(F)
    h0 = rng.uniform(-1, 1, (1, n, d)).astype(F)
    net, op = simple_rnn(with_sum)
    assert list(op.input) == ["input", "initial_input"]
    ws = Workspace()
    ws.feed("input", x)
    ws.feed("initial_input", h0)
    ws.run_net_once(net.proto())
    ref = loop_reference(x, h0, with_sum)
    np.testing.assert_allclose(ws.fetch(op.output[0]), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ws.fetch(op.output[1]), ref[-1:], rtol=1e-4, atol=1e-4)
    # central differences through the whole op (float64), as assertGradientChecks(input 0, outputs_with_grads [0])
    args = arguments(op.arg)
    if device != "cpu":   # step ops carry their device, as Caffe2's do when built under a DeviceScope
        for key in ("step_net", "backward_step_net"):
            for step_op in args[key].op:
                step_op.device_option.CopyFrom(DeviceOption(device_type=1))
    check_gradient("RecurrentNetwork", {"input": x, "initial_input": h0}, outputs=list(op.output), wrt=[0, 1],
                   outputs_with_grads=[0], device=device, op_args=args)


def test_gradient_check_catches_a_wrong_step_gradient(patched):
    from stepnet.ops import REGISTRY
    maker = REGISTRY.get("Mul").gradient

    def wrong(g):      # both inputs' gradients from the right formula, but the first one doubled
        maker(g)
        g.ops.append(type(g.ops[0])(type="Scale", input=[g.g_input[0]], output=[g.g_input[0]]))
        g.ops[-1].arg.add(name="scale", f=2.0)
    patched("Mul", gradient=wrong)
    with pytest.raises(AssertionError, match="gradient of input 0 .input. is wrong"):
        test_sum_mul_and_mul_with_gradient_of_input_0("cpu", False, 2, 3, 2)


def test_extract_step_blobs():
    T = 3
    net, op = simple_rnn(True)
    ws = Workspace()
    x = np.random.default_rng(0).uniform(-1, 1, (T, 2, 2)).astype(F)
    ws.feed("input", x)
    ws.feed("initial_input", np.ones((1, 2, 2), F))
    ws.run_net_once(net.proto())
    names = retrieve_step_blobs(ws, net, "extractTest")
    for i in range(T):
        assert f"extractTest_input_t{i}" in names
        np.testing.assert_array_equal(ws.fetch(f"extractTest_input_t{i}"), x[i:i + 1])
    assert "extractTest_timestep2" in names and int(ws.fetch("extractTest_timestep2")[0]) == 2


def lstm_model(dims=3, memopt=False, forward_only=False, layers=1):
    m = ModelBuilder("m")
    inits = [n for i in range(layers) for n in (f"h{i}", f"c{i}")]
    outs = lstm(m, "X", "seq", inits, 2, [dims] * layers if layers > 1 else dims, outputs_with_grads=(0, 3),
                memory_optimization=memopt, forward_only=forward_only)
    grads = {} if forward_only else m.net.add_gradient_ops({outs[0]: "up0", outs[3]: "up3"})
    return m, outs, grads


def lstm_feeds(T, N, H, seed, layers=1):
    rng = np.random.default_rng(seed)
    v = {"X": rng.uniform(-1, 1, (T, N, 2)).astype(F), "seq": rng.integers(1, T + 1, N).astype(np.int32),
         "up0": rng.standard_normal((T, N, H)).astype(F), "up3": rng.standard_normal((1, N, H)).astype(F)}
    for i in range(layers):
        v[f"h{i}"] = rng.uniform(-1, 1, (1, N, H)).astype(F)
        v[f"c{i}"] = rng.uniform(-1, 1, (1, N, H)).astype(F)
    return v


def run_fresh(m, feeds, params):
    ws = Workspace()
    for k, v in {**params, **feeds}.items():
        ws.feed(k, v)
    ws.run_net_once(m.net.proto())
    return ws


@pytest.mark.parametrize("layers", [1, 2])
def test_one_created_net_with_changing_T_matches_fresh_runs(layers):
    T0, N, H = 8, 3, 3
    m, outs, grads = lstm_model(H, layers=layers)
    init = Workspace(seed=5)
    init.run_net_once(m.init_net.proto())
    params = {p: init.fetch(p) for p in m.params}
    ws = Workspace()
    for k, v in {**params, **lstm_feeds(T0, N, H, 0, layers)}.items():
        ws.feed(k, v)
    created = ws.create_net(m.net.proto())
    watched = list(outs) + sorted({g for g in grads.values() if isinstance(g, str)})
    for i, T in enumerate([T0, T0 // 2, T0 // 2 + T0 // 4, T0, T0 // 2 + 1]):
        feeds = lstm_feeds(T, N, H, i + 1, layers)
        for k, v in feeds.items():
            ws.feed(k, v)
        created.run()
        fresh = run_fresh(m, feeds, params)
        for name in watched:
            np.testing.assert_array_equal(ws.fetch(name), fresh.fetch(name), err_msg=f"T={T}: {name}")
        assert ws.fetch(outs[0]).shape == (T, N, H)


@pytest.mark.parametrize("forward_only", [False, True])
def test_the_blob_fetcher_copies_what_caffe2s_step_net_makes(forward_only):
    """RecurrentNetworkBlobFetcher copies each step workspace's blobs of the step net (here, with the gradient op
    run, the states, the timestep and the previous states), and not the LSTM activations stepnet keeps in them
    for the gradient (no blob of Caffe2's step net); each copy holds that step's value."""
    T, N, H = 3, 2, 3
    m, outs, _ = lstm_model(H, forward_only=forward_only)
    ws = Workspace()
    ws.run_net_once(m.init_net.proto())
    for k, v in lstm_feeds(T, N, H, 4).items():
        ws.feed(k, v)
    ws.run_net_once(m.net.proto())
    steps = ws.get_blob("LSTM/step_workspaces").value.steps
    assert any("LSTM/gates_t_rnn_activations" in s.local_blobs() for s in steps) == (not forward_only)
    names = list(retrieve_step_blobs(ws, m.net, "f"))
    assert not any("_rnn_activations" in n for n in names)
    k = len(steps)          # (forward only: Caffe2's num_workspaces = 2 workspaces in turn)
    for t in range(k):
        assert {f"f_LSTM/hidden_t_prev{t}", f"f_LSTM/cell_state{t}", f"f_timestep{t}"} <= set(names)
        # the hidden state of the step that ran last in workspace t
        last = max(s for s in range(T) if s % k == t) if forward_only else t
        np.testing.assert_array_equal(ws.fetch(f"f_LSTM/hidden_t_prev{t}"), ws.fetch(outs[0])[last - 1:last]
                                      if last else ws.fetch("h0"))


def test_recompute_on_and_off_give_the_same_results():
    T, N, H = 5, 3, 4
    feeds = lstm_feeds(T, N, H, 9)
    results = []
    for memopt in (False, True):
        m, outs, grads = lstm_model(H, memopt=memopt)
        init = Workspace(seed=2)
        init.run_net_once(m.init_net.proto())
        ws = run_fresh(m, feeds, {p: init.fetch(p) for p in m.params})
        steps = ws.get_blob("LSTM/step_workspaces").value.steps
        kept = ["LSTM/gates_t" in s.local_blobs() for s in steps]
        acts = ["LSTM/gates_t_rnn_activations" in s.local_blobs() for s in steps]
        # the gates live once, in the shared workspace, either way: recomputed on backward (memopt), or read by
        # no op after their step, the gradient reading the activations each step keeps (shared_scratch)
        assert kept == [False] * T and acts == [not memopt] * T
        assert "LSTM/gates_t" in ws.get_blob("LSTM/step_workspaces").value.shared.local_blobs()
        results.append((ws, outs, grads))
    (a, outs, grads), (b, _, _) = results
    for name in list(outs) + [g for g in grads.values() if isinstance(g, str)]:
        np.testing.assert_allclose(b.fetch(name), a.fetch(name), rtol=1e-6, atol=1e-7, err_msg=name)


def test_forward_only_memory_does_not_grow_with_T():
    N, H = 2, 3
    m, outs, _ = lstm_model(H, forward_only=True)
    init = Workspace(seed=1)
    init.run_net_once(m.init_net.proto())
    params = {p: init.fetch(p) for p in m.params}
    counts = []
    for T in (3, 20, 60):
        ws = run_fresh(m, lstm_feeds(T, N, H, T), params)
        scratch = ws.get_blob("LSTM/step_workspaces").value
        assert len(scratch.steps) == 2
        counts.append(sum(len(s.local_blobs()) for s in scratch.steps) + len(scratch.shared.local_blobs()))
        assert ws.fetch(outs[0]).shape == (T, N, H)
    assert counts[0] == counts[1] == counts[2]
