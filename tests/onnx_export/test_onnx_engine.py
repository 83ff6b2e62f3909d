"""stepnet.export.onnx.engine: predict nets in onnxruntime, exported once per content (memory and disk cache),
with the thread count asked for; `stepnet run --engine auto`."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from stepnet import NetDef, Workspace  # noqa: E402
from stepnet.cli.run import main  # noqa: E402
from stepnet.export.onnx import engine  # noqa: E402
from stepnet.io import proto  # noqa: E402
from stepnet.testing import make_op  # noqa: E402

from test_onnx_export import INIT, PREDICT, xor  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, and no exports kept in memory from other tests."""
    monkeypatch.setenv("STEPNET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(engine, "_SESSIONS", {})
    return tmp_path / "cache"


def xor_workspace(x):
    init, predict = xor()
    ws = Workspace()
    ws.run_net_once(init)
    ws.feed("X", np.asarray(x, np.float32))
    return ws, predict


def reference(x):
    """XOR by stepnet's own engine (the predict net's math is checked against onnxruntime in test_onnx_export)."""
    ws, predict = xor_workspace(x)
    ws.run_net_once(predict)
    return ws.fetch("y")


def test_a_model_is_exported_once_then_loaded_from_memory_and_disk(fresh_cache):
    x = [[0, 1], [1, 1]]
    ws, predict = xor_workspace(x)
    net = engine.OnnxNet(ws, predict, ["X"])
    net.run()
    assert net.loaded_from == "export" and np.allclose(ws.fetch("y"), reference(x), atol=1e-6)
    assert len(list(fresh_cache.glob("*.onnx"))) == 1
    net.run()
    assert net.loaded_from == "memory"
    engine._SESSIONS.clear()                          # a new process: only the disk cache is left
    ws2, _ = xor_workspace(x)
    net2 = engine.OnnxNet(ws2, predict, ["X"])
    net2.run()
    assert net2.loaded_from == "disk" and np.array_equal(ws2.fetch("y"), ws.fetch("y"))


def test_the_key_follows_weights_input_shapes_and_the_net(fresh_cache):
    ws, predict = xor_workspace([[0, 1]])
    net = engine.OnnxNet(ws, predict, ["X"])
    net.run()
    ws.feed("X", np.array([[0, 1], [1, 0], [1, 1]], np.float32))   # another batch size: another export
    net.run()
    assert net.loaded_from == "export" and ws.fetch("y").shape == (3, 1)
    w = ws.fetch("W1")
    ws.feed("W1", w * -1.0)                                        # other weights: another export, their values
    net.run()
    assert net.loaded_from == "export"
    check, predict2 = xor_workspace([[0, 1], [1, 0], [1, 1]])
    check.feed("W1", w * -1.0)
    check.run_net_once(predict2)
    assert np.allclose(ws.fetch("y"), check.fetch("y"), atol=1e-6)
    assert len(list(fresh_cache.glob("*.onnx"))) == 3


def test_threads_are_onnxruntimes_intra_op_threads():
    for threads, want in ((1, 1), (2, 2)):
        engine._SESSIONS.clear()
        ws, predict = xor_workspace([[0, 1]])
        engine.OnnxNet(ws, predict, ["X"], threads=threads).run()
        (session, _), = engine._SESSIONS.values()
        options = session.get_session_options()
        assert (options.intra_op_num_threads, options.inter_op_num_threads) == (want, 1)


def test_a_damaged_cache_entry_is_exported_again(fresh_cache):
    ws, predict = xor_workspace([[1, 0]])
    engine.OnnxNet(ws, predict, ["X"]).run()
    entry, = fresh_cache.glob("*.onnx")
    entry.write_bytes(b"not a model")
    engine._SESSIONS.clear()
    net = engine.OnnxNet(ws, predict, ["X"])
    net.run()
    assert net.loaded_from == "export" and np.allclose(ws.fetch("y"), reference([[1, 0]]), atol=1e-6)
    assert entry.read_bytes() != b"not a model"


def test_the_cache_keeps_the_most_recent_entries(fresh_cache, monkeypatch):
    monkeypatch.setattr(engine, "CACHE_ENTRIES", 2)
    ws, predict = xor_workspace([[1, 0]])
    net = engine.OnnxNet(ws, predict, ["X"])
    for batch in (1, 2, 3):
        ws.feed("X", np.zeros((batch, 2), np.float32))
        net.run()
    assert len(list(fresh_cache.glob("*.onnx"))) == 2 and len(list(fresh_cache.glob("*.outputs"))) == 2


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("STEPNET_CACHE_DIR", str(tmp_path / "file" / "cache"))   # under a file: mkdir fails
    ws, predict = xor_workspace([[1, 1]])
    engine.OnnxNet(ws, predict, ["X"]).run()
    assert np.allclose(ws.fetch("y"), reference([[1, 1]]), atol=1e-6)


def test_run_engine_auto_takes_onnxruntime_for_a_predict_net(monkeypatch, capsys):
    calls = []
    run = engine.OnnxNet.run
    monkeypatch.setattr(engine.OnnxNet, "run", lambda self: calls.append(1) or run(self))
    args = ["run", str(INIT), str(PREDICT), "--feed", "X=[[0, 1], [1, 1]]"]
    assert main(args + ["--engine", "auto", "--iterations", "3"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "y: shape (2, 1) float32 [1., 0.]" and not out.err and calls == [1, 1, 1]
    assert main(args + ["--engine", "auto", "--profile"]) == 0 and calls == [1, 1, 1]   # a profile: stepnet's ops
    assert main(args + ["--engine", "stepnet"]) == 0 and calls == [1, 1, 1]


def test_run_engine_auto_falls_back_quietly(tmp_path, capsys):
    init, net = xor()
    net.op.append(make_op("LengthsTile", ["y", "len"], ["s"]))     # no ONNX counterpart
    net.external_input.append("len")
    net.external_output.append("s")
    proto.save(net, tmp_path / "p.pbtxt")
    assert main(["run", str(INIT), str(tmp_path / "p.pbtxt"), "--feed", "X=[[0, 1], [1, 1]]", "--feed",
                 "len=[1, 1]:int32", "--engine", "auto"]) == 0
    out = capsys.readouterr()
    assert not out.err and "y: shape (2, 1) float32 [1., 0.]" in out.out
    plan = NetDef(name="unused")
    assert plan.name == "unused"
