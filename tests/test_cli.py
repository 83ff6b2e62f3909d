"""The command line: run / inspect / convert, and one clear line for every bad input."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepnet import NetDef, load, save
from stepnet.cli.run import main
from stepnet.core.errors import ArgumentError
from stepnet.io.feeds import Dims, parse_dims
from stepnet.testing import make_op

ROOT = Path(__file__).resolve().parents[1]
XOR = ROOT / "models" / "xor"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "stepnet", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_run_plan_prints(capsys):
    assert main(["run", str(XOR / "plan.pbtxt"), "--fetch", "y"]) == 0
    out = capsys.readouterr().out
    assert "y: shape (4, 1) float32 [0., 1., 1., 0.]" in out


def test_run_init_and_predict_with_literal_feed(tmp_path, capsys):
    out = tmp_path / "out.npz"
    rc = main(["run", str(XOR / "init_net.pbtxt"), str(XOR / "predict_net.pbtxt"),
               "--feed", "X=[[1, 0], [1, 1]]", "--save", str(out)])
    assert rc == 0
    assert np.load(out)["y"].tolist() == [[1.0], [0.0]]
    assert "saved 1 blob(s)" in capsys.readouterr().out


def test_run_feed_npy_and_npz(tmp_path):
    np.save(tmp_path / "x.npy", np.array([[0, 1]], np.float32))
    np.savez(tmp_path / "x.npz", X=np.array([[1, 1]], np.float32))
    for feed in (f"X={tmp_path / 'x.npy'}", f"X={tmp_path / 'x.npz'}", str(tmp_path / "x.npz")):
        out = tmp_path / "o.npz"
        assert main(["run", str(XOR / "init_net.pbtxt"), str(XOR / "predict_net.pbtxt"), "--feed", feed,
                     "--save", str(out), "-q"]) == 0
        assert np.load(out)["y"].shape == (1, 1)


def test_module_entry_point_and_console_script():
    r = cli("run", XOR / "plan.pbtxt", "--fetch", "y")
    assert r.returncode == 0, r.stderr
    assert "y: shape (4, 1) float32" in r.stdout


def test_inspect_lists_ops_and_unsupported(tmp_path, capsys):
    assert main(["inspect", str(XOR / "plan.pbtxt")]) == 0
    out = capsys.readouterr().out
    assert "plan 'xor_plan': 2 networks" in out and "FC×2" in out and "all ops supported" in out
    bad = tmp_path / "bad.pbtxt"
    bad.write_text('name: "b" op { type: "Reluu" input: "x" output: "y" } op { type: "Frobnicate" }')
    assert main(["inspect", str(bad)]) == 0
    out = capsys.readouterr().out
    assert "unsupported ops" in out and "Reluu×1 (did you mean Relu" in out and "Frobnicate×1" in out
    assert main(["inspect", str(bad), "--strict"]) == 1


def test_convert_round_trip(tmp_path):
    pb = tmp_path / "p.pb"
    txt = tmp_path / "p.pbtxt"
    assert main(["convert", str(XOR / "plan.pbtxt"), str(pb)]) == 0
    assert main(["convert", str(pb), str(txt)]) == 0
    assert load(txt) == load(XOR / "plan.pbtxt") == load(pb)


def one_error_line(r):
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("stepnet: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture
def files(tmp_path):
    good = (XOR / "predict_net.pbtxt").read_text()
    init_bytes = load(XOR / "init_net.pbtxt").SerializeToString()
    (tmp_path / "truncated.pb").write_bytes(init_bytes[: len(init_bytes) // 2])
    (tmp_path / "garbage.pb").write_bytes(os.urandom(256))
    (tmp_path / "syntax.pbtxt").write_text('name: "x"\nop {\n  type: "Relu"\n  input: x\n}\n')
    (tmp_path / "unknown.pbtxt").write_text(good.replace('"Relu"', '"Rleu"'))
    (tmp_path / "arity.pbtxt").write_text(good.replace('input: ["X", "W1", "b1"]', 'input: ["X", "W1"]'))
    (tmp_path / "argtype.pbtxt").write_text(good.replace('output: "y" }', 'output: "y" arg { name: "axis" f: 1.5 } }'))
    (tmp_path / "concat.pbtxt").write_text(
        'name: "c" op { type: "Concat" input: ["X", "W1"] output: ["c", "c_info"] arg { name: "axis" i: 0 } }')
    (tmp_path / "add.pbtxt").write_text('name: "a" op { type: "Add" input: ["X", "W2"] output: "s" }')
    return tmp_path


RUN_XOR = ["run", XOR / "init_net.pbtxt"]


@pytest.mark.parametrize("args, message", [
    (["run", "truncated.pb"], "truncated"),
    (["run", "garbage.pb"], "neither a NetDef nor a PlanDef|not a valid binary"),
    (["run", "syntax.pbtxt"], "line 4, column"),
    (["run", "nonexistent.pbtxt"], "no such file"),
    ([*RUN_XOR, "unknown.pbtxt", "--feed", "X=[[1,0]]"], "unknown operator type 'Rleu'.*did you mean Relu"),
    ([*RUN_XOR, "arity.pbtxt", "--feed", "X=[[1,0]]"], "FC takes 3 inputs, got 2"),
    ([*RUN_XOR, "argtype.pbtxt", "--feed", "X=[[1,0]]"], "argument 'axis' must be an integer"),
    ([*RUN_XOR, XOR / "predict_net.pbtxt"], "needs blobs.*X.*--feed"),
    ([*RUN_XOR, XOR / "predict_net.pbtxt", "--feed", "X=[[1,0,1]]"], r"FC.*X \(1, 3\)"),
    ([*RUN_XOR, "concat.pbtxt", "--feed", "X=[[1,0,1]]"], r"Concat.*X \(1, 3\) float32, W1 \(2, 2\)"),
    ([*RUN_XOR, "add.pbtxt", "--feed", "X=[[1,0,1]]"], r"Add.*\(1, 3\).*\(1, 2\)"),
    ([*RUN_XOR, XOR / "predict_net.pbtxt", "--feed", "X=missing.npy"], "no such file 'missing.npy'"),
    ([*RUN_XOR, XOR / "predict_net.pbtxt", "--feed", "X=[[1,0]]:flaot32"], "unknown dtype 'flaot32'.*float32"),
])
def test_bad_input_gives_one_line(files, args, message):
    import re
    r = subprocess.run([sys.executable, "-m", "stepnet", *map(str, args)], capture_output=True, text=True,
                       cwd=files, timeout=120)
    line = one_error_line(r)
    assert re.search(message, line), line


def test_save_into_missing_directory(tmp_path):
    r = cli(*RUN_XOR, XOR / "predict_net.pbtxt", "--feed", "X=[[1,0]]", "--save", tmp_path / "no" / "o.npz")
    assert "cannot write" in one_error_line(r)
    assert not (tmp_path / "no").exists()


def test_save_replaces_whole_file(tmp_path):
    out = tmp_path / "o.npz"
    out.write_bytes(b"old contents")
    assert main(["run", str(XOR / "init_net.pbtxt"), str(XOR / "predict_net.pbtxt"), "--feed", "X=[[0,1]]",
                 "--save", str(out), "-q"]) == 0
    assert np.load(out)["y"].tolist() == [[1.0]]
    assert [p.name for p in tmp_path.iterdir()] == ["o.npz"]


def test_convert_and_save_refuse_a_fifo_or_symlink_target(tmp_path, capsys):
    """`stepnet convert model.pbtxt /dev/null` replaced /dev/null as root; the same for FIFOs and links."""
    fifo, link = tmp_path / "pipe.pb", tmp_path / "link.npz"
    os.mkfifo(fifo)
    link.symlink_to(tmp_path / "elsewhere.npz")
    assert main(["convert", str(XOR / "predict_net.pbtxt"), str(fifo)]) == 1
    assert f"{fifo}: refusing to write there: it is a FIFO (named pipe)" in capsys.readouterr().err
    assert main(["run", str(XOR / "plan.pbtxt"), "--fetch", "y", "--save", str(link), "-q"]) == 1
    assert f"{link}: refusing to write there: it is a symbolic link" in capsys.readouterr().err
    assert fifo.is_fifo() and link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["link.npz",
                                                                                                  "pipe.pb"]


def test_debug_shows_traceback(files):
    r = subprocess.run([sys.executable, "-m", "stepnet", "--debug", "run", "garbage.pb"], capture_output=True,
                       text=True, cwd=files, timeout=120)
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_synth_init_then_run_and_inspect_shapes(tmp_path, capsys):
    predict = ROOT / "tests" / "data" / "caffe2" / "squeeze_predict_net.pb"
    init = tmp_path / "init.pb"
    assert main(["synth-init", str(predict), "-o", str(init), "--input", "data=1,3,224,224"]) == 0
    assert main(["inspect", str(predict), "--shapes", "--init", str(init), "--input", "data=1,3,224,224"]) == 0
    out = capsys.readouterr().out
    assert "conv10: (1, 1000, 13, 13) float32" in out and "softmaxout: (1, 1000, 1, 1) float32" in out
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
    saved = tmp_path / "o.npz"
    assert main(["run", str(init), str(predict), "--feed", f"data={x}", "--save", str(saved), "-q"]) == 0
    p = np.load(saved)["softmaxout"]
    assert p.shape == (1, 1000, 1, 1) and abs(float(p.sum()) - 1) < 1e-4


def test_static_shape_mismatch_is_reported_before_running(capsys):
    st = ROOT / "models" / "style_transfer"
    rc = main(["inspect", str(st / "crayon_predict.pb"), "--shapes", "--init", str(st / "crayon_init.pb"),
               "--input", "data_int8_bgra=1,30,30,4:uint8"])
    assert rc == 1
    assert "op #2 (PadImage" in capsys.readouterr().err
    assert main(["inspect", str(st / "crayon_predict.pb"), "--shapes", "--input", "x=1,a"]) == 1
    assert "--input 'x=1,a': expected NAME=D1,D2,...[:dtype], dims being non-negative integers" in (
        capsys.readouterr().err)


def test_checkpoint_then_load(tmp_path, capsys):
    ck = tmp_path / "ck.minidb"
    assert main(["run", str(XOR / "plan.pbtxt"), "--checkpoint", str(ck)]) == 0
    assert "checkpoint:" in capsys.readouterr().out
    # the checkpoint holds X, so the predict net needs no --feed
    assert main(["run", str(XOR / "init_net.pbtxt"), str(XOR / "predict_net.pbtxt"), "--load", str(ck)]) == 0
    assert "y: shape (4, 1) float32 [0., 1., 1., 0.]" in capsys.readouterr().out
    assert main(["run", str(XOR / "plan.pbtxt"), "--load", str(tmp_path / "missing.minidb")]) == 1
    assert "missing.minidb" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- NAME=DIMS
@pytest.mark.parametrize("text, want", [
    ("data=1,3,224,224", Dims("data", (1, 3, 224, 224))),
    ("gpu_0/data=2x3x8x8", Dims("gpu_0/data", (2, 3, 8, 8))),
    ("data=1, 3 ,2", Dims("data", (1, 3, 2))),
    ("ids=8:int64", Dims("ids", (8,), "int64")),
    ("img=1x30x30x4:uint8", Dims("img", (1, 30, 30, 4), "uint8")),
    ("b=", Dims("b", ())),
    ("s=:int32", Dims("s", (), "int32")),
    ("e=0,3", Dims("e", (0, 3))),
    ("a=b=1,2", Dims("a=b", (1, 2))),
])
def test_parse_dims(text, want):
    assert parse_dims(text) == want


@pytest.mark.parametrize("text, message", [
    ("data", "expected NAME=D1,D2,...[:dtype]"), ("=1,2", "expected NAME="), ("data=1,a", "expected NAME="),
    ("data=1,-2", "non-negative"), ("data=1.5", "expected NAME="), ("data=1,2:float", "unknown dtype 'float'"),
])
def test_parse_dims_rejects_with_one_message_format(text, message):
    with pytest.raises(ArgumentError) as error:
        parse_dims(text, "--param")
    assert str(error.value).startswith(f"--param {text!r}: ") and message in str(error.value)


@pytest.fixture
def gather_fc(tmp_path):
    """A predict net reading a float input x and int indices idx (Gather, then FC)."""
    net = NetDef(name="g", external_input=["x", "idx", "w", "b"], external_output=["y"])
    net.op.extend([make_op("Gather", ["x", "idx"], ["g"]), make_op("FC", ["g", "w", "b"], ["y"])])
    save(net, tmp_path / "net.pbtxt")
    return tmp_path / "net.pbtxt"


@pytest.mark.parametrize("x, idx", [("x=5,3", "idx=2:int32"), ("x=5x3", "idx=2:int64"), ("x=5, 3", "idx=2,:int32"),
                                    ("x=5,3:float32", "idx=2x:int64")])
def test_inspect_and_synth_init_accept_the_same_spellings(x, idx, gather_fc, tmp_path, capsys):
    init = tmp_path / "init.pbtxt"
    assert main(["synth-init", str(gather_fc), "-o", str(init), "--input", x, "--input", idx, "--classes", "4"]) == 0
    assert main(["inspect", str(gather_fc), "--shapes", "--init", str(init), "--input", x, "--input", idx]) == 0
    out = capsys.readouterr().out
    assert "x: (5, 3) float32" in out and "idx: (2,) int" in out and "y: (2, 4) float32" in out


@pytest.mark.parametrize("bad", ["x=5,a", "x=5,-3", "x5,3", "x=5,3:float"])
def test_inspect_and_synth_init_refuse_the_same_spellings_alike(bad, gather_fc, tmp_path, capsys):
    assert main(["inspect", str(gather_fc), "--shapes", "--input", bad]) == 1
    inspect_err = capsys.readouterr().err
    assert main(["synth-init", str(gather_fc), "-o", str(tmp_path / "i.pb"), "--input", bad]) == 1
    synth_err = capsys.readouterr().err
    assert inspect_err == synth_err and inspect_err.startswith(f"stepnet: error: --input {bad!r}: ")


def test_synth_init_param_takes_the_dims_grammar_but_no_dtype(gather_fc, tmp_path, capsys):
    init = tmp_path / "init.pbtxt"
    args = ["synth-init", str(gather_fc), "-o", str(init), "--input", "x=5,3", "--input", "idx=2:int32"]
    assert main([*args, "--param", "w=7x3"]) == 0
    shapes = {op.output[0]: list(a.ints) for op in load(init).op for a in op.arg if a.name == "shape"}
    assert shapes == {"w": [7, 3], "b": [7]}
    assert main([*args, "--param", "w=7,3:float32"]) == 1
    assert "--param 'w=7,3:float32': a parameter takes no dtype" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- hostile input
def deep_plan_text(levels: int) -> str:
    return 'name: "deep"\n' + "execution_step {\n" + "substep {\n" * (levels - 1) + 'name: "s"\n' + "}\n" * levels


def deep_plan_binary(levels: int) -> bytes:
    from stepnet.io.proto import PlanDef
    plan = PlanDef(name="deep")
    step = plan.execution_step.add()
    for _ in range(levels - 1):
        step = step.substep.add()
    step.name = "s"
    return plan.SerializeToString()


@pytest.fixture
def hostile(tmp_path):
    from stepnet.io.proto import NetDef as Net
    net = Net(name="n", external_input=["x"])
    net.op.add(type="Relu", input=["x"], output=["BAD!"])
    (tmp_path / "bad_utf8.pb").write_bytes(net.SerializeToString().replace(b"BAD!", b"B\xffD!"))
    (tmp_path / "deep.pbtxt").write_text(deep_plan_text(300))
    (tmp_path / "deep.pb").write_bytes(deep_plan_binary(300))
    (tmp_path / "ok100.pbtxt").write_text(deep_plan_text(100))
    np.save(tmp_path / "liar.npy", np.zeros((2, 3), np.float32))
    data = (tmp_path / "liar.npy").read_bytes().replace(b"(2, 3), ", b"(99999, 99999),")
    (tmp_path / "liar.npy").write_bytes(data)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.pb")
    return tmp_path


PREDICT = ["run", XOR / "init_net.pbtxt", XOR / "predict_net.pbtxt", "--feed"]


@pytest.mark.parametrize("args, message", [
    (["inspect", "bad_utf8.pb"], r"bad_utf8\.pb: op #0 \(Relu\) output\[0\] is not valid UTF-8"),
    (["run", "bad_utf8.pb"], r"bad_utf8\.pb: op #0 \(Relu\) output\[0\] is not valid UTF-8"),
    (["run", "deep.pbtxt"], r"deep\.pbtxt: line 102: messages are nested more than 100 levels deep"),
    (["run", "deep.pb"], r"deep\.pb: messages are nested more than 100 levels deep"),
    (["convert", "deep.pbtxt", "out.pb"], "nested more than 100 levels deep"),
    (["run", "/dev/zero"], r"/dev/zero: the model file is not a regular file \(a character device\)"),
    (["inspect", "fifo.pb"], r"fifo\.pb: the model file is not a regular file \(a FIFO\)"),
    (["run", "."], r"the model file is not a regular file \(a directory\)"),
    ([*PREDICT, "X=[[99999999999999999999999,1]]:int64"], "99999999999999999999999 does not fit int64"),
    ([*PREDICT, "X=[[1,2],[3]]"], "the list is ragged"),
    ([*PREDICT, "X=" + "[" * 200 + "1" + "]" * 200], "brackets nested 200 deep"),
    ([*PREDICT, "X=['a',1]"], "'a' is not a number"),
    ([*PREDICT, "X=liar.npy"], r"its header claims shape \(99999, 99999\)"),
    ([*PREDICT, "X=fifo.npy"], "no such file 'fifo.npy'"),
    (["run", XOR / "plan.pbtxt", "--load", "/dev/zero"], r"the minidb file is not a regular file \(a character"),
])
def test_hostile_input_gives_one_line(hostile, args, message):
    import re
    if "fifo" in str(args) and not (hostile / "fifo.pb").exists():
        pytest.skip("no FIFOs")
    if "/dev/zero" in map(str, args) and not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    r = subprocess.run([sys.executable, "-m", "stepnet", *map(str, args)], capture_output=True, text=True,
                       cwd=hostile, timeout=60)
    line = one_error_line(r)
    assert re.search(message, line), line


def test_a_plan_at_the_nesting_limit_runs_and_converts_both_ways(hostile):
    assert main(["run", str(hostile / "ok100.pbtxt"), "-q"]) == 0
    assert main(["convert", str(hostile / "ok100.pbtxt"), str(hostile / "ok100.pb")]) == 0
    assert main(["convert", str(hostile / "ok100.pb"), str(hostile / "back.pbtxt")]) == 0
    assert load(hostile / "back.pbtxt") == load(hostile / "ok100.pbtxt")
    assert main(["run", str(hostile / "ok100.pb"), "-q"]) == 0


@pytest.mark.parametrize("error", [RuntimeError("boom\nsecond line"), RecursionError("maximum recursion depth"),
                                   MemoryError(), KeyError("k"), UnicodeEncodeError("ascii", "é", 0, 1, "no")],
                         ids=lambda e: type(e).__name__)
def test_any_other_exception_is_one_internal_error_line(monkeypatch, capsys, error):
    from stepnet.io import proto

    def load_fails(*args, **kwargs):
        raise error
    monkeypatch.setattr(proto, "load", load_fails)
    assert main(["inspect", str(XOR / "plan.pbtxt")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"stepnet: internal error: {type(error).__name__}: ")
    assert err.endswith(" (rerun with --debug for the traceback)\n")
    assert main(["--debug", "inspect", str(XOR / "plan.pbtxt")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "in load_fails" in err and err.splitlines()[-1].startswith("stepnet: internal error")


def test_control_characters_quoted_from_a_file_stay_on_one_line(tmp_path):
    # the text parser quotes the offending line; a vertical tab, a form feed or an escape in it must not break
    # the message into lines or reach the terminal
    (tmp_path / "ctl.pbtxt").write_bytes(b'name: "x"\nop {\x0b\x0c\x1b[31m\xc2\x85 bogus }\n')
    r = cli("run", tmp_path / "ctl.pbtxt")
    line = one_error_line(r)
    assert "line 2" in line and "\\x0b\\x0c\\x1b[31m\\x85" in line


def test_run_threads_option(capsys):
    assert main(["run", str(XOR / "plan.pbtxt"), "--fetch", "y", "--threads", "2"]) == 0
    assert "y: shape (4, 1) float32" in capsys.readouterr().out
    r = cli("run", XOR / "plan.pbtxt", "--threads", "-1")
    assert r.returncode == 2 and "--threads needs a count >= 0, got '-1'" in r.stderr


def test_inspect_escapes_names_from_the_file(tmp_path, capsys):
    """inspect lists op types and blob names from the model on stdout: control characters are shown escaped."""
    from stepnet.cli.run import main

    evil = "x\x1b]0;pwned\x07\nforged"
    (tmp_path / "n.pbtxt").write_text(f'name: "n" external_input: {evil!r} external_output: {evil!r}\n'
                                      f'op {{ type: {evil!r} input: {evil!r} output: "y" }}\n'.replace("'", '"'))
    main(["inspect", str(tmp_path / "n.pbtxt")])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\nforged" not in out
    assert "x\\x1b]0;pwned\\x07\\nforged" in out


def test_fetch_repeated_adds_blobs(capsys):
    """--fetch A --fetch B prints both (argparse's default would keep only the last)."""
    assert main(["run", str(XOR / "plan.pbtxt"), "--fetch", "y", "--fetch", "X"]) == 0
    out = capsys.readouterr().out
    assert "y: shape (4, 1) float32" in out and "X: shape (4, 2) float32" in out
