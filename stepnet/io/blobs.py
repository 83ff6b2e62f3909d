"""Blobs in their BlobProto form, as Caffe2's Save writes them and Load reads them back.

Save stores one record per blob, the value a serialized BlobProto; tensors are cut into chunks of
`chunk_size` elements under the keys "<name>#%<chunk index>", each chunk's TensorProto holding the full dims
and its `segment` [begin, end) (`caffe2/core/blob_serialization.cc`). Strings are BlobProtos of type
"std::string" with the bytes in `content`; other opaque objects use the serializers registered with
register_blob_type.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..core import backend
from ..core.errors import NO_VALUE, DTypeError, FileFormatError, MissingBlobError, StepnetError
from .proto import BlobProto, DataType, DeviceOption, TensorProto
from .tensors import array_to_tensor, element_count, join_chunks, segment_of, tensor_to_array
from .validate import parse_checked

CHUNK_SEPARATOR = "#%"
TENSOR_TYPE = "Tensor"
STRING_TYPE = "std::string"
DEFAULT_CHUNK_SIZE = 1_000_000  # Caffe2's flag caffe2_tensor_chunk_size
CHUNK_DEFAULT, NO_CHUNKING = -1, 0  # the special values of Save's chunk_size argument


# ----------------------------------------------------------------------------------------- blob -> BlobProto
@dataclass(frozen=True)
class BlobType:
    """How an opaque (non-tensor) blob value is saved: its BlobProto type name and content codec (or, with
    whole_proto, a codec of the whole BlobProto: serialize returns one, deserialize reads one)."""
    name: str
    cls: type
    serialize: Callable[[Any, str], Any]
    deserialize: Callable[[Any], Any]
    whole_proto: bool = False


_TYPES_BY_CLASS: dict[type, BlobType] = {}
_TYPES_BY_NAME: dict[str, BlobType] = {}


def register_blob_type(cls: type, name: str, serialize: Callable[[Any, str], Any],
                       deserialize: Callable[[Any], Any], *, whole_proto: bool = False) -> None:
    """Let blobs holding `cls` objects be saved as BlobProtos of type `name` (and loaded back): serialize(value,
    name) gives the `content` bytes and deserialize(content) the value, or with whole_proto (types whose data
    lives in other BlobProto fields, such as Int8TensorCPU's qtensor) serialize gives the BlobProto and
    deserialize reads it, raising FileFormatError for a malformed one."""
    entry = BlobType(name, cls, serialize, deserialize, whole_proto)
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
        raise MissingBlobError(f"blob {name!r} {NO_VALUE}, so it cannot be saved")
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
    if entry.whole_proto:
        proto = entry.serialize(value, name)
        proto.name, proto.type = name, entry.name
        return [(name, proto)]
    return [(name, BlobProto(name=name, type=entry.name, content=entry.serialize(value, name)))]


def serialize_blob(name: str, value, chunk_size: int = CHUNK_DEFAULT) -> list[tuple[str, bytes]]:
    """(key, serialized BlobProto) records of one blob, ready for a minidb file."""
    return [(k, p.SerializeToString()) for k, p in blob_protos(name, value, chunk_size)]


# ----------------------------------------------------------------------------------------- BlobProto -> blob
def blob_name_of_key(key: str, where: str = "") -> str:
    """The blob name of a record key: the key up to the chunk separator '#%'. A key whose bytes are not UTF-8
    (read with surrogate escapes) names no blob: FileFormatError (prefixed with `where`, the file and record)."""
    name = key.split(CHUNK_SEPARATOR, 1)[0]
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raw = key.encode("utf-8", "surrogateescape")
        raise FileFormatError(f"{where + ': ' if where else ''}db key {raw[:60]!r} is not valid UTF-8, so it cannot "
                              "name a blob") from None
    return name


def parse_blob_proto(value: bytes, where: str) -> BlobProto:
    return parse_checked(BlobProto(), value, where)


def _numel(t: TensorProto) -> int:
    return element_count(t)


def _segment_size(t: TensorProto) -> int:
    begin, end = segment_of(t, element_count(t))
    return end - begin


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
        # (a registered type may keep its data in the tensor field too, as Caffe2's counters and indexes do)
        if proto.type == TENSOR_TYPE or (proto.HasField("tensor") and proto.type not in _TYPES_BY_NAME):
            self._add_tensor(name, proto, parts, where)
            return
        if parts is not None:
            raise FileFormatError(f"blob {name!r} appears twice", at=where)
        if proto.HasField("content_num_chunks"):
            raise FileFormatError(f"blob {name!r} of type {proto.type!r} is split into content "
                                  "chunks, which stepnet cannot load", at=where)
        if proto.type == STRING_TYPE:
            value = bytes(proto.content)
        elif proto.type in _TYPES_BY_NAME:
            value = _deserialize(_TYPES_BY_NAME[proto.type], proto, name, where)
        else:
            loadable = ", ".join([TENSOR_TYPE, STRING_TYPE, *sorted(_TYPES_BY_NAME)])
            raise FileFormatError(f"blob {name!r} has type {proto.type!r}, which stepnet cannot "
                                  f"load (it loads {loadable})", at=where)
        self._parts[name] = _Parts(is_tensor=False, total=1, have=1, value=value)

    def _add_tensor(self, name: str, proto: BlobProto, parts: _Parts | None, where: str) -> None:
        t = proto.tensor
        if not proto.HasField("tensor"):
            raise FileFormatError(f"blob {name!r} has type {TENSOR_TYPE!r} but no tensor", at=where)
        try:
            size = _segment_size(t)
        except FileFormatError as e:
            raise FileFormatError(f"blob {name!r}: {e}", at=where) from None
        if parts is None:
            detail = t.device_detail if t.HasField("device_detail") else None
            self._parts[name] = _Parts(is_tensor=True, total=_numel(t), have=size, chunks=[t], device=detail)
            return
        if not parts.is_tensor:
            raise FileFormatError(f"blob {name!r} appears twice, once as a {TENSOR_TYPE}", at=where)
        first = parts.chunks[0]
        if not t.HasField("segment"):
            raise FileFormatError(f"blob {name!r} appears twice (a repeated part must have a "
                                  "segment)", at=where)
        if list(t.dims) != list(first.dims) or t.data_type != first.data_type:
            raise FileFormatError(f"a chunk of blob {name!r} has dims {list(t.dims)} "
                                  f"{DataType.Name(t.data_type)}, but an earlier chunk has "
                                  f"{list(first.dims)} {DataType.Name(first.data_type)}", at=where)
        parts.have += size
        if parts.have > parts.total:
            raise FileFormatError(f"the chunks of blob {name!r} hold more than its {parts.total} "
                                  "elements", at=where)
        parts.chunks.append(t)

    def finish(self, where: str) -> dict[str, tuple[Any, DeviceOption | None]]:
        """{name: (value, device_detail)}: host arrays for tensors (with the device they were saved from)."""
        out = {}
        for name, parts in self._parts.items():
            if parts.have != parts.total:
                raise FileFormatError(f"blob {name!r} is incomplete: it has {parts.total} elements "
                                      f"but its chunks hold {parts.have}", at=where)
            if parts.is_tensor:
                out[name] = (_tensor_value(name, parts.chunks, where), parts.device)
            else:
                out[name] = (parts.value, None)
        return out


def _deserialize(entry: BlobType, proto: BlobProto, name: str, where: str):
    """An opaque blob's value from its proto (whole_proto codecs) or its content; any failure of the codec is
    the file's: FileFormatError (a StepnetError keeps its class)."""
    try:
        return entry.deserialize(proto if entry.whole_proto else bytes(proto.content))
    except StepnetError as e:
        raise type(e)(f"{where}: blob {name!r} of type {entry.name!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a registered codec meeting bytes it cannot read
        raise FileFormatError(f"blob {name!r} of type {entry.name!r} cannot be read from its content "
                              f"({type(e).__name__}: {e})", at=where) from None


def _tensor_value(name: str, chunks: list, where: str) -> np.ndarray:
    first = chunks[0]
    if first.data_type == DataType.UNDEFINED and _numel(first) == 0:
        return np.zeros((0,), np.float32)  # Caffe2's legacy empty tensor without a dtype
    try:
        if len(chunks) == 1 and _segment_size(first) == _numel(first):
            return tensor_to_array(first).reshape(tuple(first.dims))
        return join_chunks(chunks)
    except FileFormatError as e:
        raise FileFormatError(f"blob {name!r}: {e}", at=where) from None
