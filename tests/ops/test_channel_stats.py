"""ChannelStats and ChannelBackpropStats (stepnet/ops/channel_stats.py) against loops written here from
Caffe2's docs, on every device and for 3-, 4- and 5-D inputs; bad inputs; no gradients; broken kernels caught."""
import numpy as np
import pytest

from stepnet.core.errors import GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op

rng = np.random.default_rng(11)
SHAPES = [(2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 2, 2), (0, 3, 2, 2)]


def stats_ref(x):
    c = x.shape[1]
    s, sq = np.zeros(c), np.zeros(c)
    for idx in np.ndindex(*x.shape):
        v = float(x[idx])
        s[idx[1]] += v
        sq[idx[1]] += v * v
    return s, sq


def backprop_ref(x, mean, inv_std, dy):
    c = x.shape[1]
    ds, db = np.zeros(c), np.zeros(c)
    for idx in np.ndindex(*x.shape):
        ch = idx[1]
        ds[ch] += (float(x[idx]) - float(mean[ch])) * float(inv_std[ch]) * float(dy[idx])
        db[ch] += float(dy[idx])
    return ds, db


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
def test_channel_stats(shape, device):
    x = rng.standard_normal(shape).astype(np.float32)
    got = run_op("ChannelStats", [x], 2, device=device)
    for g, want in zip(got, stats_ref(x), strict=True):
        assert g.dtype == np.float32 and g.shape == (shape[1],)
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
def test_channel_backprop_stats(shape, device):
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    mean, inv_std = rng.standard_normal(shape[1]), rng.uniform(0.5, 2, shape[1])
    got = run_op("ChannelBackpropStats", [x, mean, inv_std, dy], 2, device=device)
    for g, want in zip(got, backprop_ref(x, mean, inv_std, dy), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-10)


def test_bad_inputs_static_shapes_and_no_gradient():
    with pytest.raises(ShapeError, match="3 to 5 dims"):
        run_op("ChannelStats", [np.ones((2, 3), np.float32)], 2)
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ShapeError, match="mean must be a vector of the 3 channels"):
        run_op("ChannelBackpropStats", [x, np.ones(2, np.float32), np.ones(3, np.float32), x], 2)
    with pytest.raises(ShapeError, match="output_grad"):
        run_op("ChannelBackpropStats", [x, np.ones(3, np.float32), np.ones(3, np.float32), x[:1]], 2)
    assert [s.shape for s in infer_static("ChannelStats", [np.ones((2, 5, 3, 3), np.float32)], 2)] == [(5,), (5,)]
    with pytest.raises(GradientError):
        backward_ops([make_op("ChannelStats", ["x"], ["s", "q"])], {"s": "s_grad"})


def test_the_reference_catches_a_broken_kernel(broken):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    broken("ChannelStats", lambda xp, X: (X.sum(axis=(0, 2)), X.sum(axis=(0, 2))))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(run_op("ChannelStats", [x], 2)[1], stats_ref(x)[1], rtol=1e-5)
