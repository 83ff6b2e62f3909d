"""WeightedSample and StringJoin against direct definitions."""
import numpy as np
import pytest

from stepnet.core.errors import ShapeError
from stepnet.testing import DEVICES, run_op


@pytest.mark.parametrize("device", DEVICES)
def test_weighted_sample_frequencies_follow_the_weights(device):
    w = np.array([[1, 0, 3], [0, 0, 2], [5, 5, 0]], np.float32)
    counts = np.zeros((3, 3))
    from stepnet import Workspace
    from stepnet.io.proto import NetDef
    from stepnet.testing import make_op
    ws = Workspace(seed=1, gpu="emulate" if device == "emulated" else None)
    from stepnet.io.proto import DeviceOption
    ws.feed("w", w, device_option=DeviceOption(device_type=1) if device != "cpu" else None)
    net = NetDef(name="s")
    net.op.append(make_op("WeightedSample", ["w"], ["i"], device=device))
    created = ws.create_net(net)
    for _ in range(2000):
        created.run()
        idx = ws.fetch("i")
        assert idx.dtype == np.int32 and idx.shape == (3,)
        counts[np.arange(3), idx] += 1
    want = w / w.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(counts / 2000, want, atol=0.04)
    assert counts[0, 1] == counts[1, 0] == counts[1, 1] == counts[2, 2] == 0  # zero weight: never drawn


def test_weighted_sample_values_and_errors():
    w = np.array([[0, 1, 0]], np.float32)
    vals = np.array([[7, 8, 9]], np.float32)
    idx, v = run_op("WeightedSample", [w, vals], 2)
    assert idx.tolist() == [1] and v.tolist() == [8.0]
    with pytest.raises(ShapeError, match="2-D"):
        run_op("WeightedSample", [np.ones(3, np.float32)])
    with pytest.raises(ShapeError, match="non-negative"):
        run_op("WeightedSample", [np.array([[1, -1]], np.float32)])


@pytest.mark.parametrize("shape", [(0, 0), (3, 0), (0, 4)])
def test_weighted_sample_of_nothing_gives_empty_outputs(shape):
    """Caffe2 gives empty outputs when the batch or the weight rows are empty."""
    idx, v = run_op("WeightedSample", [np.zeros(shape, np.float32), np.zeros(shape, np.float32)], 2)
    assert idx.shape == v.shape == (0,) and idx.dtype == np.int32 and v.dtype == np.float32
    assert run_op("WeightedSample", [np.zeros(shape, np.float32)]).shape == (0,)


def test_string_join():
    """String ops run on the host only (as in Caffe2, which has no GPU string kernels)."""
    x = np.array([[b"a", b"b", b"c"], [b"d", b"e", b"f"]], dtype=object)
    rows = run_op("StringJoin", [x], delimiter="", device="cpu")
    assert rows.tolist() == [b"abc", b"def"]
    cols = run_op("StringJoin", [np.arange(6).reshape(2, 3)], delimiter="-", axis=1)
    assert cols.tolist() == [b"0-3", b"1-4", b"2-5"]
    assert run_op("StringJoin", [np.array([1.5, 2.0], np.float32)]).tolist() == [b"1.5", b"2.0"]
    # a delimiter in a file is bytes, UTF-8 or not: joined as given (a TypeError once; fuzz one-op seed 2 case 3503)
    assert run_op("StringJoin", [np.array([[1, 2]], np.int64)], delimiter=b"\xff\xfe").tolist() == [b"1\xff\xfe2"]
