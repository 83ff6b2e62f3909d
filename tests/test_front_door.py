"""The small traps a new user met (issue #27, item 7), each as that user meets it: from the command line."""
import io
import os
import shutil
import struct

import numpy as np
import pytest

from stepnet import save
from stepnet.cli.progress import Monitor, bar_fits
from stepnet.cli.results import format_blob
from stepnet.cli.run import main
from stepnet.core.version import VERSION
from stepnet.testing import make_op
from stepnet.io.proto import NetDef, PlanDef

TEXT_NET = 'name: "tiny"\nop { type: "Relu" input: "a" output: "b" }\n'


def error_of(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err          # one line
    return err[0]


def test_unknown_op_names_net_op_index_and_type(tmp_path, capsys):
    net = NetDef(name="mynet", op=[make_op("Relu", ["a"], ["b"]), make_op("Reluu", ["b"], ["c"])])
    save(net, tmp_path / "n.pbtxt")
    err = error_of(capsys, ["run", str(tmp_path / "n.pbtxt"), "--feed", "a=1.0"])
    assert "net 'mynet', op #1 (Reluu): unknown operator type 'Reluu' (did you mean Relu" in err
    init = NetDef(name="init", op=[make_op("Fillz", [], ["w"])])
    save(init, tmp_path / "init.pbtxt")
    err = error_of(capsys, ["synth-init", str(tmp_path / "n.pbtxt"), "-o", str(tmp_path / "o.pb"),
                            "--input", "a=2"])
    assert "op #1 (Reluu)" in err


def test_text_file_named_pb_is_told_to_be_pbtxt(tmp_path, capsys):
    (tmp_path / "model.pb").write_text(TEXT_NET)
    err = error_of(capsys, ["run", str(tmp_path / "model.pb"), "--feed", "a=1.0"])
    assert "model.pb: not a valid binary NetDef or PlanDef, but it looks like text" in err and ".pbtxt" in err
    (tmp_path / "junk.pb").write_bytes(bytes(range(256)) * 4)   # binary junk gets no such hint
    err = error_of(capsys, ["run", str(tmp_path / "junk.pb")])
    assert "looks like text" not in err and "not a valid binary" in err


def test_missing_weights_suggest_load(tmp_path, capsys):
    net = NetDef(name="predict", op=[make_op("FC", ["x", "w", "b"], ["y"])])
    save(net, tmp_path / "p.pbtxt")
    err = error_of(capsys, ["run", str(tmp_path / "p.pbtxt"), "--feed", "x=[[1.0, 2.0]]"])
    assert "w, b" in err and "--load CKPT" in err
    plan = PlanDef(name="sample", network=[net])
    plan.execution_step.add(name="s", network=["predict"])
    save(plan, tmp_path / "plan.pbtxt")
    err = error_of(capsys, ["run", str(tmp_path / "plan.pbtxt")])
    assert "op #0 (FC): input blob 'x' does not exist" in err and "--load CKPT" in err


def test_unread_feed_and_input_names_are_refused_with_the_close_ones(tmp_path, capsys):
    (tmp_path / "m.pbtxt").write_text(TEXT_NET)
    err = error_of(capsys, ["run", str(tmp_path / "m.pbtxt"), "--feed", "a=1.0", "--feed", "aa=2.0"])
    assert "--feed 'aa': no op of the model reads that blob" in err and "did you mean a" in err
    err = error_of(capsys, ["inspect", str(tmp_path / "m.pbtxt"), "--shapes", "--input", "A=2,3"])
    assert "--input 'A': no op of the model reads that blob" in err
    assert main(["run", str(tmp_path / "m.pbtxt"), "--feed", "a=[-1.0, 2.0]", "-q"]) == 0   # a read name runs
    # a name only a nested net reads counts: the branch of an If reads `z`
    then = NetDef(name="then", op=[make_op("Relu", ["z"], ["out"])])
    outer = NetDef(name="outer", op=[make_op("If", ["cond"], [], then_net=then)])
    save(outer, tmp_path / "if.pbtxt")
    assert main(["run", str(tmp_path / "if.pbtxt"), "--feed", "cond=1:bool", "--feed", "z=[-3.0, 4.0]",
                 "--fetch", "out", "-q"]) == 0


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"stepnet {VERSION}"


def test_profile_says_it_times_every_op(tmp_path, capsys):
    (tmp_path / "m.pbtxt").write_text(TEXT_NET)
    assert main(["run", str(tmp_path / "m.pbtxt"), "--feed", "a=1.0", "--profile"]) == 0
    out, err = capsys.readouterr()
    assert "profiling: every op is timed" in err and "profile:" in out
    assert main(["run", str(tmp_path / "m.pbtxt"), "--feed", "a=1.0", "--profile", "-q"]) == 0
    assert "profiling" not in capsys.readouterr().err


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_no_redrawn_bar_when_stdout_is_a_pipe():
    """Under `stepnet run ... | tee log` stderr is the terminal and stdout a pipe: tee's copy of a result line
    reaches the screen after the bar was redrawn, so plain progress lines are written instead."""
    read, write = os.pipe()
    try:
        with os.fdopen(write, "w", closefd=False) as piped:
            assert not bar_fits(Tty(), piped)
            assert not Monitor(err=Tty(), out=piped).tty
        with open(os.devnull, "w") as file:
            assert bar_fits(Tty(), file)             # stdout to a file: nothing of it reaches the screen
        assert bar_fits(Tty(), io.StringIO()) and not bar_fits(io.StringIO(), io.StringIO())
    finally:
        os.close(read)
        os.close(write)
    err = Tty()
    monitor = Monitor(err=err, out=io.StringIO(), tty=False, clock=lambda: 0.0)
    monitor("train", 1, 10)
    assert err.getvalue() == "progress: 1/10 iterations (10 %)\n"      # a whole line, no \r


def test_a_fetched_string_prints_as_its_lines():
    text = np.array(["ab\ncd\x1b"], dtype=object)
    assert format_blob("text", text) == "text: shape (1,) text:\nab\ncd\\x1b"   # controls still escaped
    assert format_blob("ids", np.arange(3, dtype=np.int32)) == "ids: shape (3,) int32 [0, 1, 2]"


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (CI installs it)")


def png_size(path):
    return struct.unpack(">II", path.read_bytes()[16:24])


@needs_dot
def test_a_big_png_says_how_to_make_it_smaller_and_max_size_does(tmp_path, capsys):
    """A net of 60 ops in a row lays out ~60 ranks tall: over 4000 px at full-size text."""
    ops = [make_op("Relu", [f"x{i}"], [f"x{i + 1}"]) for i in range(60)]
    save(NetDef(name="tall", op=ops), tmp_path / "tall.pbtxt")
    assert main(["draw", str(tmp_path / "tall.pbtxt"), "-o", str(tmp_path / "big.png")]) == 0
    said = capsys.readouterr().out
    width, height = png_size(tmp_path / "big.png")
    assert height > 4000 and f"{width}×{height} px" in said and "--max-size PX" in said and "--net NAME" in said
    assert main(["draw", str(tmp_path / "tall.pbtxt"), "-o", str(tmp_path / "small.png"), "--max-size", "1500"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'small.png'}"
    w, h = png_size(tmp_path / "small.png")
    assert max(w, h) <= 1500 and h > 1400 and abs(w / h - width / height) < 0.02   # scaled, same proportions
