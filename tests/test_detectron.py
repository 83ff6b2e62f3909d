"""The Detectron Faster R-CNN predict net (tests/data/models, see SOURCES.md) run end to end, unchanged.

Weights come from stepnet.builders.synth (the dims of rpn_rois given, since the number of proposals depends on
values; the RPN and box heads sized for Detectron's 15 anchors and COCO's 81 classes), anchors are
Detectron's 5 sizes x 3 aspect ratios at stride 16, and the four heads are rescaled once so that scores spread
and deltas stay small (random deep weights saturate them). Every detection op's output is then checked
against the loop references of tests/ops/box_reference.py fed with the net's own intermediate blobs, on every
device; the file's misspelt `nms_thres` is ignored with a warning, as Caffe2 ignores it.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from stepnet.io import proto
from stepnet.cli.run import main
from stepnet.core.errors import StepnetWarning
from stepnet.ops import REGISTRY
from stepnet.io.proto import DeviceOption
from stepnet.builders.synth import synth_init
from stepnet.testing import DEVICES
from stepnet.runtime.workspace import Workspace

sys.path.insert(0, str(Path(__file__).resolve().parent / "ops"))
import box_reference as ref  # noqa: E402

NET = Path(__file__).resolve().parent / "data" / "models" / "detectron_e2e_faster_rcnn_R-50-C4_1x_predict_net.pbtxt"
H, W, A, CLASSES, WIDTH = 96, 128, 15, 81, 16
PARAMS = {"anchor": (A, 4), "rpn_cls_logits_w": (A, WIDTH, 1, 1), "rpn_bbox_pred_w": (4 * A, WIDTH, 1, 1),
          "bbox_pred_w": (4 * CLASSES, WIDTH)}
HEADS = [("rpn_cls_logits", 1.0), ("rpn_bbox_pred", 0.1), ("cls_score", 3.0), ("bbox_pred", 0.1)]


def anchors() -> np.ndarray:
    """Boxes of area size² and height/width ratio r centred on the first 16-pixel cell."""
    out = []
    for size in (32.0, 64.0, 128.0, 256.0, 512.0):
        for r in (0.5, 1.0, 2.0):
            w, h = size / np.sqrt(r), size * np.sqrt(r)
            out.append([7.5 - (w - 1) / 2, 7.5 - (h - 1) / 2, 7.5 + (w - 1) / 2, 7.5 + (h - 1) / 2])
    return np.array(out, np.float32)


def load_net(device="cpu"):
    net = proto.load(NET, kind="net")
    if device != "cpu":   # every op of the file carries its own (empty, CPU) device_option
        for op in net.op:
            op.device_option.CopyFrom(DeviceOption(device_type=1))
    return net


def run_detectron(device):
    """(workspace, net) after one run with the heads rescaled."""
    net = load_net(device)
    init = synth_init(net, {"data": (1, 3, H, W), "im_info": (1, 3), "rpn_rois": (1, 5)}, width=WIDTH,
                      classes=CLASSES, params=PARAMS)
    ws = Workspace(seed=0, gpu="emulate" if device == "emulated" else None)
    ws.run_net_once(init)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    feeds = {"data": np.random.default_rng(0).standard_normal((1, 3, H, W)).astype(np.float32),
             "im_info": np.array([[H, W, 1.0]], np.float32), "anchor": anchors()}
    for name, value in feeds.items():
        ws.feed(name, value, device_option=do)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StepnetWarning)
        bound = ws.create_net(net)
    bound.run()
    for head, spread in HEADS:   # weights scaled so the head's output has this standard deviation
        scale = spread / float(ws.fetch(head).std())
        ws.feed(head + "_w", ws.fetch(head + "_w") * scale, device_option=do)
        ws.feed(head + "_b", ws.fetch(head + "_b") * 0, device_option=do)
        bound.run()
    return ws, net


@pytest.fixture(scope="module", params=DEVICES)
def detectron(request):
    return run_detectron(request.param)


def arg(net, op_type, name, default=None):
    op = next(o for o in net.op if o.type == op_type)
    return proto.arguments(op.arg).get(name, default)


def close(got, want, atol, what):
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=what)


def test_proposals(detectron):
    ws, net = detectron
    rois, probs = ref.generate_proposals(
        ws.fetch("rpn_cls_probs"), ws.fetch("rpn_bbox_pred"), ws.fetch("im_info"), ws.fetch("anchor"), 16.0,
        arg(net, "GenerateProposals", "pre_nms_topN"), arg(net, "GenerateProposals", "post_nms_topN"),
        0.7, arg(net, "GenerateProposals", "min_size"))   # nms_thresh: the default (the file's nms_thres is not it)
    assert 50 < len(rois) < 1000, len(rois)
    close(ws.fetch("rpn_rois"), rois, 1e-3, "rpn_rois")
    close(ws.fetch("rpn_roi_probs"), probs, 1e-6, "rpn_roi_probs")


def test_roi_align(detectron):
    ws, net = detectron
    rois = ws.fetch("rpn_rois")[::10]          # every tenth RoI: the loop reference is slow
    want = ref.roi_align(ws.fetch("res4_5_sum"), rois, 14, 14, scale=0.0625, ratio=0)
    close(ws.fetch("pool5")[::10], want, 1e-3 * float(np.abs(want).max()), "pool5")


def test_boxes_and_detections(detectron):
    ws, net = detectron
    boxes, counts = ref.bbox_transform(ws.fetch("rpn_rois"), ws.fetch("bbox_pred"), ws.fetch("im_info"),
                                       weights=(10.0, 10.0, 5.0, 5.0), apply_scale=False)
    close(ws.fetch("pred_bbox"), boxes, 1e-3, "pred_bbox")
    assert counts == [len(boxes)]
    scores, kept, classes, *_ = ref.box_with_nms_limit(ws.fetch("cls_prob"), ws.fetch("pred_bbox"),
                                                      score_thresh=0.05, nms_thresh=0.5, limit=100)
    assert len(scores) == 100 and len(set(classes)) > 5
    close(ws.fetch("score_nms"), scores.astype(np.float32), 1e-6, "score_nms")
    close(ws.fetch("bbox_nms"), kept.astype(np.float32), 1e-4, "bbox_nms")
    close(ws.fetch("class_nms"), classes.astype(np.float32), 0, "class_nms")
    b = ws.fetch("bbox_nms")
    assert (b >= 0).all() and (b[:, 0::2] <= W - 1).all() and (b[:, 1::2] <= H - 1).all()


def test_misspelt_nms_thres_is_ignored_as_in_caffe2(detectron):
    """The file says nms_thres: 0.7; Caffe2 reads nms_thresh, so NMS runs at its default (also 0.7). stepnet
    warns once and does the same: renaming the argument to what Caffe2 reads changes nothing."""
    ws, net = detectron
    with pytest.warns(StepnetWarning, match="'nms_thres' is not used by GenerateProposals.*did you mean nms_thresh"):
        ws.create_net(net, overwrite=True)
    proposals = next(o for o in load_net("cpu").op if o.type == "GenerateProposals")
    for a in proposals.arg:
        if a.name == "nms_thres":
            a.name = "nms_thresh"
    host = Workspace(seed=0)
    for name in proposals.input:
        host.feed(name, ws.fetch(name))
    host.run_operator_once(proposals)
    np.testing.assert_array_equal(host.fetch("rpn_rois"), ws.fetch("rpn_rois"))


def test_synth_shapes_the_detection_heads_from_the_net_alone():
    """Without the proposals' dims or any --param: the proposals are shaped by running GenerateProposals on
    zeros, the RPN heads follow the anchors (15 by default: A and 4A channels), the box head follows the class
    count (4 x 81), and the anchors are real ones at the op's stride."""
    given = shapes_of(synth_init(load_net(), {"data": (1, 3, H, W), "im_info": (1, 3), "rpn_rois": (1, 5)},
                                 width=WIDTH, classes=CLASSES, params=PARAMS))
    init = synth_init(load_net(), {"data": (1, 3, H, W), "im_info": (1, 3)}, width=WIDTH, classes=CLASSES)
    assert shapes_of(init) == given
    fill = next(op for op in init.op if op.output[0] == "anchor")
    assert fill.type == "GivenTensorFill"
    values = np.array(proto.arguments(fill.arg)["values"], np.float32).reshape(A, 4)
    np.testing.assert_allclose(values, anchors(), atol=1e-4)


def shapes_of(init):
    return {op.output[0]: tuple(proto.arguments(op.arg)["shape"]) for op in init.op}


def test_cli_synth_init_and_run(tmp_path, capsys):
    """The README's recipe: synth-init with the proposals' dims and the head sizes, then run with anchors."""
    init = tmp_path / "init.pb"
    params = [f"--param={k}={','.join(map(str, v))}" for k, v in PARAMS.items()]
    assert main(["synth-init", str(NET), "-o", str(init), "--input", f"data=1,3,{H},{W}", "--input", "im_info=1,3",
                 "--input", "rpn_rois=1,5", "--width", str(WIDTH), "--classes", str(CLASSES), *params]) == 0
    np.save(tmp_path / "x.npy", np.random.default_rng(1).standard_normal((1, 3, H, W)).astype(np.float32))
    np.save(tmp_path / "anchor.npy", anchors())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StepnetWarning)
        code = main(["run", str(init), str(NET), "--feed", f"data={tmp_path / 'x.npy'}", "--feed",
                     f"im_info=[[{H}, {W}, 1.0]]", "--feed", f"anchor={tmp_path / 'anchor.npy'}", "-q", "--save",
                     str(tmp_path / "out.npz")])
    assert code == 0, capsys.readouterr().err
    out = np.load(tmp_path / "out.npz")
    n = len(out["score_nms"])
    assert out["bbox_nms"].shape == (n, 4) and out["class_nms"].shape == (n,) and n <= 100


def test_a_broken_kernel_in_the_chain_is_caught(broken):
    kernel = REGISTRY.get("BoxWithNMSLimit").kernel
    broken("BoxWithNMSLimit", lambda xp, *a, **k: kernel(xp, *a, **dict(k, nms=0.6)))
    with pytest.raises(AssertionError):
        test_boxes_and_detections(run_detectron("cpu"))
