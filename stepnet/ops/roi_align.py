"""RoIAlign (Mask R-CNN's region pooling) and its gradient, as caffe2/operators/roi_align_op.cc and
roi_align_gradient_op.cc define them (with the later `aligned` argument).

Each output bin (ph, pw) of a RoI averages grid_h x grid_w bilinear samples of the feature map. A bilinear
sample at (y, x) is a product of a row weight and a column weight, and so is its "outside the map" rule (a
sample with y < -1, y > H, x < -1 or x > W counts as 0), so the whole pooling of one RoI is Y = Wy · X · Wxᵀ
per channel, with Wy a (pooled_h, H) and Wx a (pooled_w, W) matrix of summed sample weights, each divided by
its grid size. The matrices are built on the host from the RoIs (a few numbers per RoI); the products run in
the op's array module.

Forward, the weights are used as what they are, banded: row p of Wy is non-zero only on the few rows its
samples touch (its band), and likewise for Wx. RoIs are pooled in groups of similar size: one gather takes,
channels-last, the band rows of every bin row across the RoI's window of columns, a weighted sum over the band
gives each bin row, a second gather takes each bin column's band from that and a weighted sum finishes the bin.
That is Caffe2's work (each bilinear tap read once per bin), done in whole-array steps with no BLAS call, so it
does not suffer from a busy machine's thread contention. The gradient is the transpose, dX += Wyᵀ · dY · Wx,
two GEMMs per RoI over its window.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ResourceError, ShapeError
from .base import Meta, check_float, like, on_device, out_spec, single_gradient
from .norm import check_order
from .registry import Arg, op

MAX_SAMPLES = 1 << 24   # sample positions along one axis over all RoIs and bins (each a few float64 temporaries)
ROI_ARGS = {
    "spatial_scale": Arg("float", 1.0, "scale of the feature map relative to the image the RoIs are in"),
    "pooled_h": Arg("int", 1, "output height"),
    "pooled_w": Arg("int", 1, "output width"),
    "sampling_ratio": Arg("int", -1, "samples per bin side; <= 0: ceil(RoI side / pooled side)"),
    "aligned": Arg("bool", False, "shift the RoI by -0.5 pixel (pixel centres) and keep sub-pixel RoIs"),
    "order": "NCHW",
}


def _checks(x, rois, pooled_h, pooled_w, spatial_scale, order):
    """The shared checks; (N, C, H, W) of X whatever its order."""
    check_order(order)
    check_float("RoIAlign", X=x, RoIs=rois)
    if pooled_h <= 0 or pooled_w <= 0:
        raise ArgumentError(f"pooled_h and pooled_w must be > 0, got {pooled_h} and {pooled_w}")
    if not spatial_scale > 0:
        raise ArgumentError(f"spatial_scale must be > 0, got {spatial_scale}")
    if len(x.shape) != 4:
        raise ShapeError(f"X must be a 4-d feature map ({order}), got shape {tuple(x.shape)}")
    n, c, h, w = x.shape if order == "NCHW" else (x.shape[0], x.shape[3], *x.shape[1:3])
    if Meta(rois).size and (len(rois.shape) != 2 or rois.shape[1] not in (4, 5)):
        raise ShapeError(f"RoIs must be (R, 5) rows [batch index, x1, y1, x2, y2] or (R, 4) [x1, y1, x2, y2], "
                         f"got shape {tuple(rois.shape)}")
    return n, c, h, w


def _y_shape(n_rois, c, pooled_h, pooled_w, order):
    return (n_rois, c, pooled_h, pooled_w) if order == "NCHW" else (n_rois, pooled_h, pooled_w, c)


def _rois_count(rois):
    return rois.shape[0] if Meta(rois).size else 0


def _shape(specs, *, pooled_h, pooled_w, spatial_scale, order, **_):
    x, rois = specs
    _, c, _, _ = _checks(Meta(x), Meta(rois), pooled_h, pooled_w, spatial_scale, order)
    return [out_spec(_y_shape(_rois_count(Meta(rois)), c, pooled_h, pooled_w, order), x.dtype)]


def _axis_weights(start, length, grid, pooled: int, size: int, dtype):
    """(R, pooled, size) host weights along one axis: row p sums, over its `grid` samples at start +
    (p + (i + 0.5) / grid) * length / pooled, each sample's two interpolation weights on its neighbouring
    pixels (0 for a sample outside [-1, size]), divided by the grid size."""
    t = dtype.type
    r = start.shape[0]
    if not r:                   # no RoIs: nothing the size of `pooled` (an argument: it may be 2^31)
        return np.zeros((0, pooled, size), dtype)
    g = max(int(grid.max(initial=0)), 1)
    if r * pooled * g > MAX_SAMPLES:   # a huge sampling_ratio, or a RoI far larger than the feature map
        raise ResourceError(f"sampling {g} points per bin side for {r} RoI(s) x {pooled} bins is {r * pooled * g} "
                            f"samples along one axis, over the limit of {MAX_SAMPLES}; give a smaller sampling_ratio "
                            "(the RoI side over the pooled side is Caffe2's default, with sampling_ratio <= 0), or "
                            "RoIs within the feature map")
    bin_size = length / t(pooled)
    steps = np.maximum(grid, 1).astype(dtype)
    p = np.arange(pooled, dtype=dtype)[None, :, None]
    i = np.arange(g, dtype=dtype)[None, None, :]
    start, bin_size, steps = start[:, None, None], bin_size[:, None, None], steps[:, None, None]
    pos = start + p * bin_size + (i + t(0.5)) * bin_size / steps
    used = (np.arange(g)[None, None, :] < grid[:, None, None]) & (pos >= t(-1)) & (pos <= t(size))
    y = np.maximum(pos, t(0))
    low = np.clip(y.astype(np.int64), 0, size - 1)   # unused samples (weight 0) stay in range too
    top = low >= size - 1
    low = np.where(top, size - 1, low)
    high = np.where(top, size - 1, low + 1)
    y = np.where(top, low.astype(dtype), y)
    frac = y - low.astype(dtype)
    scale = used / steps
    base = (np.arange(r)[:, None, None] * pooled + np.arange(pooled)[None, :, None]) * size
    weights = np.bincount((base + low).ravel(), ((t(1) - frac) * scale).ravel(), minlength=r * pooled * size)
    weights += np.bincount((base + high).ravel(), (frac * scale).ravel(), minlength=r * pooled * size)
    return weights.reshape(r, pooled, size).astype(dtype)


def _plan(rois, n, h, w, pooled_h, pooled_w, spatial_scale, sampling_ratio, aligned, dtype):
    """(batch index per RoI, Wy (R, pooled_h, H), Wx (R, pooled_w, W)) from host RoIs."""
    t = dtype.type
    rois = np.asarray(rois, dtype=dtype).reshape(-1, rois.shape[-1])
    ids = np.trunc(rois[:, 0]).astype(np.int64) if rois.shape[1] == 5 else np.zeros(len(rois), np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if bad.size:
        raise ShapeError(f"RoI {bad[0]} has batch index {ids[bad[0]]}, outside the {n} images of X")
    offset = t(0.5) if aligned else t(0)
    x1, y1, x2, y2 = (rois[:, k] * t(spatial_scale) - offset for k in range(rois.shape[1] - 4, rois.shape[1]))
    width, height = x2 - x1, y2 - y1
    if aligned:
        bad = np.flatnonzero((width < 0) | (height < 0))
        if bad.size:
            raise ShapeError(f"RoI {bad[0]} has a negative width or height ({rois[bad[0]].tolist()}); with "
                             "aligned=1 RoIs must have x2 >= x1 and y2 >= y1")
    else:   # malformed RoIs become 1 x 1
        width, height = np.maximum(width, t(1)), np.maximum(height, t(1))
    if sampling_ratio > 0:
        gh = gw = np.full(len(rois), sampling_ratio, np.int64)
    else:
        gh, gw = np.ceil(height / t(pooled_h)).astype(np.int64), np.ceil(width / t(pooled_w)).astype(np.int64)
    return (ids, _axis_weights(y1, height, gh, pooled_h, h, dtype),
            _axis_weights(x1, width, gw, pooled_w, w, dtype))


def _windows(weights):
    """Per RoI, the [first, end) pixel range along one axis that its weights touch (empty when none)."""
    touched = (weights != 0).any(axis=1)                        # (R, size)
    hit = touched.any(axis=1)
    first = np.argmax(touched, axis=1)
    end = touched.shape[1] - np.argmax(touched[:, ::-1], axis=1)
    return np.where(hit, first, 0).tolist(), np.where(hit, end, 0).tolist()


def _roi_plans(xp, rois, dtype, n, h, w, pooled_h, pooled_w, spatial_scale, sampling_ratio, aligned):
    """For each RoI with samples on the map: (index, batch index, Wy window (P, h'), Wx window (Q, w'), row
    slice, column slice). Only the window a RoI touches takes part in its two GEMMs."""
    ids, wy, wx = _plan(backend.to_host(rois), n, h, w, pooled_h, pooled_w, spatial_scale, sampling_ratio,
                        aligned, dtype)
    (r0, r1), (c0, c1) = _windows(wy), _windows(wx)
    wy, wx = xp.asarray(wy), xp.asarray(wx)
    for r, b in enumerate(ids.tolist()):
        if r0[r] < r1[r] and c0[r] < c1[r]:
            rows, cols = slice(r0[r], r1[r]), slice(c0[r], c1[r])
            yield r, b, wy[r][:, rows], wx[r][:, cols], rows, cols


def _channels_first(xp, a, order):
    return a if order == "NCHW" else xp.moveaxis(a, -1, -3)


def _bands(weights):
    """(first, length) of the non-zero band of every row of host weights (R, pooled, size)."""
    nz = weights != 0
    has = nz.any(axis=2)
    first = np.where(has, np.argmax(nz, axis=2), 0)
    last = np.where(has, weights.shape[2] - 1 - np.argmax(nz[..., ::-1], axis=2), -1)
    return first, last - first + 1


GROUP_VALUES = 1 << 22   # the most values one group's gathers may hold


def _band_taps(xp, weights, first, length, members, base):
    """Indices (relative to base (G,)) and weights (G, pooled, K) of the bands of the members, K the longest."""
    k = max(int(length[members].max()), 1)
    idx = np.minimum(first[members][..., None] + np.arange(k), weights.shape[2] - 1)
    wts = np.take_along_axis(weights[members], idx, 2) * (np.arange(k) < length[members][..., None])
    return idx - base[:, None, None], xp.asarray(wts)


def _pool_groups(xp, xt, ids, wy, wx):
    """(members, pooled (G, Q, P, C)) for groups of RoIs with samples on the map, from channels-last xt."""
    (fy, ly), (fx, lx) = _bands(wy), _bands(wx)
    c0 = np.where(lx > 0, fx, np.iinfo(np.int64).max).min(axis=1)
    width = np.where(lx > 0, fx + lx, 0).max(axis=1) - np.minimum(c0, xt.shape[2])
    kh, kw = ly.max(axis=1), lx.max(axis=1)
    p, q, c = wy.shape[1], wx.shape[1], xt.shape[3]
    live = np.flatnonzero((kh > 0) & (kw > 0))
    cost = np.maximum(p * kh * width, p * q * kw)[live]
    order = live[np.argsort(cost, kind="stable")]
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * c * cost[np.searchsorted(live, order[end])] <= GROUP_VALUES:
            end += 1
        m = order[start:end]
        start = end
        rows, row_w = _band_taps(xp, wy, fy, ly, m, np.zeros(len(m), np.int64))          # (G, P, K)
        wm = int(width[m].max())
        cols = np.minimum(c0[m][:, None] + np.arange(wm), xt.shape[2] - 1)             # (G, Wm)
        taps = xt[on_device(xp, ids[m], np.int64)[:, None, None, None], on_device(xp, rows, np.int64)[..., None],
                  on_device(xp, cols, np.int64)[:, None, None, :]]                     # (G, P, K, Wm, C)
        band = row_w[:, :, 0, None, None] * taps[:, :, 0]
        for k in range(1, taps.shape[2]):
            band += row_w[:, :, k, None, None] * taps[:, :, k]                         # (G, P, Wm, C)
        at, col_w = _band_taps(xp, wx, fx, lx, m, c0[m])                               # (G, Q, K')
        at = on_device(xp, np.clip(at, 0, wm - 1), np.int64)
        g = xp.arange(len(m))[:, None]
        out = col_w[:, :, 0, None, None] * band[g, :, at[:, :, 0]]
        for k in range(1, at.shape[2]):
            out += col_w[:, :, k, None, None] * band[g, :, at[:, :, k]]                # (G, Q, P, C)
        yield m, out


@op("RoIAlign", inputs=2, outputs=1, inplace=(), shape=_shape, args=ROI_ARGS, grows="shapes",
    gradient=single_gradient("RoIAlignGradient", ["I0", "I1", "GO0"]))
def roi_align(xp, x, rois, *, spatial_scale, pooled_h, pooled_w, sampling_ratio, aligned, order):
    """X (N, C, H, W) (or NHWC), RoIs (R, 5) [batch index, x1, y1, x2, y2] or (R, 4) for one image ->
    Y (R, C, pooled_h, pooled_w) (or NHWC).

    A RoI is scaled by spatial_scale (and shifted by -0.5 when aligned); without aligned, sides under 1 become
    1. Its box is cut into pooled_h x pooled_w bins; each bin averages grid_h x grid_w bilinear samples at the
    centres of a regular sub-grid (grid = sampling_ratio, or ceil(side / pooled side) when <= 0). A sample more
    than one pixel outside the map is 0 (still counted); one within it reads the clamped border.
    """
    n, c, h, w = _checks(x, rois, pooled_h, pooled_w, spatial_scale, order)
    count = _rois_count(rois)
    y = xp.zeros(_y_shape(count, c, pooled_h, pooled_w, order), dtype=x.dtype)
    if count == 0:
        return y
    ids, wy, wx = _plan(backend.to_host(rois), n, h, w, pooled_h, pooled_w, spatial_scale, sampling_ratio,
                        aligned, x.dtype)
    xt = x if order == "NHWC" else xp.ascontiguousarray(xp.moveaxis(x, 1, -1))
    for members, pooled in _pool_groups(xp, xt, ids, wy, wx):          # pooled (G, Q, P, C)
        y[on_device(xp, members, np.int64)] = xp.moveaxis(pooled, (1, 2), (3, 2) if order == "NCHW" else (2, 1))
    return y


# ------------------------------------------------------------------------------------------- gradient
def _grad_shape(specs, *, pooled_h, pooled_w, spatial_scale, order, **_):
    x, rois, dy = specs
    _grad_checks(Meta(x), Meta(rois), Meta(dy), pooled_h, pooled_w, spatial_scale, order)
    return [like(x)]


def _grad_checks(x, rois, dy, pooled_h, pooled_w, spatial_scale, order):
    _, c, _, _ = _checks(x, rois, pooled_h, pooled_w, spatial_scale, order)
    check_float("RoIAlignGradient", X=x, dY=dy)
    want = _y_shape(_rois_count(rois), c, pooled_h, pooled_w, order)
    if tuple(dy.shape) != want:
        raise ShapeError(f"dY must have RoIAlign's output shape {want} for X {tuple(x.shape)} and RoIs "
                         f"{tuple(rois.shape)}, got {tuple(dy.shape)}")


@op("RoIAlignGradient", inputs=3, outputs=1, inplace=(), shape=_grad_shape, args=ROI_ARGS)
def roi_align_gradient(xp, x, rois, dy, *, spatial_scale, pooled_h, pooled_w, sampling_ratio, aligned, order):
    """X, RoIs, dY -> dX (X's shape): every bin's gradient spread over the pixels its samples read, with the
    forward's weights. (Caffe2's kernel reads NCHW whatever `order` says; here NHWC is handled too.)"""
    _grad_checks(x, rois, dy, pooled_h, pooled_w, spatial_scale, order)
    n, c, h, w = _checks(x, rois, pooled_h, pooled_w, spatial_scale, order)
    dx = xp.zeros(x.shape, dtype=x.dtype)
    if _rois_count(rois) == 0:
        return dx
    grads = _channels_first(xp, dy, order)                              # (R, C, P, Q)
    plans = _roi_plans(xp, rois, x.dtype, n, h, w, pooled_h, pooled_w, spatial_scale, sampling_ratio, aligned)
    for r, b, wy, wx, rows, cols in plans:
        ww, hh = wx.shape[1], wy.shape[1]
        part = xp.matmul(grads[r].reshape(c * pooled_h, pooled_w), wx)    # (C·P, w')
        part = part.reshape(c, pooled_h, ww).transpose(1, 0, 2).reshape(pooled_h, c * ww)
        target = _channels_first(xp, dx[b], order)[:, rows, cols]
        target += xp.matmul(wy.T, part).reshape(hh, c, ww).transpose(1, 0, 2)
    return dx
