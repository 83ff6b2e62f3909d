"""Caffe2 protobuf files and values: load/save .pb/.pbtxt, Argument <-> Python; TensorProto <-> ndarray lives in
`tensors` and is re-exported here."""
from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping, Set as AbstractSet
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from .. import caffe2_pb2 as pb
from ..core.errors import ArgumentError, FileFormatError, ResourceError
from . import files
from .files import PROTOBUF_LIMIT, describe_size, looks_like_text, read_regular
from .tensors import (NUMPY_OF, array_to_tensor, data_type_of, join_chunks, numpy_dtype,  # noqa: F401 - re-exported
                      tensor_to_array)
from .validate import MAX_DEPTH, check_required, check_strings, check_text, decode_text, too_deep_text, wire_depth

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
# DeviceOption's field 2 was cuda_gpu_id in Caffe2 before 2018-08 (then device_id; the same number on the wire):
# text files of either age parse. Strings and comments are matched first so that their contents stay as written;
# the new name is padded to the old one's length so that error columns stay true.
_LEGACY_NAMES = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*|\bcuda_gpu_id\b')


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
    if isinstance(s, bytes):  # not UTF-8: check_strings names the field once the kind is chosen
        s = s.decode("utf-8", "replace")
    return s.isprintable()


def _parse_text(text: str, cls, where: str, depth: int = 0):
    if len(text) > files.TEXT_LIMIT:   # a net held as text in an argument: a file's limit holds for it too
        raise files.over(where, "the text-format message", f"{len(text)} characters", files.TEXT_LIMIT)
    check_text(text, where, depth)
    if "cuda_gpu_id" in text:
        text = _LEGACY_NAMES.sub(lambda m: "device_id  " if m.group() == "cuda_gpu_id" else m.group(), text)
    msg = cls()
    try:
        text_format.Parse(text, msg, allow_unknown_extension=False)
    except text_format.ParseError as e:
        raise FileFormatError(f"line {e.GetLine()}, column {e.GetColumn()}: {_strip_pos(e)}", at=where) from None
    return msg


def _strip_pos(e: text_format.ParseError) -> str:
    msg = str(e)
    head, sep, rest = msg.partition(" : ")
    return rest if sep and ":" in head else msg


def parse_text(text: str, kind: str | None = None, where: str = "<text>", depth: int = 0) -> Message:
    """Parse a text-format NetDef or PlanDef (or the message kind given). `depth`: the nesting level the message
    sits at (a net held as text in an argument counts the nets around it); deeper than MAX_DEPTH in all is a
    FileFormatError, as protobuf's binary parser has it."""
    if kind is not None:
        msg = _parse_text(text, _kind_class(kind), where, depth)
        check_required(msg, where)
        return msg
    check_text(text, where, depth)
    errors = []
    for cls in (NetDef, PlanDef):
        try:
            msg = _parse_text(text, cls, where, depth)
        except FileFormatError as e:
            errors.append(e)
            continue
        if cls is NetDef and not msg.op and not msg.external_input and _looks_like_plan(text):
            continue
        check_required(msg, where)
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
    decoded, failed = [], []
    for cls in candidates:
        msg = cls()
        try:
            msg.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError):
            failed.append(cls)
            continue
        decoded.append((_unknown_field_count(msg), not _plausible(msg), len(decoded), msg))
    unknown, implausible, _, msg = min(decoded, key=lambda d: d[:3]) if decoded else (0, True, 0, None)
    if failed and (msg is None or (kind is None and (unknown or implausible))):
        _check_wire_depth(data, failed, where)
    if msg is None:
        what = kind or "NetDef or PlanDef"
        if looks_like_text(data):
            raise FileFormatError(f"not a valid binary {what}, but it looks like text: a text protobuf file is "
                                  "read as text by its name ending in .pbtxt; rename it (stepnet convert then makes "
                                  "a binary .pb of it)", at=where)
        raise FileFormatError(f"not a valid binary {what} (truncated, not a Caffe2 protobuf file, or "
                              f"messages nested more than {MAX_DEPTH} levels deep)", at=where)
    if kind is None and (unknown or implausible):
        raise FileFormatError("bytes decode neither as a NetDef nor as a PlanDef "
                              "(truncated, garbage, or another message kind; pass kind= to force one)", at=where)
    check_strings(msg, where)
    check_required(msg, where)
    return msg


def _check_wire_depth(data: bytes, classes, where: str) -> None:
    """FileFormatError saying so when the parse failed because messages nest deeper than protobuf allows."""
    levels = max(wire_depth(data, cls.DESCRIPTOR) for cls in classes)
    if levels > MAX_DEPTH:
        raise FileFormatError(f"{too_deep_text(levels)}", at=where)


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
    """Read a .pb (binary) or .pbtxt (text) file into a NetDef or PlanDef (or kind=...). Text is parsed only up
    to files.TEXT_LIMIT bytes; running out of memory while parsing is a ResourceError naming the file."""
    path = Path(path)
    named_text = path.suffix.lower() in TEXT_SUFFIXES
    data = read_regular(path, "the model file", files.TEXT_LIMIT if named_text else PROTOBUF_LIMIT)
    if not data.strip():
        if kind is None:
            raise FileFormatError(f"{path}: file is empty (pass kind= to read it as an empty message)")
        return _kind_class(kind)()
    try:
        if not _is_text(data, path):
            return parse_binary(data, kind, str(path))
        if len(data) > files.TEXT_LIMIT:
            raise files.over(path, "the model file (text)", f"{describe_size(len(data))} ({len(data)} bytes)",
                             files.TEXT_LIMIT)
        return parse_text(decode_text(data, str(path), "the text-format file"), kind, str(path))
    except MemoryError:
        raise ResourceError(f"{path}: ran out of memory parsing the model file ({describe_size(len(data))}); "
                            "convert a text model to binary .pb, or free memory") from None


_NOT_REGULAR = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_replaceable(path) -> None:
    """A FileFormatError when something other than a regular file is at path (lstat: a symlink, FIFO, device,
    directory, socket), which an atomic write would replace; nothing there is fine."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # nothing there, or an unreadable directory: the write itself reports that
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
        raise FileFormatError(f"{path}: refusing to write there: it is {kind}, not a regular file, and writing "
                              "would replace it; remove it first or choose another path")


def atomic_write(path, data: bytes) -> None:
    """Write bytes to path so that readers see the old file or the whole new one, never a part: to a temporary
    beside it (write_temp), then renamed over it. Only a regular file (or nothing) may be at path: symlinks,
    FIFOs, devices and directories are refused."""
    tmp = write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException as e:
        _failed(path, tmp, e)


def write_temp(path, data: bytes) -> str:
    """A new file beside path (`.NAME.XXXXXXXX.tmp`) holding data, synced, with the mode open() would give, to be
    renamed over path; atomic_write's checks of path first, and its stale temporaries removed. A failed write
    removes it and raises FileFormatError."""
    path = Path(path)
    check_replaceable(path)
    remove_stale_temps(path)
    try:
        # (the name's first 32 characters: at most 128 bytes, so any name leaves room for the temporary's)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:32]}.", suffix=".tmp", dir=path.parent)
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
    except BaseException as e:
        _failed(path, tmp, e)
    return tmp


def _failed(path, tmp: str, error: BaseException):
    """Remove the temporary of a failed write and raise: an OSError as FileFormatError, anything else as is."""
    if os.path.exists(tmp):
        os.unlink(tmp)
    if isinstance(error, OSError):
        raise FileFormatError(f"{path}: cannot write ({error.strerror})") from None
    raise error


STALE_SECONDS = 15 * 60   # a temporary of atomic_write untouched this long is one a killed write left


def remove_stale_temps(path) -> None:
    """Remove the temporaries that killed writes of path left beside it (SIGKILL cannot be caught, so the write
    could not): files named exactly as atomic_write names them for path, regular, the user's own, and untouched
    for STALE_SECONDS (a write under way keeps touching its file)."""
    import re
    import time

    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name[:32]}.") + r"[a-z0-9_]{8}\.tmp")   # mkstemp's 8 random characters
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        with os.scandir(path.parent) as entries:
            stale = [e for e in entries if pattern.fullmatch(e.name)]
    except OSError:
        return
    for entry in stale:
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and uid in (None, st.st_uid) and time.time() - st.st_mtime > STALE_SECONDS:
                os.unlink(entry.path)
        except OSError:
            pass   # gone already, or not ours to remove: the write goes on


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
    elif isinstance(value, Iterable) and not isinstance(value, (Mapping, AbstractSet)):   # a list, tuple, range,
        _fill_repeated(arg, name, list(value))   # protobuf repeated field, ... (not a dict's keys, nor a set's order)
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
