"""Rotated boxes (RRPN's [ctr_x, ctr_y, w, h, angle]) in BBoxTransform (rotated=1), GenerateProposals (5-column
anchors) and BoxWithNMSLimit (rotated=1), against the loop references of box_reference.py: corners from the
angle's definition, intersections by Sutherland-Hodgman polygon clipping in float64 (nothing shared with
rotated_boxes.py's crossing-and-containment method), NMS by its definition; Caffe2's published proposals
reproduced by angle-0 anchors (generate_proposals_op_test.cc's RotatedAngle0 check); bad inputs; broken
kernels caught."""
import numpy as np
import pytest
import test_detection as upright

from stepnet.core.errors import ArgumentError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops import rotated_boxes as rot
from stepnet.testing import DEVICES, infer_alone, run_op

import box_reference as ref

rng = np.random.default_rng(61)
F32 = np.float32


def random_rotated(n, size=60.0, angles=(-90, 90)):
    """Rotated boxes scattered so that many overlap; a few exactly upright."""
    ctr = rng.uniform(0, size, (n, 2))
    wh = rng.uniform(4, size / 2, (n, 2))
    a = rng.uniform(*angles, (n, 1))
    a[::4] = 0.0
    return np.concatenate([ctr, wh, a], axis=1).astype(F32)


def close(got, want, atol=2e-3, what="output"):
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, err_msg=what)


# ------------------------------------------------------------------------------------------- intersections
def test_intersections_against_polygon_clipping():
    boxes = random_rotated(60)
    for i in range(0, 60, 6):
        got = rot.intersections(boxes[i], boxes)
        want = [ref.polygon_area(ref.clip_polygon(ref.rotated_corners(boxes[i]), ref.rotated_corners(b)) or [(0, 0)])
                for b in boxes]
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-3)
        assert (np.array(want) > 0).sum() > 3 and (np.array(want) == 0).sum() > 3


def test_intersection_hand_cases():
    square = [10, 10, 4, 4, 0]
    cases = [([10, 10, 4, 4, 0], 16.0),              # identical: the smaller area
             ([10, 10, 4, 4, 90], 16.0),             # the same square turned a quarter
             ([10, 10, 2, 2, 30], 4.0),              # inside
             ([12, 10, 4, 4, 0], 8.0),               # half over
             ([14, 10, 4, 4, 0], 0.0),               # touching edges: no area
             ([30, 30, 4, 4, 45], 0.0),              # apart
             ([10, 10, 4, 4, 45], 32 * (np.sqrt(2) - 1))]   # a regular octagon
    got = rot.intersections(np.array(square, F32), np.array([c for c, _ in cases], F32))
    np.testing.assert_allclose(got, [a for _, a in cases], rtol=1e-5, atol=1e-4)


def test_angle_turns_counter_clockwise_in_the_image():
    """A 4x2 box at 90 degrees covers x in [9, 11], y in [8, 12]; at 30 degrees its corners are the
    reference's (in another order)."""
    corners = rot.corners(np.array([[10, 10, 4, 2, 90], [10, 10, 4, 2, 30]], F32))
    np.testing.assert_allclose(sorted(corners[0].tolist()), [[9, 8], [9, 12], [11, 8], [11, 12]], atol=1e-5)
    np.testing.assert_allclose(sorted(corners[1].tolist()), sorted(ref.rotated_corners([10, 10, 4, 2, 30])),
                               atol=1e-5)
    leaning = rot.intersections(np.array([10, 10, 4, 2, 30], F32), np.array([[11, 9, 1, 1, 0], [11, 11, 1, 1, 0]], F32))
    assert leaning[0] > 0.9 and leaning[1] < 0.5     # counter-clockwise in the image: the right end goes up


# ------------------------------------------------------------------------------------------- BBoxTransform
BBOX_CASES = [  # (id, rois per image, classes, args, reference keywords)
    ("one-image", [6], 1, {}, {}),
    ("batch-weights", [3, 0, 4], 2, {"weights": [10.0, 10.0, 5.0, 5.0], "apply_scale": False},
     {"weights": (10, 10, 5, 5), "apply_scale": False}),
    ("bounds-0-180", [5], 2, {"angle_bound_lo": 0, "angle_bound_hi": 180}, {"bound": (0, 180)}),
    ("no-bounds-no-clip", [5], 1, {"angle_bound_on": False, "clip_angle_thresh": -1.0},
     {"bound": None, "clip_thresh": -1.0}),
    ("no-plus-one", [4], 2, {"legacy_plus_one": False}, {"plus_one": 0}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,counts,classes,args,kw", BBOX_CASES, ids=[c[0] for c in BBOX_CASES])
def test_bbox_transform_rotated(device, cid, counts, classes, args, kw):
    boxes = random_rotated(sum(counts), size=100.0)
    rois = np.concatenate([np.repeat(np.arange(len(counts)), counts)[:, None], boxes], axis=1).astype(F32)
    if len(counts) == 1 and cid == "one-image":
        rois = np.ascontiguousarray(rois[:, 1:])
    deltas = rng.normal(0, 0.4, (len(rois), 5 * classes)).astype(F32)
    deltas[:, 4::5] = rng.uniform(-1.2, 1.2, (len(rois), classes))     # up to ~70 degrees: bounds bite
    deltas[0, 4] = 0.0                                                 # an upright box stays upright: clipped
    im_info = np.array([[80, 90, s] for s in (1.0, 0.5, 2.0)[:len(counts)]], F32)
    got, splits = run_op("BBoxTransform", [rois, deltas, im_info], 2, device=device, rotated=True, **args)
    want, want_counts = ref.bbox_transform_rotated(rois, deltas, im_info, **kw)
    close(got, want)
    np.testing.assert_array_equal(splits, np.array(want_counts, F32))


# ------------------------------------------------------------------------------------------- GenerateProposals
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("args,kw", [({}, {}), ({"pre_nms_topN": 30, "post_nms_topN": 6, "nms_thresh": 0.4,
                                                 "angle_bound_lo": -45, "angle_bound_hi": 135},
                                                {"pre": 30, "post": 6, "thresh": 0.4, "bound": (-45, 135)})],
                         ids=["default", "limits-bounds"])
def test_generate_proposals_rotated(device, args, kw):
    anchors = np.array([[7.5, 7.5, w, h, a] for w, h in ((32, 16), (24, 24)) for a in (-60, 0, 45)], F32)
    A, H, W = len(anchors), 4, 5
    scores = rng.uniform(0, 1, (2, A, H, W)).astype(F32)
    deltas = rng.normal(0, 0.3, (2, 5 * A, H, W)).astype(F32)
    im_info = np.array([[H * 16 - 3, W * 16 + 2, 1.0], [H * 16, W * 16, 0.8]], F32)
    rois, probs = run_op("GenerateProposals", [scores, deltas, im_info, anchors], 2, device=device,
                         spatial_scale=1 / 16, min_size=8.0, **args)
    p = {"pre": 6000, "post": 300, "thresh": 0.7, "bound": (-90, 90), **kw}
    want_rois, want_probs = ref.generate_proposals_rotated(scores, deltas, im_info, anchors, 16.0, p["pre"],
                                                           p["post"], p["thresh"], 8.0, bound=p["bound"])
    assert 1 < len(want_rois) < 2 * A * H * W, "NMS should drop some proposals"
    close(rois, want_rois, what="rois")
    close(probs, want_probs, atol=0, what="probs")
    specs = infer_alone("GenerateProposals", [scores, deltas, im_info, anchors], ["r", "p"])
    assert specs["r"].shape is None and specs["r"].dtype == F32


def test_angle_0_anchors_reproduce_caffe2s_upright_proposals():
    """Upright anchors as [ctr, w, h, 0]: the published rois, as rotated boxes (Caffe2's RotatedAngle0 test)."""
    up = np.array([[-38, -16, 53, 31], [-120, -120, 135, 135]], F32)
    anchors = np.concatenate([(up[:, :2] + up[:, 2:]) / 2, up[:, 2:] - up[:, :2] + 1, np.zeros((2, 1))], 1)
    deltas = np.array(upright.C2_DELTAS, F32).reshape(1, 2, 4, 4, 5)
    deltas = np.concatenate([deltas, np.zeros((1, 2, 1, 4, 5), F32)], axis=2).reshape(1, 10, 4, 5)
    rois, probs = run_op("GenerateProposals", [np.array(upright.C2_SCORES, F32).reshape(1, 2, 4, 5), deltas,
                                               np.array([[60, 80, 0.166667]], F32), anchors.astype(F32)], 2,
                         spatial_scale=1 / 16, pre_nms_topN=6000, post_nms_topN=300, nms_thresh=0.7, min_size=16.0)
    want = np.array(upright.C2_ROIS_LATER, F32)
    as_rotated = np.concatenate([want[:, :1], (want[:, 1:3] + want[:, 3:5]) / 2, want[:, 3:5] - want[:, 1:3] + 1,
                                 np.zeros((len(want), 1))], axis=1)
    close(rois, as_rotated, atol=1e-3, what="rois")
    close(probs, np.array(upright.C2_PROBS, F32), atol=1e-4, what="probs")


# ------------------------------------------------------------------------------------------- BoxWithNMSLimit
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("args,kw", [({}, {}), ({"nms": 0.2, "detections_per_im": 7}, {"nms_thresh": 0.2, "limit": 7}),
                                     ({"soft_nms_enabled": True, "soft_nms_method": "gaussian"}, {"soft": "gaussian"}),
                                     ({"soft_nms_enabled": True, "nms": 0.2}, {"soft": "linear", "nms_thresh": 0.2})],
                         ids=["default", "limit", "soft-gaussian", "soft-linear"])
def test_box_with_nms_limit_rotated(device, args, kw):
    rows, classes = [9, 8], 3
    scores = rng.uniform(0, 1, (sum(rows), classes)).astype(F32)
    boxes = np.concatenate([random_rotated(sum(rows), size=30.0) for _ in range(classes)], axis=1)
    got = run_op("BoxWithNMSLimit", [scores, boxes, np.array(rows, F32)], 6, device=device, rotated=True, **args)
    want = ref.box_with_nms_limit(scores, boxes, rows, rotated=True, **kw)
    for name, g, w in zip(("scores", "boxes", "classes", "splits", "keeps", "sizes"), got, want, strict=True):
        close(g, np.asarray(w, g.dtype) if g.dtype != F32 else w, atol=1e-5, what=name)
    assert got[1].shape[1] == 5 and 0 < len(got[0])
    if not args.get("soft_nms_enabled"):
        assert len(got[0]) < sum(rows) * (classes - 1), "NMS should drop some boxes"
    else:
        start = np.repeat([0, rows[0]], got[3].astype(int))
        raw = scores[start + got[4], got[2].astype(int)]
        assert (got[0] < raw).any(), "soft-NMS should lower some scores"


# ------------------------------------------------------------------------------------------- bad input
R6 = np.concatenate([np.zeros((3, 1)), random_rotated(3)], axis=1).astype(F32)
IM = np.array([[100, 100, 1]], F32)
GP = [np.zeros((1, 2, 3, 3), F32), np.zeros((1, 10, 3, 3), F32), IM, np.zeros((2, 5), F32)]
BAD = [  # (id, op, inputs, outputs, args, error, match)
    ("bbox-deltas", "BBoxTransform", [R6, np.zeros((3, 8), F32), IM], 1, {"rotated": True}, ShapeError,
     r"5 \* classes"),
    ("bbox-rois", "BBoxTransform", [R6[:, :4], np.zeros((3, 5), F32), IM], 1, {"rotated": True}, ShapeError,
     r"\(count, 5 or 6\)"),
    ("bbox-period", "BBoxTransform", [R6, np.zeros((3, 5), F32), IM], 1,
     {"rotated": True, "angle_bound_lo": -90, "angle_bound_hi": 45}, ArgumentError, "multiple of 180"),
    ("gp-deltas", "GenerateProposals", [GP[0], np.zeros((1, 8, 3, 3), F32), *GP[2:]], 2, {}, ShapeError,
     r"\(images, 5A, H, W\)"),
    ("gp-period", "GenerateProposals", GP, 2, {"angle_bound_lo": 0, "angle_bound_hi": 90}, ArgumentError,
     "multiple of 180"),
    ("gp-anchor-cols", "GenerateProposals", [*GP[:3], np.zeros((2, 6), F32)], 2, {}, ShapeError,
     r"\(A, 5\) = \(2, 5\) rotated"),
    ("nms-boxes", "BoxWithNMSLimit", [np.zeros((4, 3), F32), np.zeros((4, 12), F32)], 3, {"rotated": True},
     ShapeError, r"5 \* 3"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,n_out,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input(device, cid, op_type, inputs, n_out, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, n_out, device=device, **args)


@pytest.mark.parametrize("cid,op_type,inputs,n_out,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_found_statically(cid, op_type, inputs, n_out, args, err, match):
    with pytest.raises(err, match=match):
        infer_alone(op_type, inputs, n_out, **args)


def test_angle_bounds_are_free_when_off():
    got = run_op("BBoxTransform", [R6, np.zeros((3, 5), F32), IM], 1, rotated=True, angle_bound_on=False,
                 angle_bound_lo=0, angle_bound_hi=45)
    assert got.shape == (3, 5)


def test_reference_checks_catch_broken_kernels(broken):
    bbox = REGISTRY.get("BBoxTransform").kernel
    broken("BBoxTransform", lambda xp, *a, **k: bbox(xp, *a, **dict(k, angle_bound_on=False)))
    with pytest.raises(AssertionError):
        test_bbox_transform_rotated("cpu", *BBOX_CASES[0])
    proposals = REGISTRY.get("GenerateProposals").kernel
    broken("GenerateProposals", lambda xp, *a, **k: proposals(xp, *a, **dict(k, clip_angle_thresh=-1.0)))
    with pytest.raises(AssertionError):
        test_generate_proposals_rotated("cpu", {}, {})
    nms = REGISTRY.get("BoxWithNMSLimit").kernel

    def upright_overlaps(xp, scores, boxes, splits, **k):   # IoU of the boxes' upright hulls: wrong
        b = boxes.reshape(len(boxes), -1, 5).copy()
        b[..., 4] = 0
        return nms(xp, scores, b.reshape(boxes.shape), splits, **k)
    broken("BoxWithNMSLimit", upright_overlaps)
    with pytest.raises(AssertionError):
        test_box_with_nms_limit_rotated("cpu", {}, {})
