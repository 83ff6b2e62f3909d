"""minidb, Caffe2's flat key/value file (the usual db of Save/Load), and blobs in their BlobProto form.

A minidb file is a sequence of records, each: int32 key length, int32 value length (little-endian; both
must be > 0), the key bytes, the value bytes (`caffe2/core/db.cc`). Save stores one record per blob, the
value a serialized BlobProto (see `blobs`, whose public names are re-exported here).
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path
import struct
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from ..core import backend
from .blobs import (  # noqa: F401 - re-exported
    CHUNK_DEFAULT, CHUNK_SEPARATOR, DEFAULT_CHUNK_SIZE, NO_CHUNKING, STRING_TYPE, TENSOR_TYPE, BlobAssembler,
    BlobType, blob_name_of_key, blob_protos, chunk_length, device_detail_of, parse_blob_proto, register_blob_type,
    serialize_blob, tensor_blob_protos)
from ..core.errors import FileFormatError, MissingBlobError
from .files import open_regular
from .proto import TensorProtos, atomic_write
from . import int8_blob  # noqa: F401 - registers the Int8TensorCPU blob type
from .tensors import array_to_tensor, check_tensor_proto, tensor_to_array
from .validate import parse_checked

HEADER = struct.Struct("<ii")


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


def append_records(path, records: Iterable[tuple[str | bytes, bytes]]) -> None:
    """Add records at the end of a minidb file (made if missing), as Caffe2's minidb writes in its write mode.
    Every record is packed before the file is opened, so a bad one leaves the file as it was."""
    data = pack_records(records)
    if os.path.lexists(path) and not os.path.isfile(path):
        raise FileFormatError(f"{path}: not a regular file, so not a minidb file to add records to")
    try:
        with open(path, "ab") as f:
            f.write(data)
    except OSError as e:
        raise FileFormatError(f"{path}: cannot write the minidb file ({e.strerror or e})") from None


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


def replaceable(path) -> bool:
    """Whether a model may write a database at path: nothing is there, or an empty regular file, or a minidb file
    (its records' layout checks: a stepnet database or checkpoint). Anything else is somebody's file."""
    if not os.path.lexists(path):
        return True
    try:
        MiniDB(path)
    except (FileFormatError, OSError):
        return False
    return True


class MiniDB:
    """A minidb file opened for reading: its records in file order, values read on demand (memory-mapped)."""

    def __init__(self, path):
        self.path = str(path)
        where = ("" if Path(path).is_absolute()
                 else f" (relative paths are read from the working directory {os.getcwd()})")
        f = open_regular(path, "the minidb file", missing=where)
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

    def key_bytes(self, i: int) -> bytes:
        """Key i as the file holds it."""
        return self._index[i][0].encode("utf-8", "surrogateescape")

    def value(self, i: int) -> bytes:
        _, start, length, _ = self._index[i]
        return bytes(self._data[start:start + length])

    def offset(self, i: int) -> int:
        """Byte offset of record i in the file (for error messages)."""
        return self._index[i][3]

    def where(self, i: int) -> str:
        """Record i for an error message: the file, its key and byte offset."""
        return f"{self.path}: record {self.key(i)!r} at byte offset {self.offset(i)}"

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


# --------------------------------------------------------------------------------------------- files of blobs
def save_blobs(path, blobs: Mapping[str, Any], chunk_size: int = CHUNK_DEFAULT) -> None:
    """Write {name: value} as a minidb file the way Caffe2's Save does, atomically. Every blob is serialized
    before anything is written, so a failure leaves any existing file untouched."""
    records = []
    for name, value in blobs.items():
        records.extend(serialize_blob(name, value, chunk_size))
    write_records(path, records)


def load_blobs(path, names: Iterable[str] | None = None, max_blob_bytes: int | None = None) -> dict[str, Any]:
    """{name: value} of a minidb file written by Save (host arrays, strings as bytes); only `names` if
    given. With max_blob_bytes, a tensor whose dims say it is larger is refused before it is assembled."""
    db = MiniDB(path)
    wanted = None if names is None else set(names)
    assembler = BlobAssembler()
    for i in range(len(db)):
        key = db.key(i)
        name = blob_name_of_key(key, f"{db.path}: record at byte offset {db.offset(i)}")
        if wanted is not None and name not in wanted:
            continue
        where = f"{db.path}: record {key!r} at byte offset {db.offset(i)}"
        proto = parse_blob_proto(db.value(i), where)
        if max_blob_bytes is not None:
            check_tensor_proto(max_blob_bytes, name, proto, where)
        assembler.add(name, proto, where)
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
    protos = parse_checked(TensorProtos(), value, where)
    try:
        return [tensor_to_array(t) for t in protos.protos]
    except FileFormatError as e:
        raise FileFormatError(f"{e}", at=where) from None


def save_dataset(path, rows: Iterable[Iterable], key_format: str = "{:08d}") -> None:
    """Write rows (each a sequence of arrays) as a minidb dataset for CreateDB + TensorProtosDBInput."""
    write_records(path, ((key_format.format(i), tensor_protos_record(row)) for i, row in enumerate(rows)))
