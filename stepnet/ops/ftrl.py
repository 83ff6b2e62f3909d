"""FTRL-Proximal updates (caffe2/sgd/ftrl_op): Ftrl on a dense gradient, SparseFtrl on the rows a sparse
gradient names.

The state blob `nz` holds two accumulators per weight, interleaved: nz has the parameter's element count
times 2 (FtrlOptimizer makes it with the parameter's shape + [2]); element 2i is n (the sum of squared
gradients) and 2i + 1 is z. One step, per weight w with gradient g:

    n' = n + g²,  σ = (√n' − √n)/α,  z' = z + g − σ·w
    w' = (λ1·sign(z') − z') / ((β + √n')/α + λ2)   if |z'| > λ1, else 0

α comes from the argument `alpha` or, at run time, from an optional last input holding one value (giving
both is an error, as in Caffe2). Arithmetic stays in the parameter's float dtype. SparseFtrl updates in place
(EnforceInplace) and applies a repeated index once per occurrence, in order. Neither op is differentiable.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, ShapeError
from .base import check_float, like, size_of
from .optim import arrays, check_scalar, const, scalar
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op
from .sparse_optim import apply_rows, as_rows, check_rows, host_indices, rows_of

ALPHA_DEFAULT = 0.005
FTRL_ARGS = {"alpha": Arg("float", None), "beta": Arg("float", 1.0), "lambda1": Arg("float", 0.001),
             "lambda2": Arg("float", 0.001)}


def ftrl_step(xp, w, n, z, g, alpha_inv, beta, lambda1, lambda2):
    """(w', n', z') of one FTRL step, element-wise; alpha_inv is a 0-D array of w's dtype."""
    dt = w.dtype
    with np.errstate(all="ignore"):       # a negative n or a zero denominator gives NaN / inf, as in C++
        n_new = n + g * g
        root = xp.sqrt(n_new)
        z_new = z + g - (root - xp.sqrt(n)) * alpha_inv * w
        l1 = const(dt, lambda1)
        denom = (const(dt, beta) + root) * alpha_inv + const(dt, lambda2)
        w_new = (l1 * xp.sign(z_new) - z_new) / denom
    return xp.where(xp.abs(z_new) > l1, w_new, const(dt, 0)), n_new, z_new


def _check_alpha(op_type: str, var, alpha_input, alpha) -> None:
    if alpha_input is None:
        return
    if alpha is not None:
        raise ArgumentError(f"{op_type}: alpha is given both as an argument and as an input; give one")
    check_float(op_type, var=var, alpha=alpha_input)
    check_scalar(op_type, "alpha", alpha_input)


def _alpha_inverse(xp, alpha_input, alpha, dtype):
    """1/α as a 0-D array of `dtype`, from the run-time input when there is one (1/0 is inf, as in C++)."""
    if alpha_input is not None:
        with np.errstate(divide="ignore"):
            return const(dtype, 1) / scalar(xp, alpha_input, dtype)
    alpha = ALPHA_DEFAULT if alpha is None else alpha
    return xp.asarray(const(dtype, 1.0 / alpha if alpha else float("inf")))


def _check_nz(op_type, var, nz) -> None:
    if size_of(nz) != 2 * size_of(var):
        raise ShapeError(f"{op_type}: nz {tuple(nz.shape)} must hold two accumulators (n, z) per element of var "
                         f"{tuple(var.shape)}, i.e. {2 * size_of(var)} elements")


# --------------------------------------------------------------------------------------------- Ftrl
def _check_ftrl(var, nz, grad, alpha_input=None, alpha=None) -> None:
    check_float("Ftrl", var=var, nz=nz, grad=grad)
    if size_of(grad) != size_of(var):
        raise ShapeError(f"Ftrl: grad {tuple(grad.shape)} must have as many elements as var {tuple(var.shape)}")
    _check_nz("Ftrl", var, nz)
    _check_alpha("Ftrl", var, alpha_input, alpha)


def _ftrl_shape(specs, *, alpha, **_):
    _check_ftrl(*specs, alpha=alpha)
    return [like(specs[0]), like(specs[1])]


def _dense(xp, var, nz, grad, alpha_inv, beta, lambda1, lambda2):
    pairs = nz.reshape(-1, 2)
    w, n, z = ftrl_step(xp, var.reshape(-1), pairs[:, 0], pairs[:, 1], grad.reshape(-1), alpha_inv, beta,
                        lambda1, lambda2)
    return arrays(xp, w.reshape(var.shape), xp.stack([n, z], axis=1).reshape(nz.shape))


@op("Ftrl", inputs=(3, 4), outputs=2, inplace=[(0, 0), (1, 1)], args=FTRL_ARGS, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_ftrl_shape)
def ftrl(xp, var, nz, grad, alpha_input=None, *, alpha, beta, lambda1, lambda2):
    """(var, nz, grad[, alpha]) -> (var, nz): one FTRL-Proximal step of every weight (see the module
    docstring); nz interleaves the n and z accumulators of each weight."""
    _check_ftrl(var, nz, grad, alpha_input, alpha)
    return _dense(xp, var, nz, grad, _alpha_inverse(xp, alpha_input, alpha, var.dtype), beta, lambda1, lambda2)


# --------------------------------------------------------------------------------------------- SparseFtrl
def _check_sparse_ftrl(var, nz, indices, grad, alpha_input=None, alpha=None) -> None:
    check_float("SparseFtrl", var=var, nz=nz, grad=grad)
    check_rows("SparseFtrl", var, indices, grad, "var", "grad")
    _check_nz("SparseFtrl", var, nz)
    _check_alpha("SparseFtrl", var, alpha_input, alpha)


def _sparse_ftrl_shape(specs, *, alpha, **_):
    _check_sparse_ftrl(*specs, alpha=alpha)
    return [like(specs[0]), like(specs[1])]


@op("SparseFtrl", inputs=(4, 5), outputs=2, inplace=(), enforce_inplace=[(0, 0), (1, 1)], args=FTRL_ARGS,
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_sparse_ftrl_shape)
def sparse_ftrl(xp, var, nz, indices, grad, alpha_input=None, *, alpha, beta, lambda1, lambda2):
    """(var, nz, indices, grad values[, alpha]) -> (var, nz): the FTRL step of Ftrl on the rows of var named
    by indices (row k of the values belongs to row indices[k]); a repeated index is updated once per
    occurrence, in order."""
    _check_sparse_ftrl(var, nz, indices, grad, alpha_input, alpha)
    rows = var.shape[0]
    idx = host_indices("SparseFtrl", indices, rows)
    w, state = as_rows(var, rows), as_rows(nz, rows)
    block = w.shape[1]
    n, z = state[:, 0::2], state[:, 1::2]
    g = rows_of(grad, idx.size).reshape(idx.size, block)
    alpha_inv = _alpha_inverse(xp, alpha_input, alpha, var.dtype)

    def step(p, cur):
        w_new, n_new, z_new = ftrl_step(xp, cur[0], cur[1], cur[2], g[p], alpha_inv, beta, lambda1, lambda2)
        return (w_new, n_new, z_new), None

    tables = [w, xp.ascontiguousarray(n), xp.ascontiguousarray(z)]
    apply_rows(xp, idx, tables, step)
    state = xp.stack([tables[1], tables[2]], axis=2)
    return arrays(xp, tables[0].reshape(var.shape), state.reshape(nz.shape))

