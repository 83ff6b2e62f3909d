"""char-rnn (spec §8) from the committed plan files: data read inside the plan, loss falls, checkpoint, sampling."""
import os
import re
import sys
from pathlib import Path

import numpy as np

from stepnet import load
from stepnet.io import minidb
from stepnet.cli.run import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import build_char_rnn as build  # noqa: E402


def test_committed_plans_match_the_builder_defaults():
    """The .pbtxt files are generated: regenerating them with the defaults gives the same messages."""
    text = (ROOT / build.TEXT).read_text()
    vocab = build.vocabulary(text)
    assert vocab == sorted(set(text)) and len(vocab) == 65
    plan = load(ROOT / "models/char_rnn.pbtxt")
    assert plan == build.train_plan(vocab, 32, 25, 256, 2000, 250, 2e-3, 5.0)
    assert load(ROOT / "models/char_rnn_sample.pbtxt") == build.sample_plan(vocab, 256, 400)


def test_data_batches_continue_each_stream():
    db = minidb.MiniDB(ROOT / build.TRAIN_DB)
    first, second = (minidb.parse_tensor_protos(db.value(i), "")[0] for i in (0, 1))
    assert first.shape == (26, 32) and first.dtype == np.int32
    np.testing.assert_array_equal(first[-1], second[0])  # row T of batch k is row 0 of batch k+1
    vocab = build.vocabulary((ROOT / build.TEXT).read_text())
    text = (ROOT / build.TEXT).read_text()
    assert "".join(vocab[i] for i in first[:, 0]) == text[:26]


def test_short_training_run_then_sampling(tmp_path, capsys):
    vocab = build.vocabulary((ROOT / build.TEXT).read_text())
    plan = build.train_plan(vocab, 32, 25, 64, 60, 30, 5e-3, 5.0)
    path = tmp_path / "short.pbtxt"
    from stepnet import save
    save(plan, path)
    cwd = os.getcwd()
    os.chdir(ROOT)  # the plan's data paths are relative to the repository root, as Caffe2 resolves them
    try:
        checkpoint = ROOT / build.CHECKPOINT
        assert main(["run", str(path)]) == 0
        out = capsys.readouterr().out
        losses = [float(x) for x in re.findall(r"^iteration \d+/60: train_loss = ([\d.]+)$", out, re.M)]
        heldout = float(re.search(r"^iteration 60/60: heldout_loss = ([\d.]+)$", out, re.M).group(1))
        assert len(losses) == 2 and losses[1] < losses[0] < np.log(65) + 0.1
        assert heldout < np.log(65)
        assert checkpoint.exists()
        sample = build.sample_plan(vocab, 64, 50)
        save(sample, tmp_path / "sample.pbtxt")
        assert main(["run", str(tmp_path / "sample.pbtxt"), "--load", str(checkpoint)]) == 0
        text = capsys.readouterr().out.split("iteration 50/50: text:\n", 1)[1]
        assert len(text) >= 50 and set(text.rstrip("\n")) <= set(vocab)
    finally:
        os.chdir(cwd)
        (ROOT / build.CHECKPOINT).unlink(missing_ok=True)


def numpy_heldout_loss(w: dict, hidden: int) -> float:
    """The held-out loss written out in float64: every held-out batch in order, the LSTM state carried from
    batch to batch (prepare_state), the mean cross-entropy per batch, then the mean over the batches."""
    sys.path.insert(0, str(ROOT / "tests" / "rnn"))
    from reference import lstm_forward

    db = minidb.MiniDB(ROOT / build.HELDOUT_DB)
    h = c = np.zeros((32, hidden))
    losses = []
    for k in range(len(db)):
        batch = minidb.parse_tensor_protos(db.value(k), "")[0].astype(np.int64)   # 26 x 32 character ids
        x = np.eye(65)[batch[:-1]]
        h_all, c_all, _ = lstm_forward(x, h, c, w["LSTM/i2h_w"], w["LSTM/i2h_b"], w["LSTM/gates_t_w"],
                                       w["LSTM/gates_t_b"])
        h, c = h_all[-1], c_all[-1]
        logits = h_all @ w["logits_w"].T + w["logits_b"]
        logp = logits - logits.max(axis=2, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(axis=2, keepdims=True))
        target = batch[1:]
        losses.append(-np.take_along_axis(logp, target[:, :, None], axis=2).mean())
    return float(np.mean(losses))


def test_iterations_are_optimizer_steps_and_heldout_is_the_mean_over_its_batches(tmp_path, capsys):
    """`--iterations 1` is one optimizer step of the 8 x 250 plan, and the held-out loss is the mean over every
    held-out batch (the plan once divided a sum over the batches it ran by a fixed 139, and --iterations cut
    that loop to one batch): equal to a numpy recomputation from the trained weights."""
    from stepnet import Workspace, save
    from stepnet.io import checkpoints

    vocab = build.vocabulary((ROOT / build.TEXT).read_text())
    path, ck, metrics = tmp_path / "plan.pbtxt", tmp_path / "ck.minidb", tmp_path / "m.csv"
    save(build.train_plan(vocab, 32, 25, 16, 2000, 250, 5e-3, 5.0), path)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert main(["run", str(path), "--iterations", "1", "--checkpoint", str(ck), "--metrics", str(metrics)]) == 0
    finally:
        os.chdir(cwd)
        (ROOT / build.CHECKPOINT).unlink(missing_ok=True)
    out, err = capsys.readouterr()
    assert "--iterations 1: 1 iterations of 'train' > 'train_steps' (the plan has 8 x 250 = 2000)" in err
    ws = Workspace()
    checkpoints.load(ws, ck)
    assert int(ws.fetch("optimizer_iteration")[0]) == 1
    assert float(ws.fetch("heldout_count")) == len(minidb.MiniDB(ROOT / build.HELDOUT_DB)) == 139
    w = {n: ws.fetch(n).astype(np.float64) for n in ("LSTM/i2h_w", "LSTM/i2h_b", "LSTM/gates_t_w",
                                                     "LSTM/gates_t_b", "logits_w", "logits_b")}
    expected = numpy_heldout_loss(w, 16)
    assert 3.5 < expected < 4.5                             # one step from random weights: about log(65)
    printed = float(re.search(r"^iteration 1/1: heldout_loss = (\S+)$", out, re.M).group(1))
    assert abs(printed - expected) < 1e-4 * expected
    rows = metrics.read_text().splitlines()
    assert rows[0] == "iteration,name,value" and rows[1].startswith("1,train_loss,")
    assert rows[2].startswith("1,heldout_loss,") and abs(float(rows[2].split(",")[2]) - expected) < 1e-4 * expected
