"""caffe2.python.predictor.mobile_exporter: Export's two nets as Caffe2 builds them (worked out by hand from
Caffe2's mobile_exporter.py at 157ff81a: one GivenTensor*Fill per parameter by dtype, a 1×1 zero placeholder per
input, the predict net's external inputs and outputs), and the exported pair scoring as a float64 numpy reference.
Caffe2's own test, mobile_exporter_test.py, runs in tests/caffe2_suite."""
import numpy as np
import pytest

from stepnet.compat import core, workspace
from stepnet.compat.predictor import mobile_exporter


def args_of(op) -> dict:
    out = {}
    for a in op.arg:
        out[a.name] = list(a.ints) or list(a.floats) or list(a.strings)
    return out


def test_export_builds_caffe2s_nets():
    workspace.ResetWorkspace()
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    raw = np.arange(6, dtype=np.uint8).reshape(2, 3)
    values = {"w": w, "b": b, "i": np.array([1, -2], np.int32), "l": np.array([[2 ** 40]], np.int64), "u": raw}
    for name, value in values.items():
        workspace.FeedBlob(name, value)
    net = core.Net("exported")
    net.FC(["x", "w", "b"], "h")          # core.Net declares x, w, b external inputs (undefined when read)
    net.Relu("h", "h")                      # h written twice and read: neither input nor output
    net.Add(["h", "h"], "y")
    init, predict = mobile_exporter.Export(workspace, net, ["w", core.BlobReference("b"), "i", "l", "u"])

    assert [(op.type, list(op.output)) for op in init.op] == [
        ("GivenTensorFill", ["w"]), ("GivenTensorFill", ["b"]), ("GivenTensorIntFill", ["i"]),
        ("GivenTensorInt64Fill", ["l"]), ("GivenTensorStringFill", ["u"]), ("GivenTensorFill", ["x"])]
    got = [args_of(op) for op in init.op]
    assert got[0]["shape"] == [3, 4] and np.array_equal(np.float32(got[0]["values"]), w.ravel())
    assert got[1]["shape"] == [3] and np.array_equal(np.float32(got[1]["values"]), b)
    assert got[2] == {"shape": [2], "values": [1, -2]} and got[3] == {"shape": [1, 1], "values": [2 ** 40]}
    assert got[4] == {"shape": [1], "values": [b"\x00\x01\x02\x03\x04\x05"]}     # uint8: its bytes, one string
    assert got[5] == {"shape": [1, 1], "values": [0.0]}
    assert list(predict.external_input) == ["x", "x", "w", "b"]     # the inputs, then the net's own list
    assert list(predict.external_output) == ["y"]
    assert [op.type for op in predict.op] == ["FC", "Relu", "Add"] and predict.name == net.Proto().name
    assert list(net.Proto().external_output) == []                  # the net itself is left as it was

    workspace.ResetWorkspace()
    predictor = workspace.Predictor(init.SerializeToString(), predict.SerializeToString())
    x = rng.standard_normal((2, 4)).astype(np.float32)
    (y,) = predictor.run({"x": x})
    want = 2 * np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + b, 0)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_inputs_without_declared_external_inputs():
    """A NetDef with no external inputs: every blob read before it is written is an input (Caffe2's get_ssa)."""
    from stepnet import caffe2_pb2
    workspace.ResetWorkspace()
    workspace.FeedBlob("s", np.array([2.0], np.float32))
    proto = caffe2_pb2.NetDef()
    proto.op.extend([core.CreateOperator("Mul", ["a", "s"], ["m"], broadcast=1),
                     core.CreateOperator("Add", ["m", "c"], ["out"], broadcast=1)])
    init, predict = mobile_exporter.Export(workspace, proto, ["s"])
    assert [list(op.output) for op in init.op] == [["s"], ["a"], ["c"]]
    assert list(predict.external_input) == ["a", "c"] and list(predict.external_output) == ["out"]


def test_unsupported_dtype_is_a_key_error_as_in_caffe2():
    workspace.ResetWorkspace()
    workspace.FeedBlob("d", np.zeros(2, np.float64))
    net = core.Net("f64")
    net.Copy("d", "e")
    with pytest.raises(KeyError):
        mobile_exporter.Export(workspace, net, ["d"])
