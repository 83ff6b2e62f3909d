"""Int8 layers with weights: Int8Conv, Int8ConvRelu, Int8ConvTranspose, Int8FC.

Semantics from caffe2/operators/quantized/int8_conv_op.h and int8_fc_op.h (QNNPACK era) and QNNPACK's
convolution.c / fully-connected.c: X and the weights are uint8 Int8 tensors, the bias an int32 Int8 tensor of
the output channels whose codes are added to the accumulator as they are (QNNPACK takes its scale to be
X.scale * W.scale and its zero point 0; the bias tensor's own scale and zero point are not read). Each output
is sum((x - X.zero_point) * (w - W.zero_point)) + bias in int32, requantized with X.scale * W.scale / Y_scale
(which must be below 1) to Y_zero_point, clamped to [0, 255] or, fused with ReLU, [Y_zero_point, 255]
(int8_base.requantize). Padding reads X's zero point, i.e. contributes nothing.

Int8Conv is 2-D and NHWC only (filter M x KH x KW x C/group), with the window arguments of Conv
(window.py geometry; the kernel comes from the filter, and kernel arguments must agree with it). Int8FC
flattens X from axis 1 (Caffe2's Int8FC has no axis argument) to M x K, takes W as N x K and gives M x N.
Int8ConvTranspose (int8_conv_transpose_op.h, QNNPACK's deconvolution.c) is the adjoint of a group-1 convolution:
X N x H x W x C, filter C x KH x KW x M (as ConvTranspose's NHWC filter), output spatial size
(in - 1) * stride + kernel + adj - pad_begin - pad_end; each output is sum over the taps that land on it of
(x - X.zero_point) * (w - W.zero_point), plus the bias, requantized as Int8Conv's (range [0, 255]). Its window
arguments are ConvTranspose's (kernel, stride, pad, adj, legacy_pad VALID/SAME); it has no group argument
(QNNPACK is called with one group).

The sums are exact: the integer codes are multiplied in float64 GEMMs (every partial sum is an integer far below
2^53), then rounded back to integers.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArityError, ShapeError
from ..core.int8 import Int8Tensor
from .int8_base import (
    INT8_GRADIENT, QUANT_ARGS, activation_range, check_nhwc, int8_input, int8_spec, output_quant,
    requantization_scale, requantize, wrap_int32)
from .conv import _kernel_of, _transpose_geometry
from .registry import op
from .window import args_key, col2im, family, geometry, im2col, window_args

CONV_ARGS = {**window_args("kernel", "stride", "pad", "dilation"), "group": 1, **QUANT_ARGS}


def _bias_checks(op_type: str, B, channels: int) -> None:
    if B is None:
        raise ArityError(f"{op_type} needs the bias as input 2 (Caffe2's kernel requires X, filter and bias), "
                         "got 2 inputs; add an int32 Int8 bias (Int8GivenIntTensorFill)")
    int8_input(op_type, "the bias", B, "int32")
    if tuple(B.shape) != (channels,):
        raise ShapeError(f"{op_type}: the bias must be a vector of the {channels} output channels, got shape "
                         f"{tuple(B.shape)}")


def conv_plan(op_type: str, X, W, B, order, group, Y_scale, Y_zero_point, relu, args):
    """Int8Conv's checks on Int8Tensors or specs; (geometry, X's and W's quantization, Y's quantization,
    requantization scale, output range)."""
    check_nhwc(op_type, order)
    qx, qw = int8_input(op_type, "X", X), int8_input(op_type, "the filter", W)
    if len(X.shape) != 4:
        raise ShapeError(f"{op_type} needs a 4-D NHWC image X, got shape {tuple(X.shape)} (QNNPACK convolutions "
                         "are 2-D)")
    if len(W.shape) != 4:
        raise ShapeError(f"{op_type} needs a 4-D filter M x KH x KW x C/group, got shape {tuple(W.shape)}")
    if 0 in tuple(X.shape) or 0 in tuple(W.shape):
        raise ShapeError(f"{op_type}: X {tuple(X.shape)} and the filter {tuple(W.shape)} must have no empty dim "
                         "(QNNPACK refuses an empty batch or image; no channel or no filter is no convolution)")
    c, (m, kh, kw, cg) = X.shape[3], W.shape
    if group < 1 or c % group or m % group:
        raise ShapeError(f"{op_type}: group={group} must be positive and divide the {c} input channels and the "
                         f"{m} filters")
    if cg * group != c:
        raise ShapeError(f"{op_type}: X has {c} channels (NHWC) but the filter {tuple(W.shape)} expects {cg} x "
                         f"group {group} = {cg * group} (filter layout M x KH x KW x C/group)")
    _bias_checks(op_type, B, m)
    given = family(dict(args_key(args)), "kernel", 2)
    if given is not None and tuple(given) != (kh, kw):
        raise ShapeError(f"{op_type}: the kernel arguments say {list(given)} but the filter {tuple(W.shape)} has "
                         f"KH x KW = {kh} x {kw}")
    geom = geometry(args, X.shape[1:3], (kh, kw))
    qy = output_quant(op_type, Y_scale, Y_zero_point)
    return geom, qx, qw, qy, requantization_scale(op_type, qx[0], qw[0], qy[0]), activation_range(qy[1], relu)


def _conv_shape(op_type, relu):
    def shape(specs, *, order, group, Y_scale, Y_zero_point, **args):
        X, W, B = (*specs, None)[:3]
        geom, *_, qy, _, _ = conv_plan(op_type, X, W, B, order, group, Y_scale, Y_zero_point, relu, args)
        return [int8_spec((X.shape[0], *geom.out, W.shape[0]), qy)]
    return shape


def _register_conv(op_type: str, relu: bool, doc: str):
    def kernel(xp, X, W, B=None, *, order, group, Y_scale, Y_zero_point, **args):
        geom, qx, qw, qy, scale, (lo, hi) = conv_plan(op_type, X, W, B, order, group, Y_scale, Y_zero_point,
                                                      relu, args)
        n, m = X.shape[0], W.shape[0]
        xc = xp.moveaxis(X.data.astype(np.float64) - qx[1], -1, 1)          # N x C x H x W, zero point -> 0
        cols = im2col(xp, xc, geom, group)                                   # G x N*P x Cg*K (padding: 0)
        wc = xp.moveaxis(W.data.astype(np.float64) - qw[1], -1, 1)           # M x Cg x KH x KW
        y = xp.matmul(cols, wc.reshape(group, m // group, cols.shape[2]).transpose(0, 2, 1))   # G x N*P x Mg
        y = y.reshape((group, n) + geom.out + (m // group,)).transpose(1, 2, 3, 0, 4).reshape((n, *geom.out, m))
        acc = wrap_int32(xp, xp.rint(y).astype(np.int64) + B.data.astype(np.int64))
        return Int8Tensor(requantize(xp, acc, scale, qy[1], lo, hi), *qy)

    kernel.__name__ = kernel.__qualname__ = op_type
    op(op_type, inputs=(2, 3), outputs=1, inplace=(), gradient=INT8_GRADIENT, args=CONV_ARGS,
       shape=_conv_shape(op_type, relu), doc=doc, grows="shapes")(kernel)


_CONV_DOC = ("2-D convolution of an NHWC uint8 Int8 image X with a filter M x KH x KW x C/group and an int32 "
             "bias, in QNNPACK's integer arithmetic, requantized to Y_scale / Y_zero_point{relu}; output "
             "N x OH x OW x M.")
_register_conv("Int8Conv", False, _CONV_DOC.format(relu=""))
_register_conv("Int8ConvRelu", True, _CONV_DOC.format(relu=", then ReLU (clamped at Y_zero_point)"))


# --------------------------------------------------------------------------------------------- ConvTranspose
def conv_transpose_plan(X, W, B, order, legacy_pad, Y_scale, Y_zero_point, args):
    """Int8ConvTranspose's checks on Int8Tensors or specs; (geometry, output spatial sizes, X's and W's
    quantization, Y's quantization, requantization scale)."""
    op_type = "Int8ConvTranspose"
    check_nhwc(op_type, order)
    qx, qw = int8_input(op_type, "X", X), int8_input(op_type, "the filter", W)
    if len(X.shape) != 4:
        raise ShapeError(f"{op_type} needs a 4-D NHWC image X, got shape {tuple(X.shape)} (QNNPACK deconvolutions "
                         "are 2-D)")
    if len(W.shape) != 4 or W.shape[0] != X.shape[3]:
        raise ShapeError(f"{op_type}: the filter must be C x KH x KW x M with C = X's {X.shape[3]} channels (NHWC), "
                         f"got filter shape {tuple(W.shape)}")
    if 0 in tuple(X.shape) or 0 in tuple(W.shape):
        raise ShapeError(f"{op_type}: X {tuple(X.shape)} and the filter {tuple(W.shape)} must have no empty dim "
                         "(QNNPACK refuses an empty batch or image)")
    _bias_checks(op_type, B, W.shape[3])
    geom, out = _transpose_geometry(args, legacy_pad, tuple(X.shape[1:3]), _kernel_of(args, W, "NHWC"))
    qy = output_quant(op_type, Y_scale, Y_zero_point)
    return geom, out, qx, qw, qy, requantization_scale(op_type, qx[0], qw[0], qy[0])


def _conv_transpose_shape(specs, *, order, legacy_pad, Y_scale, Y_zero_point, **args):
    X, W, B = (*specs, None)[:3]
    _, out, _, _, qy, _ = conv_transpose_plan(X, W, B, order, legacy_pad, Y_scale, Y_zero_point, args)
    return [int8_spec((X.shape[0], *out, W.shape[3]), qy)]


@op("Int8ConvTranspose", inputs=(2, 3), outputs=1, inplace=(), gradient=INT8_GRADIENT, shape=_conv_transpose_shape,
    args={**window_args("kernel", "stride", "pad", "adj"), **QUANT_ARGS}, grows="shapes")
def int8_conv_transpose(xp, X, W, B=None, *, order, legacy_pad, Y_scale, Y_zero_point, **args):
    """Transposed 2-D convolution of an NHWC uint8 Int8 image X with a filter C x KH x KW x M and an int32
    bias, in QNNPACK's integer arithmetic, requantized to Y_scale / Y_zero_point; output N x OH x OW x M."""
    geom, out, qx, qw, qy, scale = conv_transpose_plan(X, W, B, order, legacy_pad, Y_scale, Y_zero_point, args)
    (n, h, w, c), m = X.shape, W.shape[3]
    x = X.data.reshape(n * h * w, c).astype(np.float64) - qx[1]
    wc = xp.moveaxis(W.data.astype(np.float64) - qw[1], 3, 1).reshape(c, -1)     # C x M*KH*KW
    y = col2im(xp, xp.matmul(x, wc)[None], (n, m, *out), geom)                     # N x M x OH x OW
    acc = wrap_int32(xp, xp.rint(xp.moveaxis(y, 1, -1)).astype(np.int64) + B.data.astype(np.int64))
    return Int8Tensor(requantize(xp, acc, scale, qy[1], 0, 255), *qy)


# --------------------------------------------------------------------------------------------- FC
def fc_plan(X, W, B, Y_scale, Y_zero_point):
    """Int8FC's checks on Int8Tensors or specs; (M, K, N, X's and W's quantization, Y's quantization,
    requantization scale)."""
    qx, qw = int8_input("Int8FC", "X", X), int8_input("Int8FC", "W", W)
    shape = tuple(X.shape)
    if not shape or math.prod(shape[1:]) == 0:
        raise ShapeError(f"Int8FC needs X with a batch dim and K > 0 values per row, got shape {shape}")
    k = math.prod(shape[1:])
    if len(W.shape) != 2 or W.shape[1] != k:
        raise ShapeError(f"Int8FC flattens X {shape} from axis 1 to M x K = {math.prod(shape) // k} x {k} (it has "
                         f"no axis argument), so W must be N x K = ? x {k}; got W {tuple(W.shape)}")
    _bias_checks("Int8FC", B, W.shape[0])
    qy = output_quant("Int8FC", Y_scale, Y_zero_point)
    return math.prod(shape) // k, k, W.shape[0], qx, qw, qy, requantization_scale("Int8FC", qx[0], qw[0], qy[0])


def _fc_shape(specs, *, Y_scale, Y_zero_point):
    m, _, n, _, _, qy, _ = fc_plan(*specs, Y_scale, Y_zero_point)
    return [int8_spec((m, n), qy)]


@op("Int8FC", inputs=3, outputs=1, inplace=(), gradient=INT8_GRADIENT, args=QUANT_ARGS, shape=_fc_shape,
    grows="shapes")
def int8_fc(xp, X, W, B, *, Y_scale, Y_zero_point):
    """Y = X W^T + b for X flattened to M x K from axis 1 and W N x K, in QNNPACK's integer arithmetic,
    requantized to Y_scale / Y_zero_point; output M x N."""
    m, k, n, qx, qw, qy, scale = fc_plan(X, W, B, Y_scale, Y_zero_point)
    x = X.data.reshape(m, k).astype(np.float64) - qx[1]
    w = W.data.astype(np.float64) - qw[1]
    acc = wrap_int32(xp, xp.rint(xp.matmul(x, w.T)).astype(np.int64) + B.data.astype(np.int64))
    return Int8Tensor(requantize(xp, acc, scale, qy[1], 0, 255), *qy)
