"""Checks every parsed message passes before stepnet uses it: UTF-8 in string fields, and nesting depth.

protobuf's Python runtime hands back `bytes` for a proto2 `string` field whose bytes are not UTF-8, so a
binary file is checked once right after parsing, every string field of every nested message, and the error
names the field by its path (`network 'train' op #0 (RecurrentNetwork) arg 'step_net' op #3 (FC) input[1]`).

protobuf's binary parser refuses messages nested more than MAX_DEPTH levels deep; the text parser has no such
limit (and recurses until Python's stack runs out), so text is scanned for its brace depth before parsing, and
nets held as text in arguments count the levels of the nets around them: one limit for every format.
"""
from __future__ import annotations

import re

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from ..core.errors import FileFormatError

MAX_DEPTH = 100  # upb's and protobuf-C++'s default recursion limit; the top-level message is level 0
NET_IN_ARG = 3   # a NetDef in an argument sits three levels below the net holding it: op, arg, n

_STRING, _MESSAGE = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
_NAMED = {"network": "network", "execution_step": "step", "substep": "step", "arg": "arg", "tensors": "tensor",
          "protos": "tensor", "nets": "net"}


# ------------------------------------------------------------------------------------------- UTF-8
def _child_label(field_name: str, index: int | None, child: Message) -> str:
    if field_name == "op":
        kind = child.type
        return f"op #{index} ({kind})" if isinstance(kind, str) and kind else f"op #{index}"
    if field_name == "n":
        return ""
    label = _NAMED.get(field_name)
    name = getattr(child, "name", None) if label else None
    if isinstance(name, str) and name:
        return f"{label} {name!r}"
    if label and index is not None:
        return f"{label} #{index}"
    return field_name if index is None else f"{field_name}[{index}]"


def _path(parts) -> str:
    return " ".join(p for p in parts if p)


def parse_checked(msg: Message, value: bytes, where: str) -> Message:
    """msg parsed from value, its strings checked: one FileFormatError naming `where` and the message type if the
    bytes are not one."""
    try:
        msg.ParseFromString(value)
    except (DecodeError, RuntimeError, ValueError):
        raise FileFormatError(f"the value is not a serialized {type(msg).__name__}", at=where) from None
    check_strings(msg, where)
    check_required(msg, where)
    return msg


def check_required(msg: Message, where: str) -> None:
    """FileFormatError naming the first required fields (by path) the message lacks: Caffe2's parser refuses such
    a message too, and it could not be written out again."""
    if msg.IsInitialized():
        return
    missing = msg.FindInitializationErrors()
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    raise FileFormatError(f"required field{'s' if len(missing) > 1 else ''} missing: {', '.join(missing[:3])}{more}",
                          at=where)


def check_strings(msg: Message, where: str) -> None:
    """FileFormatError naming the first string field (by its path) whose bytes are not valid UTF-8."""
    stack = [(msg, ())]
    while stack:
        m, parts = stack.pop()
        children = []
        for field, value in m.ListFields():
            if field.type == _STRING:
                items = enumerate(value) if field.is_repeated else [(None, value)]
                for i, v in items:
                    if isinstance(v, bytes):
                        _bad_string(where, parts, field.name if i is None else f"{field.name}[{i}]", v)
            elif field.type == _MESSAGE:
                if field.is_repeated:
                    children.extend((c, (*parts, _child_label(field.name, i, c))) for i, c in enumerate(value))
                else:
                    children.append((value, (*parts, _child_label(field.name, None, value))))
        stack.extend(reversed(children))  # depth first, in file order


def _bad_string(where: str, parts, name: str, value: bytes) -> None:
    path = _path((*parts, name)) if parts else f"field {name}"
    raise FileFormatError(f"{path} is not valid UTF-8 ({utf8_problem(value)}); protobuf string fields "
                          "hold UTF-8 text, so the file is corrupt or was written in another encoding", at=where)


def utf8_problem(data: bytes) -> str:
    """'byte 0xff at offset 3 of b"..."': what makes data invalid UTF-8, for error messages."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        shown = data[:60] + (b"..." if len(data) > 60 else b"")
        return f"byte 0x{data[e.start]:02x} at offset {e.start} of {shown!r}"
    return "valid"


def decode_text(data: bytes, where: str, what: str = "text") -> str:
    """data as UTF-8, or a FileFormatError saying where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileFormatError(f"{what} is not valid UTF-8 ({utf8_problem(data)})", at=where) from None


# ------------------------------------------------------------------------------------------- text
# Tokens that matter before parsing: strings, comments, braces. Escapes are blanked first (same length, so offsets
# and lines hold) so that the string pattern is one character class: no backtracking state per character.
_ESCAPES = (("\\\\", "__"), ('\\"', "__"), ("\\'", "__"))
_TOKENS = re.compile(r'"[^"\n]*"?|\'[^\'\n]*\'?|#[^\n]*|[{}<>]')
_OPEN, _CLOSE = frozenset("{<"), frozenset("}>")
MAX_TEXT_STRING = 2**20  # protobuf's Python text parser holds ~140 bytes per character of a string while matching it


def too_deep_text(levels: int, base: int = 0) -> str:
    around = f", counting the {base} levels of the nets around it" if base else ""
    return (f"messages are nested more than {MAX_DEPTH} levels deep{around} (protobuf's limit, for text and binary "
            "files alike); a plan or net this deep is garbage or was built by mistake")


def check_text(text: str, where: str, base: int = 0) -> None:
    """FileFormatError, before the recursive parser sees the text, when its messages (starting at level `base`)
    nest deeper than MAX_DEPTH (braces counted outside strings and comments) or a string in it is longer than
    MAX_TEXT_STRING."""
    limit = MAX_DEPTH - base
    depth = 0
    if "\\" in text:
        for escape, blank in _ESCAPES:
            text = text.replace(escape, blank)
    for m in _TOKENS.finditer(text):
        token = m.group()
        if token in _OPEN:
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, m.start()) + 1
                raise FileFormatError(f"line {line}: {too_deep_text(depth + base, base)}", at=where)
        elif token in _CLOSE:
            depth -= 1
        elif len(token) > MAX_TEXT_STRING and token[0] in "\"'":
            line = text.count("\n", 0, m.start()) + 1
            raise FileFormatError(
                f"line {line}: a string of {len(token)} characters, over the limit of {MAX_TEXT_STRING} for a string "
                "in text format (protobuf's Python text parser takes about 140 times a string's size in memory); "
                "hold a nested net as a NetDef (the argument's n) or write the model as binary .pb, e.g. protoc "
                "--encode=caffe2.NetDef caffe2.proto < IN > OUT", at=where)


def wire_depth(data: bytes, descriptor, limit: int = MAX_DEPTH, max_fields: int = 1_000_000) -> int:
    """How deep the messages of binary protobuf `data` nest (following the schema), scanning the wire format
    without recursion; stops as soon as it passes `limit`, at anything malformed, or after max_fields fields."""
    stack = [(len(data), descriptor)]
    pos, deepest, fields = 0, 0, 0
    try:
        while stack and fields < max_fields:
            while stack and pos >= stack[-1][0]:
                stack.pop()
            if not stack:
                break
            fields += 1
            tag, pos = _varint(data, pos)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                size, pos = _varint(data, pos)
                field = stack[-1][1].fields_by_number.get(number)
                if field is not None and field.type == _MESSAGE and pos + size <= stack[-1][0]:
                    stack.append((pos + size, field.message_type))
                    deepest = max(deepest, len(stack) - 1)
                    if deepest > limit:
                        break
                else:
                    pos += size
            else:
                break
    except IndexError:
        pass
    return deepest


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80 or shift > 63:
            return result, pos
        shift += 7
