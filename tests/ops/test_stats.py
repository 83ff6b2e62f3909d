"""Stat registries and timers (stepnet/ops/stats.py): random updates against sums kept here, export with and
without reset, the default registry shared by a workspace tree (and not by other workspaces), timers publishing
their sum and count, CPU utilization, bad inputs, and a broken kernel caught."""
import time

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, OpError, ShapeError
from stepnet.ops import stats
from stepnet.testing import make_op

rng = np.random.default_rng(5)


def run(ws, op_type, inputs, outputs, **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, **args))


def strings(*names):
    out = np.empty(len(names), object)
    out[:] = names
    return out


def exported(ws, registry=(), **args):
    run(ws, "StatRegistryExport", list(registry), ["k", "v", "t"], **args)
    k, v, t = ws.fetch("k"), ws.fetch("v"), ws.fetch("t")
    assert k.dtype == object and v.dtype == np.int64 and t.dtype == np.int64 and len(k) == len(v) == len(t)
    return dict(zip(k.tolist(), v.tolist())), t


def check_updates():
    """Random updates into a private registry, summed here per key; a reset export leaves zeros."""
    ws = Workspace()
    run(ws, "StatRegistryCreate", [], ["reg"])
    sums = {}
    for _ in range(6):
        names = [f"key{int(i)}" for i in rng.integers(0, 4, size=3)]
        values = rng.integers(-50, 50, size=3)
        ws.feed("names", strings(*names))
        ws.feed("values", values.astype(np.int64))
        run(ws, "StatRegistryUpdate", ["names", "values", "reg"], [])
        for n, v in zip(names, values.tolist()):
            sums[n.encode()] = sums.get(n.encode(), 0) + v
    got, _ = exported(ws, ["reg"], reset=False)
    assert got == sums
    before = time.time_ns()
    got, stamps = exported(ws, ["reg"])
    assert got == sums and all(before <= s <= time.time_ns() for s in stamps.tolist())
    got, _ = exported(ws, ["reg"])
    assert got == dict.fromkeys(sums, 0)


def test_updates_and_exports_against_sums():
    check_updates()


def test_the_check_catches_an_update_that_overwrites(broken):
    def overwrite(ctx, xp, keys, values, registry):
        for k, v in zip(keys.tolist(), values.tolist()):
            registry.stats[k.encode()] = v
    broken("StatRegistryUpdate", overwrite)
    with pytest.raises(AssertionError):
        check_updates()


def test_the_default_registry_is_the_workspace_trees():
    """Caffe2 keeps one registry per process; stepnet one per workspace tree (no global state): a child
    workspace's ops update the root's, another workspace starts empty."""
    key = "test_stats/default/key"
    ws = Workspace()
    ws.feed("names", strings(key))
    ws.feed("values", np.array([7], np.int64))
    run(Workspace(ws), "StatRegistryUpdate", ["names", "values"], [])
    got, _ = exported(ws, reset=False)
    assert got[key.encode()] == 7
    got, _ = exported(ws)
    assert got[key.encode()] == 7 and stats.default_registry(ws).stats[key.encode()] == 0
    other, _ = exported(Workspace())
    assert other == {}


def test_timers_publish_sum_and_count():
    ws = Workspace()
    for _ in range(2):
        run(ws, "TimerBegin", [], ["timer"], counter_name="test_stats/timer")
        run(ws, "TimerGet", ["timer"], ["so_far"])
        run(ws, "TimerGetAndEnd", ["timer"], ["total"])
    assert ws.fetch("so_far").shape == () and ws.fetch("total").shape == (1,)
    assert 0 <= ws.fetch("so_far").item() <= ws.fetch("total").item()
    assert stats.default_registry(ws).stats[b"test_stats/timer/time_ns/count"] == 2
    with pytest.raises(OpError, match="timer 'test_stats/timer' is not running"):
        run(ws, "TimerEnd", ["timer"], [])
    net = NetDef(name="timers")
    net.op.extend([make_op("TimerBegin", [], ["named_by_output"])])
    bound = ws.bind(net)
    bound.run()                      # one timer per op: a second begin without an end is an error
    with pytest.raises(OpError, match="timer 'named_by_output' is already running"):
        bound.run()


def test_cpu_utilization_report():
    ws = Workspace()
    ws.feed("u", np.array([12.345], np.float32))
    run(ws, "CpuUtilizationReport", ["u"], [], stats_name="test_stats_cpu")
    assert stats.default_registry(ws).stats[b"test_stats_cpu/cpu_utilization"] == 1234
    ws.feed("u", np.array([np.nan], np.float32))
    with pytest.raises(ArgumentError, match="must be a finite percentage"):
        run(ws, "CpuUtilizationReport", ["u"], [], stats_name="test_stats_cpu")


def test_bad_inputs():
    ws = Workspace()
    ws.feed("names", strings("a", "b"))
    ws.feed("ints", np.array([1, 2], np.int32))
    with pytest.raises(DTypeError, match="input 1 .values. must be an int64 tensor, got int32"):
        run(ws, "StatRegistryUpdate", ["names", "ints"], [])
    ws.feed("one", np.array([1], np.int64))
    with pytest.raises(ShapeError, match="as many elements"):
        run(ws, "StatRegistryUpdate", ["names", "one"], [])
    with pytest.raises(DTypeError, match="input 2 must be a StatRegistry made by StatRegistryCreate"):
        run(ws, "StatRegistryUpdate", ["names", "ints", "ints"], [])
    with pytest.raises(DTypeError, match="input 0 .keys. must be a string tensor"):
        run(ws, "StatRegistryUpdate", ["one", "one"], [])


def test_wall_clock_time_is_the_epoch_time_in_ns_read_on_every_run():
    """WallClockTime (caffe2/operators/utility_ops.h): a 0-d int64 of nanoseconds since the epoch, between
    time.time_ns() read before and after the run, and read again on each run of the same net (not kept from
    the first: a net run twice compiles)."""
    ws = Workspace()
    ws.create_net(NetDef(name="clock", op=[make_op("WallClockTime", [], ["t"])]))
    seen = []
    for _ in range(4):
        before = time.time_ns()
        ws.run_net("clock")
        after = time.time_ns()
        t = ws.fetch("t")
        assert t.dtype == np.int64 and t.shape == () and before <= int(t) <= after
        seen.append(int(t))
        time.sleep(0.002)
    assert seen == sorted(seen) and len(set(seen)) == 4
