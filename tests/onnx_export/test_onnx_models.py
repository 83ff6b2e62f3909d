"""The vendored real Caffe2 files exported to ONNX and run in onnxruntime: every output (and the logits before
each softmax) within rtol 1e-4 of stepnet's. Zoo nets run on synthesized weights (stepnet.builders.synth), the crayon
model on its real weights (its middle part: the preprocess op adds random noise), the char-rnn sampling net on
random weights (its forward part: WeightedSample draws random samples), and the test nets of the vendored
training plans on the first batch of their real test data (the part after the db reader)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from onnx_check import compare, ort_run, stepnet_run  # noqa: E402

from stepnet import NetDef, Workspace
from stepnet.io import proto
from stepnet.export.onnx import UnsupportedOpError, export_onnx  # noqa: E402
from stepnet.builders.synth import synth_init  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
ZOO = {  # file, data blob, image side, logits blob
    "squeezenet": (DATA / "caffe2" / "squeeze_predict_net.pb", "data", 224, "conv10"),
    "armcompute_squeezenet": (DATA / "caffe2" / "armcompute_squeezenet_predict.pb", "data", 224, "conv10"),
    "alexnet": (DATA / "models" / "bvlc_alexnet_predict_net.pbtxt", "data", 227, "fc8"),
    "inception_v1": (DATA / "models" / "inception_v1_predict_net.pbtxt", "data", 224, "loss3/classifier"),
    "resnet50": (DATA / "models" / "resnet50_predict_net.pbtxt", "gpu_0/data", 224, "gpu_0/pred"),
}


def test_xor():
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
    init, net = (proto.load(ROOT / "models" / "xor" / f, kind="net") for f in ("init_net.pbtxt", "predict_net.pbtxt"))
    result, _ = compare(net, init, feeds={"X": x})
    assert result.inputs == ["X"] and result.outputs == {"y": "y"}
    assert not result.notes


@pytest.mark.parametrize("key", sorted(ZOO))
def test_zoo_net_exports_and_agrees(key):
    path, data, side, logits = ZOO[key]
    net = proto.load(path, kind="net")
    batch = 2
    init = synth_init(net, {data: (batch, 3, side, side)})
    x = np.random.default_rng(1).standard_normal((batch, 3, side, side)).astype(np.float32)
    outputs = [logits] + list(net.external_output)
    result, worst = compare(net, init, feeds={data: x}, outputs=outputs, scaled=(logits,))
    assert set(result.outputs) == set(outputs)
    assert result.model.graph.initializer  # the weights travel inside the model


def _crayon():
    model = ROOT / "models" / "style_transfer"
    return proto.load(model / "crayon_init.pb", kind="net"), proto.load(model / "crayon_predict.pb", kind="net")


def test_crayon_middle_part_agrees():
    init, net = _crayon()
    pixels = np.random.default_rng(2).integers(0, 256, (1, 48, 64, 4)).astype(np.uint8)
    feeds = {"data_int8_bgra": pixels}
    b0 = stepnet_run(proto.NetDef(op=net.op[:1]), init, feeds, names=["b0"])["b0"]   # the noisy preprocess
    want = stepnet_run(net, init, feeds, names=["styled_int8_bgra"])["styled_int8_bgra"]
    result = export_onnx(net, init, inputs={"b0": b0}, outputs=["styled_int8_bgra"])
    got = ort_run(result, {"b0": b0})["styled_int8_bgra"]
    assert got.dtype == np.uint8 and got.shape == (1, 48, 64, 4)
    assert np.abs(got.astype(int) - want).max() <= 1   # pixels truncated to uint8: equal, or 1 off at a boundary
    assert (got == want).mean() > 0.999
    assert any("PackedInt8BGRANHWCToNCHWCStylizerPreprocess" in n for n in result.notes)


def test_crayon_whole_net_names_the_noise_op_and_the_cut():
    init, net = _crayon()
    with pytest.raises(UnsupportedOpError, match=r"op #0 \(PackedInt8BGRANHWCToNCHWCStylizerPreprocess\).*random "
                                                 r"noise.*--input b0=N,3,H,W"):
        export_onnx(net, init, inputs={"data_int8_bgra": (1, 48, 64, 4)})


def char_rnn_sample(seed=3):
    """The sampling plan's init net and sampling net, random LSTM weights, and feeds for one step."""
    plan = proto.load(ROOT / "models" / "char_rnn_sample.pbtxt")
    nets = {n.name: n for n in plan.network}
    rng = np.random.default_rng(seed)
    H, V = 256, 65
    dims = {"LSTM/i2h_w": (4 * H, V), "LSTM/i2h_b": (4 * H,), "LSTM/gates_t_w": (4 * H, H),
            "LSTM/gates_t_b": (4 * H,), "logits_w": (V, H), "logits_b": (V,)}
    params = {k: rng.uniform(-0.3, 0.3, s).astype(np.float32) for k, s in dims.items()}
    feeds = {"char": np.array([17], np.int32), "hidden_init": rng.uniform(-1, 1, (1, 1, H)).astype(np.float32),
             "cell_init": rng.uniform(-1, 1, (1, 1, H)).astype(np.float32)}
    return nets["char_rnn_sample_init"], nets["char_rnn_sample"], params, feeds


@pytest.mark.parametrize("rnn, node", [("auto", "LSTM"), ("scan", "Scan")])
def test_char_rnn_sampling_net_forward_part(rnn, node):
    init, net, params, feeds = char_rnn_sample()
    outputs = ["softmax_reshaped", "LSTM/hidden_state_last", "LSTM/cell_state_last"]
    result, worst = compare(net, init, feeds=feeds, params=params, outputs=outputs, rnn=rnn)
    assert worst < 1e-5
    assert [n.op_type for n in result.model.graph.node].count(node) == 1
    assert any("WeightedSample" in n for n in result.notes)   # left out, and said so


def test_char_rnn_sampling_net_refuses_the_sampler_when_asked_for_it():
    init, net, params, feeds = char_rnn_sample()
    with pytest.raises(UnsupportedOpError, match=r"op #8 \(WeightedSample\).*--output softmax_reshaped"):
        export_onnx(net, init, inputs=feeds, params=params, outputs=["char"])


PLANS = {  # plan, nets run first, the test net, outputs compared
    "digits": ("models/digits/train.pbtxt", ["digits_init"], "digits_test", ["test_softmax", "accuracy"]),
    "binary_adder": ("models/binary_adder/binary_adder.pbtxt", ["binary_adder_init"], "binary_adder_test",
                     ["test_prob", "bit_accuracy"]),
    "char_rnn": ("models/char_rnn.pbtxt", ["char_rnn_init", "eval_init", "prepare_state"], "eval",
                 ["softmax_reshaped", "loss"]),
}


@pytest.mark.parametrize("key", sorted(PLANS))
def test_a_training_plans_test_net_on_its_test_data(key, monkeypatch):
    """The plan's init nets run in stepnet (their seeded random fills are the weights), its reader reads the first
    batch of the vendored db; the ops after the reader, up to the outputs, export and agree."""
    monkeypatch.chdir(ROOT)   # the plans name their dbs relative to the repository
    path, first, name, outputs = PLANS[key]
    nets = {n.name: n for n in proto.load(ROOT / path).network}
    ws = Workspace(seed=0)
    for n in first:
        ws.run_net_once(nets[n])
    net = nets[name]
    reader = net.op[0]
    assert reader.type == "TensorProtosDBInput"
    ws.run_net_once(NetDef(name="read", op=[reader]))
    feeds = {b: np.asarray(ws.fetch(b)) for b in reader.output}
    last = max(i for i, op in enumerate(net.op) if set(op.output) & set(outputs))
    rest = NetDef(name=net.name, op=net.op[1:last + 1], external_output=outputs)
    made = {o for op in rest.op for o in op.output}
    params = {b: np.asarray(ws.fetch(b)) for op in rest.op for b in op.input if b not in made and b not in feeds}
    result, worst = compare(rest, feeds=feeds, params=params, outputs=outputs)
    assert worst < 1e-5 and set(result.outputs) == set(outputs)
    kinds = {n.op_type for n in result.model.graph.node}
    assert {"digits": "Gemm", "binary_adder": "Scan", "char_rnn": "LSTM"}[key] in kinds


DETECTION = {  # file, the RPN head's outputs (what GenerateProposals reads)
    "maskrcnn2go": (DATA / "models" / "maskrcnn2go_fp32_model.pb", ["rpn_cls_probs", "rpn_bbox_pred"]),
    "detectron": (DATA / "models" / "detectron_e2e_faster_rcnn_R-50-C4_1x_predict_net.pbtxt",
                  ["rpn_cls_probs", "rpn_bbox_pred"]),
}


@pytest.mark.parametrize("key", sorted(DETECTION))
def test_detection_net_is_refused_at_its_proposals_and_its_rpn_part_agrees(key):
    """GenerateProposals has no ONNX counterpart: the whole net is refused naming it and the flags that export
    the part before it; that part (backbone + RPN head) then exports and agrees with stepnet."""
    path, rpn = DETECTION[key]
    net = proto.load(path, kind="net")
    shape = (1, 3, 64, 96)
    init = synth_init(net, {"data": shape, "im_info": (1, 3)}, classes=81)
    feeds = {"data": np.random.default_rng(3).standard_normal(shape).astype(np.float32),
             "im_info": np.array([[64, 96, 1]], np.float32)}
    with pytest.raises(UnsupportedOpError, match=r"\(GenerateProposals\): no ONNX counterpart; export the part "
                                                 r"before it instead \(--output rpn_cls_probs --output rpn_bbox_pred"):
        export_onnx(net, init, inputs=feeds)
    result, _ = compare(net, init, feeds={"data": feeds["data"]}, params={"im_info": feeds["im_info"]}, outputs=rpn,
                        scaled=rpn)   # 50+ layers on random weights: values up to 1e5, float32 sums in another order
    assert set(result.outputs) == set(rpn)
