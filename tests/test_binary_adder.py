"""The binary adder plan (models/binary_adder) trains a basic RNN inside the plan and adds held-out 16-bit
numbers with every bit right; its accuracy is checked against an independent numpy RNN on its weights."""
from __future__ import annotations

import contextlib
import io
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.io import minidb, proto
from stepnet.io.checkpoints import load as load_checkpoint
from stepnet.cli.run import main

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "binary_adder"
PLAN = MODEL / "binary_adder.pbtxt"
T, HIDDEN = 17, 16


@contextlib.contextmanager
def in_repo_root():
    """The plan names its minidbs relative to the repository root (CreateDB opens paths as given)."""
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One `stepnet run` of the plan: its stdout, fetched accuracy, checkpoint of every blob, time."""
    tmp = tmp_path_factory.mktemp("binary_adder")
    out, ckpt = tmp / "acc.npz", tmp / "trained.minidb"
    stdout = io.StringIO()
    start = time.monotonic()
    with in_repo_root(), contextlib.redirect_stdout(stdout):
        rc = main(["run", str(PLAN.relative_to(ROOT)), "--fetch", "bit_accuracy", "--save", str(out),
                   "--checkpoint", str(ckpt)])
    seconds = time.monotonic() - start
    print(f"binary adder: trained and tested in {seconds:.1f} s")
    return {"rc": rc, "stdout": stdout.getvalue(), "accuracy": np.load(out)["bit_accuracy"], "ckpt": ckpt,
            "seconds": seconds}


def read_db(name: str):
    """(bits N x T x 2, sum N x T x 1) of every record of a dataset minidb."""
    db = minidb.MiniDB(MODEL / name)
    rows = [minidb.parse_tensor_protos(db.value(i), name) for i in range(len(db))]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def numbers(bits: np.ndarray) -> list[int]:
    """Integers from least-significant-first bit rows, one Python loop per number."""
    return [sum(int(b) << t for t, b in enumerate(row)) for row in bits]


def numpy_rnn_logits(w: dict, bits: np.ndarray) -> np.ndarray:
    """The basic RNN of build.py's docstring, written out per timestep in float64: T x N logits."""
    x = bits.astype(np.float64).transpose(1, 0, 2)
    h = np.broadcast_to(w["rnn/hidden_init"].astype(np.float64), (x.shape[1], HIDDEN))
    logits = []
    for t in range(x.shape[0]):
        h = np.tanh(x[t] @ w["rnn/i2h_w"].T + w["rnn/i2h_b"] + h @ w["rnn/h2h_w"].T + w["rnn/h2h_b"])
        logits.append((h @ w["out_w"].T + w["out_b"])[:, 0])
    return np.stack(logits)


def bit_accuracy(logits: np.ndarray, sums: np.ndarray) -> float:
    """Share of output bits right: a bit is 1 when its logit is positive (sigmoid > 0.5)."""
    truth = sums[:, :, 0].T
    right = sum(int((logits[t, n] > 0) == (truth[t, n] == 1)) for t in range(truth.shape[0])
                for n in range(truth.shape[1]))
    return right / truth.size


def test_plan_trains_to_full_bit_accuracy(trained):
    assert trained["rc"] == 0, trained["stdout"]
    printed = re.findall(r"^iteration \d+/\d+: bit_accuracy = (\S+)$", trained["stdout"], re.M)
    assert printed and float(printed[-1]) == 1.0, trained["stdout"]
    assert trained["accuracy"].shape == () and float(trained["accuracy"]) == 1.0
    found = re.findall(r"^iteration \d+/\d+: loss = (\S+)$", trained["stdout"], re.M)
    losses = [float(v) for v in found]
    assert len(losses) == 8 and losses[-1] < 0.01 < losses[0], losses  # the report net printed the loss
    print(f"time {trained['seconds']:.1f} s, bit accuracy {float(trained['accuracy'])}, losses {losses}")


def test_datasets_hold_binary_additions():
    train_bits, train_sum = read_db("train.minidb")
    test_bits, test_sum = read_db("test.minidb")
    assert train_bits.shape == (4096, T, 2) and test_bits.shape == (1000, T, 2)
    train_pairs = set()
    for bits, sums, seen in ((train_bits, train_sum, train_pairs), (test_bits, test_sum, set())):
        assert (bits[:, T - 1] == 0).all()  # 16-bit numbers: the 17th step only carries
        a, b, s = numbers(bits[:, :, 0]), numbers(bits[:, :, 1]), numbers(sums[:, :, 0])
        assert max(a + b) < 1 << 16
        assert all(x + y == z for x, y, z in zip(a, b, s, strict=True))
        seen.update(zip(a, b, strict=True))
        assert len(seen) == len(a)  # distinct pairs
    test_pairs = set(zip(numbers(test_bits[:, :, 0]), numbers(test_bits[:, :, 1]), strict=True))
    assert not test_pairs & train_pairs  # held out


def check_against_numpy(logits: np.ndarray, accuracy: float, weights: dict) -> None:
    """The plan's test logits and accuracy equal those of the numpy RNN on the same weights."""
    bits, sums = read_db("test.minidb")
    reference = numpy_rnn_logits(weights, bits)
    np.testing.assert_allclose(logits[:, :, 0], reference, rtol=1e-4, atol=1e-4)
    assert accuracy == bit_accuracy(reference, sums)


def test_accuracy_matches_an_independent_numpy_rnn(trained):
    weights = minidb.load_blobs(trained["ckpt"])
    check_against_numpy(weights["test_logits"], float(trained["accuracy"]), weights)
    assert float(trained["accuracy"]) == 1.0


def run_test_net(ckpt) -> tuple[np.ndarray, float]:
    """Init + test nets of the plan on the trained weights of a checkpoint: (test logits, accuracy)."""
    plan = proto.load(PLAN)
    nets = {n.name: n for n in plan.network}
    ws = Workspace()
    with in_repo_root():
        ws.run_net_once(nets["binary_adder_init"])
        load_checkpoint(ws, ckpt)  # trained weights over the fresh initial ones
        with contextlib.redirect_stdout(io.StringIO()):
            ws.run_net_once(nets["binary_adder_test"])
    return ws.fetch("test_logits"), float(ws.fetch("bit_accuracy"))


def test_tester_catches_a_broken_kernel(trained, broken):
    weights = minidb.load_blobs(trained["ckpt"])
    check_against_numpy(*run_test_net(trained["ckpt"]), weights)
    broken("Tanh", lambda xp, x: (xp.tanh(x) * 0.98).astype(x.dtype))  # slightly wrong
    logits, accuracy = run_test_net(trained["ckpt"])
    with pytest.raises(AssertionError):
        check_against_numpy(logits, accuracy, weights)
