"""Matrix products and softmax (Caffe2's FC, FCTransposed, MatMul, BatchMatMul, Softmax) and their gradient
makers; sums, scaling and casts are in sums.py, the gradient kernels in math_grad.py.

Caffe2 often reads an N-d tensor as a 2-D matrix split at an `axis`: rows are the product of the dims
before it, columns the product of the dims from it on. `view2d` is that rule, shared by every op here.
Only ops whose Caffe2 schema allows it may run in place (Caffe2 refuses in-place use by default).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, GradientError, ShapeError
from ..kernels.fc import fc_into
from ..kernels.softmax import rows as softmax_rows
from .base import check_float, like, out_spec, size_of
from .registry import SHOULD_NOT_DO_GRADIENT, op
from ..kernels import jit


# --------------------------------------------------------------------------------------------- helpers
def canonical_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """Caffe2's canonical_axis_index: -ndim <= axis < ndim, negative counting from the end."""
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"{what}={axis} is out of range for a {ndim}-D input "
                            f"(valid: {-ndim} to {ndim - 1})")
    return axis + ndim if axis < 0 else axis


def view2d_shape(shape, axis: int, what: str = "axis") -> tuple[int, int, int]:
    """(rows, cols, canonical axis) of a shape read as a matrix split at axis."""
    a = canonical_axis(axis, len(shape), what)
    return math.prod(shape[:a]), math.prod(shape[a:]), a


def view2d(x, axis: int, what: str = "axis"):
    """(x as a rows x cols matrix split at axis, canonical axis)."""
    rows, cols, a = view2d_shape(x.shape, axis, what)
    return x.reshape(rows, cols), a


# --------------------------------------------------------------------------------------------- FC
def fc_shape(X, W, b, axis, axis_w, transposed) -> tuple[int, ...]:
    """FC's checks on arrays or TensorSpecs of X, W, b; the output shape X.shape[:axis] + (N,)."""
    op_type = "FCTransposed" if transposed else "FC"
    check_float(op_type, X=X, W=W, b=b)
    X_shape, W_shape, b_shape = tuple(X.shape), tuple(W.shape), tuple(b.shape)
    if len(b_shape) != 1:
        raise ShapeError(f"{op_type}: b must be 1-D with N elements, got b {b_shape}")
    M, K, a = view2d_shape(X_shape, axis)
    aw = canonical_axis(axis_w, len(W_shape), "axis_w")
    N = math.prod(W_shape[aw:]) if transposed else math.prod(W_shape[:aw])
    W_size, b_size = math.prod(W_shape), b_shape[0]
    if W_size != N * K or b_size != N:
        layout = "K x N" if transposed else "N x K"
        raise ShapeError(
            f"{op_type}: X {X_shape} at axis={axis} is M x K = {M} x {K}; W {W_shape} at axis_w={axis_w} "
            f"gives N = {N}, so W must hold {layout} = {N * K} elements (it has {W_size}) and b must have "
            f"N = {N} elements (b {b_shape}); fix W's shape, or choose axis/axis_w so that X's K matches W")
    return X_shape[:a] + (N,)


def _fc(xp, X, W, b, axis, axis_w, transposed):
    out_shape = fc_shape(X, W, b, axis, axis_w, transposed)
    X2, _ = view2d(X, axis)
    K, N = X2.shape[1], out_shape[-1]
    W2 = W.reshape(K, N) if transposed else W.reshape(N, K).T
    return fc_into(xp, X2, W2, b).reshape(out_shape)


def _fc_specialize(transposed):
    def specialize(X, W, b, axis=1, axis_w=1, float16_compute=False):
        """FC's checks once per input signature; the returned kernel only computes (the same operations), into
        `out` when given one (its `writes_into`: the output's shape and dtype; runtime.executor.Specialized)."""
        out_shape = fc_shape(X, W, b, axis, axis_w, transposed)
        x2 = view2d_shape(X.shape, axis)[:2]
        K, N = x2[1], out_shape[-1]
        w2 = (K, N) if transposed else (N, K)
        y2, dtype = (x2[0], N), np.result_type(X.dtype, W.dtype)     # (the product's dtype; b is added in place)

        def fast(X, W, b, out=None):
            y = np.empty(out_shape, dtype) if out is None else out      # an array of its own, as shaped
            fc_into(np, X.reshape(x2), W.reshape(w2) if transposed else W.reshape(w2).T, b, y.reshape(y2))
            return y
        fast.writes_into = (out_shape, dtype)
        return fast
    specialize.writes_into = True     # (its kernels may write into an output buffer: executor.Specialized.into)
    return specialize


def _fc_shape(transposed):
    def shape(specs, axis=1, axis_w=1, float16_compute=False):
        X, W, b = specs
        return [out_spec(fc_shape(X, W, b, axis, axis_w, transposed), X.dtype)]
    return shape


def _fc_gradient(g):
    """FC / FCTransposed -> <type>Gradient(X, W, dY) -> (dW, db, dX), forward args copied (GetFCGradient)."""
    g.op(g.def_.type + "Gradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(1), g.GI(2), g.GI(0)])


def _fused_fc(regular):
    """FC's fused_kernel (Workspace.fused_cells): one row of float32 host arrays (sampling at batch 1) by numba's
    fc_row, the product and the bias in one pass over W (within float32 rounding of the BLAS product, which
    sums in another order; NaN and inf spread alike); other inputs take the regular kernel."""
    plain = _fc_specialize(False)

    def kernel(xp, X, W, b, axis=1, axis_w=1, float16_compute=False):
        host = all(type(a) is np.ndarray for a in (X, W, b))
        fast = specialize(X, W, b, axis, axis_w, float16_compute) if host else None
        return regular(xp, X, W, b, axis, axis_w, float16_compute) if fast is None else fast(X, W, b)

    def specialize(X, W, b, axis=1, axis_w=1, float16_compute=False):
        out_shape = fc_shape(X, W, b, axis, axis_w, False)
        M, K, _ = view2d_shape(X.shape, axis)
        compiled, N = jit.load(), out_shape[-1]
        if compiled is None or M != 1 or float16_compute or not X.dtype == W.dtype == b.dtype == np.float32:
            return plain(X, W, b, axis, axis_w, float16_compute)
        row, w2, x1 = compiled.fc_row, (N, K), (K,)

        def fast(X, W, b):
            y = np.empty(N, np.float32)
            row(W.reshape(w2), X.reshape(x1), b, y)
            return y.reshape(out_shape)
        return fast
    kernel.__doc__ = "FC with one fused float32 pass for a single row (Workspace.fused_cells)."
    specialize.writes_into = True     # (where it returns plain's kernel)
    kernel.specialize = specialize
    return kernel


@op("FC", inputs=3, args={"axis": 1, "axis_w": 1, "float16_compute": False}, inplace=(),
    shape=_fc_shape(False), gradient=_fc_gradient, specialize=_fc_specialize(False), fused=_fused_fc, grows="shapes")
def fc(xp, X, W, b, axis=1, axis_w=1, float16_compute=False):
    """Fully connected layer Y = X·Wᵀ + b on the 2-D views of X (at axis, M x K) and W (at axis_w, N x K);
    Y has shape X.shape[:axis] + [N]."""
    return _fc(xp, X, W, b, axis, axis_w, transposed=False)


@op("FCTransposed", inputs=3, args={"axis": 1, "axis_w": 1, "float16_compute": False}, inplace=(),
    shape=_fc_shape(True), gradient=_fc_gradient, specialize=_fc_specialize(True), shapes_from_inputs=True,
    grows="shapes")
def fc_transposed(xp, X, W, b, axis=1, axis_w=1, float16_compute=False):
    """FC with a pre-transposed weight: Y = X·W + b, W viewed as K x N at axis_w."""
    return _fc(xp, X, W, b, axis, axis_w, transposed=True)


def _packed_fc_checks(X, W, b) -> None:
    if len(W.shape) != 2 or len(b.shape) != 1:
        raise ShapeError(f"PackedFC: W must be 2-D (N x K) and b 1-D (N), got W {tuple(W.shape)}, b "
                         f"{tuple(b.shape)}; FC takes other shapes with axis_w")


def _packed_fc_shape(specs, axis=1):
    _packed_fc_checks(*specs)
    return _fc_shape(False)(specs, axis=axis)


@op("PackedFC", inputs=3, args={"axis": 1}, inplace=(), shape=_packed_fc_shape, gradient=SHOULD_NOT_DO_GRADIENT,
    grows="shapes")
def packed_fc(xp, X, W, b, axis=1):
    """FC for inference with a 2-D weight W (N x K) and 1-D bias: Y = X·Wᵀ + b on X's 2-D view at axis (Caffe2's
    MKL operator, which packs W once for its GEMM; here FC's arithmetic, W used as it is)."""
    _packed_fc_checks(X, W, b)
    return _fc(xp, X, W, b, axis, 1, transposed=False)


# --------------------------------------------------------------------------------------------- MatMul
def matmul_shape(A, B, like, axis_a, axis_b, trans_a, trans_b) -> tuple[tuple[int, ...], tuple, tuple]:
    """MatMul's checks on arrays or TensorSpecs; (output shape, A's 2-D view, B's 2-D view)."""
    check_float("MatMul", A=A, B=B)
    ra, ca, _ = view2d_shape(tuple(A.shape), axis_a, "axis_a")
    rb, cb, _ = view2d_shape(tuple(B.shape), axis_b, "axis_b")
    (m, k), (k2, n) = (ca, ra) if trans_a else (ra, ca), (cb, rb) if trans_b else (rb, cb)
    if k != k2:
        raise ShapeError(
            f"MatMul: {'trans(A)' if trans_a else 'A'} is {m} x {k} (A {tuple(A.shape)}, axis_a="
            f"{axis_a}) but {'trans(B)' if trans_b else 'B'} is {k2} x {n} (B {tuple(B.shape)}, "
            f"axis_b={axis_b}); the inner sizes must match: check trans_a/trans_b and the axes")
    out = (m, n)
    if like is not None:
        if size_of(like) != m * n:
            raise ShapeError(f"MatMul: the result ({out}) cannot take the shape of input 2 "
                             f"{tuple(like.shape)}")
        out = tuple(like.shape)
    return out, (ra, ca), (rb, cb)


def _matmul_shape(specs, **args):
    A, B = specs[:2]
    out, _, _ = matmul_shape(A, B, specs[2] if len(specs) > 2 else None, **args)
    return [out_spec(out, A.dtype)]


def _product_gradients(a, b, go, trans_a, trans_b):
    """The two products giving (dA, dB) of Y = op(A)·op(B), as (inputs, transposes) pairs: Caffe2's
    GetMatMulGradient / GetBatchMatMulGradient case table."""
    if trans_a and trans_b:    # Y = A'B': dA = B'G', dB = G'A'
        return ([b, go], (1, 1)), ([go, a], (1, 1))
    if trans_a:                # Y = A'B: dA = BG', dB = AG
        return ([b, go], (0, 1)), ([a, go], (0, 0))
    if trans_b:                # Y = AB': dA = GB, dB = G'A
        return ([go, b], (0, 0)), ([go, a], (1, 0))
    return ([go, b], (0, 1)), ([a, go], (1, 0))   # Y = AB: dA = GB', dB = A'G


def _trans_args(trans) -> dict:
    return {name: 1 for name, t in zip(("trans_a", "trans_b"), trans, strict=True) if t}


def _matmul_gradient(g):
    """Two MatMul ops, each given the input it differentiates as a third input so that its result takes that
    input's shape. As in Caffe2, forward args are not copied: each op gets the transposes it needs and, under
    the name of the slot the forward input it reads sits in, that input's forward axis. Caffe2 keeps those
    axes in a C++ bool, so any axis other than 0 becomes 1 there (wrong gradients for an axis > 1); stepnet
    passes the real axis, which is the same for the usual axes 0 and 1."""
    trans_a, trans_b = bool(g.arg("trans_a", 0)), bool(g.arg("trans_b", 0))
    axis_a, axis_b = g.arg("axis_a", 1), g.arg("axis_b", 1)
    A, B = g.I(0), g.I(1)
    (ins_a, t_a), (ins_b, t_b) = _product_gradients(A, B, g.GO(0), trans_a, trans_b)
    # dA reads B, in slot 0 when trans_a; dB reads A, in slot 0 unless trans_b
    axes_a = {"axis_a" if trans_a else "axis_b": axis_b}
    axes_b = {"axis_b" if trans_b else "axis_a": axis_a}
    g.op("MatMul", ins_a + [A], [g.GI(0)], copy_args=False, **_trans_args(t_a), **axes_a)
    g.op("MatMul", ins_b + [B], [g.GI(1)], copy_args=False, **_trans_args(t_b), **axes_b)


@op("MatMul", inputs=(2, 3), args={"axis_a": 1, "axis_b": 1, "trans_a": 0, "trans_b": 0}, inplace=(),
    shape=_matmul_shape, gradient=_matmul_gradient, shapes_from_inputs=True, grows="shapes")
def matmul(xp, A, B, like=None, axis_a=1, axis_b=1, trans_a=0, trans_b=0):
    """Y = op(A)·op(B) on the 2-D views of A (at axis_a) and B (at axis_b), op = transpose when trans_*.

    A third input (used by MatMul's gradient) gives the shape Y is reshaped to.
    """
    out, a2, b2 = matmul_shape(A, B, like, axis_a, axis_b, trans_a, trans_b)
    A2, B2 = A.reshape(a2), B.reshape(b2)
    Y = xp.matmul(A2.T if trans_a else A2, B2.T if trans_b else B2)
    return Y.reshape(out)


def _check_batch(a_batch, b_batch, broadcast) -> None:
    """Batch dims must broadcast (numpy rules, aligned from the right); differing ones need broadcast=1."""
    n = max(len(a_batch), len(b_batch))
    pa = (1,) * (n - len(a_batch)) + tuple(a_batch)
    pb = (1,) * (n - len(b_batch)) + tuple(b_batch)
    if pa == pb:
        return
    bad = [i for i, (x, y) in enumerate(zip(pa, pb, strict=True)) if x != y and 1 not in (x, y)]
    if bad:
        raise ShapeError(f"BatchMatMul: batch dims {tuple(a_batch)} of A and {tuple(b_batch)} of B do not "
                         f"broadcast (aligned from the right, dim {bad[0]} is {pa[bad[0]]} vs {pb[bad[0]]})")
    if not broadcast:
        raise ShapeError(f"BatchMatMul: batch dims {tuple(a_batch)} of A and {tuple(b_batch)} of B differ; "
                         "pass broadcast=1 to broadcast them (numpy.matmul rules)")


def batch_matmul_shape(A, B, trans_a, trans_b, broadcast) -> tuple[int, ...]:
    """BatchMatMul's checks on arrays or TensorSpecs; the output shape (numpy.matmul's)."""
    check_float("BatchMatMul", A=A, B=B)
    a, b = tuple(A.shape), tuple(B.shape)
    if not a or not b:
        raise ShapeError(f"BatchMatMul needs inputs of rank >= 1, got A {a} and B {b}")
    if len(a) == 1 and len(b) == 1:
        if a != b:
            raise ShapeError(f"BatchMatMul: vectors A {a} and B {b} must have the same length")
        return (1,)
    am = a[:-2] + (a[-1], a[-2]) if trans_a and len(a) >= 2 else a
    bm = b[:-2] + (b[-1], b[-2]) if trans_b and len(b) >= 2 else b
    k_a = am[-1]
    k_b = bm[0] if len(bm) == 1 else bm[-2]
    if k_a != k_b:
        raise ShapeError(
            f"BatchMatMul: A {a} (trans_a={int(bool(trans_a))}) has K = {k_a} but B {b} "
            f"(trans_b={int(bool(trans_b))}) has K = {k_b}; the contracted dims must match")
    if len(a) == 1:
        return bm[:-2] + bm[-1:]
    if len(b) == 1:
        return am[:-1]
    _check_batch(a[:-2], b[:-2], broadcast)
    return tuple(np.broadcast_shapes(am[:-2], bm[:-2])) + (am[-2], bm[-1])


def _batch_matmul_shape(specs, trans_a=0, trans_b=0, broadcast=0, use_scratch=0):
    A, B = specs
    return [out_spec(batch_matmul_shape(A, B, trans_a, trans_b, broadcast), A.dtype)]


def _batch_matmul_gradient(g):
    """Two BatchMatMul ops with Caffe2's transposes (no forward args copied); Caffe2 refuses broadcast=1."""
    if g.arg("broadcast", 0):
        raise GradientError("the gradient of BatchMatMul is not supported with broadcast=1 (as "
                            "in Caffe2); give both inputs the same batch dims and drop broadcast", at=g.label)
    trans_a, trans_b = bool(g.arg("trans_a", 0)), bool(g.arg("trans_b", 0))
    (ins_a, t_a), (ins_b, t_b) = _product_gradients(g.I(0), g.I(1), g.GO(0), trans_a, trans_b)
    g.op("BatchMatMul", ins_a, [g.GI(0)], copy_args=False, **_trans_args(t_a))
    g.op("BatchMatMul", ins_b, [g.GI(1)], copy_args=False, **_trans_args(t_b))


@op("BatchMatMul", inputs=2, args={"trans_a": 0, "trans_b": 0, "broadcast": 0, "use_scratch": 0}, inplace=(),
    shape=_batch_matmul_shape, gradient=_batch_matmul_gradient, shapes_from_inputs=True, grows="shapes")
def batch_matmul(xp, A, B, trans_a=0, trans_b=0, broadcast=0, use_scratch=0):
    """Y[i] = op(A[i])·op(B[i]) over the leading (batch) dims; op transposes the last two dims when trans_*.

    Equal batch dims always work; different ones (numpy.matmul broadcasting, including different ranks) need
    broadcast=1. A 1-D A is a row vector, a 1-D B a column vector, and that dim is dropped from Y; two 1-D
    inputs give their dot product with shape (1,).
    """
    out = batch_matmul_shape(A, B, trans_a, trans_b, broadcast)
    if A.ndim == 1 and B.ndim == 1:
        return xp.matmul(A.reshape(1, -1), B.reshape(-1, 1)).reshape(out)
    Am = xp.swapaxes(A, -1, -2) if trans_a and A.ndim >= 2 else A
    Bm = xp.swapaxes(B, -1, -2) if trans_b and B.ndim >= 2 else B
    return xp.matmul(Am, Bm)


# --------------------------------------------------------------------------------------------- Softmax
def _softmax_shape(specs, axis=1):
    check_float("Softmax", X=specs[0])
    view2d_shape(specs[0].shape, axis)
    return [like(specs[0])]


def _softmax_gradient(g):
    """SoftmaxGradient(Y, dY) -> dX, forward args (axis) copied."""
    g.op("SoftmaxGradient", [g.O(0), g.GO(0)], [g.GI(0)])


def _softmax_specialize(X, axis=1):
    """Softmax's checks once per input signature."""
    check_float("Softmax", X=X)
    x2 = view2d_shape(X.shape, axis)[:2]
    if not X.size:
        return None
    shape = X.shape

    def fast(X):
        return softmax_rows(np, X.reshape(x2)).reshape(shape)
    return fast


def _fused_softmax(regular):
    """Softmax's fused_kernel: one numba pass per row for float32 host arrays (Workspace.fused_cells); its
    `specialize` does the checks once per input signature, as the regular kernel's does."""
    def kernel(xp, X, axis=1):
        fast = specialize(X, axis) if type(X) is np.ndarray else None
        return regular(xp, X, axis=axis) if fast is None else fast(X)

    def specialize(X, axis=1):
        check_float("Softmax", X=X)
        m, k, _ = view2d_shape(X.shape, axis)
        compiled = jit.load()
        if compiled is None or X.dtype != np.float32 or not m * k:
            return None
        softmax_rows, shape = compiled.softmax_rows, X.shape

        def fast(X):
            out = np.empty((m, k), np.float32)
            softmax_rows(np.ascontiguousarray(X).reshape(m, k), out)
            return out.reshape(shape)
        return fast
    kernel.__doc__ = "Softmax with one fused float32 pass per row (Workspace.fused_cells)."
    kernel.specialize = specialize
    return kernel


@op("Softmax", args={"axis": 1}, inplace=(), shape=_softmax_shape, gradient=_softmax_gradient,
    specialize=_softmax_specialize, fused=_fused_softmax, shapes_from_inputs=True)
def softmax(xp, X, axis=1):
    """Softmax over each row of X's 2-D view at axis (all trailing dims together), shifted by the row max."""
    check_float("Softmax", X=X)
    X2, _ = view2d(X, axis)
    if X2.size == 0:
        return xp.zeros(X.shape, dtype=X.dtype)
    return softmax_rows(xp, X2).reshape(X.shape)


