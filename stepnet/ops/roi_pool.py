"""RoIPool (Fast R-CNN's max pooling over regions) and its gradient, as caffe2/operators/roi_pool_op.cc and
roi_pool_op.cu define them.

A RoI [batch index, x1, y1, x2, y2] is scaled by spatial_scale and its corners rounded (half away from zero);
its height and width count both end pixels (at least 1). Bin (ph, pw) covers rows floor(ph * bin_h) to
ceil((ph + 1) * bin_h) - 1 and the matching columns (bin_h = RoI height / pooled_h, in float32), shifted by
the RoI's corner and clipped to the map. The bin's output is its largest value; an empty bin gives 0. Unless
is_test, a second output holds, per output element, the index h * W + w of the pixel that won (the first one
in row-major order among equals; -1 for an empty bin), which the gradient routes dY back through.

The max of a bin is taken in two steps: over each bin's columns for every row of the RoI, then over each
bin's rows, carrying the winning column; both are one masked gather and reduction per RoI. Caffe2's CPU
RoIPoolGradient is CAFFE_NOT_IMPLEMENTED (only its CUDA kernel exists); here it runs on every device.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from .base import Meta, check_float, like, on_device, out_spec, single_gradient
from .registry import Arg, op
from .segments import scatter_rows

ARGS = {
    "spatial_scale": Arg("float", 1.0, "scale of the feature map relative to the image the RoIs are in"),
    "pooled_h": Arg("int", 1, "output height"),
    "pooled_w": Arg("int", 1, "output width"),
    "is_test": Arg("bool", False, "inference: no argmax output (one output instead of two)"),
    "order": "NCHW",
}
LOWEST = float(np.finfo(np.float32).min)   # Caffe2's -FLT_MAX, the start of every non-empty bin's max


def _checks(x, rois, spatial_scale, pooled_h, pooled_w, order):
    if order != "NCHW":
        raise ArgumentError(f"RoIPool supports order 'NCHW' only (as Caffe2), got {order!r}")
    if not spatial_scale > 0:
        raise ArgumentError(f"spatial_scale must be > 0, got {spatial_scale}")
    if pooled_h <= 0 or pooled_w <= 0:
        raise ArgumentError(f"pooled_h and pooled_w must be > 0, got {pooled_h} and {pooled_w}")
    check_float("RoIPool", X=x, RoIs=rois)
    if len(x.shape) != 4:
        raise ShapeError(f"X must be a 4-d NCHW feature map, got shape {tuple(x.shape)}")
    if len(rois.shape) != 2 or rois.shape[1] != 5:
        raise ShapeError(f"RoIs must be (R, 5) rows [batch index, x1, y1, x2, y2], got shape {tuple(rois.shape)}")
    return (rois.shape[0], x.shape[1], pooled_h, pooled_w)


def _shape(specs, *, spatial_scale, pooled_h, pooled_w, is_test, order):
    x, rois = specs
    y = _checks(Meta(x), Meta(rois), spatial_scale, pooled_h, pooled_w, order)
    return [out_spec(y, x.dtype)] + ([] if is_test else [out_spec(y, np.int32)])


def _round(v):
    """C's round(): half away from zero (numpy rounds half to even), on the float32 products."""
    v = np.asarray(v, np.float64)
    return (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int64)


def bins(rois, n, h, w, spatial_scale, pooled_h, pooled_w):
    """(batch index (R,), row starts and ends (R, pooled_h), column starts and ends (R, pooled_w)) of host
    float32 RoIs, clipped to the H x W map; a bin with end <= start is empty."""
    rois = np.asarray(rois, np.float32)
    ids = np.trunc(rois[:, 0]).astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if bad.size:
        raise ShapeError(f"RoI {bad[0]} has batch index {ids[bad[0]]}, outside the {n} images of X")
    x1, y1, x2, y2 = (_round(rois[:, k] * np.float32(spatial_scale)) for k in range(1, 5))

    def axis(start, end, pooled, size):
        if not start.size:        # no RoIs: nothing the size of `pooled` (an argument: it may be 2^31)
            none = np.zeros((0, pooled), np.int64)
            return none, none
        length = np.maximum(end - start + 1, 1).astype(np.float32)
        bin_size = length / np.float32(pooled)
        p = np.arange(pooled, dtype=np.float32)
        lo = np.floor(p[None] * bin_size[:, None]).astype(np.int64) + start[:, None]
        hi = np.ceil((p[None] + np.float32(1)) * bin_size[:, None]).astype(np.int64) + start[:, None]
        return np.clip(lo, 0, size), np.clip(hi, 0, size)

    return (ids, *axis(y1, y2, pooled_h, h), *axis(x1, x2, pooled_w, w))


def _band(lo, hi):
    """Host (pooled, L) indices lo + l clipped into [lo, hi - 1] and the mask l < hi - lo, L the widest bin."""
    width = max(int((hi - lo).max(initial=0)), 1)
    idx = lo[:, None] + np.arange(width)[None]
    return np.minimum(idx, np.maximum(hi - 1, lo)[:, None]), idx < hi[:, None]


def _pool_one(xp, img, rows, cols, inf):
    """Max and winning index (h * W + w) of each bin of one RoI over img (C, H, W), NaN read as -inf; bins
    given as ((lo, hi) rows, (lo, hi) cols) host arrays, empty ones included (max -inf there)."""
    (r_lo, r_hi), (c_lo, c_hi) = rows, cols
    height, width = img.shape[1:]
    top = min(int(r_lo.min()), height - 1)
    bottom = max(int(r_hi.max()), top + 1)
    cidx, cmask = _band(c_lo, c_hi)                                          # (Q, Lw) columns
    cidx = on_device(xp, np.clip(cidx, 0, width - 1), np.int64)
    band = img[:, top:bottom][:, :, cidx]                                    # (C, h', Q, Lw)
    band = xp.where(on_device(xp, cmask, bool), band, inf)
    col_slot = xp.argmax(band, axis=3)                                       # first max along each row
    col_max = xp.max(band, axis=3)                                           # (C, h', Q)
    ridx, rmask = _band(r_lo - top, r_hi - top)                              # (P, Lh) rows of the window
    ridx = on_device(xp, np.clip(ridx, 0, bottom - top - 1), np.int64)
    tall = col_max[:, ridx]                                                  # (C, P, Lh, Q)
    tall = xp.where(on_device(xp, rmask, bool)[None, :, :, None], tall, inf)
    row_slot = xp.argmax(tall, axis=2)                                       # (C, P, Q): first row of the max
    best = xp.max(tall, axis=2)
    c_, p_, q_ = (xp.arange(k).reshape(s) for k, s in zip(best.shape, ((-1, 1, 1), (1, -1, 1), (1, 1, -1))))
    row = ridx[p_, row_slot]                                                 # window row of the winner
    col = cidx[q_, col_slot[c_, row, q_]]
    return best, (row + top) * width + col


_grad_op = single_gradient("RoIPoolGradient", ["I0", "I1", "O1", "GO0"])


def _gradient(g):
    """RoIPoolGradient(X, RoIs, argmaxes, dY) -> dX; an is_test RoIPool has no argmaxes to route it by."""
    if g.n_outputs < 2:
        raise GradientError("RoIPool's gradient reads its argmaxes output, which an is_test RoIPool (one "
                            "output) does not write; run it with is_test=0 and two outputs")
    _grad_op(g)


@op("RoIPool", inputs=2, outputs=(1, 2), inplace=(), shape=_shape, args=ARGS, gradient=_gradient, grows="shapes")
def roi_pool(xp, x, rois, *, spatial_scale, pooled_h, pooled_w, is_test, order):
    """X (N, C, H, W), RoIs (R, 5) [batch index, x1, y1, x2, y2] -> Y (R, C, pooled_h, pooled_w)[, argmaxes
    int32 (R, C, pooled_h, pooled_w)]: each bin's max (0 when the bin is empty; NaNs never win, and a bin
    whose values are all -inf or NaN gives -FLT_MAX and argmax -1, as Caffe2's comparisons do)."""
    out_shape = _checks(x, rois, spatial_scale, pooled_h, pooled_w, order)
    n, _, h, w = x.shape
    ids, r_lo, r_hi, c_lo, c_hi = bins(backend.to_host(rois), n, h, w, spatial_scale, pooled_h, pooled_w)
    y = xp.zeros(out_shape, dtype=x.dtype)
    arg = xp.full(out_shape, -1, dtype=np.int32)
    inf = x.dtype.type(-np.inf)
    clean = xp.where(xp.isnan(x), inf, x) if x.size else x
    for r, b in enumerate(ids.tolist()):
        empty = (r_hi[r] <= r_lo[r])[:, None] | (c_hi[r] <= c_lo[r])[None, :]   # (P, Q)
        if empty.all():
            continue
        best, index = _pool_one(xp, clean[b], (r_lo[r], r_hi[r]), (c_lo[r], c_hi[r]), inf)
        won = best > x.dtype.type(LOWEST)
        keep = on_device(xp, ~empty, bool)[None]
        y[r] = xp.where(keep, xp.where(won, best, x.dtype.type(LOWEST)), x.dtype.type(0))
        arg[r] = xp.where(keep & won, index, -1).astype(np.int32)
    return (y,) if is_test else (y, arg)


# ------------------------------------------------------------------------------------------- gradient
def _grad_checks(x, rois, argmax, dy, spatial_scale, pooled_h, pooled_w, order):
    want = _checks(x, rois, spatial_scale, pooled_h, pooled_w, order)
    check_float("RoIPoolGradient", X=x, dY=dy)
    if argmax.dtype is not None and np.dtype(argmax.dtype) != np.int32:
        raise DTypeError(f"argmaxes must be int32 (RoIPool's second output), got {np.dtype(argmax.dtype)}")
    for name, a in (("argmaxes", argmax), ("dY", dy)):
        if tuple(a.shape) != want:
            raise ShapeError(f"{name} must have RoIPool's output shape {want} for X {tuple(x.shape)} and RoIs "
                             f"{tuple(rois.shape)}, got {tuple(a.shape)}")


def _grad_shape(specs, *, spatial_scale, pooled_h, pooled_w, order, **_):
    x, rois, argmax, dy = specs
    _grad_checks(Meta(x), Meta(rois), Meta(argmax), Meta(dy), spatial_scale, pooled_h, pooled_w, order)
    return [like(x)]


@op("RoIPoolGradient", inputs=4, outputs=1, inplace=(), shape=_grad_shape, args=ARGS)
def roi_pool_gradient(xp, x, rois, argmax, dy, *, spatial_scale, pooled_h, pooled_w, order, **_):
    """X, RoIs, argmaxes, dY -> dX (X's shape): each dY element added to the pixel its argmax names in its
    RoI's image and channel (nothing for -1), as Caffe2's CUDA kernel does."""
    _grad_checks(x, rois, argmax, dy, spatial_scale, pooled_h, pooled_w, order)
    n, c, h, w = x.shape
    ids = bins(backend.to_host(rois), n, h, w, spatial_scale, pooled_h, pooled_w)[0]
    index = np.asarray(backend.to_host(argmax), np.int64).reshape(len(ids), c, pooled_h * pooled_w)
    if ((index < -1) | (index >= h * w)).any():
        raise ShapeError(f"argmaxes must lie in [-1, H*W) = [-1, {h * w}), got values from {index.min()} to "
                         f"{index.max()}")
    flat = (ids[:, None, None] * c + np.arange(c)[None, :, None]) * (h * w) + index
    used = np.flatnonzero(index.reshape(-1) >= 0)
    values = xp.take(xp.reshape(dy, (-1,)), on_device(xp, used, np.int64)).reshape(-1, 1)
    return xp.reshape(scatter_rows(xp, flat.reshape(-1)[used], values, n * c * h * w), x.shape)
