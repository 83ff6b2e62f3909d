"""A training LSTM's saved activations in one T×4×N×D tensor the op keeps (stepnet.graph.step_nets.saved_steps),
which also holds the input gradient (RecurrentNetworkGradient: step t's gate gradients take the place of step t's
activations, read first): no per-step arrays, no second T×N×4D tensor, and every blob bit for bit what separate
arrays give, compiled (numpy and fused cells) and op by op."""
import numpy as np
import pytest

from stepnet.builders.rnn import lstm

from .test_compiled import CELLS, loss_of, run_model

F = np.float32
T, N, D, H = 5, 3, 4, 6


def build(m):
    out = lstm(m, "X", "seq", ["h0", "c0"], D, H)
    m.add_gradient_ops([loss_of(m, out[0])])


def feeds(seed):
    rng = np.random.default_rng(seed)
    return {"X": rng.uniform(-1, 1, (T, N, D)).astype(F), "seq": np.array([T, 2, T - 1], np.int32),
            "h0": rng.uniform(-1, 1, (1, N, H)).astype(F), "c0": rng.uniform(-1, 1, (1, N, H)).astype(F)}


def arrays(ws) -> dict:
    return {b: ws.fetch(b).copy() for b in ws.blobs() if isinstance(ws.find(b).value, np.ndarray)}


def saved_tensor(ws):
    """The op's tensor of saved activations (in the step workspaces' shared workspace)."""
    from stepnet.ops.recurrent import StepWorkspaces
    for b in ws.blobs():
        v = ws.find(b).value
        if isinstance(v, StepWorkspaces):
            names = [n for n in v.shared.local_blobs() if n.endswith("_rnn_activations_steps")]
            assert len(names) == 1
            return v.shared.local_blob(names[0]).value
    raise AssertionError("no step workspaces")


@pytest.mark.parametrize("fused", CELLS)
@pytest.mark.parametrize("compiled", [True, False])
def test_the_input_gradient_lives_in_the_saved_activations(compiled, fused, monkeypatch):
    import stepnet.ops.recurrent_grad as recurrent_grad

    data = feeds(3)
    ws, _ = run_model(build, data, runs=3, compile_steps=compiled, fused_cells=fused)
    acts = saved_tensor(ws)
    assert acts.shape == (T, 4, N, H)
    grad = ws.find("LSTM/i2h_grad").value
    assert grad.shape == (T, N, 4 * H) and grad.base is acts          # the same memory, no copy
    got = arrays(ws)
    monkeypatch.setattr(recurrent_grad, "_input_gradient_home", lambda *a: None)
    ws_apart, _ = run_model(build, data, runs=3, compile_steps=compiled, fused_cells=fused)
    assert not np.shares_memory(ws_apart.find("LSTM/i2h_grad").value, saved_tensor(ws_apart))
    want = arrays(ws_apart)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_without_reading_first_the_gradients_go_wrong(monkeypatch):
    """Proof for the test above: where the compiled cell gradient does not copy the activations it shares rows
    with before writing its gate gradients over them, the gradients differ from the op-by-op run."""
    data = feeds(4)
    ws_ref, _ = run_model(build, data, runs=3, compile_steps=False, fused_cells=False)
    monkeypatch.setattr(np, "may_share_memory", lambda *a, **k: False)
    ws_bad, _ = run_model(build, data, runs=3, compile_steps=True, fused_cells=False)
    want, got = arrays(ws_ref), arrays(ws_bad)
    assert any(not np.array_equal(got[n], want[n]) for n in ("LSTM/i2h_w_grad", "LSTM/gates_t_w_grad"))
