"""Caffe2 protobuf files and values: load/save .pb/.pbtxt, Argument <-> Python, TensorProto <-> ndarray."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from . import caffe2_pb2 as pb
from .errors import ArgumentError, FileFormatError

TensorProto = pb.TensorProto
QTensorProto = pb.QTensorProto
TensorProtos = pb.TensorProtos
TensorShape = pb.TensorShape
Argument = pb.Argument
DeviceOption = pb.DeviceOption
OperatorDef = pb.OperatorDef
NetDef = pb.NetDef
ExecutionStep = pb.ExecutionStep
PlanDef = pb.PlanDef
BlobProto = pb.BlobProto
DBReaderProto = pb.DBReaderProto
MetaNetDef = pb.MetaNetDef

DataType = TensorProto.DataType
CPU, CUDA = 0, 1

KINDS = {"net": NetDef, "plan": PlanDef, "tensor": TensorProto, "tensors": TensorProtos,
         "blob": BlobProto, "metanet": MetaNetDef, "op": OperatorDef}
TEXT_SUFFIXES = {".pbtxt", ".prototxt", ".txt", ".pbtext", ".textproto"}


# --------------------------------------------------------------------------------------------- files
def _unknown_field_count(msg: Message) -> int:
    """Fields in msg (recursively) that the schema does not know: a sign of a wrong message kind."""
    count = len(UnknownFieldSet(msg))
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        items = value if field.is_repeated else [value]
        count += sum(_unknown_field_count(m) for m in items)
    return count


def _plausible(msg: Message) -> bool:
    """Whether a message decoded from bytes looks like a real NetDef / PlanDef."""
    if isinstance(msg, NetDef):
        return all(op.type for op in msg.op) and _printable(msg.type) and _printable(msg.name)
    if isinstance(msg, PlanDef):
        return bool(msg.network or msg.execution_step) and all(_plausible(n) for n in msg.network)
    return True


def _printable(s) -> bool:
    return isinstance(s, str) and s.isprintable()


def _parse_text(text: str, cls, where: str):
    msg = cls()
    try:
        text_format.Parse(text, msg, allow_unknown_extension=False)
    except text_format.ParseError as e:
        raise FileFormatError(f"{where}: line {e.GetLine()}, column {e.GetColumn()}: {_strip_pos(e)}") from None
    return msg


def _strip_pos(e: text_format.ParseError) -> str:
    msg = str(e)
    head, sep, rest = msg.partition(" : ")
    return rest if sep and ":" in head else msg


def parse_text(text: str, kind: str | None = None, where: str = "<text>") -> Message:
    """Parse a text-format NetDef or PlanDef (or the message kind given)."""
    if kind is not None:
        return _parse_text(text, _kind_class(kind), where)
    errors = []
    for cls in (NetDef, PlanDef):
        try:
            msg = _parse_text(text, cls, where)
        except FileFormatError as e:
            errors.append(e)
            continue
        if cls is NetDef and not msg.op and not msg.external_input and _looks_like_plan(text):
            continue
        return msg
    # Report the error of the more plausible kind: the one that got further into the file.
    raise max(errors, key=_error_position)


def _looks_like_plan(text: str) -> bool:
    try:
        return bool(_parse_text(text, PlanDef, "").execution_step)
    except FileFormatError:
        return False


def _error_position(e: FileFormatError):
    import re

    m = re.search(r"line (\d+), column (\d+)", str(e))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def parse_binary(data: bytes, kind: str | None = None, where: str = "<bytes>") -> Message:
    """Parse a binary NetDef or PlanDef, telling them apart by which decodes cleanly."""
    candidates = [_kind_class(kind)] if kind else [NetDef, PlanDef]
    decoded = []
    for cls in candidates:
        msg = cls()
        try:
            msg.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError):
            continue
        decoded.append((_unknown_field_count(msg), not _plausible(msg), len(decoded), msg))
    if not decoded:
        what = kind or "NetDef or PlanDef"
        raise FileFormatError(f"{where}: not a valid binary {what} (truncated or not a Caffe2 protobuf file)")
    unknown, implausible, _, msg = min(decoded, key=lambda d: d[:3])
    if kind is None and (unknown or implausible):
        raise FileFormatError(f"{where}: bytes decode neither as a NetDef nor as a PlanDef "
                              f"(truncated, garbage, or another message kind; pass kind= to force one)")
    return msg


def _kind_class(kind):
    if isinstance(kind, type) and issubclass(kind, Message):
        return kind
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(KINDS)}") from None


def _is_text(data: bytes, path: Path) -> bool:
    if path.suffix.lower() in TEXT_SUFFIXES:
        return True
    if path.suffix.lower() in {".pb", ".bin", ".pbbin"}:
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\r\n\t" for c in text[:4096])


def load(path, kind: str | None = None) -> Message:
    """Read a .pb (binary) or .pbtxt (text) file into a NetDef or PlanDef (or kind=...)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileFormatError(f"{path}: no such file") from None
    except OSError as e:
        raise FileFormatError(f"{path}: cannot read ({e.strerror})") from None
    if not data.strip():
        if kind is None:
            raise FileFormatError(f"{path}: file is empty (pass kind= to read it as an empty message)")
        return _kind_class(kind)()
    if _is_text(data, path):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileFormatError(f"{path}: a text-format file must be UTF-8") from None
        return parse_text(text, kind, str(path))
    return parse_binary(data, kind, str(path))


def atomic_write(path, data: bytes) -> None:
    """Write bytes to path so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise FileFormatError(f"{path}: cannot write ({e.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)  # what open() would give, not mkstemp's 0600
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise FileFormatError(f"{path}: cannot write ({e.strerror})") from None
        raise


def to_text(message: Message) -> str:
    return text_format.MessageToString(message)


def save(message: Message, path, text: bool | None = None) -> None:
    """Write a message as text (.pbtxt and friends) or binary (anything else), atomically."""
    path = Path(path)
    if text is None:
        text = path.suffix.lower() in TEXT_SUFFIXES
    atomic_write(path, to_text(message).encode() if text else message.SerializeToString())


# --------------------------------------------------------------------------------------------- arguments
def argument_value(arg: Argument) -> Any:
    """The Python value an Argument holds; a name-only argument is an empty list (Caffe2's rule)."""
    for field in ("f", "i", "s", "n", "t"):
        if arg.HasField(field):
            value = getattr(arg, field)
            if field == "s":
                return _decode(value)
            if field == "t":
                return tensor_to_array(value)
            return value
    for field in ("floats", "ints", "strings", "nets", "tensors", "qtensors"):
        values = getattr(arg, field)
        if len(values):
            if field == "strings":
                return [_decode(v) for v in values]
            if field == "tensors":
                return [tensor_to_array(t) for t in values]
            return list(values)
    return []


def _decode(b: bytes):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def make_argument(name: str, value: Any) -> Argument:
    """An Argument from a Python value, following Caffe2's utils.MakeArgument."""
    arg = Argument(name=name)
    if isinstance(value, np.ndarray):
        value = value.reshape(-1).tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int)):
        arg.i = int(value)
    elif isinstance(value, float):
        arg.f = value
    elif isinstance(value, str):
        arg.s = value.encode()
    elif isinstance(value, bytes):
        arg.s = value
    elif isinstance(value, NetDef):
        arg.n.CopyFrom(value)
    elif isinstance(value, TensorProto):
        arg.t.CopyFrom(value)
    elif isinstance(value, Message):
        arg.s = value.SerializeToString()
    elif isinstance(value, (list, tuple)):
        _fill_repeated(arg, name, list(value))
    else:
        raise ArgumentError(f"argument {name!r}: cannot store a value of type {type(value).__name__}")
    return arg


def _fill_repeated(arg: Argument, name: str, values: list) -> None:
    if not values:
        return  # name only: an empty list of any type
    values = [v.item() if isinstance(v, np.generic) else v for v in values]
    if all(isinstance(v, (bool, int)) for v in values):
        arg.ints.extend(int(v) for v in values)
    elif all(isinstance(v, (bool, int, float)) for v in values):
        arg.floats.extend(float(v) for v in values)
    elif all(isinstance(v, (str, bytes)) for v in values):
        arg.strings.extend(v.encode() if isinstance(v, str) else v for v in values)
    elif all(isinstance(v, NetDef) for v in values):
        arg.nets.extend(values)
    elif all(isinstance(v, TensorProto) for v in values):
        arg.tensors.extend(values)
    else:
        raise ArgumentError(f"argument {name!r}: a list must hold only numbers, only strings or only NetDefs")


def arguments(args) -> dict[str, Any]:
    """{name: value} of a repeated Argument field (OperatorDef.arg, NetDef.arg)."""
    return {a.name: argument_value(a) for a in args}


# --------------------------------------------------------------------------------------------- tensors
NUMPY_OF = {
    DataType.FLOAT: np.float32, DataType.INT32: np.int32, DataType.BYTE: np.uint8,
    DataType.STRING: object, DataType.BOOL: np.bool_, DataType.UINT8: np.uint8, DataType.INT8: np.int8,
    DataType.UINT16: np.uint16, DataType.INT16: np.int16, DataType.INT64: np.int64,
    DataType.FLOAT16: np.float16, DataType.DOUBLE: np.float64,
}
_DTYPE_OF_NUMPY = {np.dtype(np.float32): DataType.FLOAT, np.dtype(np.int32): DataType.INT32,
                   np.dtype(np.bool_): DataType.BOOL, np.dtype(np.uint8): DataType.UINT8,
                   np.dtype(np.int8): DataType.INT8, np.dtype(np.uint16): DataType.UINT16,
                   np.dtype(np.int16): DataType.INT16, np.dtype(np.int64): DataType.INT64,
                   np.dtype(np.float16): DataType.FLOAT16, np.dtype(np.float64): DataType.DOUBLE}
_SMALL_INTS = {DataType.BOOL, DataType.UINT8, DataType.INT8, DataType.UINT16, DataType.INT16}


def data_type_of(dtype) -> int:
    """The TensorProto.DataType of a numpy dtype (object/str/bytes -> STRING)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return DataType.STRING
    try:
        return _DTYPE_OF_NUMPY[dtype]
    except KeyError:
        raise ArgumentError(f"dtype {dtype} has no Caffe2 TensorProto data type") from None


def numpy_dtype(data_type: int):
    try:
        return NUMPY_OF[data_type]
    except KeyError:
        name = DataType.Name(data_type) if data_type in DataType.values() else data_type
        raise FileFormatError(f"TensorProto data_type {name} cannot be converted to an array") from None


def tensor_to_array(t: TensorProto) -> np.ndarray:
    """The ndarray a TensorProto holds (for a chunk with `segment`, just that chunk's elements)."""
    dtype = numpy_dtype(t.data_type)
    shape = tuple(t.dims)
    count = int(np.prod(shape, dtype=np.int64))
    if t.HasField("segment") and (t.segment.begin, t.segment.end) != (0, count):
        count = t.segment.end - t.segment.begin
        shape = (count,)
    dt = t.data_type
    if dt == DataType.STRING:
        arr = np.empty(len(t.string_data), dtype=object)
        arr[:] = list(t.string_data)
    elif t.data_format == TensorProto.FMT_BFLOAT16:
        bits = _frombuffer(t, t.raw_data, "<u2").astype(np.uint32) << 16
        arr = bits.view(np.float32).astype(dtype)
    elif t.raw_data:
        arr = _frombuffer(t, t.raw_data, np.dtype(dtype).newbyteorder("<")).astype(dtype)
    elif dt == DataType.FLOAT:
        arr = np.asarray(t.float_data, dtype=np.float32)
    elif dt == DataType.DOUBLE:
        arr = np.asarray(t.double_data, dtype=np.float64)
    elif dt == DataType.INT64:
        arr = np.asarray(t.int64_data, dtype=np.int64)
    elif dt == DataType.INT32:
        arr = np.asarray(t.int32_data, dtype=np.int32)
    elif dt == DataType.BYTE:
        arr = _frombuffer(t, t.byte_data, np.uint8).copy()
    elif dt == DataType.FLOAT16:
        if t.byte_data:
            arr = _frombuffer(t, t.byte_data, "<f2").astype(np.float16)
        else:
            arr = np.asarray(t.int32_data, dtype=np.int64).astype(np.uint16).view(np.float16)
    elif dt in _SMALL_INTS:
        if t.byte_data:
            arr = _frombuffer(t, t.byte_data, np.dtype(dtype).newbyteorder("<")).astype(dtype)
        else:
            arr = np.asarray(t.int32_data, dtype=np.int64).astype(dtype)
    else:  # pragma: no cover - numpy_dtype rejected it
        raise FileFormatError(f"unsupported data_type {dt}")
    if arr.size != count:
        name = f" {t.name!r}" if t.name else ""
        raise FileFormatError(f"tensor{name}: dims {list(t.dims)} need {count} elements but "
                              f"{DataType.Name(dt)} data holds {arr.size}")
    return arr.reshape(shape)


def _frombuffer(t: TensorProto, buf: bytes, dtype) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    if len(buf) % itemsize:
        name = f" {t.name!r}" if t.name else ""
        raise FileFormatError(f"tensor{name}: a payload of {len(buf)} bytes is not a whole number of "
                              f"{itemsize}-byte {DataType.Name(t.data_type)} elements")
    return np.frombuffer(buf, dtype=dtype)


def array_to_tensor(value, name: str | None = None) -> TensorProto:
    """A TensorProto holding value, in the fields Caffe2 itself writes for its dtype."""
    arr = np.asarray(value)
    t = TensorProto(dims=arr.shape, data_type=data_type_of(arr.dtype))
    if name is not None:
        t.name = name
    flat = arr.reshape(-1)
    dt = t.data_type
    if dt == DataType.STRING:
        t.string_data.extend(v if isinstance(v, bytes) else str(v).encode() for v in flat)
    elif dt == DataType.FLOAT:
        t.float_data.extend(flat.tolist())
    elif dt == DataType.DOUBLE:
        t.double_data.extend(flat.tolist())
    elif dt == DataType.INT64:
        t.int64_data.extend(flat.tolist())
    elif dt == DataType.FLOAT16:
        t.int32_data.extend(flat.view(np.uint16).astype(np.int32).tolist())
    else:
        t.int32_data.extend(flat.astype(np.int32).tolist())
    return t


def join_chunks(chunks) -> np.ndarray:
    """Reassemble a tensor saved as several TensorProtos with `segment`s (Caffe2 chunked blobs); the chunks
    must cover every element exactly once."""
    chunks = list(chunks)
    if not chunks:
        raise FileFormatError("no chunks to join")
    first = chunks[0]
    out = np.empty(int(np.prod(tuple(first.dims), dtype=np.int64)), dtype=numpy_dtype(first.data_type))
    covered = np.zeros(out.size, dtype=bool)
    for c in chunks:
        begin, end = (c.segment.begin, c.segment.end) if c.HasField("segment") else (0, out.size)
        if not 0 <= begin <= end <= out.size:
            raise FileFormatError(f"tensor {first.name!r}: chunk [{begin}, {end}) outside {out.size} elements")
        if covered[begin:end].any():
            raise FileFormatError(f"tensor {first.name!r}: chunk [{begin}, {end}) overlaps another chunk")
        out[begin:end] = tensor_to_array(c).reshape(-1)
        covered[begin:end] = True
    if not covered.all():
        raise FileFormatError(f"tensor {first.name!r}: chunks leave {int((~covered).sum())} of {out.size} "
                              "elements uncovered")
    return out.reshape(tuple(first.dims))
