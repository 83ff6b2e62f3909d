"""Embedding-bag reductions over fused row-wise quantized tables: SparseLengths{Sum,WeightedSum,Mean}Fused
{8,4,2}BitRowwise (Caffe2's lengths_reducer_fused_8bit_rowwise_ops.cc and lengths_reducer_fused_nbit_rowwise
_ops.cc). DATA holds one fused row per embedding (the formats of fused_rowwise.py: 8-bit rows end with a
float32 scale and bias, 4/2-bit rows with float16 ones); the output is float32, one row per segment.

For the indices k of segment i (LENGTHS[i] consecutive entries of INDICES), as Caffe2's embedding lookups
compute it: out[i] = sum_k (w_k * scale_r) * code_r + (w_k * bias_r), r = INDICES[k], w_k = WEIGHTS[k] (1
without weights); the Mean ops divide a non-empty segment by its length. Indices must lie in [0, rows of
DATA) and the lengths must sum to the number of indices. Caffe2 registers these as NO_GRADIENT. The shared
checks (`sparse_checks`) serve rowwise8.py too.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import DTypeError, ShapeError
from .base import host_ints, known_ints, out_spec
from .fused_rowwise import dequantize_rows, fused_input, values_per_row
from .index import check_bounds, check_vector, read_lengths, require_int, spec_value
from .registry import NO_GRADIENT, op
from .segments import reduce_rows, segment_layout

F32, F16 = np.float32, np.float16


def sparse_checks(op_type, indices, lengths, weights, read) -> list[int] | None:
    """The checks every quantized embedding-bag op makes of INDICES, LENGTHS and WEIGHTS (arrays or specs);
    the lengths (None when a spec's values are unknown)."""
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    require_int(lengths, "LENGTHS")
    lens = read_lengths(lengths, "LENGTHS", read)
    count = math.prod(indices.shape)
    if lens is not None and sum(lens) != count:
        raise ShapeError(f"{op_type}: LENGTHS {tuple(lengths.shape)} sum to {sum(lens)} but there are {count} "
                         "INDICES; the lengths must sum to the number of indices")
    if weights is not None:
        check_vector(weights, "WEIGHTS")
        if weights.dtype is not None and np.dtype(weights.dtype) != F32:
            raise DTypeError(f"{op_type}: WEIGHTS must be float32, got {weights.dtype}")
        if weights.shape[0] != count:
            raise ShapeError(f"{op_type}: WEIGHTS has {weights.shape[0]} entries but INDICES has {count}; "
                             "there must be one weight per index")
    return lens


def check_table_bounds(xp, indices, rows: int, data_shape) -> None:
    """Every index names a row of DATA (a spec of unknown value passes)."""
    check_bounds(xp, indices, rows, "INDICES", f" for DATA of shape {tuple(data_shape)}")


def segment_sums(xp, values, lens, kind: str):
    """Per-segment sum (or mean of the non-empty ones) of the rows of `values`, one row per index, in order."""
    pos, mask = segment_layout(xp, lens)
    return reduce_rows(xp, values, pos, mask, kind, np.float32)


def _fused_geometry(op_type, bits, sb, data, weights, indices, lengths, read):
    """(the lengths or None, values per row) after every check but the index bounds."""
    fused_input(data, op_type)
    if len(data.shape) != 2:
        raise ShapeError(f"{op_type}: DATA must be a matrix of fused rows, got shape {tuple(data.shape)}")
    width = values_per_row(tuple(data.shape), bits, sb, op_type, least=1)
    return sparse_checks(op_type, indices, lengths, weights, read), width


def _fused_reducer(op_type, bits, sb, kind, weighted):
    def split(inputs):
        data, *rest = inputs
        weights = rest.pop(0) if weighted else None
        return data, weights, rest[0], rest[1]

    def kernel(xp, *inputs):
        data, weights, indices, lengths = split(inputs)
        lens, _ = _fused_geometry(op_type, bits, sb, data, weights, indices, lengths, host_ints)
        check_table_bounds(xp, indices, data.shape[0], data.shape)
        rows8 = xp.take(data, indices.reshape(-1), axis=0)
        values = dequantize_rows(xp, rows8, bits, sb, None if weights is None else weights.reshape(-1))
        return segment_sums(xp, values, lens, kind)

    def shape(specs):
        data, weights, indices, lengths = split(specs)
        _, width = _fused_geometry(op_type, bits, sb, data, weights, indices, lengths, known_ints)
        check_table_bounds(np, spec_value(indices), data.shape[0], data.shape)
        return [out_spec((lengths.shape[0], width), F32)]

    kernel.__name__ = kernel.__qualname__ = op_type
    what = {"sum": "sum", "mean": "mean (a non-empty segment divided by its length)"}[kind]
    ins = "DATA, WEIGHTS, INDICES, LENGTHS" if weighted else "DATA, INDICES, LENGTHS"
    op(op_type, inputs=4 if weighted else 3, outputs=1, inplace=(), gradient=NO_GRADIENT, shape=shape,
       doc=f"({ins}) -> float32 per-segment {'weighted ' if weighted else ''}{what} of the rows INDICES picks "
           f"from DATA, fused {bits}-bit rows with {np.dtype(sb).name} scale and bias.")(kernel)


for _bits, _sb in ((8, F32), (4, F16), (2, F16)):
    _fused_reducer(f"SparseLengthsSumFused{_bits}BitRowwise", _bits, _sb, "sum", False)
    _fused_reducer(f"SparseLengthsWeightedSumFused{_bits}BitRowwise", _bits, _sb, "sum", True)
    _fused_reducer(f"SparseLengthsMeanFused{_bits}BitRowwise", _bits, _sb, "mean", False)
