"""Box arithmetic shared by the detection ops (detection.py): the regression transform, clipping, the size
filter and greedy / soft non-maximum suppression, as caffe2/operators/generate_proposals_op_util_boxes.h and
generate_proposals_op_util_nms.h define them (after Detectron's utils/boxes.py and cython_nms.pyx).

Boxes are rows [x1, y1, x2, y2] in pixels. `plus_one` is Caffe2's legacy_plus_one, "the infamous + 1 dating
back to the DPM days": with it a box from x1 to x2 is x2 - x1 + 1 pixels wide, clipping keeps x2 <= width - 1,
and a transformed box's far corner is moved in by `offset` (1 in Detectron and in Caffe2 since 2019; 0 in the
2018 code unless correct_transform_coords was set). Everything is computed in the boxes' own float type, as
Caffe2 computes it in float32. `transform` and `clip` take the array module, so BBoxTransform runs them on
the op's device; the rest are host (numpy) loops, the way Caffe2 runs NMS on the CPU.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from . import rotated_boxes as rotated

# The largest log-space width/height change a delta may ask for: log(1000 / 16), stored as a float32.
BBOX_XFORM_CLIP = np.float32(math.log(1000.0 / 16.0))
SOFT_NMS_METHODS = {"linear": 1, "gaussian": 2}


def check_f32(op_type: str, **named) -> None:
    """DTypeError unless every named array (or TensorSpec) is float32: Caffe2's box ops take float only."""
    for name, x in named.items():
        if x is not None and x.dtype is not None and np.dtype(x.dtype) != np.float32:
            raise DTypeError(f"{op_type}: {name} must be float32, got {np.dtype(x.dtype)} (Caffe2's {op_type} "
                             "reads float data only; Cast to=1 converts)")


def transform_offset(plus_one: bool, correct_transform_coords) -> int:
    """How far a transformed box's x2/y2 move in: legacy_plus_one's 1, unless the 2018 argument
    correct_transform_coords is given (0 or 1), which only has a meaning with the + 1 widths."""
    if correct_transform_coords is None:
        return int(plus_one)
    if correct_transform_coords and not plus_one:
        raise ArgumentError("correct_transform_coords=1 moves x2/y2 in by the + 1 of legacy_plus_one, which is 0 "
                            "here; drop correct_transform_coords (legacy_plus_one alone decides)")
    return int(bool(correct_transform_coords))


def check_weights(weights) -> tuple:
    if len(weights) != 4:
        raise ArgumentError(f"weights must list 4 values [wx, wy, ww, wh], got {list(weights)}")
    if any(w == 0 for w in weights):
        raise ArgumentError(f"weights must be non-zero (the deltas are divided by them), got {list(weights)}")
    return tuple(float(w) for w in weights)


def transform(xp, boxes, deltas, weights, plus_one: bool, offset: int):
    """Boxes (M, 4) moved by deltas (M, 4K), K boxes per row: [dx, dy, dw, dh] shift the centre by (dx, dy)
    times the width and height and scale them by exp(dw), exp(dh) (dw, dh divided by the weights and capped
    at log(1000/16)). Returns (M, 4K)."""
    t = boxes.dtype.type
    d = deltas.reshape(deltas.shape[0], deltas.shape[1] // 4, 4)
    one = t(1 if plus_one else 0)
    widths = (boxes[:, 2] - boxes[:, 0] + one)[:, None]
    heights = (boxes[:, 3] - boxes[:, 1] + one)[:, None]
    ctr_x = boxes[:, 0][:, None] + t(0.5) * widths
    ctr_y = boxes[:, 1][:, None] + t(0.5) * heights
    wx, wy, ww, wh = (t(w) for w in weights)
    clip = t(BBOX_XFORM_CLIP)
    pred_x = d[..., 0] / wx * widths + ctr_x
    pred_y = d[..., 1] / wy * heights + ctr_y
    pred_w = xp.exp(xp.minimum(d[..., 2] / ww, clip)) * widths
    pred_h = xp.exp(xp.minimum(d[..., 3] / wh, clip)) * heights
    off = t(offset)
    out = xp.stack([pred_x - t(0.5) * pred_w, pred_y - t(0.5) * pred_h,
                    pred_x + t(0.5) * pred_w - off, pred_y + t(0.5) * pred_h - off], axis=-1)
    return out.reshape(deltas.shape)


def clip(xp, boxes, height, width, plus_one: bool):
    """Boxes (M, 4K) with x in [0, width - 1] and y in [0, height - 1] (the - 1 with plus_one only). height and
    width: numbers, or (M, 1) arrays of the boxes' dtype for per-row images."""
    d = boxes.reshape(boxes.shape[0], boxes.shape[1] // 4, 4)
    one = 1 if plus_one else 0
    x_max, y_max = width - one, height - one
    zero = boxes.dtype.type(0)
    xs = xp.maximum(xp.minimum(d[..., 0::2], x_max if np.isscalar(x_max) else x_max[..., None]), zero)
    ys = xp.maximum(xp.minimum(d[..., 1::2], y_max if np.isscalar(y_max) else y_max[..., None]), zero)
    return xp.stack([xs[..., 0], ys[..., 0], xs[..., 1], ys[..., 1]], axis=-1).reshape(boxes.shape)


def keep_by_size(boxes, min_size: float, im_info, plus_one: bool) -> np.ndarray:
    """Row indices of host boxes (M, 4) whose sides are >= min_size * scale and whose centre lies inside the
    image, im_info = [height, width, scale]."""
    t = boxes.dtype.type
    one = t(1 if plus_one else 0)
    ws = boxes[:, 2] - boxes[:, 0] + one
    hs = boxes[:, 3] - boxes[:, 1] + one
    least = t(float(np.float32(min_size)) * float(im_info[2]))   # float arg, double product
    keep = ((ws >= least) & (hs >= least) & (boxes[:, 0] + ws / t(2) < t(im_info[1]))
            & (boxes[:, 1] + hs / t(2) < t(im_info[0])))
    return np.flatnonzero(keep)


def _overlaps(boxes, areas, i: int, rest, one):
    """IoU of host box i with the boxes `rest` (NaN where both are empty: it never suppresses)."""
    xx1 = np.maximum(boxes[rest, 0], boxes[i, 0])
    yy1 = np.maximum(boxes[rest, 1], boxes[i, 1])
    xx2 = np.minimum(boxes[rest, 2], boxes[i, 2])
    yy2 = np.minimum(boxes[rest, 3], boxes[i, 3])
    zero = boxes.dtype.type(0)
    inter = np.maximum(xx2 - xx1 + one, zero) * np.maximum(yy2 - yy1 + one, zero)
    with np.errstate(divide="ignore", invalid="ignore"):
        return inter / (areas[i] + areas[rest] - inter)


def _areas(boxes, plus_one):
    one = boxes.dtype.type(1 if plus_one else 0)
    return (boxes[:, 2] - boxes[:, 0] + one) * (boxes[:, 3] - boxes[:, 1] + one), one


def _iou(boxes, plus_one):
    """iou(i, rest): the IoU of host box i with the boxes `rest`; 5-column boxes are rotated boxes (Caffe2's
    nms_cpu picks the rotated NMS by the column count too), where plus_one plays no part."""
    if boxes.shape[1] == 5:
        areas = rotated.areas(boxes)
        return lambda i, rest: rotated.overlaps(boxes, areas, i, rest)
    areas, one = _areas(boxes, plus_one)
    return lambda i, rest: _overlaps(boxes, areas, i, rest, one)


def nms(boxes, order, thresh: float, top_n: int = -1, plus_one: bool = True) -> list[int]:
    """Greedy NMS over host boxes (M, 4) (or rotated (M, 5)): walk `order` (indices, best first), keep the
    first remaining box and drop every remaining box whose IoU with it is above thresh; stop after top_n kept
    (top_n < 0: no limit)."""
    iou = _iou(boxes, plus_one)
    t = boxes.dtype.type(thresh)
    order = np.asarray(order, dtype=np.int64)
    keep = []
    while order.size and (top_n < 0 or len(keep) < top_n):
        i, rest = int(order[0]), order[1:]
        keep.append(i)
        order = rest[iou(i, rest) <= t]
    return keep


def soft_nms(boxes, scores, indices, sigma: float, thresh: float, min_score: float, method: int,
             plus_one: bool = True):
    """Soft-NMS (Bodla et al. 2017) over host boxes (M, 4) (or rotated (M, 5)): repeatedly keep the remaining
    box of highest (updated) score and scale the others' scores by 1 - IoU above thresh (method 1, linear) or
    exp(-IoU² / sigma) (method 2, Gaussian), dropping those that fall below min_score. Returns (kept indices,
    updated scores)."""
    iou = _iou(boxes, plus_one)
    t = boxes.dtype.type
    out = scores.astype(t, copy=True)
    pending = np.asarray(indices, dtype=np.int64).copy()
    keep = []
    while pending.size:
        best = int(np.argmax(out[pending]))       # the first of equal maxima, as Eigen's maxCoeff
        i = int(pending[best])
        keep.append(i)
        pending[[0, best]] = pending[[best, 0]]   # Caffe2 swaps it to the front: the rest keep that order
        rest = pending[1:]
        ovr = iou(i, rest)
        if method == 1:
            weight = np.where(ovr > t(thresh), t(1) - ovr, t(1))
        else:
            weight = np.exp(-1.0 * ovr.astype(np.float64) ** 2 / sigma).astype(t)
        out[rest] = out[rest] * weight
        pending = rest[out[rest] >= t(min_score)]
    return keep, out


def anchor_grid(anchors, height: int, width: int, stride: float) -> np.ndarray:
    """Host anchors (A, 4) shifted to every feature-map cell: (H·W·A, 4), rows ordered (h, w, a), anchor a
    moved by (w·stride, h·stride) (ComputeAllAnchors). Rotated anchors (A, 5) move their centre only."""
    t = anchors.dtype.type
    sx = np.arange(width, dtype=anchors.dtype) * t(stride)
    sy = np.arange(height, dtype=anchors.dtype) * t(stride)
    zero = np.zeros((height, width), anchors.dtype)
    cols = (sx[None, :], sy[:, None]) * 2 if anchors.shape[1] == 4 else (sx[None, :], sy[:, None], zero, zero, zero)
    shift = np.stack(np.broadcast_arrays(*cols), axis=-1)
    box_dim = anchors.shape[1]
    return (shift.reshape(-1, 1, box_dim) + anchors[None]).reshape(-1, box_dim)


def check_rows(name: str, x, cols, what: str) -> None:
    """ShapeError unless x is 2-D with one of the column counts `cols`."""
    if len(x.shape) != 2 or x.shape[1] not in cols:
        want = " or ".join(str(c) for c in cols)
        raise ShapeError(f"{name} must be (count, {want}) {what}, got shape {tuple(x.shape)}")


def check_im_info(info: np.ndarray) -> None:
    """ShapeError unless every host im_info row [height, width, scale] is finite (whole pixels are taken of its
    sides; a placeholder row of zeros is fine)."""
    bad = np.flatnonzero(~np.isfinite(info).all(axis=1))
    if bad.size:
        raise ShapeError(f"im_info row {bad[0]} is {info[bad[0]].tolist()}; each row must be [height, width, scale] "
                         "of finite numbers")
