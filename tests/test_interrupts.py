"""Ctrl-C during `stepnet run --checkpoint` (issue #24 § 5.4): the first is acknowledged at once and asks for a
checkpoint at the end of the iteration; a second one during that save lets it finish (the checkpoint is whole);
a second one before the save began stops the run at once and says the checkpoint was not written.

The subprocess tests wait for events, never for time: a driver runs the command line with pauses at the
moments that matter (each prints a `test: <event>` line on stderr and waits for a line on stdin), and the test
sends SIGINT while the driver waits there."""
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.io import checkpoints, proto
from stepnet.io.minidb import load_blobs

ROOT = Path(__file__).resolve().parents[1]
PLAN = """name: "p"
network { name: "init" op { type: "ConstantFill" output: "it" arg { name: "shape" ints: 1 }
                             arg { name: "value" i: 0 } arg { name: "dtype" i: 10 } } }
network { name: "tick" op { type: "Iter" input: "it" output: "it" } }
execution_step { name: "init" network: "init" }
execution_step { name: "steps" network: "tick" num_iter: 5 }
"""
DRIVER = """
import sys
from stepnet.io import checkpoints
from stepnet.cli.run import main

mode, args = sys.argv[1], sys.argv[2:]
call, save = checkpoints.Checkpointer.__call__, checkpoints.save


def pause(event):
    print(f"test: {event}", file=sys.stderr, flush=True)
    sys.stdin.readline()


def boundary(self, position, ws):
    if position.done == 1:
        pause("iterating")              # the first Ctrl-C comes here, in the middle of an iteration
        if mode == "before":
            pause("still iterating")    # and in mode 'before' the second, before the boundary's save
    return call(self, position, ws)


def slow_save(*args):
    if mode == "during":
        pause("saving")                 # the second Ctrl-C comes during the save
    return save(*args)


checkpoints.Checkpointer.__call__ = boundary
checkpoints.save = slow_save
sys.exit(main(args))
"""
ACK = "stepnet: interrupted; saving a checkpoint to {} at the end of this iteration (Ctrl-C again to stop without it)"


class Driven:
    """`stepnet run PLAN --checkpoint CK` under the driver, its stderr read line by line as it comes."""

    def __init__(self, tmp_path, mode: str):
        (tmp_path / "plan.pbtxt").write_text(PLAN)
        (tmp_path / "driver.py").write_text(DRIVER)
        self.ck = tmp_path / "ck.minidb"
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "driver.py"), mode, "run", str(tmp_path / "plan.pbtxt"), "-q",
             "--checkpoint", str(self.ck)], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [*map(self.lines.put, self.proc.stderr), self.lines.put(None)],
                         daemon=True).start()

    def wait_for(self, text: str | None) -> None:
        """Read stderr up to a line holding text, or to its end for None (the deadline only ends a test that
        would hang)."""
        while text is None or not any(text in line for line in self.seen):
            try:
                line = self.lines.get(timeout=120)
            except queue.Empty:
                line = None
            if line is None:
                if text is None:
                    return
                self.proc.kill()
                raise AssertionError(f"no line with {text!r}; stderr: {self.seen}")
            self.seen.append(line.rstrip("\n"))

    def go_on(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, list[str]]:
        self.proc.stdin.close()
        self.wait_for(None)
        return self.proc.wait(timeout=120), self.seen


@pytest.fixture
def driven(tmp_path):
    runs = []
    yield lambda mode: runs.append(Driven(tmp_path, mode)) or runs[-1]
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
        run.proc.wait()


def test_a_second_ctrl_c_during_the_save_lets_it_finish(driven, tmp_path):
    run = driven("during")
    run.wait_for("test: iterating")
    run.proc.send_signal(signal.SIGINT)
    run.wait_for(ACK.format(run.ck))          # acknowledged at once, in the middle of the iteration
    run.go_on()
    run.wait_for("test: saving")
    run.proc.send_signal(signal.SIGINT)
    run.wait_for(f"stepnet: interrupted; finishing the checkpoint being written to {run.ck}, then stopping")
    run.go_on()
    rc, lines = run.finish()
    assert rc == 130 and f"stepnet: interrupted; checkpoint saved to {run.ck} at step path [1] after 1 " \
        f"iteration(s); continue the run with --resume {run.ck}" in lines, lines
    blobs = load_blobs(run.ck)                # whole: it loads, and holds the iteration it was taken at
    assert list(blobs[checkpoints.POSITION]) == [1, 1] and blobs["it"].tolist() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.minidb", "driver.py", "plan.pbtxt"]


def test_a_second_ctrl_c_before_the_save_stops_without_it(driven, tmp_path):
    run = driven("before")
    run.wait_for("test: iterating")
    run.proc.send_signal(signal.SIGINT)
    run.wait_for(ACK.format(run.ck))
    run.go_on()
    run.wait_for("test: still iterating")
    run.proc.send_signal(signal.SIGINT)
    rc, lines = run.finish()
    assert rc == 130 and "stepnet: interrupted; stopped at once, without the checkpoint (Ctrl-C came again " \
        f"before its save began); {run.ck} was not written" in lines, lines
    assert not any("Traceback" in line for line in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["driver.py", "plan.pbtxt"]   # absent, as promised


def test_ctrl_c_in_process_during_and_before_the_save(tmp_path, monkeypatch, capfd):
    """The same with real signals in this process: SIGINT sent from inside the save, and twice before it."""
    plan = proto.parse_text(PLAN)
    saver = checkpoints.Checkpointer(tmp_path / "ck.minidb", every=2)
    real_save = checkpoints.save

    def save_interrupted(*args):
        os.kill(os.getpid(), signal.SIGINT)     # the handler runs here, in the middle of the save
        return real_save(*args)

    monkeypatch.setattr(checkpoints, "save", save_interrupted)
    previous = signal.signal(signal.SIGINT, saver.interrupt)
    try:
        with pytest.raises(checkpoints.Interrupted, match=r"step path \[1\] after 2 iteration"):
            Workspace().run_plan(plan, boundary=saver)   # a Ctrl-C during the periodic save: stop after it
        assert load_blobs(tmp_path / "ck.minidb")["it"].tolist() == [2]
        assert "finishing the checkpoint being written" in capfd.readouterr().err
        again = checkpoints.Checkpointer(tmp_path / "other.minidb")
        signal.signal(signal.SIGINT, again.interrupt)
        os.kill(os.getpid(), signal.SIGINT)
        assert ACK.format(tmp_path / "other.minidb") in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt, match="was not written"):
            os.kill(os.getpid(), signal.SIGINT)
            np.zeros(1).sum()                   # a few bytecodes for the handler to run in
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not (tmp_path / "other.minidb").exists()
