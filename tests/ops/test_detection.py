"""BBoxTransform, GenerateProposals and BoxWithNMSLimit against the loop references of box_reference.py and
against the numbers Caffe2's own tests publish (generate_proposals_op_test.cc, 2018 and later revisions), on
every device (rotated boxes: test_rotated_boxes.py); arguments, empty inputs, bad inputs (at run time and
statically), no gradients, and broken kernels caught."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, infer_alone, make_op, run_op

import box_reference as ref

rng = np.random.default_rng(23)
F32 = np.float32


def close(got, want, atol=2e-3, what="output"):
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=what)


def random_rois(counts, size=100.0):
    """[batch index, x1, y1, x2, y2] rows grouped by image, corners ordered."""
    rows = []
    for b, n in enumerate(counts):
        xy = rng.uniform(0, size, (n, 2, 2))
        lo, hi = xy.min(axis=1), xy.max(axis=1)
        rows += [[b, *lo[i], *hi[i]] for i in range(n)]
    return np.array(rows, F32).reshape(-1, 5)


# ------------------------------------------------------------------------------------------- BBoxTransform
BBOX_CASES = [  # (id, rois per image, classes, args, reference keywords)
    ("one-image-4-cols", [6], 1, {}, {}),
    ("detectron", [5], 3, {"apply_scale": False, "correct_transform_coords": True, "weights": [10., 10., 5., 5.]},
     {"apply_scale": False, "weights": (10, 10, 5, 5)}),
    ("batch", [3, 0, 4], 2, {}, {}),
    ("no-plus-one", [4, 2], 2, {"legacy_plus_one": False}, {"plus_one": 0, "offset": 0}),
    ("2018-default", [4], 2, {"correct_transform_coords": False}, {"offset": 0}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,counts,classes,args,kw", BBOX_CASES, ids=[c[0] for c in BBOX_CASES])
def test_bbox_transform(device, cid, counts, classes, args, kw):
    rois = random_rois(counts)
    if cid.endswith("4-cols"):
        rois = np.ascontiguousarray(rois[:, 1:])
    deltas = rng.normal(0, 0.5, (len(rois), 4 * classes)).astype(F32)
    deltas[0, 2] = 9.0    # past log(1000/16): capped
    im_info = np.array([[rng.uniform(60, 120), rng.uniform(60, 120), s] for s in (1.0, 0.5, 2.0)[:len(counts)]],
                       F32)
    boxes, splits = run_op("BBoxTransform", [rois, deltas, im_info], 2, device=device, **args)
    want, counts_want = ref.bbox_transform(rois, deltas, im_info, **kw)
    close(boxes, want)
    assert boxes.dtype == F32 and splits.dtype == F32
    np.testing.assert_array_equal(splits, np.array(counts_want, F32))


def test_bbox_transform_assigns_rows_to_images_by_count_as_caffe2():
    """Unsorted batch indices [1, 0, 0]: Caffe2 gives rows 0-1 image 0's im_info and row 2 image 1's."""
    rois = np.array([[1, 10, 10, 20, 20], [0, 10, 10, 20, 20], [0, 10, 10, 20, 20]], F32)
    deltas = np.zeros((3, 4), F32)
    im_info = np.array([[100, 100, 1.0], [100, 100, 2.0]], F32)
    boxes, splits = run_op("BBoxTransform", [rois, deltas, im_info], 2, apply_scale=False)
    np.testing.assert_array_equal(splits, [2, 1])
    close(boxes, [[10, 10, 20, 20], [10, 10, 20, 20], [5, 5, 10, 10]])   # zero deltas, - 1 + 1: unchanged


# ------------------------------------------------------------------------------------------- GenerateProposals
def anchors_for(sizes, ratios=(0.5, 1.0, 2.0), stride=16):
    """Detectron-like anchors centred on the first cell."""
    c = (stride - 1) / 2
    out = []
    for s in sizes:
        for r in ratios:
            w, h = s / np.sqrt(r), s * np.sqrt(r)
            out.append([c - (w - 1) / 2, c - (h - 1) / 2, c + (w - 1) / 2, c + (h - 1) / 2])
    return np.array(out, F32)


PROPOSAL_CASES = [  # (id, images, H, W, args, reference keywords)
    ("default", 2, 4, 5, {}, {}),
    ("pre-and-post", 1, 6, 6, {"pre_nms_topN": 40, "post_nms_topN": 7, "nms_thresh": 0.5, "min_size": 4.0}, {}),
    ("no-limits", 1, 3, 4, {"pre_nms_topN": 0, "post_nms_topN": -1, "min_size": 0.0}, {}),
    ("no-plus-one", 2, 3, 3, {"legacy_plus_one": False, "min_size": 2.0}, {"plus_one": 0, "offset": 0}),
    ("2018-transform", 1, 4, 4, {"correct_transform_coords": False}, {"offset": 0}),
    ("stride-8", 1, 5, 7, {"spatial_scale": 0.125, "nms_thresh": 0.6}, {}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,images,H,W,args,kw", PROPOSAL_CASES, ids=[c[0] for c in PROPOSAL_CASES])
def test_generate_proposals(device, cid, images, H, W, args, kw):
    anchors = anchors_for((16, 32, 64))
    A = len(anchors)
    scores = rng.uniform(0, 1, (images, A, H, W)).astype(F32)
    deltas = rng.normal(0, 0.3, (images, 4 * A, H, W)).astype(F32)
    stride = 1.0 / args.get("spatial_scale", 1.0 / 16)
    im_info = np.array([[H * stride - 3, W * stride + 2, s] for s in (1.0, 0.8)[:images]], F32)
    rois, probs = run_op("GenerateProposals", [scores, deltas, im_info, anchors], 2, device=device, **args)
    defaults = {"pre_nms_topN": 6000, "post_nms_topN": 300, "nms_thresh": 0.7, "min_size": 16.0}
    p = {**defaults, **{k: v for k, v in args.items() if k in defaults}}
    want_rois, want_probs = ref.generate_proposals(scores, deltas, im_info, anchors, stride, p["pre_nms_topN"],
                                                   p["post_nms_topN"], p["nms_thresh"], p["min_size"], **kw)
    assert len(want_rois) > 1, "the case should keep some proposals"
    close(rois, want_rois, what="rois")
    close(probs, want_probs, atol=0, what="rois_probs")
    assert rois.dtype == probs.dtype == F32


# Caffe2's generate_proposals_op_test.cc, TestRealDownSampled: inputs and both published answers.
C2_SCORES = [
    5.44218998e-03, 1.19207997e-03, 1.12379994e-03, 1.17181998e-03, 1.20544003e-03, 6.17993006e-04,
    1.05261997e-05, 8.91025957e-06, 9.29536981e-09, 6.09605013e-05, 4.72735002e-04, 1.13482002e-10,
    1.50015003e-05, 4.45032993e-06, 3.21612994e-08, 8.02662980e-04, 1.40488002e-04, 3.12508007e-07,
    3.02616991e-06, 1.97759000e-08, 2.66913995e-02, 5.26766013e-03, 5.05053019e-03, 5.62100019e-03,
    5.37420018e-03, 5.26280981e-03, 2.48894998e-04, 1.06842002e-04, 3.92931997e-06, 1.79388002e-03,
    4.79440019e-03, 3.41609990e-07, 5.20430971e-04, 3.34090000e-05, 2.19159006e-07, 2.28786003e-03,
    5.16703985e-05, 4.04523007e-06, 1.79227004e-06, 5.32449000e-08]
C2_DELTAS = [
    -1.65040009e-02, -1.84051003e-02, -1.85930002e-02, -2.08263006e-02, -1.83814000e-02, -2.89172009e-02,
    -3.89706008e-02, -7.52277970e-02, -1.54091999e-01, -2.55433004e-02, -1.77490003e-02, -1.10340998e-01,
    -4.20190990e-02, -2.71421000e-02, 6.89801015e-03, 5.71171008e-02, -1.75665006e-01, 2.30021998e-02,
    3.08554992e-02, -1.39333997e-02, 3.40579003e-01, 3.91070992e-01, 3.91624004e-01, 3.92527014e-01,
    3.91445011e-01, 3.79328012e-01, 4.26631987e-01, 3.64892989e-01, 2.76894987e-01, 5.13985991e-01,
    3.79999995e-01, 1.80457994e-01, 4.37402993e-01, 4.18545991e-01, 2.51549989e-01, 4.48318988e-01,
    1.68564007e-01, 4.65440989e-01, 4.21891987e-01, 4.45928007e-01, 3.27155995e-03, 3.71480011e-03,
    3.60032008e-03, 4.27092984e-03, 3.74579988e-03, 5.95752988e-03, -3.14473989e-03, 3.52022005e-03,
    -1.88564006e-02, 1.65188999e-03, 1.73791999e-03, -3.56074013e-02, -1.66615995e-04, 3.14146001e-03,
    -1.11830998e-02, -5.35363983e-03, 6.49790000e-03, -9.27671045e-03, -2.83346009e-02, -1.61233004e-02,
    -2.15505004e-01, -2.19910994e-01, -2.20872998e-01, -2.12831005e-01, -2.19145000e-01, -2.27687001e-01,
    -3.43973994e-01, -2.75869995e-01, -3.19516987e-01, -2.50418007e-01, -2.48537004e-01, -5.08224010e-01,
    -2.28724003e-01, -2.82402009e-01, -3.75815988e-01, -2.86352992e-01, -5.28333001e-02, -4.43836004e-01,
    -4.55134988e-01, -4.34897989e-01, -5.65053988e-03, -9.25739005e-04, -1.06790999e-03, -2.37016007e-03,
    -9.71166010e-04, -8.90910998e-03, -1.17592998e-02, -2.08992008e-02, -4.94231991e-02, 6.63906988e-03,
    3.20469006e-03, -6.44695014e-02, -3.11607006e-03, 2.02738005e-03, 1.48096997e-02, 4.39785011e-02,
    -8.28424022e-02, 3.62076014e-02, 2.71668993e-02, 1.38250999e-02, 6.76669031e-02, 1.03252999e-01,
    1.03255004e-01, 9.89722982e-02, 1.03646003e-01, 4.79663983e-02, 1.11014001e-01, 9.31736007e-02,
    1.15768999e-01, 1.04014002e-01, -8.90677981e-03, 1.13103002e-01, 1.33085996e-01, 1.25405997e-01,
    1.50051996e-01, -1.13038003e-01, 7.01059997e-02, 1.79651007e-01, 1.41055003e-01, 1.62841007e-01,
    -1.00247003e-02, -8.17587040e-03, -8.32176022e-03, -8.90108012e-03, -8.13035015e-03, -1.77263003e-02,
    -3.69572006e-02, -3.51580009e-02, -5.92143014e-02, -1.80795006e-02, -5.46086021e-03, -4.10550982e-02,
    -1.83081999e-02, -2.15411000e-02, -1.17953997e-02, 3.33894007e-02, -5.29635996e-02, -6.97528012e-03,
    -3.15250992e-03, -3.27355005e-02, 1.29676998e-01, 1.16080999e-01, 1.15947001e-01, 1.21797003e-01,
    1.16089001e-01, 1.44875005e-01, 1.15617000e-01, 1.31586999e-01, 1.74735002e-02, 1.21973999e-01,
    1.31596997e-01, 2.48907991e-02, 6.18605018e-02, 1.12855002e-01, -6.99798986e-02, 9.58312973e-02,
    1.53593004e-01, -8.75087008e-02, -4.92327996e-02, -3.32239009e-02]
C2_PROBS = [2.66913995e-02, 5.44218998e-03, 1.20544003e-03, 1.19207997e-03, 6.17993006e-04, 4.72735002e-04,
            6.09605013e-05, 1.50015003e-05, 8.91025957e-06]
C2_ROIS_2018 = [[0, 0, 0, 79, 59], [0, 0, 5.0005703, 52.63237, 43.69501495], [0, 24.13628387, 7.51243401, 79,
                46.06628418], [0, 0, 7.50924301, 68.47792816, 46.03357315], [0, 0, 23.09477997, 51.61448669, 59],
                [0, 0, 39.52141571, 52.44710541, 59], [0, 23.57396317, 29.98791885, 79, 59],
                [0, 0, 41.90219116, 79, 59], [0, 0, 23.30098343, 79, 59]]
C2_ROIS_LATER = [[0, 0, 0, 79, 59], [0, 0, 5.0005703, 51.6324, 42.6950], [0, 24.13628387, 7.51243401, 79, 45.0663],
                 [0, 0, 7.50924301, 67.4779, 45.0336], [0, 0, 23.09477997, 50.61448669, 59],
                 [0, 0, 39.52141571, 51.44710541, 59], [0, 23.57396317, 29.98791885, 79, 59],
                 [0, 0, 41.90219116, 79, 59], [0, 0, 23.30098343, 78.2413, 58.7287]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("extra,want", [({"correct_transform_coords": False}, C2_ROIS_2018),
                                        ({"correct_transform_coords": True}, C2_ROIS_LATER), ({}, C2_ROIS_LATER)],
                         ids=["2018", "later", "legacy-plus-one-default"])
def test_generate_proposals_matches_caffe2s_published_numbers(device, extra, want):
    inputs = [np.array(C2_SCORES, F32).reshape(1, 2, 4, 5), np.array(C2_DELTAS, F32).reshape(1, 8, 4, 5),
              np.array([[60, 80, 0.166667]], F32), np.array([[-38, -16, 53, 31], [-120, -120, 135, 135]], F32)]
    rois, probs = run_op("GenerateProposals", inputs, 2, device=device, spatial_scale=1 / 16, pre_nms_topN=6000,
                         post_nms_topN=300, nms_thresh=0.7, min_size=16.0, **extra)
    close(rois, np.array(want, F32), atol=1e-4, what="rois")
    close(probs, np.array(C2_PROBS, F32), atol=1e-4, what="rois_probs")


def test_generate_proposals_empty_and_alias():
    """Caffe2's TestEmpty: every box is filtered away; rois (0, 5). GenerateProposalsCPP is the same op."""
    for op_type in ("GenerateProposals", "GenerateProposalsCPP"):
        scores = np.ones((3, 4, 10, 8), F32)
        deltas = np.linspace(0, 10, 3 * 16 * 80, dtype=F32).reshape(3, 16, 10, 8)
        rois, probs = run_op(op_type, [scores, deltas, np.full((3, 3), 0.1, F32), np.ones((4, 4), F32)], 2,
                             spatial_scale=2.0)
        assert rois.shape == (0, 5) and probs.shape == (0,) and rois.dtype == F32


# ------------------------------------------------------------------------------------------- BoxWithNMSLimit
def clustered(count, classes):
    """Scores (count, classes) and per-class boxes (count, 4 * classes) around a few centres, so NMS bites."""
    centres = rng.uniform(20, 80, (3, 2))
    boxes = np.zeros((count, 4 * classes), F32)
    for j in range(classes):
        c = centres[rng.integers(0, 3, count)] + rng.normal(0, 3, (count, 2))
        half = rng.uniform(5, 15, (count, 2))
        boxes[:, 4 * j:4 * j + 4] = np.concatenate([c - half, c + half], axis=1)
    return rng.uniform(0, 1, (count, classes)).astype(F32), boxes


NMS_CASES = [  # (id, rows per image, classes, args, reference keywords)
    ("default", [12], 3, {}, {}),
    ("batch-limit", [10, 0, 9], 4, {"detections_per_im": 5, "score_thresh": 0.2, "nms": 0.4},
     {"limit": 5, "score_thresh": 0.2, "nms_thresh": 0.4}),
    ("no-limit", [15], 2, {"detections_per_im": -1, "nms": 0.6}, {"limit": -1, "nms_thresh": 0.6}),
    ("soft-linear", [12], 3, {"soft_nms_enabled": True, "nms": 0.3, "detections_per_im": 8},
     {"soft": "linear", "limit": 8}),
    ("soft-gaussian", [7, 8], 3, {"soft_nms_enabled": True, "soft_nms_method": "gaussian", "soft_nms_sigma": 0.3,
                                  "soft_nms_min_score_thres": 0.05},
     {"soft": "gaussian", "sigma": 0.3, "min_score": 0.05}),
    ("no-plus-one", [12], 3, {"legacy_plus_one": False, "nms": 0.5}, {"plus_one": 0, "nms_thresh": 0.5}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,rows,classes,args,kw", NMS_CASES, ids=[c[0] for c in NMS_CASES])
def test_box_with_nms_limit(device, cid, rows, classes, args, kw):
    scores, boxes = clustered(sum(rows), classes)
    inputs = [scores, boxes] + ([np.array(rows, F32)] if len(rows) > 1 else [])
    got = run_op("BoxWithNMSLimit", inputs, 6, device=device, **args)
    want = ref.box_with_nms_limit(scores, boxes, rows if len(rows) > 1 else None, **kw)
    names = ("scores", "boxes", "classes", "batch_splits", "keeps", "keeps_size")
    assert [g.dtype for g in got] == [F32] * 4 + [np.int32] * 2
    for name, g, w in zip(names, got, want, strict=True):
        close(g, np.asarray(w, g.dtype) if g.dtype != F32 else w, atol=1e-5, what=name)
    assert 0 < len(got[0]) < sum(rows) * (classes - 1), "the case should drop some boxes"


def test_box_with_nms_limit_class_layouts():
    """Without background boxes the class j box is column j-1 and the background the last score column;
    class-agnostic boxes share one column; output classes may count from 0."""
    scores, boxes = clustered(10, 3)
    want = run_op("BoxWithNMSLimit", [scores, boxes], 6)
    fg_last = np.concatenate([scores[:, 1:], scores[:, :1]], axis=1)
    got = run_op("BoxWithNMSLimit", [fg_last, boxes[:, 4:]], 6, input_boxes_include_bg_cls=False)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    shared = np.tile(boxes[:, 4:8], 3)
    want = run_op("BoxWithNMSLimit", [scores, shared], 3, output_classes_include_bg_cls=False)
    got = run_op("BoxWithNMSLimit", [scores, boxes[:, 4:8]], 3, cls_agnostic_bbox_reg=True,
                 output_classes_include_bg_cls=False)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert set(got[2].tolist()) <= {0.0, 1.0}


def test_box_with_nms_limit_takes_4d_inputs_and_int_splits():
    scores, boxes = clustered(9, 2)
    want = run_op("BoxWithNMSLimit", [scores, boxes, np.array([4, 5], F32)], 4)
    got = run_op("BoxWithNMSLimit", [scores[:, :, None, None], boxes[:, :, None, None],
                                     np.array([4, 5], np.int32)], 4)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_box_with_nms_limit_hand_case():
    """Two overlapping boxes of class 1 (IoU 81/121 > 0.3): the better one stays; class 2's lone box stays."""
    scores = np.array([[0.1, 0.9, 0.0], [0.1, 0.8, 0.7]], F32)
    boxes = np.array([[0, 0, 0, 0, 0, 0, 10, 10, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 11, 11, 5, 5, 8, 8]], F32)
    s, b, c, splits, keeps, sizes = run_op("BoxWithNMSLimit", [scores, boxes], 6)
    np.testing.assert_array_equal(s, np.array([0.9, 0.7], F32))
    np.testing.assert_array_equal(b, [[0, 0, 10, 10], [5, 5, 8, 8]])
    np.testing.assert_array_equal(c, [1, 2])
    np.testing.assert_array_equal(keeps, [0, 1])
    np.testing.assert_array_equal(sizes, [[0, 1, 1]])
    np.testing.assert_array_equal(splits, [2])


# ------------------------------------------------------------------------------------------- bad input
R5 = random_rois([3])
IM = np.array([[100, 100, 1]], F32)
SC, BX = clustered(4, 3)
GP = [np.zeros((1, 2, 3, 3), F32), np.zeros((1, 8, 3, 3), F32), IM, np.zeros((2, 4), F32)]
BAD = [  # (id, op, inputs, n outputs, args, error, match)
    ("bbox-f64", "BBoxTransform", [R5.astype(float), np.zeros((3, 4), F32), IM], 1, {}, DTypeError,
     "rois must be float32"),
    ("bbox-cols", "BBoxTransform", [R5[:, :3], np.zeros((3, 4), F32), IM], 1, {}, ShapeError, r"\(count, 4 or 5\)"),
    ("bbox-deltas", "BBoxTransform", [R5, np.zeros((3, 6), F32), IM], 1, {}, ShapeError, "4 \\* classes"),
    ("bbox-im-info", "BBoxTransform", [R5, np.zeros((3, 4), F32), IM[:, :2]], 1, {}, ShapeError, "im_info"),
    ("bbox-4-cols-batch", "BBoxTransform", [R5[:, 1:], np.zeros((3, 4), F32), np.tile(IM, (2, 1))], 1, {},
     ShapeError, "one image"),
    ("bbox-weights", "BBoxTransform", [R5, np.zeros((3, 4), F32), IM], 1, {"weights": [1.0, 2.0]}, ArgumentError,
     "4 values"),
    ("bbox-contradiction", "BBoxTransform", [R5, np.zeros((3, 4), F32), IM], 1,
     {"legacy_plus_one": False, "correct_transform_coords": True}, ArgumentError, "correct_transform_coords"),
    ("gp-3d", "GenerateProposals", [GP[0][0], *GP[1:]], 2, {}, ShapeError, "images, A, H, W"),
    ("gp-anchors", "GenerateProposals", [*GP[:3], np.zeros((3, 4), F32)], 2, {}, ShapeError, r"\(A, 4\) = \(2, 4\)"),
    ("gp-deltas", "GenerateProposals", [GP[0], np.zeros((1, 4, 3, 3), F32), *GP[2:]], 2, {}, ShapeError,
     "bbox_deltas"),
    ("gp-im-info", "GenerateProposals", [*GP[:2], np.zeros((2, 3), F32), GP[3]], 2, {}, ShapeError, "im_info"),
    ("gp-scale", "GenerateProposals", GP, 2, {"spatial_scale": 0.0}, ArgumentError, "spatial_scale"),
    ("gp-int", "GenerateProposals", [GP[0].astype(np.int32), *GP[1:]], 2, {}, DTypeError, "scores must be float32"),
    ("nms-boxes", "BoxWithNMSLimit", [SC, BX[:, :8]], 3, {}, ShapeError, r"4 \* 3"),
    ("nms-3d", "BoxWithNMSLimit", [SC[:, :, None], BX], 3, {}, ShapeError, "2-D"),
    ("nms-method", "BoxWithNMSLimit", [SC, BX], 3, {"soft_nms_method": "hard"}, ArgumentError, "soft_nms_method"),
    ("nms-splits-2d", "BoxWithNMSLimit", [SC, BX, np.ones((2, 2), F32)], 3, {}, ShapeError, "1-D"),
]
RUNTIME_ONLY = [  # values, not shapes: found when the op runs
    ("bbox-batch-index", "BBoxTransform", [R5 + np.array([2, 0, 0, 0, 0], F32), np.zeros((3, 4), F32), IM], 1,
     {}, ShapeError, "batch index 2, outside the 1 images"),
    ("nms-splits-sum", "BoxWithNMSLimit", [SC, BX, np.array([1, 2], F32)], 3, {}, ShapeError, "adding up to the 4"),
    *((f"gp-im-info-{v}", "GenerateProposals", [*GP[:2], np.array([v], F32), GP[3]], 2, {}, ShapeError,
       r"im_info row 0 is \[.*\]; each row must be \[height, width, scale\] of finite numbers")
      for v in ([12, np.inf, 1], [np.nan, 12, 1], [12, -np.inf, 1])),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,n_out,args,err,match", BAD + RUNTIME_ONLY,
                         ids=[b[0] for b in BAD + RUNTIME_ONLY])
def test_bad_input(device, cid, op_type, inputs, n_out, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, n_out, device=device, **args)


@pytest.mark.parametrize("cid,op_type,inputs,n_out,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_found_statically(cid, op_type, inputs, n_out, args, err, match):
    with pytest.raises(err, match=match):
        infer_alone(op_type, inputs, n_out, **args)


@pytest.mark.parametrize("op_type,inputs", [("BBoxTransform", {"X": R5, "d": np.zeros((3, 4), F32), "i": IM}),
                                            ("BoxWithNMSLimit", {"X": SC, "b": BX})])
def test_in_place_refused(op_type, inputs):
    with pytest.raises(ArgumentError, match="in place"):
        run_op(op_type, inputs, ["X", "y", "z"][:3 if op_type == "BoxWithNMSLimit" else 1])


@pytest.mark.parametrize("op_type,n_in,n_out", [("BBoxTransform", 3, 1), ("GenerateProposals", 4, 2),
                                                ("BoxWithNMSLimit", 2, 3)])
def test_no_gradient_as_in_caffe2(op_type, n_in, n_out):
    forward = make_op(op_type, [f"i{k}" for k in range(n_in)], [f"o{k}" for k in range(n_out)])
    with pytest.raises(GradientError):
        backward_ops([forward], {"o0": "o0_grad"})


# ------------------------------------------------------------------------------------------- the testers
def test_reference_checks_catch_broken_kernels(broken):
    bbox = REGISTRY.get("BBoxTransform").kernel
    broken("BBoxTransform", lambda xp, *a, **k: bbox(xp, *a, **dict(k, correct_transform_coords=False)))
    with pytest.raises(AssertionError):
        test_bbox_transform("cpu", *BBOX_CASES[0])

    proposals = REGISTRY.get("GenerateProposals").kernel
    broken("GenerateProposals", lambda xp, *a, **k: proposals(xp, *a, **dict(k, nms_thresh=1.0)))  # no NMS
    with pytest.raises(AssertionError):
        test_generate_proposals("cpu", *PROPOSAL_CASES[0])
    with pytest.raises(AssertionError):
        test_generate_proposals_matches_caffe2s_published_numbers("cpu", {}, C2_ROIS_LATER)

    nms = REGISTRY.get("BoxWithNMSLimit").kernel
    broken("BoxWithNMSLimit", lambda xp, *a, **k: nms(xp, *a, **dict(k, detections_per_im=-1)))
    with pytest.raises(AssertionError):
        test_box_with_nms_limit("cpu", *NMS_CASES[1])
    broken("BoxWithNMSLimit", lambda xp, *a, **k: nms(xp, *a, **dict(k, soft_nms_method="linear")))
    with pytest.raises(AssertionError):
        test_box_with_nms_limit("cpu", *NMS_CASES[4])


@pytest.mark.parametrize("device", DEVICES)
def test_no_rows_anywhere(device):
    """No proposals: BBoxTransform and BoxWithNMSLimit give empty outputs of the right shapes (as the
    detection nets do when nothing is found)."""
    boxes, splits = run_op("BBoxTransform", [np.zeros((0, 5), F32), np.zeros((0, 12), F32), IM], 2, device=device)
    assert boxes.shape == (0, 12) and splits.tolist() == [0]
    out = run_op("BoxWithNMSLimit", [np.zeros((0, 3), F32), boxes, splits], 6, device=device)
    assert [o.shape for o in out] == [(0,), (0, 4), (0,), (1,), (0,), (1, 3)]
