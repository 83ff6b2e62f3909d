"""compat.functional beyond Caffe2's own test: the output count from the schema for an op with optional outputs,
num_output choosing fewer, the ValueErrors for counts out of range, and the private workspace."""
import numpy as np
import pytest

from stepnet.compat import workspace
from stepnet.compat.functional import Functional

X = np.array([[3.0, 1.0, 2.0, 7.0], [0.0, 5.0, 4.0, -1.0]], dtype=np.float32)


def topk_reference(x, k):
    """Values and indices of the k largest of each row (numpy, float64), and the indices into x.ravel()."""
    idx = np.argsort(-x.astype(np.float64), axis=1, kind="stable")[:, :k]
    values = np.take_along_axis(x, idx, axis=1)
    flat = (idx + np.arange(x.shape[0])[:, None] * x.shape[1]).ravel()
    return values, idx, flat


def test_an_op_with_optional_outputs_gives_them_all():
    out = Functional.TopK(X, k=2)           # TopK: 2 to 3 outputs; Caffe2 takes the largest count
    values, idx, flat = topk_reference(X, 2)
    assert len(out) == 3 and out._fields == ("output_0", "output_1", "output_2")
    np.testing.assert_array_equal(out[0], values)
    np.testing.assert_array_equal(out["output_1"], idx)
    np.testing.assert_array_equal(out.output_2, flat)


def test_num_output_takes_fewer_outputs():
    out = Functional.TopK(X, k=3, num_output=2)
    values, idx, _ = topk_reference(X, 3)
    assert len(out) == 2
    np.testing.assert_array_equal(out[0], values)
    np.testing.assert_array_equal(out[1], idx)


def test_counts_out_of_range_are_value_errors():
    with pytest.raises(ValueError, match="Number of output"):
        Functional.TopK(X, k=1, num_output=4)
    with pytest.raises(ValueError, match="Number of inputs"):
        Functional.Add(X)                   # Add takes 2 inputs
    with pytest.raises(ValueError, match="Number of inputs"):
        Functional.Relu(X, X)
    with pytest.raises(ValueError, match="num_output"):
        Functional.Split(X, split=[1, 1], axis=0)   # Split has no largest output count


def test_runs_in_a_workspace_of_its_own():
    workspace.FeedBlob("input_0", np.zeros(3, dtype=np.float32))
    out = Functional.Sum(np.array([1.0, 2.0], np.float32), np.array([10.0, 20.0], np.float32))
    np.testing.assert_array_equal(out[0], [11.0, 22.0])
    assert sorted(workspace.Blobs()) == ["input_0"]
    np.testing.assert_array_equal(workspace.FetchBlob("input_0"), np.zeros(3))
