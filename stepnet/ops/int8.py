"""Int8 values in and out, and the Int8 ops that only move codes: Int8Quantize, Int8Dequantize,
Int8GivenTensorFill, Int8GivenIntTensorFill, Int8Reshape, Int8Flatten, Int8Transpose, Int8Concat.

Semantics from caffe2/operators/quantized/int8_quantize_op.h, int8_dequantize_op.h,
int8_given_tensor_fill_op.h, int8_reshape_op.h, int8_flatten_op.h, int8_transpose_op.h and int8_concat_op.h.
Int8Quantize rounds x / Y_scale half to even in float32 and clamps zero_point + that to [0, 255];
Int8Dequantize gives (q - zero_point) * scale in float32. The ops that move codes keep their input's
quantization, and (as in Caffe2) their Y_scale / Y_zero_point arguments must repeat it. The shape rules are
those of the float ops (layout.py, shape.py), whose kernels run on the codes. Values are Int8Tensors
(stepnet/core/int8.py); no Int8 op has a gradient (int8_base.INT8_GRADIENT).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..core.int8 import Int8Tensor, dequantize, quantize_uint8
from .base import canonical_axis, on_device, out_spec
from .int8_base import INT8_GRADIENT, QUANT_ARGS, int8_input, int8_spec, output_quant, plain, quant_of, same_quant
from .layout import flatten, reshape, transpose
from .registry import REGISTRY, Arg, op


# --------------------------------------------------------------------------------------------- (de)quantize
def _quantize_checks(X, Y_scale, Y_zero_point):
    if quant_of(X) is not None or X.dtype != np.float32:
        got = "an Int8 tensor" if quant_of(X) is not None else f"a {X.dtype} tensor"
        raise DTypeError(f"Int8Quantize needs X as a float32 tensor, got {got}"
                         + ("" if quant_of(X) is not None else " (Cast it to float32 first)"))
    return output_quant("Int8Quantize", Y_scale, Y_zero_point)


@op("Int8Quantize", inputs=1, outputs=1, inplace=(), args=QUANT_ARGS, gradient=INT8_GRADIENT,
    shape=lambda s, **a: [int8_spec(s[0].shape, _quantize_checks(s[0], **a))])
def int8_quantize(xp, X, *, Y_scale, Y_zero_point):
    """Y = clamp(Y_zero_point + round(X / Y_scale), 0, 255) as uint8 codes with Y_scale and Y_zero_point;
    X / Y_scale is rounded half to even in float32, as Caffe2's QuantizeUint8 does."""
    quant = _quantize_checks(X, Y_scale, Y_zero_point)
    return Int8Tensor(quantize_uint8(xp, X, *quant), *quant)


def _dequantize_shape(specs):
    int8_input("Int8Dequantize", "X", specs[0])
    return [out_spec(specs[0].shape, np.float32)]


@op("Int8Dequantize", inputs=1, outputs=1, inplace=(), gradient=INT8_GRADIENT, shape=_dequantize_shape)
def int8_dequantize(xp, X):
    """Y = (X - zero_point) * scale, a float32 tensor of X's shape (uint8 codes only, as in Caffe2)."""
    int8_input("Int8Dequantize", "X", X)
    return dequantize(xp, X.data, X.scale, X.zero_point)


# --------------------------------------------------------------------------------------------- fills
def _fill_values(op_type, shape, values, dtype):
    if any(d < 0 for d in shape):
        raise ArgumentError(f"{op_type}: 'shape' {list(shape)} has a negative size")
    if dtype == np.uint8:
        raw = values.encode("utf-8") if isinstance(values, str) else bytes(values)
        host = np.frombuffer(raw, dtype=np.uint8).copy()
    else:
        host = np.asarray(values, dtype=np.int64).reshape(-1)
        if host.size and (host.min() < -2 ** 31 or host.max() >= 2 ** 31):
            raise ArgumentError(f"{op_type}: 'values' holds numbers outside the int32 range")
        host = host.astype(np.int32)
    if host.size != math.prod(shape):
        raise ArgumentError(f"{op_type}: 'shape' {list(shape)} needs {math.prod(shape)} values but 'values' holds "
                            f"{host.size}; make 'shape' and 'values' agree")
    return host.reshape(shape)


def _fill_quant(op_type, dtype, Y_scale, Y_zero_point):
    """uint8 codes need an output quantization; a bias (int32) only a finite scale and an int32 zero point."""
    if dtype == np.uint8:
        return output_quant(op_type, Y_scale, Y_zero_point)
    scale = float(np.float32(Y_scale))
    if not math.isfinite(scale) or not -2 ** 31 <= Y_zero_point < 2 ** 31:
        raise ArgumentError(f"{op_type}: Y_scale must be finite and Y_zero_point an int32, got {Y_scale!r} and "
                            f"{Y_zero_point!r}")
    return scale, Y_zero_point


def _register_fill(op_type, dtype, values_arg, doc):
    def kernel(xp, *, shape, values, Y_scale, Y_zero_point):
        quant = _fill_quant(op_type, dtype, Y_scale, Y_zero_point)
        return Int8Tensor(xp.asarray(_fill_values(op_type, shape, values, dtype)), *quant)

    def shape_fn(specs, *, shape, values, Y_scale, Y_zero_point):
        quant = _fill_quant(op_type, dtype, Y_scale, Y_zero_point)
        return [int8_spec(_fill_values(op_type, shape, values, dtype).shape, quant, dtype)]

    kernel.__name__ = kernel.__qualname__ = op_type
    op(op_type, inputs=0, outputs=1, gradient=INT8_GRADIENT, shape=shape_fn, doc=doc,
       args={"shape": Arg("ints", [], "output shape"), "values": values_arg, **QUANT_ARGS})(kernel)


_register_fill("Int8GivenTensorFill", np.uint8, Arg("str", "", "the uint8 codes, one byte each"),
               "An Int8 tensor of `shape` whose uint8 codes are the bytes of the string `values`, with Y_scale and "
               "Y_zero_point.")
_register_fill("Int8GivenIntTensorFill", np.int32, Arg("ints", [], "the int32 codes"),
               "An Int8 tensor of `shape` with the int32 codes `values` (a bias of Int8Conv/Int8FC), with Y_scale "
               "and Y_zero_point.")


# --------------------------------------------------------------------------------------------- reshapes
def _codes_shape(op_type, float_type, specs, Y_scale, Y_zero_point, dtype=None, **args):
    """Shape function of an op that moves codes: the float op's shape rule on the codes, X's quantization."""
    quant = same_quant(op_type, int8_input(op_type, "X", specs[0], dtype), Y_scale, Y_zero_point)
    outs = REGISTRY.get(float_type).shape([plain(specs[0]), *specs[1:]], **args)
    return [int8_spec(outs[0].shape, quant, specs[0].dtype), *outs[1:]]


@op("Int8Reshape", inputs=(1, 2), outputs=2, inplace=[(0, 0)], host_inputs=(1,), gradient=INT8_GRADIENT,
    args={"shape": Arg("ints", None), **QUANT_ARGS},
    shape=lambda s, **a: _codes_shape("Int8Reshape", "Reshape", s, **a))
def int8_reshape(xp, X, *shape_input, shape, Y_scale, Y_zero_point):
    """Reshape's rules (argument `shape` or a 1-D int input; 0 copies a dim, one -1 is inferred) on X's codes,
    keeping X's quantization; old_shape is X's shape (int64)."""
    quant = same_quant("Int8Reshape", int8_input("Int8Reshape", "X", X, None), Y_scale, Y_zero_point)
    data, old_shape = reshape(xp, X.data, *shape_input, shape=shape)
    return Int8Tensor(data, *quant), old_shape


@op("Int8Flatten", inputs=1, outputs=1, inplace=(), gradient=INT8_GRADIENT, args={"axis": 1, **QUANT_ARGS},
    shape=lambda s, **a: _codes_shape("Int8Flatten", "Flatten", s, **a))
def int8_flatten(xp, X, *, axis, Y_scale, Y_zero_point):
    """X's codes as a 2-D tensor [prod(dims[:axis]), prod(dims[axis:])], keeping X's quantization."""
    quant = same_quant("Int8Flatten", int8_input("Int8Flatten", "X", X, None), Y_scale, Y_zero_point)
    return Int8Tensor(flatten(xp, X.data, axis), *quant)


@op("Int8Transpose", inputs=1, outputs=1, inplace=(), gradient=INT8_GRADIENT,
    args={"axes": Arg("ints", None), **QUANT_ARGS},
    shape=lambda s, **a: _codes_shape("Int8Transpose", "Transpose", s, dtype="uint8", **a))
def int8_transpose(xp, X, *, axes, Y_scale, Y_zero_point):
    """X's uint8 codes with their dims permuted by `axes` (default: reversed), keeping X's quantization."""
    quant = same_quant("Int8Transpose", int8_input("Int8Transpose", "X", X), Y_scale, Y_zero_point)
    return Int8Tensor(transpose(xp, X.data, axes), *quant)


# --------------------------------------------------------------------------------------------- concat
def concat_axis(xs, axis, order, add_axis, Y_scale, Y_zero_point):
    """Int8Concat's checks on arrays or specs; (axis, X0's quantization). The axis defaults to C for
    order NHWC (3) or NCHW (1), else to 0, as in Caffe2's constructor."""
    if add_axis:
        raise ArgumentError("Int8Concat does not support add_axis (Caffe2's kernel ignores it); stack with a "
                            "float Concat instead")
    quants = [int8_input("Int8Concat", f"input {i}", x) for i, x in enumerate(xs)]
    quant = same_quant("Int8Concat", quants[0], Y_scale, Y_zero_point)
    s0 = tuple(xs[0].shape)
    order = (order or "").upper()
    if order == "NHWC" and len(s0) != 4:
        raise ShapeError(f"Int8Concat with order NHWC needs 4-D inputs, got input 0 of shape {s0}")
    default = {"NHWC": 3, "NCHW": 1}.get(order, 0)
    ax = canonical_axis(default if axis is None else axis, len(s0))
    for i, x in enumerate(xs[1:], 1):
        s = tuple(x.shape)
        if len(s) != len(s0) or s[:ax] + s[ax + 1:] != s0[:ax] + s0[ax + 1:]:
            raise ShapeError(f"Int8Concat: input {i} has shape {s} but input 0 has {s0}; they must agree in every "
                             f"dimension except axis {ax}")
    return ax, quant


def _concat_shape(specs, *, axis, order, add_axis, Y_scale, Y_zero_point):
    ax, quant = concat_axis(specs, axis, order, add_axis, Y_scale, Y_zero_point)
    shape = list(specs[0].shape)
    sizes = [s.shape[ax] for s in specs]
    shape[ax] = sum(sizes)
    return [int8_spec(shape, quant), out_spec((len(specs),), np.int32, sizes)]


@op("Int8Concat", inputs=(1, None), outputs=(1, 2), inplace=(), gradient=INT8_GRADIENT, shape=_concat_shape,
    grows="shapes",
    args={"axis": Arg("int", None), "order": Arg("str", None), "add_axis": 0, **QUANT_ARGS})
def int8_concat(xp, *xs, axis, order, add_axis, Y_scale, Y_zero_point):
    """The inputs' uint8 codes joined along `axis` (default: C for order NHWC or NCHW, else 0) with input 0's
    quantization; also the int32 sizes along it. As in Caffe2, the codes are copied as they are: the other
    inputs are expected to share input 0's scale and zero point."""
    ax, quant = concat_axis(xs, axis, order, add_axis, Y_scale, Y_zero_point)
    data = xp.concatenate([x.data for x in xs], axis=ax)
    return Int8Tensor(data, *quant), on_device(xp, [x.shape[ax] for x in xs], np.int32)
