"""Dynamic RecurrentNetwork vs the statically unrolled net (Caffe2's UnrolledCell layout): the same outputs and
the same gradient for every input, parameter and initial state."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.builder import BlobRef, NetBuilder
from stepnet.builders.model import ModelBuilder
from stepnet.builders.rnn import gru, lstm, recurrent_net
from stepnet.builders.unroll import unroll_step_net


F = np.float32


def run_both(build, feeds, seed=0):
    """build(model, unroll) -> (outputs, {output index: gradient blob}); returns both workspaces and names."""
    results = []
    for unroll in (False, True):
        m = ModelBuilder("m")
        outs, owg = build(m, unroll)
        grads = m.net.add_gradient_ops({outs[k]: f"up{k}" for k in owg})
        ws = Workspace(seed=seed)
        ws.run_net_once(m.init_net.proto())
        for name, value in feeds(outs).items():
            ws.feed(name, value)
        ws.run_net_once(m.net.proto())
        results.append((ws, outs, grads, m))
    return results


def compare(results, wrt, rtol=1e-6, atol=1e-7):
    (ws_d, outs_d, g_d, _), (ws_u, outs_u, g_u, _) = results
    for a, b in zip(outs_d, outs_u, strict=True):
        np.testing.assert_allclose(ws_u.fetch(b), ws_d.fetch(a), rtol=rtol, atol=atol, err_msg=f"{a} vs {b}")
    for name in wrt:
        np.testing.assert_allclose(ws_u.fetch(g_u[name]), ws_d.fetch(g_d[name]), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of {name}")


def lstm_case(T, N, D, dims, owg, seq=True, drop_states=False):
    rng = np.random.default_rng(T + 10 * len(dims) + len(owg))
    dims = list(dims)
    inits = [n for i in range(len(dims)) for n in (f"h{i}", f"c{i}")]
    values = {"X": rng.uniform(-1, 1, (T, N, D)).astype(F), "seq": rng.integers(1, T + 1, N).astype(np.int32)}
    for i, H in enumerate(dims):
        values[f"h{i}"] = rng.uniform(-1, 1, (1, N, H)).astype(F)
        values[f"c{i}"] = rng.uniform(-1, 1, (1, N, H)).astype(F)
    ups = [rng.standard_normal((T if k % 2 == 0 else 1, N, dims[-1])).astype(F) for k in range(4)]

    def build(m, unroll):
        outs = lstm(m, "X", "seq" if seq else None, inits, D, dims if len(dims) > 1 else dims[0],
                    outputs_with_grads=owg, drop_states=drop_states, static_rnn_unroll_size=T if unroll else None)
        return outs, owg

    def feeds(outs):
        return {**values, **{f"up{k}": ups[k] for k in owg}}
    return build, feeds, list(values)[:1] + inits


@pytest.mark.parametrize("T, N, D, dims, owg, seq, drop_states", [
    (3, 2, 3, [4], (0,), True, False),
    (4, 3, 2, [3], (0, 2), True, True),
    (1, 2, 2, [2], (2,), False, False),
    (3, 2, 2, [3, 2], (0,), True, False),
    (2, 1, 3, [2, 3, 2], (0, 2), True, False),
])
def test_dynamic_and_unrolled_lstm_agree(T, N, D, dims, owg, seq, drop_states):
    build, feeds, inputs = lstm_case(T, N, D, dims, owg, seq, drop_states)
    results = run_both(build, feeds)
    params = [p for p in results[0][3].params]
    assert params == results[1][3].params      # the unrolled steps share the dynamic net's parameters
    compare(results, inputs + params)


def test_unrolled_last_output_gradient():
    build, feeds, inputs = lstm_case(3, 2, 2, [3], (0, 1))
    compare(run_both(build, feeds), inputs)


def test_dynamic_and_unrolled_gru_agree():
    T, N, D, H = 3, 2, 2, 3
    rng = np.random.default_rng(4)
    values = {"X": rng.uniform(-1, 1, (T, N, D)).astype(F), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F),
              "seq": np.array([3, 2], np.int32), "up0": rng.standard_normal((T, N, H)).astype(F)}

    def build(m, unroll):
        return gru(m, "X", "seq", ["h0"], D, H, static_rnn_unroll_size=T if unroll else None), (0,)
    results = run_both(build, lambda outs: values)
    compare(results, ["X", "h0"] + results[0][3].params)


def sum_mul_cell():
    step = NetBuilder("step")
    step.add_external_inputs("input_t", "output_t_prev")
    inner = step.Sum(["input_t", "output_t_prev"])
    out = step.Mul(["input_t", inner])
    step.add_external_outputs(out)
    return step, out


@pytest.mark.parametrize("T, owg", [(1, (0,)), (3, (0,)), (4, (0,))])
def test_dynamic_and_unrolled_sum_mul_agree(T, owg):
    rng = np.random.default_rng(T)
    N, D = 2, 3
    values = {"input": rng.uniform(-1, 1, (T, N, D)).astype(F),
              "initial_input": rng.uniform(-1, 1, (1, N, D)).astype(F), "up0": rng.standard_normal((T, N, D)).astype(F)}

    def build(m, unroll):
        step, out = sum_mul_cell()
        args = ([(BlobRef("input_t"), BlobRef("input"))], [(BlobRef("output_t_prev"), BlobRef("initial_input"))],
                {BlobRef("output_t_prev"): out})
        if unroll:
            return unroll_step_net(m, step, *args, T, outputs_with_grads=owg), owg
        return recurrent_net(m.net, step, *args, scope="test_rnn_sum_mull", outputs_with_grads=owg), owg
    results = run_both(build, lambda outs: values)
    compare(results, ["input", "initial_input"])
    assert results[1][1] == ["step/Mul_concat", "step/Mul_last"]


def test_unrolled_layout_matches_caffe2_unrolled_cell():
    m = ModelBuilder("m")
    outs = lstm(m, "X", "seq", ["h0", "c0"], 2, 3, static_rnn_unroll_size=2, outputs_with_grads=(0,))
    # Caffe2's UnrolledCell returns the last step's blob itself as `_last`; stepnet copies it so that a
    # gradient given for it is summed with the Concat's instead of replacing it.
    assert outs == ["LSTM/hidden_state_concat", "LSTM/hidden_state_last", "LSTM/cell_state_concat",
                    "LSTM/cell_state_last"]
    ops = m.net.proto().op
    assert [o.type for o in ops] == ["FC", "Split"] + ["FC", "Sum", "LSTMUnit"] * 2 + ["Concat", "Copy"] * 2 + \
        ["ZeroGradient"] * 3
    assert list(ops[1].output) == ["LSTM/i2h_timestep_0", "LSTM/i2h_timestep_1"]
    assert list(ops[2].input) == ["h0", "LSTM/gates_t_w", "LSTM/gates_t_b"]
    assert list(ops[5].input) == ["timestep_0/LSTM/hidden_state", "LSTM/gates_t_w", "LSTM/gates_t_b"]
    assert list(ops[4].input) == ["h0", "c0", "timestep_0/LSTM/gates_t", "seq", "timestep_0/timestep"]
    assert list(ops[6].output) == ["timestep_1/LSTM/gates_t"] and list(ops[6].input)[1] == "LSTM/i2h_timestep_1"
    assert [list(o.input) for o in ops[-3:]] == [["LSTM/hidden_state_last"], ["LSTM/cell_state_concat"],
                                                 ["LSTM/cell_state_last"]]
    assert list(ops[-6].input) == ["timestep_1/LSTM/hidden_state"]
    fills = [o for o in m.init_net.proto().op if o.output[0].startswith("timestep_")]
    assert [(o.output[0], o.device_option.device_type) for o in fills] == [("timestep_0/timestep", 0),
                                                                          ("timestep_1/timestep", 0)]


def test_the_comparison_catches_a_step_that_differs(broken):
    from stepnet.ops import REGISTRY
    schema = REGISTRY.get("LSTMUnitGradient")
    calls = []

    def wrong_in_one_context(xp, *args, **kw):
        out = schema.kernel(xp, *args, **kw)
        calls.append(1)
        return (out[0], out[1] * 1.001, out[2]) if len(calls) % 2 else out
    broken("LSTMUnitGradient", wrong_in_one_context)
    with pytest.raises(AssertionError, match="gradient of"):
        test_dynamic_and_unrolled_lstm_agree(3, 2, 3, [4], (0,), True, False)
