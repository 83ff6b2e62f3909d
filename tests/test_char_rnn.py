"""char-rnn (spec §8) from the committed plan files: data read inside the plan, loss falls, checkpoint, sampling."""
import os
import re
import sys
from pathlib import Path

import numpy as np

from stepnet import load, minidb
from stepnet.cli import main

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
        losses = [float(x) for x in re.findall(r"Tensor train_loss of type float32\. Dims: \(\): ([\d.]+)", out)]
        heldout = float(re.search(r"Tensor heldout_loss of type float32\. Dims: \(\): ([\d.]+)", out).group(1))
        assert len(losses) == 2 and losses[1] < losses[0] < np.log(65) + 0.1
        assert heldout < np.log(65)
        assert checkpoint.exists()
        sample = build.sample_plan(vocab, 64, 50)
        save(sample, tmp_path / "sample.pbtxt")
        assert main(["run", str(tmp_path / "sample.pbtxt"), "--load", str(checkpoint)]) == 0
        text = capsys.readouterr().out.split("Dims: (1,): ", 1)[1]
        assert len(text) >= 50 and set(text.rstrip("\n")) <= set(vocab)
    finally:
        os.chdir(cwd)
        (ROOT / build.CHECKPOINT).unlink(missing_ok=True)
