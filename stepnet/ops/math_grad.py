"""Gradient kernels of the matrix and sum ops: FCGradient, FCTransposedGradient, SoftmaxGradient,
WeightedSumGradient and ElementwiseLinearGradient, with Caffe2's inputs and outputs (their makers live next to
the forward ops in math.py and sums.py). None of them runs in place, and none has a gradient of its own.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArityError, ShapeError
from .base import check_float, like, out_spec, size_of
from ..kernels.fc import input_gradient_into
from ..kernels.onehot import scatter_weight_grad
from .math import canonical_axis, view2d, view2d_shape
from .registry import op
from ..kernels import jit

_FC_ARGS = {"axis": 1, "axis_w": 1, "float16_compute": False}


# --------------------------------------------------------------------------------------------- FC
def fc_grad_dims(op_type, X, W, dY, axis, axis_w, transposed) -> tuple[int, int, int]:
    """FC*Gradient's checks on arrays or TensorSpecs; (M, K, N) of X (M x K), W and dY (M x N)."""
    check_float(op_type, X=X, W=W, dY=dY)
    M, K, _ = view2d_shape(tuple(X.shape), axis)
    aw = canonical_axis(axis_w, len(W.shape), "axis_w")
    N = math.prod(W.shape[aw:]) if transposed else math.prod(W.shape[:aw])
    if size_of(W) != N * K:
        raise ShapeError(f"{op_type}: X {tuple(X.shape)} at axis={axis} has K = {K} columns, but W "
                         f"{tuple(W.shape)} at axis_w={axis_w} holds {size_of(W)} elements, not N x K = "
                         f"{N * K}; use the X and W of the forward FC and its axis/axis_w")
    if size_of(dY) != M * N:
        raise ShapeError(f"{op_type}: dY {tuple(dY.shape)} must hold M x N = {M} x {N} = {M * N} elements "
                         f"(the forward output's), from X {tuple(X.shape)} and W {tuple(W.shape)}")
    return M, K, N


def _fc_gradient(xp, op_type, X, W, dY, axis, axis_w, transposed, input_gradient=True):
    """(dW, db, dX); (dW, db) without input_gradient (Caffe2 computes dX only for an op with 3 outputs)."""
    M, K, N = fc_grad_dims(op_type, X, W, dY, axis, axis_w, transposed)
    dY = xp.asarray(dY)  # a 1-element gradient may sit on the host
    if X.size == 0:  # Caffe2 zero-fills dW and db; dX is empty then anyway
        return (xp.zeros(W.shape, W.dtype), xp.zeros((N,), dY.dtype), xp.zeros(X.shape, X.dtype))[
            :3 if input_gradient else 2]
    X2, G = X.reshape(M, K), dY.reshape(M, N)
    if transposed:      # W is K x N: Y = X·W
        W2 = W.reshape(K, N)
        dW = xp.matmul(X2.T, G)
        dX = xp.matmul(G, W2.T) if input_gradient else None
    else:               # W is N x K: Y = X·Wᵀ
        W2 = W.reshape(N, K)
        dW = xp.matmul(G.T, X2)
        dX = input_gradient_into(xp, G, W2) if input_gradient else None
    if dX is None:
        return dW.reshape(W.shape), G.sum(axis=0)
    return dW.reshape(W.shape), G.sum(axis=0), dX.reshape(X.shape)


def _one_hot_fc_gradient(regular, op_type, transposed):
    """FCGradient's fused_kernel: regular, but the weight gradient of one-hot rows of X as a scatter-add
    (stepnet.kernels.onehot; numba's, with Workspace.fused_cells)."""
    def kernel(ctx, xp, X, W, dY, axis=1, axis_w=1, float16_compute=False):
        M, K, N = fc_grad_dims(op_type, X, W, dY, axis, axis_w, transposed)
        if xp is np and type(dY) is np.ndarray and M:
            G = dY.reshape(M, N)
            dW = scatter_weight_grad(X.reshape(M, K), G, jit.load(), transpose=not transposed)   # W's layout
            if dW is not None:
                if len(ctx.opdef.output) < 3:
                    return dW.reshape(W.shape), G.sum(axis=0)
                W2 = W.reshape(K, N).T if transposed else W.reshape(N, K)
                return dW.reshape(W.shape), G.sum(axis=0), input_gradient_into(np, G, W2).reshape(X.shape)
        return regular(ctx, xp, X, W, dY, axis=axis, axis_w=axis_w, float16_compute=float16_compute)
    kernel.__doc__ = f"{op_type} with the one-hot weight gradient as a scatter-add (Workspace.fused_cells)."
    return kernel


def _fc_gradient_shape(op_type, transposed):
    def shape(specs, axis=1, axis_w=1, float16_compute=False):
        X, W, dY = specs
        _, _, N = fc_grad_dims(op_type, X, W, dY, axis, axis_w, transposed)
        return [like(W), out_spec((N,), dY.dtype), like(X)]
    return shape


@op("FCGradient", inputs=3, outputs=(2, 3), args=_FC_ARGS, inplace=(), context="structure",
    shape=_fc_gradient_shape("FCGradient", False),
    fused=lambda k: _one_hot_fc_gradient(k, "FCGradient", False), shapes_from_inputs=True)
def fc_gradient(ctx, xp, X, W, dY, axis=1, axis_w=1, float16_compute=False):
    """(X, W, dY) -> (dW = dYᵀ·X, db = Σ_rows dY, dX = dY·W) on the 2-D views of FC; dX only when the op has
    a third output (as in Caffe2: without one, no dX product)."""
    return _fc_gradient(xp, "FCGradient", X, W, dY, axis, axis_w, False, len(ctx.opdef.output) > 2)


@op("FCTransposedGradient", inputs=3, outputs=(2, 3), args=_FC_ARGS, inplace=(), context="structure",
    shape=_fc_gradient_shape("FCTransposedGradient", True),
    fused=lambda k: _one_hot_fc_gradient(k, "FCTransposedGradient", True), shapes_from_inputs=True)
def fc_transposed_gradient(ctx, xp, X, W, dY, axis=1, axis_w=1, float16_compute=False):
    """(X, W, dY) -> (dW = Xᵀ·dY, db = Σ_rows dY, dX = dY·Wᵀ) for FCTransposed's K x N weight (dX as
    FCGradient's)."""
    return _fc_gradient(xp, "FCTransposedGradient", X, W, dY, axis, axis_w, True, len(ctx.opdef.output) > 2)


# --------------------------------------------------------------------------------------------- Softmax
def _check_softmax_grad(Y, dY, axis) -> None:
    check_float("SoftmaxGradient", Y=Y, dY=dY)
    if tuple(Y.shape) != tuple(dY.shape):
        raise ShapeError(f"SoftmaxGradient: Y {tuple(Y.shape)} and dY {tuple(dY.shape)} must have one shape "
                         "(the forward Softmax's output and its gradient)")
    view2d_shape(tuple(Y.shape), axis)


def _softmax_gradient_shape(specs, axis=1):
    _check_softmax_grad(*specs, axis)
    return [like(specs[0])]


def _fused_softmax_gradient(regular):
    """SoftmaxGradient's fused_kernel: one numba pass per row for float32 host arrays (Workspace.fused_cells)."""
    def kernel(xp, Y, dY, axis=1):
        _check_softmax_grad(Y, dY, axis)
        m, k, _ = view2d_shape(tuple(Y.shape), axis)
        dX = jit.rows("softmax_grad_rows", Y.reshape(m, k), dY.reshape(m, k)) if m * k else None
        return regular(xp, Y, dY, axis=axis) if dX is None else dX.reshape(Y.shape)
    kernel.__doc__ = "SoftmaxGradient with one fused float32 pass per row (Workspace.fused_cells)."
    return kernel


@op("SoftmaxGradient", inputs=2, args={"axis": 1}, inplace=(), shape=_softmax_gradient_shape,
    fused=_fused_softmax_gradient, shapes_from_inputs=True)
def softmax_gradient(xp, Y, dY, axis=1):
    """(Y, dY) -> dX = Y ⊙ (dY − Σ_row dY ⊙ Y), rows of the 2-D view at axis (Y is Softmax's output)."""
    _check_softmax_grad(Y, dY, axis)
    Y, dY = xp.asarray(Y), xp.asarray(dY)
    Y2, _ = view2d(Y, axis)
    G2, _ = view2d(dY, axis)
    return (Y2 * (G2 - (G2 * Y2).sum(axis=1, keepdims=True))).reshape(Y.shape)


# --------------------------------------------------------------------------------------------- WeightedSum
def _check_weighted_sum_grad(inputs, grad_on_w, n_outputs=None) -> None:
    """WeightedSumGradient's checks on arrays or TensorSpecs: (dY, X0, w0, X1, w1, ...)."""
    if len(inputs) % 2 != 1:
        raise ArityError(f"WeightedSumGradient takes dY then pairs (X_i, w_i), got {len(inputs)} inputs")
    pairs = len(inputs) // 2
    want = 2 * pairs if grad_on_w else pairs
    if n_outputs is not None and n_outputs != want:
        raise ArityError(f"WeightedSumGradient with {pairs} pairs and grad_on_w={int(bool(grad_on_w))} "
                         f"writes {want} outputs, got {n_outputs}")
    dY = inputs[0]
    check_float("WeightedSumGradient", dY=dY)
    for i in range(pairs):
        x, w = inputs[1 + 2 * i], inputs[2 + 2 * i]
        if size_of(w) != 1:
            raise ShapeError(f"WeightedSumGradient: weight w{i} must hold 1 element, got {tuple(w.shape)}")
        if size_of(x) != size_of(dY):
            raise ShapeError(f"WeightedSumGradient: X{i} {tuple(x.shape)} must have as many elements as dY "
                             f"{tuple(dY.shape)}")


def _weighted_sum_gradient_shape(specs, grad_on_w=False):
    _check_weighted_sum_grad(specs, grad_on_w)
    dY, pairs = specs[0], len(specs) // 2
    dxs = [out_spec(specs[1 + 2 * i].shape, dY.dtype) for i in range(pairs)]
    dws = [like(specs[2 + 2 * i]) for i in range(pairs)] if grad_on_w else []
    return dxs + dws


@op("WeightedSumGradient", inputs=(3, None), outputs=(1, None), args={"grad_on_w": False}, inplace=(),
    context=True, shape=_weighted_sum_gradient_shape)
def weighted_sum_gradient(ctx, xp, *inputs, grad_on_w=False):
    """(dY, X0, w0, X1, w1, ...) -> dX_i = w_i·dY for every pair, then dw_i = Σ dY ⊙ X_i when grad_on_w.

    dX_i takes X_i's shape (Caffe2 gives it dY's; the elements are the same) and dw_i w_i's.
    """
    _check_weighted_sum_grad(inputs, grad_on_w, len(ctx.opdef.output))
    dY, xs, ws = xp.asarray(inputs[0]), inputs[1::2], [xp.asarray(w) for w in inputs[2::2]]
    dxs = [(dY.reshape(-1) * w.reshape(1).astype(dY.dtype)).reshape(x.shape)
           for x, w in zip(xs, ws, strict=True)]
    if not grad_on_w:
        return tuple(dxs)
    dws = [(dY.reshape(-1) * x.reshape(-1)).sum(keepdims=True).astype(w.dtype).reshape(w.shape)
           for x, w in zip(xs, ws, strict=True)]
    return tuple(dxs + dws)


# ----------------------------------------------------------------------------------------- ElementwiseLinear
def _check_elementwise_linear_grad(dY, X, a, axis) -> int:
    """ElementwiseLinearGradient's checks on arrays or TensorSpecs; D, the columns of X's 2-D view."""
    check_float("ElementwiseLinearGradient", dY=dY, X=X, a=a)
    _, D, _ = view2d_shape(tuple(X.shape), axis)
    if len(a.shape) != 1 or a.shape[0] != D:
        raise ShapeError(f"ElementwiseLinearGradient: X {tuple(X.shape)} at axis={axis} has D = {D} columns, "
                         f"so a must be 1-D of length {D}, got a {tuple(a.shape)}")
    if size_of(dY) != size_of(X):
        raise ShapeError(f"ElementwiseLinearGradient: dY {tuple(dY.shape)} must have X's {size_of(X)} "
                         f"elements (X {tuple(X.shape)})")
    return D


def _elementwise_linear_gradient_shape(specs, axis=1):
    dY, X, a = specs
    _check_elementwise_linear_grad(dY, X, a, axis)
    return [like(X), like(a), like(a)]


@op("ElementwiseLinearGradient", inputs=3, outputs=3, args={"axis": 1}, inplace=(),
    shape=_elementwise_linear_gradient_shape)
def elementwise_linear_gradient(xp, dY, X, a, axis=1):
    """(dY, X, a) -> (dX = dY ⊙ a, da = Σ_rows dY ⊙ X, db = Σ_rows dY) on X's 2-D view N x D at axis."""
    _check_elementwise_linear_grad(dY, X, a, axis)
    X2, _ = view2d(X, axis)
    G = xp.asarray(dY).reshape(X2.shape)
    return (G * a).reshape(X.shape), (G * X2).sum(axis=0), G.sum(axis=0)
