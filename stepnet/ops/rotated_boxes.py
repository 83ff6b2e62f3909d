"""Rotated-box arithmetic of the detection ops (RRPN's boxes [ctr_x, ctr_y, w, h, angle in degrees]), as
caffe2/operators/generate_proposals_op_util_boxes.h and generate_proposals_op_util_nms.h define it.

The angle turns the box counter-clockwise as seen in an image (y pointing down): its corners are the centre
plus (u cos a + v sin a, -u sin a + v cos a) for u = +-w/2, v = +-h/2. Deltas [dx, dy, dw, dh, da] move the
centre by (dx * w, dy * h), scale the sides by exp(dw), exp(dh) (no + 1 here, whatever legacy_plus_one says)
and turn the box by da radians; with angle_bound_on the angle is brought back once into [lo, hi] by adding or
subtracting hi - lo. Clipping only touches boxes within clip_angle_thresh degrees of upright, treated as
upright boxes; the size filter reads the sides as they are. The overlap of two rotated boxes is the area of
their intersection polygon: the corners of each inside the other plus the crossings of their edges, in
float32 as Caffe2 finds them, the area of the convex polygon they span (points ordered by their angle about
their centroid; Caffe2 orders them by a Graham scan, which differs only by rounding), two identical boxes
(corners within 1e-5) overlapping by the smaller area, fewer than 3 points by 0.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError

PI = np.float32(3.14159265358979323846)


def check_angle_bounds(angle_bound_on: bool, lo: int, hi: int) -> None:
    if angle_bound_on and not (hi - lo > 0 and (hi - lo) % 180 == 0):
        raise ArgumentError(f"angle_bound_hi - angle_bound_lo must be a positive multiple of 180, got "
                            f"{hi} - {lo} = {hi - lo}")


def transform(xp, boxes, deltas, weights, angle_bound_on: bool, lo: int, hi: int):
    """Boxes (M, 5) moved by deltas (M, 5K), K boxes per row. Returns (M, 5K), in the boxes' float type."""
    t = boxes.dtype.type
    d = deltas.reshape(deltas.shape[0], deltas.shape[1] // 5, 5)
    wx, wy, ww, wh = (t(w) for w in weights)
    clip = t(np.log(1000.0 / 16.0))
    ctr_x, ctr_y, w, h, a = (boxes[:, k][:, None] for k in range(5))
    angle = d[..., 4] * t(180.0) / t(PI) + a
    if angle_bound_on:
        period = t(hi - lo)
        angle = xp.where(angle < t(lo), angle + period, xp.where(angle > t(hi), angle - period, angle))
    out = xp.stack([d[..., 0] / wx * w + ctr_x, d[..., 1] / wy * h + ctr_y,
                    xp.exp(xp.minimum(d[..., 2] / ww, clip)) * w, xp.exp(xp.minimum(d[..., 3] / wh, clip)) * h,
                    angle], axis=-1)
    return out.reshape(deltas.shape)


def clip(xp, boxes, height, width, angle_thresh: float, plus_one: bool):
    """Boxes (M, 5K) with those within angle_thresh degrees of upright clipped as upright boxes to
    [0, width - 1] x [0, height - 1] (the - 1 with plus_one). height, width: numbers or (M, 1) arrays."""
    t = boxes.dtype.type
    d = boxes.reshape(boxes.shape[0], boxes.shape[1] // 5, 5)
    one = t(1 if plus_one else 0)
    half = t(2.0)
    ctr_x, ctr_y, w, h, a = (d[..., k] for k in range(5))
    x_max, y_max = width - one, height - one
    x_max = x_max if np.isscalar(x_max) else x_max.astype(boxes.dtype)
    y_max = y_max if np.isscalar(y_max) else y_max.astype(boxes.dtype)
    zero = t(0)
    x1 = xp.maximum(xp.minimum(ctr_x - (w - one) / half, x_max), zero)
    x2 = xp.maximum(xp.minimum(ctr_x + (w - one) / half, x_max), zero)
    y1 = xp.maximum(xp.minimum(ctr_y - (h - one) / half, y_max), zero)
    y2 = xp.maximum(xp.minimum(ctr_y + (h - one) / half, y_max), zero)
    upright = xp.abs(a) <= t(angle_thresh)
    clipped = xp.stack([(x1 + x2) / half, (y1 + y2) / half, x2 - x1 + one, y2 - y1 + one, a], axis=-1)
    return xp.where(upright[..., None], clipped, d).reshape(boxes.shape)


def keep_by_size(boxes, min_size: float, im_info) -> np.ndarray:
    """Row indices of host boxes (M, 5) with both sides >= min_size * scale and the centre inside the image."""
    t = boxes.dtype.type
    least = t(float(np.float32(min_size)) * float(im_info[2]))
    keep = ((boxes[:, 2] >= least) & (boxes[:, 3] >= least) & (boxes[:, 0] < t(im_info[1]))
            & (boxes[:, 1] < t(im_info[0])))
    return np.flatnonzero(keep)


def corners(boxes) -> np.ndarray:
    """(n, 4, 2) float32 corners of host boxes (n, 5), in Caffe2's order and arithmetic."""
    boxes = np.asarray(boxes, np.float32)
    angle = -boxes[:, 4].astype(np.float64) * 0.01745329251
    b = np.cos(angle).astype(np.float32) * np.float32(0.5)
    a = np.sin(angle).astype(np.float32) * np.float32(0.5)
    cx, cy, w, h = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    p0 = np.stack([cx - a * h - b * w, cy + b * h - a * w], axis=-1)
    p1 = np.stack([cx + a * h - b * w, cy - b * h - a * w], axis=-1)
    c2 = np.float32(2) * np.stack([cx, cy], axis=-1)
    return np.stack([p0, p1, c2 - p0, c2 - p1], axis=1)


def _cross(a, b):
    return a[..., 0] * b[..., 1] - b[..., 0] * a[..., 1]


def _inside(points, rect_pts, rect_vec):
    """Mask of points (n, 4, 2) inside rectangles (n, 4, 2) with edge vectors (n, 4, 2), borders included."""
    ab, da = rect_vec[:, None, 0], rect_vec[:, None, 3]
    ap = points - rect_pts[:, None, 0]
    along_ab, along_ad = (ap * ab).sum(-1), -(ap * da).sum(-1)
    return ((along_ab >= 0) & (along_ad >= 0) & (along_ab <= (ab * ab).sum(-1)) & (along_ad <= (da * da).sum(-1)))


def intersections(box, boxes) -> np.ndarray:
    """Intersection areas (float32) of host box (5,) with each of host boxes (n, 5)."""
    boxes = np.asarray(boxes, np.float32).reshape(-1, 5)
    n = len(boxes)
    p1 = np.broadcast_to(corners(np.asarray(box, np.float32).reshape(1, 5)), (n, 4, 2))
    p2 = corners(boxes)
    v1, v2 = np.roll(p1, -1, axis=1) - p1, np.roll(p2, -1, axis=1) - p2
    det = _cross(v2[:, None, :], v1[:, :, None])                         # (n, i, j)
    d12 = p2[:, None, :] - p1[:, :, None]                               # pts2[j] - pts1[i]
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = _cross(v2[:, None, :], d12) / det
        t2 = _cross(v1[:, :, None], d12) / det
    crossing = (np.abs(det) > np.float32(1e-14)) & (t1 >= 0) & (t1 <= 1) & (t2 >= 0) & (t2 <= 1)
    at = p1[:, :, None] + np.where(crossing, t1, np.float32(0))[..., None] * v1[:, :, None]
    mask = np.concatenate([crossing.reshape(n, 16), _inside(p1, p2, v2), _inside(p2, p1, v1)], axis=1)
    points = np.concatenate([at.reshape(n, 16, 2), p1, p2], axis=1).astype(np.float64)
    points = np.where(mask[..., None], points, 0.0)
    count = mask.sum(axis=1)
    centre = points.sum(axis=1) / np.maximum(count, 1)[:, None]
    rel = points - centre[:, None]
    angle = np.where(mask, np.arctan2(rel[..., 1], rel[..., 0]), np.inf)
    order = np.argsort(angle, axis=1, kind="stable")
    ring = np.take_along_axis(rel, order[..., None], axis=1)
    last = np.take_along_axis(ring, np.maximum(count - 1, 0)[:, None, None].repeat(2, axis=2), axis=1)
    ring = np.where((np.arange(ring.shape[1])[None] < count[:, None])[..., None], ring, last)
    area = np.abs(_cross(ring, np.roll(ring, -1, axis=1)).sum(axis=1)) / 2.0
    area = np.where(count > 2, area, 0.0)
    same = (np.abs(p1 - p2) <= np.float32(1e-5)).all(axis=(1, 2))
    sizes = np.minimum(np.float32(box[2]) * np.float32(box[3]), boxes[:, 2] * boxes[:, 3])
    return np.where(same, sizes, area).astype(np.float32)


def overlaps(boxes, areas, i: int, rest):
    """IoU of host rotated box i with the boxes `rest`, as nms_cpu_rotated computes it (float32)."""
    inter = intersections(boxes[i], boxes[rest])
    with np.errstate(divide="ignore", invalid="ignore"):
        return inter / (areas[i] + areas[rest] - inter)


def areas(boxes):
    return boxes[:, 2] * boxes[:, 3]
