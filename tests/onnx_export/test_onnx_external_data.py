"""Weights over what one .onnx file holds (protobuf's 2 GiB; exporter.MAX_INLINE_BYTES, lowered here so no test
allocates gigabytes): refused with one line naming the size and --external-data before anything is serialized;
with --external-data written beside the model as ONNX external data, whole or not at all."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from stepnet.cli.run import main  # noqa: E402
from stepnet.core.errors import FileFormatError  # noqa: E402
from stepnet.export.onnx import ExportError, exporter  # noqa: E402

XOR = Path(__file__).resolve().parents[2] / "models" / "xor"
ARGS = [str(XOR / "init_net.pbtxt"), str(XOR / "predict_net.pbtxt"), "--input", "X=4,2"]
X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(exporter, "MAX_INLINE_BYTES", 32)


def run(path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"X": X})[0]


def test_weights_over_the_limit_are_one_line_naming_the_size_and_the_flag(small_limit, tmp_path, capsys):
    out = tmp_path / "xor.onnx"
    assert main(["export-onnx", *ARGS, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stepnet: error: the model's weights take ")
    assert "more than one ONNX file holds (32 bytes" in err and "--external-data" in err
    assert list(tmp_path.iterdir()) == []


def test_the_size_is_checked_before_any_tensor_is_made(small_limit, monkeypatch):
    def no_copy(*_):
        raise AssertionError("an initializer was built")
    monkeypatch.setattr(exporter, "to_tensor", no_copy)
    with pytest.raises(ExportError, match="--external-data"):
        exporter.export_onnx(XOR / "predict_net.pbtxt", XOR / "init_net.pbtxt", inputs={"X": (4, 2)})


def test_external_data_writes_the_weights_beside_the_model(small_limit, tmp_path, capsys):
    inline = tmp_path / "inline.onnx"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exporter, "MAX_INLINE_BYTES", 2**31)
        assert main(["export-onnx", *ARGS, "-o", str(inline)]) == 0
    out = tmp_path / "xor.onnx"
    (tmp_path / "xor.onnx.data").write_bytes(b"stale" * 1000)   # replaced, never appended to
    assert main(["export-onnx", *ARGS, "-o", str(out), "--external-data"]) == 0
    assert f"wrote {out} (weights in {out}.data)" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inline.onnx", "xor.onnx", "xor.onnx.data"]
    weights = sum(len(t.raw_data) for t in onnx.load(inline).graph.initializer)
    assert 32 < weights == (tmp_path / "xor.onnx.data").stat().st_size
    held = onnx.load(out, load_external_data=False).graph.initializer
    assert held and all(t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data for t in held)
    np.testing.assert_array_equal(run(out), run(inline))


def test_an_external_write_that_cannot_finish_leaves_the_old_files(tmp_path):
    out = tmp_path / "xor.onnx"
    out.write_bytes(b"old")
    (tmp_path / "xor.onnx.data").mkdir()
    result = exporter.export_onnx(XOR / "predict_net.pbtxt", XOR / "init_net.pbtxt", inputs={"X": (4, 2)},
                                  external_data=True)
    with pytest.raises(FileFormatError, match="xor.onnx.data: refusing to write there: it is a directory"):
        result.save(out)
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["xor.onnx", "xor.onnx.data"]
