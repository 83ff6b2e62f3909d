"""Image-layout operators: PadImage, ResizeNearest, ChannelShuffle and the two pixel-format ops of Caffe2's
mobile style-transfer nets (uint8 BGRA NHWC in, float NCHW through the net, uint8 BGRA NHWC out), and
NormalizePlanarYUV (a per-channel (X - mean) / std of mobile nets' planar YUV input).

NCHW2NHWC / NHWC2NCHW live in layout.py. Kernels and shape functions share each op's checks and size rules;
image_grad.py reuses them for the gradient kernels. Gradient makers (pad_op.cc, resize_op.cc,
channel_shuffle_op.cc): PadImageGradient(dY), ResizeNearestGradient(dY, X[, scales]) and
ChannelShuffleGradient(dY), each -> dX; the stylizer ops and NormalizePlanarYUV have none.
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import Meta, check_float, like, out_spec, single_gradient
from .norm import channel_layout, check_order
from .registry import Arg, op

PAD_MODES = ("constant", "reflect", "edge")


# ----------------------------------------------------------------------------------------------- PadImage
def image_pads(pad, pad_t, pad_l, pad_b, pad_r, pads) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from the conv-style pad arguments, with ConvPoolOpBase's precedence:
    `pads` ([t, l, b, r]), else `pad` on every side, else all four of pad_t/pad_l/pad_b/pad_r, else 0."""
    sides = {"pad_t": pad_t, "pad_l": pad_l, "pad_b": pad_b, "pad_r": pad_r}
    if pads:
        if len(pads) != 4:
            raise ArgumentError(f"pads must list 4 values [t, l, b, r] for an image, got {list(pads)}")
        return tuple(int(p) for p in pads)
    if pad is not None:
        return (pad,) * 4
    given = [k for k, v in sides.items() if v is not None]
    if not given:
        return (0, 0, 0, 0)
    if len(given) != 4:
        missing = ", ".join(k for k in sides if k not in given)
        raise ArgumentError(f"{', '.join(given)} given without {missing}: Caffe2 uses the per-side pads only "
                            "when all four are set (it would silently pad nothing); give all four, or `pad`")
    return (pad_t, pad_l, pad_b, pad_r)


def padded_size(size: int, before: int, after: int, mode: str) -> int:
    """The length of an axis of `size` padded by (before, after) (negative: cropped), checked; Python ints only,
    so that a shape function sizes a huge output without building it."""
    out = size + before + after
    if out <= 0:
        raise ShapeError(f"padding ({before}, {after}) leaves no output along an axis of size {size}")
    if mode == "reflect" and max(abs(before), abs(size + after - 1)) > 2 * size - 2:
        raise ShapeError(f"reflect padding ({before}, {after}) needs an axis longer than the pad, "
                         f"got size {size}; use mode 'edge' or smaller pads")
    return out


def source_index(size: int, before: int, after: int, mode: str):
    """For each output position along one axis: the input index it copies and whether it is inside."""
    idx = np.arange(padded_size(size, before, after, mode)) - before
    inside = (idx >= 0) & (idx < size)
    if mode == "reflect":
        idx = np.abs(idx)
        idx = np.minimum(idx, 2 * size - 2 - idx)  # one reflection about each edge, edge sample excluded
    else:
        idx = np.clip(idx, 0, size - 1)
    return idx, inside


def pad_plan(x, **args):
    """PadImage's checks; the row and column plans (source index, inside mask) and the height axis."""
    (t, left, b, r), h_axis = pad_sides(x, **args)
    return (source_index(x.shape[h_axis], t, b, args["mode"]),
            source_index(x.shape[h_axis + 1], left, r, args["mode"]), h_axis)


def pad_sides(x, *, pad, pad_t, pad_l, pad_b, pad_r, pads, mode, value, order, legacy_pad, stride):
    """PadImage's checks of its arguments; ((top, left, bottom, right), the height axis)."""
    check_order(order)
    check_float(X=x)
    if mode not in PAD_MODES:
        raise ArgumentError(f"mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    if legacy_pad:
        raise ArgumentError("PadImage only supports explicit pad values (legacy_pad must be unset)")
    if stride != 1:
        raise ArgumentError(f"PadImage does not support stride, got stride={stride}")
    if x.ndim != 4 or x.size == 0:
        raise ShapeError(f"PadImage needs a non-empty 4-d image ({order}), got shape {x.shape}")
    return image_pads(pad, pad_t, pad_l, pad_b, pad_r, pads), (2 if order == "NCHW" else 1)


def _pad_shape(specs, **args):
    (t, left, b, r), h_axis = pad_sides(Meta(specs[0]), **args)
    shape = list(specs[0].shape)
    shape[h_axis:h_axis + 2] = [padded_size(shape[h_axis], t, b, args["mode"]),
                                padded_size(shape[h_axis + 1], left, r, args["mode"])]
    return [out_spec(shape, specs[0].dtype)]


PAD_ARGS = {"pad": Arg("int", None), "pad_t": Arg("int", None), "pad_l": Arg("int", None),
            "pad_b": Arg("int", None), "pad_r": Arg("int", None), "pads": Arg("ints", None),
            "mode": "constant", "value": 0.0, "order": "NCHW", "legacy_pad": 0, "stride": 1}


@op("PadImage", inputs=1, outputs=1, inplace=[], shape=_pad_shape, args=PAD_ARGS, grows="shapes",
    gradient=single_gradient("PadImageGradient", ["GO0"]))
def pad_image(xp, x, *, pad, pad_t, pad_l, pad_b, pad_r, pads, mode, value, order, legacy_pad, stride):
    """Pad (or, with negative pads, crop) the two spatial axes of a 4-d image.

    mode "constant" fills with `value`; "reflect" mirrors about the edge sample without repeating it
    (numpy's "reflect"); "edge" repeats the edge sample.
    """
    (hi, h_in), (wi, w_in), _ = pad_plan(x, pad=pad, pad_t=pad_t, pad_l=pad_l, pad_b=pad_b, pad_r=pad_r,
                                          pads=pads, mode=mode, value=value, order=order,
                                          legacy_pad=legacy_pad, stride=stride)
    rows = xp.asarray(hi)[:, None]
    cols = xp.asarray(wi)[None, :]
    y = x[:, :, rows, cols] if order == "NCHW" else x[:, rows, cols, :]
    if mode == "constant":
        inside = xp.asarray(h_in[:, None] & w_in[None, :])
        inside = inside[None, None] if order == "NCHW" else inside[None, :, :, None]
        y = xp.where(inside, y, x.dtype.type(value))
    return y


# ------------------------------------------------------------------------------------------- ResizeNearest
def resize_plan(x, scales, width_scale, height_scale, order):
    """ResizeNearest's checks; (height axis, height scale, width scale). `scales` is None or (shape of the
    scales input, its float32 values or None when unknown: TensorSpecs carry no float values)."""
    check_order(order)
    check_float(X=x)
    if x.ndim != 4:
        raise ShapeError(f"ResizeNearest needs a 4-d image ({order}), got shape {x.shape}")
    if scales is not None:
        shape, s = scales
        if math.prod(shape) not in (2, 4):
            raise ShapeError(f"scales must be [height_scale, width_scale], got shape {tuple(shape)}")
        height_scale, width_scale = (None, None) if s is None else (float(s[-2]), float(s[-1]))
    if height_scale is not None and not (width_scale > 0 and height_scale > 0):
        raise ArgumentError(f"scales must be > 0, got height_scale={height_scale}, width_scale={width_scale}")
    return (2 if order == "NCHW" else 1), height_scale, width_scale


def host_floats(v):
    return None if v is None else np.asarray(v, dtype=np.float32).reshape(-1)


def _resize_shape(specs, *, width_scale, height_scale, order):
    scales = (specs[1].shape, host_floats(specs[1].value)) if len(specs) > 1 else None
    h_axis, hs, ws = resize_plan(Meta(specs[0]), scales, width_scale, height_scale, order)
    if hs is None:   # float scales from an input: their values are never known statically
        return []
    shape = list(specs[0].shape)
    for i, scale in enumerate((hs, ws)):
        shape[h_axis + i] = nearest_size(shape[h_axis + i], scale)
    return [out_spec(shape, specs[0].dtype)]


def _resize_nearest_gradient(g):
    """GetResizeNearestGradient: (dY, X[, scales]) -> dX."""
    g.op("ResizeNearestGradient", [g.GO(0), *(g.I(i) for i in range(g.n_inputs))], [g.GI(0)])


@op("ResizeNearest", inputs=(1, 2), outputs=1, inplace=[], shape=_resize_shape, gradient=_resize_nearest_gradient,
    grows="values",
    args={"width_scale": 1.0, "height_scale": 1.0, "order": "NCHW"})
def resize_nearest(xp, x, *scales, width_scale, height_scale, order):
    """Nearest-neighbour resize of a 4-d image: out size = floor(in·scale); output pixel i reads input pixel
    min(floor(i / scale), in − 1), all in float32 as Caffe2 computes it. An optional second input
    [height_scale, width_scale] overrides the arguments (the ONNX Upsample form)."""
    scales = (scales[0].shape, host_floats(backend.to_host(scales[0]))) if scales else None
    h_axis, height_scale, width_scale = resize_plan(x, scales, width_scale, height_scale, order)
    rows = nearest_index(x.shape[h_axis], height_scale)
    cols = nearest_index(x.shape[h_axis + 1], width_scale)
    rows, cols = xp.asarray(rows)[:, None], xp.asarray(cols)[None, :]
    return x[:, :, rows, cols] if order == "NCHW" else x[:, rows, cols, :]


def nearest_size(size: int, scale: float) -> int:
    """The length of an axis of `size` resized by `scale` (floor in float32, as Caffe2), checked."""
    out = int(np.float32(size) * np.float32(scale))
    if out <= 0:
        raise ShapeError(f"scale {scale} shrinks an axis of size {size} to nothing")
    return out


def nearest_index(size: int, scale: float):
    """For each output position along a resized axis: the input index it reads."""
    idx = (np.arange(nearest_size(size, scale), dtype=np.float32) / np.float32(scale)).astype(np.int64)
    return np.minimum(idx, size - 1)


# ------------------------------------------------------------------------------------------- ChannelShuffle
def shuffle_layout(x, group, order):
    n, c, hxw, _ = channel_layout(x, order)
    if group <= 0 or c % group:
        raise ShapeError(f"group={group} must divide the {c} channels of X (shape {x.shape})")
    return n, c, hxw


def _shuffle_shape(specs, *, group, order, kernel):
    shuffle_layout(Meta(specs[0]), group, order)
    return [like(specs[0])]


@op("ChannelShuffle", inputs=1, outputs=1, inplace=[], args={"group": 1, "order": "NCHW", "kernel": 1},
    shape=_shuffle_shape, gradient=single_gradient("ChannelShuffleGradient", ["GO0"]))
def channel_shuffle(xp, x, *, group, order, kernel):
    """View the C channels as (group, C/group) and transpose to (C/group, group): output channel
    k·group + g is input channel g·(C/group) + k. (`kernel` is accepted, unused, as the ConvPoolOpBase
    form of this op read it.)"""
    shuffle_layout(x, group, order)
    return shuffle(xp, x, group, order)


def shuffle(xp, x, group: int, order: str):
    """Channels viewed as (group, C/group), transposed; shuffling again with C/group groups undoes it."""
    n, c, hxw, _ = channel_layout(x, order)
    k = c // group
    if order == "NCHW":
        y = x.reshape(n, group, k, hxw).transpose(0, 2, 1, 3)
    else:
        y = x.reshape(n, hxw, group, k).transpose(0, 1, 3, 2)
    return xp.ascontiguousarray(y).reshape(x.shape)


# ----------------------------------------------------------------------------------------------- stylizer
NOISE_BLOB = "__CAFFE2_STYLIZER_NOISE__"


def check_mean(mean) -> None:
    if mean.size != 3:
        raise ShapeError(f"mean must hold 3 values (B, G, R), got shape {mean.shape}")
    check_float(mean=mean)


def _pre_checks(x, mean, noise_size) -> tuple:
    """The preprocess checks; the output shape (N, 3, H, W)."""
    if x.dtype is not None and x.dtype != np.uint8:
        raise DTypeError(f"X must be uint8 BGRA pixels, got {x.dtype}")
    if x.ndim != 4 or x.shape[3] != 4:
        raise ShapeError(f"X must be (N, H, W, 4) BGRA pixels, got shape {x.shape}")
    check_mean(mean)
    if noise_size <= 0:
        raise ArgumentError(f"noise_size must be > 0, got {noise_size}")
    return (x.shape[0], 3, *x.shape[1:3])


@op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", inputs=2, outputs=1, inplace=[], context=True,
    random=True, args={"noise_std": 10.0, "noise_size": 491},
    shape=lambda s, *, noise_std, noise_size, rng: [out_spec(_pre_checks(*map(Meta, s), noise_size),
                                                             np.float32)], writes_unnamed=True)
def stylizer_preprocess(ctx, xp, x, mean, *, noise_std, noise_size, rng):
    """uint8 BGRA images (N, H, W, 4) -> float32 (N, 3, H, W): Y[n, c] = X[n, :, :, c] − mean[c] + noise.

    The noise is noise_size Gaussian samples (std noise_std) drawn once and kept in the workspace blob
    __CAFFE2_STYLIZER_NOISE__, so every run (and every such op in the workspace) adds the same noise; it is
    consumed cyclically in (pixel, channel) order, restarting at each image. Alpha is dropped.
    """
    _pre_checks(x, mean, noise_size)
    mean = mean.reshape(-1).astype(np.float32)
    noise = cached_noise(ctx.workspace, noise_size, noise_std, rng)
    h, w = x.shape[1:3]
    cycle = noise[np.arange(h * w * 3) % noise_size].reshape(h, w, 3).transpose(2, 0, 1)
    y = x[..., :3].transpose(0, 3, 1, 2).astype(np.float32) - mean.reshape(1, 3, 1, 1)
    return xp.ascontiguousarray(y + xp.asarray(cycle)[None])


def cached_noise(ws, size: int, std: float, rng):
    """The workspace's stylizer noise (host float32), created on first use."""
    if size <= 0:
        raise ArgumentError(f"noise_size must be > 0, got {size}")
    if std < 0:
        raise ArgumentError(f"noise_std is the noise's standard deviation and must be >= 0, got {std}")
    blob = ws.create_blob(NOISE_BLOB)
    if blob.value is None:
        blob.set(rng.normal(0.0, abs(std), size).astype(np.float32))   # (abs: -0.0 as 0, which numpy refuses)
    noise = np.asarray(backend.to_host(blob.value), dtype=np.float32).reshape(-1)
    if noise.size < size:
        raise ShapeError(f"the cached noise blob {NOISE_BLOB} holds {noise.size} values, fewer than "
                         f"noise_size={size}")
    return noise


def _post_checks(x, mean) -> tuple:
    """The deprocess checks; the output shape (N, H, W, 4)."""
    check_float(X=x)
    if x.ndim != 4 or x.shape[1] != 3:
        raise ShapeError(f"X must be (N, 3, H, W), got shape {x.shape}")
    check_mean(mean)
    return (x.shape[0], *x.shape[2:], 4)


@op("BRGNCHWCToPackedInt8BGRAStylizerDeprocess", inputs=2, outputs=1, inplace=[],
    shape=lambda s: [out_spec(_post_checks(*map(Meta, s)), np.uint8)])
def stylizer_deprocess(xp, x, mean):
    """float (N, 3, H, W) -> uint8 BGRA (N, H, W, 4): channel c = X[:, c] + mean[c], clamped to [0, 255] and
    truncated toward zero (NaN becomes 0); alpha is 255."""
    _post_checks(x, mean)
    v = x.astype(np.float32) + mean.reshape(1, 3, 1, 1).astype(np.float32)
    v = xp.where(xp.isnan(v), np.float32(0), xp.clip(v, np.float32(0), np.float32(255)))
    n, _, h, w = x.shape
    y = xp.full((n, h, w, 4), 255, dtype=np.uint8)
    y[..., :3] = v.transpose(0, 2, 3, 1).astype(np.uint8)
    return y


# ----------------------------------------------------------------------------------------------- planar YUV
def _yuv_checks(x, mean, std) -> int:
    """NormalizePlanarYUV's checks (norm_planar_yuv_op.cc); the channel count C."""
    check_float("NormalizePlanarYUV", X=x, mean=mean, std=std)
    if len(x.shape) != 4:
        raise ShapeError(f"NormalizePlanarYUV: X must be 4-D NCHW (N, C, H, W), got shape {tuple(x.shape)}")
    c = x.shape[1]
    for name, v in (("mean", mean), ("std", std)):
        if len(v.shape) < 2 or v.shape[1] != c or math.prod(v.shape) < c:
            raise ShapeError(f"NormalizePlanarYUV: {name} must be (1, C) = (1, {c}), one value per channel of X "
                             f"in its dim 1, got shape {tuple(v.shape)}")
    return c


def _yuv_shape(specs):
    _yuv_checks(*specs)
    return [like(specs[0])]


@op("NormalizePlanarYUV", inputs=3, outputs=1, inplace=[(0, 0)], shape=_yuv_shape, shapes_from_inputs=True)
def normalize_planar_yuv(xp, x, mean, std):
    """float X (N, C, H, W), mean and std (1, C) -> (X[:, c] - mean[c]) / std[c] per channel (the first C
    values of mean and std); a std of 0 gives inf or NaN, as in Caffe2."""
    c = _yuv_checks(x, mean, std)
    m = xp.reshape(xp.reshape(mean, (-1,))[:c], (1, c, 1, 1))
    s = xp.reshape(xp.reshape(std, (-1,))[:c], (1, c, 1, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return (x - m) / s
