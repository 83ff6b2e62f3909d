"""Gradients of FC, FCTransposed, MatMul, BatchMatMul and Softmax: float64 finite differences on every device,
the emitted ops against Caffe2's makers, the gradient kernels (WeightedSumGradient and
ElementwiseLinearGradient included) against loop references, a whole-net check, and tests that a broken
gradient is caught. The sums' gradients and makers are tested in test_sums.py."""
import math

import numpy as np
import pytest

from stepnet.core.errors import ArityError, ShapeError
from stepnet.passes.gradients import GradientError, add_gradient_ops, backward_ops
from stepnet.io.proto import DeviceOption, NetDef, argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op
from stepnet.runtime.workspace import Workspace

rng = np.random.default_rng(5)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


# ----------------------------------------------------------------------------------------- finite differences
GRAD_CASES = [
    ("FC", [f32(3, 4), f32(5, 4), f32(5)], {}),
    ("FC", [f32(2, 3, 4), f32(5, 4), f32(5)], {"axis": 2}),
    ("FC", [f32(2, 3, 2), f32(5, 6), f32(5)], {"axis": 1}),
    ("FC", [f32(2, 3, 4), f32(5, 1, 4), f32(5)], {"axis": -1, "axis_w": 2}),
    ("FCTransposed", [f32(3, 4), f32(4, 5), f32(5)], {}),
    ("FCTransposed", [f32(2, 3, 4), f32(2, 2, 5), f32(5)], {"axis": 2, "axis_w": 2}),
    ("Softmax", [f32(3, 4)], {}),
    ("Softmax", [f32(2, 3, 4)], {"axis": 2}),
    ("Softmax", [f32(2, 2, 3)], {"axis": 1}),
    ("MatMul", [f32(3, 4), f32(4, 2)], {}),
    ("MatMul", [f32(4, 3), f32(4, 2)], {"trans_a": 1}),
    ("MatMul", [f32(3, 4), f32(2, 4)], {"trans_b": 1}),
    ("MatMul", [f32(4, 3), f32(2, 4)], {"trans_a": 1, "trans_b": 1}),
    ("MatMul", [f32(2, 3, 4), f32(4, 2)], {"axis_a": 2}),
    ("MatMul", [f32(2, 3, 2), f32(3, 1, 2, 3)], {"axis_a": 2, "axis_b": 2, "trans_a": 1, "trans_b": 1}),
    ("MatMul", [f32(2, 2, 3), f32(3, 4)], {"axis_a": 2, "trans_a": 1, "trans_b": 1}),
    ("BatchMatMul", [f32(2, 3, 4), f32(2, 4, 2)], {}),
    ("BatchMatMul", [f32(2, 4, 3), f32(2, 4, 2)], {"trans_a": 1}),
    ("BatchMatMul", [f32(2, 3, 4), f32(2, 2, 4)], {"trans_b": 1}),
    ("BatchMatMul", [f32(2, 1, 4, 3), f32(2, 1, 2, 4)], {"trans_a": 1, "trans_b": 1}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args", GRAD_CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_gradient_matches_finite_differences(op_type, inputs, args, device):
    check_gradient(op_type, inputs, device=device, **args)


# ------------------------------------------------------------------------------------------------ emitted ops
def test_fc_emits_caffe2s_fc_gradient_with_args_and_device_copied():
    fwd = make_op("FC", ["X", "W", "b"], ["Y"], device="emulated", axis=2, axis_w=1)
    fwd.engine = "CUDNN"
    ops, grads = backward_ops([fwd], {"Y": "Y_grad"})
    assert sig(ops) == [("FCGradient", ["X", "W", "Y_grad"], ["W_grad", "b_grad", "X_grad"],
                         {"axis": 2, "axis_w": 1})]
    assert ops[0].is_gradient_op and ops[0].engine == "CUDNN"
    assert ops[0].device_option == fwd.device_option
    assert grads == {"Y": "Y_grad", "X": "X_grad", "W": "W_grad", "b": "b_grad"}
    ops, _ = backward_ops([make_op("FCTransposed", ["X", "W", "b"], ["Y"])], {"Y": "g"})
    assert sig(ops) == [("FCTransposedGradient", ["X", "W", "g"], ["W_grad", "b_grad", "X_grad"], {})]


def test_softmax_emits_softmax_gradient_of_the_output():
    ops, grads = backward_ops([make_op("Softmax", ["X"], ["Y"], axis=2)], {"Y": "Y_grad"})
    assert sig(ops) == [("SoftmaxGradient", ["Y", "Y_grad"], ["X_grad"], {"axis": 2})]
    assert grads["X"] == "X_grad"


# (trans_a, trans_b) -> the two MatMul ops of Caffe2's GetMatMulGradient (axis_a=2, axis_b=3 forward)
MATMUL_GRADS = {
    (0, 0): [(["G", "B", "A"], "A_grad", {"trans_b": 1, "axis_b": 3}),
             (["A", "G", "B"], "B_grad", {"trans_a": 1, "axis_a": 2})],
    (1, 0): [(["B", "G", "A"], "A_grad", {"trans_b": 1, "axis_a": 3}),
             (["A", "G", "B"], "B_grad", {"axis_a": 2})],
    (0, 1): [(["G", "B", "A"], "A_grad", {"axis_b": 3}),
             (["G", "A", "B"], "B_grad", {"trans_a": 1, "axis_b": 2})],
    (1, 1): [(["B", "G", "A"], "A_grad", {"trans_a": 1, "trans_b": 1, "axis_a": 3}),
             (["G", "A", "B"], "B_grad", {"trans_a": 1, "trans_b": 1, "axis_b": 2})],
}


@pytest.mark.parametrize("trans", sorted(MATMUL_GRADS))
def test_matmul_emits_caffe2s_two_matmuls_without_copying_args(trans):
    fwd = make_op("MatMul", ["A", "B"], ["Y"], trans_a=trans[0], trans_b=trans[1], axis_a=2, axis_b=3)
    ops, _ = backward_ops([fwd], {"Y": "G"})
    want = [("MatMul", ins, [out], args) for ins, out, args in MATMUL_GRADS[trans]]
    assert sig(ops) == want
    assert [list(a.name for a in o.arg) for o in ops] == [list(w[3]) for w in want]  # Caffe2's argument order


@pytest.mark.parametrize("trans, want", [
    ((0, 0), [(["G", "B"], "A_grad", {"trans_b": 1}), (["A", "G"], "B_grad", {"trans_a": 1})]),
    ((1, 0), [(["B", "G"], "A_grad", {"trans_b": 1}), (["A", "G"], "B_grad", {})]),
    ((0, 1), [(["G", "B"], "A_grad", {}), (["G", "A"], "B_grad", {"trans_a": 1})]),
    ((1, 1), [(["B", "G"], "A_grad", {"trans_a": 1, "trans_b": 1}),
              (["G", "A"], "B_grad", {"trans_a": 1, "trans_b": 1})]),
])
def test_batch_matmul_emits_caffe2s_two_batch_matmuls(trans, want):
    fwd = make_op("BatchMatMul", ["A", "B"], ["Y"], trans_a=trans[0], trans_b=trans[1], use_scratch=1)
    ops, _ = backward_ops([fwd], {"Y": "G"})
    assert sig(ops) == [("BatchMatMul", ins, [out], args) for ins, out, args in want]


def test_batch_matmul_gradient_refuses_broadcast_like_caffe2():
    with pytest.raises(GradientError, match="broadcast=1"):
        backward_ops([make_op("BatchMatMul", ["A", "B"], ["Y"], broadcast=1)], {"Y": "G"})


# ------------------------------------------------------------------------------------------- gradient kernels
def rows_of(x, axis):
    """x as a list of rows (Python floats) of its 2-D view at axis."""
    a = axis % x.ndim
    n = math.prod(x.shape[:a])
    flat = [float(v) for v in x.reshape(-1)]
    cols = len(flat) // n if n else 0
    return [flat[r * cols:(r + 1) * cols] for r in range(n)]


def ref_fc_gradient(X, W, dY, axis=1, axis_w=1, transposed=False):
    x, g, w = rows_of(X, axis), rows_of(dY, -1), rows_of(W, axis_w)
    M, K, N = len(x), math.prod(X.shape[axis % X.ndim:]), dY.shape[-1]
    wk = (lambda n, k: w[k][n]) if transposed else (lambda n, k: w[n][k])   # W[n, k] of Y = X·Wᵀ
    dw = [[sum(g[m][n] * x[m][k] for m in range(M)) for k in range(K)] for n in range(N)]
    if transposed:
        dw = [[dw[n][k] for n in range(N)] for k in range(K)]
    db = [sum(g[m][n] for m in range(M)) for n in range(N)]
    dx = [[sum(g[m][n] * wk(n, k) for n in range(N)) for k in range(K)] for m in range(M)]
    return np.array(dw).reshape(W.shape), np.array(db), np.array(dx).reshape(X.shape)


def ref_softmax_gradient(Y, dY, axis=1):
    """dX = Jᵀ·dY row by row, with the softmax Jacobian J[i][j] = y_i (δ_ij − y_j)."""
    out = []
    for y, g in zip(rows_of(Y, axis), rows_of(dY, axis), strict=True):
        out.append([sum(g[i] * y[i] * ((i == j) - y[j]) for i in range(len(y))) for j in range(len(y))])
    return np.array(out).reshape(Y.shape)


def softmax_rows(X, axis):
    out = []
    for r in rows_of(X, axis):
        e = [math.exp(v - max(r)) for v in r]
        out.append([v / sum(e) for v in e])
    return np.array(out, dtype=np.float32).reshape(X.shape)


def check(got, want, tol=1e-5):
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-4, atol=tol)


FC_KERNEL_CASES = [((3, 4), (5, 4), {}), ((2, 3, 4), (5, 4), {"axis": 2}),
                   ((2, 3, 4), (5, 1, 12), {"axis_w": 2}), ((0, 4), (5, 4), {})]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("xs, ws, args", FC_KERNEL_CASES)
def test_fc_gradient_kernel_against_loops(xs, ws, args, device):
    X, W = f32(*xs), f32(*ws)
    M = math.prod(xs[:args.get("axis", 1) % len(xs)])
    dY = f32(M, 5)
    got = run_op("FCGradient", [X, W, dY], 3, device=device, **args)
    for g, w in zip(got, ref_fc_gradient(X, W, dY, **args), strict=True):
        assert g.dtype == np.float32
        check(g, w)
    dW, db = run_op("FCGradient", [X, W, dY], 2, device=device, **args)  # dX is optional
    check(dW, ref_fc_gradient(X, W, dY, **args)[0])
    check(db, ref_fc_gradient(X, W, dY, **args)[1])


@pytest.mark.parametrize("device", DEVICES)
def test_fc_transposed_gradient_kernel_against_loops(device):
    X, W, dY = f32(2, 3, 4), f32(4, 5), f32(6, 5)
    got = run_op("FCTransposedGradient", [X, W, dY], 3, device=device, axis=2)
    for g, w in zip(got, ref_fc_gradient(X, W, dY, axis=2, transposed=True), strict=True):
        check(g, w)
    with pytest.raises(ShapeError, match=r"K = 12 columns, but W \(4, 5\)"):
        run_op("FCTransposedGradient", [X, W, dY], 3, device=device, axis=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, axis", [((3, 4), 1), ((2, 3, 4), 2), ((2, 3, 4), 1), ((1, 1), 1)])
def test_softmax_gradient_kernel_against_the_jacobian(shape, axis, device):
    Y, dY = softmax_rows(f32(*shape), axis), f32(*shape)
    check(run_op("SoftmaxGradient", [Y, dY], device=device, axis=axis), ref_softmax_gradient(Y, dY, axis))


@pytest.mark.parametrize("device", DEVICES)
def test_weighted_sum_gradient_kernel_against_loops(device):
    dY, x0, x1 = f32(2, 3), f32(2, 3), f32(6)
    w0, w1 = np.array([0.5], np.float32), np.array([-2.0], np.float32)
    dx0, dx1, dw0, dw1 = run_op("WeightedSumGradient", [dY, x0, w0, x1, w1], 4, device=device, grad_on_w=1)
    g = [float(v) for v in dY.reshape(-1)]
    check(dx0, np.array([0.5 * v for v in g]).reshape(2, 3))
    check(dx1, np.array([-2.0 * v for v in g]))
    check(dw0, np.array([sum(a * float(b) for a, b in zip(g, x0.reshape(-1), strict=True))]))
    check(dw1, np.array([sum(a * float(b) for a, b in zip(g, x1, strict=True))]))
    dx0, dx1 = run_op("WeightedSumGradient", [dY, x0, w0, x1, w1], 2, device=device)
    check(dx1, np.array([-2.0 * v for v in g]))
    with pytest.raises(ArityError, match="writes 4 outputs, got 2"):
        run_op("WeightedSumGradient", [dY, x0, w0, x1, w1], 2, device=device, grad_on_w=1)


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_linear_gradient_kernel_against_loops(device):
    dY, X, a = f32(2, 2, 3), f32(2, 2, 3), f32(6)
    dX, da, db = run_op("ElementwiseLinearGradient", [dY, X, a], 3, device=device, axis=1)
    g, x = rows_of(dY, 1), rows_of(X, 1)
    check(dX, np.array([[g[n][d] * float(a[d]) for d in range(6)] for n in range(2)]).reshape(2, 2, 3))
    check(da, np.array([sum(g[n][d] * x[n][d] for n in range(2)) for d in range(6)]))
    check(db, np.array([sum(g[n][d] for n in range(2)) for d in range(6)]))


def test_gradient_kernels_reject_mismatched_inputs():
    with pytest.raises(ShapeError, match=r"dY \(4, 5\) must hold M x N = 3 x 5"):
        run_op("FCGradient", [f32(3, 4), f32(5, 4), f32(4, 5)], 3)
    with pytest.raises(ShapeError, match="one shape"):
        run_op("SoftmaxGradient", [f32(3, 4), f32(4, 3)])
    with pytest.raises(ShapeError, match="length 4"):
        run_op("ElementwiseLinearGradient", [f32(3, 4), f32(3, 4), f32(3)], 3)
    with pytest.raises(ShapeError, match="1 element"):
        run_op("WeightedSumGradient", [f32(3), f32(3), f32(2)], 1)


# ------------------------------------------------------------------------------------------------ a whole net
def mlp_net(device):
    """loss = mean((Gᵀ·G) / 2) with G = zᵀ·p, z = FC(p), p = Softmax(FC(X)): p and G are each read twice."""
    net = NetDef(name="mlp")
    for op in (make_op("FC", ["X", "W1", "b1"], ["a"]), make_op("Softmax", ["a"], ["p"]),
               make_op("FC", ["p", "W2", "b2"], ["z"]), make_op("MatMul", ["z", "p"], ["G"], trans_a=1),
               make_op("MatMul", ["G", "G"], ["GG"], trans_b=1), make_op("Scale", ["GG"], ["h"], scale=0.5),
               make_op("SumElements", ["h"], ["loss"], average=1)):
        net.op.add().CopyFrom(op)
    if device != "cpu":
        net.device_option.CopyFrom(DeviceOption(device_type=1))
    return net


MLP_PARAMS = {"X": rng.standard_normal((4, 3)), "W1": rng.standard_normal((5, 3)),
              "b1": rng.standard_normal(5), "W2": rng.standard_normal((2, 5)), "b2": rng.standard_normal(2)}


def run_mlp(values, device, with_gradients=False):
    ws = Workspace(gpu="emulate" if device != "cpu" else None)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, v in values.items():
        ws.feed(name, v, device_option=do)
    net = mlp_net(device)
    grads = add_gradient_ops(net, ["loss"]) if with_gradients else {}
    ws.run_net_once(net)
    return ws, grads


def check_net_against_finite_differences(device, eps=1e-6):
    ws, grads = run_mlp(MLP_PARAMS, device, with_gradients=True)
    for name, x in MLP_PARAMS.items():
        analytic = ws.fetch(grads[name])
        assert analytic.shape == x.shape and analytic.dtype == np.float64
        numeric = np.zeros_like(x)
        for k in range(x.size):
            d = np.zeros(x.size)
            d[k] = eps
            plus = run_mlp(dict(MLP_PARAMS, **{name: x + d.reshape(x.shape)}), device)[0].fetch("loss")
            minus = run_mlp(dict(MLP_PARAMS, **{name: x - d.reshape(x.shape)}), device)[0].fetch("loss")
            numeric.reshape(-1)[k] = (float(plus) - float(minus)) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-8, err_msg=f"gradient of {name}")


@pytest.mark.parametrize("device", DEVICES)
def test_whole_net_gradients_match_finite_differences(device):
    check_net_against_finite_differences(device)
    _, grads = run_mlp(MLP_PARAMS, device, with_gradients=True)
    assert grads["p"] == "p_grad" and grads["z"] == "z_grad"


def test_whole_net_emits_sums_for_blobs_read_twice():
    net = mlp_net("cpu")
    add_gradient_ops(net, ["loss"])
    sums = [(list(o.input), list(o.output)) for o in net.op if o.type == "Sum"]
    assert (["G_grad", "_G_grad_autosplit_0"], ["G_grad"]) in sums
    assert any(out == ["p_grad"] and "p_grad" in ins for ins, out in sums)


# ------------------------------------------------------------------------------------------------- the tester
def test_check_gradient_and_the_net_check_catch_a_wrong_softmax_gradient(broken):
    def wrong(xp, Y, dY, axis=1):
        return dY * Y   # forgets the row sum
    broken("SoftmaxGradient", wrong)
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("Softmax", [f32(3, 4)])
    with pytest.raises(AssertionError, match="gradient of"):
        check_net_against_finite_differences("cpu")


def test_check_gradient_catches_a_transposed_fc_weight_gradient(broken):
    from stepnet.ops.math_grad import fc_gradient

    def wrong(ctx, xp, X, W, dY, **args):
        dW, db, dX = fc_gradient(ctx, xp, X, W, dY, **args)
        return dW[::-1].copy(), db, dX   # rows of dW in the wrong order
    broken("FCGradient", wrong)
    with pytest.raises(AssertionError, match="gradient of input 1"):
        check_gradient("FC", [f32(3, 4), f32(5, 4), f32(5)])
