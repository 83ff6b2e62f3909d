"""StumpFunc (the step function Caffe2's LabelSmooth and BatchLRLoss layers emit) against a per-element
reference: low_value where x <= threshold, high_value above."""
import numpy as np
import pytest

from stepnet.core.errors import DTypeError
from stepnet.testing import DEVICES, infer_static, run_op


def reference(x, threshold, low, high):
    return np.array([low if v <= threshold else high for v in x.ravel().tolist()],
                    dtype=np.float64).reshape(x.shape)


@pytest.mark.parametrize("device", DEVICES)
def test_values_on_both_sides_of_the_threshold_and_at_it(device):
    x = np.array([[-1.0, 0.5, 0.5000001], [0.49, 2.0, 0.5]], np.float32)
    got = run_op("StumpFunc", [x], device=device, threshold=0.5, low_value=0.1, high_value=0.9)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, reference(x, 0.5, 0.1, 0.9), rtol=1e-7)


def test_defaults_give_zero_everywhere_and_shape_inference_keeps_the_input():
    x = np.random.default_rng(3).normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_array_equal(run_op("StumpFunc", [x]), np.zeros((4, 3), np.float32))
    (out,) = infer_static("StumpFunc", [x])
    assert out.shape == (4, 3) and out.dtype == np.float32


def test_integer_input_is_refused():
    with pytest.raises(DTypeError):
        run_op("StumpFunc", [np.array([1, 2], np.int32)], threshold=1.0)
