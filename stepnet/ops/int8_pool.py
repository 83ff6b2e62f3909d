"""Int8 pooling and resizing: Int8MaxPool, Int8MaxPoolRelu, Int8AveragePool, Int8AveragePoolRelu,
Int8ResizeNearest (NHWC, uint8 Int8 tensors).

Semantics from caffe2/operators/quantized/int8_max_pool_op.h, int8_average_pool_op.h (QNNPACK era),
int8_resize_nearest_op.h and QNNPACK's max-pooling.c, average-pooling.c, global-average-pooling.c:

- Int8MaxPool: the maximum code of each window (padding never wins), keeping X's quantization (Y_scale and
  Y_zero_point must repeat it); the fused ReLU clamps at the zero point. QNNPACK refuses 1x1 windows.
- Int8AveragePool: requantizes to Y_scale / Y_zero_point (X.scale / Y_scale in [2^-8, 2^8)). Padding reads
  X's zero point, so padded pixels add nothing but still count: every window is divided by the full kernel
  size (unlike the float AveragePool, which divides by the pixels inside the image). The sum of
  (x - X.zero_point) is scaled by X.scale / (Y_scale * kernel size) with QNNPACK's 24-bit fixed-point
  multiplier, rounding ties away from zero (int8_base.avgpool_quantize). A window covering the whole image
  with no padding or stride is QNNPACK's global average pooling (same arithmetic); otherwise 1x1 windows are
  refused.
- Int8ResizeNearest: nearest-neighbour resize of the H and W axes (float ResizeNearest's float32 index
  rule), keeping X's quantization.

Windows come from window.py (the float pooling geometry: kernel/stride/pad forms, legacy_pad,
global_pooling; no dilation).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, ShapeError
from ..core.int8 import Int8Tensor
from .image import nearest_index, nearest_size
from .int8_base import (
    INT8_GRADIENT, QUANT_ARGS, activation_range, avgpool_quantize, check_nhwc, int8_input, int8_spec, output_quant,
    positive_scale, same_quant)
from .pool import POOL_ARGS
from .registry import op
from .window import from_channels_first, geometry, window_view


def pool_plan(op_type: str, X, order, args):
    """A pooling op's checks on an Int8Tensor or spec; (X's quantization, geometry, global pooling?)."""
    check_nhwc(op_type, order)
    quant = int8_input(op_type, "X", X)
    if len(X.shape) != 4:
        raise ShapeError(f"{op_type} needs a 4-D NHWC image X, got shape {tuple(X.shape)}")
    geom = geometry(args, X.shape[1:3], pool=True)
    whole = (not any(geom.pad_begin + geom.pad_end) and all(s == 1 for s in geom.stride)
             and geom.kernel == tuple(X.shape[1:3]))
    if math.prod(geom.kernel) == 1 and not whole:
        raise ArgumentError(f"{op_type}: QNNPACK refuses 1x1 pooling windows (they would copy the input)")
    return quant, geom, whole


def _out_shape(X, geom):
    return (X.shape[0], *geom.out, X.shape[3])


def _windows(xp, data, geom):
    """(N, C, OH, OW, KH, KW) windows of an NHWC array (padding: 0)."""
    return window_view(xp, xp.moveaxis(data, -1, 1), geom, fill=0)


# --------------------------------------------------------------------------------------------- max pool
def _max_pool_plan(op_type, relu, X, order, Y_scale, Y_zero_point, args):
    quant, geom, _ = pool_plan(op_type, X, order, args)
    return same_quant(op_type, quant, Y_scale, Y_zero_point), geom, activation_range(quant[1], relu)


def _register_max_pool(op_type: str, relu: bool, doc: str):
    def kernel(xp, X, *, order, Y_scale, Y_zero_point, **args):
        quant, geom, (lo, hi) = _max_pool_plan(op_type, relu, X, order, Y_scale, Y_zero_point, args)
        y = _windows(xp, X.data, geom).max(axis=(-2, -1))
        return Int8Tensor(from_channels_first(xp, xp.clip(y, lo, hi).astype(np.uint8), "NHWC"), *quant)

    def shape(specs, *, order, Y_scale, Y_zero_point, **args):
        quant, geom, _ = _max_pool_plan(op_type, relu, specs[0], order, Y_scale, Y_zero_point, args)
        return [int8_spec(_out_shape(specs[0], geom), quant)]

    kernel.__name__ = kernel.__qualname__ = op_type
    op(op_type, inputs=1, outputs=1, inplace=(), gradient=INT8_GRADIENT, args={**POOL_ARGS, **QUANT_ARGS},
       shape=shape, doc=doc, grows="shapes")(kernel)


_MAX_DOC = ("The maximum uint8 code of each window of an NHWC Int8 image (padding never wins), keeping X's "
            "quantization{relu}.")
_register_max_pool("Int8MaxPool", False, _MAX_DOC.format(relu=""))
_register_max_pool("Int8MaxPoolRelu", True, _MAX_DOC.format(relu=", clamped below at the zero point (ReLU)"))


# --------------------------------------------------------------------------------------------- average pool
def _avg_pool_plan(op_type, relu, X, order, Y_scale, Y_zero_point, args):
    """(X's and Y's quantization, geometry, requantization scale, output range)."""
    qx, geom, _ = pool_plan(op_type, X, order, args)
    qy = output_quant(op_type, Y_scale, Y_zero_point)
    positive_scale(op_type, "X", qx[0])
    ratio = np.float32(qx[0]) / np.float32(qy[0])
    if not 2.0 ** -8 <= ratio < 2.0 ** 8:
        raise ArgumentError(f"{op_type}: X's scale {qx[0]:g} over Y_scale {qy[0]:g} is {float(ratio):g}; QNNPACK's "
                            "average pooling needs it in [2^-8, 2^8)")
    size = math.prod(geom.kernel)
    if size >= 2 ** 24:
        raise ArgumentError(f"{op_type}: a {size}-pixel window is too large for QNNPACK (below 2^24)")
    scale = float(np.float32(qx[0]) / (np.float32(qy[0]) * np.float32(size)))
    return qx, qy, geom, scale, activation_range(qy[1], relu)


def _register_average_pool(op_type: str, relu: bool, doc: str):
    def kernel(xp, X, *, order, Y_scale, Y_zero_point, **args):
        qx, qy, geom, scale, (lo, hi) = _avg_pool_plan(op_type, relu, X, order, Y_scale, Y_zero_point, args)
        acc = _windows(xp, X.data.astype(np.int64) - qx[1], geom).sum(axis=(-2, -1))
        y = avgpool_quantize(xp, acc, scale, qy[1], lo, hi)
        return Int8Tensor(from_channels_first(xp, y, "NHWC"), *qy)

    def shape(specs, *, order, Y_scale, Y_zero_point, **args):
        _, qy, geom, _, _ = _avg_pool_plan(op_type, relu, specs[0], order, Y_scale, Y_zero_point, args)
        return [int8_spec(_out_shape(specs[0], geom), qy)]

    kernel.__name__ = kernel.__qualname__ = op_type
    op(op_type, inputs=1, outputs=1, inplace=(), gradient=INT8_GRADIENT, args={**POOL_ARGS, **QUANT_ARGS},
       shape=shape, doc=doc, grows="shapes")(kernel)


_AVG_DOC = ("The mean of each window of an NHWC Int8 image, padding counted as X's zero point (every window is "
            "divided by the kernel size), requantized to Y_scale / Y_zero_point with QNNPACK's fixed-point "
            "arithmetic{relu}.")
_register_average_pool("Int8AveragePool", False, _AVG_DOC.format(relu=""))
_register_average_pool("Int8AveragePoolRelu", True, _AVG_DOC.format(relu=", then ReLU (clamped at Y_zero_point)"))


# --------------------------------------------------------------------------------------------- resize
def resize_plan(X, width_scale, height_scale, Y_scale, Y_zero_point):
    """Int8ResizeNearest's checks; (X's quantization, output rows, output columns)."""
    quant = same_quant("Int8ResizeNearest", int8_input("Int8ResizeNearest", "X", X), Y_scale, Y_zero_point)
    if not (width_scale > 0 and height_scale > 0):
        raise ArgumentError(f"Int8ResizeNearest needs width_scale and height_scale > 0, got {width_scale:g} and "
                            f"{height_scale:g}")
    if len(X.shape) != 4:
        raise ShapeError(f"Int8ResizeNearest needs a 4-D NHWC image X, got shape {tuple(X.shape)}")
    return quant, nearest_size(X.shape[1], height_scale), nearest_size(X.shape[2], width_scale)


def _resize_shape(specs, *, width_scale, height_scale, Y_scale, Y_zero_point):
    quant, rows, cols = resize_plan(specs[0], width_scale, height_scale, Y_scale, Y_zero_point)
    n, _, _, c = specs[0].shape
    return [int8_spec((n, rows, cols, c), quant)]


@op("Int8ResizeNearest", inputs=1, outputs=1, inplace=(), gradient=INT8_GRADIENT, shape=_resize_shape, grows="shapes",
    args={"width_scale": 1.0, "height_scale": 1.0, **QUANT_ARGS})
def int8_resize_nearest(xp, X, *, width_scale, height_scale, Y_scale, Y_zero_point):
    """Nearest-neighbour resize of an NHWC Int8 image: out size floor(in * scale), output pixel i reads input
    pixel min(floor(i / scale), in - 1) in float32; keeps X's quantization."""
    quant, _, _ = resize_plan(X, width_scale, height_scale, Y_scale, Y_zero_point)
    rows, cols = nearest_index(X.shape[1], height_scale), nearest_index(X.shape[2], width_scale)
    data = X.data[:, xp.asarray(rows)[:, None], xp.asarray(cols)[None, :], :]
    return Int8Tensor(data, *quant)
