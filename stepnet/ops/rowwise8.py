"""The older 8-bit row-wise quantization, with the scales and biases in a tensor of their own (Caffe2's
lengths_reducer_rowwise_8bit_ops.h/.cc): FloatToRowwiseQuantized8Bits, Rowwise8BitQuantizedToFloat and the
embedding bags SparseLengths{Sum,WeightedSum,Mean,WeightedMean}8BitsRowwise. The fused formats are in
fused_rowwise.py and fused_sls.py.

A tensor of shape (m_1, ..., m_n) is read as m_1 rows of m_2 x ... x m_n values. Quantizing a row: with
min and max its extremes, when max - min < 1e-10 the scale is 1, the bias min and every code 0; otherwise
scale = (max - min) / 255, bias = min and code = round((x - bias) * (1 / scale)) (half away from zero, as
Eigen's round). scale_bias is an m_1 x 2 float32 matrix of (scale, bias) rows; a value is code * scale + bias.
The embedding bags compute, for the indices k of segment i, sum_k (w_k * scale_r) * code_r + w_k * bias_r with
r = INDICES[k] (w_k = 1 without weights), divided by the segment's length for the Mean ops (a non-empty one).
Caffe2 registers every op here as NO_GRADIENT.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .base import host_ints, known_ints, out_spec
from .fused_sls import check_table_bounds, segment_sums, sparse_checks
from .index import spec_value
from .registry import NO_GRADIENT, op

F32 = np.float32
THRESHOLD = 1e-10


# --------------------------------------------------------------------------------------------- conversions
def _rows_of(x, op_type: str, what: str) -> tuple[int, int]:
    if len(x.shape) < 1:
        raise ShapeError(f"{op_type}: {what} must be at least 1-D (its first dimension counts rows), got 0-D")
    return x.shape[0], math.prod(x.shape[1:])


def _quantize_shape(specs):
    x = specs[0]
    if x.dtype is not None and np.dtype(x.dtype) != F32:
        raise DTypeError(f"FloatToRowwiseQuantized8Bits: the input must be float32, got {x.dtype}")
    rows, _ = _rows_of(x, "FloatToRowwiseQuantized8Bits", "the input")
    return [out_spec(x.shape, np.uint8), out_spec((rows, 2), F32)]


@op("FloatToRowwiseQuantized8Bits", inputs=1, outputs=2, inplace=(), gradient=NO_GRADIENT, shape=_quantize_shape)
def float_to_rowwise_quantized_8bits(xp, x):
    """float32 rows (the first dimension) -> (uint8 codes shaped like the input, m_1 x 2 float32 scale_bias)."""
    _quantize_shape([x])
    rows, cols = _rows_of(x, "FloatToRowwiseQuantized8Bits", "the input")
    x2 = x.reshape(rows, cols)
    if rows == 0 or cols == 0:
        return xp.zeros(x.shape, dtype=np.uint8), xp.zeros((rows, 2), dtype=F32)
    lo, hi = x2.min(axis=1), x2.max(axis=1)
    flat = (hi - lo) < THRESHOLD
    scale = xp.where(flat, F32(1), (hi - lo) / F32(255))
    inverse = F32(1) / scale
    v = (x2 - lo[:, None]) * inverse[:, None]
    whole = xp.trunc(v)
    codes = whole + (v - whole >= F32(0.5))                   # round half away from zero (v >= 0)
    codes = xp.where(flat[:, None], F32(0), codes).astype(np.uint8)
    return codes.reshape(x.shape), xp.stack([scale, lo], axis=1)


def scale_bias_checks(op_type, data, scale_bias) -> None:
    if scale_bias.dtype is not None and np.dtype(scale_bias.dtype) != F32:
        raise DTypeError(f"{op_type}: scale_bias must be float32, got {scale_bias.dtype}")
    if len(scale_bias.shape) != 2 or scale_bias.shape[1] != 2 or scale_bias.shape[0] != data.shape[0]:
        raise ShapeError(f"{op_type}: scale_bias must be a matrix of one (scale, bias) row per row of DATA, "
                         f"i.e. ({data.shape[0]}, 2), got {tuple(scale_bias.shape)}")


def _codes(op_type, data) -> None:
    if data.dtype is not None and np.dtype(data.dtype) != np.uint8:
        raise DTypeError(f"{op_type}: DATA must be uint8 codes, got {data.dtype} (shape {tuple(data.shape)})")
    _rows_of(data, op_type, "DATA")


def _dequantize_shape(specs):
    data, scale_bias = specs
    _codes("Rowwise8BitQuantizedToFloat", data)
    scale_bias_checks("Rowwise8BitQuantizedToFloat", data, scale_bias)
    return [out_spec(data.shape, F32)]


@op("Rowwise8BitQuantizedToFloat", inputs=2, outputs=1, inplace=(), gradient=NO_GRADIENT, shape=_dequantize_shape)
def rowwise_8bit_quantized_to_float(xp, data, scale_bias):
    """(uint8 codes, m_1 x 2 scale_bias) -> float32 code * scale + bias, row by row, shaped like the codes."""
    _dequantize_shape([data, scale_bias])
    rows, cols = _rows_of(data, "Rowwise8BitQuantizedToFloat", "DATA")
    out = data.reshape(rows, cols).astype(F32) * scale_bias[:, :1] + scale_bias[:, 1:]
    return out.reshape(data.shape)


# --------------------------------------------------------------------------------------------- embedding bags
def _reducer(op_type, kind, weighted):
    def split(inputs):
        data, *rest = inputs
        weights = rest.pop(0) if weighted else None
        return data, weights, rest[0], rest[1], rest[2]

    def checks(data, weights, indices, lengths, scale_bias, read):
        _codes(op_type, data)
        scale_bias_checks(op_type, data, scale_bias)
        return sparse_checks(op_type, indices, lengths, weights, read)

    def kernel(xp, *inputs):
        data, weights, indices, lengths, scale_bias = split(inputs)
        lens = checks(data, weights, indices, lengths, scale_bias, host_ints)
        check_table_bounds(xp, indices, data.shape[0], data.shape)
        idx = indices.reshape(-1)
        codes = xp.take(data.reshape(data.shape[0], math.prod(data.shape[1:])), idx, axis=0).astype(F32)
        sb = xp.take(scale_bias, idx, axis=0)
        scale, bias = sb[:, 0], sb[:, 1]
        if weights is not None:
            scale, bias = scale * weights, bias * weights
        out = segment_sums(xp, codes * scale[:, None] + bias[:, None], lens, kind)
        return out.reshape((len(lens),) + tuple(data.shape[1:]))

    def shape(specs):
        data, weights, indices, lengths, scale_bias = split(specs)
        checks(data, weights, indices, lengths, scale_bias, known_ints)
        check_table_bounds(np, spec_value(indices), data.shape[0], data.shape)
        return [out_spec((lengths.shape[0],) + tuple(data.shape[1:]), F32)]

    kernel.__name__ = kernel.__qualname__ = op_type
    ins = "DATA, SCALARS, INDICES, LENGTHS, scale_bias" if weighted else "DATA, INDICES, LENGTHS, scale_bias"
    what = "sum" if kind == "sum" else "mean (a non-empty segment divided by its length)"
    op(op_type, inputs=5 if weighted else 4, outputs=1, inplace=(), gradient=NO_GRADIENT, shape=shape,
       doc=f"({ins}) -> float32 per-segment {'weighted ' if weighted else ''}{what} of the DATA rows INDICES "
           "picks, each dequantized with its scale_bias row.")(kernel)


for _type, _kind, _weighted in (("SparseLengthsSum8BitsRowwise", "sum", False),
                                ("SparseLengthsWeightedSum8BitsRowwise", "sum", True),
                                ("SparseLengthsMean8BitsRowwise", "mean", False),
                                ("SparseLengthsWeightedMean8BitsRowwise", "mean", True)):
    _reducer(_type, _kind, _weighted)
