"""The Int8Tensor value (stepnet/core/int8.py): made, fed, fetched, saved and loaded in Caffe2's Int8TensorCPU form,
printed, and described for static inference."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core import backend
from stepnet.io import checkpoints, minidb
from stepnet.cli.run import format_blob, save_npz
from stepnet.core.errors import ArgumentError, DTypeError, FileFormatError, StepnetError
from stepnet.core.int8 import Int8Tensor
from stepnet.ops.util import format_tensor
from stepnet.io.proto import BlobProto, DataType, DeviceOption, NetDef
from stepnet.core.spec import TensorSpec
from stepnet.testing import make_op, run_op

CODES = np.array([[0, 3, 127], [128, 200, 255]], np.uint8)


def codes_equal(a, b) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype and a.scale == b.scale and a.zero_point == b.zero_point
            and np.array_equal(np.asarray(backend.to_host(a.data)), np.asarray(backend.to_host(b.data))))


# ----------------------------------------------------------------------------------------------- the value
def test_an_int8_tensor_holds_codes_a_float32_scale_and_a_zero_point():
    t = Int8Tensor(CODES, 0.1, 127)
    assert t.shape == (2, 3) and t.dtype == np.uint8 and t.ndim == 2 and t.size == 6
    assert t.scale == float(np.float32(0.1)) and t.zero_point == 127   # Caffe2 keeps a float scale
    bias = Int8Tensor(np.array([-5, 7], np.int32), 0.01)
    assert bias.dtype == np.int32 and bias.zero_point == 0


@pytest.mark.parametrize("data, scale, zp, error, words", [
    (np.zeros(3, np.float32), 1.0, 0, DTypeError, "uint8 codes"),
    (np.zeros(3, np.int8), 1.0, 0, DTypeError, "int8 data"),
    ([1, 2], 1.0, 0, DTypeError, "int64 data"),
    (CODES, float("nan"), 0, ArgumentError, "finite scale"),
    (CODES, 1.0, 2.5, ArgumentError, "int32"),
    (CODES, 1.0, 2 ** 31, ArgumentError, "int32")])
def test_bad_int8_tensors_are_refused(data, scale, zp, error, words):
    with pytest.raises(error, match=words):
        Int8Tensor(data, scale, zp)


def test_quantize_and_dequantize_are_caffe2s():
    x = np.array([-1.0, -0.05, 0.0, 0.05, 0.15, 0.25, 100.0], np.float32)
    t = Int8Tensor.quantize(x, 0.1, 10)
    # x / 0.1 rounded half to even in float32 (0.05/0.1 = 0.5 -> 0, 0.15/0.1 = 1.5 -> 2), clamped to [0, 255]
    assert t.data.tolist() == [0, 10, 10, 10, 12, 12, 255]
    want = (t.data.astype(np.int32) - 10).astype(np.float32) * np.float32(0.1)
    np.testing.assert_array_equal(t.dequantize(), want)
    assert t.dequantize().dtype == np.float32


def test_an_int8_tensor_is_no_float_array():
    t = Int8Tensor(CODES, 0.5, 3)
    with pytest.raises(TypeError, match="dequantize it first"):
        np.asarray(t)


def test_tensor_spec_describes_an_int8_tensor():
    spec = TensorSpec.of(Int8Tensor(CODES, 0.5, 3))
    assert spec.shape == (2, 3) and spec.dtype == np.uint8 and spec.quant == (0.5, 3) and spec.value is None
    assert str(spec) == "(2, 3) uint8 scale 0.5 zero_point 3"
    assert TensorSpec.of(CODES).quant is None


# ----------------------------------------------------------------------------------------------- feed / fetch
@pytest.mark.parametrize("gpu", [None, "emulate"])
def test_feed_and_fetch_copy_the_value(gpu):
    ws = Workspace(gpu=gpu)
    t = Int8Tensor(CODES.copy(), 0.25, 9)
    ws.feed("q", t, device_option=DeviceOption(device_type=1) if gpu else None)
    stored = ws.get_blob("q").value
    assert isinstance(stored, Int8Tensor) and stored is not t and codes_equal(stored, t)
    assert backend.device_of(stored.data).kind == ("emulated" if gpu else "cpu")
    t.data[0, 0] = 99                                   # the fed copy does not follow the caller's array
    got = ws.fetch("q")
    assert isinstance(got, Int8Tensor) and type(got.data) is np.ndarray and got.data[0, 0] == 0
    got.data[0, 0] = 77                                 # nor does the blob follow the fetched copy
    assert ws.fetch("q").data[0, 0] == 0


# ----------------------------------------------------------------------------------------------- save / load
def int8_blob_proto(name, dims, data, data_type, scale, bias):
    """A BlobProto the way Caffe2's Int8TensorCPUSerializer writes one (int8_serialization.cc)."""
    proto = BlobProto(name=name, type="Int8TensorCPU")
    q = proto.qtensor
    q.name, q.precision, q.scale, q.bias, q.is_signed, q.data_type = name, 8, scale, bias, False, data_type
    q.dims.extend(dims)
    q.data.extend(data)
    return proto


def test_save_writes_caffe2s_int8tensorcpu_blob(tmp_path):
    path = tmp_path / "q.minidb"
    minidb.save_blobs(path, {"w": Int8Tensor(CODES, 0.5, 3), "b": Int8Tensor(np.array([-4, 9], np.int32), 0.25)})
    records = dict(minidb.read_records(path))
    w, b = BlobProto(), BlobProto()
    w.ParseFromString(records["w"])
    b.ParseFromString(records["b"])
    assert w.name == "w" and w.type == "Int8TensorCPU" and not w.HasField("tensor")
    q = w.qtensor
    assert (list(q.dims), q.precision, q.scale, q.bias, q.is_signed, q.data_type, q.name) == \
        ([2, 3], 8, 0.5, 3.0, False, DataType.UINT8, "w")
    assert list(q.data) == CODES.reshape(-1).tolist()
    assert b.qtensor.data_type == DataType.INT32 and list(b.qtensor.data) == [-4, 9]


def test_save_load_round_trip(tmp_path):
    blobs = {"w": Int8Tensor(CODES, 0.1, 3), "b": Int8Tensor(np.array([-4, 9], np.int32), 0.01, 0),
             "s": Int8Tensor(np.array(7, np.uint8), 2.0, 1), "e": Int8Tensor(np.zeros((0, 4), np.uint8), 1.0)}
    minidb.save_blobs(tmp_path / "q.minidb", blobs)
    got = minidb.load_blobs(tmp_path / "q.minidb")
    assert set(got) == set(blobs) and all(codes_equal(got[k], v) for k, v in blobs.items())


def test_a_caffe2_saved_int8_blob_loads(tmp_path):
    proto = int8_blob_proto("x", [1, 2, 2], [0, 255, 17, 128], DataType.UINT8, 0.0078125, 128)
    minidb.write_records(tmp_path / "c2.minidb", [("x", proto.SerializeToString())])
    got = minidb.load_blobs(tmp_path / "c2.minidb")["x"]
    assert codes_equal(got, Int8Tensor(np.array([0, 255, 17, 128], np.uint8).reshape(1, 2, 2), 0.0078125, 128))


@pytest.mark.parametrize("proto, words", [
    (int8_blob_proto("x", [2], [1, 2], DataType.FLOAT, 1.0, 0), "data type FLOAT is not supported"),
    (int8_blob_proto("x", [3], [1, 2], DataType.UINT8, 1.0, 0), "need 3 values but data holds 2"),
    (int8_blob_proto("x", [2], [1, 256], DataType.UINT8, 1.0, 0), "outside the uint8 range"),
    (int8_blob_proto("x", [1], [1], DataType.UINT8, 1.0, 0.5), "integer zero point"),
    (BlobProto(name="x", type="Int8TensorCPU"), "qtensor field")])
def test_malformed_int8_blobs_are_named(tmp_path, proto, words):
    minidb.write_records(tmp_path / "bad.minidb", [("x", proto.SerializeToString())])
    with pytest.raises(FileFormatError, match=f"bad.minidb: record 'x'.*blob 'x'.*{words}"):
        minidb.load_blobs(tmp_path / "bad.minidb")


def test_save_and_load_ops_round_trip_an_int8_blob(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # a model's db paths are confined to the working directory
    ws = Workspace()
    ws.feed("q", Int8Tensor(CODES, 0.5, 3))
    db = str(tmp_path / "ops.minidb")
    ws.run_operator_once(make_op("Save", ["q"], [], db=db, db_type="minidb", absolute_path=1))
    other = Workspace()
    other.run_operator_once(make_op("Load", [], ["q"], db=db, db_type="minidb", absolute_path=1))
    assert codes_equal(other.fetch("q"), Int8Tensor(CODES, 0.5, 3))


def test_checkpoints_keep_int8_blobs(tmp_path):
    ws = Workspace()
    ws.feed("q", Int8Tensor(CODES, 0.5, 3))
    ws.feed("x", np.ones(2, np.float32))
    assert checkpoints.save(ws, tmp_path / "ck.minidb") == 2
    other = Workspace()
    checkpoints.load(other, tmp_path / "ck.minidb")
    assert codes_equal(other.fetch("q"), Int8Tensor(CODES, 0.5, 3))


# ----------------------------------------------------------------------------------------------- printing
def test_print_shows_the_codes_and_quantization(capsys):
    ws = Workspace()
    ws.feed("q", Int8Tensor(CODES, 0.5, 3))
    net = NetDef(name="p")
    net.op.append(make_op("Print", ["q"], []))
    ws.run_net_once(net)
    assert capsys.readouterr().out == "Int8Tensor q of type uint8, scale 0.5, zero_point 3. Dims: (2,3,): " \
                                      "0,3,127,128,200,255\n"
    assert format_tensor("q", Int8Tensor(CODES, 0.5, 3), 2).endswith("Dims: (2,3,): 0,3")


def test_cli_format_and_npz_of_an_int8_blob(tmp_path):
    t = Int8Tensor(np.arange(8, dtype=np.uint8), 0.5, 2)
    assert format_blob("q", t) == "q: Int8Tensor shape (8,) uint8 scale 0.5 zero_point 2 [0, 1, 2, 3, 4, 5] ... " \
                                  "(8 values)"
    save_npz(tmp_path / "o.npz", {"q": t})
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["q"], (np.arange(8) - 2) * 0.5)


def test_an_int8_blob_is_an_error_for_float_ops_in_a_net():
    ws = Workspace()
    ws.feed("q", Int8Tensor(CODES, 0.5, 3))
    with pytest.raises(StepnetError, match="op #0 \\(Sigmoid\\).*q \\(2, 3\\) uint8 Int8 \\(scale 0.5, zero point "
                       "3\\)\\]; 'q' is an Int8 tensor: dequantize first \\(Int8Dequantize\\)"):
        ws.run_operator_once(make_op("Sigmoid", ["q"], ["y"]))


# ----------------------------------------------------------------------------------------------- run_op
def test_run_op_checks_int8_outputs_and_inputs(temporary_op):
    """run_op compares an Int8 output's quantization with the shape function's, and sees a kernel that writes
    into an Int8 input's codes."""
    def honest(xp, x):
        return Int8Tensor(x.data.copy(), x.scale, x.zero_point)

    def scribbler(xp, x):
        x.data[...] = 0
        return honest(xp, x)

    def says(quant):
        return lambda specs: [TensorSpec(specs[0].shape, specs[0].dtype, None, quant)]

    temporary_op("Int8Same_", honest, shape=says((0.5, 3)))
    temporary_op("Int8Lies_", honest, shape=says((1.0, 0)))
    temporary_op("Int8Plain_", honest, shape=says(None))
    temporary_op("Int8Scribbles_", scribbler, shape=says((0.5, 3)))
    assert codes_equal(run_op("Int8Same_", [Int8Tensor(CODES, 0.5, 3)]), Int8Tensor(CODES, 0.5, 3))
    for op_type, words in (("Int8Lies_", "quantization"), ("Int8Plain_", "quantization"),
                           ("Int8Scribbles_", "changed its input")):
        with pytest.raises(AssertionError, match=words):
            run_op(op_type, [Int8Tensor(CODES, 0.5, 3)])


def test_cli_runs_an_int8_net_and_prints_its_blobs(tmp_path, capsys):
    from stepnet import save
    from stepnet.cli.run import main

    init, predict = NetDef(name="init"), NetDef(name="predict", external_input=["x"], external_output=["y", "q"])
    init.op.append(make_op("Int8GivenTensorFill", [], ["x"], shape=[2, 2], values=bytes([0, 5, 9, 200]),
                           Y_scale=0.5, Y_zero_point=9))
    predict.op.append(make_op("Int8Relu", ["x"], ["q"], Y_scale=0.5, Y_zero_point=9))
    predict.op.append(make_op("Int8Dequantize", ["q"], ["y"]))
    save(init, tmp_path / "init.pbtxt")
    save(predict, tmp_path / "predict.pbtxt")
    assert main(["run", str(tmp_path / "init.pbtxt"), str(tmp_path / "predict.pbtxt")]) == 0
    out = capsys.readouterr().out
    assert "y: shape (2, 2) float32 [ 0. ,  0. ,  0. , 95.5]" in out
    assert "q: Int8Tensor shape (2, 2) uint8 scale 0.5 zero_point 9 [  9,   9,   9, 200]" in out
