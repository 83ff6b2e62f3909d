"""RowMul and ReduceTailSum (stepnet/ops/row_mul.py) against loops written from Caffe2's docs on every device;
RowMul's gradient against float64 finite differences and the three ops Caffe2's maker emits; bad inputs; a
broken kernel caught."""
import numpy as np
import pytest

from stepnet.core.errors import DTypeError, GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, check_gradient, infer_static, make_op, run_op

rng = np.random.default_rng(11)


def row_mul_ref(mat, w):
    out = np.empty(mat.shape, np.float64)
    for i in range(mat.shape[0]):
        out[i] = mat[i] * float(w.reshape(-1)[i])
    return out


def tail_sum_ref(mat):
    return np.array([sum(float(v) for v in mat[i].reshape(-1)) for i in range(mat.shape[0])])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (3,), (0, 2)])
def test_row_mul_and_tail_sum(shape, device):
    mat = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[0]).astype(np.float32)
    got = run_op("RowMul", [mat, w], device=device)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, row_mul_ref(mat, w), rtol=1e-6)
    sums = run_op("ReduceTailSum", [mat], device=device)
    assert sums.shape == (shape[0],)
    np.testing.assert_allclose(sums, tail_sum_ref(mat), rtol=1e-5, atol=1e-6)


def test_row_mul_by_hand_and_w_of_any_shape():
    mat = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(run_op("RowMul", [mat, np.array([[2.0], [-1.0]], np.float32)]),
                                  [[2.0, 4.0], [-3.0, -4.0]])
    np.testing.assert_array_equal(run_op("ReduceTailSum", [mat]), [3.0, 7.0])


def test_row_mul_gradient_and_the_ops_caffe2_emits():
    mat, w = rng.standard_normal((3, 4)), rng.standard_normal(3)
    check_gradient("RowMul", [mat, w])
    ops, _ = backward_ops([make_op("RowMul", ["m", "w"], ["y"])], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("RowMul", ["y_grad", "w"], ["m_grad"]), ("Mul", ["y_grad", "m"], ["w_gradbefore_aggregate"]),
        ("ReduceTailSum", ["w_gradbefore_aggregate"], ["w_grad"])]
    with pytest.raises(GradientError, match="in place"):
        backward_ops([make_op("RowMul", ["m", "w"], ["m"])], {"m": "m_grad"})


def test_row_mul_bad_inputs_are_refused_statically_too():
    mat = np.ones((3, 2), np.float32)
    with pytest.raises(ShapeError, match=r"w has 2 elements \(2,\) but mat \(3, 2\) has 3 rows"):
        run_op("RowMul", [mat, np.ones(2, np.float32)])
    with pytest.raises(ShapeError, match=r"w has 2 elements"):
        infer_static("RowMul", [mat, np.ones(2, np.float32)])
    with pytest.raises(DTypeError, match="float"):
        run_op("RowMul", [mat.astype(np.int32), np.ones(3, np.int32)])
    with pytest.raises(DTypeError, match="one dtype"):
        run_op("RowMul", [mat, np.ones(3, np.float64)])
    with pytest.raises(ShapeError, match="at least 1 dim"):
        run_op("ReduceTailSum", [np.float32(1.0)])


def test_checker_catches_a_broken_row_mul(broken):
    mat, w = rng.standard_normal((3, 2)), rng.standard_normal(3)
    broken("ReduceTailSum", lambda xp, m: m.reshape(m.shape[0], -1)[:, 0].copy())   # first column only
    with pytest.raises(AssertionError, match="gradient of input 1"):
        check_gradient("RowMul", [mat, w])
