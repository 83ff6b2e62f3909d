"""Image retrieval helpers: RMACRegions (the fixed grid of regions R-MAC pools over, as RoIs) and APMeter
(the average precision of each class over a buffer of recent predictions).

Semantics from caffe2/operators/rmac_regions_op.cc and apmeter_op.{h,cc}. Both compute on the host (Caffe2's
APMeter is CPU only; RMACRegions' grid depends only on the input's shape) and put their results on the op's
device. APMeter keeps its buffer in the op between runs, as Caffe2's operator object does. Neither has a
gradient (SHOULD_NOT_DO_GRADIENT).
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import check_float, on_device, out_spec
from .registry import SHOULD_NOT_DO_GRADIENT, op

MAX_STEPS = 6


# --------------------------------------------------------------------------------------------- RMACRegions
def _long_side_steps(h: int, w: int, overlap: float) -> int:
    """How many extra regions the longer side gets: the step count (1..6) whose regions overlap closest to
    `overlap`, in float32 as Caffe2 computes it (the first of equals)."""
    if h == w:
        return 0
    short, f = min(h, w), np.float32
    best, best_val = 0, np.inf
    for steps in range(1, MAX_STEPS + 1):
        b = f((max(h, w) - short) / steps)
        val = abs((f(short * short) - f(short) * b) / f(short * short) - f(overlap))
        if val < best_val:
            best, best_val = steps, val
    return best


def rmac_grid(h: int, w: int, scales: int, overlap: float) -> list[list[int]]:
    """The regions [0, x1, y1, x2, y2] of one image of H x W (inclusive corners)."""
    steps = _long_side_steps(h, w, overlap)
    wd, hd = (steps if w > h else 0), (steps if h > w else 0)
    rows = []
    for level in range(1, scales + 1):
        size = 2 * min(h, w) // (level + 1)
        if size == 0:
            break
        bw = float(np.float32((w - size) / (level + wd - 1))) if level + wd - 1 > 0 else 0.0
        bh = float(np.float32((h - size) / (level + hd - 1))) if level + hd - 1 > 0 else 0.0
        for i in range(level + wd):
            for j in range(level + hd):
                x1 = min(int(np.float32(bw) * np.float32(i)), w - size)
                y1 = min(int(np.float32(bh) * np.float32(j)), h - size)
                rows.append([0, x1, y1, x1 + size - 1, y1 + size - 1])
    return rows


def _rmac_checks(X, scales):
    check_float("RMACRegions", X=X)
    if len(X.shape) != 4:
        raise ShapeError(f"RMACRegions needs an NCHW input (4-D), got shape {tuple(X.shape)}")
    if scales < 0:
        raise ArgumentError(f"RMACRegions argument scales must be >= 0, got {scales}")


def _rmac_shape(specs, *, scales, overlap):
    X = specs[0]
    _rmac_checks(X, scales)
    n, _, h, w = X.shape
    rows = 0 if n * h * w * X.shape[1] == 0 else n * len(rmac_grid(h, w, scales, overlap))
    return [out_spec((rows, 5), X.dtype)]


@op("RMACRegions", inputs=1, outputs=1, inplace=(), args={"scales": 3, "overlap": 0.4}, shape=_rmac_shape,
    shapes_from_inputs=True, gradient=SHOULD_NOT_DO_GRADIENT)
def rmac_regions(xp, X, *, scales, overlap):
    """X (N x C x H x W) -> RoIs (R x 5, rows batch_index x1 y1 x2 y2): square regions at `scales` levels, at
    level l of side 2 min(H, W) / (l + 1), spread evenly over the image with the longer side getting the
    extra regions that best give `overlap`; the same regions for every image of the batch (none for an empty
    X)."""
    _rmac_checks(X, scales)
    n, c, h, w = X.shape
    if n * c * h * w == 0:
        return xp.zeros((0, 5), X.dtype)
    grid = np.asarray(rmac_grid(h, w, scales, overlap), np.float64).reshape(-1, 5)
    rows = np.tile(grid, (n, 1))
    rows[:, 0] = np.repeat(np.arange(n), grid.shape[0])
    return on_device(xp, rows, X.dtype)


# --------------------------------------------------------------------------------------------- APMeter
def _ap_checks(X, labels, buffer_size) -> None:
    check_float("APMeter", predictions=X)
    if labels.dtype is not None and labels.dtype != np.int32:
        raise DTypeError(f"APMeter: labels must be int32 (0 or 1), got {labels.dtype}")
    if len(X.shape) != 2 or tuple(labels.shape) != tuple(X.shape):
        raise ShapeError(f"APMeter: predictions and labels must both be N x D, got {tuple(X.shape)} and "
                         f"{tuple(labels.shape)}")
    if buffer_size < 1:
        raise ArgumentError(f"APMeter argument buffer_size must be positive, got {buffer_size}")


def _ap_shape(specs, *, buffer_size):
    _ap_checks(*specs, buffer_size)
    return [out_spec((specs[0].shape[1],), np.float32)]


class _Buffer:
    """Per class, the buffered (score, label) pairs in Caffe2's order: sorted by score after each run, and
    when full giving up its first entries (the highest scores) for the new ones, as Caffe2's rotate does."""

    def __init__(self, classes: int):
        self.scores = np.zeros((classes, 0), np.float32)
        self.labels = np.zeros((classes, 0), np.int64)

    def add(self, scores, labels, size: int) -> None:
        scores, labels = scores[-size:], labels[-size:]             # only the last `size` rows fit
        reclaim = max(self.scores.shape[1] + scores.shape[0] - size, 0)
        self.scores = np.concatenate([self.scores[:, reclaim:], scores.T], axis=1)
        self.labels = np.concatenate([self.labels[:, reclaim:], labels.T], axis=1)
        order = np.argsort(-self.scores, axis=1, kind="stable")      # descending, ties keep their order
        self.scores = np.take_along_axis(self.scores, order, axis=1)
        self.labels = np.take_along_axis(self.labels, order, axis=1)

    def average_precision(self):
        tp = np.cumsum(self.labels, axis=1, dtype=np.float64)
        precision = tp / np.arange(1, self.labels.shape[1] + 1)
        hits = self.labels == 1
        return (np.where(hits, precision, 0.0).sum(axis=1) / np.maximum(hits.sum(axis=1), 1)).astype(np.float32)


@op("APMeter", inputs=2, outputs=1, inplace=(), args={"buffer_size": 1000}, context="structure",
    shape=_ap_shape, gradient=SHOULD_NOT_DO_GRADIENT)
def ap_meter(ctx, xp, predictions, labels, *, buffer_size):
    """predictions (N x D scores), labels (N x D, int32 0/1) -> AP (D, float32): each class's average
    precision over the last buffer_size predictions this op has seen (this run's and earlier runs'):
    the mean, over the positives ranked by score, of the precision at each one's rank."""
    _ap_checks(predictions, labels, buffer_size)
    d = predictions.shape[1]
    buf = ctx.state.get("buffer")
    if buf is None or buf.scores.shape[0] != d:
        buf = ctx.state["buffer"] = _Buffer(d)
    buf.add(np.asarray(backend.to_host(predictions), np.float32), np.asarray(backend.to_host(labels)), buffer_size)
    return on_device(xp, buf.average_precision(), np.float32)

