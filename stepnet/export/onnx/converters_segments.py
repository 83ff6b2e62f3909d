"""Converters of the segment reductions (embedding bags): Lengths{Sum,Mean,Max} and SparseLengths{Sum,Mean,
WeightedSum}. ONNX has no segment op; the segments are a mask built from the lengths at run time (row i of
segment n when ends[n] - lengths[n] <= i < ends[n], ends = CumSum(lengths)), so a sum is one MatMul of the mask
with the rows and a max one masked ReduceMax. Empty segments give 0, as the kernels do.
"""
from __future__ import annotations

import math

import numpy as np

from .table import converts


def _segment_mask(c, lengths: str, total: int) -> tuple[str, str]:
    """(N x total bool mask of each segment's rows, int64 lengths)."""
    lens = c.e.cast(c.e.reshape(lengths, [-1]), np.int64)
    ends = c.e.node("CumSum", [lens, c.e.scalar(0, np.int64)])
    starts = c.e.node("Sub", [ends, lens])
    pos = c.e.const(np.arange(total, dtype=np.int64).reshape(1, total))
    after = c.e.node("GreaterOrEqual", [pos, c.e.unsqueeze(starts, [1])])
    before = c.e.node("Less", [pos, c.e.unsqueeze(ends, [1])])
    return c.e.node("And", [after, before]), lens


def _reduce_segments(c, rows: str, total: int, block: tuple, lengths: str, kind: str, dtype) -> None:
    """Output 0 = each segment of `rows` (total x prod(block)) reduced, shaped (N,) + block."""
    mask, lens = _segment_mask(c, lengths, total)
    n = c.shape(len(c.inputs) - 1)[0]
    if kind == "max":
        picked = c.e.node("Where", [c.e.unsqueeze(mask, [2]), c.e.unsqueeze(rows, [0]),
                                    c.e.scalar(-np.inf, dtype)])
        out = c.e.reduce("ReduceMax", picked, [1], False)
        some = c.e.unsqueeze(c.e.node("Greater", [lens, c.e.scalar(0, np.int64)]), [1])
        out = c.e.node("Where", [some, out, c.e.scalar(0, dtype)])
    else:
        out = c.e.node("MatMul", [c.e.cast(mask, dtype), rows])
        if kind == "mean":
            count = c.e.node("Max", [c.e.cast(lens, dtype), c.e.scalar(1, dtype)])
            out = c.e.node("Div", [out, c.e.unsqueeze(count, [1])])
    c.e.reshape(out, (n,) + tuple(block), out=[c.out(0)])


def _rows(c, j: int, dtype) -> tuple[str, int, tuple]:
    shape = c.shape(j)
    rows = c.e.reshape(c.x(j), [shape[0], math.prod(shape[1:])])
    return (rows if c.dtype(j) == dtype else c.e.cast(rows, dtype)), shape[0], tuple(shape[1:])


@converts("LengthsSum", "LengthsMean", "LengthsMax")
def lengths_reduce(c):
    dtype = c.dtype(0)
    rows, total, block = _rows(c, 0, dtype)
    _reduce_segments(c, rows, total, block, c.x(1), c.op.type[len("Lengths"):].lower(), dtype)


@converts("SparseLengthsSum", "SparseLengthsMean", "SparseLengthsWeightedSum")
def sparse_lengths_reduce(c):
    """DATA[INDICES] reduced per segment (half data reduces to float, as the kernels do)."""
    dtype = np.dtype(np.float32) if c.dtype(0) == np.float16 else c.dtype(0)
    weighted = c.op.type == "SparseLengthsWeightedSum"
    data, _, block = _rows(c, 0, dtype)
    indices = c.e.reshape(c.x(2 if weighted else 1), [-1])
    total = math.prod(c.shape(2 if weighted else 1))
    rows = c.e.node("Gather", [data, indices], axis=0)
    if weighted:
        w = c.e.reshape(c.x(1) if c.dtype(1) == dtype else c.e.cast(c.x(1), dtype), [total, 1])
        rows = c.e.node("Mul", [rows, w])
    kind = "mean" if c.op.type == "SparseLengthsMean" else "sum"
    _reduce_segments(c, rows, total, block, c.x(len(c.inputs) - 1), kind, dtype)
