"""Unique (stepnet/ops/unique.py) against Python's set on every device: the distinct values, the remapping
that gives the input back, the shapes inference knows (Caffe2's: only for 0 or 1 values, unless the value is
known); bad inputs; a broken kernel caught."""
import numpy as np
import pytest

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op


def check_unique(x, unique, remapping):
    assert unique.dtype == x.dtype and remapping.dtype == np.int32 and remapping.shape == x.shape
    assert unique.tolist() == sorted(set(x.tolist()))
    assert [unique[r] for r in remapping.tolist()] == x.tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("values", [[3, 1, 3, 0, 7, 1, 1], [5], [], [-2, 9, -2]])
def test_unique_and_remapping(values, dtype, device):
    x = np.array(values, dtype)
    unique, remapping = run_op("Unique", [x], 2, device=device)
    check_unique(x, unique, remapping)
    np.testing.assert_array_equal(run_op("Unique", [x], device=device), unique)


def test_unique_by_hand():
    unique, remapping = run_op("Unique", [np.array([20, 10, 20, 30], np.int64)], 2)
    assert unique.tolist() == [10, 20, 30] and remapping.tolist() == [1, 0, 1, 2]


def test_inferred_shapes_follow_caffe2():
    for n in (0, 1):
        got = infer_static("Unique", [np.zeros(n, np.int64)], 2)
        assert got[0].shape == (n,) and got[0].dtype == np.int64
        assert got[1].shape == (n,) and got[1].dtype == np.int32
    assert infer_static("Unique", [np.array([4, 4, 1], np.int32)])[0].shape == (2,)   # a known value
    many = infer_static("Unique", [np.array([4, 4, 1] * 30, np.int32)], 2)   # (too long to carry its value)
    assert many[0].shape is None and many[0].dtype == np.int32 and many[1].shape == (90,)


def test_bad_inputs_and_no_gradient():
    with pytest.raises(DTypeError, match="int32 or int64"):
        run_op("Unique", [np.ones(3, np.float32)])
    with pytest.raises(ShapeError, match=r"vector, got shape \(2, 2\)"):
        run_op("Unique", [np.ones((2, 2), np.int32)])
    with pytest.raises(GradientError):
        backward_ops([make_op("Unique", ["x"], ["u"])], {"u": "u_grad"})


def test_checker_catches_a_broken_unique(broken):
    x = np.array([3, 1, 3], np.int32)
    broken("Unique", lambda xp, i: (xp.unique(i), xp.zeros(i.shape, np.int32)))
    unique, remapping = run_op("Unique", [x], 2)
    with pytest.raises(AssertionError):
        check_unique(x, unique, remapping)
