"""What a model file may allocate: Limits.max_blob_bytes, checked statically (infer_net) and before allocating in
fill ops (their records' `alloc`), TensorProtosDBInput batches, Load / minidb loads and .npy/.npz feeds. A
one-number edit of a file otherwise makes a fill of many GiB. Tests use a 1 KiB limit."""
import io
import os
import time

import numpy as np
import pytest

from stepnet import NetDef, Workspace, save
from stepnet.io import minidb
from stepnet.cli.run import main
from stepnet.core.errors import ArgumentError, FileFormatError, ResourceError
from stepnet.io.feeds import parse_feed
from stepnet.core.limits import FALLBACK_MAX_BLOB_BYTES, Limits, default_max_blob_bytes, parse_size
from stepnet.passes.shapes import infer_net
from stepnet.testing import make_op

KIB = 1024
SMALL = Limits(max_blob_bytes=KIB)


def net(*ops, name="model"):
    nd = NetDef(name=name)
    nd.op.extend(ops)
    return nd


def over(message, blob, shape, dtype, nbytes, where=""):
    """The parts a ResourceError must name."""
    for part in (where, f"blob {blob!r} would be {shape} {dtype}, {nbytes} bytes", "over the limit of 1024 bytes "
                 "(1.0 KiB) per blob", "--max-blob-bytes SIZE"):
        assert part in message, (part, message)


# ----------------------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("text, want", [("1073741824", 1 << 30), ("512M", 512 << 20), ("8G", 8 << 30),
                                        ("1k", 1024), ("64KiB", 64 << 10), ("1.5G", 3 << 29), ("2TB", 2 << 40),
                                        ("0", 0)])
def test_parse_size(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "-1", "G", "12 apples", "1e9", "0x10"])
def test_parse_size_refuses(text):
    with pytest.raises(ArgumentError, match="e.g. 512M, 8G or 1073741824"):
        parse_size(text)


def test_default_is_a_quarter_of_the_physical_memory(monkeypatch):
    assert Limits().max_blob_bytes == default_max_blob_bytes() == (
        os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4)

    def unknown(name):
        raise ValueError(name)
    monkeypatch.setattr(os, "sysconf", unknown)
    assert Limits().max_blob_bytes == FALLBACK_MAX_BLOB_BYTES == 4 << 30


def test_children_inherit_the_limit():
    ws = Workspace(limits=SMALL)
    assert ws.limits.max_blob_bytes == KIB and Workspace(parent=ws).limits is ws.limits


# ----------------------------------------------------------------------------------------- fill ops
# (op, over-limit inputs and arguments, the blob's shape and dtype then, under-limit inputs and arguments)
FILLS = [
    ("ConstantFill", {}, {"shape": [100, 100], "value": 1.0}, "(100, 100) float32", {}, {"shape": [2, 3]}),
    ("ConstantFill", {"dims": np.array([300], np.int64)}, {"input_as_shape": 1, "dtype": 10}, "(300,) int64",
     {"dims": np.array([3], np.int64)}, {"input_as_shape": 1, "dtype": 10, "value": 7}),
    ("GivenTensorFill", {}, {"shape": [300], "values": [0.5] * 300}, "(300,) float32",
     {}, {"shape": [2], "values": [0.5, 1.5]}),
    ("GivenTensorInt64Fill", {}, {"shape": [200], "values": list(range(200))}, "(200,) int64",
     {}, {"shape": [2], "values": [1, 2]}),
    ("GivenTensorByteStringToUInt8Fill", {}, {"shape": [2000], "values": [b"x" * 2000]}, "(2000,) uint8",
     {}, {"shape": [3], "values": [b"abc"]}),
    ("RangeFill", {}, {"shape": [1000]}, "(1000,) float32", {}, {"shape": [5]}),
    ("LengthsRangeFill", {"lengths": np.array([1000, 1000], np.int32)}, {}, "(2000,) int32",
     {"lengths": np.array([1, 2], np.int32)}, {}),
    ("UniformFill", {}, {"shape": [10, 100], "min": -1.0, "max": 1.0}, "(10, 100) float32", {}, {"shape": [4]}),
    ("UniformIntFill", {}, {"shape": [300], "min": 0, "max": 9}, "(300,) int32", {}, {"shape": [4]}),
    ("GaussianFill", {}, {"shape": [300]}, "(300,) float32", {}, {"shape": [4]}),
    ("XavierFill", {}, {"shape": [30, 30]}, "(30, 30) float32", {}, {"shape": [4, 2]}),
    ("MSRAFill", {}, {"shape": [30, 30]}, "(30, 30) float32", {}, {"shape": [4, 2]}),
]


@pytest.mark.parametrize("op_type, big_inputs, big, blob, small_inputs, small", FILLS,
                         ids=[f"{f[0]}{'-input' if f[1] else ''}" for f in FILLS])
def test_fills_refuse_an_oversize_blob_before_the_kernel_runs(op_type, big_inputs, big, blob, small_inputs, small,
                                                              patched):
    from stepnet.ops import REGISTRY

    schema = REGISTRY.get(op_type)
    calls = []

    def counted(*args, **kwargs):
        calls.append(op_type)
        return schema.kernel(*args, **kwargs)
    patched(op_type, kernel=counted)
    ws = Workspace(limits=SMALL)
    for name, value in small_inputs.items():
        ws.feed(name, value)
    ws.run_net_once(net(make_op(op_type, list(small_inputs), ["y"], **small)))
    assert calls == [op_type] and 0 < ws.fetch("y").nbytes <= KIB  # under the limit it runs
    for name, value in big_inputs.items():
        ws.feed(name, value)
    with pytest.raises(ResourceError) as info:
        ws.run_net_once(net(make_op(op_type, list(big_inputs), ["y"], **big)))
    shape, dtype = blob.rsplit(" ", 1)
    nbytes = int(np.prod([int(d) for d in shape.strip("(,)").split(",") if d.strip()])) * np.dtype(dtype).itemsize
    over(str(info.value), "y", shape, dtype, nbytes, f"net 'model', op #0 ({op_type}): ")
    assert calls == [op_type]  # the kernel was not called


def test_a_one_number_edit_is_refused_at_once_with_the_default_limit():
    start = time.process_time()      # (CPU time: this process's work, not the machine's load)
    with pytest.raises(ResourceError, match=r"blob 'w' would be \(1048576, 1048576\) float32, 4398046511104 bytes "
                                            r"\(4.0 TiB\), over the limit"):
        Workspace().run_net_once(net(make_op("ConstantFill", [], ["w"], shape=[1 << 20, 1 << 20], value=1.0)))
    assert time.process_time() - start < 5


def test_static_inference_refuses_first(tmp_path, monkeypatch, capsys):
    nd = net(make_op("Relu", ["x"], ["r"]), make_op("ConstantFill", [], ["big"], shape=[1000, 1000]))
    specs = infer_net(nd, {}, max_blob_bytes=4000000)  # unknown x: r unknown; big known, at the limit
    with pytest.raises(ResourceError) as info:
        infer_net(nd, {}, max_blob_bytes=KIB)
    over(str(info.value), "big", "(1000, 1000)", "float32", 4000000, "net 'model', op #1 (ConstantFill): ")
    assert specs["big"].shape == (1000, 1000) and infer_net(nd, {})["big"].shape == (1000, 1000)
    # `stepnet run` infers the predict net before running it: nothing of it runs
    monkeypatch.chdir(tmp_path)
    init = net(make_op("ConstantFill", [], ["x"], shape=[2], value=1.0), name="init")
    predict = net(make_op("Save", ["x"], [], db="ran.minidb", db_type="minidb"),
                  make_op("ConstantFill", [], ["big"], shape=[1000, 1000]), name="predict")
    save(init, tmp_path / "init.pbtxt")
    save(predict, tmp_path / "predict.pbtxt")
    assert main(["run", "init.pbtxt", "predict.pbtxt", "--max-blob-bytes", "1K", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stepnet: error: net 'predict', op #1 (ConstantFill): blob 'big' would be (1000, 1000)")
    assert not (tmp_path / "ran.minidb").exists()
    assert main(["run", "init.pbtxt", "predict.pbtxt", "--max-blob-bytes", "4M", "-q"]) == 0
    assert (tmp_path / "ran.minidb").exists()
    assert main(["inspect", "predict.pbtxt", "--shapes", "--max-blob-bytes", "1024"]) == 1
    assert "blob 'big' would be (1000, 1000) float32" in capsys.readouterr().err
    assert main(["inspect", "predict.pbtxt", "--shapes", "--max-blob-bytes", "4000000"]) == 0
    with pytest.raises(SystemExit):
        main(["run", "init.pbtxt", "--max-blob-bytes", "lots"])
    assert "size 'lots': expected a number of bytes" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- db input and loads
def test_tensor_protos_db_input_stops_before_a_batch_passes_the_limit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    minidb.save_dataset("data.minidb", [(np.full((2, 3), i, np.float32),) for i in range(4)])  # 24 bytes each
    ws = Workspace(limits=SMALL)
    ws.run_net_once(net(make_op("CreateDB", [], ["reader"], db="data.minidb", db_type="minidb")))
    reader = ws.get_blob("reader").value
    ws.run_net_once(net(make_op("TensorProtosDBInput", ["reader"], ["x"], batch_size=42)))  # 1008 bytes
    assert ws.fetch("x").shape == (42, 2, 3)
    start, pos = time.process_time(), reader.pos
    with pytest.raises(ResourceError) as info:
        ws.run_net_once(net(make_op("TensorProtosDBInput", ["reader"], ["x"], batch_size=1000000000000)))
    assert time.process_time() - start < 5 and reader.pos == (pos + 1) % 4  # one record read, then it stopped
    over(str(info.value), "x", "(1000000000000, 2, 3)", "float32", 24000000000000,
         "net 'model', op #0 (TensorProtosDBInput): batch_size 1000000000000: ")
    with pytest.raises(ResourceError, match=r"blob 'x' would be \(43, 2, 3\) float32, 1032 bytes"):
        ws.run_net_once(net(make_op("TensorProtosDBInput", ["reader"], ["x"], batch_size=43)))
    minidb.save_dataset("big.minidb", [(np.zeros(300, np.float32),)])
    ws.run_net_once(net(make_op("CreateDB", [], ["r2"], db="big.minidb", db_type="minidb")))
    with pytest.raises(ResourceError, match=r"blob 'x' would be \(300,\) float32, 1200 bytes"):
        ws.run_net_once(net(make_op("TensorProtosDBInput", ["r2"], ["x"])))  # batch_size 0: one record


def test_loads_check_the_dims_before_assembling(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    minidb.save_blobs("w.minidb", {"w": np.zeros(300, np.float32), "b": np.zeros(4, np.float32)}, chunk_size=100)
    ws = Workspace(limits=SMALL)
    ws.run_net_once(net(make_op("Load", [], ["b"], db="w.minidb", db_type="minidb")))
    assert ws.fetch("b").shape == (4,)
    with pytest.raises(ResourceError) as info:
        ws.run_net_once(net(make_op("Load", [], ["w"], db="w.minidb", db_type="minidb")))
    over(str(info.value), "w", "(300,)", "float32", 1200, "net 'model', op #0 (Load): ./w.minidb: record 'w#%0'")
    assert ws.find("w").value is None
    with pytest.raises(ResourceError, match=r"record 'w#%0' at byte offset 0: blob 'w' would be \(300,\)"):
        minidb.load_blobs("w.minidb", max_blob_bytes=KIB)
    assert minidb.load_blobs("w.minidb", ["b"], max_blob_bytes=KIB)["b"].shape == (4,)
    assert minidb.load_blobs("w.minidb")["w"].shape == (300,)  # no limit given: none
    # dims that claim 4 TiB are refused from the first record's header, before anything is allocated
    from stepnet.io.blobs import serialize_blob
    key, value = serialize_blob("huge", np.zeros(4, np.float32))[0]
    from stepnet.io.proto import BlobProto
    proto = BlobProto.FromString(value)
    proto.tensor.dims[:] = [1 << 40]
    minidb.write_records("huge.minidb", [(key, proto.SerializeToString())])
    with pytest.raises(ResourceError, match=r"blob 'huge' would be \(1099511627776,\) float32"):
        Workspace().run_net_once(net(make_op("Load", [], ["huge"], db="huge.minidb", db_type="minidb")))
    init = net(make_op("ConstantFill", [], ["x"], shape=[2], value=1.0), name="init")
    save(init, "init.pbtxt")
    assert main(["run", "init.pbtxt", "--load", "w.minidb", "--max-blob-bytes", "1K", "-q"]) == 1
    assert capsys.readouterr().err.startswith("stepnet: error: w.minidb: record 'w#%0' at byte offset 0: blob 'w' "
                                              "would be (300,) float32, 1200 bytes")
    assert main(["run", "init.pbtxt", "--load", "w.minidb", "-q"]) == 0


# ----------------------------------------------------------------------------------------- feeds
def npy_claiming(shape, dtype="<f4") -> bytes:
    """A .npy file whose header claims `shape` but that holds no data: loading it would allocate first."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def test_feeds_check_the_npy_header_before_loading(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    np.save("ok.npy", np.zeros(4, np.float32))
    np.save("big.npy", np.zeros(300, np.float32))
    np.savez("both.npz", a=np.zeros(4, np.float32), b=np.zeros(300, np.float32))
    open("huge.npy", "wb").write(npy_claiming((1 << 40,)))
    assert parse_feed("x=ok.npy", KIB)["x"].shape == (4,)
    assert parse_feed("x=big.npy")["x"].shape == (300,)  # no limit given: none
    member = "both.npz member 'b.npy'"
    for spec, blob, where in (("x=big.npy", "x", "big.npy"), ("both.npz", "b", member), ("x=both.npz", "b", member)):
        with pytest.raises(ResourceError) as info:
            parse_feed(spec, KIB)
        over(str(info.value), blob, "(300,)", "float32", 1200, f"--feed {where}: ")
    with pytest.raises(FileFormatError, match=r"header claims shape \(1099511627776,\)"):   # a header that lies
        parse_feed("x=huge.npy", Limits().max_blob_bytes)
    init = net(make_op("Copy", ["x"], ["y"]), name="init")     # a net that reads x (a feed nothing reads is refused)
    save(init, "init.pbtxt")
    assert main(["run", "init.pbtxt", "--feed", "x=big.npy", "--max-blob-bytes", "1K", "-q"]) == 1
    assert capsys.readouterr().err.startswith("stepnet: error: --feed big.npy: blob 'x' would be (300,) float32")
    assert main(["run", "init.pbtxt", "--feed", "x=big.npy", "--max-blob-bytes", "2K", "-q"]) == 0


def test_a_read_only_workspace_reads_db_files_but_writes_none(tmp_path, monkeypatch):
    from stepnet.core.errors import FileAccessError

    monkeypatch.chdir(tmp_path)
    minidb.save_blobs(tmp_path / "in.minidb", {"w": np.ones(2, np.float32)})
    ws = Workspace(limits=Limits(writes=False))
    ws.run_net_once(NetDef(name="load", op=[make_op("Load", [], ["w"], db="in.minidb", db_type="minidb",
                                                    load_all=1)]))
    assert ws.fetch("w").tolist() == [1.0, 1.0]
    ws.feed("it", np.array([3], np.int64))
    for op_type, inputs in (("Save", ["w"]), ("Checkpoint", ["it", "w"])):
        with pytest.raises(FileAccessError, match=rf"net 'save', op #0 \({op_type}\): db path .*out.minidb.*: this "
                                                  "command runs the model's ops only to compute values"):
            ws.run_net_once(NetDef(name="save", op=[make_op(op_type, inputs, [], db="out.minidb", db_type="minidb")]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.minidb"]
    with pytest.raises(FileAccessError, match="lets no op write"):   # any_path lifts the root, not this
        Limits(writes=False, any_path=True).confine("x.minidb", write=True)
