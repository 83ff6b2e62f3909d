"""Converters of the image families: Conv, ConvTranspose, pooling, LRN, the normalisations, Dropout and the
image-layout ops (PadImage, ResizeNearest, ChannelShuffle, the style-transfer deprocess).

Window geometry (legacy_pad, global_pooling, the kernel/stride/pad argument forms) is computed by stepnet's own
window.geometry, and ONNX gets the explicit begin/end pads it yields (for Caffe's legacy pooling, the tail pad
the last window really reads, so no ceil_mode is needed). NHWC ops are wrapped in transposes to and from NCHW.
"""
from __future__ import annotations

import math

import numpy as np

from ...ops.conv import conv_geometry, conv_transpose_geometry
from ...ops.image import image_pads, nearest_index
from ...ops.math import canonical_axis
from ...ops.pool import pool_geometry
from ...ops.window import image_dims
from .table import converts


def to_nchw(c, x: str, rank: int) -> str:
    return c.e.transpose(x, [0, rank - 1, *range(1, rank - 1)])


def from_nchw(c, y: str, rank: int, out: int = 0) -> None:
    c.e.transpose(y, [0, *range(2, rank), 1], out=[c.out(out)])


def channels_first(c, order: str, body) -> None:
    """Output 0 = body(input 0 as NCHW), transposed back to NHWC when the op is NHWC."""
    rank = len(c.shape(0))
    if order.upper() == "NCHW":
        c.set(0, body(c.x(0)))
        return
    from_nchw(c, body(to_nchw(c, c.x(0), rank)), rank)


def _window_attrs(g) -> dict:
    return {"kernel_shape": list(g.kernel), "strides": list(g.stride), "pads": list(g.pad_begin + g.pad_end)}


# --------------------------------------------------------------------------------------------- conv
@converts("Conv", "Conv1D", "Conv2D", "Conv3D")
def conv(c):
    b = c.meta(2) if len(c.inputs) > 2 else None
    order, g = conv_geometry(c.meta(0), c.meta(1), b, c.args["order"], c.args["group"], _geometry_args(c))
    rank = len(c.shape(0))
    w = c.x(1) if order == "NCHW" else to_nchw(c, c.x(1), rank)
    bias = [c.x(2)] if len(c.inputs) > 2 else []
    attrs = {**_window_attrs(g), "dilations": list(g.dilation), "group": c.args["group"]}
    channels_first(c, order, lambda x: c.e.node("Conv", [x, w, *bias], **attrs))


@converts("ConvTranspose")
def conv_transpose(c):
    b = c.meta(2) if len(c.inputs) > 2 else None
    order, _, g, _ = conv_transpose_geometry(c.meta(0), c.meta(1), b, c.args["order"], c.args["group"],
                                             c.args["legacy_pad"], _geometry_args(c))
    rank = len(c.shape(0))
    adj = _family(c.args, "adj", g.ndim) or (0,) * g.ndim
    w = c.x(1) if order == "NCHW" else to_nchw(c, c.x(1), rank)
    bias = [c.x(2)] if len(c.inputs) > 2 else []
    attrs = {**_window_attrs(g), "output_padding": list(adj), "group": c.args["group"]}
    channels_first(c, order, lambda x: c.e.node("ConvTranspose", [x, w, *bias], **attrs))


def _geometry_args(c) -> dict:
    """The arguments window.geometry reads (the parsed ones minus those the op's kernel takes by name)."""
    skip = {"order", "group", "float16_compute", "no_gradient_to_input", "count_include_pad", "p"}
    return {k: v for k, v in c.args.items() if k not in skip}


def _family(args, fam, nd):
    from ...ops.window import args_key, family
    return family(dict(args_key(args)), fam, nd)


# --------------------------------------------------------------------------------------------- pooling
POOLS = {"MaxPool": "MaxPool", "AveragePool": "AveragePool", "LpPool": "LpPool"}


@converts(*POOLS, "MaxPool1D", "MaxPool2D", "MaxPool3D", "AveragePool1D", "AveragePool2D", "AveragePool3D")
def pool(c):
    kind = next(k for k in POOLS if c.op.type.startswith(k))
    args = _geometry_args(c)
    args["order"] = c.args["order"]
    order, _, _, g = pool_geometry(c.meta(0), kind, args)
    extra = {}
    if kind == "LpPool":
        p = float(c.args["p"])
        if p != int(p):
            raise c.refuse(f"ONNX LpPool takes an integer p, got p={p}")
        extra["p"] = int(p)
    if c.args.get("global_pooling"):   # (onnxruntime lacks GlobalLpPool at recent opsets: a whole-image LpPool)
        glob = {"kernel_shape": list(g.kernel), **extra}
        channels_first(c, order, lambda x: c.e.node(kind, [x], **glob) if kind == "LpPool" else
                       c.e.node(f"Global{kind}", [x]))
        return
    spatial = image_dims(c.shape(0), order)[2]
    # a tail pad as large as the kernel (Caffe's legacy pooling) becomes the pad the last window really reads
    tail = tuple(e if e < k else max(g.extent(i) - spatial[i] - g.pad_begin[i], 0)
                 for i, (e, k) in enumerate(zip(g.pad_end, g.kernel)))
    if any(p >= k for p, k in zip(g.pad_begin + tail, g.kernel + g.kernel)):
        raise c.refuse("a pooling window lies entirely in the padding (pad >= kernel), which ONNX pooling "
                       "cannot express")
    attrs = {"kernel_shape": list(g.kernel), "strides": list(g.stride), "pads": list(g.pad_begin + tail), **extra}
    if kind == "AveragePool":
        attrs["count_include_pad"] = int(bool(c.args["count_include_pad"]))
    channels_first(c, order, lambda x: c.e.node(kind, [x], **attrs))


@converts("LRN")
def lrn(c):
    a = c.args
    if c.wants(1):
        raise c.refuse("its second output (the scale) has no ONNX form; export the outputs that do not read it")
    attrs = {"size": a["size"], "alpha": float(a["alpha"]), "beta": float(a["beta"]), "bias": float(a["bias"])}
    channels_first(c, a["order"], lambda x: c.e.node("LRN", [x], **attrs))


# --------------------------------------------------------------------------------------------- normalisation
def _vector(c, j: int) -> str:
    return c.x(j) if len(c.shape(j)) == 1 else c.e.reshape(c.x(j), [-1])


@converts("SpatialBN")
def spatial_bn(c):
    if not c.args["is_test"]:
        raise c.refuse("SpatialBN in training mode (is_test=0) normalises with the batch's own statistics; "
                       "set is_test=1 to export inference")
    params = [_vector(c, j) for j in range(1, 5)]
    eps = float(c.args["epsilon"])
    channels_first(c, c.args["order"], lambda x: c.e.node("BatchNormalization", [x, *params], epsilon=eps))


@converts("InstanceNorm")
def instance_norm(c):
    if c.wants(1) or c.wants(2):
        raise c.refuse("its mean and inverse-std outputs have no ONNX form; export only Y")
    params = [_vector(c, 1), _vector(c, 2)]
    eps = float(c.args["epsilon"])
    channels_first(c, c.args["order"], lambda x: c.e.node("InstanceNormalization", [x, *params], epsilon=eps))


@converts("LayerNorm", opset=17)
def layer_norm(c):
    shape = c.shape(0)
    axis = canonical_axis(c.args["axis"], len(shape))
    tail, dt = shape[axis:], c.dtype(0)
    if c.args["elementwise_affine"]:
        scale, bias = (c.e.reshape(c.x(j), tail) for j in (1, 2))
    else:
        scale, bias = c.e.const(np.ones(tail, dt)), c.e.const(np.zeros(tail, dt))
    y, mean, inv = c.e.node("LayerNormalization", [c.x(0), scale, bias], n=3, axis=axis,
                            epsilon=float(c.args["epsilon"]))
    c.set(0, y)
    stats = list(shape[:axis]) + [1]
    if c.wants(1):
        c.e.reshape(mean, stats, out=[c.out(1)])
    if c.wants(2):
        c.e.reshape(c.e.node("Reciprocal", [inv]), stats, out=[c.out(2)])


@converts("GroupNorm")
def group_norm(c):
    shape, order, group = c.shape(0), c.args["order"].upper(), c.args["group"]
    n, rank = shape[0], len(shape)
    ch = shape[1] if order == "NCHW" else shape[-1]
    hxw = math.prod(shape[2:] if order == "NCHW" else shape[1:-1])
    grouped = [n, group, ch // group * hxw] if order == "NCHW" else [n, hxw, group, ch // group]
    axes = [2] if order == "NCHW" else [1, 3]
    xg = c.e.reshape(c.x(0), grouped)
    mean = c.e.reduce("ReduceMean", xg, axes, True)
    dev = c.e.node("Sub", [xg, mean])
    var = c.e.reduce("ReduceMean", c.e.node("Mul", [dev, dev]), axes, True)
    inv = c.e.node("Reciprocal", [c.e.node("Sqrt", [c.e.node("Add", [var, c.e.scalar(c.args["epsilon"],
                                                                                       c.dtype(0))])])])
    y = c.e.reshape(c.e.node("Mul", [dev, inv]), shape)
    view = [ch] + [1] * (rank - 2) if order == "NCHW" else [ch]
    gamma, beta = (c.e.reshape(c.x(j), view) for j in (1, 2))
    c.emit("Add", [c.e.node("Mul", [y, gamma]), beta], out=0)
    for j, stat in ((1, mean), (2, inv)):
        if c.wants(j):
            c.e.reshape(stat, [n, group], out=[c.out(j)])


@converts("Dropout")
def dropout(c):
    """Inference: Y is X (whatever is_test says); the mask, if read, keeps everything."""
    c.set(0, c.x(0))
    if c.wants(1):
        c.e.node("ConstantOfShape", [c.e.node("Shape", [c.x(0)])], out=[c.out(1)],
                 value=_tensor(np.ones(1, np.bool_)))


def _tensor(arr):
    from onnx import numpy_helper
    return numpy_helper.from_array(arr)


@converts("Normalize", "NormalizeL1")
def normalize(c):
    axes = [canonical_axis(c.args["axis"], len(c.shape(0)))]
    dt = c.dtype(0)
    if c.op.type == "Normalize":
        norm = c.e.node("Sqrt", [c.e.reduce("ReduceSumSquare", c.x(0), axes, True)])
        norm = c.e.node("Max", [norm, c.e.scalar(1e-12, dt)])
    else:
        s = c.e.reduce("ReduceL1", c.x(0), axes, True)
        norm = c.e.node("Where", [c.e.node("Equal", [s, c.e.scalar(0, dt)]), c.e.scalar(1, dt), s])
    c.emit("Div", [c.x(0), norm], out=0)


# --------------------------------------------------------------------------------------------- image layout
@converts("PadImage")
def pad_image(c):
    a = c.args
    t, left, b, r = image_pads(a["pad"], a["pad_t"], a["pad_l"], a["pad_b"], a["pad_r"], a["pads"])
    pads = [0, 0, t, left, 0, 0, b, r] if a["order"] == "NCHW" else [0, t, left, 0, 0, b, r, 0]
    ins = [c.x(0), c.e.ints(pads)]
    if a["mode"] == "constant":
        ins.append(c.e.scalar(a["value"], c.dtype(0)))
    c.emit("Pad", ins, out=0, mode=a["mode"])


@converts("ResizeNearest")
def resize_nearest(c):
    a = c.args
    hs, ws = a["height_scale"], a["width_scale"]
    if len(c.inputs) > 1:
        v = c.value(1)
        if v is None:
            raise c.refuse("its scales input is not a constant; ONNX needs the output size when the model is made")
        hs, ws = (float(s) for s in np.asarray(v).reshape(-1)[-2:])
    shape = c.shape(0)
    h_axis = 2 if a["order"] == "NCHW" else 1
    for axis, s in ((h_axis, hs), (h_axis + 1, ws)):
        nearest_index(shape[axis], s)   # the same size checks as the kernel
    scales = [1.0] * 4
    scales[h_axis], scales[h_axis + 1] = hs, ws
    c.emit("Resize", [c.x(0), "", c.e.const(np.asarray(scales, np.float32))], out=0, mode="nearest",
           coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@converts("ChannelShuffle")
def channel_shuffle(c):
    shape, group = c.shape(0), c.args["group"]
    if c.args["order"] == "NCHW":
        n, ch, hxw = shape[0], shape[1], math.prod(shape[2:])
        view, perm = [n, group, ch // group, hxw], [0, 2, 1, 3]
    else:
        n, ch, hxw = shape[0], shape[-1], math.prod(shape[1:-1])
        view, perm = [n, hxw, group, ch // group], [0, 1, 3, 2]
    c.e.reshape(c.e.transpose(c.e.reshape(c.x(0), view), perm), shape, out=[c.out(0)])


@converts("BRGNCHWCToPackedInt8BGRAStylizerDeprocess")
def stylizer_deprocess(c):
    """X + mean per channel, NaN -> 0, clamped to [0, 255], truncated to uint8, NHWC, alpha 255."""
    n, _, h, w = c.shape(0)
    f32 = np.float32
    x = c.x(0) if c.dtype(0) == f32 else c.e.cast(c.x(0), f32)
    mean = c.e.reshape(c.x(1) if c.dtype(1) == f32 else c.e.cast(c.x(1), f32), [1, 3, 1, 1])
    v = c.e.node("Add", [x, mean])
    v = c.e.node("Where", [c.e.node("IsNaN", [v]), c.e.scalar(0, f32), v])
    v = c.e.node("Clip", [v, c.e.scalar(0, f32), c.e.scalar(255, f32)])
    bgr = c.e.cast(c.e.transpose(v, [0, 2, 3, 1]), np.uint8)
    alpha = c.e.const(np.full((n, h, w, 1), 255, np.uint8))
    c.emit("Concat", [bgr, alpha], out=0, axis=3)
