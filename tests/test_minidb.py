"""The minidb file format and blob <-> BlobProto conversion (stepnet/io/minidb.py).

Independent references: records and BlobProtos built by hand with struct and raw protobuf wire bytes (the
layout of caffe2/core/db.cc and caffe2.proto), and Python loops over the expected chunk boundaries."""
import os
import struct

import numpy as np
import pytest

from stepnet.io import minidb
from stepnet.core.backend import EMULATED, DeviceArray
from stepnet.core.errors import DTypeError, FileFormatError, MissingBlobError
from stepnet.ops.util import Mutex
from stepnet.io.proto import BlobProto, TensorProto
from stepnet.testing import allocates_under

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.int16, np.uint8, np.uint16,
          np.bool_]
SHAPES = [(), (0,), (2, 0, 3), (5,), (2, 3, 4)]


# ------------------------------------------------------------------------------------------- raw wire helpers
def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def vfield(num: int, n: int) -> bytes:
    return varint(num << 3) + varint(n)


def lfield(num: int, payload: bytes) -> bytes:
    return varint((num << 3) | 2) + varint(len(payload)) + payload


def record(key: bytes, value: bytes) -> bytes:
    return struct.pack("<ii", len(key), len(value)) + key + value


def hand_float_blob(name: bytes, dims, values, segment=None) -> bytes:
    """A BlobProto of a FLOAT tensor, encoded by hand (field numbers from caffe2.proto)."""
    payload = struct.pack(f"<{len(values)}f", *values)
    t = b"".join(vfield(1, d) for d in dims) + vfield(2, 1) + lfield(3, payload)
    t += lfield(7, name)
    if segment is not None:
        t += lfield(11, vfield(1, segment[0]) + vfield(2, segment[1]))
    return lfield(1, name) + lfield(2, b"Tensor") + lfield(3, t)


def random_array(dtype, shape, rng):
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.dtype(dtype).kind == "f":
        x = np.asarray(rng.standard_normal(shape) * 100).astype(dtype)
        if x.size >= 4:
            x.reshape(-1)[:4] = [np.nan, -0.0, np.inf, -np.inf]
        return x
    info = np.iinfo(dtype)
    return np.asarray(rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype))


# --------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_roundtrip_every_dtype_and_shape(tmp_path, dtype):
    rng = np.random.default_rng(0)
    blobs = {f"b{i}": random_array(dtype, shape, rng) for i, shape in enumerate(SHAPES)}
    path = tmp_path / "all.minidb"
    minidb.save_blobs(path, blobs)
    back = minidb.load_blobs(path)
    assert sorted(back) == sorted(blobs)
    for name, want in blobs.items():
        got = back[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name  # bit-exact, NaN payloads and signed zeros included


def test_roundtrip_strings_and_string_tensors(tmp_path):
    path = tmp_path / "s.minidb"
    words = np.array([b"alpha", b"", "beta\u00e9".encode(), b"\x00\xff"], dtype=object).reshape(2, 2)
    minidb.save_blobs(path, {"text": "hello world", "raw": b"\x00\x01", "words": words})
    back = minidb.load_blobs(path)
    assert back["text"] == b"hello world" and back["raw"] == b"\x00\x01"
    assert back["words"].shape == (2, 2) and back["words"].tolist() == words.tolist()


def test_records_follow_caffe2_layout(tmp_path):
    """Each record: struct '<ii' lengths, key, value; tensor keys '<name>#%0'; fields as Caffe2 writes."""
    path = tmp_path / "layout.minidb"
    w = np.array([[1.5, -2.0, 3.25]], np.float32)
    n = np.array([7, -8], np.int64)
    flags = np.array([True, False, True])
    minidb.save_blobs(path, {"w": w, "n": n, "flags": flags, "s": "txt"})
    data = path.read_bytes()
    offset, seen = 0, []
    while offset < len(data):
        klen, vlen = struct.unpack_from("<ii", data, offset)
        key = data[offset + 8:offset + 8 + klen].decode()
        proto = BlobProto.FromString(data[offset + 8 + klen:offset + 8 + klen + vlen])
        seen.append((key, proto))
        offset += 8 + klen + vlen
    assert offset == len(data)
    assert [k for k, _ in seen] == ["w#%0", "n#%0", "flags#%0", "s"]
    pw, pn, pf, ps = (p for _, p in seen)
    assert pw.type == "Tensor" and pw.name == "w" and pw.tensor.name == "w"
    assert list(pw.tensor.dims) == [1, 3] and list(pw.tensor.float_data) == [1.5, -2.0, 3.25]
    assert (pw.tensor.segment.begin, pw.tensor.segment.end) == (0, 3)
    assert pw.tensor.HasField("device_detail") and pw.tensor.device_detail.device_type == 0
    assert pn.tensor.data_type == TensorProto.INT64 and list(pn.tensor.int64_data) == [7, -8]
    assert pf.tensor.data_type == TensorProto.BOOL and list(pf.tensor.int32_data) == [1, 0, 1]
    assert ps.type == "std::string" and ps.content == b"txt" and not ps.HasField("tensor")


def test_hand_built_file_is_parsed(tmp_path):
    """A file made with struct.pack and raw protobuf bytes (no stepnet code): a whole tensor under a legacy
    key without '#%', a tensor in two chunks stored out of order, and a string blob."""
    a = hand_float_blob(b"a", [2, 2], [1.0, 2.0, 3.0, 4.0])
    c1 = hand_float_blob(b"c", [5], [3.0, 4.0, 5.0], segment=(2, 5))
    c0 = hand_float_blob(b"c", [5], [1.0, 2.0], segment=(0, 2))
    s = lfield(1, b"s") + lfield(2, b"std::string") + lfield(4, b"bytes\x00here")
    data = record(b"a", a) + record(b"c#%1", c1) + record(b"s", s) + record(b"c#%0", c0)
    path = tmp_path / "hand.minidb"
    path.write_bytes(data)
    db = minidb.MiniDB(path)
    assert db.keys() == ["a", "c#%1", "s", "c#%0"]
    assert [db.offset(i) for i in range(4)] == [0, 9 + len(a), 9 + len(a) + 12 + len(c1),
                                                9 + len(a) + 12 + len(c1) + 9 + len(s)]
    assert db.get("s") == s and "c#%0" in db and "c" not in db
    back = minidb.load_blobs(path)
    assert back["a"].dtype == np.float32 and back["a"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert back["c"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert back["s"] == b"bytes\x00here"
    assert minidb.load_blobs(path, names=["c"]).keys() == {"c"}


def test_writer_bytes_equal_hand_packed():
    assert minidb.pack_record("key", b"\x01\x02\x03") == struct.pack("<ii", 3, 3) + b"key\x01\x02\x03"
    with pytest.raises(ValueError, match="non-empty"):
        minidb.pack_record("", b"x")


# --------------------------------------------------------------------------------------------- chunks
@pytest.mark.parametrize("chunk_size, numel", [(4, 10), (5, 10), (1, 3), (3, 0), (0, 7), (-1, 7)])
def test_chunked_tensors(tmp_path, chunk_size, numel):
    x = np.arange(numel, dtype=np.float64).reshape(-1, 1) * 1.5
    path = tmp_path / "chunks.minidb"
    minidb.save_blobs(path, {"x": x}, chunk_size=chunk_size)
    step = numel + 1 if chunk_size == 0 else (1_000_000 if chunk_size == -1 else chunk_size)
    expect = []
    begin = 0
    while True:  # Caffe2 writes at least one chunk, even for an empty tensor
        expect.append((f"x#%{begin // step}", begin, min(begin + step, numel)))
        begin += step
        if begin >= numel:
            break
    got = []
    for key, value in minidb.read_records(path):
        t = BlobProto.FromString(value).tensor
        assert list(t.dims) == [numel, 1]
        assert list(t.double_data) == [1.5 * i for i in range(t.segment.begin, t.segment.end)]
        got.append((key, t.segment.begin, t.segment.end))
    assert got == expect
    back = minidb.load_blobs(path)["x"]
    assert back.shape == x.shape and np.array_equal(back, x)


def test_incomplete_or_overlapping_chunks_are_errors(tmp_path):
    first = hand_float_blob(b"c", [4], [1.0, 2.0], segment=(0, 2))
    path = tmp_path / "bad.minidb"
    path.write_bytes(record(b"c#%0", first))
    with pytest.raises(FileFormatError, match="blob 'c' is incomplete: it has 4 elements but its chunks"):
        minidb.load_blobs(path)
    path.write_bytes(record(b"c#%0", first) + record(b"c#%1", hand_float_blob(b"c", [4], [9.0, 9.0, 9.0],
                                                                               segment=(1, 4))))
    with pytest.raises(FileFormatError, match="hold more than its 4 elements"):
        minidb.load_blobs(path)
    s = lfield(1, b"s") + lfield(2, b"std::string") + lfield(4, b"x")
    path.write_bytes(record(b"s", s) + record(b"s", s))
    with pytest.raises(FileFormatError, match="blob 's' appears twice"):
        minidb.load_blobs(path)
    path.write_bytes(record(b"q", lfield(1, b"q") + lfield(2, b"SomeCustomType") + lfield(4, b"?")))
    with pytest.raises(FileFormatError, match="type 'SomeCustomType', which stepnet cannot load"):
        minidb.load_blobs(path)


# --------------------------------------------------------------------------------------------- bad files
def test_truncated_file_names_the_offset(tmp_path):
    path = tmp_path / "t.minidb"
    minidb.save_blobs(path, {"a": np.ones(3, np.float32), "b": np.arange(4, dtype=np.int32)})
    data = path.read_bytes()
    klen, vlen = struct.unpack_from("<ii", data, 0)
    second = 8 + klen + vlen
    tail = len(data) - second
    for cut, what in [(second + 5, "header needs 8 bytes but only 5 remain"),
                      (len(data) - 1, f"needs {tail} bytes but only {tail - 1} remain"),
                      (3, "header needs 8 bytes but only 3 remain")]:
        path.write_bytes(data[:cut])
        offset = 0 if cut == 3 else second
        with pytest.raises(FileFormatError, match=f"truncated minidb record at byte offset {offset}: .*{what}"
                           ):
            minidb.MiniDB(path)


def test_garbage_and_missing_files(tmp_path):
    path = tmp_path / "g.minidb"
    path.write_bytes(struct.pack("<ii", 0, 4) + b"abcd")
    with pytest.raises(FileFormatError, match="bad minidb record at byte offset 0: key length 0"):
        minidb.MiniDB(path)
    path.write_bytes(record(b"k", b"\xff\xff\xff"))
    with pytest.raises(FileFormatError, match=r"record 'k' at byte offset 0: the value is not a serialized"):
        minidb.load_blobs(path)
    with pytest.raises(FileFormatError, match="nothere.minidb: no such file"):
        minidb.MiniDB(tmp_path / "nothere.minidb")
    empty = tmp_path / "empty.minidb"
    empty.write_bytes(b"")
    assert len(minidb.MiniDB(empty)) == 0 and minidb.load_blobs(empty) == {}
    with pytest.raises(MissingBlobError, match="no blob 'w' in the file"):
        minidb.load_blobs(empty, names=["w"])


def test_failed_write_leaves_old_file(tmp_path, monkeypatch):
    path = tmp_path / "keep.minidb"
    minidb.save_blobs(path, {"old": np.ones(2, np.float32)})
    before = path.read_bytes()

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(FileFormatError, match="cannot write .No space left"):
        minidb.save_blobs(path, {"new": np.zeros(5, np.float32)})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.minidb"]  # no temporary file left behind
    with pytest.raises(DTypeError, match="blob 'bad' holds a object, which cannot be saved"):
        minidb.save_blobs(path, {"fine": np.ones(1), "bad": object()})
    assert path.read_bytes() == before


# --------------------------------------------------------------------------------------------- opaque blobs
def test_mutex_saves_as_empty_content_and_device_detail(tmp_path):
    path = tmp_path / "m.minidb"
    on_device = EMULATED.asarray(np.arange(3, dtype=np.float32))
    minidb.save_blobs(path, {"mutex": Mutex(), "g": on_device})
    recs = dict(minidb.read_records(path))
    p = BlobProto.FromString(recs["mutex"])
    assert p.type == "std::unique_ptr<std::mutex>" and p.HasField("content") and p.content == b""
    detail = BlobProto.FromString(recs["g#%0"]).tensor.device_detail
    assert (detail.device_type, detail.device_id) == (1, 0)
    back = minidb.load_blobs(path)
    assert isinstance(back["mutex"], Mutex) and not back["mutex"].locked()
    assert type(back["g"]) is np.ndarray and not isinstance(back["g"], DeviceArray)
    assert back["g"].tolist() == [0.0, 1.0, 2.0]


def test_dataset_records(tmp_path):
    path = tmp_path / "data.minidb"
    rows = [(np.full((2,), i, np.float32), np.array(i, np.int32)) for i in range(3)]
    minidb.save_dataset(path, rows)
    db = minidb.MiniDB(path)
    assert db.keys() == ["00000000", "00000001", "00000002"]
    x, y = minidb.parse_tensor_protos(db.value(2), "here")
    assert x.tolist() == [2.0, 2.0] and y.shape == () and y.dtype == np.int32 and int(y) == 2


def test_the_tester_detects_a_wrong_byte_order(tmp_path, monkeypatch):
    """A writer with big-endian lengths must fail the hand-packed layout check and the reader."""
    monkeypatch.setattr(minidb, "HEADER", struct.Struct(">ii"))
    assert minidb.pack_record("key", b"abc") != struct.pack("<ii", 3, 3) + b"key" + b"abc"
    path = tmp_path / "be.minidb"
    minidb.save_blobs(path, {"x": np.ones(2, np.float32)})
    monkeypatch.undo()
    with pytest.raises(FileFormatError, match="byte offset 0"):
        minidb.MiniDB(path)


def test_blob_protos_are_reexported_by_minidb():
    from stepnet.io import blobs
    for name in ("BlobAssembler", "BlobType", "register_blob_type", "serialize_blob", "blob_protos",
                 "tensor_blob_protos", "blob_name_of_key", "parse_blob_proto", "device_detail_of", "chunk_length",
                 "CHUNK_DEFAULT", "NO_CHUNKING", "DEFAULT_CHUNK_SIZE", "CHUNK_SEPARATOR", "TENSOR_TYPE",
                 "STRING_TYPE"):
        assert getattr(minidb, name) is getattr(blobs, name), name


# --------------------------------------------------------------------------------------------- hostile files
def test_a_key_that_is_not_utf8_names_no_blob(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the Load below reads under the file root (the working directory)
    path = tmp_path / "k.minidb"
    good = hand_float_blob(b"w", [1], [1.0])
    path.write_bytes(record(b"w", good) + record(b"x\xff#%0", good))
    with pytest.raises(FileFormatError, match=r"k\.minidb: record at byte offset \d+: db key b'x\\xff#%0' is not "
                                              "valid UTF-8, so it cannot name a blob"):
        minidb.load_blobs(path)
    db = minidb.MiniDB(path)   # a dataset's keys are never names: reading the records still works
    assert len(db) == 2 and db.value(1) == good
    from stepnet import Workspace
    from stepnet.testing import make_op
    load = make_op("Load", [], ["w"], db=str(path), db_type="minidb", absolute_path=1, load_all=1)
    with pytest.raises(FileFormatError, match=r"op #0 \(Load\): db key b'x\\xff#%0' is not valid UTF-8"):
        Workspace().run_operator_once(load)


@pytest.mark.parametrize("blob, path", [
    (lfield(1, b"w") + lfield(2, b"Tens\xffr") + lfield(3, vfield(1, 1) + vfield(2, 1)), "field type"),
    (lfield(1, b"w") + lfield(2, b"Tensor") + lfield(3, vfield(1, 1) + vfield(2, 1) + lfield(7, b"\xfe")),
     "tensor name"),
], ids=["type", "tensor name"])
def test_a_blob_proto_string_that_is_not_utf8_names_its_field(tmp_path, blob, path):
    file = tmp_path / "b.minidb"
    file.write_bytes(record(b"w", blob))
    with pytest.raises(FileFormatError, match=f"record 'w' at byte offset 0: {path} is not valid UTF-8"):
        minidb.load_blobs(file)


def test_a_dataset_record_whose_tensor_name_is_not_utf8(tmp_path):
    value = lfield(1, vfield(1, 1) + vfield(2, 1) + lfield(3, struct.pack("<f", 1.0)) + lfield(7, b"\xc3("))
    with pytest.raises(FileFormatError, match=r"row 3: tensor #0 name is not valid UTF-8 \(byte 0xc3 at offset 0"):
        minidb.parse_tensor_protos(value, "row 3")


@pytest.mark.parametrize("dims, values, segment, match", [
    ([-2, -3], [1.0] * 6, None, r"dims \[-2, -3\] hold a negative size"),
    ([2**32, 2**32], [], None, "describe more elements than any array can hold"),
    ([2**28, 2**28], [1.0], None, "need 72057594037927936 elements but FLOAT data holds 1"),
    ([10**12], [1.0], (0, 1), "is incomplete: it has 1000000000000 elements but its chunks hold 1"),
    ([4], [1.0] * 8, (0, 8), r"segment \[0, 8\) is outside its 4 elements"),
], ids=["negative", "int64 overflow", "2**56", "huge chunked", "segment past the end"])
def test_tensor_headers_that_lie_allocate_nothing(tmp_path, dims, values, segment, match):
    path = tmp_path / "t.minidb"
    path.write_bytes(record(b"w#%0" if segment else b"w", hand_float_blob(b"w", dims, values, segment)))
    with allocates_under(), pytest.raises(FileFormatError, match=match):
        minidb.load_blobs(path)


def test_an_opaque_blob_whose_content_is_garbage(tmp_path):
    from stepnet.io.dbreader import DBReader  # noqa: F401 - registers the DBReader blob type
    path = tmp_path / "r.minidb"
    path.write_bytes(record(b"r", lfield(1, b"r") + lfield(2, b"DBReader") + lfield(4, b"\xff\xff\xff")))
    with pytest.raises(FileFormatError, match="blob 'r' of type 'DBReader' cannot be read from its content"):
        minidb.load_blobs(path)


def test_only_regular_files_are_read(tmp_path, fifo, no_hang):
    with pytest.raises(FileFormatError, match=r"pipe: the minidb file is not a regular file \(a FIFO\)"):
        no_hang(minidb.load_blobs, fifo)
    with pytest.raises(FileFormatError, match=r"the minidb file is not a regular file \(a directory\)"):
        minidb.MiniDB(tmp_path)
    if os.path.exists("/dev/zero"):
        with pytest.raises(FileFormatError, match=r"not a regular file \(a character device\)"):
            no_hang(minidb.MiniDB, "/dev/zero")
