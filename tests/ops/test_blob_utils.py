"""HasElements, UnsafeCoalesce and GetAllBlobNames (stepnet/ops/blob_utils.py) against references written from
Caffe2's docs on every device: the coalesced bytes built by hand (32-byte aligned blocks, zero padding), outputs
that are views into them, in-place use; bad inputs; broken kernels caught; the blob names listed by hand."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, GradientError
from stepnet.io.proto import NetDef
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, infer_static, make_op, run_op

rng = np.random.default_rng(3)


def coalesced_ref(xs):
    out = b""
    for x in xs:
        raw = np.ascontiguousarray(x).tobytes()
        out += raw + b"\0" * (-len(raw) % 32)
    return np.frombuffer(out, np.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3,), (2, 0), (), (2, 3, 1)])
def test_has_elements(shape, device):
    got = run_op("HasElements", [np.ones(shape, np.float32)], device=device)
    assert got.dtype == np.bool_ and got.shape == () and bool(got) == (int(np.prod(shape)) > 0)


@pytest.mark.parametrize("device", DEVICES)
def test_unsafe_coalesce(device):
    xs = [rng.standard_normal(5).astype(np.float32), np.arange(9, dtype=np.uint8), rng.standard_normal((2, 3)),
          np.array([True, False]), np.zeros((0, 4), np.int64), np.int32(7)]
    got = run_op("UnsafeCoalesce", xs, len(xs) + 1, device=device)
    for x, y in zip(xs, got):
        assert y.dtype == x.dtype and y.shape == np.shape(x)
        np.testing.assert_array_equal(y, x)
    assert got[-1].dtype == np.uint8
    np.testing.assert_array_equal(got[-1], coalesced_ref(xs))
    assert got[-1].size == 32 + 32 + 64 + 32 + 0 + 32


def test_outputs_are_views_into_the_coalesced_buffer_and_may_overwrite_their_inputs():
    ws = Workspace()
    ws.feed("a", np.array([1.0, 2.0], np.float32))
    ws.feed("b", np.array([3, 4, 5], np.int64))
    ws.run_operator_once(make_op("UnsafeCoalesce", ["a", "b"], ["a", "y", "all"]))
    a, y, buf = (ws.get_blob(n).value for n in ("a", "y", "all"))
    assert np.shares_memory(a, buf) and np.shares_memory(y, buf)
    a[1] = 8.0                                   # writing an output writes the buffer ("unsafe")
    assert buf[:8].view(np.float32).tolist() == [1.0, 8.0] and buf[32:56].view(np.int64).tolist() == [3, 4, 5]
    assert run_op("UnsafeCoalesce", [], 1).shape == (0,)


def test_inferred_shapes():
    got = infer_static("UnsafeCoalesce", [np.ones(3, np.float64), np.ones((2, 2), np.uint8)], 3)
    assert [s.shape for s in got] == [(3,), (2, 2), (64,)] and got[2].dtype == np.uint8
    assert infer_static("HasElements", [np.ones((0, 2))])[0].value == np.bool_(False)


def test_bad_inputs_and_no_gradients():
    x = np.ones(2, np.float32)
    with pytest.raises(ArityError, match="2 inputs need 3 outputs, got 2"):
        run_op("UnsafeCoalesce", [x, x], 2)
    with pytest.raises(ArgumentError, match=r"output 1 is input 0 \('in0'\)"):
        run_op("UnsafeCoalesce", {"in0": x, "in1": x}, ["o0", "in0", "o2"])
    with pytest.raises(DTypeError, match="numbers or bools; input 1 holds object"):
        run_op("UnsafeCoalesce", [x, np.array(["s"], object)], 3)
    for op_type, outs in (("HasElements", ["h"]), ("UnsafeCoalesce", ["y", "all"])):
        with pytest.raises(GradientError):
            backward_ops([make_op(op_type, ["x"], outs)], {outs[0]: "g"})


def test_checker_catches_broken_kernels(broken):
    xs = [np.ones(3, np.float32), np.arange(2, dtype=np.int64)]
    broken("UnsafeCoalesce", lambda ctx, xp, *xs: (*xs, np.concatenate([x.view(np.uint8).reshape(-1) for x in xs])))
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(run_op("UnsafeCoalesce", xs, 3)[-1], coalesced_ref(xs))
    broken("HasElements", lambda xp, x: np.asarray(x.ndim > 0))
    with pytest.raises(AssertionError):
        test_has_elements((2, 0), "cpu")


# --------------------------------------------------------------------------------------------- GetAllBlobNames
def _names(ws, **args):
    net = NetDef(name="n")
    net.op.append(make_op("GetAllBlobNames", [], ["names"], **args))
    ws.run_net_once(net)
    return ws.fetch("names").tolist()


def test_get_all_blob_names_lists_the_workspace_and_itself():
    parent = Workspace()
    parent.feed("b", np.zeros(1, np.float32))
    parent.feed("a", np.array(["s"], dtype=object))
    assert _names(parent) == [b"a", b"b", b"names"]
    child = parent.child()
    child.feed("c", np.ones(2))
    assert _names(child, include_shared=0) == [b"c", b"names"]
    assert _names(child) == [b"a", b"b", b"c", b"names"]


def test_free_empties_its_blobs_in_place_and_a_later_read_names_them():
    """Free (caffe2/operators/free_op.cc): each output, the same blob as its input, holds no value after it;
    other blobs keep theirs; an op reading a freed blob fails naming it; outputs must be the inputs."""
    ws = Workspace()
    ws.feed("a", np.ones(3, np.float32))
    ws.feed("b", np.arange(4))
    ws.feed("c", np.zeros(2))
    ws.run_net_once(NetDef(name="f", op=[make_op("Free", ["a", "b"], ["a", "b"])]))
    assert ws.get_blob("a").value is None and ws.get_blob("b").value is None
    np.testing.assert_array_equal(ws.fetch("c"), np.zeros(2))
    ws.feed("a", np.ones(3, np.float32))
    net = NetDef(name="g", op=[make_op("Free", ["a"], ["a"]), make_op("Relu", ["a"], ["r"])])
    with pytest.raises(Exception, match=r"op #1 \(Relu\).*'a'.*emptied by Free"):
        ws.run_net_once(net)
    with pytest.raises(Exception, match="in place|in-place|inplace"):
        ws.run_net_once(NetDef(name="h", op=[make_op("Free", ["c"], ["d"])]))
    np.testing.assert_array_equal(ws.fetch("c"), np.zeros(2))
    with pytest.raises(GradientError):        # SHOULD_NOT_DO_GRADIENT, as in Caffe2
        backward_ops([make_op("Free", ["c"], ["c"])], {"c": "g"})


def test_feed_blob_writes_its_string_argument_as_a_string_blob():
    """FeedBlob (caffe2/operators/feed_blob_op.h): no inputs, its output the `value` argument's string (bytes,
    as Caffe2's FetchBlob returns a std::string blob); the argument is required."""
    ws = Workspace()
    ws.run_net_once(NetDef(name="s", op=[make_op("FeedBlob", [], ["s"], value="héllo, world")]))
    assert ws.fetch("s") == "héllo, world".encode("utf-8")
    with pytest.raises(ArgumentError, match="value"):
        ws.run_net_once(NetDef(name="t", op=[make_op("FeedBlob", [], ["t"])]))
