"""stepnet.testing's own checks fail when an op misbehaves."""
import numpy as np
import pytest

from stepnet.testing import allocates_under, run_op


def test_run_op_catches_a_kernel_that_changes_its_input(broken):
    def scribbling_relu(xp, x):
        out = xp.maximum(x, 0)
        x[...] = 0             # not in place by definition: Relu's input must stay as it was
        return out
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(run_op("Relu", [x]), [0, 2])
    broken("Relu", scribbling_relu)
    with pytest.raises(AssertionError, match="Relu changed its input 'in0', which is not one of its outputs"):
        run_op("Relu", [x])


def test_run_op_allows_declared_in_place_writes():
    """Inputs that are also outputs (in place, as Caffe2 defines the op) may change."""
    out = run_op("Iter", {"it": np.array([3], np.int64)}, ["it"])
    np.testing.assert_array_equal(out, [4])


def test_allocates_under_fails_a_block_that_allocates_more():
    with allocates_under():
        np.ones(1000)
    with pytest.raises(AssertionError, match=r"the block allocated up to \d+ bytes \(limit 1048576\)"):
        with allocates_under():
            np.ones(1 << 20)
