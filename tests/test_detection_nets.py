"""The real detection nets from the command line, as a user runs them: `stepnet synth-init` with nothing but the
image's and im_info's dims, then `stepnet run` feeding data and im_info (tests/data/models: Mask R-CNN2Go fp32
.pb and .pbtxt, whose mask head sits in an If, and Detectron's Faster R-CNN); the detections must have
consistent shapes (n scores, n x 4 boxes inside the image, n integer classes, n masks). And a hand-made
detector small enough to follow on paper (one anchor per cell, weights chosen so that every proposal, pooled
feature, class probability and box is computed below with pencil-and-paper arithmetic) run the same way."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from stepnet.io import proto
from stepnet.cli.run import main
from stepnet.core.errors import StepnetWarning
from stepnet.io.proto import NetDef
from stepnet.testing import make_op

MODELS = Path(__file__).resolve().parent / "data" / "models"
H, W, CLASSES = 96, 128, 81
NETS = {  # name: (file, synth-init options)
    "maskrcnn2go-pb": ("maskrcnn2go_fp32_model.pb", []),
    "maskrcnn2go-pbtxt": ("maskrcnn2go_fp32_model.pbtxt", []),
    "detectron": ("detectron_e2e_faster_rcnn_R-50-C4_1x_predict_net.pbtxt", ["--width", "16"]),
}


def cli(*argv):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StepnetWarning)     # Detectron's misspelt nms_thres
        return main([str(a) for a in argv])


@pytest.mark.parametrize("name", sorted(NETS))
def test_synth_init_then_run_from_the_command_line(name, tmp_path, capsys):
    file, options = NETS[name]
    net, init, out = MODELS / file, tmp_path / "init.pb", tmp_path / "out.npz"
    assert cli("synth-init", net, "-o", init, "--input", f"data=1,3,{H},{W}", "--input", "im_info=1,3",
               "--classes", CLASSES, *options) == 0, capsys.readouterr().err
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((1, 3, H, W)).astype(np.float32))
    code = cli("run", init, net, "--feed", f"data={tmp_path / 'x.npy'}", "--feed", f"im_info=[[{H}, {W}, 1.0]]",
               "-q", "--save", out)
    assert code == 0, capsys.readouterr().err
    got = np.load(out)
    scores, boxes, classes = got["score_nms"], got["bbox_nms"], got["class_nms"]
    n = len(scores)
    assert n >= 1, "these seeds give detections, so the whole net (mask head included) ran"
    assert scores.shape == (n,) and boxes.shape == (n, 4) and classes.shape == (n,)
    assert ((scores > 0.05) & (scores <= 1)).all()
    assert (classes == np.round(classes)).all() and (1 <= classes).all() and (classes < CLASSES).all()
    assert (boxes >= 0).all() and (boxes[:, 0::2] <= W - 1).all() and (boxes[:, 1::2] <= H - 1).all()
    if "mask_fcn_probs" in got:
        masks = got["mask_fcn_probs"]
        assert masks.shape[0] == n and masks.ndim == 4 and masks.shape[2] == masks.shape[3]
        assert ((masks >= 0) & (masks <= 1)).all()


# ------------------------------------------------------------------------------------------- by hand
def sigmoid(v):
    return 1 / (1 + math.exp(-v))


def softmax(logits):
    e = [math.exp(v) for v in logits]
    return [v / sum(e) for v in e]


def hand_nets():
    """A 2 x 2 feature map at stride 16 (a 32 x 32 image) whose single channel is the RPN logit itself:
    [[3, -3], [-3, 1]]. One anchor, the 16 x 16 cell; zero box deltas everywhere; pooled features go to class
    logits [0, 2p, -2p]."""
    init = NetDef(name="hand_init")
    fills = {"rpn_cls_w": ([1, 1, 1, 1], [1.0]), "rpn_cls_b": ([1], [0.0]),
             "rpn_bbox_w": ([4, 1, 1, 1], [0.0] * 4), "rpn_bbox_b": ([4], [0.0] * 4),
             "anchor": ([1, 4], [0.0, 0.0, 15.0, 15.0]),
             "cls_w": ([3, 1], [0.0, 2.0, -2.0]), "cls_b": ([3], [0.0] * 3),
             "box_w": ([12, 1], [0.0] * 12), "box_b": ([12], [0.0] * 12)}
    for name, (shape, values) in fills.items():
        init.op.append(make_op("GivenTensorFill", [], [name], shape=shape, values=values))
    predict = NetDef(name="hand")
    predict.external_input.extend(["data", "im_info", *fills])
    predict.external_output.extend(["score_nms", "bbox_nms", "class_nms"])
    for args in [
        ("Conv", ["data", "rpn_cls_w", "rpn_cls_b"], ["rpn_logits"], {"kernel": 1}),
        ("Sigmoid", ["rpn_logits"], ["rpn_probs"], {}),
        ("Conv", ["data", "rpn_bbox_w", "rpn_bbox_b"], ["rpn_deltas"], {"kernel": 1}),
        ("GenerateProposals", ["rpn_probs", "rpn_deltas", "im_info", "anchor"], ["rois", "roi_probs"],
         {"spatial_scale": 0.0625, "pre_nms_topN": 10, "post_nms_topN": 10, "nms_thresh": 0.7, "min_size": 0.0}),
        ("RoIAlign", ["data", "rois"], ["pooled"], {"spatial_scale": 0.0625, "pooled_h": 1, "pooled_w": 1,
                                                   "sampling_ratio": 1}),
        ("FC", ["pooled", "cls_w", "cls_b"], ["cls_score"], {}),
        ("Softmax", ["cls_score"], ["cls_prob"], {}),
        ("FC", ["pooled", "box_w", "box_b"], ["bbox_pred"], {}),
        ("BBoxTransform", ["rois", "bbox_pred", "im_info"], ["pred_bbox"],
         {"weights": [10.0, 10.0, 5.0, 5.0], "apply_scale": False}),
        ("BoxWithNMSLimit", ["cls_prob", "pred_bbox"], ["score_nms", "bbox_nms", "class_nms"],
         {"score_thresh": 0.05, "nms": 0.5, "detections_per_im": 100}),
    ]:
        predict.op.append(make_op(args[0], args[1], args[2], **args[3]))
    return init, predict


def test_a_hand_made_detector_gives_the_boxes_worked_out_by_hand(tmp_path, capsys):
    init, predict = hand_nets()
    proto.save(init, tmp_path / "init.pbtxt")
    proto.save(predict, tmp_path / "predict.pbtxt")
    np.save(tmp_path / "x.npy", np.array([[[[3, -3], [-3, 1]]]], np.float32))
    assert cli("run", tmp_path / "init.pbtxt", tmp_path / "predict.pbtxt", "--feed", f"data={tmp_path / 'x.npy'}",
               "--feed", "im_info=[[32, 32, 1]]", "--fetch", "rois", "roi_probs", "pooled", "score_nms", "bbox_nms",
               "class_nms", "-q", "--save", tmp_path / "out.npz") == 0, capsys.readouterr().err
    got = np.load(tmp_path / "out.npz")
    # Proposals: each cell's anchor, unmoved (zero deltas keep a box: width 16, centre x1 + 8, x2 = centre + 8 - 1),
    # inside the 32 x 32 image, no two overlapping, so NMS keeps all four, best logit first; the two cells of
    # logit -3 tie and keep their (row, column) order.
    cells = [(0, 0, 3), (1, 1, 1), (0, 1, -3), (1, 0, -3)]     # (row, column, logit)
    rois = [[0, 16 * c, 16 * r, 16 * c + 15, 16 * r + 15] for r, c, _ in cells]
    np.testing.assert_array_equal(got["rois"], rois)
    np.testing.assert_allclose(got["roi_probs"], [sigmoid(v) for _, _, v in cells], rtol=1e-6)
    # RoIAlign, one sample per RoI at its centre in map units (a RoI of 15/16 of a cell counts as 1 x 1):
    # (0.5, 0.5) averages the four cells: (3 - 3 - 3 + 1) / 4 = -0.5; (1.5, 1.5) is past the last cell and reads
    # it: 1; (x 1.5, y 0.5) reads the last column, averaging its rows: (-3 + 1) / 2 = -1; likewise (0.5, 1.5).
    pooled = [-0.5, 1.0, -1.0, -1.0]
    np.testing.assert_allclose(got["pooled"].ravel(), pooled, atol=1e-6)
    # Class probabilities softmax([0, 2p, -2p]); the boxes are the RoIs (zero deltas). Class 1 keeps RoIs 2 and 1
    # (0.867 and 0.090 > 0.05), class 2 RoIs 3 and 4 (0.867 each, in order) and 1 (0.665); none overlap.
    probs = [softmax([0, 2 * p, -2 * p]) for p in pooled]
    kept = [(1, 1), (1, 0), (2, 2), (2, 3), (2, 0)]             # (class, RoI), in BoxWithNMSLimit's order
    np.testing.assert_allclose(got["score_nms"], [probs[r][j] for j, r in kept], rtol=1e-5)
    np.testing.assert_array_equal(got["bbox_nms"], [rois[r][1:] for _, r in kept])
    np.testing.assert_array_equal(got["class_nms"], [j for j, _ in kept])


def test_the_checks_catch_broken_kernels(broken, tmp_path, capsys):
    from stepnet.ops import REGISTRY
    nms = REGISTRY.get("BoxWithNMSLimit").kernel
    broken("BoxWithNMSLimit", lambda xp, *a, **k: nms(xp, *a, **dict(k, score_thresh=0.1)))
    with pytest.raises(AssertionError):
        test_a_hand_made_detector_gives_the_boxes_worked_out_by_hand(tmp_path, capsys)
    bbox = REGISTRY.get("BBoxTransform").kernel

    def unclipped(xp, rois, deltas, im_info, **k):      # boxes as transformed, then pushed off the image
        boxes, splits = bbox(xp, rois, deltas, im_info, **k)
        return boxes + 200, splits
    broken("BBoxTransform", unclipped)
    with pytest.raises(AssertionError):
        test_synth_init_then_run_from_the_command_line("detectron", tmp_path, capsys)
