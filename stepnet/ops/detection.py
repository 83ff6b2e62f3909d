"""Detection ops of Faster / Mask R-CNN (Detectron's nets): BBoxTransform, GenerateProposals (also under its
older name GenerateProposalsCPP) and BoxWithNMSLimit, with Caffe2's semantics (bbox_transform_op.cc,
generate_proposals_op.cc, box_with_nms_limit_op.cc and their 2019+ arguments); RoIAlign is in roi_align.py.

All three take float32 boxes [x1, y1, x2, y2] in pixels, or rotated boxes [ctr_x, ctr_y, w, h, angle in
degrees] (Caffe2's RRPN form: 5-column anchors for GenerateProposals, rotated=1 for the other two; their
arithmetic is in rotated_boxes.py), and have no gradient (SHOULD_NOT_DO_GRADIENT). BBoxTransform runs on the
op's device; the other two sort and suppress on the host (Caffe2 runs NMS on the CPU too) and put their
results on the op's device. Ties between equal scores are broken by position (stable sorts), where Caffe2's
std::sort leaves them open.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ShapeError
from . import boxes as bx
from . import rotated_boxes as rot
from .base import Meta, out_spec, value_dependent
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op

PLUS_ONE = Arg("bool", True, "the + 1 in box widths/heights and the - 1 in clipping (Caffe2's legacy_plus_one)")
CORRECT = Arg("bool", None, "2018 form of the - 1 on transformed x2/y2: given, it decides it (0 or 1); absent, "
                            "legacy_plus_one does")
ROTATED_ONLY = {"angle_bound_on": Arg("bool", True, "rotated boxes: bring transformed angles into "
                                                    "[angle_bound_lo, angle_bound_hi]"),
                "angle_bound_lo": Arg("int", -90, "rotated boxes: least angle (degrees)"),
                "angle_bound_hi": Arg("int", 90, "rotated boxes: largest angle (degrees); hi - lo a multiple of 180"),
                "clip_angle_thresh": Arg("float", 1.0, "rotated boxes: only boxes within this many degrees of "
                                                      "upright are clipped (negative: none)")}


def _host(x) -> np.ndarray:
    return np.asarray(backend.to_host(x))


# ------------------------------------------------------------------------------------------- BBoxTransform
def _bbox_checks(rois, deltas, im_info, weights, rotated, legacy_plus_one, correct_transform_coords, args):
    """The box width: 5 for rotated boxes, else 4."""
    box = 5 if rotated else 4
    bx.check_f32("BBoxTransform", rois=rois, deltas=deltas, im_info=im_info)
    bx.check_weights(weights)
    bx.transform_offset(legacy_plus_one, correct_transform_coords)
    if rotated:
        rot.check_angle_bounds(args["angle_bound_on"], args["angle_bound_lo"], args["angle_bound_hi"])
        bx.check_rows("rois", rois, (5, 6), "rotated boxes [ctr_x, ctr_y, w, h, angle], or with a batch index first")
    else:
        bx.check_rows("rois", rois, (4, 5), "boxes [x1, y1, x2, y2], or [batch index, x1, y1, x2, y2]")
    if len(deltas.shape) != 2 or deltas.shape[0] != rois.shape[0] or deltas.shape[1] % box:
        raise ShapeError(f"deltas must be (rois, {box} * classes) = ({rois.shape[0]}, {box}K), got shape "
                         f"{tuple(deltas.shape)}")
    bx.check_rows("im_info", im_info, (3,), "rows [height, width, scale], one per image")
    if rois.shape[1] == box and im_info.shape[0] != 1:
        raise ShapeError(f"rois without a batch-index column belong to one image, but im_info has "
                         f"{im_info.shape[0]} rows")
    return box


def _bbox_shape(specs, *, weights, apply_scale, rotated, legacy_plus_one, correct_transform_coords, **args):
    rois, deltas, im_info = specs
    _bbox_checks(Meta(rois), Meta(deltas), Meta(im_info), weights, rotated, legacy_plus_one,
                 correct_transform_coords, args)
    return [out_spec(deltas.shape, np.float32), out_spec((im_info.shape[0],), np.float32)]


@op("BBoxTransform", inputs=3, outputs=(1, 2), inplace=(), shape=_bbox_shape, gradient=SHOULD_NOT_DO_GRADIENT,
    args={"weights": Arg("floats", (1.0, 1.0, 1.0, 1.0), "[wx, wy, ww, wh] the deltas are divided by"),
          "apply_scale": Arg("bool", True, "scale the boxes back by im_info's scale after the transform"),
          "rotated": Arg("bool", False, "rotated boxes [ctr_x, ctr_y, w, h, angle]: rois (M, 5 or 6), deltas "
                                       "(M, 5K) [dx, dy, dw, dh, da (radians)]"), **ROTATED_ONLY,
          "legacy_plus_one": PLUS_ONE, "correct_transform_coords": CORRECT})
def bbox_transform(xp, rois, deltas, im_info, *, weights, apply_scale, rotated, legacy_plus_one,
                   correct_transform_coords, **args):
    """rois (M, 4 or 5), deltas (M, 4K), im_info (B, 3) -> boxes (M, 4K), roi_batch_splits (B,) float.

    Each roi (divided by its image's scale) is moved by each of its K deltas [dx, dy, dw, dh] / weights (the
    centre shifted by dx·width and dy·height, the sides scaled by exp(dw) and exp(dh), dw and dh capped at
    log(1000/16)), clipped to the image of round(height / scale) x round(width / scale) pixels, and multiplied
    by the scale again when apply_scale. As in Caffe2, rows are assigned to images by counting: the first n_0
    rows (n_b = rows whose batch index is b) use image 0's im_info, the next n_1 image 1's, so the rois must be
    grouped by image in increasing order (as GenerateProposals writes them). With rotated=1 the boxes are
    [ctr_x, ctr_y, w, h, angle] (see rotated_boxes.py): the angle is neither scaled nor weighted, and only
    boxes within clip_angle_thresh degrees of upright are clipped.
    """
    box = _bbox_checks(rois, deltas, im_info, weights, rotated, legacy_plus_one, correct_transform_coords, args)
    offset = bx.transform_offset(legacy_plus_one, correct_transform_coords)
    batch = im_info.shape[0]
    if rois.shape[1] == box + 1:
        ids = np.trunc(_host(rois[:, 0])).astype(np.int64)
        bad = np.flatnonzero((ids < 0) | (ids >= batch))
        if bad.size:
            raise ShapeError(f"rois[{bad[0]}] has batch index {ids[bad[0]]}, outside the {batch} images of im_info")
        counts = np.bincount(ids, minlength=batch)
    else:
        counts = np.array([rois.shape[0]])
    image = xp.asarray(np.repeat(np.arange(batch), counts))
    info = im_info[image]                                  # (M, 3): each row's image
    scale = info[:, 2:3]
    size = (im_info[:, :2] / im_info[:, 2:3]).astype(np.float64) + 0.5
    size = size.astype(np.int64).astype(np.float32)[image]  # int(h / scale + 0.5), int(w / scale + 0.5)
    if rotated:
        boxes = xp.concatenate([rois[:, -5:-1] / scale, rois[:, -1:]], axis=1)
        boxes = rot.transform(xp, boxes, deltas, weights, args["angle_bound_on"], args["angle_bound_lo"],
                              args["angle_bound_hi"])
        boxes = rot.clip(xp, boxes, size[:, 0:1], size[:, 1:2], args["clip_angle_thresh"], legacy_plus_one)
        if apply_scale:   # the angle keeps its degrees
            factor = xp.concatenate([xp.broadcast_to(scale, (len(scale), 4)), xp.ones_like(scale)], axis=1)
            boxes = (boxes.reshape(len(boxes), -1, 5) * factor[:, None]).reshape(boxes.shape)
    else:
        boxes = bx.transform(xp, rois[:, -4:] / scale, deltas, weights, legacy_plus_one, offset)
        boxes = bx.clip(xp, boxes, size[:, 0:1], size[:, 1:2], legacy_plus_one)
        if apply_scale:
            boxes = boxes * scale
    return boxes.astype(np.float32), xp.asarray(counts.astype(np.float32))


# ------------------------------------------------------------------------------------------- GenerateProposals
def _proposal_checks(scores, deltas, im_info, anchors, spatial_scale, legacy_plus_one, correct_transform_coords,
                     args):
    """The box width: 5 for rotated anchors (RRPN), else 4."""
    bx.transform_offset(legacy_plus_one, correct_transform_coords)
    bx.check_f32("GenerateProposals", scores=scores, bbox_deltas=deltas, im_info=im_info, anchors=anchors)
    if len(scores.shape) != 4:
        raise ShapeError(f"scores must be (images, A, H, W), got shape {tuple(scores.shape)}")
    n, a, h, w = scores.shape
    box = anchors.shape[1] if len(anchors.shape) == 2 and anchors.shape[1] in (4, 5) else 4
    if tuple(anchors.shape) != (a, box):
        raise ShapeError(f"anchors must be (A, 4) = ({a}, 4) boxes, or (A, 5) = ({a}, 5) rotated boxes, for scores "
                         f"of shape {tuple(scores.shape)}, got {tuple(anchors.shape)}")
    if box == 5:
        rot.check_angle_bounds(args["angle_bound_on"], args["angle_bound_lo"], args["angle_bound_hi"])
    if tuple(deltas.shape) != (n, box * a, h, w):
        raise ShapeError(f"bbox_deltas must be (images, {box}A, H, W) = {(n, box * a, h, w)}, got "
                         f"{tuple(deltas.shape)}")
    if tuple(im_info.shape) != (n, 3):
        raise ShapeError(f"im_info must be (images, 3) = ({n}, 3) rows [height, width, scale], got "
                         f"{tuple(im_info.shape)}")
    if not spatial_scale > 0:
        raise ArgumentError(f"spatial_scale must be > 0 (the feature stride is its inverse), got {spatial_scale}")
    return box


def _proposal_shape(specs, *, spatial_scale, legacy_plus_one, correct_transform_coords, **args):
    box = _proposal_checks(*map(Meta, specs), spatial_scale, legacy_plus_one, correct_transform_coords, args)
    return [value_dependent((None, box + 1), np.float32), value_dependent((None,), np.float32)]


@op("GenerateProposals", inputs=4, outputs=2, inplace=(), aliases=("GenerateProposalsCPP",),
    shape=_proposal_shape, gradient=SHOULD_NOT_DO_GRADIENT,
    args={"spatial_scale": Arg("float", 1.0 / 16, "feature-map scale; the anchor stride is 1 / spatial_scale"),
          "pre_nms_topN": Arg("int", 6000, "best-scored anchors kept before NMS (<= 0: all)"),
          "post_nms_topN": Arg("int", 300, "proposals kept after NMS (<= 0: all)"),
          "nms_thresh": Arg("float", 0.7, "IoU above which NMS drops a proposal"),
          "min_size": Arg("float", 16.0, "least side (times the image scale) of a proposal"),
          **ROTATED_ONLY, "legacy_plus_one": PLUS_ONE, "correct_transform_coords": CORRECT})
def generate_proposals(xp, scores, deltas, im_info, anchors, *, spatial_scale, pre_nms_topN, post_nms_topN,
                       nms_thresh, min_size, legacy_plus_one, correct_transform_coords, **args):
    """scores (N, A, H, W), bbox_deltas (N, 4A, H, W), im_info (N, 3), anchors (A, 4) -> rois (n, 5)
    [image, x1, y1, x2, y2], rois_probs (n,).

    Per image: anchor a at cell (h, w) is anchors[a] shifted by (w, h) / spatial_scale; the pre_nms_topN best
    scored are moved by their deltas (weights 1), clipped to the image (int(height) x int(width)), those with
    a side under min_size * scale or a centre outside the image dropped, then greedy NMS at nms_thresh keeps
    at most post_nms_topN, best first. (Caffe2's 2018 code dropped small boxes before taking the
    pre_nms_topN best; Detectron and later Caffe2 take the best first, as here.)

    Rotated anchors (A, 5) [ctr_x, ctr_y, w, h, angle] (RRPN) take deltas (N, 5A, H, W) and give rois (n, 6)
    [image, ctr_x, ctr_y, w, h, angle]: the centres move with the cells, the transform, clipping (of nearly
    upright boxes only), size filter and NMS (by the rotated boxes' polygon overlap) are rotated_boxes.py's.
    """
    box = _proposal_checks(scores, deltas, im_info, anchors, spatial_scale, legacy_plus_one,
                           correct_transform_coords, args)
    offset = bx.transform_offset(legacy_plus_one, correct_transform_coords)
    n, a, h, w = scores.shape
    stride = float(np.float32(1.0 / float(np.float32(spatial_scale))))
    grid = bx.anchor_grid(_host(anchors), h, w, stride)
    all_scores, all_deltas, info = _host(scores), _host(deltas), _host(im_info)
    bx.check_im_info(info)   # clipping takes whole pixels of its sides
    rois, probs = [], []
    for i in range(n):
        s = all_scores[i].reshape(a, h * w).T.reshape(-1)              # rows (h, w, a), as the anchors
        d = all_deltas[i].reshape(box * a, h * w).T.reshape(-1, box)
        order = np.argsort(-s, kind="stable")
        if 0 < pre_nms_topN < s.size:
            order = order[:pre_nms_topN]
        if box == 5:
            boxes = rot.transform(np, grid[order], d[order], (1.0, 1.0, 1.0, 1.0), args["angle_bound_on"],
                                  args["angle_bound_lo"], args["angle_bound_hi"])
            boxes = rot.clip(np, boxes, int(info[i, 0]), int(info[i, 1]), args["clip_angle_thresh"],
                             legacy_plus_one)
            keep = rot.keep_by_size(boxes, min_size, info[i])
        else:
            boxes = bx.transform(np, grid[order], d[order], (1.0, 1.0, 1.0, 1.0), legacy_plus_one, offset)
            boxes = bx.clip(np, boxes, int(info[i, 0]), int(info[i, 1]), legacy_plus_one)
            keep = bx.keep_by_size(boxes, min_size, info[i], legacy_plus_one)
        top = post_nms_topN if 0 < post_nms_topN < keep.size else -1
        keep = bx.nms(boxes, keep, nms_thresh, top, legacy_plus_one)
        rois.append(np.concatenate([np.full((len(keep), 1), i, np.float32), boxes[keep]], axis=1))
        probs.append(s[order][keep])
    return (xp.asarray(np.concatenate(rois).reshape(-1, box + 1).astype(np.float32)),
            xp.asarray(np.concatenate(probs).astype(np.float32)))


# ------------------------------------------------------------------------------------------- BoxWithNMSLimit
def _nms_limit_checks(scores, boxes, splits, args):
    box = 5 if args["rotated"] else 4
    bx.check_f32("BoxWithNMSLimit", scores=scores, boxes=boxes)
    if args["soft_nms_method"] not in bx.SOFT_NMS_METHODS:
        raise ArgumentError(f"soft_nms_method must be 'linear' or 'gaussian', got {args['soft_nms_method']!r}")
    for name, x in (("scores", scores), ("boxes", boxes)):
        if not (len(x.shape) == 2 or (len(x.shape) == 4 and tuple(x.shape[2:]) == (1, 1))):
            raise ShapeError(f"{name} must be 2-D (count, ...) or 4-D (count, ..., 1, 1), got {tuple(x.shape)}")
    count, classes = scores.shape[:2]
    box_classes = 1 if args["cls_agnostic_bbox_reg"] else classes - (not args["input_boxes_include_bg_cls"])
    if boxes.shape[0] != count or boxes.shape[1] != box * box_classes:
        raise ShapeError(f"boxes must be (count, {box} * {box_classes}) = ({count}, {box * box_classes}) for "
                         f"scores of shape {tuple(scores.shape)}, got {tuple(boxes.shape)}")
    if splits is not None:
        if len(splits.shape) != 1:
            raise ShapeError(f"batch_splits must be 1-D (one count per image), got shape {tuple(splits.shape)}")
        if splits.dtype is not None and np.dtype(splits.dtype).kind not in "fiu":
            raise ShapeError(f"batch_splits must hold numbers, got {splits.dtype}")
    return count, classes, (1 if splits is None else splits.shape[0])


NMS_LIMIT_ARGS = {
    "score_thresh": Arg("float", 0.05, "scores above it take part"),
    "nms": Arg("float", 0.3, "IoU above which NMS drops a box (per class)"),
    "detections_per_im": Arg("int", 100, "boxes kept per image over all classes (<= 0: all)"),
    "soft_nms_enabled": Arg("bool", False, "soft-NMS instead of greedy NMS"),
    "soft_nms_method": Arg("str", "linear", "'linear' or 'gaussian'"),
    "soft_nms_sigma": Arg("float", 0.5, "the Gaussian's sigma"),
    "soft_nms_min_score_thres": Arg("float", 0.001, "soft-NMS drops boxes whose score falls below it"),
    "rotated": Arg("bool", False, "rotated boxes [ctr_x, ctr_y, w, h, angle]: boxes (count, 5C), NMS by their "
                                  "polygon overlap"),
    "cls_agnostic_bbox_reg": Arg("bool", False, "one box per row shared by every class"),
    "input_boxes_include_bg_cls": Arg("bool", True, "boxes (and scores) start with the background class; "
                                      "without it the background is the last score column"),
    "output_classes_include_bg_cls": Arg("bool", True, "class ids count the background (first foreground = 1)"),
    "legacy_plus_one": PLUS_ONE,
}


def _nms_limit_shape(specs, **args):
    _nms_limit_checks(Meta(specs[0]), Meta(specs[1]), Meta(specs[2]) if len(specs) > 2 else None, args)
    n = (None,)
    batch = 1 if len(specs) < 3 else specs[2].shape[0]
    box = 5 if args["rotated"] else 4
    return [value_dependent(n, np.float32), value_dependent(n + (box,), np.float32), value_dependent(n, np.float32),
            out_spec((batch,), np.float32), value_dependent(n, np.int32),
            out_spec((batch, specs[0].shape[1]), np.int32)]


@op("BoxWithNMSLimit", inputs=(2, 3), outputs=(3, 6), inplace=(), shape=_nms_limit_shape,
    gradient=SHOULD_NOT_DO_GRADIENT, args=NMS_LIMIT_ARGS)
def box_with_nms_limit(xp, scores, boxes, batch_splits=None, **args):
    """scores (n, C) (class 0 the background), boxes (n, 4C)[, batch_splits (B,)] -> scores (k,), boxes (k, 4),
    classes (k,) float, batch_splits (B,) float, keeps (k,) int32, keeps_size (B, C) int32.

    Per image (its batch_splits rows) and foreground class: the rows scoring above score_thresh, by score,
    through NMS (or soft-NMS, whose updated scores are then the scores). Over all classes at most
    detections_per_im are kept, the best scored (ties: earlier class, then earlier kept). Output rows go image
    by image, class by class; keeps are row indices within the image, keeps_size the count per class. With
    rotated=1 boxes are (n, 5C) rotated boxes, suppressed by their polygon IoU, and the output boxes (k, 5).
    """
    count, classes, batch = _nms_limit_checks(scores, boxes, batch_splits, args)
    S = _host(scores).reshape(count, classes)
    Bx = _host(boxes).reshape(count, int(np.prod(boxes.shape[1:])))
    box = 5 if args["rotated"] else 4
    if batch_splits is None:
        splits = np.array([count])
    else:
        splits = np.trunc(_host(batch_splits)).astype(np.int64)
        if (splits < 0).any() or splits.sum() != count:
            raise ShapeError(f"batch_splits {splits.tolist()} must be counts adding up to the {count} rows")
    include_bg = args["input_boxes_include_bg_cls"]
    score_col = (lambda j: j) if include_bg else (lambda j: j - 1)
    box_col = ((lambda j: 0) if args["cls_agnostic_bbox_reg"] else score_col)
    method = bx.SOFT_NMS_METHODS[args["soft_nms_method"]] if args["soft_nms_enabled"] else 0
    limit, plus_one = args["detections_per_im"], args["legacy_plus_one"]
    out = {k: [] for k in ("scores", "boxes", "classes", "keeps")}
    sizes = np.zeros((batch, classes), np.int32)
    start = 0
    for b, rows in enumerate(splits.tolist()):
        s, bxs = S[start:start + rows], Bx[start:start + rows]
        start += rows
        keeps, used = {}, {}
        for j in range(1, classes):
            col = s[:, score_col(j)]
            cand = np.flatnonzero(col > np.float32(args["score_thresh"]))
            cb = bxs[:, box * box_col(j):box * box_col(j) + box]
            if method:
                keeps[j], used[j] = bx.soft_nms(cb, col, cand, args["soft_nms_sigma"], args["nms"],
                                                args["soft_nms_min_score_thres"], method, plus_one)
            else:
                order = cand[np.argsort(-col[cand], kind="stable")]
                keeps[j] = bx.nms(cb, order, args["nms"], limit if limit > 0 else -1, plus_one)
                used[j] = col
        total = sum(len(k) for k in keeps.values())
        if 0 < limit < total:
            ranked = [(j, i) for j in range(1, classes) for i in keeps[j]]
            ranked.sort(key=lambda ji: -used[ji[0]][ji[1]])    # stable: class, then kept order
            keeps = {j: [i for jj, i in ranked[:limit] if jj == j] for j in range(1, classes)}
        for j in range(1, classes):
            k = np.asarray(keeps[j], dtype=np.int64)
            out["scores"].append(used[j][k])
            out["boxes"].append(bxs[k, box * box_col(j):box * box_col(j) + box].reshape(-1, box))
            out["classes"].append(np.full(k.size, j - (not args["output_classes_include_bg_cls"]), np.float32))
            out["keeps"].append(k)
            sizes[b, j] = k.size
    cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}
    per_image = sizes.sum(axis=1).astype(np.float32)
    return (xp.asarray(cat["scores"].astype(np.float32)),
            xp.asarray(cat["boxes"].reshape(-1, box).astype(np.float32)),
            xp.asarray(cat["classes"].astype(np.float32)), xp.asarray(per_image),
            xp.asarray(cat["keeps"].astype(np.int32)), xp.asarray(sizes))
