"""What the Int8 families (int8.py, int8_elementwise.py, int8_conv.py, int8_pool.py) share: input and
argument checks that work on Int8Tensors and on TensorSpecs alike, output specs, and QNNPACK's integer
arithmetic.

Caffe2's Int8 ops (caffe2/operators/quantized/int8_*.h) run on QNNPACK (pytorch/QNNPACK), whose results are
defined in integers: a convolution or fully-connected layer accumulates sum((x - zx) * (w - zw)) + bias in
int32 and requantizes it with the float32 scale x_scale * w_scale / y_scale as a Q31 fixed-point multiplier
(the 24-bit mantissa of the float32 scale) and a rounding right shift (ties away from zero), then clamps to
the activation range and adds the output zero point (requantization.h: qnnp_q31_requantize). The fused ReLU
clamps at the output zero point (int8_utils.h activationLimits). Add and average pooling have their own
fixed-point forms (requantization.h: qnnp_add_quantize, qnnp_avgpool_quantize), written here in numpy.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError
from ..core.int8 import Int8Tensor
from ..core.spec import TensorSpec
from .registry import GRADIENT_NOT_IMPLEMENTED

U8_MAX = 255
# Caffe2 registers no gradient for any Int8 op: asking for one fails there ("Gradient maker for operator ...
# not implemented"), as GRADIENT_NOT_IMPLEMENTED does here.
INT8_GRADIENT = GRADIENT_NOT_IMPLEMENTED
QUANT_ARGS = {"Y_scale": 1.0, "Y_zero_point": 0}   # Caffe2's defaults (GetSingleArgument<float>/<int>)
FLOAT_MIN_NORMAL = float(np.finfo(np.float32).tiny)


# --------------------------------------------------------------------------------------------- checks
def quant_of(x) -> tuple[float, int] | None:
    """(scale, zero_point) of an Int8Tensor or of the TensorSpec of one; None for anything else."""
    if isinstance(x, Int8Tensor):
        return x.scale, x.zero_point
    return x.quant if isinstance(x, TensorSpec) else None


def int8_input(op_type: str, what: str, x, dtype: str | None = "uint8") -> tuple[float, int]:
    """The (scale, zero_point) of an input that must be an Int8 tensor with `dtype` codes (uint8 activations
    and weights, int32 biases, None for either); a DTypeError naming the op and input otherwise."""
    quant = quant_of(x)
    if quant is None:
        got = "an opaque object" if getattr(x, "dtype", None) is None else f"a plain {x.dtype} tensor"
        raise DTypeError(f"{op_type} needs {what} as an Int8 tensor ({dtype} codes with a scale and zero point), "
                         f"got {got}; quantize it first (Int8Quantize, or an Int8*Fill in the init net)")
    if dtype is not None and x.dtype is not None and x.dtype != np.dtype(dtype):
        raise DTypeError(f"{op_type} needs {what} as an Int8 tensor of {dtype} codes, got {x.dtype} codes"
                         + (" (int32 Int8 tensors are biases: Int8GivenIntTensorFill)" if dtype == "uint8" else
                            " (biases are int32: Int8GivenIntTensorFill)"))
    if x.dtype == np.uint8 and not 0 <= quant[1] <= U8_MAX:
        raise ArgumentError(f"{op_type}: {what} has zero point {quant[1]}, outside the uint8 range 0..255")
    return quant


def output_quant(op_type: str, Y_scale: float, Y_zero_point: int) -> tuple[float, int]:
    """The output's (scale, zero_point) from the Y_scale / Y_zero_point arguments, checked."""
    scale = float(np.float32(Y_scale))
    if not (math.isfinite(scale) and scale >= FLOAT_MIN_NORMAL):
        raise ArgumentError(f"{op_type}: Y_scale must be finite and positive, got {Y_scale!r}")
    if not 0 <= Y_zero_point <= U8_MAX:
        raise ArgumentError(f"{op_type}: Y_zero_point must be in 0..255 (a uint8 code), got {Y_zero_point}")
    return scale, int(Y_zero_point)


def positive_scale(op_type: str, what: str, scale: float) -> None:
    """QNNPACK's check on an input scale: finite, positive and a normal float."""
    if not (math.isfinite(scale) and scale >= FLOAT_MIN_NORMAL):
        raise ArgumentError(f"{op_type}: {what} has scale {scale!r}; QNNPACK needs a finite, positive scale")


def same_quant(op_type: str, quant: tuple[float, int], Y_scale: float, Y_zero_point: int) -> tuple[float, int]:
    """Ops that keep their input's quantization (Relu, MaxPool, ResizeNearest, the reshapes, Transpose,
    Concat) check, as Caffe2 does, that Y_scale / Y_zero_point repeat it; returns it."""
    if (float(np.float32(Y_scale)), int(Y_zero_point)) != quant:
        raise ArgumentError(f"{op_type} keeps its input's quantization, so Y_scale and Y_zero_point must equal "
                            f"the input's scale {quant[0]:g} and zero point {quant[1]}; got Y_scale={Y_scale:g}, "
                            f"Y_zero_point={Y_zero_point} (Caffe2 checks this; when absent they are 1 and 0)")
    return quant


def check_nhwc(op_type: str, order: str) -> None:
    if order.upper() != "NHWC":
        raise ArgumentError(f"{op_type} supports only order=\"NHWC\" (Caffe2's Int8 ops run on QNNPACK, which is "
                            f"NHWC only), got order={order!r}{' (the default)' if order == 'NCHW' else ''}; set "
                            "order=\"NHWC\" and lay the image out N x H x W x C")


# --------------------------------------------------------------------------------------------- outputs
def int8_spec(shape, quant, dtype=np.uint8) -> TensorSpec:
    """The spec of an Int8 output (None dims: sizes known only when it runs)."""
    return TensorSpec(tuple(None if d is None else int(d) for d in shape), np.dtype(dtype), None, quant)


def int8_like(spec: TensorSpec) -> TensorSpec:
    return int8_spec(spec.shape, spec.quant, spec.dtype)


def plain(spec: TensorSpec) -> TensorSpec:
    """An Int8 input's spec as the plain spec of its codes (for the shape functions of the float ops)."""
    return TensorSpec(spec.shape, spec.dtype)


# --------------------------------------------------------------------------------------------- arithmetic
def _f32_bits(value: float) -> int:
    return int(np.array(value, np.float32).view(np.uint32))


def q31_multiplier(scale: float) -> tuple[int, int]:
    """QNNPACK's requantization parameters of a float32 scale in [2^-32, 1): the Q31 multiplier (the 24-bit
    mantissa shifted left by 7) and the right shift."""
    bits = _f32_bits(scale)
    return ((bits & 0x7FFFFF) | 0x800000) << 7, 126 - (bits >> 23)


def requantization_scale(op_type: str, x_scale: float, w_scale: float, y_scale: float) -> float:
    """x_scale * w_scale / y_scale in float32, which QNNPACK's convolution and fully-connected operators need
    in [2^-32, 1)."""
    for what, s in (("X", x_scale), ("the weights", w_scale)):
        positive_scale(op_type, what, s)
    scale = float(np.float32(np.float32(x_scale) * np.float32(w_scale)) / np.float32(y_scale))
    if scale >= 1.0:
        raise ArgumentError(f"{op_type}: the requantization scale X.scale * W.scale / Y_scale = {x_scale:g} * "
                            f"{w_scale:g} / {y_scale:g} = {scale:g} must be below 1 (QNNPACK refuses larger "
                            "ones); use a larger Y_scale")
    if scale < 2.0 ** -32:
        raise ArgumentError(f"{op_type}: the requantization scale X.scale * W.scale / Y_scale = {scale:g} is "
                            "below 2^-32, which QNNPACK cannot represent; use a smaller Y_scale")
    return scale


def requantize(xp, acc, scale: float, zero_point: int, lo: int, hi: int):
    """qnnp_q31_requantize over an array of int32 accumulators (given as int64): round(acc * scale) with the
    Q31 multiplier and a rounding shift (ties away from zero), clamped to [lo, hi], as uint8."""
    multiplier, shift = q31_multiplier(scale)
    acc = acc.astype(np.int64)
    q31 = (acc * multiplier + (1 << 30)) >> 31
    mask = (1 << shift) - 1
    remainder = (q31 & mask) - (acc < 0)
    out = (q31 >> shift) + (remainder > (mask >> 1))
    return (xp.clip(out, lo - zero_point, hi - zero_point) + zero_point).astype(np.uint8)


def wrap_int32(xp, acc):
    """int64 sums reduced to int32 the way an int32 accumulator wraps (kept as int64)."""
    return ((acc + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int64)


def activation_range(zero_point: int, relu: bool) -> tuple[int, int]:
    """Caffe2's activationLimits: [0, 255], or [zero_point, 255] with a fused ReLU (the code of 0.0)."""
    return (zero_point if relu else 0), U8_MAX


def add_multipliers(op_type: str, a_scale: float, b_scale: float, y_scale: float):
    """qnnp_compute_add_quantization_params: the integer multipliers of A and B and the shift, after QNNPACK's
    checks (each input-to-output scale ratio in [2^-14, 2^8))."""
    for what, s in (("A", a_scale), ("B", b_scale)):
        positive_scale(op_type, what, s)
    ratios = []
    for what, s in (("A", a_scale), ("B", b_scale)):
        ratio = np.float32(s) / np.float32(y_scale)
        if not 2.0 ** -14 <= ratio < 2.0 ** 8:
            raise ArgumentError(f"{op_type}: input {what}'s scale {s:g} over Y_scale {y_scale:g} is {float(ratio):g}; "
                                "QNNPACK's add needs every input-to-output scale ratio in [2^-14, 2^8)")
        ratios.append(ratio)
    exponent = (_f32_bits(max(ratios)) >> 23) - 127
    shift = 21 - exponent
    factor = np.float32(2.0 ** shift)
    a_mult, b_mult = (int(np.rint(np.float32(r * factor))) for r in ratios)
    return a_mult, b_mult, shift


def add_quantize(xp, a, b, a_zp, b_zp, multipliers, zero_point, lo, hi):
    """qnnp_add_quantize over arrays of uint8 codes."""
    a_mult, b_mult, shift = multipliers
    acc = a.astype(np.int64) * a_mult + b.astype(np.int64) * b_mult - (a_mult * a_zp + b_mult * b_zp)
    mask = (1 << shift) - 1
    remainder = (acc & mask) - (acc < 0)
    acc = (acc >> shift) + (remainder > (mask >> 1))
    return xp.clip(acc + zero_point, lo, hi).astype(np.uint8)


def avgpool_quantize(xp, acc, scale: float, zero_point: int, lo: int, hi: int):
    """qnnp_avgpool_quantize: round(acc * scale) for a float32 scale in [2^-32, 256) with a 24-bit multiplier
    and a 64-bit rounding shift (ties away from zero), clamped to [lo, hi], as uint8."""
    bits = _f32_bits(scale)
    multiplier, shift = (bits & 0x7FFFFF) | 0x800000, 150 - (bits >> 23)
    acc = acc.astype(np.int64)
    out = (acc * multiplier - (acc < 0) + (1 << (shift - 1))) >> shift
    return (xp.clip(out, lo - zero_point, hi - zero_point) + zero_point).astype(np.uint8)
