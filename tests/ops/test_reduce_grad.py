"""Gradients of the reductions (Reduce*, ReduceFront*/ReduceBack* with and without lengths, SumElements,
RowwiseMax/ColwiseMax): float64 finite differences on every device, the gradient kernels against loop
references (ties, zeros, lengths, the legacy shape input), the emitted ops, and a broken kernel caught."""
import itertools
import math

import numpy as np
import pytest

from stepnet.core.errors import ShapeError
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(9)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def off_zero(*shape):
    """Values with |x| >= 0.1, away from the kink of |x|."""
    x = rng.standard_normal(shape)
    return (np.sign(x) * (0.1 + np.abs(x))).astype(np.float32)


def i32(*values):
    return np.array(values, dtype=np.int32)


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


# ----------------------------------------------------------------------------------------- finite differences
REDUCE_TYPES = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2"]
AXES = [([], 1), ([], 0), ([1], 0), ([0, 2], 1), ([-1], 0), ([2, 0, 2], 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axes, keepdims", AXES)
@pytest.mark.parametrize("op_type", REDUCE_TYPES)
def test_reduce_gradients_match_finite_differences(op_type, axes, keepdims, device):
    check_gradient(op_type, [off_zero(2, 3, 4)], axes=axes, keepdims=keepdims, device=device, directions=3)


FRONT_BACK = ["ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean", "ReduceFrontMax",
              "ReduceBackMax"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("op_type", FRONT_BACK)
def test_front_back_gradients_match_finite_differences(op_type, n, device):
    check_gradient(op_type, [f32(2, 3, 2)], num_reduce_dim=n, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", FRONT_BACK)
def test_front_back_gradients_with_lengths_match_finite_differences(op_type, device):
    lengths = i32(1, 3, 2, 3) if "Front" in op_type else i32(4, 1, 2)   # X is 3 x 4
    check_gradient(op_type, [f32(3, 4), lengths], wrt=[0], device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, args", [("SumElements", {}), ("SumElements", {"average": 1}),
                                           ("RowwiseMax", {}), ("ColwiseMax", {})])
def test_scalar_and_3d_gradients_match_finite_differences(op_type, args, device):
    check_gradient(op_type, [f32(2, 3, 4)], device=device, **args)


# ------------------------------------------------------------------------------------------------- references
def cells(shape):
    return list(itertools.product(*(range(d) for d in shape)))


def kept_index(idx, axes):
    return tuple(0 if k in axes else i for k, i in enumerate(idx))


def ref_reduce_gradient(kind, dY, X, Y, axes):
    """dX[idx] from the reduced cell idx falls into (axes canonical, all when empty)."""
    axes = set(a % X.ndim for a in axes) if axes else set(range(X.ndim))
    kept = tuple(1 if k in axes else d for k, d in enumerate(X.shape))
    g, y = dY.reshape(kept), Y.reshape(kept)
    count = math.prod(X.shape[k] for k in axes)
    out = np.zeros(X.shape)
    for idx in cells(X.shape):
        c, x = kept_index(idx, axes), float(X[idx])
        gc, yc = float(g[c]), float(y[c])
        if kind == "ReduceSum":
            out[idx] = gc
        elif kind == "ReduceMean":
            out[idx] = gc / count
        elif kind in ("ReduceMax", "ReduceMin"):
            out[idx] = gc if x == yc else 0.0
        elif kind == "ReduceL1":
            out[idx] = gc if x > 1e-12 else -gc if x < -1e-12 else 0.0
        else:
            out[idx] = gc if yc < 1e-12 else gc * x / yc
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", REDUCE_TYPES)
@pytest.mark.parametrize("axes, keepdims", [([1], 0), ([0, 2], 1), ([], 0)])
def test_reduce_gradient_kernels_with_ties_and_zeros(op_type, axes, keepdims, device):
    X = f32(2, 3, 4)
    X[0, :, 1] = 0.0                       # a zero norm along axis 1 and exact zeros for L1
    X[1, 0, 0] = X[1, 2, 0] = 5.0          # a tie for the max
    X[0, 1, 2] = X[0, 2, 2] = -5.0         # a tie for the min
    X[1, 1, 3] = 1e-13                     # inside L1's dead zone
    Y = run_op(op_type, [X], device=device, axes=axes, keepdims=keepdims)
    dY = f32(*Y.shape)
    got = run_op(op_type + "Gradient", [dY, X, Y], device=device, axes=axes, keepdims=keepdims)
    assert got.dtype == np.float32 and got.shape == X.shape
    np.testing.assert_allclose(got, ref_reduce_gradient(op_type, dY, X, Y, axes), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_sum_gradient_keeps_integer_types(device):
    X = np.arange(6, dtype=np.int32).reshape(2, 3)
    got = run_op("ReduceSumGradient", [i32(4, -2), X, i32(3, 12)], device=device, axes=[1], keepdims=0)
    assert got.dtype == np.int32
    assert got.tolist() == [[4, 4, 4], [-2, -2, -2]]


def ref_front_back_gradient(kind, front, dY, X, Y, lengths, n=1):
    shape = X.shape
    split = n if front else len(shape) - n
    rows, cols = math.prod(shape[:split]), math.prod(shape[split:])
    x, out = X.reshape(rows, cols), np.zeros((rows, cols))
    g, y = dY.reshape(-1), (None if Y is None else Y.reshape(-1))
    for r in range(rows):
        for c in range(cols):
            j, pos = (c, r) if front else (r, c)           # reduced vector j, position pos within it
            size = rows if front else cols
            length = size if lengths is None else int(lengths[j])
            if pos >= length:
                continue
            if kind == "sum":
                out[r, c] = g[j]
            elif kind == "mean":
                out[r, c] = g[j] / length
            else:
                out[r, c] = g[j] if float(x[r, c]) == float(y[j]) else 0.0
    return out.reshape(shape)


FB_CASES = [("ReduceFrontSum", True, "sum"), ("ReduceBackSum", False, "sum"),
            ("ReduceFrontMean", True, "mean"), ("ReduceBackMean", False, "mean"),
            ("ReduceFrontMax", True, "max"), ("ReduceBackMax", False, "max")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, front, kind", FB_CASES)
def test_front_back_gradient_kernels_with_lengths(op_type, front, kind, device):
    X = f32(3, 4)
    X[0, 0] = X[2, 0] = X[0, 3] = 9.0          # max ties: column 0 (front) and row 0 (back)
    lengths = i32(3, 0, 2, 1) if front else i32(4, 0, 3)
    # an entry past its vector's length that equals the vector's max must still get no gradient
    if front:
        X[2, 2] = X[:2, 2].max()
    else:
        X[2, 3] = X[2, :3].max()
    ins = [X, lengths]
    Y = run_op(op_type, ins, device=device)
    dY = f32(*Y.shape)
    grad_ins = [dY, X, Y, lengths] if kind == "max" else [dY, X, lengths]
    got = run_op(op_type + "Gradient", grad_ins, device=device)
    want = ref_front_back_gradient(kind, front, dY, X, Y if kind == "max" else None, lengths)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, front, kind", [c for c in FB_CASES if c[2] != "max"])
def test_front_back_gradient_reads_an_int64_shape_as_input_1(op_type, front, kind, device):
    """The older Caffe2 form: input 1 is X's shape (1-D int64), not X."""
    X = f32(2, 3, 2)
    Y = run_op(op_type, [X], device=device, num_reduce_dim=2)
    dY = f32(*Y.shape)
    shape = np.array(X.shape, np.int64)
    from_shape = run_op(op_type + "Gradient", [dY, shape], device=device, num_reduce_dim=2)
    from_x = run_op(op_type + "Gradient", [dY, X], device=device, num_reduce_dim=2)
    np.testing.assert_array_equal(from_shape, from_x)
    np.testing.assert_allclose(from_x, ref_front_back_gradient(kind, front, dY, X, None, None, 2), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_sum_elements_and_rowwise_colwise_max_gradient_kernels(device):
    X = f32(2, 3, 4)
    got = run_op("SumElementsGradient", [X, np.array(3.0, np.float32)], device=device, average=1)
    np.testing.assert_allclose(got, np.full(X.shape, 3.0 / 24), rtol=1e-6)
    X[1, 2, 1] = X[1, 2, 3] = 7.0            # a tie in row (1, 2) and none elsewhere at 7
    for op_type, axis in (("RowwiseMax", 2), ("ColwiseMax", 1)):
        Y = run_op(op_type, [X], device=device)
        dY = f32(*Y.shape)
        got = run_op(op_type + "Gradient", [X, Y, dY], device=device)
        want = np.zeros(X.shape)
        for idx in cells(X.shape):
            red = idx[:axis] + idx[axis + 1:]
            want[idx] = dY[red] if X[idx] == Y[red] else 0.0
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_gradient_kernels_reject_mismatched_sizes():
    X = f32(2, 3)
    with pytest.raises(ShapeError, match=r"dY \(3,\) must hold 2 elements"):
        run_op("ReduceSumGradient", [f32(3), X, f32(2)], axes=[1], keepdims=0)
    with pytest.raises(ShapeError, match="one entry per reduced vector"):
        run_op("ReduceBackSumGradient", [f32(2), X, i32(1, 2, 3)])
    with pytest.raises(ShapeError, match=r"dY \(2,\) must hold 3 elements"):
        run_op("ReduceFrontMaxGradient", [f32(2), X, f32(3)])
    with pytest.raises(ShapeError, match="1 elements"):
        run_op("SumElementsGradient", [X, f32(2)])


# ------------------------------------------------------------------------------------------------ emitted ops
def test_reductions_emit_caffe2s_gradient_ops():
    cases = [
        (make_op("ReduceL2", ["X"], ["Y"], axes=[0, 2], keepdims=0),
         [("ReduceL2Gradient", ["g", "X", "Y"], ["X_grad"], {"axes": [0, 2], "keepdims": 0})]),
        (make_op("ReduceFrontSum", ["X", "len"], ["Y"], num_reduce_dim=1),
         [("ReduceFrontSumGradient", ["g", "X", "len"], ["X_grad"], {"num_reduce_dim": 1})]),
        (make_op("ReduceBackMean", ["X"], ["Y"]), [("ReduceBackMeanGradient", ["g", "X"], ["X_grad"], {})]),
        (make_op("ReduceBackMax", ["X", "len"], ["Y"]),
         [("ReduceBackMaxGradient", ["g", "X", "Y", "len"], ["X_grad"], {})]),
        (make_op("SumElements", ["X"], ["Y"], average=1),
         [("SumElementsGradient", ["X", "g"], ["X_grad"], {"average": 1})]),
        (make_op("RowwiseMax", ["X"], ["Y"]), [("RowwiseMaxGradient", ["X", "Y", "g"], ["X_grad"], {})]),
        (make_op("ColwiseMax", ["X"], ["Y"]), [("ColwiseMaxGradient", ["X", "Y", "g"], ["X_grad"], {})]),
    ]
    for fwd, want in cases:
        ops, grads = backward_ops([fwd], {"Y": "g"})
        assert sig(ops) == want
        assert "len" not in grads and all(o.is_gradient_op for o in ops)


def test_sum_sqr_elements_and_sum_elements_int_have_no_gradient():
    with pytest.raises(GradientError, match="no gradient registered"):
        backward_ops([make_op("SumSqrElements", ["X"], ["Y"])], {"Y": "g"})
    with pytest.raises(GradientError, match="registered as not differentiable"):
        backward_ops([make_op("SumElementsInt", ["X"], ["Y"])], {"Y": "g"})


# ------------------------------------------------------------------------------------------------- the tester
def test_check_gradient_catches_a_mean_gradient_that_forgets_to_divide(broken):
    def wrong(xp, dY, X, Y, axes=(), keepdims=1, allow_broadcast_fastpath=False):
        return run_op("ReduceSumGradient", [dY, X, Y], axes=axes, keepdims=keepdims)
    broken("ReduceMeanGradient", wrong)
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("ReduceMean", [f32(2, 3)], axes=[1])


def test_the_reference_catches_a_max_gradient_that_ignores_lengths(broken):
    grad = REGISTRY.get("ReduceFrontMaxGradient").kernel

    def wrong(xp, dY, X, Y, *lengths, num_reduce_dim=1):
        return grad(xp, dY, X, Y, num_reduce_dim=num_reduce_dim)
    broken("ReduceFrontMaxGradient", wrong)
    with pytest.raises(AssertionError):
        test_front_back_gradient_kernels_with_lengths("ReduceFrontMax", True, "max", "cpu")
