"""minidb, Caffe2's flat key/value file (the usual db of Save/Load), and blobs in their BlobProto form.

A minidb file is a sequence of records, each: int32 key length, int32 value length (little-endian; both
must be > 0), the key bytes, the value bytes (`caffe2/core/db.cc`). Save stores one record per blob, the
value a serialized BlobProto; tensors are cut into chunks of `chunk_size` elements under the keys
"<name>#%<chunk index>", each chunk's TensorProto holding the full dims and its `segment` [begin, end)
(`caffe2/core/blob_serialization.cc`). Strings are BlobProtos of type "std::string" with the bytes in
`content`; other opaque objects use the serializers registered with register_blob_type.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
from google.protobuf.message import DecodeError

from . import backend
from .errors import DTypeError, FileFormatError, MissingBlobError
from .proto import (BlobProto, DataType, DeviceOption, TensorProto, TensorProtos, array_to_tensor,
                    atomic_write, join_chunks, tensor_to_array)

HEADER = struct.Struct("<ii")
CHUNK_SEPARATOR = "#%"
TENSOR_TYPE = "Tensor"
STRING_TYPE = "std::string"
DEFAULT_CHUNK_SIZE = 1_000_000  # Caffe2's flag caffe2_tensor_chunk_size
CHUNK_DEFAULT, NO_CHUNKING = -1, 0  # the special values of Save's chunk_size argument


# --------------------------------------------------------------------------------------------- records
def pack_record(key: str | bytes, value: bytes) -> bytes:
    """One record: int32 key length, int32 value length, key, value."""
    k = key.encode("utf-8", "surrogateescape") if isinstance(key, str) else bytes(key)
    v = bytes(value)
    if not k or not v:
        raise ValueError(f"minidb keys and values must be non-empty (key {k!r}, value of {len(v)} bytes)")
    if len(k) > 0x7FFFFFFF or len(v) > 0x7FFFFFFF:
        raise ValueError(f"record {k[:60]!r} is too large for minidb's int32 lengths; "
                         "save with a smaller chunk_size")
    return HEADER.pack(len(k), len(v)) + k + v


def pack_records(records: Iterable[tuple[str | bytes, bytes]]) -> bytes:
    return b"".join(pack_record(k, v) for k, v in records)


def write_records(path, records: Iterable[tuple[str | bytes, bytes]]) -> None:
    """Write a whole minidb file atomically: readers see the old file or the complete new one."""
    atomic_write(path, pack_records(records))


def _scan(data, path: str) -> list[tuple[str, int, int, int]]:
    """(key, value start, value length, record offset) of every record, checking the layout."""
    index = []
    offset, size = 0, len(data)
    while offset < size:
        if size - offset < HEADER.size:
            raise FileFormatError(f"{path}: truncated minidb record at byte offset {offset}: its header "
                                  f"needs {HEADER.size} bytes but only {size - offset} remain "
                                  "(the file was cut short)")
        klen, vlen = HEADER.unpack_from(data, offset)
        if klen <= 0 or vlen <= 0:
            raise FileFormatError(f"{path}: bad minidb record at byte offset {offset}: key length {klen}, "
                                  f"value length {vlen} (both must be > 0); the file is corrupt or not a "
                                  "minidb file")
        start = offset + HEADER.size
        end = start + klen + vlen
        if end > size:
            raise FileFormatError(f"{path}: truncated minidb record at byte offset {offset}: it needs "
                                  f"{end - offset} bytes but only {size - offset} remain (the file was cut "
                                  "short, or it is not a minidb file)")
        key = bytes(data[start:start + klen]).decode("utf-8", "surrogateescape")
        index.append((key, start + klen, vlen, offset))
        offset = end
    return index


class MiniDB:
    """A minidb file opened for reading: its records in file order, values read on demand (memory-mapped)."""

    def __init__(self, path):
        self.path = str(path)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            where = ("" if Path(path).is_absolute()
                     else f" (relative paths are read from the working directory {os.getcwd()})")
            raise FileFormatError(f"{path}: no such file{where}") from None
        except OSError as e:
            raise FileFormatError(f"{path}: cannot read ({e.strerror})") from None
        with f:
            if os.fstat(f.fileno()).st_size == 0:
                self._data = b""
            else:
                self._data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._index = _scan(self._data, self.path)
        self._first: dict[str, int] = {}
        for i, entry in enumerate(self._index):
            self._first.setdefault(entry[0], i)

    def __len__(self) -> int:
        return len(self._index)

    def key(self, i: int) -> str:
        return self._index[i][0]

    def value(self, i: int) -> bytes:
        _, start, length, _ = self._index[i]
        return bytes(self._data[start:start + length])

    def offset(self, i: int) -> int:
        """Byte offset of record i in the file (for error messages)."""
        return self._index[i][3]

    def keys(self) -> list[str]:
        return [entry[0] for entry in self._index]

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        for i in range(len(self)):
            yield self.key(i), self.value(i)

    def __contains__(self, key: str) -> bool:
        return key in self._first

    def get(self, key: str) -> bytes:
        """The value of the first record with this key."""
        try:
            return self.value(self._first[key])
        except KeyError:
            raise MissingBlobError(f"{self.path}: no record with key {key!r}") from None


def read_records(path) -> list[tuple[str, bytes]]:
    """Every (key, value) of a minidb file, in file order."""
    return list(MiniDB(path))


# ----------------------------------------------------------------------------------------- blob -> BlobProto
@dataclass(frozen=True)
class BlobType:
    """How an opaque (non-tensor) blob value is saved: its BlobProto type name and content codec."""
    name: str
    cls: type
    serialize: Callable[[Any, str], bytes]
    deserialize: Callable[[bytes], Any]


_TYPES_BY_CLASS: dict[type, BlobType] = {}
_TYPES_BY_NAME: dict[str, BlobType] = {}


def register_blob_type(cls: type, name: str, serialize: Callable[[Any, str], bytes],
                       deserialize: Callable[[bytes], Any]) -> None:
    """Let blobs holding `cls` objects be saved as BlobProtos of type `name` (and loaded back)."""
    entry = BlobType(name, cls, serialize, deserialize)
    _TYPES_BY_CLASS[cls] = entry
    _TYPES_BY_NAME[name] = entry


def device_detail_of(value) -> DeviceOption:
    """The DeviceOption Caffe2 records for a tensor: CPU (type 0), or CUDA (type 1) with its device id."""
    dev = backend.device_of(value)
    if dev is None or dev.is_cpu:
        return DeviceOption(device_type=0)
    return DeviceOption(device_type=1, device_id=dev.index)


def chunk_length(chunk_size: int, numel: int) -> int:
    """Elements per chunk for Save's chunk_size argument (-1: Caffe2's default, 0: one chunk)."""
    if chunk_size == CHUNK_DEFAULT:
        return DEFAULT_CHUNK_SIZE
    if chunk_size == NO_CHUNKING:
        return numel + 1
    if chunk_size < 0:
        raise ValueError(f"chunk_size must be > 0, 0 (no chunking) or -1 (default), got {chunk_size}")
    return chunk_size


def tensor_blob_protos(name: str, value, chunk_size: int = CHUNK_DEFAULT) -> list[tuple[str, BlobProto]]:
    """A tensor as Caffe2 saves it: (key "<name>#%<k>", BlobProto) per chunk, each with a segment."""
    detail = device_detail_of(value)
    arr = np.asarray(backend.to_host(value))  # not ascontiguousarray: it turns 0-d into 1-d
    if arr.dtype.kind == "c" or arr.dtype.kind == "V":
        raise DTypeError(f"blob {name!r} is a {arr.dtype} tensor, which Caffe2 files cannot hold")
    flat = arr.reshape(-1)
    step = chunk_length(chunk_size, flat.size)
    out = []
    for begin in range(0, max(flat.size, 1), step):
        end = min(begin + step, flat.size)
        t = array_to_tensor(flat[begin:end], name=name)
        del t.dims[:]
        t.dims.extend(arr.shape)
        t.segment.begin, t.segment.end = begin, end
        t.device_detail.CopyFrom(detail)
        proto = BlobProto(name=name, type=TENSOR_TYPE)
        proto.tensor.CopyFrom(t)
        out.append((f"{name}{CHUNK_SEPARATOR}{begin // step}", proto))
    return out


def blob_protos(name: str, value, chunk_size: int = CHUNK_DEFAULT) -> list[tuple[str, BlobProto]]:
    """(key, BlobProto) records of one blob: tensors (chunked), strings, or a registered opaque type."""
    if value is None:
        raise MissingBlobError(f"blob {name!r} holds no value (never written or fed), so it cannot be saved")
    if isinstance(value, (str, bytes)):
        content = value.encode() if isinstance(value, str) else value
        return [(name, BlobProto(name=name, type=STRING_TYPE, content=content))]
    if isinstance(value, (np.ndarray, np.generic)) or backend.device_of(value) is not None:
        return tensor_blob_protos(name, value, chunk_size)
    entry = _TYPES_BY_CLASS.get(type(value))
    if entry is None:
        known = ", ".join(sorted(t.cls.__name__ for t in _TYPES_BY_CLASS.values())) or "none"
        raise DTypeError(f"blob {name!r} holds a {type(value).__name__}, which cannot be saved (savable: "
                         f"tensors, strings, {known}); leave it out of the Save op's inputs")
    return [(name, BlobProto(name=name, type=entry.name, content=entry.serialize(value, name)))]


def serialize_blob(name: str, value, chunk_size: int = CHUNK_DEFAULT) -> list[tuple[str, bytes]]:
    """(key, serialized BlobProto) records of one blob, ready for a minidb file."""
    return [(k, p.SerializeToString()) for k, p in blob_protos(name, value, chunk_size)]


# ----------------------------------------------------------------------------------------- BlobProto -> blob
def blob_name_of_key(key: str) -> str:
    """The blob name of a record key: the key up to the chunk separator '#%'."""
    return key.split(CHUNK_SEPARATOR, 1)[0]


def parse_blob_proto(value: bytes, where: str) -> BlobProto:
    proto = BlobProto()
    try:
        proto.ParseFromString(value)
    except (DecodeError, RuntimeError, ValueError):
        raise FileFormatError(f"{where}: the value is not a serialized BlobProto") from None
    return proto


def _numel(t: TensorProto) -> int:
    return int(np.prod(tuple(t.dims), dtype=np.int64))


def _segment_size(t: TensorProto) -> int:
    return t.segment.end - t.segment.begin if t.HasField("segment") else _numel(t)


@dataclass
class _Parts:
    is_tensor: bool
    total: int = 0
    have: int = 0
    chunks: list = field(default_factory=list)
    value: Any = None
    device: DeviceOption | None = None


class BlobAssembler:
    """Collects the BlobProtos read for each blob name (whole or in chunks) and checks, as Caffe2's Load does,
    that nothing is duplicated and every tensor is complete."""

    def __init__(self):
        self._parts: dict[str, _Parts] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._parts

    def complete(self, name: str) -> bool:
        parts = self._parts.get(name)
        return parts is not None and parts.have == parts.total

    def add(self, name: str, proto: BlobProto, where: str) -> None:
        """Take one record's BlobProto for blob `name`; `where` names the file and record for errors."""
        parts = self._parts.get(name)
        if proto.type == TENSOR_TYPE or proto.HasField("tensor"):
            self._add_tensor(name, proto, parts, where)
            return
        if parts is not None:
            raise FileFormatError(f"{where}: blob {name!r} appears twice")
        if proto.HasField("content_num_chunks"):
            raise FileFormatError(f"{where}: blob {name!r} of type {proto.type!r} is split into content "
                                  "chunks, which stepnet cannot load")
        if proto.type == STRING_TYPE:
            value = bytes(proto.content)
        elif proto.type in _TYPES_BY_NAME:
            value = _TYPES_BY_NAME[proto.type].deserialize(bytes(proto.content))
        else:
            loadable = ", ".join([TENSOR_TYPE, STRING_TYPE, *sorted(_TYPES_BY_NAME)])
            raise FileFormatError(f"{where}: blob {name!r} has type {proto.type!r}, which stepnet cannot "
                                  f"load (it loads {loadable})")
        self._parts[name] = _Parts(is_tensor=False, total=1, have=1, value=value)

    def _add_tensor(self, name: str, proto: BlobProto, parts: _Parts | None, where: str) -> None:
        t = proto.tensor
        if not proto.HasField("tensor"):
            raise FileFormatError(f"{where}: blob {name!r} has type {TENSOR_TYPE!r} but no tensor")
        size = _segment_size(t)
        if parts is None:
            detail = t.device_detail if t.HasField("device_detail") else None
            self._parts[name] = _Parts(is_tensor=True, total=_numel(t), have=size, chunks=[t], device=detail)
            return
        first = parts.chunks[0]
        if not parts.is_tensor:
            raise FileFormatError(f"{where}: blob {name!r} appears twice, once as a {TENSOR_TYPE}")
        if not t.HasField("segment"):
            raise FileFormatError(f"{where}: blob {name!r} appears twice (a repeated part must have a "
                                  "segment)")
        if list(t.dims) != list(first.dims) or t.data_type != first.data_type:
            raise FileFormatError(f"{where}: a chunk of blob {name!r} has dims {list(t.dims)} "
                                  f"{DataType.Name(t.data_type)}, but an earlier chunk has "
                                  f"{list(first.dims)} {DataType.Name(first.data_type)}")
        parts.have += size
        if parts.have > parts.total:
            raise FileFormatError(f"{where}: the chunks of blob {name!r} hold more than its {parts.total} "
                                  "elements")
        parts.chunks.append(t)

    def finish(self, where: str) -> dict[str, tuple[Any, DeviceOption | None]]:
        """{name: (value, device_detail)}: host arrays for tensors (with the device they were saved from)."""
        out = {}
        for name, parts in self._parts.items():
            if parts.have != parts.total:
                raise FileFormatError(f"{where}: blob {name!r} is incomplete: it has {parts.total} elements "
                                      f"but its chunks hold {parts.have}")
            if parts.is_tensor:
                out[name] = (_tensor_value(name, parts.chunks, where), parts.device)
            else:
                out[name] = (parts.value, None)
        return out


def _tensor_value(name: str, chunks: list, where: str) -> np.ndarray:
    first = chunks[0]
    if first.data_type == DataType.UNDEFINED and _numel(first) == 0:
        return np.zeros((0,), np.float32)  # Caffe2's legacy empty tensor without a dtype
    try:
        if len(chunks) == 1 and _segment_size(first) == _numel(first):
            return tensor_to_array(first).reshape(tuple(first.dims))
        return join_chunks(chunks)
    except FileFormatError as e:
        raise FileFormatError(f"{where}: blob {name!r}: {e}") from None


# --------------------------------------------------------------------------------------------- files of blobs
def save_blobs(path, blobs: Mapping[str, Any], chunk_size: int = CHUNK_DEFAULT) -> None:
    """Write {name: value} as a minidb file the way Caffe2's Save does, atomically. Every blob is serialized
    before anything is written, so a failure leaves any existing file untouched."""
    records = []
    for name, value in blobs.items():
        records.extend(serialize_blob(name, value, chunk_size))
    write_records(path, records)


def load_blobs(path, names: Iterable[str] | None = None) -> dict[str, Any]:
    """{name: value} of a minidb file written by Save (host arrays, strings as bytes); only `names` if
    given."""
    db = MiniDB(path)
    wanted = None if names is None else set(names)
    assembler = BlobAssembler()
    for i in range(len(db)):
        key = db.key(i)
        name = blob_name_of_key(key)
        if wanted is not None and name not in wanted:
            continue
        where = f"{db.path}: record {key!r} at byte offset {db.offset(i)}"
        assembler.add(name, parse_blob_proto(db.value(i), where), where)
    if wanted is not None:
        missing = sorted(n for n in wanted if n not in assembler)
        if missing:
            held = ", ".join(sorted({blob_name_of_key(k) for k in db.keys()})) or "nothing"
            raise MissingBlobError(f"{db.path}: no blob {', '.join(map(repr, missing))} in the file "
                                   f"(it holds: {held})")
    return {name: value for name, (value, _) in assembler.finish(db.path).items()}


# --------------------------------------------------------------------------------------------- datasets
def tensor_protos_record(arrays: Iterable) -> bytes:
    """One dataset record for TensorProtosDBInput: a serialized TensorProtos of the given arrays."""
    protos = TensorProtos()
    for a in arrays:
        protos.protos.add().CopyFrom(array_to_tensor(np.asarray(backend.to_host(a))))
    return protos.SerializeToString()


def parse_tensor_protos(value: bytes, where: str) -> list[np.ndarray]:
    """The arrays of one TensorProtos record (device details ignored)."""
    protos = TensorProtos()
    try:
        protos.ParseFromString(value)
    except (DecodeError, RuntimeError, ValueError):
        raise FileFormatError(f"{where}: the value is not a serialized TensorProtos") from None
    try:
        return [tensor_to_array(t) for t in protos.protos]
    except FileFormatError as e:
        raise FileFormatError(f"{where}: {e}") from None


def save_dataset(path, rows: Iterable[Iterable], key_format: str = "{:08d}") -> None:
    """Write rows (each a sequence of arrays) as a minidb dataset for CreateDB + TensorProtosDBInput."""
    write_records(path, ((key_format.format(i), tensor_protos_record(row)) for i, row in enumerate(rows)))
