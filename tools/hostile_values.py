"""Values the hostile campaign's mutators draw from (tools/hostile_campaign.py): integers at the edges of each
protobuf integer type, floats that are not ordinary numbers, strings that break names, paths, formats and
terminals, small nets and tensors to plant in arguments."""
from __future__ import annotations

import random
import sys

from stepnet.io import proto
from stepnet.io.proto import NetDef, OperatorDef, make_argument

RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1), "uint32": (0, 2**32 - 1),
          "uint64": (0, 2**64 - 1)}
EDGE_INTS = [0, 1, -1, 2, 3, -2, 7, 64, 65, 99, 100, 101, 255, 256, 1000, 4096, 65535, 65536, 10**6, 10**9,
             2**31 - 1, -2**31, 2**31, 2**32, 2**32 + 1, 2**53 + 1, 2**62, 2**63 - 1, -2**63, 2**64 - 1]
SMALL_INTS = [0, 1, -1, 2, 3, -2, -3, 4, 5, 7, 8, 16]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-45, 5e-324, 1e-30, 3.4028235e38, 3.5e38, 1e308, -1e308,
          float("inf"), float("-inf"), float("nan"), 2.0**63, -2.0**31, 1e10]
BAD_UTF8 = "\x01\x02\x03BADUTF8"   # replaced in wire bytes by invalid UTF-8 of the same length
NAME_STRINGS = ["", " ", "\x00", "a\x00b", "\u202eexe.minidb", "\x1b[2J\x1b[31mred\x1b[0m", "\x7f\x08", "\r\n",
                "\u00e9\u00e8", "\U0001d518\U0001f600", "\u200b", "\ufeff", "x" * 5000, "../../outside",
                "/etc/passwd", "%s%n%x", "{rank}", "{size}", "{0.__class__}", "{}", "a/b/c", "a//b", ".", "..",
                "-", "--help", "-o", "NCHW", "minidb", "data", "X", "__stepnet__/plan_position", "#%0", "a#%1",
                "label=<x>", "]\"}; a -> b", "&amp;", BAD_UTF8, "a\tb", "\\", "'", "\"", "null", "NaN"]


def edge_int(rng: random.Random, kind: str = "int64") -> int:
    lo, hi = RANGES[kind]
    v = rng.choice(EDGE_INTS + [lo, hi, lo + 1, hi - 1] + SMALL_INTS)
    return min(max(v, lo), hi)


def edge_float(rng: random.Random) -> float:
    return rng.choice(FLOATS)


def hostile_string(rng: random.Random, names=()) -> str:
    """A hostile string, or (a third of the time) a name the model already uses, perhaps bent."""
    if names and rng.random() < 0.35:
        name = rng.choice(list(names))
        return rng.choice([name, name + "\x00", name.upper(), name + "/" + name, " " + name, name * 3])
    return rng.choice(NAME_STRINGS)


def op(type_: str, inputs=(), outputs=(), **args) -> OperatorDef:
    o = OperatorDef(type=type_, input=list(inputs), output=list(outputs))
    o.arg.extend(make_argument(k, v) for k, v in args.items())
    return o


def small_net(rng: random.Random, name: str = "sub") -> NetDef:
    """A small net of a few plain ops over blobs that may or may not exist."""
    x = rng.choice(["X", "x", "data", "missing", "cond", "i"])
    ops = [op(rng.choice(["Relu", "Sigmoid", "Copy", "Negative", "Abs", "Tanh"]), [x], [rng.choice(["y", x, "X"])])]
    if rng.random() < 0.5:
        ops.append(op("ConstantFill", [], [rng.choice(["c", "cond", "y"])], shape=[1], value=1.0))
    if rng.random() < 0.3:
        ops.append(op(rng.choice(["Sum", "Add", "Mul"]), ["y", x], ["z"]))
    return NetDef(name=name, op=ops, external_input=[x] if rng.random() < 0.5 else [])


def deep_net(levels: int, arg_name: str = "step_net", op_type: str = "Do") -> NetDef:
    """A net nested `levels` deep in ops' net arguments, built in place (copies refuse 100+ levels)."""
    top = NetDef(name="deep0")
    cur = top
    for i in range(levels):
        cur = cur.op.add(type=op_type, input=["x"], output=["y"]).arg.add(name=arg_name).n
        cur.name = f"deep{i + 1}"
    cur.op.add(type="Relu", input=["x"], output=["y"])
    return top


def net_text(rng: random.Random, levels: int | None = None) -> bytes:
    """A net as text, for an `s` field: small, deep, nested text in text, or broken."""
    kind = rng.randrange(5)
    if kind == 0:
        return proto.to_text(small_net(rng)).encode()
    if kind == 1:
        deep = deep_net(levels or rng.choice([30, 32, 33, 34, 49, 98]), "then_net", "If")
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20_000))   # the text printer recurses ~15 frames a level
        try:
            return proto.to_text(deep).encode()
        finally:
            sys.setrecursionlimit(limit)
    if kind == 2:   # a net whose op holds its own text again (and again)
        inner = proto.to_text(small_net(rng, "inner"))
        for _ in range(rng.choice([1, 3, 20])):
            if len(inner) > 2 << 20:   # each level about doubles the escapes: 20 levels would be gigabytes
                break
            inner = proto.to_text(NetDef(name="wrap", op=[op("Do", ["x"], ["y"], net=inner)]))
        return inner.encode()
    if kind == 3:
        return ("op { type: \"Relu\" " * rng.choice([10, 120, 5000])).encode()
    return rng.choice([b"", b"{", b"name: \"x\" op {", "op { type: \"\u00e9\" }".encode(), b"\xff\xfe", b"n" * 70000,
                       b"plan { }", b"name: \"x\" execution_step { }"])


def set_data_type(t: proto.TensorProto, value: int) -> None:
    """t.data_type = value, also for a value the enum lacks (11, 16: kept as the unknown field a file would hold,
    since protobuf refuses to assign it)."""
    if value in proto.TensorProto.DataType.values():
        t.data_type = value
    else:
        t.MergeFromString(bytes([2 << 3]) + bytes([value]))   # field 2 (data_type), varint; value < 128


def random_tensor(rng: random.Random) -> proto.TensorProto:
    """A TensorProto whose dims, type, data and segment may disagree."""
    t = proto.TensorProto()
    set_data_type(t, rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]))
    t.dims.extend(rng.choice([0, 1, 2, 3, -1, 2**31, 2**40, 2**63 - 1]) for _ in range(rng.choice([0, 1, 2, 3, 9])))
    n = rng.choice([0, 1, 2, 6, 1000])
    field = rng.choice(["float_data", "int32_data", "int64_data", "double_data", "string_data", "raw_data",
                        "byte_data"])
    if field == "raw_data":
        t.raw_data = bytes(rng.randrange(256) for _ in range(min(n, 64) * rng.choice([1, 2, 4, 8])))
    elif field == "byte_data":
        t.byte_data = b"\x01" * n
    elif field == "string_data":
        t.string_data.extend([b"s"] * n)
    elif field in ("float_data", "double_data"):
        getattr(t, field).extend(rng.choice(FLOATS) for _ in range(n))
    else:
        getattr(t, field).extend(rng.choice([0, 1, -1, 2**31 - 1]) for _ in range(n))
    if rng.random() < 0.3:
        t.segment.begin, t.segment.end = rng.choice([(0, 1), (3, 1), (-1, 2), (0, 2**62), (2**62, 2**62 + 1)])
    if rng.random() < 0.2:
        t.name = hostile_string(rng)
    return t


def serialize(rng: random.Random, msg, text: bool | None = None) -> tuple[bytes, str]:
    """(bytes, suffix): text (BAD_UTF8 spelled out) or binary (BAD_UTF8 made invalid UTF-8 in place)."""
    if text is None:
        text = rng.random() < 0.45
    if text:
        try:
            return proto.to_text(msg).replace(BAD_UTF8, "bad\\377").encode("utf-8", "surrogatepass"), ".pbtxt"
        except (RecursionError, ValueError):
            pass
    data = msg.SerializePartialToString()   # a mutation may have dropped a required field: keep it dropped
    return data.replace(BAD_UTF8.encode(), b"\xff\xfe\xc3(\xed\xa0\x80\xf8\x88\x80\x80\x80"[:len(BAD_UTF8)]), ".pb"
