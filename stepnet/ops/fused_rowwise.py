"""Fused row-wise quantization: float or half rows to uint8 rows that carry their own scale and bias, and back
(Caffe2's fused_rowwise_8bit_conversion_ops.cc, fused_rowwise_nbit_conversion_ops.cc and the reference
kernels of caffe2/perfkernels/fused_nbit_rowwise_conversion.cc). The reducers that read these rows are in
fused_sls.py; the older format with a separate scale_bias tensor is in rowwise8.py.

The last dimension holds a row; every other dimension counts rows. A fused row is

    | codes: ceil(cols / (8 / bits)) bytes | scale | bias |

with the scale and bias as two float32 (8 bytes, the 8-bit format) or two float16 (4 bytes: the 4- and 2-bit
formats and the 8-bit "HalfScaleBias" one), little-endian. Below 8 bits, value k of a row sits in byte
k // (8 / bits) at bit (k % (8 / bits)) * bits. A value is scale * code + bias.

Quantizing, as Caffe2 does it (float32 arithmetic, round half to even like lrintf):
- float32 scale and bias: bias = min, scale = (max - min) / 255, code = rint((x - min) * 255 / (max - min + 1e-8)).
- float16 scale and bias: bias = half(min); scale = half((max - bias) / (2^bits - 1)), 1 when that is 0 (or
  its inverse overflows); code = rint((x - bias) / scale) clamped to [0, 2^bits - 1].
Caffe2 registers no gradient for any of these (NO_GRADIENT). Its GREEDY engine (a range search for the 4/2-bit
quantizers) is not implemented: engines select nothing here, so those nets get the min/max quantization.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .base import out_spec
from .registry import NO_GRADIENT, op

EPSILON = np.float32(1e-8)
ONE = np.float32(1.0)


def sb_bytes(sb_dtype) -> int:
    """Bytes of the scale and bias at the end of a fused row."""
    return 2 * np.dtype(sb_dtype).itemsize


def per_byte(bits: int) -> int:
    return 8 // bits


# --------------------------------------------------------------------------------------------- checks
def fused_input(x, op_type: str, what: str = "DATA") -> None:
    """A fused tensor: uint8, at least 1-D."""
    if x.dtype is not None and np.dtype(x.dtype) != np.uint8:
        raise DTypeError(f"{op_type}: {what} must be a uint8 tensor of fused rows, got {x.dtype} "
                         f"(shape {tuple(x.shape)})")
    if len(x.shape) < 1:
        raise ShapeError(f"{op_type}: {what} must be at least 1-D, got a 0-D tensor")


def values_per_row(shape, bits: int, sb_dtype, op_type: str, what: str = "DATA", least: int = 0) -> int:
    """The number of values a fused row of `shape[-1]` bytes holds; a ShapeError when the row is too short
    for its scale and bias (and at least `least` code bytes)."""
    cols, tail = shape[-1], sb_bytes(sb_dtype)
    if cols < tail + least:
        need = f"more than {tail}" if least else f"at least {tail}"
        raise ShapeError(f"{op_type}: {what} {tuple(shape)} has {cols} bytes per row, but a fused row ends with "
                         f"its {np.dtype(sb_dtype).name} scale and bias ({tail} bytes), so it needs {need}; "
                         "is this the right fused format (8-bit rows end with 8 bytes, 4/2-bit rows with 4)?")
    return (cols - tail) * per_byte(bits)


def _quantize_checks(x, op_type: str, in_dtype, bits: int) -> None:
    if x.dtype is not None and np.dtype(x.dtype) != np.dtype(in_dtype):
        raise DTypeError(f"{op_type}: the input must be {np.dtype(in_dtype).name}, got {x.dtype} "
                         f"(shape {tuple(x.shape)})")
    if len(x.shape) < 1:
        raise ShapeError(f"{op_type}: the input must be at least 1-D (rows of its last dimension), got 0-D")
    cols = x.shape[-1]
    if math.prod(x.shape[:-1]) and cols == 0:
        raise ShapeError(f"{op_type}: the input {tuple(x.shape)} has rows of no values; a row needs at least one "
                         "value to have a range")
    if cols % per_byte(bits):
        raise ShapeError(f"{op_type}: the input {tuple(x.shape)} has {cols} values per row; {bits}-bit rows pack "
                         f"{per_byte(bits)} values per byte, so the count must be a multiple of {per_byte(bits)}")


# --------------------------------------------------------------------------------------------- the formats
def quantize_rows(xp, x2, bits: int, sb_dtype):
    """Float32 rows (R x C) -> fused uint8 rows (R x (C / (8 / bits) + scale and bias bytes))."""
    rows, cols = x2.shape
    if rows == 0:
        return xp.zeros((0, cols // per_byte(bits) + sb_bytes(sb_dtype)), dtype=np.uint8)
    lo, hi = x2.min(axis=1), x2.max(axis=1)
    if np.dtype(sb_dtype) == np.float32:
        rng = hi - lo
        scale, bias = rng / np.float32(255), lo
        codes = xp.rint((x2 - lo[:, None]) * (np.float32(255) / (rng + EPSILON))[:, None])
    else:
        qmax = np.float32((1 << bits) - 1)
        bias = lo.astype(np.float16).astype(np.float32)
        rng = hi - bias
        scale = xp.where(rng == 0, ONE, (rng / qmax).astype(np.float16).astype(np.float32))
        scale = xp.where(scale == 0, ONE, scale)
        with np.errstate(divide="ignore", over="ignore"):
            inverse = ONE / scale
        bad = xp.isinf(inverse)
        scale, inverse = xp.where(bad, ONE, scale), xp.where(bad, ONE, inverse)
        codes = xp.clip(xp.rint((x2 - bias[:, None]) * inverse[:, None]), 0, qmax)
    codes = codes.astype(np.uint8)
    if bits < 8:
        pb = per_byte(bits)
        shifts = xp.asarray(np.arange(pb, dtype=np.uint8) * np.uint8(bits))
        codes = (codes.reshape(rows, cols // pb, pb) << shifts).sum(axis=2, dtype=np.uint8)
    sb = xp.ascontiguousarray(xp.stack([scale, bias], axis=1).astype(sb_dtype))
    return xp.concatenate([codes, sb.view(np.uint8)], axis=1)


def split_rows(xp, rows8, bits: int, sb_dtype):
    """Fused uint8 rows (R x B) -> (codes R x D as float32, scale R, bias R as float32)."""
    tail = sb_bytes(sb_dtype)
    nbytes = rows8.shape[1] - tail
    sb = xp.ascontiguousarray(rows8[:, nbytes:]).view(sb_dtype).astype(np.float32)
    codes = rows8[:, :nbytes]
    if bits < 8:
        pb = per_byte(bits)
        shifts = xp.asarray(np.arange(pb, dtype=np.uint8) * np.uint8(bits))
        codes = ((codes[:, :, None] >> shifts) & np.uint8((1 << bits) - 1)).reshape(rows8.shape[0], nbytes * pb)
    return codes.astype(np.float32), sb[:, 0], sb[:, 1]


def dequantize_rows(xp, rows8, bits: int, sb_dtype, weights=None):
    """Fused rows -> float32 values scale * code + bias; with `weights` (one per row) the scale and bias are
    scaled first, as Caffe2's embedding lookups do."""
    codes, scale, bias = split_rows(xp, rows8, bits, sb_dtype)
    if weights is not None:
        w = weights.astype(np.float32)
        scale, bias = scale * w, bias * w
    return codes * scale[:, None] + bias[:, None]


# --------------------------------------------------------------------------------------------- the ops
def _quantizer(op_type, in_dtype, bits, sb_dtype):
    def geometry(x):
        _quantize_checks(x, op_type, in_dtype, bits)
        return tuple(x.shape[:-1]) + (x.shape[-1] // per_byte(bits) + sb_bytes(sb_dtype),)

    def kernel(xp, x):
        out_shape = geometry(x)
        x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]).astype(np.float32)
        return quantize_rows(xp, x2, bits, sb_dtype).reshape(out_shape)

    kernel.__name__ = kernel.__qualname__ = op_type
    sb = "float32" if np.dtype(sb_dtype) == np.float32 else "float16"
    op(op_type, inputs=1, outputs=1, gradient=NO_GRADIENT, shape=lambda s: [out_spec(geometry(s[0]), np.uint8)],
       doc=f"{np.dtype(in_dtype).name} rows (the last dimension) -> fused {bits}-bit rows: the codes, then a "
           f"{sb} scale and bias (see the module docstring for the rounding).")(kernel)


def _dequantizer(op_type, bits, sb_dtype, out_dtype, note=""):
    def geometry(x):
        fused_input(x, op_type)
        return tuple(x.shape[:-1]) + (values_per_row(tuple(x.shape), bits, sb_dtype, op_type),)

    def kernel(xp, x):
        out_shape = geometry(x)
        rows8 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
        with np.errstate(over="ignore"):
            return dequantize_rows(xp, rows8, bits, sb_dtype).astype(out_dtype).reshape(out_shape)

    kernel.__name__ = kernel.__qualname__ = op_type
    sb = "float32" if np.dtype(sb_dtype) == np.float32 else "float16"
    op(op_type, inputs=1, outputs=1, gradient=NO_GRADIENT, shape=lambda s: [out_spec(geometry(s[0]), out_dtype)],
       doc=f"Fused {bits}-bit rows ({sb} scale and bias) -> {np.dtype(out_dtype).name} values scale * code + "
           f"bias.{note}")(kernel)


F32, F16 = np.float32, np.float16
for _type, _in, _bits, _sb in (("FloatToFused8BitRowwiseQuantized", F32, 8, F32),
                               ("HalfFloatToFused8BitRowwiseQuantized", F16, 8, F32),
                               ("FloatToFused8BitRowwiseQuantizedHalfScaleBias", F32, 8, F16),
                               ("HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias", F16, 8, F16),
                               ("FloatToFused4BitRowwiseQuantized", F32, 4, F16),
                               ("HalfToFused4BitRowwiseQuantized", F16, 4, F16),
                               ("FloatToFused2BitRowwiseQuantized", F32, 2, F16),
                               ("HalfToFused2BitRowwiseQuantized", F16, 2, F16)):
    _quantizer(_type, _in, _bits, _sb)

for _type, _bits, _sb, _out in (("Fused8BitRowwiseQuantizedToFloat", 8, F32, F32),
                                ("Fused8BitRowwiseQuantizedToHalfFloat", 8, F32, F16),
                                ("Fused8BitRowwiseQuantizedHalfScaleBiasToFloat", 8, F16, F32),
                                ("Fused4BitRowwiseQuantizedToFloat", 4, F16, F32),
                                ("Fused4BitRowwiseQuantizedToHalf", 4, F16, F16),
                                ("Fused2BitRowwiseQuantizedToFloat", 2, F16, F32),
                                ("Fused2BitRowwiseQuantizedToHalf", 2, F16, F16)):
    _dequantizer(_type, _bits, _sb, _out)
# Caffe2 registers this one with the float32 kernel and schema of ...HalfScaleBiasToFloat: its output is float32.
_dequantizer("Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat", 8, F16, F32,
             " Despite the name the output is float32, as Caffe2 registers it.")
