"""RecurrentNetwork's replay of a compiled run (stepnet/compiled/replay.py, kept by stepnet/runtime/steps.py): a run
whose timesteps all ran compiled is kept, and a later run whose inputs have its signature only copies the initial
states in, runs the compiled timesteps and points the aliases at the states. Against the op-by-op path
(compile_steps=False), in a net that stays interpreted itself (a Print in it), so the op is called by the executor:
the same bits over runs that change values, sequence lengths and shapes; a step net reading an outer blob that is not
an op input keeps its own signature check (a changed dtype there fails as op by op); a state blob given another array
runs the op in full."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.builder import BlobRef
from stepnet.core.errors import StepnetError
from stepnet.builders.model import ModelBuilder
from stepnet.builders.rnn import lstm

F = np.float32
T, N, D, H = 3, 2, 4, 5


def model(drop_seq_input: bool = False):
    m = ModelBuilder("m")
    out = lstm(m, BlobRef("X"), BlobRef("seq"), [BlobRef("h0"), BlobRef("c0")], D, H, scope="L",
               forward_only=True)
    m.net.Print(m.net.Tanh(out[0], BlobRef("t")), [])          # no compiled form: the net runs op by op
    proto = m.net.proto()
    if drop_seq_input:                  # the step net still reads "seq", from the outer workspace, by name
        rnn = next(op for op in proto.op if op.type == "RecurrentNetwork")
        kept = [name for name in rnn.input if name != "seq"]
        del rnn.input[:]
        rnn.input.extend(kept)
    return m, proto


def feeds(rng, t=T, n=N, seq=None):
    return {"X": rng.uniform(-1, 1, (t, n, D)).astype(F), "h0": rng.uniform(-1, 1, (1, n, H)).astype(F),
            "c0": rng.uniform(-1, 1, (1, n, H)).astype(F),
            "seq": np.array(seq if seq is not None else [t] * n, np.int32)}


def runs(changes, compiled: bool, drop_seq_input=False):
    """Per run: the feeds changes[r] fed, the net run; every blob after each run, and the forward op's state."""
    m, proto = model(drop_seq_input)
    ws = Workspace(seed=2, compile_steps=compiled, reporter=lambda name, value: True)
    ws.run_net_once(m.init_net.proto())
    seen = []
    net = None
    for values in changes:
        for name, value in values.items():
            if name.startswith("@"):
                ws.get_blob(name[1:]).value = value.copy()      # a blob given another array
            else:
                ws.feed(name, value)
        net = net or ws.create_net(proto)
        net.run()
        seen.append({b: ws.fetch(b) for b in ws.blobs() if isinstance(ws.find(b).value, np.ndarray)})
    rnn = next(b for b in net.ops if b.opdef.type == "RecurrentNetwork")
    return seen, rnn.call.args[0].state["forward"]


def assert_same(changes, drop_seq_input=False):
    got, fwd = runs(changes, True, drop_seq_input)
    want, _ = runs(changes, False, drop_seq_input)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for name, value in w.items():
            np.testing.assert_array_equal(g[name], value, err_msg=name)
    return fwd


def test_runs_of_one_signature_replay_with_the_op_by_op_bits():
    rng = np.random.default_rng(0)
    fwd = assert_same([feeds(rng), feeds(rng), feeds(rng, seq=[1, 3]), feeds(rng, seq=[0, 2])])
    assert fwd.loop.replay is not None and fwd.loop.replay.covered


def test_new_shapes_run_in_full_then_replay_again():
    rng = np.random.default_rng(1)
    fwd = assert_same([feeds(rng), feeds(rng), feeds(rng, t=5, n=3), feeds(rng, t=5, n=3), feeds(rng)])
    assert fwd.loop.replay is not None and fwd.loop.replay.T == T


def test_a_step_input_that_is_not_an_op_input_keeps_its_own_check():
    rng = np.random.default_rng(2)
    fwd = assert_same([feeds(rng), feeds(rng, seq=[2, 3]), feeds(rng, seq=[1, 1])], drop_seq_input=True)
    assert fwd.loop.replay is not None and not fwd.loop.replay.covered
    bad = feeds(rng)
    bad["seq"] = bad["seq"].astype(np.float32)             # same shape, another dtype: LSTMUnit refuses it
    errors = []
    for compiled in (True, False):
        with pytest.raises(StepnetError) as e:
            runs([feeds(rng), feeds(rng), bad], compiled, drop_seq_input=True)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "seq" in errors[0]


def test_a_state_blob_given_another_array_runs_the_op_in_full():
    rng = np.random.default_rng(3)
    other = np.full((T + 1, N, H), 7, F)
    fwd = assert_same([feeds(rng), feeds(rng), {**feeds(rng), "@L/L/hidden_t_prev_states": other}, feeds(rng)])
    assert fwd.loop.replay is not None


def test_a_step_net_that_writes_its_timestep_gets_fresh_timesteps_each_run():
    """The step net doubles its timestep in place (Add, after the links read it): a replay that kept one array
    of timesteps across runs would hand the next run the doubled values; it keeps them only for step nets
    that never write the timestep blob."""
    from .test_compiled import arrays, run_model
    from .test_compiled_fusion import cell_case, cell_step

    def doubled_gates(step):
        step.Add(["timestep", "timestep"], "timestep")
        return step.Sum([step.FC(["h_prev", "U", "ub"], "uh", axis=2), "input_t"], "gates")

    build, feeds = cell_case(cell_step("doubling", doubled_gates), 3, train=False)
    (ws_c, net), (ws_i, _) = (run_model(build, feeds, 4, compile_steps=c, fused_cells=False) for c in (True, False))
    got, want = arrays(ws_c), arrays(ws_i)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    rnn = next(b for b in net.ops if b.opdef.type == "RecurrentNetwork")
    replay = rnn.call.args[0].state["forward"].loop.replay
    assert replay is not None and replay.timesteps is None


def test_a_replayed_training_step_keeps_no_earlier_runs_arrays_alive():
    """A replayed run does not check its step net's input signature; what an earlier check saw (the input
    projection of the first run, a view of it) must not be kept alive by it (compiled.inputs.Inputs holds
    weak references): after later runs, the first run's array is freed."""
    import gc
    import weakref

    m = ModelBuilder("m")
    lstm(m, BlobRef("X"), BlobRef("seq"), [BlobRef("h0"), BlobRef("c0")], D, H, scope="L")
    ws = Workspace(seed=0)
    ws.run_net_once(m.init_net.proto())
    rng = np.random.default_rng(0)
    for name, shape in (("X", (T, N, D)), ("h0", (1, N, H)), ("c0", (1, N, H))):
        ws.feed(name, rng.standard_normal(shape).astype(F))
    ws.feed("seq", np.full(N, T, np.int32))
    net = ws.create_net(m.net.proto())
    refs = []
    for _ in range(4):
        net.run()
        value = ws.find("L/i2h").value
        refs.append(weakref.ref(value if value.base is None else value.base))
    gc.collect()
    assert [r() is not None for r in refs] == [False, False, False, True]
    assert ws.find("L/step_workspaces").value.steps   # (the op ran with a backward step net: kept per step)
