"""`stepnet export-predict`: char-rnn trained for a few iterations, exported, and the pair run by `stepnet run`
against the plan's own nets on the same feed; sampling from the exported sampler against the sample plan; the
init net's fills; the weights as .npz; and one clear line for each bad input."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from stepnet.io import checkpoints, minidb
from stepnet import load, save
from stepnet.cli.run import main
from stepnet.export.predict import export, fill_op
from stepnet.runtime.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import build_char_rnn as build  # noqa: E402

WEIGHTS = ["LSTM/i2h_w", "LSTM/i2h_b", "LSTM/gates_t_w", "LSTM/gates_t_b", "logits_w", "logits_b"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(train plan, sample plan, checkpoint) of char-rnn (H=32) after 8 training iterations."""
    d = tmp_path_factory.mktemp("charrnn")
    vocab = build.vocabulary((ROOT / build.TEXT).read_text())
    plan = build.train_plan(vocab, 32, 25, 32, 8, 4, 5e-3, 5.0)
    steps = [s.name for s in plan.execution_step]
    del plan.execution_step[steps.index("save")]               # no checkpoint in the repository: --checkpoint
    heldout = plan.execution_step[steps.index("heldout_steps")]
    heldout.ClearField("should_stop_blob")                      # two held-out batches, not all of them
    heldout.num_iter = 2
    save(plan, d / "train.pbtxt")
    save(build.sample_plan(vocab, 32, 30), d / "sample.pbtxt")
    with _in(ROOT):   # the plan reads its data by paths relative to the repository root
        assert main(["run", str(d / "train.pbtxt"), "-q", "--checkpoint", str(d / "ckpt.minidb")]) == 0
    return d / "train.pbtxt", d / "sample.pbtxt", d / "ckpt.minidb"


class _in:
    def __init__(self, path):
        self.path, self.old = path, os.getcwd()

    def __enter__(self):
        os.chdir(self.path)

    def __exit__(self, *exc):
        os.chdir(self.old)


def plan_forward(plan_path, ckpt):
    """What the plan's own nets compute on their first training batch after loading the checkpoint: the
    batch, the state they start from and the softmax the loss reads (before any update)."""
    plan = load(plan_path)
    nets = {n.name: n for n in plan.network}
    with _in(ROOT):
        ws = Workspace(seed=0)
        ws.run_net_once(nets["char_rnn_init"])
        checkpoints.load(ws, ckpt)
        ws.run_net_once(nets["prepare_state"])
        ws.run_net_once(nets["char_rnn"])
    return {n: ws.fetch(n) for n in ("batch", "hidden_init", "cell_init", "softmax_reshaped")}


def test_exported_pair_computes_the_plans_forward(trained, tmp_path, capsys):
    train, _, ckpt = trained
    out = tmp_path / "pair"
    assert main(["export-predict", str(train), "--load", str(ckpt), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "outputs: softmax_reshaped" in said and "--feed batch=..." in said
    ref = plan_forward(train, ckpt)
    np.save(tmp_path / "batch.npy", ref["batch"])
    np.save(tmp_path / "h.npy", ref["hidden_init"])
    np.save(tmp_path / "c.npy", ref["cell_init"])
    assert np.abs(ref["hidden_init"]).max() > 0          # a carried state, fed to the pair as well
    assert main(["run", str(out / "init_net.pb"), str(out / "predict_net.pb"), "-q",
                 "--feed", f"batch={tmp_path / 'batch.npy'}", "--feed", f"LSTM/hidden_state_last={tmp_path / 'h.npy'}",
                 "--feed", f"LSTM/cell_state_last={tmp_path / 'c.npy'}", "--save", str(tmp_path / "y.npz")]) == 0
    got = np.load(tmp_path / "y.npz")["softmax_reshaped"]
    assert got.shape == (25 * 32, 65)
    np.testing.assert_allclose(got, ref["softmax_reshaped"], rtol=1e-6, atol=1e-7)

    predict, init = load(out / "predict_net.pb"), load(out / "init_net.pb")
    types = {op.type for op in predict.op}
    assert types == {"Copy", "Slice", "Cast", "Reshape", "OneHot", "FC", "RecurrentNetwork", "Softmax"}
    rnn = next(op for op in predict.op if op.type == "RecurrentNetwork")
    assert not {a.name for a in rnn.arg} & {"backward_step_net", "param", "outputs_with_grads"}
    assert list(predict.external_output) == ["softmax_reshaped"]
    assert "batch" in predict.external_input and set(WEIGHTS) <= set(predict.external_input)
    assert sorted(init.external_output) == sorted(set(predict.external_input) - {"batch"})
    saved = minidb.load_blobs(ckpt)
    fills = {op.output[0]: op for op in init.op}
    assert fills["logits_w"].type == "GivenTensorFill" and fills["vocab_size"].type == "GivenTensorInt64Fill"
    assert fills["seq_lengths"].type == "GivenTensorIntFill"
    ws = Workspace()
    ws.run_net_once(init)
    for name in WEIGHTS:   # the trained values, not the plan's initial fills
        np.testing.assert_array_equal(ws.fetch(name), saved[name])
    assert not np.any(ws.fetch("LSTM/hidden_state_last"))   # states start from the plan's own zero fill


def test_sampling_from_the_exported_pair_is_the_sample_plans(trained, tmp_path, capsys):
    _, sample, ckpt = trained
    out = tmp_path / "sampler"
    assert main(["export-predict", str(sample), "--load", str(ckpt), "-o", str(out), "--format", "pbtxt"]) == 0
    assert "outputs: generated, text" in capsys.readouterr().out   # the ids, and the `show` net's text of them
    assert main(["run", str(sample), "--load", str(ckpt), "--fetch", "generated", "--save",
                 str(tmp_path / "plan.npz"), "-q"]) == 0
    capsys.readouterr()
    assert main(["run", str(out / "init_net.pbtxt"), str(out / "predict_net.pbtxt"), "--iterations", "30",
                 "--save", str(tmp_path / "pair.npz")]) == 0
    printed = capsys.readouterr().out
    plan_ids, pair_ids = (np.load(tmp_path / f)["generated"] for f in ("plan.npz", "pair.npz"))
    assert pair_ids.shape == (30,) and pair_ids.max() < 65
    np.testing.assert_array_equal(pair_ids, plan_ids)   # same weights, state, seed: the same characters
    vocab = build.vocabulary((ROOT / build.TEXT).read_text())
    text = printed.split("text: shape (1,) text:\n", 1)[1]
    assert text.startswith("".join(vocab[i] for i in pair_ids) + "\nsaved 2 blob(s)")   # it decodes its ids


def test_npz_holds_the_weights(trained, tmp_path, capsys):
    train, _, ckpt = trained
    saved = minidb.load_blobs(ckpt)
    for target, path in ((tmp_path / "w.npz", tmp_path / "w.npz"), (tmp_path / "d", tmp_path / "d" / "params.npz")):
        assert main(["export-predict", str(train), "--load", str(ckpt), "-o", str(target), "--format", "npz"]) == 0
        assert f"wrote {path}" in capsys.readouterr().out
        with np.load(path) as z:
            for name in WEIGHTS:
                np.testing.assert_array_equal(z[name], saved[name])
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]   # atomic writes leave nothing behind


def test_fill_ops_keep_dtype_and_shape():
    ws = Workspace()
    values = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "d": np.array([0.5]), "i": np.int32(7),
              "l": np.array([[1], [2]], np.int64), "b": np.array([True, False]), "s": np.array([b"a", b"bc"], object),
              "u": np.arange(4, dtype=np.uint8), "e": np.zeros((0, 3), np.float32)}
    ws.run_net_once(load_net([fill_op(k, v) for k, v in values.items()]))
    for name, value in values.items():
        got = ws.fetch(name)
        assert np.asarray(got).shape == np.asarray(value).shape and np.asarray(got).dtype == np.asarray(value).dtype
        assert np.asarray(got).tolist() == np.asarray(value).tolist()


def load_net(ops):
    from stepnet import NetDef
    return NetDef(name="init", op=ops)


# ------------------------------------------------------------------------------------------- bad input
def test_bad_input_is_one_line(trained, tmp_path, capsys):
    train, _, ckpt = trained
    partial = tmp_path / "partial.minidb"
    minidb.save_blobs(partial, {k: v for k, v in minidb.load_blobs(ckpt).items() if k != "logits_w"})

    def error(*args):
        assert main(["export-predict", str(train), "--load", *map(str, args)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("stepnet: error: ")
        return err

    assert "has no blob 'logits_w', a parameter the predict net reads" in error(partial, "-o", tmp_path / "a")
    assert "output blob 'nope' is not produced" in error(ckpt, "-o", tmp_path / "b", "--outputs", "nope")
    assert "only a gradient, optimizer, loss or data op writes it" in error(ckpt, "-o", tmp_path / "b",
                                                                           "--outputs", "loss")
    (tmp_path / "file").write_text("x")
    assert "exists and is not a directory" in error(ckpt, "-o", tmp_path / "file")
    assert "has no network named 'nope'" in error(ckpt, "-o", tmp_path / "c", "--net", "nope")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "init_net.pb").symlink_to(tmp_path / "file")
    assert "it is a symbolic link" in error(ckpt, "-o", tmp_path / "d")
    assert (tmp_path / "file").read_text() == "x"


def test_python_api_picks_nets_and_outputs(trained):
    train, sample, ckpt = trained
    result = export(load(train), ckpt, nets=["eval"], outputs=["softmax"])
    assert result.predict.name == "eval" and list(result.predict.external_output) == ["softmax"]
    assert result.feeds == ["batch"] and "hidden_init" in result.params     # a state the checkpoint holds
    assert {op.type for op in result.predict.op} >= {"RecurrentNetwork", "Softmax"}
    sampler = export(load(sample), ckpt, outputs=["softmax"])
    types = [op.type for op in sampler.predict.op]
    assert "WeightedSample" in types and "Concat" not in types   # it writes `char`, which the next run reads


def test_int8_blobs_go_to_npz_only():
    from stepnet.core.errors import ArgumentError
    from stepnet.core.int8 import Int8Tensor

    q = Int8Tensor(np.array([1, 2, 3], np.uint8), 0.5, 1)
    with pytest.raises(ArgumentError, match="'q' is an Int8 tensor.*--format npz"):
        fill_op("q", q)


def test_int8_npz_holds_real_values(tmp_path):
    from stepnet.export.predict import Export, write_npz
    from stepnet.core.int8 import Int8Tensor

    path = write_npz(Export(None, None, {"q": Int8Tensor(np.array([1, 3], np.uint8), 0.5, 1)}, []), tmp_path / "q.npz")
    assert np.load(path)["q"].tolist() == [0.0, 1.0]


def test_npz_holds_blobs_whatever_their_names(tmp_path, capsys):
    """np.savez(file, **blobs) took a blob named 'file' for its own argument and one named 'allow_pickle' as a
    flag; names come from the model, so the archive is written member by member."""
    from stepnet.export.predict import Export, write_npz

    blobs = {"file": np.ones(2, np.float32), "allow_pickle": np.zeros(1), "a/b": np.arange(3)}   # '../x': refused
    with np.load(write_npz(Export(None, None, dict(blobs), []), tmp_path / "w.npz")) as z:
        assert sorted(z.files) == sorted(blobs) and z["file"].tolist() == [1.0, 1.0]
    net = tmp_path / "n.pbtxt"
    net.write_text('name: "n" op { type: "ConstantFill" output: "file" arg { name: "shape" ints: 2 } }\n'
                   'op { type: "ConstantFill" output: "allow_pickle" arg { name: "shape" ints: 1 } }\n')
    assert main(["run", str(net), "--fetch", "file", "allow_pickle", "--save", str(tmp_path / "r.npz"),
                 "-q"]) == 0
    with np.load(tmp_path / "r.npz") as z:
        assert sorted(z.files) == ["allow_pickle", "file"]


def conv_bn_model(is_test: bool):
    """data (N, 2, 5, 5) -> Conv -> SpatialBN -> Relu -> Dropout -> FC logits (-> SoftmaxWithLoss)."""
    from stepnet.builders.model import ModelBuilder

    m = ModelBuilder("cnn")
    x = m.relu(m.spatial_bn(m.conv("data", "c", 2, 3, 3, pad=1), "bn", 3, is_test=is_test), "r")
    logits = m.fc(m.dropout(x, "drop", 0.5, is_test=is_test), "logits", 3 * 5 * 5, 4)
    if not is_test:
        _, loss = m.net.SoftmaxWithLoss([logits, "label"], ["prob", "loss"])
        m.add_gradient_ops([loss])
        m.sgd(0.05)
    return m


def test_batch_norm_and_dropout_run_in_test_mode_with_trained_statistics(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(2.0, 3.0, (6, 2, 5, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "label.npy", rng.integers(0, 4, 6).astype(np.int32))
    save(conv_bn_model(False).to_plan(5), tmp_path / "cnn.pbtxt")
    ckpt = tmp_path / "cnn.minidb"
    assert main(["run", str(tmp_path / "cnn.pbtxt"), "-q", "--feed", f"data={tmp_path / 'x.npy'}", "--feed",
                 f"label={tmp_path / 'label.npy'}", "--checkpoint", str(ckpt)]) == 0
    assert main(["export-predict", str(tmp_path / "cnn.pbtxt"), "--load", str(ckpt), "-o", str(tmp_path / "m")]) == 0
    assert "outputs: logits" in capsys.readouterr().out
    predict = load(tmp_path / "m" / "predict_net.pb")
    bn = next(op for op in predict.op if op.type == "SpatialBN")
    drop = next(op for op in predict.op if op.type == "Dropout")
    for op in (bn, drop):
        assert len(op.output) == 1 and [a.i for a in op.arg if a.name == "is_test"] == [1]
    saved = minidb.load_blobs(ckpt)
    assert not np.allclose(saved["bn_rm"], 0)            # trained running mean, not the initial zeros
    ws = Workspace()
    ws.run_net_once(load(tmp_path / "m" / "init_net.pb"))
    np.testing.assert_array_equal(ws.fetch("bn_rm"), saved["bn_rm"])
    np.testing.assert_array_equal(ws.fetch("bn_riv"), saved["bn_riv"])
    for run in range(2):   # no dropout at inference: the same output every run
        assert main(["run", str(tmp_path / "m" / "init_net.pb"), str(tmp_path / "m" / "predict_net.pb"), "-q",
                     "--feed", f"data={tmp_path / 'x.npy'}", "--save", str(tmp_path / f"y{run}.npz")]) == 0
    got = [np.load(tmp_path / f"y{run}.npz")["logits"] for run in range(2)]
    np.testing.assert_array_equal(got[0], got[1])
    ref = Workspace()   # the same layers built for inference, fed the checkpoint
    for name, value in saved.items():
        if not name.startswith("__"):
            ref.feed(name, value)
    ref.feed("data", x)
    ref.run_net_once(conv_bn_model(True).net.proto())
    np.testing.assert_allclose(got[0], ref.fetch("logits"), rtol=1e-6, atol=1e-6)
