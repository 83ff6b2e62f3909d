"""Checkpoints of plan runs: a run interrupted and resumed ends exactly where an uninterrupted run ends (data
readers, the learning-rate schedule, momentum and the random generator included), from Python and from the
command line with a real Ctrl-C; bad checkpoints and flags get one clear line."""
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.io import checkpoints, proto
from stepnet.cli.run import main
from stepnet.core.errors import ArgumentError, FileFormatError, PlanError
from stepnet.io.minidb import load_blobs
from stepnet.io.proto import OperatorDef, make_argument

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]


def digits_plan(iterations: int, report_every: int):
    """The digits MLP plan (models/digits/build.py): CreateDB readers, SGD with momentum and a step LR policy;
    plus a UniformFill without a seed in the train net, so the workspace generator advances every iteration."""
    spec = importlib.util.spec_from_file_location("digits_build", ROOT / "models" / "digits" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    build.STEP_SIZE = 2
    plan = build.build(iterations, "models/digits")
    train = next(n for n in plan.network if n.name == "digits")
    train.op.append(OperatorDef(type="UniformFill", output=["noise"], arg=[make_argument("shape", [3])]))
    for step in plan.execution_step:   # report every `report_every` iterations (outer loop over them)
        if step.name == "train" and report_every:
            step.num_iter = iterations // report_every
            step.substep[0].num_iter = report_every
    return plan


def final_params(ws) -> dict:
    return {n: ws.fetch(n) for n in PARAMS + ["fc1_w_momentum", "optimizer_iteration", "noise", "SgdOptimizer_0_lr_cpu"]
            if ws.has(n)}


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)   # the plan names its data relative to the repository root, as Caffe2 resolves it


@pytest.mark.parametrize("iterations, report_every, stop_at", [(8, 2, 2), (8, 2, 3), (6, 0, 4)])
def test_interrupted_and_resumed_equals_uninterrupted(at_root, tmp_path, iterations, report_every, stop_at):
    """2N straight ≡ N, interrupt, resume — with the checkpoint in the outer loop (report_every: the plan's
    outer step iterates) or in the nested train step (report_every 0: only the inner step iterates)."""
    plan = digits_plan(iterations, report_every)
    straight = Workspace(seed=3)
    straight.run_plan(plan)
    expected = final_params(straight)

    saver = checkpoints.Checkpointer(tmp_path / "ck.minidb")

    def interrupt_at(position, ws):
        if position.done == stop_at:
            saver.interrupt()
        saver(position, ws)
    ws = Workspace(seed=3)
    with pytest.raises(checkpoints.Interrupted, match=f"after {stop_at} iteration"):
        ws.run_plan(plan, boundary=interrupt_at)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    resumed = Workspace(seed=99)                      # another seed: the generator state comes from the checkpoint
    resumed.run_plan(digits_plan(iterations, report_every), resume=checkpoints.Resume(tmp_path / "ck.minidb"))
    got = final_params(resumed)
    assert got.keys() == expected.keys() and "fc1_w_momentum" in got and "noise" in got
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_the_comparison_catches_a_resume_that_forgets_the_readers(at_root, tmp_path, monkeypatch):
    from stepnet.io.dbreader import DBReader
    monkeypatch.setattr(DBReader, "seek", lambda self, pos: None)   # readers restart at their first record
    with pytest.raises(AssertionError, match="fc1_w"):
        test_interrupted_and_resumed_equals_uninterrupted(at_root, tmp_path, 8, 2, 2)


def test_periodic_checkpoints_are_written_and_the_last_one_resumes(at_root, tmp_path):
    plan = digits_plan(6, 2)
    saver = checkpoints.Checkpointer(tmp_path / "ck.minidb", every=2)
    Workspace(seed=0).run_plan(plan, boundary=saver)
    assert saver.saves == 1                           # outer iterations 1, 2, 3: saved after the 2nd
    blobs = load_blobs(tmp_path / "ck.minidb")
    assert list(blobs[checkpoints.POSITION]) == [1, 2] and int(blobs["optimizer_iteration"][0]) == 4


def test_bad_checkpoints_and_positions(at_root, tmp_path):
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    checkpoints.save(ws, tmp_path / "plain.minidb")
    with pytest.raises(FileFormatError, match="not a resumable checkpoint.*--load instead"):
        checkpoints.Resume(tmp_path / "plain.minidb")
    checkpoints.save(ws, tmp_path / "done.minidb", checkpoints.Position(checkpoints.FINISHED))
    with pytest.raises(FileFormatError, match="finished; there is nothing to resume"):
        checkpoints.Resume(tmp_path / "done.minidb")
    checkpoints.save(ws, tmp_path / "far.minidb", checkpoints.Position((7, 0), 1))
    with pytest.raises(PlanError, match=r"step path \[7, 0\], which plan 'digits_mlp' does not have"):
        Workspace().run_plan(digits_plan(4, 2), resume=checkpoints.Resume(tmp_path / "far.minidb"))


@pytest.mark.parametrize("flags, message", [
    (["--checkpoint-every", "2"], "--checkpoint-every N needs N >= 1, --checkpoint PATH and a plan"),
    (["--resume", "x.minidb"], "--resume continues a plan run"),
])
def test_checkpoint_flags_on_a_net(flags, message, capsys):
    assert main(["run", str(ROOT / "models" / "xor" / "init_net.pbtxt"), *flags]) == 1
    assert message in capsys.readouterr().err


def test_ctrl_c_saves_a_checkpoint_that_resume_continues(tmp_path):
    """A real SIGINT to `stepnet run --checkpoint`: exit 130 with the checkpoint named; --resume then ends with
    the same parameters as an uninterrupted run."""
    plan_path = tmp_path / "plan.pbtxt"
    proto.save(digits_plan(400, 4), plan_path)        # 100 outer iterations: long enough to interrupt
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = [sys.executable, "-m", "stepnet", "run", str(plan_path), "-q"]
    ck, straight = tmp_path / "ck.minidb", tmp_path / "straight.minidb"
    proc = subprocess.Popen([*run, "--checkpoint", str(ck), "--checkpoint-every", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ck.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"checkpoint saved to {ck}" in err and "--resume" in err and "Traceback" not in err
    position = load_blobs(ck)[checkpoints.POSITION]
    assert position[0] == 1 and 0 < position[-1] < 100
    resumed = tmp_path / "resumed.minidb"
    subprocess.run([*run, "--resume", str(ck), "--checkpoint", str(resumed)], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([*run, "--checkpoint", str(straight)], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    a, b = load_blobs(resumed), load_blobs(straight)
    for name in PARAMS + ["optimizer_iteration"]:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_load_leaves_the_resume_state_out(tmp_path):
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    checkpoints.save(ws, tmp_path / "ck.minidb", checkpoints.Position((0,), 1))
    fresh = Workspace()
    assert checkpoints.load(fresh, tmp_path / "ck.minidb") == 1
    assert fresh.blobs() == ["x"]


def test_a_checkpoint_flag_error_is_an_argument_error():
    assert issubclass(ArgumentError, Exception)   # the CLI maps it to one line (see test_checkpoint_flags_on_a_net)
