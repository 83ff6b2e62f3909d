"""SegmentIdsToRanges and LengthsToWeights (stepnet/ops/segment_conversions.py) against loops written from
Caffe2's kernels on every device; static shapes; bad inputs; the blob limit; a broken kernel caught."""
import math

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import DTypeError, GradientError, ResourceError, ShapeError
from stepnet.core.limits import Limits
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op


def ranges_ref(ids, count=None):
    """Caffe2's loop: a segment skipped between two ids starts at the next present id; ones before the first
    id or after the last keep offset 0."""
    n = (ids[-1] + 1 if ids else 0) if count is None else count
    out = [[0, 0] for _ in range(n)]
    prev = ids[0] if ids else 0
    for i, s in enumerate(ids):
        while prev != s:
            prev += 1
            out[prev][0] = i
        out[s][1] += 1
    return np.array(out, np.int32).reshape(n, 2)


def weights_ref(lengths, power):
    return np.array([1.0 / math.pow(n, power) for n in lengths for _ in range(n)], np.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("ids,count", [([0, 0, 1, 3, 3], None), ([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 5],
                                       None), ([2, 2, 4], None), ([], None), ([0, 1, 1], 5), ([], 3)])
def test_segment_ids_to_ranges(ids, count, dtype, device):
    inputs = [np.array(ids, dtype)] + ([np.zeros((count, 2), np.float32)] if count is not None else [])
    got = run_op("SegmentIdsToRanges", inputs, device=device)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ranges_ref(ids, count))


def test_segment_ids_to_ranges_by_hand():
    got = run_op("SegmentIdsToRanges", [np.array([0, 0, 1, 3, 3], np.int32)])
    assert got.tolist() == [[0, 2], [2, 1], [3, 0], [3, 2]]
    assert infer_static("SegmentIdsToRanges", [np.array([0, 2], np.int32)])[0].shape == (3, 2)
    assert infer_static("SegmentIdsToRanges", [np.array([0, 2], np.int32), np.zeros(7)])[0].shape == (7, 2)


def test_segment_ids_to_ranges_bad_inputs():
    with pytest.raises(ShapeError, match="sorted"):
        run_op("SegmentIdsToRanges", [np.array([0, 2, 1], np.int32)])
    with pytest.raises(ShapeError, match="sorted and non-negative"):
        run_op("SegmentIdsToRanges", [np.array([-1, 0], np.int32)])
    with pytest.raises(ShapeError, match="only 2 rows"):
        run_op("SegmentIdsToRanges", [np.array([0, 4], np.int32), np.zeros(2, np.float32)])
    with pytest.raises(DTypeError, match="int32 or int64"):
        run_op("SegmentIdsToRanges", [np.array([0.0, 1.0], np.float32)])
    with pytest.raises(GradientError):
        backward_ops([make_op("SegmentIdsToRanges", ["s"], ["r"])], {"r": "r_grad"})


def test_segment_ids_to_ranges_is_held_to_the_blob_limit():
    ws = Workspace(limits=Limits(max_blob_bytes=1 << 20))
    ws.feed("ids", np.array([0, 10 ** 9], np.int64))
    with pytest.raises(ResourceError, match=r"would be \(1000000001, 2\) int32"):
        ws.run_operator_once(make_op("SegmentIdsToRanges", ["ids"], ["r"]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("power", [0.5, 1.0, 1.5, 2.0, 0.0])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_lengths_to_weights(power, dtype, device):
    lengths = [3, 0, 1, 4, 2]
    got = run_op("LengthsToWeights", [np.array(lengths, dtype)], device=device, power=power)
    assert got.dtype == np.float32 and got.shape == (10,)
    np.testing.assert_allclose(got, weights_ref(lengths, power), rtol=1e-7)


def test_lengths_to_weights_by_hand_default_and_errors():
    np.testing.assert_allclose(run_op("LengthsToWeights", [np.array([4, 1], np.int32)]), [0.5] * 4 + [1.0])
    assert run_op("LengthsToWeights", [np.array([], np.int32)]).shape == (0,)
    assert infer_static("LengthsToWeights", [np.array([2, 3], np.int32)], power=1.0)[0].shape == (5,)
    with pytest.raises(ShapeError, match=r"lengths\[1\] = -2"):
        run_op("LengthsToWeights", [np.array([1, -2], np.int32)])
    with pytest.raises(ShapeError, match="1-D"):
        run_op("LengthsToWeights", [np.ones((2, 2), np.int32)])
    with pytest.raises(DTypeError, match="integers"):
        run_op("LengthsToWeights", [np.ones(2, np.float32)])


def test_checkers_catch_broken_kernels(broken):
    broken("LengthsToWeights", lambda xp, l, power: np.repeat(1.0 / np.maximum(l, 1), l).astype(np.float32))
    with pytest.raises(AssertionError):
        test_lengths_to_weights(0.5, np.int32, "cpu")
    broken("SegmentIdsToRanges", lambda xp, s, *d: np.stack([np.zeros(s[-1] + 1), np.bincount(s)], 1).astype(np.int32))
    with pytest.raises(AssertionError):
        test_segment_ids_to_ranges([0, 0, 1, 3, 3], None, np.int32, "cpu")
