"""Sparse optimizer updates and scatter ops: SparseMomentumSGDUpdate, SparseAdagrad, RowWiseSparseAdagrad,
SparseAdam, RowWiseSparseAdam, ScatterWeightedSum, ScatterAssign.

A sparse gradient is (indices, values): value row i belongs to parameter row indices[i] (rows are the
parameter's first dimension; values hold len(indices) rows of the parameter's row size, whatever their
shape). Caffe2 applies the rows one after the other, in place, so a repeated index sees the state its
earlier occurrences left: the k-th update of a row reads the moment written by the (k−1)-th. stepnet keeps
exactly that order, vectorised by "rounds" (round k updates every row's k-th occurrence at once). Caffe2
requires the parameter and its moments to be updated in place (EnforceInplace); so does stepnet. Sign
conventions as in optim.py. None of these ops is differentiable (SHOULD_NOT_DO_GRADIENT).
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from .base import check_float, like, size_of
from .lr import iteration_value
from .optim import (
    ADAM_ARGS, MOMENTUM_ARGS, adagrad_step, adam_correction, adam_step, arrays, check_like, check_scalar, const,
    momentum_step, scalar)
from .registry import SHOULD_NOT_DO_GRADIENT, op

# --------------------------------------------------------------------------------------------- rows


def _check_indices(op_type: str, indices) -> None:
    if indices.dtype is not None and indices.dtype not in (np.int32, np.int64):
        raise DTypeError(f"{op_type}: indices must be int32 or int64, got {indices.dtype}")


def check_rows(op_type: str, table, indices, values, table_name="param", values_name="grad") -> int:
    """Checks of a (table, indices, values) triple; returns the row size of the table."""
    _check_indices(op_type, indices)
    if len(table.shape) == 0:
        raise ShapeError(f"{op_type}: {table_name} must have at least one dimension (its rows), got a scalar")
    block = int(np.prod(table.shape[1:], dtype=np.int64))
    if size_of(values) != size_of(indices) * block:
        raise ShapeError(f"{op_type}: {values_name} {tuple(values.shape)} must hold len(indices) = "
                         f"{size_of(indices)} rows of {table_name}'s row size {block} "
                         f"({table_name} is {tuple(table.shape)})")
    return block


def host_indices(op_type: str, indices, n_rows: int) -> np.ndarray:
    """The indices as a flat host int64 array, bounds-checked against the table's row count."""
    idx = np.asarray(backend.to_host(indices)).reshape(-1).astype(np.int64)
    bad = (idx < 0) | (idx >= n_rows)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ShapeError(f"{op_type}: indices[{i}] = {int(idx[i])} is out of bounds for a table of {n_rows} "
                         f"rows (valid: 0..{n_rows - 1})")
    return idx


def rounds(idx: np.ndarray) -> list[np.ndarray]:
    """Positions into idx grouped so that round k holds every row's k-th occurrence (distinct rows within a
    round, positions increasing): applying the rounds in order equals applying idx sequentially."""
    n = idx.size
    if n == 0:
        return []
    order = np.argsort(idx, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(idx[order]) != 0])
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    return [np.flatnonzero(rank == k) for k in range(int(rank.max()) + 1)]


def apply_rows(xp, idx: np.ndarray, tables: list, step, per_position=None) -> None:
    """Sequential row updates: for each round, rows = tables[j][idx[pos]] are replaced by step(pos, rows),
    which returns (new rows per table, values per position or None, stored in per_position[pos]). The tables
    (2-D, one row per index) are fresh copies and are updated in place."""
    for pos in rounds(idx):
        rows, p = xp.asarray(idx[pos]), xp.asarray(pos)
        new_rows, extra = step(p, [t[rows] for t in tables])
        for t, r in zip(tables, new_rows, strict=True):
            t[rows] = r
        if per_position is not None:
            per_position[p] = extra


def same_dtype(op_type: str, ref, **named) -> None:
    for name, x in named.items():
        if x.dtype is not None and ref.dtype is not None and x.dtype != ref.dtype:
            raise DTypeError(f"{op_type}: {name} is {x.dtype} but the table is {ref.dtype}; use one type")


def rows_of(x, n_rows: int):
    """x viewed as n_rows rows (a 2-D view; sizes were checked)."""
    return x.reshape(n_rows, size_of(x) // n_rows if n_rows else 0)


def as_rows(x, n_rows: int):
    """A fresh 2-D copy of x, one row per first-dimension entry (a table the op updates)."""
    return rows_of(x, n_rows).copy()


# --------------------------------------------------------------------------------------------- momentum
def _check_sparse_momentum(grad, moment, lr, param, indices) -> None:
    t = "SparseMomentumSGDUpdate"
    check_float(t, param=param)
    check_like(t, "param", param, moment=moment)
    same_dtype(t, param, grad=grad)
    check_scalar(t, "lr", lr)
    check_rows(t, param, indices, grad)


def _sparse_momentum_shape(specs, **_):
    _check_sparse_momentum(*specs)
    return [like(specs[0]), like(specs[1]), like(specs[3])]


@op("SparseMomentumSGDUpdate", inputs=5, outputs=3, inplace=[(0, 0)], enforce_inplace=[(1, 1), (3, 2)],
    args=MOMENTUM_ARGS, gradient=SHOULD_NOT_DO_GRADIENT, shape=_sparse_momentum_shape)
def sparse_momentum_sgd_update(xp, grad, moment, lr, param, indices, *, momentum, nesterov):
    """MomentumSGDUpdate on the rows named by indices: (grad values, moment, lr, param, indices) ->
    (adjusted grad values, moment, param). Repeated indices update the row once per occurrence, in order."""
    _check_sparse_momentum(grad, moment, lr, param, indices)
    n = param.shape[0]
    idx = host_indices("SparseMomentumSGDUpdate", indices, n)
    w, m = as_rows(param, n), as_rows(moment, n)
    g = rows_of(grad, idx.size)
    g_out = xp.zeros_like(g)
    rate = scalar(xp, lr, param.dtype)

    def step(p, rows):
        adjusted, m_new = momentum_step(xp, g[p], rows[1], rate, momentum, nesterov)
        return (rows[0] - adjusted, m_new), adjusted

    apply_rows(xp, idx, [w, m], step, g_out)
    return arrays(xp, g_out.reshape(grad.shape), m.reshape(moment.shape), w.reshape(param.shape))


# --------------------------------------------------------------------------------------------- Adagrad
def _check_sparse_adagrad(op_type, param, moment, indices, grad, lr, rowwise=False) -> None:
    check_float(op_type, param=param)
    same_dtype(op_type, param, moment=moment, grad=grad)
    if rowwise:
        if len(param.shape) and size_of(moment) != param.shape[0]:
            raise ShapeError(f"{op_type}: moment {tuple(moment.shape)} must hold one value per row of param "
                             f"{tuple(param.shape)}, i.e. {param.shape[0]} elements")
    else:
        check_like(op_type, "param", param, moment=moment)
    check_scalar(op_type, "lr", lr)
    check_rows(op_type, param, indices, grad)


def _sparse_adagrad_shape(op_type, rowwise):
    def shape(specs, **_):
        _check_sparse_adagrad(op_type, *specs, rowwise=rowwise)
        return [like(specs[0]), like(specs[1])]
    return shape


def _sparse_adagrad(xp, op_type, param, moment, indices, grad, lr, epsilon, weight_decay, rowwise):
    _check_sparse_adagrad(op_type, param, moment, indices, grad, lr, rowwise)
    n = param.shape[0]
    idx = host_indices(op_type, indices, n)
    w, h = as_rows(param, n), as_rows(moment, n)
    g = rows_of(grad, idx.size)
    rate, dt = scalar(xp, lr, param.dtype), param.dtype

    def step(p, rows):
        if not rowwise:
            w_new, h_new, _, _ = adagrad_step(xp, rows[0], g[p], rows[1], rate, epsilon, 1.0, weight_decay)
            return (w_new, h_new), None
        gp = g[p] + const(dt, weight_decay) * rows[0] if weight_decay else g[p]
        h_new = rows[1] + xp.mean(gp * gp, axis=1, keepdims=True, dtype=dt)
        return (rows[0] + gp * (rate / (xp.sqrt(h_new) + const(dt, epsilon))), h_new), None

    apply_rows(xp, idx, [w, h], step)
    return arrays(xp, w.reshape(param.shape), h.reshape(moment.shape))


SPARSE_ADAGRAD_ARGS = {"epsilon": 1e-5, "weight_decay": 0.0}


@op("SparseAdagrad", inputs=5, outputs=2, inplace=(), enforce_inplace=[(0, 0), (1, 1)],
    gradient=SHOULD_NOT_DO_GRADIENT, args={**SPARSE_ADAGRAD_ARGS, "decay": 1.0},
    shape=_sparse_adagrad_shape("SparseAdagrad", False))
def sparse_adagrad(xp, param, moment, indices, grad, lr, *, epsilon, weight_decay, decay):
    """Adagrad on the rows named by indices: (param, moment, indices, grad values, lr) -> (param, moment).
    Caffe2's sparse form has no decay (it must stay 1.0)."""
    if decay != 1.0:
        raise ArgumentError(f"SparseAdagrad does not support decay (got {decay}); leave it at 1.0")
    return _sparse_adagrad(xp, "SparseAdagrad", param, moment, indices, grad, lr, epsilon, weight_decay,
                           False)


@op("RowWiseSparseAdagrad", inputs=5, outputs=2, inplace=(), enforce_inplace=[(0, 0), (1, 1)],
    gradient=SHOULD_NOT_DO_GRADIENT, args=SPARSE_ADAGRAD_ARGS,
    shape=_sparse_adagrad_shape("RowWiseSparseAdagrad", True))
def row_wise_sparse_adagrad(xp, param, moment, indices, grad, lr, *, epsilon, weight_decay):
    """Adagrad with one moment per parameter row (moment has param.shape[0] elements): moment[r] += mean of
    the row's g², then the row gets lr·g/(√moment[r] + ε)."""
    return _sparse_adagrad(xp, "RowWiseSparseAdagrad", param, moment, indices, grad, lr, epsilon,
                           weight_decay, True)


# --------------------------------------------------------------------------------------------- Adam
def _check_sparse_adam(op_type, param, m1, m2, indices, grad, lr, iteration, rowwise=False) -> None:
    check_float(op_type, param=param)
    same_dtype(op_type, param, moment_1=m1, moment_2=m2, grad=grad)
    check_like(op_type, "param", param, moment_1=m1)
    if rowwise:
        if len(param.shape) and size_of(m2) != param.shape[0]:
            raise ShapeError(f"{op_type}: moment_2 {tuple(m2.shape)} must hold one value per row of param "
                             f"{tuple(param.shape)}, i.e. {param.shape[0]} elements")
    else:
        check_like(op_type, "param", param, moment_2=m2)
    check_scalar(op_type, "lr", lr)
    iteration_value(iteration, op_type, static=True)
    check_rows(op_type, param, indices, grad)


def _sparse_adam_shape(op_type, rowwise):
    def shape(specs, **_):
        _check_sparse_adam(op_type, *specs, rowwise=rowwise)
        return [like(specs[0]), like(specs[1]), like(specs[2]), like(specs[4])]
    return shape


def _sparse_adam(xp, op_type, param, m1, m2, indices, grad, lr, iteration, beta1, beta2, epsilon, rowwise):
    _check_sparse_adam(op_type, param, m1, m2, indices, grad, lr, iteration, rowwise)
    corr = adam_correction(beta1, beta2, iteration_value(iteration, op_type))
    n = param.shape[0]
    idx = host_indices(op_type, indices, n)
    w, a, b = as_rows(param, n), as_rows(m1, n), as_rows(m2, n)
    g = rows_of(grad, idx.size)
    eff = xp.zeros_like(g)
    rate, dt = scalar(xp, lr, param.dtype), param.dtype

    def step(p, rows):
        if not rowwise:
            w_new, a_new, b_new, eg = adam_step(xp, rows[0], g[p], rows[1], rows[2], rate, corr, beta1, beta2,
                                                epsilon)
            return (w_new, a_new, b_new), eg
        b1, b2, one = const(dt, beta1), const(dt, beta2), const(dt, 1)
        gp = g[p]
        b_new = rows[2] * b2 + xp.mean(gp * gp, axis=1, keepdims=True, dtype=dt) * (one - b2)
        a_new = rows[1] * b1 + gp * (one - b1)
        eg = const(dt, corr) * a_new / (xp.sqrt(b_new) + const(dt, epsilon))
        return (rows[0] + rate * eg, a_new, b_new), eg

    apply_rows(xp, idx, [w, a, b], step, eff)
    return arrays(xp, w.reshape(param.shape), a.reshape(m1.shape), b.reshape(m2.shape),
                  eff.reshape(grad.shape))


@op("SparseAdam", inputs=7, outputs=(3, 4), inplace=(), enforce_inplace=[(0, 0), (1, 1), (2, 2)],
    host_inputs=[6], args=ADAM_ARGS, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_sparse_adam_shape("SparseAdam", False))
def sparse_adam(xp, param, m1, m2, indices, grad, lr, iteration, *, beta1, beta2, epsilon):
    """Adam on the rows named by indices: (param, m1, m2, indices, grad values, lr, iter) -> (param, m1, m2
    [, effective grad values])."""
    return _sparse_adam(xp, "SparseAdam", param, m1, m2, indices, grad, lr, iteration, beta1, beta2, epsilon,
                        False)


@op("RowWiseSparseAdam", inputs=7, outputs=(3, 4), inplace=(), enforce_inplace=[(0, 0), (1, 1), (2, 2)],
    host_inputs=[6], args=ADAM_ARGS, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_sparse_adam_shape("RowWiseSparseAdam", True))
def row_wise_sparse_adam(xp, param, m1, m2, indices, grad, lr, iteration, *, beta1, beta2, epsilon):
    """SparseAdam with one second moment per parameter row (moment_2 has param.shape[0] elements), updated
    with the mean of the row's g²."""
    return _sparse_adam(xp, "RowWiseSparseAdam", param, m1, m2, indices, grad, lr, iteration, beta1, beta2,
                        epsilon, True)


# --------------------------------------------------------------------------------------------- scatter ops
def _check_scatter_weighted_sum(inputs) -> None:
    t = "ScatterWeightedSum"
    if len(inputs) % 2 == 0:
        raise ArityError(f"{t} takes X0, w0, INDICES, then pairs (X1, w1), ...: an odd number of inputs, got "
                         f"{len(inputs)}")
    x0, w0, indices = inputs[:3]
    check_float(t, X0=x0)
    check_scalar(t, "weight_0", w0)
    for k in range(3, len(inputs), 2):
        j = (k - 1) // 2
        check_rows(t, x0, indices, inputs[k], "X0", f"X_{j}")
        same_dtype(t, x0, **{f"X_{j}": inputs[k]})
        check_scalar(t, f"weight_{j}", inputs[k + 1])
    if len(inputs) == 3:
        _check_indices(t, indices)


def _scatter_weighted_sum_shape(specs):
    _check_scatter_weighted_sum(specs)
    return [like(specs[0])]


@op("ScatterWeightedSum", inputs=(5, None), inplace=(), enforce_inplace=[(0, 0)],
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_scatter_weighted_sum_shape)
def scatter_weighted_sum(xp, x0, w0, indices, *pairs):
    """X0[idx] = w0·X0[idx] + Σ_i w_i·X_i[k] for k-th index idx (sparse SGD: X0 = param, w0 = 1,
    X1 = grad values, w1 = lr). As in Caffe2, every indexed row is first scaled by w0 once per occurrence,
    then every update is added, so a repeated index is scaled w0^count times and gets all its updates."""
    inputs = (x0, w0, indices, *pairs)
    _check_scatter_weighted_sum(inputs)
    n = x0.shape[0]
    idx = host_indices("ScatterWeightedSum", indices, n)
    out, dt = as_rows(x0, n), x0.dtype
    scale = scalar(xp, w0, dt)
    apply_rows(xp, idx, [out], lambda p, rows: ((rows[0] * scale,), None))
    for k in range(0, len(pairs), 2):
        values, weight = rows_of(pairs[k], idx.size), scalar(xp, pairs[k + 1], dt)
        apply_rows(xp, idx, [out], lambda p, rows, v=values, w=weight: ((rows[0] + w * v[p],), None))
    return xp.asarray(out.reshape(x0.shape))


def _check_scatter_assign(data, indices, slices) -> None:
    t = "ScatterAssign"
    if data.dtype is not None and data.dtype.name not in ("float16", "float32", "float64", "int32", "int64"):
        raise DTypeError(f"{t}: DATA must be float16, float32, int32 or int64, got {data.dtype}")
    same_dtype(t, data, SLICES=slices)
    check_rows(t, data, indices, slices, "DATA", "SLICES")


def _scatter_assign_shape(specs):
    _check_scatter_assign(*specs)
    return [like(specs[0])]


@op("ScatterAssign", inputs=3, inplace=(), enforce_inplace=[(0, 0)], gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_scatter_assign_shape)
def scatter_assign(xp, data, indices, slices):
    """DATA[indices[k]] = SLICES[k]; for a repeated index the last slice wins (Caffe2 copies in order)."""
    _check_scatter_assign(data, indices, slices)
    n = data.shape[0]
    idx = host_indices("ScatterAssign", indices, n)
    out = as_rows(data, n)
    if idx.size:
        last = idx.size - 1 - np.unique(idx[::-1], return_index=True)[1]
        out[xp.asarray(idx[last])] = rows_of(slices, idx.size)[xp.asarray(last)]
    return xp.asarray(out.reshape(data.shape))
