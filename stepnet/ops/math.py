"""Matrix products, softmax, sums, scaling and casts (Caffe2's FC, MatMul, BatchMatMul, Softmax, Sum, ...).

Caffe2 often reads an N-d tensor as a 2-D matrix split at an `axis`: rows are the product of the dims
before it, columns the product of the dims from it on. `_view2d` is that rule, shared by every op here.
Only ops whose Caffe2 schema allows it may run in place (Caffe2 refuses in-place use by default).
"""
from __future__ import annotations

import contextlib
import functools
import math

import numpy as np

from ..errors import ArgumentError, ArityError, DTypeError, ShapeError
from ..proto import NUMPY_OF, DataType
from .registry import Arg, op

_SUM_DTYPES = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64))
_INT_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


# --------------------------------------------------------------------------------------------- helpers
def canonical_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """Caffe2's canonical_axis_index: -ndim <= axis < ndim, negative counting from the end."""
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"{what}={axis} is out of range for a {ndim}-D input (valid: {-ndim} to {ndim - 1})")
    return axis + ndim if axis < 0 else axis


def _view2d(x, axis: int, what: str = "axis"):
    """(x as a rows x cols matrix split at axis, canonical axis)."""
    a = canonical_axis(axis, x.ndim, what)
    rows = math.prod(x.shape[:a])
    return x.reshape(rows, math.prod(x.shape[a:])), a


def _need_float(op_type: str, **arrays) -> None:
    """Caffe2 runs these kernels on floating types only; all inputs must share one dtype."""
    first = next(iter(arrays.values())).dtype
    for name, x in arrays.items():
        if x.dtype.kind != "f":
            raise DTypeError(f"{op_type} needs floating-point inputs, but {name} is {x.dtype}; Cast it to float first")
        if x.dtype != first:
            names = ", ".join(f"{n} {v.dtype}" for n, v in arrays.items())
            raise DTypeError(f"{op_type} needs inputs of one dtype, got {names}; Cast them to the same type")


def _quiet(xp):
    """Silence numpy's overflow warnings where an overflow is the intended result."""
    errstate = getattr(xp, "errstate", None)
    return errstate(over="ignore") if errstate is not None else contextlib.nullcontext()


# --------------------------------------------------------------------------------------------- FC
def _fc(xp, X, W, b, axis, axis_w, transposed):
    op_type = "FCTransposed" if transposed else "FC"
    _need_float(op_type, X=X, W=W, b=b)
    if b.ndim != 1:
        raise ShapeError(f"{op_type}: b must be 1-D with N elements, got b {b.shape}")
    X2, a = _view2d(X, axis)
    M, K = X2.shape
    aw = canonical_axis(axis_w, W.ndim, "axis_w")
    N = math.prod(W.shape[aw:]) if transposed else math.prod(W.shape[:aw])
    if W.size != N * K or b.size != N:
        layout = "K x N" if transposed else "N x K"
        raise ShapeError(
            f"{op_type}: X {X.shape} at axis={axis} is M x K = {M} x {K}; W {W.shape} at axis_w={axis_w} gives "
            f"N = {N}, so W must hold {layout} = {N * K} elements (it has {W.size}) and b must have N = {N} "
            f"elements (b {b.shape}); fix W's shape, or choose axis/axis_w so that X's K matches W")
    W2 = W.reshape(K, N) if transposed else W.reshape(N, K).T
    Y = xp.matmul(X2, W2) + b
    return Y.reshape(X.shape[:a] + (N,))


@op("FC", inputs=3, args={"axis": 1, "axis_w": 1, "float16_compute": False}, inplace=())
def fc(xp, X, W, b, axis=1, axis_w=1, float16_compute=False):
    """Fully connected layer Y = X·Wᵀ + b on the 2-D views of X (at axis, M x K) and W (at axis_w, N x K);
    Y has shape X.shape[:axis] + [N]."""
    return _fc(xp, X, W, b, axis, axis_w, transposed=False)


@op("FCTransposed", inputs=3, args={"axis": 1, "axis_w": 1, "float16_compute": False}, inplace=())
def fc_transposed(xp, X, W, b, axis=1, axis_w=1, float16_compute=False):
    """FC with a pre-transposed weight: Y = X·W + b, W viewed as K x N at axis_w."""
    return _fc(xp, X, W, b, axis, axis_w, transposed=True)


# --------------------------------------------------------------------------------------------- MatMul
@op("MatMul", inputs=(2, 3), args={"axis_a": 1, "axis_b": 1, "trans_a": 0, "trans_b": 0}, inplace=())
def matmul(xp, A, B, like=None, axis_a=1, axis_b=1, trans_a=0, trans_b=0):
    """Y = op(A)·op(B) on the 2-D views of A (at axis_a) and B (at axis_b), op = transpose when trans_*.

    A third input (used by MatMul's gradient) gives the shape Y is reshaped to.
    """
    _need_float("MatMul", A=A, B=B)
    A2, _ = _view2d(A, axis_a, "axis_a")
    B2, _ = _view2d(B, axis_b, "axis_b")
    A2 = A2.T if trans_a else A2
    B2 = B2.T if trans_b else B2
    if A2.shape[1] != B2.shape[0]:
        raise ShapeError(
            f"MatMul: {'trans(A)' if trans_a else 'A'} is {A2.shape[0]} x {A2.shape[1]} (A {A.shape}, axis_a="
            f"{axis_a}) but {'trans(B)' if trans_b else 'B'} is {B2.shape[0]} x {B2.shape[1]} (B {B.shape}, "
            f"axis_b={axis_b}); the inner sizes must match: check trans_a/trans_b and the axes")
    Y = xp.matmul(A2, B2)
    if like is not None:
        if like.size != Y.size:
            raise ShapeError(f"MatMul: the result ({Y.shape}) cannot take the shape of input 2 {like.shape}")
        Y = Y.reshape(like.shape)
    return Y


def _check_batch(a_batch, b_batch, broadcast) -> None:
    """Batch dims must broadcast (numpy rules, aligned from the right); differing ones need broadcast=1."""
    n = max(len(a_batch), len(b_batch))
    pa = (1,) * (n - len(a_batch)) + tuple(a_batch)
    pb = (1,) * (n - len(b_batch)) + tuple(b_batch)
    if pa == pb:
        return
    bad = [i for i, (x, y) in enumerate(zip(pa, pb)) if x != y and 1 not in (x, y)]
    if bad:
        raise ShapeError(f"BatchMatMul: batch dims {tuple(a_batch)} of A and {tuple(b_batch)} of B do not "
                         f"broadcast (aligned from the right, dim {bad[0]} is {pa[bad[0]]} vs {pb[bad[0]]})")
    if not broadcast:
        raise ShapeError(f"BatchMatMul: batch dims {tuple(a_batch)} of A and {tuple(b_batch)} of B differ; "
                         "pass broadcast=1 to broadcast them (numpy.matmul rules)")


@op("BatchMatMul", inputs=2, args={"trans_a": 0, "trans_b": 0, "broadcast": 0, "use_scratch": 0}, inplace=())
def batch_matmul(xp, A, B, trans_a=0, trans_b=0, broadcast=0, use_scratch=0):
    """Y[i] = op(A[i])·op(B[i]) over the leading (batch) dims; op transposes the last two dims when trans_*.

    Equal batch dims always work; different ones (numpy.matmul broadcasting, including different ranks) need
    broadcast=1. A 1-D A is a row vector, a 1-D B a column vector, and that dim is dropped from Y; two 1-D
    inputs give their dot product with shape (1,).
    """
    _need_float("BatchMatMul", A=A, B=B)
    if A.ndim == 0 or B.ndim == 0:
        raise ShapeError(f"BatchMatMul needs inputs of rank >= 1, got A {A.shape} and B {B.shape}")
    if A.ndim == 1 and B.ndim == 1:
        if A.size != B.size:
            raise ShapeError(f"BatchMatMul: vectors A {A.shape} and B {B.shape} must have the same length")
        return xp.matmul(A.reshape(1, -1), B.reshape(-1, 1)).reshape(1)
    Am = xp.swapaxes(A, -1, -2) if trans_a and A.ndim >= 2 else A
    Bm = xp.swapaxes(B, -1, -2) if trans_b and B.ndim >= 2 else B
    K_a = Am.shape[-1]
    K_b = Bm.shape[0] if Bm.ndim == 1 else Bm.shape[-2]
    if K_a != K_b:
        raise ShapeError(
            f"BatchMatMul: A {A.shape} (trans_a={int(bool(trans_a))}) has K = {K_a} but B {B.shape} "
            f"(trans_b={int(bool(trans_b))}) has K = {K_b}; the contracted dims must match")
    if A.ndim >= 2 and B.ndim >= 2:
        _check_batch(A.shape[:-2], B.shape[:-2], broadcast)
    return xp.matmul(Am, Bm)


# --------------------------------------------------------------------------------------------- Softmax
@op("Softmax", args={"axis": 1}, inplace=())
def softmax(xp, X, axis=1):
    """Softmax over each row of X's 2-D view at axis (all trailing dims together), shifted by the row max."""
    _need_float("Softmax", X=X)
    X2, _ = _view2d(X, axis)
    if X2.size == 0:
        return xp.zeros(X.shape, dtype=X.dtype)
    with _quiet(xp):  # rows spanning more than the float range shift to -inf, whose exp is an exact 0
        e = xp.exp(X2 - X2.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(X.shape)


# --------------------------------------------------------------------------------------------- sums
def _sum(xp, op_type, inputs, allowed):
    X0 = inputs[0]
    if X0.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise DTypeError(f"{op_type} supports {names}, but input 0 is {X0.dtype}")
    for i, x in enumerate(inputs[1:], 1):
        if x.dtype != X0.dtype:
            raise DTypeError(f"{op_type} needs inputs of one dtype: input 0 is {X0.dtype} but input {i} is "
                             f"{x.dtype}; Cast them to the same type")
        if x.shape != X0.shape:
            raise ShapeError(f"{op_type} does not broadcast: input {i} has shape {x.shape} but input 0 has "
                             f"{X0.shape}; give every input the same shape (or use Add with broadcast=1)")
    out = X0.copy()
    for x in inputs[1:]:
        out += x
    return out


@op("Sum", inputs=(1, None), inplace=[(0, 0)])
def sum_(xp, *inputs):
    """Elementwise sum of any number of same-shape, same-dtype tensors (one input: a copy)."""
    return _sum(xp, "Sum", inputs, _SUM_DTYPES)


@op("SumInt", inputs=(1, None), inplace=[(0, 0)])
def sum_int(xp, *inputs):
    """Sum for integer tensors."""
    return _sum(xp, "SumInt", inputs, _INT_DTYPES)


@op("WeightedSum", inputs=(2, None), args={"grad_on_w": False}, inplace=[(0, 0)])
def weighted_sum(xp, *inputs, grad_on_w=False):
    """Y = Σ w_i·X_i over pairs X0, w0, X1, w1, ...; each w_i holds one number, each X_i as many elements as
    X0 (Caffe2 compares sizes, not shapes). grad_on_w only tells the gradient to also produce dw_i."""
    if len(inputs) % 2:
        raise ArityError(f"WeightedSum takes pairs (X0, w0, X1, w1, ...), got {len(inputs)} inputs")
    X0 = inputs[0]
    _need_float("WeightedSum", X0=X0)
    out = None
    for k in range(0, len(inputs), 2):
        x, w = inputs[k], inputs[k + 1]
        if w.size != 1:
            raise ShapeError(f"WeightedSum: weight w{k // 2} (input {k + 1}) must hold 1 element, got {w.shape}")
        if x.size != X0.size:
            raise ShapeError(f"WeightedSum: X{k // 2} {x.shape} must have as many elements as X0 {X0.shape}")
        if x.dtype != X0.dtype:
            raise DTypeError(f"WeightedSum: X{k // 2} is {x.dtype} but X0 is {X0.dtype}; Cast them to one type")
        term = x.reshape(X0.shape) * xp.asarray(w).reshape(()).astype(X0.dtype)
        out = term if out is None else out + term
    return xp.asarray(out)  # numpy gives a scalar for 0-D inputs


@op("Scale", args={"scale": 1.0}, inplace=[(0, 0)])
def scale(xp, X, scale=1.0):
    """Y = scale · X."""
    _need_float("Scale", X=X)
    return xp.asarray(X * X.dtype.type(scale))  # numpy gives a scalar for 0-D inputs


@op("ElementwiseLinear", inputs=3, args={"axis": 1}, inplace=())
def elementwise_linear(xp, X, a, b, axis=1):
    """Y = X ⊙ a + b on X's 2-D view N x D at axis, with a and b 1-D of length D (per-column scale and shift)."""
    _need_float("ElementwiseLinear", X=X, a=a, b=b)
    X2, _ = _view2d(X, axis)
    D = X2.shape[1]
    for name, v in (("a", a), ("b", b)):
        if v.ndim != 1 or v.shape[0] != D:
            raise ShapeError(f"ElementwiseLinear: X {X.shape} at axis={axis} has D = {D} columns, so {name} must "
                             f"be 1-D of length {D}, got {name} {v.shape}")
    return (X2 * a + b).reshape(X.shape)


# --------------------------------------------------------------------------------------------- Cast
_NO_CAST = {DataType.UNDEFINED: "UNDEFINED is not a type", DataType.BYTE: "BYTE is deprecated (use UINT8)",
            DataType.STRING: "casts to and from strings are not supported"}


def cast_dtype(value, name: str = "to") -> np.dtype:
    """The numpy dtype of a Cast type argument: a TensorProto.DataType number or its name in any case."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ArgumentError(f"Cast: argument {name!r} must be a DataType number or name, got {value!r}")
    return _cast_dtype(value, name)


@functools.cache
def _cast_dtype(value, name):
    if isinstance(value, str):
        try:
            code = DataType.Value(value.upper())
        except ValueError:
            valid = ", ".join(n for n, v in DataType.items() if v in NUMPY_OF and v not in _NO_CAST)
            raise ArgumentError(f"Cast: unknown {name}={value!r}; use one of {valid} (any case)") from None
    else:
        code = value
    if code in _NO_CAST:
        raise ArgumentError(f"Cast: {name}={value!r}: {_NO_CAST[code]}")
    if code not in NUMPY_OF:
        raise ArgumentError(f"Cast: {name}={value!r} is not a castable TensorProto.DataType")
    return np.dtype(NUMPY_OF[code])


@op("Cast", args={"to": Arg("any"), "from_type": Arg("any", None)}, inplace=())
def cast(xp, X, to, from_type=None):
    """Elementwise static_cast to the type `to` (number, or name such as "float", "INT64"); a cast to bool is
    x != 0. `from_type` names the source type for the gradient only (it is checked, not used)."""
    dtype = cast_dtype(to, "to")
    if from_type is not None:
        cast_dtype(from_type, "from_type")
    if X.dtype.kind not in "biuf":
        raise DTypeError(f"Cast: cannot cast from {X.dtype}; casting from strings is not supported")
    return X.astype(dtype)
