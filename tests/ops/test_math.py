"""FC, FCTransposed, MatMul, BatchMatMul and Softmax against loop references computed in Python floats
(float64), on every device. The sums (Sum, SumInt, WeightedSum, Scale, ElementwiseLinear, Cast) are tested in
test_sums.py."""
import math

import numpy as np
import pytest
from loop_reference import table_check, view2d

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.testing import DEVICES, infer_static, run_op

rng = np.random.default_rng(11)


def f32(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# --------------------------------------------------------------------------------------------- references
def transpose(m, ncols):
    return [[m[r][c] for r in range(len(m))] for c in range(ncols)]


def gemm(a, b, ncols_b):
    """Triple loop: a is M x K, b is K x N (nested lists)."""
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(ncols_b)] for i in range(len(a))]


def ref_fc(X, W, b, axis=1, axis_w=1, transposed=False):
    x, _ = view2d(X, axis)
    w, wc = view2d(W, axis_w)
    wt = w if transposed else transpose(w, wc)          # K x N
    N = len(b)
    y = gemm(x, wt, N)
    out = [[y[i][j] + float(b[j]) for j in range(N)] for i in range(len(x))]
    return np.array(out, dtype=np.float64).reshape(X.shape[:axis % X.ndim] + (N,))


def ref_matmul(A, B, axis_a=1, axis_b=1, trans_a=0, trans_b=0):
    a, ac = view2d(A, axis_a)
    b, bc = view2d(B, axis_b)
    if trans_a:
        a = transpose(a, ac)
    if trans_b:
        b, bc = transpose(b, bc), len(b)
    return np.array(gemm(a, b, bc), dtype=np.float64).reshape(len(a), bc)


def ref_bmm(A, B, trans_a=0, trans_b=0):
    """Loop over the broadcast batch index; 1-D A is a row, 1-D B a column, and that dim is dropped."""
    if A.ndim == 1 and B.ndim == 1:
        return np.array([sum(float(x) * float(y) for x, y in zip(A, B, strict=True))])
    a_vec, b_vec = A.ndim == 1, B.ndim == 1
    A_ = A[None, :] if a_vec else (np.swapaxes(A, -1, -2) if trans_a else A)
    B_ = B[:, None] if b_vec else (np.swapaxes(B, -1, -2) if trans_b else B)
    nb = max(A_.ndim, B_.ndim) - 2
    pa = (1,) * (nb - (A_.ndim - 2)) + A_.shape[:-2]
    pb = (1,) * (nb - (B_.ndim - 2)) + B_.shape[:-2]
    batch = tuple(max(x, y) for x, y in zip(pa, pb, strict=True))
    M, N = A_.shape[-2], B_.shape[-1]
    out = np.zeros(batch + (M, N))
    for idx in np.ndindex(*batch):
        ia = tuple(0 if pa[k] == 1 else idx[k] for k in range(nb))[nb - (A_.ndim - 2):]
        ib = tuple(0 if pb[k] == 1 else idx[k] for k in range(nb))[nb - (B_.ndim - 2):]
        a = [[float(v) for v in row] for row in A_[ia]]
        b = [[float(v) for v in row] for row in B_[ib]]
        out[idx] = gemm(a, b, N)
    if a_vec:
        out = out[..., 0, :]
    if b_vec:
        out = out[..., 0]
    return out


def ref_softmax(X, axis=1):
    rows, _ = view2d(X, axis)
    out = []
    for row in rows:
        m = max(row)
        e = [math.exp(v - m) for v in row]
        s = sum(e)
        out.append([v / s for v in e])
    return np.array(out, dtype=np.float64).reshape(X.shape)


# --------------------------------------------------------------------------------------------- cases
X234, W5_12, b5 = f32(2, 3, 4), f32(5, 12), f32(5)
A34, B45 = f32(3, 4), f32(4, 5)
BIG = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], dtype=np.float32)
SOFT = f32(2, 3, 4, lo=-5, hi=5)
CASES = [
    # (id, op, inputs, args, reference, tolerance)
    ("fc", "FC", [X234, W5_12, b5], {}, lambda: ref_fc(X234, W5_12, b5), 1e-5),
    ("fc_axis2", "FC", [X234, f32(5, 4), b5], {"axis": 2}, None, 1e-5),
    ("fc_axis_neg", "FC", [X234, f32(5, 4), b5], {"axis": -1}, None, 1e-5),
    ("fc_axis0", "FC", [X234, f32(5, 24), b5], {"axis": 0}, None, 1e-5),
    ("fc_axis_w2", "FC", [X234, f32(5, 3, 4), b5], {"axis_w": 1}, None, 1e-5),
    ("fc_w3d_axis_w2", "FC", [X234, f32(5, 1, 12), b5], {"axis_w": 2, "axis": 1}, None, 1e-5),
    ("fc_f64", "FC", [X234.astype(np.float64), W5_12.astype(np.float64), b5.astype(np.float64)], {}, None,
     1e-12),
    ("fc_empty", "FC", [np.zeros((0, 12), np.float32), W5_12, b5], {}, None, 0),
    ("fc_k0", "FC", [np.zeros((4, 0), np.float32), np.zeros((5, 0), np.float32), b5], {},   # an empty sum: b
     lambda: ref_fc(np.zeros((4, 0), np.float32), np.zeros((5, 0), np.float32), b5), 0),
    ("fct", "FCTransposed", [X234, f32(12, 5), b5], {}, None, 1e-5),
    ("packed_fc", "PackedFC", [X234, W5_12, b5], {}, None, 1e-5),
    ("packed_fc_axis2", "PackedFC", [X234, f32(5, 4), b5], {"axis": 2}, None, 1e-5),
    ("fct_axis2", "FCTransposed", [X234, f32(4, 5), b5], {"axis": 2}, None, 1e-5),
    ("mm", "MatMul", [A34, B45], {}, None, 1e-5),
    ("mm_ta", "MatMul", [f32(4, 3), B45], {"trans_a": 1}, None, 1e-5),
    ("mm_tb", "MatMul", [A34, f32(5, 4)], {"trans_b": 1}, None, 1e-5),
    ("mm_tab", "MatMul", [f32(4, 3), f32(5, 4)], {"trans_a": 1, "trans_b": 1}, None, 1e-5),
    ("mm_axes", "MatMul", [f32(2, 3, 4), f32(3, 4, 5)], {"axis_a": 1, "axis_b": 2}, None, 1e-5),
    ("mm_like", "MatMul", [A34, B45, np.zeros((5, 3), np.float32)], {}, None, 1e-5),
    ("bmm_3d", "BatchMatMul", [f32(2, 3, 4), f32(2, 4, 5)], {}, None, 1e-5),
    ("bmm_2d", "BatchMatMul", [A34, B45], {}, None, 1e-5),
    ("bmm_4d_trans", "BatchMatMul", [f32(2, 2, 4, 3), f32(2, 2, 5, 4)], {"trans_a": 1, "trans_b": 1}, None,
     1e-5),
    ("bmm_suffix_bc", "BatchMatMul", [f32(2, 3, 3, 4), f32(3, 4, 5)], {"broadcast": 1}, None, 1e-5),
    ("bmm_ones_bc", "BatchMatMul", [f32(2, 1, 3, 4), f32(1, 3, 4, 2)], {"broadcast": 1}, None, 1e-5),
    ("bmm_2d_vs_3d", "BatchMatMul", [A34, f32(2, 4, 5)], {"broadcast": 1}, None, 1e-5),
    ("bmm_vec_vec", "BatchMatMul", [f32(4), f32(4)], {}, None, 1e-5),
    ("bmm_vec_mat", "BatchMatMul", [f32(4), f32(2, 4, 5)], {"broadcast": 1}, None, 1e-5),
    ("bmm_vec_mat_tb", "BatchMatMul", [f32(4), f32(2, 5, 4)], {"trans_b": 1, "broadcast": 1}, None, 1e-5),
    ("bmm_mat_vec", "BatchMatMul", [f32(2, 3, 4), f32(4)], {"broadcast": 1}, None, 1e-5),
    ("bmm_mat_vec_ta", "BatchMatMul", [f32(2, 4, 3), f32(4)], {"trans_a": 1, "broadcast": 1}, None, 1e-5),
    ("bmm_empty_batch", "BatchMatMul", [f32(0, 3, 4), f32(0, 4, 5)], {}, None, 0),
    ("softmax", "Softmax", [SOFT], {}, lambda: ref_softmax(SOFT, 1), 1e-6),
    ("softmax_axis2", "Softmax", [SOFT], {"axis": 2}, lambda: ref_softmax(SOFT, 2), 1e-6),
    ("softmax_axis_neg", "Softmax", [SOFT], {"axis": -1}, lambda: ref_softmax(SOFT, -1), 1e-6),
    ("softmax_axis0", "Softmax", [SOFT], {"axis": 0}, lambda: ref_softmax(SOFT, 0), 1e-6),
    ("softmax_big", "Softmax", [BIG], {}, lambda: ref_softmax(BIG, 1), 1e-6),
    ("softmax_f64", "Softmax", [SOFT.astype(np.float64)], {}, lambda: ref_softmax(SOFT, 1), 1e-12),
]
_REFS = {
    "FC": lambda ins, a: ref_fc(*ins, a.get("axis", 1), a.get("axis_w", 1)),
    "FCTransposed": lambda ins, a: ref_fc(*ins, a.get("axis", 1), a.get("axis_w", 1), transposed=True),
    "PackedFC": lambda ins, a: ref_fc(*ins, a.get("axis", 1)),
    "MatMul": lambda ins, a: (ref_matmul(ins[0], ins[1], **a).reshape(ins[2].shape) if len(ins) > 2
                              else ref_matmul(ins[0], ins[1], **a)),
    "BatchMatMul": lambda ins, a: ref_bmm(*ins, a.get("trans_a", 0), a.get("trans_b", 0)),
}


check = table_check(_REFS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, ref, tol = case
    check(op_type, inputs, args, ref, tol, device)


def test_softmax_rows_sum_to_one_and_survive_huge_inputs():
    x = np.array([[3.0e38, -3.0e38, 0.0, 1.0]], dtype=np.float32)
    y = run_op("Softmax", [x])
    assert np.isfinite(y).all() and y[0, 0] == 1.0 and y.sum() == pytest.approx(1.0)


# --------------------------------------------------------------------------------------------- bad input
BAD = [
    ("FC", [X234, f32(5, 11), b5], {}, ShapeError,
     r"X \(2, 3, 4\).*K = 2 x 12.*W \(5, 11\).*N = 5.*b \(5,\)"),
    ("FC", [X234, W5_12, f32(4)], {}, ShapeError, r"b must have N = 5"),
    ("FC", [X234, W5_12, f32(1, 5)], {}, ShapeError, r"b must be 1-D"),
    ("FC", [X234, W5_12, b5], {"axis": 3}, ArgumentError, r"axis=3 is out of range"),
    ("FC", [X234.astype(np.int32), W5_12, b5], {}, DTypeError, r"floating-point.*int32"),
    ("FC", [X234, W5_12.astype(np.float64), b5], {}, DTypeError, r"one dtype"),
    ("FCTransposed", [X234, W5_12, b5], {}, ShapeError, r"K x N"),
    ("PackedFC", [X234, f32(5, 3, 4), b5], {}, ShapeError, r"PackedFC: W must be 2-D"),
    ("PackedFC", [X234, f32(5, 11), b5], {}, ShapeError, r"K = 2 x 12"),
    ("MatMul", [A34, A34], {}, ShapeError, r"inner sizes must match"),
    ("MatMul", [A34, B45, np.zeros(7, np.float32)], {}, ShapeError, r"input 2"),
    ("BatchMatMul", [f32(2, 3, 4), f32(4, 5)], {}, ShapeError, r"differ; pass broadcast=1"),
    ("BatchMatMul", [f32(2, 3, 4), f32(1, 4, 5)], {}, ShapeError, r"differ; pass broadcast=1"),
    ("BatchMatMul", [f32(2, 3, 4), f32(3, 4, 5)], {"broadcast": 1}, ShapeError, r"do not broadcast"),
    ("BatchMatMul", [f32(2, 3, 4), f32(2, 3, 5)], {}, ShapeError, r"K = 4.*K = 3"),
    ("BatchMatMul", [f32(4), f32(5)], {}, ShapeError, r"same length"),
    ("Softmax", [np.ones((2, 3), np.int32)], {}, DTypeError, r"Softmax needs floating-point"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, pattern", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(op_type, inputs, args, error, pattern, device):
    with pytest.raises(error, match=pattern):
        run_op(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("op_type, inputs, args, error, pattern", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_caught_statically(op_type, inputs, args, error, pattern):
    """Every bad input is refused by the shape function too, with the kernel's error, before anything runs."""
    with pytest.raises(error, match=pattern):
        infer_static(op_type, inputs, **args)


@pytest.mark.parametrize("op_type, inputs, args", [("FC", [X234, W5_12, b5], {}), ("Softmax", [SOFT], {}),
                                                   ("BatchMatMul", [A34, B45], {})])
def test_in_place_refused_where_caffe2_refuses(op_type, inputs, args):
    names = {f"in{i}": v for i, v in enumerate(inputs)}
    with pytest.raises(ArgumentError, match="in place"):
        run_op(op_type, names, ["in0"], **args)


# --------------------------------------------------------------------------------------------- the tester
@pytest.mark.parametrize("wrong, case", [
    # FC without the bias, FC with W used untransposed in the wrong order, Softmax without the shift's
    # normalisation, BatchMatMul ignoring trans_b: each must fail the same comparison the table uses.
    (lambda xp, X, W, b, **a: (X.reshape(2, 12) @ W.T), ("FC", [X234, W5_12, b5], {}, None, 1e-5)),
    (lambda xp, X, W, b, **a: X.reshape(2, 12) @ W.reshape(12, 5) + b, ("FC", [X234, W5_12, b5], {}, None, 1e-5)),
    (lambda xp, X, W, b, **a: X.reshape(2, 12) @ W.T - b, ("PackedFC", [X234, W5_12, b5], {}, None, 1e-5)),
    (lambda xp, X, **a: xp.exp(X - X.max()), ("Softmax", [SOFT], {}, lambda: ref_softmax(SOFT, 1), 1e-6)),
    (lambda xp, A, B, **a: xp.matmul(A, xp.swapaxes(B, -1, -2)),
     ("BatchMatMul", [f32(2, 3, 4), f32(2, 4, 4)], {}, None, 1e-5)),
], ids=["FC-no-bias", "FC-untransposed-W", "PackedFC-subtracts-b", "Softmax-unnormalised",
        "BatchMatMul-ignores-trans_b"])
def test_reference_catches_broken_kernels(wrong, case, broken):
    check(*case, device="cpu")
    broken(case[0], wrong)
    with pytest.raises(AssertionError):
        check(*case, device="cpu")


@pytest.mark.parametrize("op_type, n", [("FC", 3), ("Softmax", 1), ("MatMul", 2)])
def test_a_blob_holding_no_tensor_is_a_clean_error(op_type, n):
    """An input blob holding another object (a common world, a db cursor: a hostile plan can wire one in) is
    named in a DTypeError, not an AttributeError deep in the kernel."""
    from stepnet.io.proto import NetDef
    from stepnet.testing import make_op
    from stepnet.runtime.workspace import Workspace

    ws = Workspace()
    names = [f"in{i}" for i in range(n)]
    for name in names[:-1]:
        ws.feed(name, np.ones((2, 2), np.float32))
    ws.create_blob(names[-1]).value = object()
    net = NetDef(name="holder")
    net.op.append(make_op(op_type, names, ["out"]))
    with pytest.raises(DTypeError, match=rf"op #0 \({op_type}\).*is a object, not a tensor"):
        ws.create_net(net).run()
