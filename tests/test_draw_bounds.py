"""`stepnet draw` of nets that would keep Graphviz busy for minutes (#24 §4): what is drawn is bounded by edges as
well as ops (an op's inputs past MAX_OP_EDGES as one node, then --max-edges), and `dot` never outlives stepnet:
its process group is killed on the timeout and on Ctrl-C, and on Linux the kernel kills it when stepnet dies."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepnet.cli.run import main
from stepnet.core.errors import StepnetError
from stepnet.export import draw as drawing, graphviz
from stepnet.export.draw import Options, to_dot
from stepnet.io import proto
from stepnet.testing import make_op

ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG")


def sums(ops: int = 100, inputs: int = 300):
    """The campaign's case: 100 Sum ops of 300 inputs each."""
    net = proto.NetDef(name="sums")
    net.op.extend(make_op("Sum", [f"x{i}_{j}" for j in range(inputs)], [f"y{i}"]) for i in range(ops))
    return net


def test_an_ops_inputs_past_the_bound_are_one_node():
    text = to_dot([sums()])
    assert text.count(" -> ") == 100 * (16 + 1 + 1)          # 16 inputs, "… 284 more inputs", the output
    assert text.count("label=<… 284 more inputs>") == 100 and "more ops not drawn" not in text
    assert len(text) < 400_000


def test_drawing_stops_at_max_edges_with_a_note():
    text = to_dot([sums()], Options(max_edges=100))
    assert text.count("shape=box") == 6 and text.count(" -> ") == 6 * 18
    assert "94 more ops not drawn (max_edges 100; raise it with --max-edges N)" in text


def test_without_the_bounds_every_edge_is_drawn(monkeypatch):
    monkeypatch.setattr(drawing, "MAX_OP_EDGES", 10**9)
    assert to_dot([sums()], Options(max_edges=10**9)).count(" -> ") == 100 * 301   # what kept dot busy
    assert to_dot([sums()]).count(" -> ") <= drawing.MAX_EDGES + 301                # max_edges alone bounds it


def test_small_nets_are_drawn_whole(capsys, tmp_path):
    text = to_dot([sums(3, 16)])
    assert text.count(" -> ") == 3 * 17 and "more inputs" not in text
    out = str(tmp_path / "x.dot")
    assert main(["draw", str(ROOT / "models/xor/predict_net.pbtxt"), "-o", out, "--max-edges", "0"]) == 1
    assert "max_edges must be at least 1, got 0" in capsys.readouterr().err
    assert main(["draw", str(ROOT / "models/xor/predict_net.pbtxt"), "-o", out, "--max-edges", "3"]) == 0
    assert "more ops not drawn (max_edges 3" in Path(out).read_text()


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (CI installs it)")
def test_the_campaigns_net_draws(tmp_path, capsys):
    proto.save(sums(), tmp_path / "sums.pbtxt")
    assert main(["draw", str(tmp_path / "sums.pbtxt"), "-o", str(tmp_path / "sums.svg")]) == 0
    assert "… 284 more inputs" in (tmp_path / "sums.svg").read_text()


# --------------------------------------------------------------------------------- dot never outlives stepnet
@pytest.fixture
def slow_dot(tmp_path, monkeypatch):
    """A `dot` on PATH that starts a child and waits forever; returns the file where it writes both pids."""
    pids = tmp_path / "pids"
    script = tmp_path / "bin" / "dot"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nsleep 1000 &\necho $$ $! > {pids}.tmp\nmv {pids}.tmp {pids}\nwait\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    yield pids
    if pids.exists():   # whatever a failed test left running
        for pid in map(int, pids.read_text().split()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"   # (a zombie has ended)


def wait_for(test, guard_s: float = 60.0) -> bool:
    """Poll until test() holds; the deadline is a guard against a hang, not a measure of time."""
    deadline = time.monotonic() + guard_s
    while not test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@linux_only
def test_dots_timeout_is_one_line_and_kills_its_group(slow_dot, monkeypatch):
    monkeypatch.setattr(graphviz, "RENDER_TIMEOUT_S", 1)
    with pytest.raises(StepnetError, match=r"^dot -Tsvg took more than 1 s; draw fewer ops or edges"):
        graphviz.render("digraph {}", "svg")
    pids = [int(p) for p in slow_dot.read_text().split()]
    assert wait_for(lambda: not any(map(alive, pids))), pids   # dot and the child it started


@linux_only
def test_ctrl_c_while_dot_runs_kills_it(slow_dot):
    def interrupt(*_):   # Ctrl-C once dot runs (it has written its pids)
        if slow_dot.exists():
            raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
        with pytest.raises(KeyboardInterrupt):
            graphviz.render("digraph {}", "svg")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    pids = [int(p) for p in slow_dot.read_text().split()]
    assert wait_for(lambda: not any(map(alive, pids))), pids


@linux_only
def test_a_killed_stepnet_takes_dot_with_it(slow_dot, tmp_path):
    code = "from stepnet.export.graphviz import render; render('digraph {}', 'svg')"
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert wait_for(slow_dot.exists)
    finally:
        parent.kill()          # SIGKILL: no Python code of stepnet runs
        parent.wait()
    dot = int(slow_dot.read_text().split()[0])
    assert wait_for(lambda: not alive(dot)), dot


@linux_only
def test_without_the_death_signal_dot_outlives_a_killed_stepnet(slow_dot, monkeypatch):
    """The rule the previous test guards: with no PR_SET_PDEATHSIG, SIGKILL of stepnet leaves dot running."""
    code = ("import stepnet.export.graphviz as d; d._die_with_parent = lambda: None; d.render('digraph {}', 'svg')")
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert wait_for(slow_dot.exists)
    finally:
        parent.kill()
        parent.wait()
    dot = int(slow_dot.read_text().split()[0])
    time.sleep(0.5)
    assert alive(dot)
