"""--profile (stepnet/runtime/profile.py): op timings that add up to the measured run, counts per op and per timestep,
the RecurrentNetwork's split into its step nets and overhead, prof_dag nets."""
import re
import time

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.io import proto
from stepnet.cli.run import main
from stepnet.builders.builder import BlobRef
from stepnet.builders.model import ModelBuilder
from stepnet.runtime.profile import Profiler
from stepnet.builders.rnn import lstm

T, N, D, H = 6, 16, 32, 128


def lstm_plan(iterations: int):
    """A trainable LSTM over fed-by-fill data: forward RecurrentNetwork, its gradient, SGD."""
    m = ModelBuilder("prof")
    init, net = m.init_net, m.net
    init.GaussianFill([], BlobRef("x"), shape=[T, N, D])
    init.ConstantFill([], BlobRef("seq"), shape=[N], value=T, dtype=2)
    for name in ("h0", "c0"):
        init.ConstantFill([], BlobRef(name), shape=[1, N, H], value=0.0)
    h_all, _, _, _ = lstm(m, BlobRef("x"), BlobRef("seq"), ("h0", "c0"), D, H, scope="LSTM")
    loss = net.AveragedLoss(h_all, BlobRef("loss"))
    m.add_gradient_ops([loss])
    m.sgd(0.01)
    return m.to_plan(iterations)


def profiled_run(plan):
    """(profiler, seconds of the run), both in this process's CPU time: what the run itself did, whatever else
    the machine is doing (wall time on a loaded machine counts other processes' turns too)."""
    profiler = Profiler(clock=time.process_time)
    ws = Workspace(seed=0, profiler=profiler)
    start = time.process_time()
    ws.run_plan(plan)
    return profiler, time.process_time() - start


def test_counts_are_ops_times_iterations_times_timesteps():
    plan = lstm_plan(4)
    profiler, _ = profiled_run(plan)
    nets = {n.name: n for n in plan.network}
    stats = profiler.stats
    for i, op in enumerate(nets["prof"].op):                    # the training net: once per iteration
        assert stats[("prof", i)].calls == 4 and stats[("prof", i)].type == op.type
    inner = {s.net for s in stats.values()} - set(nets)
    assert inner == {"LSTM", "RecurrentBackwardStep", "RecurrentBackwardStep_weight_gradients"}
    for name, runs in (("LSTM", 4 * T), ("RecurrentBackwardStep", 4 * T),   # step nets: once per timestep
                       ("RecurrentBackwardStep_weight_gradients", 4)):      # after the backward loop
        ops = [s for s in stats.values() if s.net == name]
        assert ops and all(s.calls == runs for s in ops), (name, [(s.type, s.calls) for s in ops])
    by_type = profiler.by_type()
    assert by_type["RecurrentNetwork"][0] == by_type["RecurrentNetworkGradient"][0] == 4
    assert by_type["rnn_internal_lstm_unit"][0] == by_type["rnn_internal_lstm_unit_gradient"][0] == 4 * T


def test_the_recurrent_op_splits_into_its_step_nets_and_overhead():
    profiler, _ = profiled_run(lstm_plan(3))
    (rnn,) = [s for s in profiler.stats.values() if s.type == "RecurrentNetwork"]
    (step,) = rnn.inner
    inside = sum(s.total for s in profiler.stats.values() if s.net == step)
    assert inside == pytest.approx(rnn.inner[step], rel=1e-9)   # its step-net time is the time of those ops
    assert 0 <= rnn.self_time < rnn.total
    text = profiler.report(1.0)
    assert re.search(rf"RecurrentNetwork \(net 'prof', op #\d+\): [\d.]+ s = net '{re.escape(step)}' [\d.]+ s "
                     r"\+ overhead [\d.]+ s", text)


def test_the_profile_adds_up_to_the_measured_run():
    """Self times add up to the time spent in ops, which is nearly all of a run whose ops do real work."""
    profiled_run(lstm_plan(2))                     # imports and JIT caches first: not part of any run
    profiler, wall = profiled_run(lstm_plan(100))  # long enough that binding the nets stays under 10 %
    assert abs(profiler.total() - wall) < 0.1 * wall, (profiler.total(), wall)
    assert sum(t for _, t in profiler.by_type().values()) == pytest.approx(profiler.total())


def test_no_profiler_no_timing():
    ws = Workspace()
    net = ws.create_net(proto.parse_text('name: "n" op { type: "ConstantFill" output: "y" '
                                         'arg { name: "shape" ints: 2 } }', "net"))
    assert net.ops[0].call.__name__ != "run"     # the kernel's own partial, not the profiler's wrapper
    assert Workspace(profiler=Profiler()).create_net(net.netdef).ops[0].call.__name__ == "run"


def test_cli_profile_table_and_prof_dag(tmp_path, capsys):
    plan = lstm_plan(150)
    path = tmp_path / "plan.pbtxt"
    proto.save(plan, path)
    assert main(["run", str(path), "--profile", "--quiet"]) == 0
    out = capsys.readouterr().out
    ops_s, wall = map(float, re.search(r"profile: ([\d.]+) s in ops of ([\d.]+) s measured", out).groups())
    assert 0 < ops_s <= wall        # (how close they are: test_the_profile_adds_up_to_the_measured_run)
    assert re.search(r"^RecurrentNetwork\s+150\s", out, re.M)
    assert "slowest ops" in out
    for net in plan.network:             # Caffe2's profiling net type runs as a normal net, profiled
        net.type = "prof_dag"
    proto.save(plan, path)
    assert main(["run", str(path), "--quiet"]) == 0
    assert "profile: " in capsys.readouterr().out


def test_prof_dag_net_runs_as_a_plain_net():
    ws = Workspace()
    nd = proto.parse_text('name: "n" type: "prof_dag" op { type: "ConstantFill" output: "y" '
                          'arg { name: "shape" ints: 2 } arg { name: "value" f: 3 } }', "net")
    ws.run_net_once(nd)
    np.testing.assert_array_equal(ws.fetch("y"), [3, 3])


def test_names_from_the_file_cannot_drive_the_terminal(tmp_path, capsys):
    """The profile table and the result lines quote net, op and blob names from the model: control characters
    (an escape sequence, a newline forging a line) are shown escaped."""
    from stepnet.testing import make_op

    evil = "x\x1b[2J\nstepnet: error: forged"
    body = proto.NetDef(name=evil, op=[make_op("Relu", ["a"], ["a"])])
    net = proto.NetDef(name=evil, op=[make_op("ConstantFill", [], [evil], shape=[1], value=2.0),
                                      make_op("Print", [evil], []),
                                      make_op("ConstantFill", [], ["c"], shape=[1], value=0, dtype=5),
                                      make_op("ConstantFill", [], ["a"], shape=[1]),
                                      make_op("If", ["c", "a"], ["a"], then_net=body, else_net=body)])
    plan = proto.PlanDef(name="p", network=[net])
    plan.execution_step.add(name="s", network=[evil], num_iter=2)
    proto.save(plan, tmp_path / "p.pbtxt")
    assert main(["run", str(tmp_path / "p.pbtxt"), "--profile", "-q"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\nstepnet: error: forged" not in out
    assert "x\\x1b[2J\\nstepnet: error: forged = 2" in out    # the Print op's labeled result, escaped


# ---------------------------------------------------------------------------------------------- observers
class _Recorder:
    """A runtime.profile.Observer that writes down every event it is told, in order."""

    def __init__(self):
        self.events = []

    def net_started(self, net):
        self.events.append(("start", net.name))

    def net_stopped(self, net):
        self.events.append(("stop", net.name))

    def op_started(self, net, index, op_type):
        self.events.append(("op", net.name, index, op_type))

    def op_stopped(self, net, index, op_type):
        self.events.append(("done", net.name, index, op_type))


def test_observers_see_every_run_and_op_in_order():
    from stepnet.runtime.profile import Observer, active_observers

    netdef = proto.NetDef(name="obs")
    netdef.op.add(type="Scale", input=["x"], output=["y"]).arg.add(name="scale", f=2.0)
    netdef.op.add(type="Relu", input=["y"], output=["z"])
    ws = Workspace()
    ws.feed("x", np.array([-1.0, 3.0], dtype=np.float32))
    net = ws.create_net(netdef)
    recorder = _Recorder()
    assert isinstance(Observer(), Observer) and not issubclass(_Recorder, Observer)   # any object with the hooks
    net.observers.append(recorder)
    for _ in range(4):                          # past the runs after which an unobserved net runs compiled
        net.run()
    one_run = [("start", "obs"), ("op", "obs", 0, "Scale"), ("done", "obs", 0, "Scale"),
               ("op", "obs", 1, "Relu"), ("done", "obs", 1, "Relu"), ("stop", "obs")]
    assert recorder.events == one_run * 4
    assert ws.fetch("z").tolist() == [0.0, 6.0] and active_observers() == ()
    net.observers.clear()
    net.run()
    assert recorder.events == one_run * 4
