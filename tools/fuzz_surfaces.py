"""The fuzz campaign's families for the newer command-line surfaces (tools/fuzz_campaign.py picks them):
draw, export-onnx and run --engine onnxruntime, export-predict, plot, run --metrics --profile, and models with
collective, control-flow, Int8 and detection ops. Mutators are tests/fuzzing.py's and tests/fuzzing_surfaces.py's.

Each worker builds its assets once (a checkpoint of models/xor/plan.pbtxt; a small char-rnn training plan, H=8,
and its checkpoint) into a temporary directory; a case only reads them.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
XOR = "models/xor"
FAMILIES = {"draw": 8, "export-onnx": 8, "onnx-engine": 4, "export-predict": 6, "plot": 6, "metrics": 5,
            "collective": 6, "control": 6, "int8-detection": 6, "special-out": 3}
_ASSETS: dict = {}
DATA_FILES = ["models/data/char_rnn_train.minidb", "models/data/char_rnn_heldout.minidb",
              "models/binary_adder/train.minidb", "models/binary_adder/test.minidb"]


def assets() -> dict:
    """{"xor_ckpt", "char_plan", "char_ckpt"}: paths built once per process."""
    if _ASSETS:
        return _ASSETS
    sys.path.insert(0, str(ROOT / "models"))
    import build_char_rnn as build

    from stepnet import save
    from stepnet.cli.run import main

    d = Path(tempfile.mkdtemp(prefix="stepnet-fuzz-assets-"))
    atexit.register(shutil.rmtree, d, True)
    vocab = build.vocabulary((ROOT / build.TEXT).read_text())
    plan = build.train_plan(vocab, 32, 25, 8, 2, 1, 5e-3, 5.0)
    steps = [s.name for s in plan.execution_step]
    del plan.execution_step[steps.index("save")]
    heldout = plan.execution_step[steps.index("heldout_steps")]
    heldout.ClearField("should_stop_blob")
    heldout.num_iter = 1
    save(plan, d / "char_train.pbtxt")
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            for argv in (["run", f"{XOR}/plan.pbtxt", "-q", "-n", "2", "--checkpoint", str(d / "xor_ckpt.minidb")],
                         ["run", str(d / "char_train.pbtxt"), "-q", "--checkpoint", str(d / "char_ckpt.minidb")]):
                if main(argv) != 0:
                    raise RuntimeError(f"building the fuzz assets failed: stepnet {' '.join(argv)}")
    finally:
        os.chdir(old)
    for f in DATA_FILES:   # copies a case hard-links into its own models/ tree: inside its file root
        (d / "tree" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, d / "tree" / f)
    _ASSETS.update(xor_ckpt=d / "xor_ckpt.minidb", char_plan=d / "char_train.pbtxt", char_ckpt=d / "char_ckpt.minidb",
                   tree=d / "tree")
    return _ASSETS


def data_tree(workdir: Path) -> None:
    """Replace the case's models/ symlink (outside its file root once resolved) by a tree of the data files the
    char-rnn and binary-adder plans read, hard-linked (copied across file systems)."""
    (workdir / "models").unlink()
    for f in DATA_FILES:
        (workdir / f).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(assets()["tree"] / f, workdir / f)
        except OSError:
            shutil.copyfile(assets()["tree"] / f, workdir / f)


def _model(rng: random.Random, workdir: Path, msg, stem: str = "model", edit: float = 0.6, hostile: float = 0.4) -> str:
    """msg (edited, perhaps with hostile names) written into workdir; returns its file name."""
    import fuzzing
    import fuzzing_surfaces as fs

    if rng.random() < edit:
        fuzzing.edit_message(rng, msg)
    if rng.random() < hostile:
        for _ in range(rng.randint(1, 3)):
            fs.rename(rng, msg)
    data, suffix = fuzzing.serialize(rng, msg)
    (workdir / f"{stem}{suffix}").write_bytes(data)
    return f"{stem}{suffix}"


def _load(path) -> object:
    from stepnet.io import proto
    return proto.load(ROOT / path if not os.path.isabs(path) else path)


def make_case(family: str, rng: random.Random, workdir: Path) -> list[str]:
    import numpy as np

    import fuzzing
    import fuzzing_surfaces as fs
    from stepnet.io import proto

    a = assets()
    if family == "draw":
        seed = rng.choice([f"{XOR}/predict_net.pbtxt", f"{XOR}/plan.pbtxt", "pair", str(a["char_plan"]), "control",
                           "models/binary_adder/binary_adder.pbtxt", "tests/data/caffe2/squeeze_predict_net.pb"])
        if seed == "pair":
            files = [_model(rng, workdir, _load(f"{XOR}/init_net.pbtxt"), "init", 0.3),
                     _model(rng, workdir, _load(f"{XOR}/predict_net.pbtxt"), "predict")]
        else:
            msg = fs.control_net(rng) if seed == "control" else _load(seed)
            if seed == "control":
                fs.mutate_control(rng, msg)
            files = [_model(rng, workdir, msg, edit=0.0 if seed == "control" else 0.6)]
        out = rng.choice(["out.dot"] * 6 + ["out.svg"] * 3 + ["out.gv", "out.xyz", "out", "sub/out.dot", "OUT.DOT"])
        flags = rng.choice([[], [], ["--max-ops", str(rng.choice([0, 1, 3, -1, 600, 2**31]))], ["--backward"],
                            ["--collapse", rng.choice(["yes", "no"])],
                            ["--net", rng.choice(["xor_train", "char_rnn", "missing", "", fuzzing.MARK[1:]])]])
        return ["draw", *files, "-o", out, *flags]
    if family in ("export-onnx", "onnx-engine"):
        return _onnx_case(family, rng, workdir)
    if family == "export-predict":
        plan, ckpt = rng.choice([(f"{XOR}/plan.pbtxt", a["xor_ckpt"]), (str(a["char_plan"]), a["char_ckpt"]),
                                 (str(a["char_plan"]), a["xor_ckpt"])])
        name = _model(rng, workdir, _load(plan), "plan", 0.7, 0.3) if rng.random() < 0.7 else plan
        if rng.random() < 0.5:
            (workdir / "ckpt.minidb").write_bytes(fuzzing.mutate_minidb(rng, Path(ckpt).read_bytes()))
            ckpt = "ckpt.minidb"
        flags = rng.choice([[], [], ["--format", rng.choice(["pbtxt", "npz"])], ["--outputs", rng.choice(
            ["y", "pred", "softmax", ",", "missing", "X", "LSTM/hidden_t_last"])], ["--net", rng.choice(
                ["xor_train", "char_rnn", "char_rnn_init", "missing"])], ["--max-blob-bytes", "1K"]])
        out = rng.choice(["out", "out", "out.npz", "deep/er/out", "ckpt.minidb" if rng.random() < 0.5 else "."])
        return ["export-predict", name, "--load", str(ckpt), "-o", out, *flags]
    if family == "plot":
        (workdir / "m.csv").write_bytes(fs.hostile_csv(rng))
        out = rng.choice(["p.png"] * 5 + ["p.svg", "p.pdf", "p.xyz", "p", "p.jpg", "sub/p.png", "p.PNG"])
        names = rng.choice([[], [], ["--name", rng.choice(["loss", "", "missing", "n1", "a,b"])]])
        title = rng.choice([[], [], ["--title", rng.choice(fs.HOSTILE_NAMES[:12])], ["--title", "$\\frac{"]])
        return ["plot", "m.csv", "-o", out, *names, *title]
    if family == "metrics":
        plan = rng.choice([f"{XOR}/plan.pbtxt", str(a["char_plan"]), "models/binary_adder/binary_adder.pbtxt"])
        name = _model(rng, workdir, _load(plan), "plan", 0.8, 0.4)
        data_tree(workdir)
        flags = rng.choice([["--metrics", "m.csv", "--profile"], ["--metrics", "m.csv"], ["--profile"],
                            ["--metrics", "m.csv", "--profile", "-n", "1"]])
        return ["run", name, "-q", "-n", str(rng.choice([1, 2])), *flags]
    if family == "collective":
        name = _model(rng, workdir, fs.collective_net(rng), "net", 0.3, 0.2)
        return ["run", name, *rng.choice([[], ["--device", "emulate"], ["--fetch", "X"]])]
    if family == "control":
        net = fs.control_net(rng)
        fs.mutate_control(rng, net)
        name = _model(rng, workdir, net, "net", 0.0, 0.0)
        feed = rng.choice(["x=[[1.0, -2.0], [0.5, 3.0]]", "x=[1.0]", "x=[]", "x=[[1, 2]]:int64", "x=1e30"])
        return rng.choice([["run", name, "--feed", feed, "-q"], ["inspect", name, "--shapes", "--input", "x=2,2"],
                           ["draw", name, "-o", "c.dot"], ["run", name, "--feed", feed, "--profile", "-q"]])
    if family == "int8-detection":
        if rng.random() < 0.6:
            net, pool = fs.detection_net(rng)
        else:
            o, pool = fs.hostile_op(rng)
            net = proto.NetDef(name="hostile", op=[o], external_output=list(o.output)[:1])
        np.savez(workdir / "pool.npz", **pool)
        name = _model(rng, workdir, net, "net", 0.0, 0.1)
        return ["run", name, "--feed", "pool.npz", *rng.choice([[], ["--device", "emulate"], ["--check-nan"]])]
    return _special_out(rng, workdir)


def _onnx_case(family: str, rng: random.Random, workdir: Path) -> list[str]:
    import numpy as np

    import fuzzing
    import fuzzing_surfaces as fs
    from stepnet.io import proto

    kind = rng.choice(["xor", "xor", "plan", "one-op", "one-op", "one-op"])
    if kind == "one-op":
        o, pool = fuzzing.random_op(rng)
        net = proto.NetDef(name="one_op", op=[o], external_output=list(o.output)[:1])
        name = _model(rng, workdir, net, "net", 0.0, 0.1)
        if family == "onnx-engine":
            np.savez(workdir / "pool.npz", **pool)
            return ["run", name, "--feed", "pool.npz", "--engine", "onnxruntime", "-q"]
        inputs = [f"{b}={','.join(map(str, pool[b].shape))}:{pool[b].dtype}" for b in dict.fromkeys(o.input)
                  if b in pool]
        flags = [x for i in inputs for x in ("--input", i if rng.random() < 0.9 else fs.input_spec(rng))]
        return ["export-onnx", name, "-o", "out.onnx", *flags, *rng.choice([[], ["--opset", "13"], ["--opset", "7"]])]
    if kind == "plan":
        name = _model(rng, workdir, _load(f"{XOR}/plan.pbtxt"), "plan", 0.5, 0.3)
        if family == "onnx-engine":
            return ["run", name, "--engine", "onnxruntime", "-q", "-n", "1"]
        return ["export-onnx", name, "-o", "out.onnx", "--net", rng.choice(["xor_train", "xor_init", "missing"]),
                "--input", rng.choice(["X=4,2", "X", fs.input_spec(rng)])]
    which = rng.random()
    init = _model(rng, workdir, _load(f"{XOR}/init_net.pbtxt"), "init") if which < 0.4 else f"{XOR}/init_net.pbtxt"
    predict = (_model(rng, workdir, _load(f"{XOR}/predict_net.pbtxt"), "predict") if which > 0.3
               else f"{XOR}/predict_net.pbtxt")
    if family == "onnx-engine":
        feed = rng.choice(["X=[[1, 0]]", "X=[[1, 0], [0, 1]]", "X=[1, 0]", "X=[[1, 0]]:int64", "X=[[1e30, -1e30]]",
                           "X=" + fuzzing.random_literal(rng)])
        return ["run", init, predict, "--feed", feed, "--engine", "onnxruntime", "-q"]
    inputs = [x for _ in range(rng.randint(0, 2)) for x in ("--input", rng.choice(["X=1,2", "X=4,2", "X",
                                                                                   fs.input_spec(rng)]))]
    outs = rng.choice([[], [], ["--output", rng.choice(["hidden", "Y", "missing", "X", ""])]])
    opset = rng.choice([[], [], ["--opset", str(rng.choice([1, 6, 7, 13, 17, 99, -1, 2**40]))], ["--rnn", "scan"]])
    files = [init, predict] if rng.random() < 0.8 else [predict]
    return ["export-onnx", *files, "-o", rng.choice(["out.onnx"] * 5 + ["sub/out.onnx", "out"]), *inputs, *outs,
            *opset]


def _special_out(rng: random.Random, workdir: Path) -> list[str]:
    """An output path that is not a regular file: a FIFO, a symlink (to a file outside, or dangling), a
    directory, a device."""
    import fuzzing_surfaces as fs

    target = rng.choice(["fifo", "link", "dangling", "dir", "/dev/null", "/dev/full"])
    suffix = rng.choice([".dot", ".svg", ".png", ".csv", ".onnx", ".npz"])
    out = f"{target}{suffix}" if target[0] != "/" else target
    if target == "fifo":
        os.mkfifo(workdir / out)
    elif target == "link":
        (workdir / "outside").mkdir()
        (workdir / "outside" / "victim").write_bytes(b"keep")
        (workdir / out).symlink_to(workdir / "outside" / "victim")
    elif target == "dangling":
        (workdir / out).symlink_to(workdir / "nowhere" / "x")
    elif target == "dir":
        (workdir / out).mkdir()
    if suffix == ".csv":
        (workdir / "m.csv").write_bytes(fs.hostile_csv(random.Random(0)))
        return rng.choice([["run", f"{XOR}/plan.pbtxt", "-q", "-n", "1", "--metrics", out],
                           ["plot", "m.csv", "-o", out if out.endswith(".csv") else out]])
    if suffix == ".onnx":
        return ["export-onnx", f"{XOR}/init_net.pbtxt", f"{XOR}/predict_net.pbtxt", "-o", out, "--input", "X=1,2"]
    if suffix == ".npz":
        return ["export-predict", f"{XOR}/plan.pbtxt", "--load", str(assets()["xor_ckpt"]), "-o", out,
                "--format", "npz"]
    if suffix == ".png" and rng.random() < 0.5:
        (workdir / "m.csv").write_bytes(b"iteration,name,value\n1,loss,0.5\n")
        return ["plot", "m.csv", "-o", out]
    return ["draw", f"{XOR}/predict_net.pbtxt", "-o", out]
