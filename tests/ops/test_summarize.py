"""Summarize (stepnet/ops/summarize.py) against statistics written from Caffe2's kernel (float64 loops) on every
device: the returned [min, max, mean, std], the lines to_file writes under the root folder (one per run, the
file emptied by a new op), the op without output; bad inputs; a broken kernel caught."""
import math
import re

import numpy as np
import pytest

from stepnet import Limits, NetDef, Workspace
from stepnet.core.errors import DTypeError, FileAccessError, GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op

rng = np.random.default_rng(5)


def summary_ref(x):
    """min, max, mean and the unbiased standard deviation, accumulated one value at a time in float64."""
    values = [float(v) for v in np.asarray(x, np.float32).reshape(-1)]
    n = len(values)
    mean = 0.0
    for v in values:
        mean += v / n
    var = sum((v - mean) ** 2 for v in values)
    return [min(values), max(values), mean, 0.0 if n == 1 else math.sqrt(var / (n - 1))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 4, 2)])
def test_statistics(shape, device):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    y = run_op("Summarize", [x], 1, device=device)
    assert y.dtype == np.float32 and y.shape == (4,)
    np.testing.assert_allclose(y, summary_ref(x), rtol=1e-6, atol=1e-7)


def test_by_hand():
    y = run_op("Summarize", [np.array([[1, 2], [3, 6]], np.float32)], 1)
    np.testing.assert_allclose(y, [1, 6, 3, math.sqrt(14 / 3)], rtol=1e-7)   # deviations -2 -1 0 3
    assert run_op("Summarize", [np.array([-2.5], np.float32)], 1).tolist() == [-2.5, -2.5, -2.5, 0.0]


def test_to_file_writes_a_line_per_run_under_the_root_folder(tmp_path):
    ws = Workspace(limits=Limits(trusted=True))   # a Python program's paths: its own choice, as in Caffe2
    ws.root_folder = str(tmp_path)
    net = NetDef(name="s")
    net.op.append(make_op("Summarize", ["scope/w"], [], to_file=1))
    batches = [rng.standard_normal(6).astype(np.float32) for _ in range(3)]
    ws.feed("scope/w", batches[0])
    created = ws.create_net(net)
    for x in batches:
        ws.feed("scope/w", x)
        created.run()
    lines = (tmp_path / "scope#w.summary").read_text().splitlines()
    assert len(lines) == 3
    for line, x in zip(lines, batches):
        numbers = [float(v) for v in line.split(" ")]
        np.testing.assert_allclose(numbers, summary_ref(x), rtol=1e-5)     # 6 significant digits
        assert all(len(re.sub(r"e.*|[-.]", "", v).lstrip("0")) <= 6 for v in line.split(" "))
    ws.create_net(net, overwrite=True).run()                              # a new op empties the file first
    assert len((tmp_path / "scope#w.summary").read_text().splitlines()) == 1
    assert ws.fetch("scope/w") is not None and not (tmp_path / "scope").exists()


def test_to_file_and_output_without_a_root_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    y = run_op("Summarize", [np.array([1, 2, 4], np.float32)], ["stats"], ws=Workspace(limits=Limits(trusted=True)),
               to_file=1)
    assert (tmp_path / "in0.summary").read_text() == "1 4 2.33333 1.52753\n"
    np.testing.assert_allclose(y, [1, 4, 7 / 3, math.sqrt(7 / 3)], rtol=1e-7)


def test_a_model_files_summary_meets_the_write_rules(tmp_path, monkeypatch):
    """Campaign seed 9 case 6285: a model file's Summarize(to_file=1) wrote in0.summary wherever the model ran;
    under a model file's limits a `.summary` file is refused as any file another program might read, and nothing
    is written (a Python program's limits are trusted: the test above)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileAccessError, match=r"Summarize\): db path './in0.summary': a model may not write there: "
                                              r"its suffix '.summary' is not a database's"):
        run_op("Summarize", [np.array([1, 2, 4], np.float32)], ["stats"], ws=Workspace(), to_file=1)
    assert list(tmp_path.iterdir()) == []


def test_inference_and_bad_inputs():
    got = infer_static("Summarize", [np.ones((2, 3), np.float32)], 1)
    assert (got[0].shape, got[0].dtype) == ((4,), np.float32)
    with pytest.raises(ShapeError, match=r"X of shape \(0, 3\) is empty"):
        run_op("Summarize", [np.ones((0, 3), np.float32)], 1)
    with pytest.raises(DTypeError, match="X has dtype float64; Summarize takes float32"):
        run_op("Summarize", [np.ones(2)], 1)
    with pytest.raises(GradientError):
        backward_ops([make_op("Summarize", ["x"], ["s"])], {"s": "g"})


def test_checker_catches_a_broken_kernel(broken):
    def biased(ctx, xp, x, *, to_file):                     # the biased standard deviation (divided by N)
        return np.array([x.min(), x.max(), x.mean(), x.std()], np.float32)
    broken("Summarize", biased)
    with pytest.raises(AssertionError):
        test_statistics((5,), "cpu")
