"""The export itself: bad input (one line naming the op or blob and the fix), the command line, the onnxruntime
engine, and what the export keeps, cuts, folds and leaves the caller's nets as."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from onnx_check import compare, one_op, ort_run  # noqa: E402

from stepnet import NetDef
from stepnet.io import proto
from stepnet.cli.run import main  # noqa: E402
from stepnet.core.errors import StepnetError  # noqa: E402
from stepnet.io.minidb import save_blobs  # noqa: E402
from stepnet.export.onnx import (
    ExportError, InputDimsError, MissingWeightError, OpsetError, UnsupportedOpError, default_opset, export_onnx)
from stepnet.export.onnx.table import markdown  # noqa: E402
from stepnet.testing import make_op  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
XOR = ROOT / "models" / "xor"
INIT, PREDICT = XOR / "init_net.pbtxt", XOR / "predict_net.pbtxt"
X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)


def xor():
    return proto.load(INIT, kind="net"), proto.load(PREDICT, kind="net")


# --------------------------------------------------------------------------------------------- bad input
def test_an_op_without_counterpart_is_refused_with_its_index_and_the_fix():
    net = NetDef(name="seg", external_input=["x", "len"], external_output=["y"])
    net.op.extend([make_op("Relu", ["x"], ["r"]), make_op("LengthsTile", ["r", "len"], ["y"])])
    with pytest.raises(UnsupportedOpError, match=r"^net 'seg', op #1 \(LengthsTile\): no ONNX counterpart; export "
                                                 r"the part before it instead \(--output r --output len\)"):
        export_onnx(net, inputs={"x": (4, 3), "len": np.array([1, 3], np.int32)})


@pytest.mark.parametrize("op, message", [
    (make_op("Relu", [], ["y"]), r"op #0 \(Relu\): Relu takes 1 inputs, got 0 \(none\)"),
    (make_op("FC", ["x", "w"], ["y"]), r"op #0 \(FC\): FC takes 3 inputs, got 2 \(x, w\)"),
    (make_op("Sigmoid", ["x"], ["y", "z"]), r"op #0 \(Sigmoid\): Sigmoid takes 1 outputs, got 2 \(y, z\)"),
])
def test_an_op_with_the_wrong_number_of_inputs_or_outputs_names_it(op, message):
    net = NetDef(name="bad", op=[op], external_input=["x"], external_output=["y"])
    with pytest.raises(StepnetError, match=r"^net 'bad', " + message):
        export_onnx(net, inputs={"x": (2, 2), **({"w": np.ones((2, 2), np.float32)} if "w" in op.input else {})})


@pytest.mark.parametrize("op, inputs, message", [
    (make_op("Slice", ["x"], ["y"], starts=[2**62, -1, -1], ends=[-1, 1, 0]), {"x": np.zeros(2, np.int32)},
     r"op #0 \(Slice\): starts/ends give 3 dimensions but the data has only 1"),
    (make_op("Scale", ["x"], ["y"], scale=-1.0), {"x": np.zeros((1, 4), np.uint8)},
     r"op #0 \(Scale\): Scale needs floating-point inputs: X must be a float tensor, got uint8"),
])
def test_an_op_its_record_refuses_is_refused_before_its_converter_runs(op, inputs, message):
    """Converters read shapes and arguments as the op record's checks leave them (an IndexError, an
    OverflowError before): the record's shape function runs first, with the executor's message."""
    net = NetDef(name="bad", op=[op], external_input=["x"], external_output=["y"])
    with pytest.raises(StepnetError, match=r"^net 'bad', " + message):
        export_onnx(net, inputs=inputs)


def test_an_input_without_dims():
    init, net = xor()
    with pytest.raises(InputDimsError, match=r"^net 'xor_predict': input 'X' \(read by op #0 \(FC\) input 0\) has "
                                             r"no dims and none can be inferred; give them with --input X=D1,D2"):
        export_onnx(net, init)


def test_an_init_net_that_does_not_fill_a_weight():
    init, net = xor()
    del init.op[0]
    init.external_output.remove("W1")
    with pytest.raises(MissingWeightError, match=r"^net 'xor_predict': the init net does not fill 'W1', a weight "
                                                 r"read by op #0 \(FC\) input 1; give the init net"):
        export_onnx(net, init, inputs={"X": (4, 2)})


def test_an_opset_below_what_an_op_needs():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(OpsetError, match=r"op #0 \(LayerNorm\): its ONNX form needs opset 17, but the export is "
                                         r"at opset 16; export with --opset 17 or newer"):
        export_onnx(one_op("LayerNorm", {"x": x}, 3), inputs={"x": x}, opset=16)
    compare(one_op("LayerNorm", {"x": x}, 3), feeds={"x": x}, opset=17)


@pytest.mark.parametrize("opset", [9, 99])
def test_an_opset_the_exporter_does_not_write(opset):
    init, net = xor()
    with pytest.raises(OpsetError, match=rf"^opset {opset} is outside what the exporter writes \(13 to \d+"):
        export_onnx(net, init, inputs={"X": (4, 2)}, opset=opset)


def test_no_outputs_and_unknown_outputs():
    init, net = xor()
    del net.external_output[:]
    with pytest.raises(ExportError, match="declares none\\); name the blobs to export with --output NAME"):
        export_onnx(net, init, inputs={"X": (4, 2)})
    with pytest.raises(ExportError, match="output 'nope' is not made by the net's forward part"):
        export_onnx(net, init, inputs={"X": (4, 2)}, outputs=["nope"])


def test_an_input_the_net_does_not_have():
    init, net = xor()
    with pytest.raises(ExportError, match=r"has no blob 'x' to take as an input \(did you mean X\?\)"):
        export_onnx(net, init, inputs={"x": (4, 2)})


def test_spatial_bn_in_training_mode_is_refused_with_the_fix():
    v = {k: np.ones(3, np.float32) for k in "sbmv"}
    net = one_op("SpatialBN", {"x": np.ones((1, 3, 2, 2), np.float32), **v}, 1, is_test=0)
    with pytest.raises(UnsupportedOpError, match="training mode .*set is_test=1"):
        export_onnx(net, inputs={"x": (1, 3, 2, 2)}, params=v)


# --------------------------------------------------------------------------------------------- what it keeps
def test_the_callers_nets_are_unchanged_and_the_model_is_checked():
    init, net = xor()
    before = (init.SerializeToString(), net.SerializeToString())
    result = export_onnx(net, init, inputs={"X": (4, 2)})
    assert (init.SerializeToString(), net.SerializeToString()) == before
    import onnx
    onnx.checker.check_model(result.model, full_check=True)
    assert result.opset == default_opset()
    assert {i.name for i in result.model.graph.initializer} == {"W1", "b1", "W2", "b2"}


def test_unneeded_ops_are_left_out_and_named():
    init, net = xor()
    net.op.append(make_op("Print", ["y"], []))
    net.op.append(make_op("Sigmoid", ["y"], ["unused"]))
    result, _ = compare(net, init, feeds={"X": X})
    assert result.notes == ["net 'xor_predict': left out 2 op(s) that no exported output needs (Print×1, "
                            "Sigmoid×1)"]


def test_fills_in_the_predict_net_become_constants():
    net = NetDef(name="fills", external_input=["x"], external_output=["y"])
    net.op.extend([make_op("GivenTensorFill", [], ["w"], shape=[2], values=[1.5, -2.0]),
                   make_op("ConstantFill", [], ["k"], shape=[2], value=3.0),
                   make_op("Mul", ["x", "w"], ["xw"]), make_op("Add", ["xw", "k"], ["y"])])
    result, _ = compare(net, feeds={"x": np.ones((3, 2), np.float32)})
    assert [n.op_type for n in result.model.graph.node] == ["Mul", "Add"]


def test_an_input_takes_its_dims_and_dtype_from_the_init_nets_placeholder():
    init, net = xor()
    init.op.add().CopyFrom(make_op("GivenTensorFill", [], ["X"], shape=[4, 2], values=[0.0] * 8))
    result = export_onnx(net, init, inputs={"X": None})
    assert ort_run(result, {"X": X})["y"].shape == (4, 1)


def test_a_graph_output_that_is_also_an_input_name():
    net = NetDef(name="inplace", external_input=["x"], external_output=["x"])
    net.op.append(make_op("Relu", ["x"], ["x"]))
    x = np.array([[-1.0, 2.0]], np.float32)
    result = export_onnx(net, inputs={"x": x.shape})
    assert result.outputs == {"x": "x_out"}
    np.testing.assert_array_equal(ort_run(result, {"x": x})["x"], [[0.0, 2.0]])


# --------------------------------------------------------------------------------------------- command line
def test_export_onnx_command(tmp_path, capsys):
    out = tmp_path / "xor.onnx"
    assert main(["export-onnx", str(INIT), str(PREDICT), "-o", str(out), "--input", "X=4,2", "--opset", "17"]) == 0
    text = capsys.readouterr().out
    assert re.match(r"wrote .*xor\.onnx: opset 17, 3 nodes, inputs X \(4, 2\), outputs y", text)
    import onnx
    import onnxruntime as ort
    model = onnx.load(str(out))
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": X})[0]
    np.testing.assert_array_equal(y.reshape(-1), [0, 1, 1, 0])


@pytest.mark.parametrize("args, message", [
    ([str(PREDICT), "--input", "X=4,2"], "needs -o OUT.onnx"),
    ([str(PREDICT), "-o", "x.onnx", "--input", "X=4,2"], "no init net was given to fill 'W1'"),
    ([str(INIT), str(PREDICT), "-o", "x.onnx"], "input 'X' (read by op #0 (FC) input 0) has no dims"),
    ([str(INIT), str(PREDICT), "-o", "x.onnx", "--input", "X=4,2", "--opset", "5"], "opset 5 is outside"),
    ([str(XOR / "plan.pbtxt"), "-o", "x.onnx"], "name the net to export with --net"),
])
def test_export_onnx_bad_input_is_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["export-onnx", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stepnet: error: ") and message in err and err.count("\n") == 1


def test_the_four_bad_inputs_are_one_line_each_on_the_command_line(tmp_path, capsys):
    """No ONNX counterpart, no dims, an unfilled weight, an opset below an op's: one line naming op/blob and fix."""
    init, net = xor()
    nofill = tmp_path / "init.pbtxt"
    del init.op[0]
    init.external_output.remove("W1")
    proto.save(init, nofill)
    tile = tmp_path / "tile.pbtxt"
    _, t = xor()
    t.op.append(make_op("LengthsTile", ["y", "len"], ["s"]))
    t.external_input.append("len")
    t.external_output[:] = ["s"]
    proto.save(t, tile)
    ln = tmp_path / "ln.pbtxt"
    proto.save(one_op("LayerNorm", {"x": np.ones((2, 3), np.float32)}, 3), ln)
    out = str(tmp_path / "x.onnx")
    cases = [([str(INIT), str(tile), "--input", "X=4,2", "--input", "len=4:int32"],
              "op #3 (LengthsTile): no ONNX counterpart; export the part before it instead (--output y --output len)"),
             ([str(INIT), str(PREDICT)], "input 'X' (read by op #0 (FC) input 0) has no dims and none can be "
                                         "inferred; give them with --input X=D1,D2"),
             ([str(nofill), str(PREDICT), "--input", "X=4,2"], "the init net does not fill 'W1', a weight read by "
                                                                "op #0 (FC) input 1"),
             ([str(ln), "--input", "x=2,3", "--opset", "16"], "op #0 (LayerNorm): its ONNX form needs opset 17, but "
                                                             "the export is at opset 16; export with --opset 17")]
    for args, message in cases:
        assert main(["export-onnx", *args, "-o", out]) == 1
        err = capsys.readouterr().err
        assert err.startswith("stepnet: error: ") and message in err and err.count("\n") == 1, (args, err)
    assert not Path(out).exists()


def test_export_a_plans_net_with_checkpoint_weights(tmp_path, capsys):
    """docs/onnx.md's char-rnn command: a plan's sampling net, weights from a checkpoint, its forward part."""
    from test_onnx_models import char_rnn_sample
    _, _, params, feeds = char_rnn_sample()
    ckpt, out = tmp_path / "ckpt.minidb", tmp_path / "sample.onnx"
    save_blobs(ckpt, params)
    assert main(["export-onnx", str(ROOT / "models" / "char_rnn_sample.pbtxt"), "--net", "char_rnn_sample",
                 "--load", str(ckpt), "-o", str(out), "--input", "char=1:int32", "--input", "hidden_init=1,1,256",
                 "--input", "cell_init=1,1,256", "--output", "softmax_reshaped"]) == 0
    text = capsys.readouterr().out
    assert "note: net 'char_rnn_sample': left out 3 op(s)" in text and "outputs softmax_reshaped" in text
    import onnx
    import onnxruntime as ort
    model = onnx.load(str(out))
    got = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_array_equal(got["LSTM/gates_t_w"], params["LSTM/gates_t_w"])
    p = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert p.shape == (1, 65) and abs(float(p.sum()) - 1) < 1e-5


def test_list_ops(capsys):
    assert main(["export-onnx", "--list-ops"]) == 0
    listed = capsys.readouterr().out.strip().split(", ")
    assert {"FC", "Conv", "RecurrentNetwork", "LSTMUnit", "SpatialBN"} <= set(listed)


def test_the_docs_list_the_ops_that_export():
    page = (ROOT / "docs" / "onnx.md").read_text()
    listed = re.search(r"<!-- onnx-ops:begin -->\n(.*)\n<!-- onnx-ops:end -->", page, re.S).group(1)
    assert listed.strip() == markdown(), "docs/onnx.md's op list is stale: regenerate it from table.markdown()"


# --------------------------------------------------------------------------------------------- engine
def test_run_with_the_onnxruntime_engine(capsys):
    args = ["run", str(INIT), str(PREDICT), "--feed", "X=[[0, 1], [1, 1]]"]
    assert main(args + ["--engine", "onnxruntime"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "y: shape (2, 1) float32 [1., 0.]" and not captured.err


def test_the_engine_falls_back_with_one_line(tmp_path, capsys):
    init, net = xor()
    net.op.append(make_op("LengthsTile", ["y", "len"], ["s"]))
    net.external_input.append("len")
    net.external_output.append("s")
    path = tmp_path / "p.pbtxt"
    proto.save(net, path)
    args = ["run", str(INIT), str(path), "--feed", "X=[[0, 1], [1, 1]]", "--feed", "len=[1, 1]:int32"]
    assert main(args + ["--engine", "onnxruntime"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("stepnet: warning: onnxruntime engine: net 'xor_predict', op #3 (LengthsTile): "
                                   "no ONNX")
    assert captured.err.rstrip().endswith("running on stepnet's engine") and captured.err.count("\n") == 1
    assert "y: shape (2, 1) float32 [1., 0.]" in captured.out


def test_a_plan_runs_on_stepnets_engine_and_says_so(capsys):
    assert main(["run", str(XOR / "plan.pbtxt"), "--fetch", "y", "--engine", "onnxruntime"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ("stepnet: warning: onnxruntime engine: it runs predict nets; a plan runs on stepnet's "
                            "engine\n")
    assert "y: shape (4, 1) float32 [0., 1., 1., 0.]" in captured.out


def test_the_engines_notes_are_warnings_and_a_bad_model_is_one_error_line(tmp_path, capsys):
    plan = proto.load(XOR / "plan.pbtxt")
    del plan.network[0]                           # its steps name a net it no longer has
    proto.save(plan, tmp_path / "plan.pbtxt")
    assert main(["run", str(tmp_path / "plan.pbtxt"), "--engine", "onnxruntime", "-q"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("stepnet: warning: ")]
    assert len(err) == 1 and err[0].startswith("stepnet: error: plan 'xor_plan'"), err
    init, net = xor()                             # a fallback note quoting an op name with a newline: one line
    evil = "len\nstepnet: error: forged"        # blob names are quoted raw in the note's --output hint
    net.op.append(make_op("LengthsTile", ["y", evil], ["s"]))
    net.external_input.append(evil)
    net.external_output.append("s")
    proto.save(net, tmp_path / "p.pbtxt")
    np.save(tmp_path / "len.npy", np.array([1], np.int32))
    assert main(["run", str(INIT), str(tmp_path / "p.pbtxt"), "--feed", "X=[[0, 1]]", "--feed",
                 f"{evil}={tmp_path / 'len.npy'}",
                 "--engine", "onnxruntime", "-q"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("stepnet: warning: onnxruntime engine: ") and "len\\nstepnet" in err[0]


def test_the_init_net_runs_but_writes_no_file(tmp_path, capsys, monkeypatch):
    """export-onnx runs the init net to take its values; a Save op there must not write (only -o is written)."""
    monkeypatch.chdir(tmp_path)
    init, net = xor()
    init.op.append(make_op("Save", ["W1"], [], db="dropped.minidb", db_type="minidb"))
    proto.save(init, tmp_path / "init.pbtxt")
    assert main(["export-onnx", "init.pbtxt", str(PREDICT), "-o", "out.onnx", "--input", "X=1,2"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and re.match(r"stepnet: error: net 'xor_init', op #\d+ \(Save\): db path "
                                      r"'(\./)?dropped.minidb': this command runs the model's ops only to compute "
                                      r"values and lets no op write a file", err[0]), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init.pbtxt"]


def test_a_net_onnxruntime_fails_to_run_falls_back_with_one_warning(tmp_path, capsys):
    """onnxruntime's own errors (an integer division by zero here) are not stepnet's: the run falls back to
    stepnet's engine with one warning line, and onnxruntime's C++ log stays quiet."""
    net = NetDef(name="div", op=[make_op("Div", ["a", "b"], ["y"])], external_input=["a", "b"], external_output=["y"])
    proto.save(net, tmp_path / "div.pbtxt")
    assert main(["run", str(tmp_path / "div.pbtxt"), "--feed", "a=[4, 6]:int32", "--feed", "b=[2, 3]:int32",
                 "--engine", "onnxruntime"]) == 0
    assert capsys.readouterr().err == ""
    code = main(["run", str(tmp_path / "div.pbtxt"), "--feed", "a=[4, 6]:int32", "--feed", "b=[0, 3]:int32",
                 "--engine", "onnxruntime", "-q"])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("stepnet: warning: onnxruntime engine: onnxruntime could not run the exported net "
                             "([ONNXRuntimeError]") and err[0].endswith("running on stepnet's engine"), err
    assert len(err) == 1 or (code == 1 and len(err) == 2 and err[1].startswith("stepnet: error: net 'div', op #0"))
