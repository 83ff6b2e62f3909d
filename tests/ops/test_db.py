"""Data and checkpoint operators: Save/Load round trips through nets on every device, Checkpoint, DBExists,
CreateDB + TensorProtosDBInput batches. References: the fed values themselves, and batch orders worked out
by hand from Caffe2's DBReader rule (read the current record, step num_shards records, restart at shard_id
at the end)."""
import os

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.io import minidb
from stepnet.core.backend import DeviceArray, device_of
from stepnet.core.errors import ArgumentError, DTypeError, FileFormatError, MissingBlobError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.io.dbreader import DBReader
from stepnet.ops.util import Mutex
from stepnet.io.proto import BlobProto, DeviceOption
from stepnet.testing import DEVICES, make_op, run_op

GPU = DeviceOption(device_type=1)


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """A model's db paths must lie under the file root, by default the working directory when the workspace is
    made: these tests run from tmp_path, where they write (test_limits.py tests the confinement itself)."""
    monkeypatch.chdir(tmp_path)


def workspace(device):
    return Workspace(gpu="emulate" if device != "cpu" else None)


def run(ws, *ops, device="cpu"):
    nd = NetDef(name="db_test")
    nd.op.extend(ops)
    if device != "cpu":
        nd.device_option.CopyFrom(GPU)
    ws.run_net_once(nd)


def feed(ws, name, value, device):
    ws.feed(name, value, device_option=GPU if device != "cpu" else None)


def blobs_example():
    rng = np.random.default_rng(3)
    return {"fc_w": rng.standard_normal((4, 3)).astype(np.float32), "fc_b": np.zeros(4, np.float32),
            "iter": np.array([17], np.int64), "emb": rng.standard_normal((5, 2)),
            "ids": np.arange(6, dtype=np.int32).reshape(2, 3), "mask": np.array([True, False]),
            "half": np.array([0.5, -1.25], np.float16), "empty": np.zeros((0, 4), np.float32)}


def assert_same(got, want, name=""):
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
    assert np.array_equal(got, want), name


# --------------------------------------------------------------------------------------------- Save / Load
@pytest.mark.parametrize("device", DEVICES)
def test_save_then_load_round_trips_a_set_of_blobs(tmp_path, device):
    blobs = blobs_example()
    ws = workspace(device)
    for name, value in blobs.items():
        feed(ws, name, value, device)
    ws.feed("vocab", "abc\x00def")
    path = str(tmp_path / "params.minidb")
    names = [*blobs, "vocab"]
    run(ws, make_op("Save", names, [], db=path, db_type="minidb", absolute_path=1), device=device)
    fresh = workspace(device)
    run(fresh, make_op("Load", [], names, db=path, db_type="minidb", absolute_path=1), device=device)
    for name, want in blobs.items():
        value = fresh.get_blob(name).value
        assert (device_of(value).is_cpu) == (device == "cpu"), name  # loaded onto the op's device
        assert_same(fresh.fetch(name), want, name)
    assert fresh.fetch("vocab") == b"abc\x00def"


@pytest.mark.parametrize("chunk_size, keys", [(-1, ["w#%0"]), (0, ["w#%0"]), (5, ["w#%0", "w#%1", "w#%2"])])
def test_save_chunk_size(tmp_path, chunk_size, keys):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    ws = Workspace()
    ws.feed("w", w)
    path = str(tmp_path / "c.minidb")
    run(ws, make_op("Save", ["w"], [], db=path, db_type="minidb", absolute_path=1, chunk_size=chunk_size))
    assert minidb.MiniDB(path).keys() == keys
    fresh = Workspace()
    run(fresh, make_op("Load", [], ["w"], db=path, db_type="minidb", absolute_path=1))
    assert_same(fresh.fetch("w"), w)


def test_relative_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ws = Workspace()
    ws.feed("x", np.array([1.0, 2.0], np.float32))
    run(ws, make_op("Save", ["x"], [], db="rel.minidb", db_type="minidb"))
    assert (tmp_path / "rel.minidb").is_file()
    run(ws, make_op("DBExists", [], ["there"], db_name="rel.minidb", db_type="minidb"),
        make_op("DBExists", [], ["gone"], db_name="nope.minidb", db_type="minidb"),
        make_op("DBExists", [], ["abs"], db_name=str(tmp_path / "rel.minidb"), db_type="minidb",
                absolute_path=1))
    assert ws.fetch("there").shape == () and ws.fetch("there").dtype == np.bool_
    assert bool(ws.fetch("there")) and not bool(ws.fetch("gone")) and bool(ws.fetch("abs"))
    fresh = Workspace()
    with pytest.raises(FileFormatError, match="absolute_path=0 puts it under the root folder; set absolute"):
        run(fresh, make_op("Load", [], ["x"], db=str(tmp_path / "rel.minidb"), db_type="minidb"))


@pytest.mark.parametrize("device", DEVICES)
def test_db_exists_with_run_op(tmp_path, device):
    path = tmp_path / "here.minidb"
    minidb.save_blobs(path, {"x": np.ones(1, np.float32)})
    for name, want in (("here.minidb", True), ("gone.minidb", False)):
        got = run_op("DBExists", [], 1, device=device, db_name=str(tmp_path / name), db_type="minidb",
                     absolute_path=1)
        assert got.shape == () and got.dtype == np.bool_ and bool(got) is want


def test_prefixes_overrides_and_source_names(tmp_path):
    ws = Workspace()
    ws.feed("gpu_0/w", np.array([1.0], np.float32))
    ws.feed("gpu_0/b", np.array([2.0], np.float32))
    path = str(tmp_path / "p.minidb")
    run(ws, make_op("Save", ["gpu_0/w", "gpu_0/b"], [], db=path, db_type="minidb", absolute_path=1,
                    strip_prefix="gpu_0/"))
    assert minidb.MiniDB(path).keys() == ["w#%0", "b#%0"]
    run(ws, make_op("Load", [], ["gpu_1/w", "gpu_1/b"], db=path, db_type="minidb", absolute_path=1,
                    add_prefix="gpu_1/"),
        make_op("Load", [], ["first", "second"], db=path, db_type="minidb", absolute_path=1,
                source_blob_names=["b", "w"]))
    assert ws.fetch("gpu_1/w").tolist() == [1.0] and ws.fetch("gpu_1/b").tolist() == [2.0]
    assert ws.fetch("first").tolist() == [2.0] and ws.fetch("second").tolist() == [1.0]
    other = str(tmp_path / "o.minidb")
    run(ws, make_op("Save", ["gpu_0/w", "gpu_0/b"], [], db=other, db_type="minidb", absolute_path=1,
                    blob_name_overrides=["W", "B"]))
    assert minidb.MiniDB(other).keys() == ["W#%0", "B#%0"]
    with pytest.raises(ArgumentError, match="blob_name_overrides has 1 names for 2 inputs"):
        run(ws, make_op("Save", ["gpu_0/w", "gpu_0/b"], [], db=other, db_type="minidb", absolute_path=1,
                        blob_name_overrides=["W"]))
    with pytest.raises(ArgumentError, match="strip_prefix and source_blob_names"):
        run(ws, make_op("Load", [], ["w"], db=path, db_type="minidb", absolute_path=1, strip_prefix="x",
                        source_blob_names=["w"]))


def test_load_all_and_several_dbs(tmp_path):
    a, b = str(tmp_path / "a.minidb"), str(tmp_path / "b.minidb")
    minidb.save_blobs(a, {"x": np.array([1], np.int32), "y": np.array([2], np.int32)})
    minidb.save_blobs(b, {"z": np.array([3], np.int32)})
    ws = Workspace()
    run(ws, make_op("Load", [], [], dbs=[a, b], db_type="minidb", absolute_path=1, load_all=1))
    assert {n: int(ws.fetch(n)[0]) for n in ("x", "y", "z")} == {"x": 1, "y": 2, "z": 3}
    run(ws, make_op("Load", [], ["z", "x"], dbs=[a, b], db_type="minidb", absolute_path=1))
    a2 = str(tmp_path / "a2.minidb")
    minidb.save_blobs(a2, {"x": np.array([9], np.int32)})
    with pytest.raises(FileFormatError, match="blob 'x' is in both .*a.minidb and .*a2.minidb"):
        run(ws, make_op("Load", [], [], dbs=[a, a2], db_type="minidb", absolute_path=1, load_all=1))
    with pytest.raises(MissingBlobError, match="blob 'w' not found"):
        run(ws, make_op("Load", [], ["w"], dbs=[a, b], db_type="minidb", absolute_path=1, load_all=1))


def test_load_missing_file_and_blobs(tmp_path):
    ws = Workspace()
    missing = str(tmp_path / "absent.minidb")
    with pytest.raises(FileFormatError, match="absent.minidb: no such file"):
        run(ws, make_op("Load", [], ["w"], db=missing, db_type="minidb", absolute_path=1))
    path = str(tmp_path / "some.minidb")
    minidb.save_blobs(path, {"fc_w": np.ones(2, np.float32), "fc_b": np.zeros(2, np.float32)})
    ws.feed("fc_bias", np.array([7.0], np.float32))
    with pytest.raises(MissingBlobError, match=r"blob 'fc_bias' not found in .*some.minidb \(did you mean "
                                               r"fc_b.*it holds fc_b, fc_w\); pass allow_incomplete=1"):
        run(ws, make_op("Load", [], ["fc_w", "fc_bias"], db=path, db_type="minidb", absolute_path=1))
    assert not ws.has("fc_w") or ws.get_blob("fc_w").value is None  # nothing written on failure
    run(ws, make_op("Load", [], ["fc_w", "fc_bias"], db=path, db_type="minidb", absolute_path=1,
                    allow_incomplete=True))
    assert ws.fetch("fc_w").tolist() == [1.0, 1.0] and ws.fetch("fc_bias").tolist() == [7.0]


def test_truncated_db_in_load(tmp_path):
    path = tmp_path / "cut.minidb"
    minidb.save_blobs(path, {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
    data = path.read_bytes()
    path.write_bytes(data[:-2])
    second = len(data) // 2  # two records of equal size
    with pytest.raises(FileFormatError, match=f"cut.minidb: truncated minidb record at byte offset {second}"):
        run(Workspace(), make_op("Load", [], ["a"], db=str(path), db_type="minidb", absolute_path=1))


def test_keep_device(tmp_path):
    path = str(tmp_path / "dev.minidb")
    ws = workspace("emulated")
    feed(ws, "g", np.arange(3, dtype=np.float32), "emulated")
    run(ws, make_op("Save", ["g"], [], db=path, db_type="minidb", absolute_path=1), device="emulated")
    fresh = workspace("emulated")
    run(fresh, make_op("Load", [], ["g"], db=path, db_type="minidb", absolute_path=1, keep_device=1),
        make_op("Load", [], ["h"], db=path, db_type="minidb", absolute_path=1, source_blob_names=["g"]))
    assert isinstance(fresh.get_blob("g").value, DeviceArray)  # the saved device (CUDA 0) is kept
    assert not isinstance(fresh.get_blob("h").value, DeviceArray)  # the CPU op's device
    assert fresh.fetch("g").tolist() == fresh.fetch("h").tolist() == [0.0, 1.0, 2.0]


def test_save_failures_leave_no_partial_file(tmp_path):
    ws = Workspace()
    ws.feed("x", np.ones(3, np.float32))
    nowhere = str(tmp_path / "no_such_dir" / "x.minidb")
    with pytest.raises(FileFormatError, match="no_such_dir/x.minidb: cannot write"):
        run(ws, make_op("Save", ["x"], [], db=nowhere, db_type="minidb", absolute_path=1))
    assert not (tmp_path / "no_such_dir").exists()
    path = str(tmp_path / "keep.minidb")
    run(ws, make_op("Save", ["x"], [], db=path, db_type="minidb", absolute_path=1))
    before = open(path, "rb").read()
    ws.create_blob("never_set")
    with pytest.raises(MissingBlobError, match="never_set"):
        run(ws, make_op("Save", ["x", "never_set"], [], db=path, db_type="minidb", absolute_path=1))
    ws.feed("x", np.zeros(3, np.float32))
    ws.create_blob("thing").set(object())
    with pytest.raises(DTypeError, match="blob 'thing' holds a object, which cannot be saved"):
        run(ws, make_op("Save", ["x", "thing"], [], db=path, db_type="minidb", absolute_path=1))
    assert open(path, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.minidb"]


def test_mutex_and_reader_blobs_round_trip(tmp_path):
    data = str(tmp_path / "data.minidb")
    minidb.save_dataset(data, [(np.array([i], np.float32),) for i in range(3)])
    ws = Workspace()
    run(ws, make_op("CreateMutex", [], ["mutex"]),
        make_op("CreateDB", [], ["reader"], db=data, db_type="minidb"))
    path = str(tmp_path / "opaque.minidb")
    run(ws, make_op("Save", ["mutex", "reader"], [], db=path, db_type="minidb", absolute_path=1))
    types = {k: BlobProto.FromString(v).type for k, v in minidb.read_records(path)}
    assert types == {"mutex": "std::unique_ptr<std::mutex>", "reader": "DBReader"}
    fresh = Workspace()
    run(fresh, make_op("Load", [], ["mutex", "reader"], db=path, db_type="minidb", absolute_path=1))
    assert isinstance(fresh.get_blob("mutex").value, Mutex)
    reader = fresh.get_blob("reader").value
    assert isinstance(reader, DBReader) and reader.source == data and len(reader.db) == 3


def test_bad_arguments():
    ws = Workspace()
    ws.feed("x", np.ones(1, np.float32))
    with pytest.raises(ArgumentError, match="db_type is 'rocksdb', but stepnet reads and writes 'minidb', 'lmdb'"):
        run(ws, make_op("Save", ["x"], [], db="x.ldb", db_type="rocksdb"))
    with pytest.raises(ArgumentError, match="required argument 'db_type' is missing"):
        run(ws, make_op("Save", ["x"], [], db="x.minidb"))
    with pytest.raises(FileFormatError, match=r"somewhere: no leveldb db there"):   # CreateDB's default db_type
        run(ws, make_op("CreateDB", [], ["r"], db="somewhere"))
    with pytest.raises(ArgumentError, match="db_type is empty"):
        run(ws, make_op("Load", [], ["x"], db="x.minidb"))
    with pytest.raises(DTypeError, match="input 0 must be a DB reader made by CreateDB, got ndarray"):
        run(ws, make_op("TensorProtosDBInput", ["x"], ["y"]))


# --------------------------------------------------------------------------------------------- Checkpoint
def test_checkpoint_every(tmp_path):
    ws = Workspace()
    ws.feed("w", np.array([1.5], np.float32))
    pattern = str(tmp_path / "ckpt_%03d.minidb")
    for it in range(5):
        ws.feed("iter", np.array([it], np.int64))
        ws.feed("w", np.array([it * 10.0], np.float32))
        run(ws, make_op("Checkpoint", ["iter", "w"], [], db=pattern, db_type="minidb", absolute_path=1,
                        every=2))
    assert sorted(os.listdir(tmp_path)) == ["ckpt_000.minidb", "ckpt_002.minidb", "ckpt_004.minidb"]
    saved = minidb.load_blobs(tmp_path / "ckpt_002.minidb")
    assert saved["iter"].tolist() == [2] and saved["w"].tolist() == [20.0]
    ws.feed("iter", np.array([7], np.int64))
    run(ws, make_op("Snapshot", ["iter", "w"], [], db=str(tmp_path / "snap_%lld"), db_type="minidb",
                    absolute_path=1))
    assert (tmp_path / "snap_7").is_file()
    ws.feed("iter", np.array([2], np.int32))
    with pytest.raises(DTypeError, match="int64 iteration counter"):
        run(ws, make_op("Checkpoint", ["iter"], [], db=pattern, db_type="minidb", absolute_path=1))
    with pytest.raises(ArgumentError, match="every must be > 0"):
        run(ws, make_op("Checkpoint", ["iter"], [], db=pattern, db_type="minidb", every=0))


# --------------------------------------------------------------------------------------------- dataset input
def make_dataset(path, n=5):
    """Record i: image (2, 3) float32 filled with i (plus its position), label int32 scalar 100 + i."""
    rows = [(np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * i, np.array(100 + i, np.int32))
            for i in range(n)]
    minidb.save_dataset(path, rows)
    return rows


def expected_batches(rows, order, batch):
    """Stacked batches of the given record order (a plain Python loop)."""
    out = []
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        out.append((np.array([rows[i][0] for i in idx]), np.array([rows[i][1] for i in idx])))
    return out


# record orders derived by hand from DBReader::Read for 5 records
ORDERS = {(1, 0): [0, 1, 2, 3, 4, 0, 1, 2], (2, 0): [0, 2, 4, 0, 2, 4, 0, 2],
          (2, 1): [1, 3, 1, 3, 1, 3, 1, 3]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shards", sorted(ORDERS))
def test_tensor_protos_db_input_batches_in_order_and_wraps(tmp_path, device, shards):
    path = str(tmp_path / "data.minidb")
    rows = make_dataset(path)
    num_shards, shard_id = shards
    ws = workspace(device)
    run(ws, make_op("CreateDB", [], ["reader"], db=path, db_type="minidb", num_shards=num_shards,
                    shard_id=shard_id), device=device)
    for want_x, want_y in expected_batches(rows, ORDERS[shards], 2):
        run(ws, make_op("TensorProtosDBInput", ["reader"], ["x", "y"], batch_size=2, device=device),
            device=device)
        assert isinstance(ws.get_blob("x").value, DeviceArray) == (device != "cpu")
        assert_same(ws.fetch("x"), want_x.astype(np.float32))
        assert_same(ws.fetch("y"), want_y.astype(np.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_protos_db_input_without_batching(tmp_path, device):
    path = str(tmp_path / "data.minidb")
    rows = make_dataset(path, n=2)
    ws = workspace(device)
    run(ws, make_op("CreateDB", [], ["reader"], db=path, db_type="minidb"), device=device)
    for i in (0, 1, 0):
        run(ws, make_op("TensorProtosDBInput", ["reader"], ["x", "y"], device=device), device=device)
        assert_same(ws.fetch("x"), rows[i][0])
        assert_same(ws.fetch("y"), rows[i][1])


def test_tensor_protos_db_input_errors(tmp_path):
    path = str(tmp_path / "data.minidb")
    make_dataset(path, n=2)
    ws = Workspace()
    run(ws, make_op("CreateDB", [], ["reader"], db=path, db_type="minidb"))
    with pytest.raises(ShapeError, match="record '00000000' at byte offset 0 holds 2 tensors but the op has"):
        run(ws, make_op("TensorProtosDBInput", ["reader"], ["x"], batch_size=1))
    ragged = str(tmp_path / "ragged.minidb")
    minidb.save_dataset(ragged, [(np.zeros(2, np.float32),), (np.zeros(3, np.float32),)])
    run(ws, make_op("CreateDB", [], ["r2"], db=ragged, db_type="minidb"))
    with pytest.raises(ShapeError, match=r"tensor 0 of .*'00000001'.* is \(3,\) float32, but the batch"):
        run(ws, make_op("TensorProtosDBInput", ["r2"], ["x"], batch_size=2))
    with pytest.raises(FileFormatError, match="nothing.minidb: no such file"):
        run(ws, make_op("CreateDB", [], ["r3"], db=str(tmp_path / "nothing.minidb"), db_type="minidb"))


def test_load_reads_from_reader_inputs(tmp_path):
    path = str(tmp_path / "p.minidb")
    minidb.save_blobs(path, {"a": np.array([1.0]), "b": np.array([2.0])})
    ws = Workspace()
    run(ws, make_op("CreateDB", [], ["reader"], db=path, db_type="minidb"),
        make_op("Load", ["reader"], ["b", "a"]))
    assert ws.fetch("a").tolist() == [1.0] and ws.fetch("b").tolist() == [2.0]


# ------------------------------------------------------------------------------------------- test the tester
def test_the_tester_detects_broken_kernels(tmp_path, broken):
    """A reader that skips a record per run and a Save that transposes its first input fail the checks."""
    path = str(tmp_path / "data.minidb")
    rows = make_dataset(path)
    schema = REGISTRY.get("TensorProtosDBInput")

    def skipping(ctx, xp, reader, *, batch_size):
        reader.read()
        return schema.kernel(ctx, xp, reader, batch_size=batch_size)
    broken("TensorProtosDBInput", skipping)
    ws = Workspace()
    run(ws, make_op("CreateDB", [], ["reader"], db=path, db_type="minidb"))
    with pytest.raises(AssertionError):
        for want_x, _ in expected_batches(rows, ORDERS[(1, 0)], 2):
            run(ws, make_op("TensorProtosDBInput", ["reader"], ["x", "y"], batch_size=2))
            assert_same(ws.fetch("x"), want_x.astype(np.float32))

    save_schema = REGISTRY.get("Save")

    def transposed_first(ctx, xp, first, *values, **args):
        return save_schema.kernel(ctx, xp, first.T, *values, **args)
    broken("Save", transposed_first)
    with pytest.raises(AssertionError, match="fc_w"):
        test_save_then_load_round_trips_a_set_of_blobs(tmp_path, "cpu")


@pytest.mark.parametrize("op_type, inputs, args", [
    ("Save", ["x"], {"db": b"\xff\xfe"}), ("Checkpoint", ["it"], {"db": b"\xff\xfe%d"}),
    ("Snapshot", ["it"], {"db": b"\xff\xfe"}), ("Load", [], {"db": b"\xff\xfe", "load_all": 1}),
    ("CreateDB", [], {"db": b"\xff\xfe"}), ("DBExists", [], {"db_name": b"\xff\xfe"})])
def test_a_db_path_that_is_not_utf8_is_an_argument_error(tmp_path, monkeypatch, op_type, inputs, args):
    """A file's path argument is bytes; ones that are not UTF-8 name no file: an ArgumentError naming the op
    (a TypeError escaped from Snapshot once; fuzz seed 998 case 4880)."""
    monkeypatch.chdir(tmp_path)
    ws = Workspace()
    ws.feed("x", np.ones(2, np.float32))
    ws.feed("it", np.array([3], np.int64))
    outputs = ["out"] if op_type in ("CreateDB", "DBExists") else []
    with pytest.raises(ArgumentError, match=rf"op #0 \({op_type}\): the db path .* is not UTF-8 text"):
        run(ws, make_op(op_type, inputs, outputs, db_type="minidb", **args))
    assert not os.listdir(tmp_path)
