"""Untrusted bytes reaching other programs (issue #24 § 5): names and strings from a model shown on a terminal
(Print, `run`'s result lines, `inspect`) and written to a spreadsheet (--metrics). Each case shows the hostile
input neutralised and normal input unchanged."""
import csv
from pathlib import Path

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.cli.metrics import MetricsWriter, cell, plot, read
from stepnet.cli.progress import Monitor
from stepnet.cli.run import format_blob, main
from stepnet.core.errors import one_line
from stepnet.io import proto
from stepnet.testing import make_op

XOR = Path(__file__).resolve().parents[1] / "models" / "xor"
TITLE, CLEAR = "\x1b]0;pwned\x07", "\x1b[2J\x1b[H"   # set the terminal's title; clear the screen
HIDDEN = "\u200b\u200f\u202e\u2066\ufeff"            # zero-width space, RTL mark, RTL override, isolate, BOM


@pytest.mark.parametrize("hostile, shown", [
    (TITLE, "\\x1b]0;pwned\\x07"), (CLEAR, "\\x1b[2J\\x1b[H"),
    ("a\nb\rc\x85d\u2028e\u2029", "a\\nb\\rc\\x85d\\u2028e\\u2029"),
    ("Re" + HIDDEN + "LU", "Re\\u200b\\u200f\\u202e\\u2066\\ufeffLU"), ("x\u00ady\U000e0041", "x\\xady\\U000e0041"),
])
def test_one_line_escapes_controls_zero_width_and_bidi(hostile, shown):
    assert one_line(hostile) == shown


@pytest.mark.parametrize("normal", ["train_loss", "gpu_0/fc_w", "tab\there", "é 中文 αβγ \u00a0nbsp", "a\\x1b", ""])
def test_one_line_leaves_normal_text_alone(normal):
    assert one_line(normal) == normal


def string_net(name: str, value: str) -> NetDef:
    nd = NetDef(name="n")
    nd.op.extend([make_op("GivenTensorStringFill", [], [name], shape=[1], values=[value.encode()]),
                  make_op("Print", [name], [])])
    nd.external_output.append(name)
    return nd


def test_print_escapes_the_blob_name_and_its_strings(capsys):
    Workspace().run_net_once(string_net(f"s{TITLE}", f"v{CLEAR}{HIDDEN}"))
    out = capsys.readouterr().out
    assert out == "Tensor s\\x1b]0;pwned\\x07 of type object. Dims: (1,): v\\x1b[2J\\x1b[H" \
        "\\u200b\\u200f\\u202e\\u2066\\ufeff\n"
    Workspace().run_net_once(string_net("words", "hello world"))
    assert capsys.readouterr().out == "Tensor words of type object. Dims: (1,): hello world\n"


def test_run_result_lines_escape_names_and_strings(tmp_path, capsys):
    path = tmp_path / "n.pb"
    proto.save(string_net(f"s{TITLE}", f"v{CLEAR}"), path)
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "s\\x1b]0;pwned\\x07: shape (1,) text:\nv\\x1b[2J\\x1b[H\n" in out
    assert format_blob(f"n{HIDDEN}", "t\x1b") == "n\\u200b\\u200f\\u202e\\u2066\\ufeff: string 't\\x1b'"
    assert format_blob("y", np.array([1.5, 2], np.float32)) == "y: shape (2,) float32 [1.5, 2. ]"


def test_monitor_escapes_reported_names_text_and_the_step(tmp_path):
    import io

    out, err = io.StringIO(), io.StringIO()
    m = Monitor(out=out, err=err, tty=True, clock=lambda: 0.0)
    m(f"steps{TITLE}", 1, 4)
    assert m.report(f"loss{CLEAR}", np.float32(2.5))
    assert m.report(f"sample{HIDDEN}", np.array([f"line one{TITLE}\nline two\u202e"], dtype=object))
    assert m.report("text", np.array(["first line\nsecond line"], dtype=object))   # generated text keeps its lines
    assert out.getvalue().splitlines() == [
        "iteration 1/4: loss\\x1b[2J\\x1b[H = 2.5", "iteration 1/4: sample\\u200b\\u200f\\u202e\\u2066\\ufeff:",
        "line one\\x1b]0;pwned\\x07", "line two\\u202e", "iteration 1/4: text:", "first line", "second line"]
    bar = err.getvalue().replace("\r\x1b[K", "")   # the bar's own control: clear the line before redrawing
    assert "\x1b" not in bar and "\x07" not in bar and "steps\\x1b]0;pwned\\x07 [" in bar


def test_inspect_escapes_zero_width_and_bidi_in_op_types(tmp_path, capsys):
    nd = NetDef(name="n")
    nd.op.extend([make_op(f"Re{HIDDEN}lu", ["x"], ["y"]), make_op("Relu", ["y"], ["z"])])
    nd.external_input.append("x")
    proto.save(nd, tmp_path / "n.pb")
    main(["inspect", str(tmp_path / "n.pb")])
    out = capsys.readouterr().out
    assert not any(c in out for c in HIDDEN)
    assert "ops by type: Relu×1, Re\\u200b\\u200f\\u202e\\u2066\\ufefflu×1\n" in out   # not two 'Relu's
    assert "unsupported ops (this build cannot run them): Re\\u200b\\u200f\\u202e\\u2066\\ufefflu×1" in out


FORMULAS = ['=HYPERLINK("http://evil","x")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1+1)*cmd|' /C calc'!A0",
            "\t=1+1", "'=quoted"]


def test_metrics_cells_never_start_a_formula_and_read_back_as_the_names(tmp_path):
    path = tmp_path / "m.csv"
    writer = MetricsWriter(path)
    for i, name in enumerate([*FORMULAS, f"loss{TITLE}", "train_loss", "acc-top1"]):
        writer.write(i, name, 0.5)
    writer.close()
    text = path.read_text()
    assert "\x1b" not in text and "\x07" not in text
    rows = list(csv.reader(text.splitlines()))[1:]
    assert [r[1] for r in rows] == ["'" + f for f in FORMULAS] + ["loss\\x1b]0;pwned\\x07", "train_loss", "acc-top1"]
    assert rows[-2] == ["7", "train_loss", "0.5"]             # a normal row as before
    assert list(read(path)) == [*FORMULAS, "loss\\x1b]0;pwned\\x07", "train_loss", "acc-top1"]
    assert plot(path, tmp_path / "m.png", ["=HYPERLINK(\"http://evil\",\"x\")", "train_loss"]) == 2


@pytest.mark.parametrize("name", ["loss", "a=b", "x+1", "top-1", "e@mail", "it's"])
def test_metrics_cells_of_normal_names_are_the_names(name):
    assert cell(name) == name


# --------------------------------------------------------------------------------------------- images
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 1 1\n0 0 moveto 1 1 lineto stroke\nshowpage\n%%EOF\n"


def image_file(path, fmt: str):
    from PIL import Image

    Image.new("RGB", (3, 2), (10, 20, 30)).save(path, format=fmt)
    return path


@pytest.fixture
def eps_reader(monkeypatch):
    """Pillow's EPS reader, watched: the list of files it was handed (it runs Ghostscript to decode them)."""
    Image = pytest.importorskip("PIL.Image")
    Image.init()
    factory, accept = Image.OPEN["EPS"]
    reached = []
    monkeypatch.setitem(Image.OPEN, "EPS", (lambda fp, name: reached.append(name) or factory(fp, name), accept))
    return reached


def test_an_image_feed_opens_only_the_format_its_suffix_names(tmp_path, eps_reader):
    from stepnet.core.errors import FileFormatError
    from stepnet.io.feeds import parse_feed

    (tmp_path / "x.png").write_bytes(EPS)
    with pytest.raises(FileFormatError, match=r"x\.png: not an image Pillow can read as PNG, the format its suffix"):
        parse_feed(f"X={tmp_path / 'x.png'}")
    assert eps_reader == []                                       # PostScript never reached the EPS reader
    image_file(tmp_path / "png.jpg", "PNG")
    with pytest.raises(FileFormatError, match=r"png\.jpg: not an image Pillow can read as JPEG"):
        parse_feed(f"X={tmp_path / 'png.jpg'}")
    for suffix, fmt in [(".png", "PNG"), (".bmp", "BMP"), (".gif", "GIF"), (".tiff", "TIFF"), (".ppm", "PPM")]:
        arr = parse_feed(f"X={image_file(tmp_path / ('ok' + suffix), fmt)}")["X"]
        assert arr.shape == (1, 2, 3, 3) and arr[0, 0, 0].tolist() == [10, 20, 30], suffix


def test_an_eps_named_png_is_one_line_on_the_command_line(tmp_path, capsys, eps_reader):
    (tmp_path / "x.png").write_bytes(EPS)
    pair = [str(XOR / "init_net.pbtxt"), str(XOR / "predict_net.pbtxt")]
    assert main(["run", *pair, "--feed", f"X={tmp_path / 'x.png'}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an image Pillow can read as PNG" in err and eps_reader == []


# --------------------------------------------------------------------------------------------- --save OUT.npz
def fills_net(*names: str) -> NetDef:
    nd = NetDef(name="n")
    nd.op.extend(make_op("ConstantFill", [], [n], shape=[2], value=1.0) for n in names)
    nd.external_output.extend(names)
    return nd


@pytest.mark.parametrize("name, why", [
    ("../../x", r"a part of it is empty or starts with '\.' \(an absolute path, '\.\.', a hidden file\)"),
    ("/etc/cron.d/x", "a part of it is empty or starts with"), (".bashrc", "a part of it is empty or starts with"),
    ("a/../../b", "a part of it is empty"), ("a\\..\\b", "it holds a backslash"),
    ("a\x1bb", "it holds a control, format or other unprintable character"), ("x" * 252, "256 bytes is over 255"),
])
def test_save_refuses_blob_names_that_are_no_safe_member(tmp_path, capsys, name, why):
    proto.save(fills_net("y", name), tmp_path / "n.pb")
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    assert main(["run", str(tmp_path / "n.pb"), "--save", str(work / "out.npz"), "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err
    assert err.startswith(f"stepnet: error: --save {work / 'out.npz'}: blob ")
    assert pytest.importorskip("re").search(f"cannot name a member of an .npz archive: {why}", err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "n.pb"]   # nothing written, anywhere


def test_save_keeps_scoped_names_and_feed_reads_them_back(tmp_path, capsys):
    proto.save(fills_net("y", "gpu_0/fc_w", "LSTM/cell_state_last"), tmp_path / "n.pb")
    assert main(["run", str(tmp_path / "n.pb"), "--save", str(tmp_path / "out.npz"), "-q"]) == 0
    with np.load(tmp_path / "out.npz", allow_pickle=False) as z:
        assert sorted(z.files) == ["LSTM/cell_state_last", "gpu_0/fc_w", "y"]
    from stepnet.io.feeds import parse_feed

    fed = parse_feed(str(tmp_path / "out.npz"))
    assert sorted(fed) == ["LSTM/cell_state_last", "gpu_0/fc_w", "y"] and fed["gpu_0/fc_w"].tolist() == [1.0, 1.0]


def test_save_stores_strings_without_pickles(tmp_path, capsys):
    proto.save(string_net("s", "hello"), tmp_path / "n.pb")
    assert main(["run", str(tmp_path / "n.pb"), "--save", str(tmp_path / "out.npz"), "-q"]) == 0
    with np.load(tmp_path / "out.npz", allow_pickle=False) as z:
        assert z["s"].dtype.kind == "S" and z["s"].tolist() == [b"hello"]
    from stepnet.io.feeds import parse_feed

    assert parse_feed(f"s={tmp_path / 'out.npz'}")["s"].tolist() == [b"hello"]   # --feed takes it back
    from stepnet.io.files import npz_bytes

    for value, kind in [("text", "U"), (np.array(["a", b"b"], dtype=object), "U"), (b"raw", "S")]:
        with np.load(pytest.importorskip("io").BytesIO(npz_bytes({"v": value})), allow_pickle=False) as z:
            assert z["v"].dtype.kind == kind


def test_npz_refuses_python_objects():
    from stepnet.core.errors import ArgumentError
    from stepnet.io.files import npz_bytes

    with pytest.raises(ArgumentError, match=r"blob 'o' holds Python objects \(dict, int\), which an .npz holds only "
                                            "as pickles; stepnet writes none"):
        npz_bytes({"o": np.array([{"a": 1}, 2, "s"], dtype=object)})
