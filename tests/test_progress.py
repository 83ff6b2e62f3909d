"""What `stepnet run` shows while a plan trains (stepnet/cli/progress.py), --metrics files and `stepnet plot`
(stepnet/cli/metrics.py)."""
import io
import sys

import numpy as np
import pytest

from stepnet.io import proto
from stepnet.cli.run import main
from stepnet.core.errors import StepnetError
from stepnet.cli.metrics import MetricsWriter, plot, read
from stepnet.cli.progress import Monitor, duration


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def monitor(tty: bool, **kw):
    clock, err, out = Clock(), io.StringIO(), io.StringIO()
    return Monitor(err=err, out=out, tty=tty, clock=clock, **kw), clock, err, out


def test_rate_is_measured_over_the_recent_window_not_since_creation():
    m, clock, _, _ = monitor(False, window=10.0)
    clock.t = 100.0                   # a slow start (binding, init nets) before the first iteration
    for i in range(1, 31):            # then 2 iterations per second
        m("train", i, 100)
        clock.t += 0.5
    assert m.rate() == pytest.approx(2.0)
    for i in range(31, 41):           # slower lately: 1 per second
        clock.t += 1.0
        m("train", i, 100)
    assert m.rate() == pytest.approx(1.0, rel=0.1)


def test_plain_lines_every_interval_with_count_rate_eta_and_loss():
    m, clock, err, out = monitor(False, interval=10.0)
    for i in range(1, 101):           # 4 iterations per second for 25 s
        clock.t = i / 4
        m("steps", i, 100)
        if i == 20:
            assert m.report("train_loss", np.float32(2.5))
    lines = err.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/100", "41/100", "81/100", "100/100"]   # 10 s apart
    assert lines[0] == "progress: 1/100 iterations (1 %)"
    assert lines[1] == "progress: 41/100 iterations (41 %), 4.0 it/s, ETA 15 s, train_loss 2.5"
    assert lines[3] == "progress: 100/100 iterations (100 %), 4.0 it/s, train_loss 2.5"
    assert out.getvalue() == "iteration 20/100: train_loss = 2.5\n"


def test_terminal_bar_shows_the_overall_count_and_redraws_after_results():
    m, clock, err, out = monitor(True)
    for i in range(1, 11):
        clock.t = i
        m("inner", i, 20)
    assert err.getvalue().endswith("\r\x1b[Kinner [############............] 10/20 iterations (50 %), 1.0 it/s, "
                                   "ETA 10 s")
    m.report("loss", np.array([0.25], np.float32))
    assert out.getvalue() == "iteration 10/20: loss = 0.25\n"
    assert err.getvalue().endswith("ETA 10 s, loss 0.25")      # cleared for the line, then drawn again
    m.close()
    assert err.getvalue().endswith("\n")


def test_quiet_shows_no_progress_but_results_and_only_scalars_are_taken():
    m, clock, err, out = monitor(False, show=False)
    m("t", 1, 2)
    assert err.getvalue() == ""
    assert m.report("acc", np.float64(0.5)) and out.getvalue() == "iteration 1/2: acc = 0.5\n"
    assert m.report("text", np.array(["ab\ncd"], dtype=object))
    assert out.getvalue().endswith("iteration 1/2: text:\nab\ncd\n")
    assert not m.report("texts", np.array(["a", "b"], dtype=object))
    assert not m.report("w", np.zeros((2, 2), np.float32))


def test_duration():
    assert [duration(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]


def test_metrics_rows_are_flushed_as_written(tmp_path):
    w = MetricsWriter(tmp_path / "m.csv")
    w.write(250, "train_loss", np.float32(1.5))
    assert (tmp_path / "m.csv").read_text() == "iteration,name,value\n250,train_loss,1.5\n"   # before close
    w.close()
    assert read(tmp_path / "m.csv") == {"train_loss": ([250], [1.5])}


PLAN = """name: "p"
network { name: "init"
  op { type: "ConstantFill" output: "it" arg { name: "shape" ints: 1 } arg { name: "value" i: 0 }
       arg { name: "dtype" i: 10 } } }
network { name: "tick" op { type: "Iter" input: "it" output: "it" } }
network { name: "report" op { type: "Cast" input: "it" output: "loss" arg { name: "to" i: 1 } }
          op { type: "Print" input: "loss" } }
execution_step { name: "init" network: "init" }
execution_step { name: "epochs" num_iter: 3 substep { name: "steps" network: "tick" num_iter: 4 }
                 substep { name: "rep" network: "report" } }
"""


def test_run_labels_results_writes_metrics_and_says_what_iterations_set(tmp_path, capsys):
    path, csv = tmp_path / "p.pbtxt", tmp_path / "m.csv"
    path.write_text(PLAN)
    assert main(["run", str(path), "--iterations", "6", "--metrics", str(csv)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["iteration 4/6: loss = 4", "iteration 6/6: loss = 6"]
    assert err.splitlines()[0] == "--iterations 6: 6 iterations of 'epochs' > 'steps' (the plan has 3 x 4 = 12)"
    assert "progress: 6/6 iterations (100 %)" in err
    assert read(csv) == {"loss": ([4, 6], [4.0, 6.0])}
    assert main(["run", str(path), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.splitlines()[-1] == "iteration 12/12: loss = 12"


def test_run_says_where_the_plans_save_op_wrote(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = PLAN + 'network { name: "save" op { type: "Save" input: "it" arg { name: "db" s: "ck.minidb" } ' \
                  'arg { name: "db_type" s: "minidb" } } }\nexecution_step { name: "save" network: "save" }\n'
    (tmp_path / "p.pbtxt").write_text(plan)
    assert main(["run", "p.pbtxt"]) == 0
    assert "the model wrote ck.minidb (48 bytes) by net 'save', op #0 (Save)" in capsys.readouterr().out


def test_plot_draws_every_curve(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    csv = tmp_path / "m.csv"
    csv.write_text("iteration,name,value\n250,train_loss,2.0\n500,train_loss,1.8\n500,heldout_loss,1.9\n")
    assert main(["plot", str(csv), "-o", str(tmp_path / "loss.png")]) == 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plotted 2 curve(s)" in capsys.readouterr().out
    with pytest.raises(StepnetError, match="no values named 'acc'"):
        plot(csv, tmp_path / "x.png", ["acc"])


def test_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    (tmp_path / "m.csv").write_text("iteration,name,value\n1,loss,2\n")
    assert main(["plot", str(tmp_path / "m.csv"), "-o", str(tmp_path / "l.png")]) == 1
    assert capsys.readouterr().err == ("stepnet: error: stepnet plot needs matplotlib: "
                                       "pip install 'matplotlib>=3.5' (stepnet's `plots` extra)\n")


def test_metrics_target_must_be_a_regular_file(tmp_path):
    (tmp_path / "real.csv").write_text("keep")
    (tmp_path / "link.csv").symlink_to(tmp_path / "real.csv")
    for target in (tmp_path / "link.csv", tmp_path):
        with pytest.raises(StepnetError, match="not a regular file"):
            MetricsWriter(target)
    assert (tmp_path / "real.csv").read_text() == "keep"


def test_metrics_target_fifo_is_refused_without_blocking(tmp_path):
    import os
    os.mkfifo(tmp_path / "fifo.csv")   # opening a FIFO for writing blocks until a reader comes
    with pytest.raises(StepnetError, match="not a regular file"):
        MetricsWriter(tmp_path / "fifo.csv")


HEAD = b"iteration,name,value\n"


@pytest.mark.parametrize("data, message", [
    (HEAD + b"1," + b"n" * 200000 + b",1\n", r"m.csv, line 2: not a metrics file \(field larger than field limit"),
    (HEAD + b"1,a\rb,1\n", r"m.csv, line 2: expected iteration,name,value, got '1,a'"),
    (HEAD + str(2**62).encode() + b",loss,1\n", r"line 2: iteration 4611686018427387904 is not between 0 "),
    (HEAD + b"1,a,1e308\n2,b,-1e308\n", r"its values span -1e\+308 to 1e\+308, a range wider than a float"),
    (HEAD + b"".join(b"%d,n%d,1\n" % (i, i) for i in range(100)),
     r"values of 100 names, more than the 40 one plot draws \('n0', 'n1', .*\(90 more\)\); choose some with --name"),
])
def test_hostile_metrics_files_are_one_line(tmp_path, capsys, data, message):
    pytest.importorskip("matplotlib")
    import re
    (tmp_path / "m.csv").write_bytes(data)
    assert main(["plot", str(tmp_path / "m.csv"), "-o", str(tmp_path / "p.png")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("stepnet: error: ") and re.search(message, err[0]), err
    assert not (tmp_path / "p.png").exists()


def test_names_and_titles_are_drawn_literally(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    (tmp_path / "m.csv").write_text("iteration,name,value\n1,cost $x_{$,2\n2,_hidden,1\n")
    assert main(["plot", str(tmp_path / "m.csv"), "-o", str(tmp_path / "p.svg"), "--title", "$\\frac{$"]) == 0
    assert "plotted 2 curve(s)" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["link.png", "fifo.png", "dir.png", "p.xyz"])
def test_plot_target_must_be_a_regular_file_with_an_image_suffix(tmp_path, capsys, target):
    pytest.importorskip("matplotlib")
    import os
    (tmp_path / "m.csv").write_text("iteration,name,value\n1,loss,2\n")
    (tmp_path / "victim").write_text("keep")
    (tmp_path / "link.png").symlink_to(tmp_path / "victim")
    os.mkfifo(tmp_path / "fifo.png")
    (tmp_path / "dir.png").mkdir()
    assert main(["plot", str(tmp_path / "m.csv"), "-o", str(tmp_path / target)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and ("refusing to write there" in err[0] or "format comes from its suffix" in err[0]), err
    assert (tmp_path / "victim").read_text() == "keep" and (tmp_path / "link.png").is_symlink()


def test_not_a_metrics_file(tmp_path):
    (tmp_path / "m.csv").write_text("a,b\n")
    with pytest.raises(StepnetError, match="not a metrics file"):
        read(tmp_path / "m.csv")


def test_plan_with_print_in_python_keeps_caffe2_format(capsys):
    from stepnet import Workspace
    Workspace().run_plan(proto.parse_text(PLAN, "plan"), iterations=4)
    assert capsys.readouterr().out == "Tensor loss of type float32. Dims: (1,): 4\n"
