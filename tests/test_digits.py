"""models/digits: the vendored data, the committed plan (the output of build.py), and a training run through
`stepnet run` that reaches >= 95 % test accuracy, checked against a numpy forward pass of the trained weights.
"""
import hashlib
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from stepnet.cli import run as cli
from stepnet.io import proto
from stepnet.io.minidb import MiniDB, parse_tensor_protos

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits"
PARAMS = ["fc1_w", "fc1_b", "fc2_w", "fc2_b"]


def module(name: str):
    spec = importlib.util.spec_from_file_location(f"digits_{name}", DIGITS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def records(name: str):
    db = MiniDB(DIGITS / f"{name}.minidb")
    rows = [parse_tensor_protos(db.value(i), f"{name} record {i}") for i in range(len(db))]
    return db, np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


# --------------------------------------------------------------------------------------------- data and plan
def test_the_data_files():
    counts = {}
    for name, size in (("train", 1437), ("test", 360)):
        db, images, labels = records(name)
        assert db.keys() == [f"{i:08d}" for i in range(size)]
        assert images.shape == (size, 64) and images.dtype == np.float32
        assert labels.shape == (size,) and labels.dtype == np.int32
        assert images.min() == 0 and images.max() == 1
        np.testing.assert_array_equal(images * 16, np.round(images * 16))  # pixel counts 0..16 over 16
        counts[name] = np.bincount(labels, minlength=10)
    assert counts["test"].min() >= 35 and counts["test"].max() <= 37  # stratified
    total = counts["train"] + counts["test"]
    np.testing.assert_allclose(counts["test"] / total, 360 / 1797, atol=0.01)


def test_sources_md_names_the_files_as_they_are():
    sources = (DIGITS / "SOURCES.md").read_text()
    for name in ("train.minidb", "test.minidb"):
        digest = hashlib.sha256((DIGITS / name).read_bytes()).hexdigest()
        assert re.search(rf"`{name}`.*{digest}", sources), name
    assert "BSD 3-Clause" in (DIGITS / "LICENSE-BSD-3-Clause-scikit-learn.txt").read_text()


def test_the_committed_plan_is_what_build_py_writes():
    built = module("build").build()
    assert proto.to_text(proto.load(DIGITS / "train.pbtxt")) == proto.to_text(built)


def test_committed_data_match_sources_md():
    """The minidb files are the ones SOURCES.md records (make_data.py regenerates them byte for byte from
    scikit-learn's CSV; that check runs where scikit-learn is installed, see below)."""
    import hashlib
    import re
    text = (DIGITS / "SOURCES.md").read_text()
    for name in ("train.minidb", "test.minidb"):
        digest = re.search(rf"^\| `{name}` \|.*\| ([0-9a-f]{{64}}) \|$", text, re.M).group(1)
        assert hashlib.sha256((DIGITS / name).read_bytes()).hexdigest() == digest, name


def test_make_data_is_reproducible(tmp_path):
    """Regenerate the data when scikit-learn (not a stepnet dependency) is installed; otherwise check that
    make_data.py says so clearly instead of failing obscurely."""
    make_data = module("make_data")
    if importlib.util.find_spec("sklearn") is None:
        with pytest.raises(BaseException, match="(?i)scikit-learn|sklearn"):
            make_data.main(["--out", str(tmp_path)])
        return
    make_data.main(["--out", str(tmp_path)])
    for name in ("train.minidb", "test.minidb"):
        assert (tmp_path / name).read_bytes() == (DIGITS / name).read_bytes(), name


# --------------------------------------------------------------------------------------------- training
def numpy_accuracy(weights: dict) -> float:
    """Accuracy of the MLP on the test set, by numpy from the trained weights (first maximum wins)."""
    _, images, labels = records("test")
    x = images.astype(np.float64)
    hidden = np.maximum(x @ weights["fc1_w"].T.astype(np.float64) + weights["fc1_b"], 0)
    logits = hidden @ weights["fc2_w"].T.astype(np.float64) + weights["fc2_b"]
    return float((logits.argmax(axis=1) == labels).mean())


def train(tmp_path, monkeypatch, capsys, iterations: int | None = None):
    """`stepnet run models/digits/train.pbtxt` from the repository root (or a build with fewer iterations);
    returns the accuracy it printed (Print op), the one it fetched, the losses it reported and the weights."""
    plan = DIGITS / "train.pbtxt"
    if iterations is not None:
        plan = tmp_path / "train.pbtxt"
        proto.save(module("build").build(iterations), plan)
    monkeypatch.chdir(ROOT)
    saved = tmp_path / "weights.npz"
    assert cli.main(["run", str(plan), "--fetch", "accuracy", *PARAMS, "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    printed = re.findall(r"^iteration \d+/\d+: accuracy = (\S+)$", out, re.M)
    fetched = re.findall(r"^accuracy: shape \(\) float32 \[(\S+)\]", out, re.M)
    losses = [float(v) for v in re.findall(r"^iteration \d+/\d+: loss = (\S+)$", out, re.M)]
    assert len(printed) == 1 and len(fetched) == 1, out
    weights = dict(np.load(saved))
    return float(printed[0]), float(fetched[0]), losses, weights


def test_the_committed_plan_reaches_95_percent(tmp_path, monkeypatch, capsys):
    build = module("build")
    printed, fetched, losses, weights = train(tmp_path, monkeypatch, capsys)
    assert printed >= 0.95 and fetched >= 0.95
    assert abs(printed - fetched) < 1e-5
    assert abs(float(weights["accuracy"]) - numpy_accuracy(weights)) < 1e-6
    assert len(losses) == build.ITERATIONS // build.REPORT_EVERY  # one report every REPORT_EVERY iterations
    assert max(losses[-3:]) < 0.1 and losses[-1] < losses[0]


def test_the_tester_a_broken_accuracy_is_caught(tmp_path, monkeypatch, capsys, broken):
    broken("Accuracy", lambda xp, X, label, *, top_k: xp.ones((), np.float32))
    _, fetched, _, weights = train(tmp_path, monkeypatch, capsys, iterations=20)
    assert abs(float(weights["accuracy"]) - numpy_accuracy(weights)) > 1e-3


def test_iterations_are_optimizer_steps(monkeypatch, capsys):
    """--iterations 75 on the 12 x 50 plan: 75 optimizer steps, reports after 50 and after the 25 of the cut
    second block, then the test net."""
    monkeypatch.chdir(ROOT)
    assert cli.main(["run", str(DIGITS / "train.pbtxt"), "--iterations", "75", "--fetch", "optimizer_iteration"]) == 0
    out, err = capsys.readouterr()
    assert "--iterations 75: 75 iterations of 'train' > 'train_inner' (the plan has 12 x 50 = 600)" in err
    assert re.findall(r"^iteration (\d+)/75: loss = ", out, re.M) == ["50", "75"]
    assert re.search(r"^iteration 75/75: accuracy = ", out, re.M)
    assert "optimizer_iteration: shape (1,) int64 [75]" in out
