"""AccumulateHistogram (stepnet/ops/histogram.py) against a loop written from Caffe2's kernel on every device:
the current histogram, the accumulation over one bound op's runs (a fresh op starts again), the buckets at their
edges; bad inputs; a broken kernel caught."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, GradientError, OpError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op

rng = np.random.default_rng(8)


def histogram_ref(x, lo, hi, n):
    counts = [0] * (n + 2)
    width = np.float32(np.float32(hi) - np.float32(lo)) / np.float32(n)
    for v in np.asarray(x, np.float32).reshape(-1):
        if v < np.float32(lo):
            counts[0] += 1
        elif v >= np.float32(hi):
            counts[n + 1] += 1
        else:
            counts[int((v - np.float32(lo)) / width) + 1] += 1
    return np.array(counts, np.int64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 3, 5])
def test_current_histogram(n, device):
    x = rng.random((7, 4)).astype(np.float32)
    cur, acc = run_op("AccumulateHistogram", [x], 2, device=device, lower_bound=0.1, upper_bound=0.9, num_buckets=n)
    assert cur.dtype == acc.dtype == np.int64 and cur.shape == (n + 2,)
    np.testing.assert_array_equal(cur, histogram_ref(x, 0.1, 0.9, n))
    np.testing.assert_array_equal(acc, cur)                  # a fresh op has seen this input only


def test_by_hand_with_the_edges():
    x = np.array([-1.0, 0.0, 0.25, 0.5, 0.99, 1.0, 7.0], np.float32)
    cur, _ = run_op("AccumulateHistogram", [x], 2, num_buckets=2)   # [0, 0.5) and [0.5, 1)
    assert cur.tolist() == [1, 2, 2, 2]
    assert run_op("AccumulateHistogram", [np.zeros((0, 3), np.float32)], 2)[0].tolist() == [0, 0, 0]


def test_the_accumulated_histogram_sums_the_runs_of_one_op():
    ws = Workspace()
    net = NetDef(name="h")
    net.op.append(make_op("AccumulateHistogram", ["x"], ["cur", "acc"], num_buckets=4))
    batches = [rng.random(10).astype(np.float32) * 1.2 - 0.1 for _ in range(5)]   # (later runs: compiled)
    ws.feed("x", batches[0])
    created = ws.create_net(net)
    for k, x in enumerate(batches):
        ws.feed("x", x)
        created.run()
        np.testing.assert_array_equal(ws.fetch("cur"), histogram_ref(x, 0.0, 1.0, 4))
        np.testing.assert_array_equal(ws.fetch("acc"), sum(histogram_ref(b, 0.0, 1.0, 4) for b in batches[:k + 1]))


def test_inference_and_bad_inputs():
    got = infer_static("AccumulateHistogram", [np.ones((2, 3), np.float32)], 2, num_buckets=6)
    assert [(s.shape, s.dtype) for s in got] == [((8,), np.int64)] * 2
    with pytest.raises(ArgumentError, match="num_buckets must be > 0, got 0"):
        run_op("AccumulateHistogram", [np.ones(2, np.float32)], 2, num_buckets=0)
    with pytest.raises(DTypeError, match="float"):
        run_op("AccumulateHistogram", [np.ones(2, np.int32)], 2)
    with pytest.raises(OpError, match="NaN at flat position 1"):
        run_op("AccumulateHistogram", [np.array([0.5, np.nan], np.float32)], 2)
    with pytest.raises(GradientError):
        backward_ops([make_op("AccumulateHistogram", ["x"], ["c", "a"])], {"c": "g"})


def test_checker_catches_a_broken_kernel(broken):
    def off_by_one(ctx, xp, x, *, lower_bound, upper_bound, num_buckets):
        counts = np.histogram(x, bins=num_buckets + 2, range=(lower_bound, upper_bound))[0].astype(np.int64)
        return counts, counts
    broken("AccumulateHistogram", off_by_one)
    with pytest.raises(AssertionError):
        test_current_histogram(3, "cpu")
