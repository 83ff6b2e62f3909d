"""RowMul (row i of a matrix times element i of a vector) and ReduceTailSum (the sum of each row), the pair
Caffe2 wrote before Mul's broadcast had a gradient.

Semantics from caffe2/operators/rowmul_op.{h,cc} (registered there for float32; here for any float type, one
for all inputs): "row" is everything after the first dim. RowMul's gradient is three ops, as Caffe2's maker
emits them: RowMul(dY, w) -> dMAT, Mul(dY, MAT) -> d<w>before_aggregate, ReduceTailSum of that -> dw (a vector
of MAT's first dim). ReduceTailSum has no gradient registered.
"""
from __future__ import annotations

import math

from ..core.errors import ShapeError
from .base import GradientContext, check_float, like, not_in_place, out_spec, size_of
from .registry import op


def _rows(mat, op_type: str) -> tuple[int, int]:
    """(N, the size of a row) of a float tensor of at least 1 dim."""
    check_float(op_type, mat=mat)
    if len(mat.shape) < 1:
        raise ShapeError(f"{op_type}: mat must have at least 1 dim (rows), got a 0-D tensor")
    return int(mat.shape[0]), math.prod(mat.shape[1:])


def _row_mul_checks(mat, w) -> int:
    check_float("RowMul", mat=mat, w=w)
    n, _ = _rows(mat, "RowMul")
    if size_of(w) != n:
        raise ShapeError(f"RowMul: w has {size_of(w)} elements {tuple(w.shape)} but mat {tuple(mat.shape)} has "
                         f"{n} rows; give one value per row")
    return n


def _row_mul_shape(specs):
    _row_mul_checks(*specs)
    return [like(specs[0])]


def _row_mul_gradient(g: GradientContext) -> None:
    not_in_place(g, (0, 1))
    g.op("RowMul", [g.GO(0), g.I(1)], [g.GI(0)], copy_args=False)
    before = g.GI(1) + "before_aggregate"
    g.op("Mul", [g.GO(0), g.I(0)], [before], copy_args=False)
    g.op("ReduceTailSum", [before], [g.GI(1)], copy_args=False)


@op("RowMul", inputs=2, outputs=1, inplace=(), shape=_row_mul_shape, shapes_from_inputs=True,
    gradient=_row_mul_gradient)
def row_mul(xp, mat, w):
    """OUT[i, ...] = MAT[i, ...] * w[i]: MAT (N x ...) float, w with N elements (any shape)."""
    n = _row_mul_checks(mat, w)
    return mat * w.reshape((n,) + (1,) * (mat.ndim - 1))


def _tail_sum_shape(specs):
    n, _ = _rows(specs[0], "ReduceTailSum")
    return [out_spec((n,), specs[0].dtype)]


@op("ReduceTailSum", inputs=1, outputs=1, inplace=(), shape=_tail_sum_shape, shapes_from_inputs=True)
def reduce_tail_sum(xp, mat):
    """OUT[i] = the sum of MAT[i, ...]: MAT (N x ...) float -> a vector of N."""
    n, d = _rows(mat, "ReduceTailSum")
    if d == 0:
        return xp.zeros((n,), dtype=mat.dtype)
    return mat.reshape(n, d).sum(axis=1).astype(mat.dtype)
