"""Hangs and runaway resources an independent hostile-input campaign found (#24 §4): each ends in one
`stepnet: error:` line, checked against a bound that makes the hang impossible, and the good input next to it
still works."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.cli.run import main
from stepnet.core.errors import ArgumentError
from stepnet.core.limits import Limits
from stepnet.io import proto
from stepnet.runtime import plan
from stepnet.testing import make_op


ROOT = Path(__file__).resolve().parents[1]


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("stepnet: error: ") and err.count("\n") == 1 and "internal" not in err, err
    return err


# --------------------------------------------------------------------------------- Checkpoint's db pattern
def checkpoint_net(path, pattern: str) -> str:
    net = proto.NetDef(name="ck")
    net.op.extend([make_op("ConstantFill", [], ["it"], shape=[1], dtype=proto.DataType.INT64, value=3),
                   make_op("Checkpoint", ["it"], [], db=pattern, db_type="minidb")])
    proto.save(net, path)
    return str(path)


@pytest.mark.parametrize("pattern, message", [
    ("ck%100000000d", "'%100000000d' pads the iteration to more than the 255 bytes a file name holds"),
    ("ck%1000000000d", "'%1000000000d' pads the iteration"),
    ("ck%.1000000000d", "'%.1000000000d' pads the iteration"),
    ("ck%256d", "'%256d' pads the iteration"),
    ("ck%" + "9" * 100_000 + "d", "pads the iteration"),
    ("ck%0254d", "characters long with a name of 256 bytes; file systems take at most 255 bytes a name"),
    ("d/" * 2100 + "ck%d", "file systems take at most 255 bytes a name and 4096 a path"),
])
def test_a_db_pattern_wider_than_a_file_name_is_one_short_line(tmp_path, monkeypatch, capsys, pattern, message):
    monkeypatch.chdir(tmp_path)
    assert main(["run", checkpoint_net(tmp_path / "net.pbtxt", pattern)]) == 1
    err = one_error(capsys)
    assert message in err and "op #1 (Checkpoint)" in err and len(err) < 500
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.pbtxt"]


@pytest.mark.parametrize("pattern, written", [("ck_%08d.minidb", "ck_00000003.minidb"),
                                              ("ck%0253d", "ck" + "3".zfill(253)), ("ck%%%-5d.db", "ck%3    .db")])
def test_a_db_pattern_a_file_name_holds_writes(tmp_path, monkeypatch, capsys, pattern, written):
    monkeypatch.chdir(tmp_path)
    assert main(["run", checkpoint_net(tmp_path / "net.pbtxt", pattern), "-q"]) == 0, capsys.readouterr().err
    assert (tmp_path / written).is_file()


def test_a_save_to_a_name_longer_than_a_file_name_is_refused(tmp_path):
    ws = Workspace(limits=Limits(file_root=tmp_path))
    ws.feed("x", np.ones(2, np.float32))
    with pytest.raises(ArgumentError, match="with a name of 256 bytes"):
        ws.run_operator_once(make_op("Save", ["x"], [], db=str(tmp_path / ("é" * 128)), db_type="minidb",
                                     absolute_path=1))
    ws.run_operator_once(make_op("Save", ["x"], [], db=str(tmp_path / ("é" * 127)), db_type="minidb",
                                 absolute_path=1))
    assert (tmp_path / ("é" * 127)).is_file()


# --------------------------------------------------------------------------------- a stop blob nothing writes
PLAN = """name: "p"
network { name: "init"
  op { type: "ConstantFill" output: "it" arg { name: "shape" ints: 1 } arg { name: "dtype" i: 10 } }
  op { type: "ConstantFill" output: "one" arg { name: "shape" ints: 1 } arg { name: "value" i: 1 }
       arg { name: "dtype" i: 10 } }
  op { type: "ConstantFill" output: "limit" arg { name: "shape" ints: 1 } arg { name: "value" i: LIMIT }
       arg { name: "dtype" i: 10 } }
  op { type: "ConstantFill" output: "stop" arg { name: "shape" ints: 1 } arg { name: "dtype" i: 5 } }
  op { type: "ConstantFill" output: "n" arg { name: "shape" ints: 1 } arg { name: "dtype" i: 10 } } }
network { name: "tick" op { type: "Add" input: ["it", "one"] output: "it" } }
network { name: "check" op { type: "GE" input: ["it", "limit"] output: "stop" } }
network { name: "copy" op { type: "Copy" input: "it" output: "shown" } }
network { name: "show" op { type: "Print" input: "it" } }
network { name: "count" op { type: "Iter" input: "n" output: "n" } op { type: "Print" input: "n" } }
execution_step { name: "init" network: "init" }
"""
FOREVER = [   # steps whose stop blob is false or absent and written by no net they run
    'execution_step { name: "loop" network: "tick" should_stop_blob: "stop" }',
    'execution_step { name: "loop" network: "tick" should_stop_blob: "never" }',
    'execution_step { name: "loop" should_stop_blob: "stop" substep { network: "tick" } substep { network: "copy" } }',
    'execution_step { name: "loop" network: "tick" report_net: "copy" should_stop_blob: "stop" }',
    'execution_step { name: "loop" should_stop_blob: "stop" }',
    'execution_step { name: "loop" network: "show" should_stop_blob: "stop" }',     # context ops that write only
    'execution_step { name: "loop" network: ["count", "tick"] should_stop_blob: "stop" }',   # what they name
]


def plan_file(tmp_path, steps: str, limit: int = 3) -> str:
    proto.save(proto.parse_text(PLAN.replace("LIMIT", str(limit)) + steps, "plan"), tmp_path / "plan.pbtxt")
    return str(tmp_path / "plan.pbtxt")


@pytest.mark.parametrize("steps", FOREVER)
def test_a_step_whose_stop_blob_nothing_writes_is_refused_before_it_starts(tmp_path, capsys, steps):
    """(the bound: the step is refused before its first iteration, so the loop cannot start; a hang would stop
    this test at the harness's timeout, not pass it)"""
    assert main(["run", plan_file(tmp_path, steps), "-q"]) == 1
    err = one_error(capsys)
    assert "execution step 'loop' runs until should_stop_blob" in err and "so the step would never end" in err
    assert ("is absent" if '"never"' in steps else "is false") in err


@pytest.mark.parametrize("steps, ticks", [
    ('execution_step { name: "loop" network: ["tick", "check"] should_stop_blob: "stop" }', 3),
    ('execution_step { name: "loop" should_stop_blob: "stop" substep { network: "tick" } '
     'substep { network: "check" } }', 3),
    ('execution_step { name: "loop" network: "tick" report_net: "check" should_stop_blob: "stop" }', 4),
    ('execution_step { name: "loop" network: "tick" should_stop_blob: "it" }', 1),    # false, then written
    ('execution_step { name: "loop" network: ["count", "tick", "check"] should_stop_blob: "stop" }', 3),
])
def test_a_step_that_may_write_its_stop_blob_still_loops(tmp_path, steps, ticks):
    ws = Workspace()
    ws.run_plan(proto.load(plan_file(tmp_path, steps)))
    assert int(ws.fetch("it")[0]) == ticks


def test_without_the_rule_the_step_never_ends(tmp_path, monkeypatch):
    """With the check off the first FOREVER step runs on: stopped here after 1,000 iterations."""
    calls, iteration = [], plan.PlanRun._iteration

    def counted(self, *args):
        calls.append(1)
        if len(calls) > 1000:
            raise RuntimeError("still looping")
        return iteration(self, *args)
    monkeypatch.setattr(plan.PlanRun, "_check_can_stop", lambda *args: None)
    monkeypatch.setattr(plan.PlanRun, "_iteration", counted)
    with pytest.raises(RuntimeError, match="still looping"):
        Workspace().run_plan(proto.load(plan_file(tmp_path, FOREVER[0])))


def test_a_real_loop_stays_interruptible(tmp_path):
    """A step whose net writes its stop blob, false for ~10**12 iterations: Ctrl-C ends it with one line."""
    steps = 'execution_step { name: "loop" network: ["tick", "show", "check"] should_stop_blob: "stop" }'
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "stepnet", "run", plan_file(tmp_path, steps, 10**12)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline()            # it loops: the Print op has printed
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)   # (a guard, generous: Ctrl-C ends it at the next op)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.startswith("stepnet: interrupted") and "Traceback" not in err
