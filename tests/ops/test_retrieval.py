"""RMACRegions and APMeter (stepnet/ops/retrieval.py): RMAC's grid against a reference written here from the
R-MAC paper's recipe (as Caffe2's test states it) and hand-computed grids; APMeter against average precision
computed here from its definition, its buffer across runs (the last buffer_size predictions), on every
device; bad inputs; no gradients; broken kernels caught."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from stepnet.io.proto import NetDef
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op

rng = np.random.default_rng(47)


def rmac_ref(n, h, w, scales, overlap=0.4):
    steps = np.arange(1, 7, dtype=np.float32)
    short = min(h, w)
    b = (max(h, w) - short) / steps
    idx = int(np.argmin(np.abs((short ** 2 - short * b) / short ** 2 - overlap))) + 1
    wd, hd = (idx if w > h else 0), (idx if h > w else 0)
    regions = []
    for level in range(1, scales + 1):
        size = 2 * short // (level + 1)
        if size == 0:
            break
        bw = (w - size) / (level + wd - 1) if level + wd - 1 > 0 else 0
        bh = (h - size) / (level + hd - 1) if level + hd - 1 > 0 else 0
        for i in range(level + wd):
            for j in range(level + hd):
                x, y = min(int(bw * i), w - size), min(int(bh * j), h - size)
                regions.append([x, y, x + size - 1, y + size - 1])
    return np.array([[k, *r] for k in range(n) for r in regions], np.float32).reshape(-1, 5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("h, w, scales", [(1, 1, 1), (4, 4, 3), (5, 9, 2), (10, 3, 3), (7, 8, 3), (2, 10, 3)])
def test_rmac_regions(h, w, scales, device):
    x = np.zeros((3, 2, h, w), np.float32)
    got = run_op("RMACRegions", [x], device=device, scales=scales)
    np.testing.assert_array_equal(got, rmac_ref(3, h, w, scales))
    assert infer_static("RMACRegions", [x], scales=scales)[0].shape == got.shape


def test_rmac_hand_computed_grid():
    """4 x 4, 2 scales: one 4 x 4 region, then four 2 x 2 regions at offsets 0 and 2 (x-major)."""
    got = run_op("RMACRegions", [np.zeros((1, 1, 4, 4), np.float32)], scales=2)
    want = [[0, 0, 0, 3, 3], [0, 0, 0, 1, 1], [0, 0, 2, 1, 3], [0, 2, 0, 3, 1], [0, 2, 2, 3, 3]]
    np.testing.assert_array_equal(got, want)
    assert run_op("RMACRegions", [np.zeros((0, 1, 4, 4), np.float32)]).shape == (0, 5)
    with pytest.raises(ShapeError, match="NCHW input"):
        run_op("RMACRegions", [np.zeros((1, 4, 4), np.float32)])
    with pytest.raises(GradientError):
        backward_ops([make_op("RMACRegions", ["x"], ["r"])], {"r": "r_grad"})


def average_precision(scores, labels):
    """Per class: rank by score (ties in arrival order), mean over positives of hits-so-far / rank."""
    out = []
    for k in range(scores.shape[1]):
        order = sorted(range(scores.shape[0]), key=lambda i: -scores[i, k])
        hits, total = 0, 0.0
        for rank, i in enumerate(order, 1):
            if labels[i, k] == 1:
                hits += 1
                total += hits / rank
        out.append(total / max(hits, 1))
    return np.array(out, np.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_ap_meter(device):
    scores = rng.uniform(0.1, 1, (10, 3)).astype(np.float32)
    labels = rng.integers(0, 2, (10, 3)).astype(np.int32)
    got = run_op("APMeter", [scores, labels], device=device, buffer_size=10)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, average_precision(scores, labels), rtol=1e-6)
    small = run_op("APMeter", [scores, labels], device=device, buffer_size=5)
    np.testing.assert_allclose(small, average_precision(scores[5:], labels[5:]), rtol=1e-6)
    none = run_op("APMeter", [scores, np.zeros((10, 3), np.int32)])
    np.testing.assert_array_equal(none, np.zeros(3, np.float32))


def test_ap_meter_keeps_its_buffer_between_runs():
    """Two runs of one op: the second sees both batches while they fit the buffer."""
    a, b = rng.uniform(0, 1, (4, 2)).astype(np.float32), rng.uniform(0, 1, (3, 2)).astype(np.float32)
    la, lb = rng.integers(0, 2, (4, 2)).astype(np.int32), rng.integers(0, 2, (3, 2)).astype(np.int32)
    ws = Workspace()
    ws.feed("p", a)
    ws.feed("l", la)
    net = NetDef(name="ap")
    net.op.append(make_op("APMeter", ["p", "l"], ["ap"], buffer_size=8))
    bound = ws.bind(net)
    bound.run()
    np.testing.assert_allclose(ws.fetch("ap"), average_precision(a, la), rtol=1e-6)
    ws.feed("p", b)
    ws.feed("l", lb)
    bound.run()
    both_s, both_l = np.concatenate([a, b]), np.concatenate([la, lb])
    np.testing.assert_allclose(ws.fetch("ap"), average_precision(both_s, both_l), rtol=1e-6)


def test_ap_meter_bad_inputs():
    with pytest.raises(DTypeError, match="labels must be int32"):
        run_op("APMeter", [np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)])
    with pytest.raises(ShapeError, match="both be N x D"):
        run_op("APMeter", [np.ones((2, 2), np.float32), np.ones((2, 3), np.int32)])
    with pytest.raises(ArgumentError, match="buffer_size must be positive"):
        run_op("APMeter", [np.ones((2, 2), np.float32), np.ones((2, 2), np.int32)], buffer_size=0)


def test_the_references_catch_broken_kernels(broken):
    broken("RMACRegions", lambda xp, X, **a: xp.zeros((3, 5), np.float32))
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(run_op("RMACRegions", [np.zeros((1, 1, 3, 3), np.float32)]),
                                      rmac_ref(1, 3, 3, 3))
    scores, labels = np.array([[0.9], [0.1], [0.5]], np.float32), np.array([[0], [1], [1]], np.int32)
    broken("APMeter", lambda ctx, xp, p, l, **a: xp.ones(1, np.float32))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(run_op("APMeter", [scores, labels]), average_precision(scores, labels))
