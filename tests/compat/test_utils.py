"""compat.utils: debug / DebugMode, argument and tensor conversion, reading protos, resetting blobs."""
import io

import numpy as np
import pytest

from stepnet.core import backend
from stepnet import caffe2_pb2
from stepnet.compat import core, utils, workspace


def test_debug_passes_results_on_and_reraises_without_a_terminal(monkeypatch):
    @utils.debug
    def ok(a, b=1):
        return a + b

    @utils.debug
    def fails():
        raise ValueError("broken")
    assert ok(1, b=2) == 3 and ok.__name__ == "ok"
    monkeypatch.setattr("sys.stdin", io.StringIO())       # not a terminal: no pdb, the error as it was
    with pytest.raises(ValueError, match="broken"):
        fails()


def test_debug_opens_pdb_at_a_terminal(monkeypatch, capsys):
    class Terminal:
        @staticmethod
        def isatty():
            return True
    seen = []
    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr("pdb.post_mortem", lambda *a: seen.append("pdb"))
    with pytest.raises(SystemExit) as info:
        utils.DebugMode.run(lambda: 1 / 0)
    assert info.value.code == 1 and seen == ["pdb"] and "division by zero" in capsys.readouterr().out


def test_arguments_and_tensors():
    assert utils.MakeArgument("k", [1, 2]).ints == [1, 2] and utils.MakeArgument("s", "x").s == b"x"
    assert utils.MakeArgument("f", np.float32(0.5)).f == 0.5
    held = caffe2_pb2.TensorProto(float_data=[1.5, -2.0], dims=[2, 3])   # any iterable, as Caffe2 took
    assert utils.MakeArgument("v", held.float_data).floats == [1.5, -2.0]
    assert utils.MakeArgument("d", held.dims).ints == [2, 3] and utils.MakeArgument("r", range(3)).ints == [0, 1, 2]
    assert utils.MakeArgument("g", (s for s in ("a", "b"))).strings == [b"a", b"b"]
    with pytest.raises(Exception, match="cannot store a value of type object"):
        utils.MakeArgument("o", object())
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    tensor = utils.NumpyArrayToCaffe2Tensor(arr, "t")
    assert tensor.name == "t" and list(tensor.dims) == [2, 3] and tensor.data_type == caffe2_pb2.TensorProto.INT32
    back = utils.Caffe2TensorToNumpyArray(tensor)
    assert back.dtype == np.int32 and back.tolist() == arr.tolist()


def test_reading_protos(tmp_path):
    net = caffe2_pb2.NetDef(name="n")
    net.op.add(type="Relu", input=["x"], output=["y"])
    assert utils.TryReadProtoWithClass(caffe2_pb2.NetDef, str(net)) == net
    assert utils.TryReadProtoWithClass(caffe2_pb2.NetDef, net.SerializeToString()) == net
    assert utils.GetContentFromProto(net, {caffe2_pb2.NetDef: lambda n: n.name}) == "n"
    assert utils.GetContentFromProtoString(str(net), {caffe2_pb2.NetDef: lambda n: len(n.op)}) == 1
    (tmp_path / "n.pbtxt").write_text(str(net))
    utils.ConvertProtoToBinary(caffe2_pb2.NetDef, tmp_path / "n.pbtxt", tmp_path / "n.pb")
    assert caffe2_pb2.NetDef.FromString((tmp_path / "n.pb").read_bytes()) == net


def test_op_almost_equal_and_the_rest():
    a = core.CreateOperator("Relu", ["x"], ["y"], name="a")
    b = core.CreateOperator("Relu", ["x"], ["y"], name="b")
    assert not utils.OpAlmostEqual(a, b) and utils.OpAlmostEqual(a, b, "name")
    workspace.FeedBlob("x", np.ones(2))
    utils.ResetBlobs(["x"])
    assert workspace.HasBlob("x") and workspace._ws().get_blob("x").value is None
    utils.raiseIfNotEqual(1, 1, "same")
    with pytest.raises(Exception, match="differ. 1 != 2"):
        utils.raiseIfNotEqual(1, 2, "differ")
    if backend.cupy_module() is None:
        with pytest.raises(RuntimeError, match="CuPy"):
            utils.GetGPUMemoryUsageStats()
    else:
        assert set(utils.GetGPUMemoryUsageStats()) == {"total_by_gpu", "max_by_gpu", "total", "max_total"}


def test_caffe_blobs_as_arrays():
    """Caffe1's BlobProto: the legacy 4-D shape when num is set, else shape.dim; values that do not fill the shape
    are one FileFormatError (a .caffemodel is a file from elsewhere)."""
    from stepnet import caffe_pb2 as caffe1
    from stepnet.core.errors import FileFormatError
    legacy = caffe1.BlobProto(num=1, channels=2, height=1, width=3, data=[0, 1, 2, 3, 4, 5])
    assert utils.CaffeBlobToNumpyArray(legacy).tolist() == [[[[0, 1, 2]], [[3, 4, 5]]]]
    new = caffe1.BlobProto(shape=caffe1.BlobShape(dim=[3, 2]), double_data=[0.5, 1, 2, 3, 4, 5])
    got = utils.CaffeBlobToNumpyArray(new)
    assert got.dtype == np.float32 and got.tolist() == [[0.5, 1], [2, 3], [4, 5]]
    with pytest.raises(FileFormatError, match=r"shape \[3, 2\] holds 5 values"):
        utils.CaffeBlobToNumpyArray(caffe1.BlobProto(shape=caffe1.BlobShape(dim=[3, 2]), data=[1, 2, 3, 4, 5]))
