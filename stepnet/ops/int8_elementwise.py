"""Element-wise Int8 ops: Int8Add, Int8AddRelu, Int8Sum, Int8SumRelu, Int8Relu, Int8Softmax.

Semantics from caffe2/operators/quantized/int8_add_op.h (QNNPACK era), int8_relu_op.h and int8_softmax_op.h,
with QNNPACK's arithmetic (pytorch/QNNPACK src/add.c, softargmax.c, requantization.h):

- Int8Add: A and B of one shape (no broadcasting). With ratios a = A.scale / Y_scale and b = B.scale /
  Y_scale (each in [2^-14, 2^8)), integer multipliers round(a * 2^s), round(b * 2^s) for the shift s that puts
  the larger in [2^21, 2^22); y = zero_point + ((qa - za) * ma + (qb - zb) * mb) >> s (rounded, ties away from
  zero), clamped to [0, 255] ([zero_point, 255] with the fused ReLU). Int8Sum / Int8SumRelu are Caffe2's
  aliases of Int8Add / Int8AddRelu (exactly two inputs).
- Int8Relu: max(q, zero_point), keeping X's quantization.
- Int8Softmax: over all dims after the first, output scale 1/256 and zero point 0 (the only ones QNNPACK
  supports): a table T[i] = round(min(2^32 / C, 2^23 - 1) * exp((i - 255) * X.scale)) read at
  q + 255 - max(q), normalised as min(255, (256 * t + sum / 2) / sum) in integers.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, ArityError, ShapeError
from ..core.int8 import Int8Tensor
from .int8_base import (
    INT8_GRADIENT, QUANT_ARGS, U8_MAX, activation_range, add_multipliers, add_quantize, int8_input, int8_spec,
    output_quant, positive_scale, same_quant)
from .registry import op

ADD_INPLACE = [(0, 0), (1, 0)]


# --------------------------------------------------------------------------------------------- add
def add_plan(op_type: str, xs, Y_scale, Y_zero_point, relu: bool):
    """Int8Add's checks on Int8Tensors or specs; (input quantizations, output quantization, multipliers,
    output range)."""
    if len(xs) != 2:
        raise ArityError(f"{op_type} adds exactly two Int8 tensors (Caffe2's kernel requires 2 inputs), got "
                         f"{len(xs)}")
    a, b = xs
    qa, qb = int8_input(op_type, "A", a), int8_input(op_type, "B", b)
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"{op_type}: A {tuple(a.shape)} and B {tuple(b.shape)} must have the same shape (Int8 add "
                         "has no broadcasting)")
    qy = output_quant(op_type, Y_scale, Y_zero_point)
    lo, hi = activation_range(qy[1], relu)
    if lo >= hi:
        raise ArgumentError(f"{op_type}: with the fused ReLU the output range [{lo}, {hi}] is empty; use a "
                            "Y_zero_point below 255")
    return qa, qb, qy, add_multipliers(op_type, qa[0], qb[0], qy[0]), (lo, hi)


def _add_shape(op_type, relu):
    def shape(specs, *, Y_scale, Y_zero_point):
        qy = add_plan(op_type, specs, Y_scale, Y_zero_point, relu)[2]
        return [int8_spec(specs[0].shape, qy)]
    return shape


def _register_add(op_type: str, relu: bool, inputs, doc: str):
    def kernel(xp, *xs, Y_scale, Y_zero_point):
        qa, qb, qy, mult, (lo, hi) = add_plan(op_type, xs, Y_scale, Y_zero_point, relu)
        return Int8Tensor(add_quantize(xp, xs[0].data, xs[1].data, qa[1], qb[1], mult, qy[1], lo, hi), *qy)

    kernel.__name__ = kernel.__qualname__ = op_type
    op(op_type, inputs=inputs, outputs=1, inplace=ADD_INPLACE, gradient=INT8_GRADIENT, args=QUANT_ARGS,
       shape=_add_shape(op_type, relu), doc=doc)(kernel)


_ADD_DOC = ("Y = A + B element-wise (same shapes, no broadcasting), requantized to Y_scale / Y_zero_point with "
            "QNNPACK's fixed-point add{relu}.")
_register_add("Int8Add", False, 2, _ADD_DOC.format(relu=""))
_register_add("Int8AddRelu", True, 2, _ADD_DOC.format(relu=", then ReLU (clamped at Y_zero_point)"))
_register_add("Int8Sum", False, (1, None), _ADD_DOC.format(relu="") + " Caffe2's alias of Int8Add: exactly two "
              "inputs.")
_register_add("Int8SumRelu", True, (1, None), _ADD_DOC.format(relu=", then ReLU (clamped at Y_zero_point)")
              + " Caffe2's alias of Int8AddRelu: exactly two inputs.")


# --------------------------------------------------------------------------------------------- relu
def _relu_quant(X, Y_scale, Y_zero_point):
    return same_quant("Int8Relu", int8_input("Int8Relu", "X", X), Y_scale, Y_zero_point)


@op("Int8Relu", inputs=1, outputs=1, inplace=[(0, 0)], gradient=INT8_GRADIENT, args=QUANT_ARGS,
    shape=lambda s, **a: [int8_spec(s[0].shape, _relu_quant(s[0], **a))])
def int8_relu(xp, X, *, Y_scale, Y_zero_point):
    """Y = max(X, zero_point) (the code of 0.0), keeping X's quantization."""
    quant = _relu_quant(X, Y_scale, Y_zero_point)
    return Int8Tensor(xp.maximum(X.data, np.uint8(quant[1])), *quant)


# --------------------------------------------------------------------------------------------- softmax
SOFTMAX_SCALE = 1.0 / 256.0


def softmax_plan(X, axis, Y_scale, Y_zero_point):
    """Int8Softmax's checks on an Int8Tensor or spec; (rows, channels, X's scale)."""
    scale = int8_input("Int8Softmax", "X", X)[0]
    if axis != 1:
        raise ArgumentError(f"Int8Softmax normalises over every dim after the first (Caffe2's kernel ignores "
                            f"'axis'); axis={axis} is not supported")
    if float(np.float32(Y_scale)) != SOFTMAX_SCALE or Y_zero_point != 0:
        raise ArgumentError(f"Int8Softmax's output has scale 1/256 and zero point 0 (the only ones QNNPACK's "
                            f"softmax supports); set Y_scale=0.00390625 and Y_zero_point=0, got {Y_scale:g} and "
                            f"{Y_zero_point}")
    positive_scale("Int8Softmax", "X", scale)
    if len(X.shape) < 1 or math.prod(X.shape) == 0:
        raise ShapeError(f"Int8Softmax needs a non-empty X with a batch dim, got shape {tuple(X.shape)}")
    return X.shape[0], math.prod(X.shape) // X.shape[0], scale


def softmax_table(channels: int, scale: float) -> np.ndarray:
    """QNNPACK's lookup table: round(min((2^32 - 1) / C, 2^23 - 1) * exp((i - 255) * scale)) for i in 0..255."""
    qscale = min((2.0 ** 32 - 1) / channels, 8388607.0)
    return np.rint(qscale * np.exp((np.arange(256, dtype=np.float64) - 255) * scale)).astype(np.int64)


def _softmax_shape(specs, *, axis, Y_scale, Y_zero_point):
    softmax_plan(specs[0], axis, Y_scale, Y_zero_point)
    return [int8_spec(specs[0].shape, (SOFTMAX_SCALE, 0))]


@op("Int8Softmax", inputs=1, outputs=1, inplace=(), gradient=INT8_GRADIENT, shape=_softmax_shape,
    args={"axis": 1, **QUANT_ARGS})
def int8_softmax(xp, X, *, axis, Y_scale, Y_zero_point):
    """Softmax of each row (X flattened to N x C from axis 1) as uint8 codes of scale 1/256 and zero point 0,
    computed with QNNPACK's exp table and integer normalisation."""
    n, channels, scale = softmax_plan(X, axis, Y_scale, Y_zero_point)
    rows = X.data.reshape(n, channels).astype(np.int64)
    table = xp.asarray(softmax_table(channels, scale))
    t = table[rows + (U8_MAX - rows.max(axis=1, keepdims=True))]
    total = t.sum(axis=1, keepdims=True)
    y = xp.minimum(((t << 8) + (total >> 1)) // total, U8_MAX).astype(np.uint8)
    return Int8Tensor(y.reshape(X.shape), SOFTMAX_SCALE, 0)
