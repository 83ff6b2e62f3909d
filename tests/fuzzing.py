"""Mutators shared by tests/test_fuzz.py (hypothesis, in CI) and tools/fuzz_campaign.py (many more cases): each
takes a random.Random and real bytes, text or messages from tests/data and models/, and returns a hostile
variant. Values stay small or astronomically large (never a few GiB), so a case either runs fast or fails fast.
"""
from __future__ import annotations

import io
import random
import struct
from pathlib import Path

import numpy as np

from stepnet.io import proto
from stepnet.ops import REGISTRY

ROOT = Path(__file__).resolve().parents[1]

BINARY_MODELS = ["tests/data/caffe2/squeeze_predict_net.pb", "tests/data/caffe2/armcompute_squeezenet_predict.pb",
                 "models/style_transfer/crayon_predict.pb", "tests/data/models/style_transfer_crayon_predict.pb"]
TEXT_MODELS = ["models/xor/plan.pbtxt", "models/xor/init_net.pbtxt", "models/xor/predict_net.pbtxt",
               "models/digits/train.pbtxt", "models/binary_adder/binary_adder.pbtxt",
               "tests/data/glow/alias_op_net.pbtxt", "tests/data/glow/argmin.pbtxt",
               "tests/data/glow/avgpool_predict_net.pbtxt", "tests/data/glow/NCHW2NHWC_predict_net.pbtxt"]
MINIDBS = ["models/binary_adder/test.minidb", "models/digits/test.minidb"]

# Small, or too large for any allocation to start: a fuzz case never fills gigabytes.
INTS = [0, 1, 2, 3, -1, -2, 2**62, -2**62, 2**63 - 1, -2**63]
FLOATS = [0.0, 0.5, -1.0, 3.0, 1e30, -1e30, float("inf"), float("-inf"), float("nan")]
STRINGS = [b"", b"x", b"minidb", b"NCHW", b"NHWC", b"/dev/zero", b"nonexistent.minidb", b"\xff\xfe",
           b"op { type: ", b'name: "s" op { type: "Relu" input: "x" output: "y" }', b"{" * 300]
MARK = "\x01BAD"  # a string mutate_strings makes invalid UTF-8 in the wire bytes (same length: framing holds)


def read(relative: str) -> bytes:
    return (ROOT / relative).read_bytes()


# ------------------------------------------------------------------------------------------- bytes
def mutate_bytes(rng: random.Random, data: bytes, donors=()) -> bytes:
    """1-4 byte-level edits: bit flips, interesting bytes, truncation, insertion, deletion, duplication, splicing."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        n = len(data)
        pos = rng.randrange(n + 1) if n else 0
        kind = rng.randrange(8)
        if kind == 0 and n:
            data[min(pos, n - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1 and n:
            data[min(pos, n - 1)] = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0x01, 0x08, 0x0A, 0x12, 0x1A])
        elif kind == 2:
            del data[pos:]
        elif kind == 3:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 4:
            del data[pos:pos + rng.randint(1, 64)]
        elif kind == 5 and n:
            start = rng.randrange(n)
            data[pos:pos] = data[start:start + rng.randint(1, 256)]
        elif kind == 6 and donors:
            donor = rng.choice(donors)
            if donor:
                start = rng.randrange(len(donor))
                data[pos:pos] = donor[start:start + rng.randint(1, 512)]
        elif kind == 7 and n >= 4:   # a varint made huge: lengths and counts that lie
            data[min(pos, n - 4):min(pos, n - 4) + 4] = b"\xff\xff\xff\x7f"
    return bytes(data)


# ------------------------------------------------------------------------------------------- text
_TEXT_INSERTS = ["{", "}", "<", ">", '"', "#", ":", "[", "]", "\\", "\n", "op {", "arg {", "substep {",
                 "execution_step {", 'type: "Relu"', "n {", "dims: -1", "\\377", "\u00e9", "\x00"]


def mutate_text(rng: random.Random, text: str) -> str:
    """1-3 edits that keep text mostly text: inserted tokens, deleted or duplicated lines, numbers made huge or
    negative, strings replaced, braces nested hundreds deep."""
    lines = text.split("\n")
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6)
        i = rng.randrange(len(lines)) if lines else 0
        if not lines:
            lines = [""]
        if kind == 0:
            line = lines[i]
            at = rng.randrange(len(line) + 1)
            lines[i] = line[:at] + rng.choice(_TEXT_INSERTS) + line[at:]
        elif kind == 1 and len(lines) > 1:
            del lines[i]
        elif kind == 2:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif kind == 3:
            lines[i] = _replace_numbers(rng, lines[i])
        elif kind == 4:
            depth = rng.choice([50, 99, 100, 101, 150, 400])
            wrapper = rng.choice(["substep {", "op { arg { name: \"step_net\" n {", "n {", "{"])
            lines.insert(i, wrapper * depth + "}" * depth * wrapper.count("{"))
        else:
            lines[i] = lines[i].replace('"', '"' + rng.choice(["\\377", "\\303(", "x" * 3, "", "{"]), 1)
    return "\n".join(lines)


def _replace_numbers(rng: random.Random, line: str) -> str:
    import re
    return re.sub(r"-?\d+(\.\d+)?", lambda m: str(rng.choice(INTS + [1e300, -0.0])) if rng.random() < 0.6
                  else m.group(), line)


# ------------------------------------------------------------------------------------------- messages
def nets_of(msg) -> list:
    """Every NetDef in a NetDef or PlanDef, nested ones (Argument.n / nets) included."""
    todo = list(msg.network) if isinstance(msg, proto.PlanDef) else [msg]
    out = []
    while todo:
        net = todo.pop()
        out.append(net)
        for op in net.op:
            for arg in op.arg:
                if arg.HasField("n"):
                    todo.append(arg.n)
                todo.extend(arg.nets)
    return out


def random_value_arg(rng: random.Random, arg: proto.Argument, kind: str | None = None) -> None:
    """Set arg to a random value of a random (or the given) kind, clearing what it held."""
    name = arg.name
    arg.Clear()
    arg.name = name
    kind = kind or rng.choice(["i", "f", "s", "ints", "floats", "strings", "t", "n", "none"])
    if kind == "i":
        arg.i = rng.choice(INTS)
    elif kind == "f":
        arg.f = rng.choice(FLOATS)
    elif kind == "s":
        arg.s = rng.choice(STRINGS)
    elif kind == "ints":
        arg.ints.extend(rng.choice(INTS) for _ in range(rng.randint(0, 5)))
    elif kind == "floats":
        arg.floats.extend(rng.choice(FLOATS) for _ in range(rng.randint(0, 5)))
    elif kind == "strings":
        arg.strings.extend(rng.choice(STRINGS) for _ in range(rng.randint(0, 3)))
    elif kind == "t":
        arg.t.CopyFrom(random_tensor(rng))
    elif kind == "n":
        arg.n.CopyFrom(proto.NetDef(name=f"sub{rng.randrange(9)}", op=[random_op(rng)[0]]))


def random_tensor(rng: random.Random) -> proto.TensorProto:
    """A small TensorProto whose dims may lie (negative, huge, not matching the data)."""
    t = proto.TensorProto(data_type=rng.choice([0, 1, 2, 3, 4, 5, 10, 12, 13, 14]))
    t.dims.extend(rng.choice([0, 1, 2, 3, -1, 2**32, 2**62]) for _ in range(rng.randint(0, 3)))
    count = rng.randint(0, 6)
    if t.data_type in (1, 12):
        t.float_data.extend([1.0] * count) if t.data_type == 1 else t.int32_data.extend([0x3C00] * count)
    elif t.data_type == 4:
        t.string_data.extend([b"a"] * count)
    else:
        t.raw_data = bytes(rng.randrange(256) for _ in range(count * rng.choice([1, 2, 4, 8])))
    if rng.random() < 0.3:
        t.segment.begin, t.segment.end = rng.choice([(0, 1), (1, 0), (-1, 3), (0, 2**62), (2, 4)])
    return t


def edit_message(rng: random.Random, msg) -> None:
    """1-3 field-level edits of a NetDef or PlanDef, in place: op types, argument values and kinds, blob names,
    device options, tensors, nets nested in arguments (deep, or as text), plan steps; strings set to MARK."""
    for _ in range(rng.randint(1, 3)):
        try:
            _edit_once(rng, msg)
        except Exception:  # noqa: BLE001 - protobuf refusing to copy a message > 100 levels deep: skip the edit
            continue


def _edit_once(rng: random.Random, msg) -> None:
    nets = nets_of(msg) or [msg.network.add(name="added")]
    net = rng.choice(nets)
    kind = rng.randrange(11)
    op = rng.choice(net.op) if len(net.op) else net.op.add(type="Relu", input=["x"], output=["y"])
    if kind == 0:
        op.type = rng.choice(["", "Bogus", MARK] + list(REGISTRY))
    elif kind == 1:
        arg = rng.choice(op.arg) if len(op.arg) and rng.random() < 0.7 else op.arg.add(name=_arg_name(rng, op))
        random_value_arg(rng, arg)
    elif kind == 2:
        names = list(op.input) + list(op.output) + ["x", "W1", "X", MARK, ""]
        field = op.input if rng.random() < 0.5 else op.output
        if len(field) and rng.random() < 0.5:
            field[rng.randrange(len(field))] = rng.choice(names)
        elif len(field) and rng.random() < 0.5:
            del field[rng.randrange(len(field))]
        else:
            field.append(rng.choice(names))
    elif kind == 3:
        op.device_option.device_type = rng.choice([0, 1, 2, 6, 99])
        op.device_option.device_id = rng.choice([0, 1, 7])
        if rng.random() < 0.2:
            op.device_option.node_name = rng.choice(["x", MARK])
    elif kind == 4:
        wrap_deep(rng, net, rng.choice([1, 5, 30, 33, 34, 40]))
    elif kind == 5:
        arg = op.arg.add(name=rng.choice(["step_net", "net", "backward_step_net", "then_net"]))
        arg.s = _net_text(rng, rng.choice([1, 3, 10, 31, 34]))
    elif kind == 6 and len(net.op) > 1:
        i, j = rng.randrange(len(net.op)), rng.randrange(len(net.op))
        if rng.random() < 0.5:
            del net.op[i]
        else:
            net.op.add().CopyFrom(net.op[j])
    elif kind == 7:
        field = net.external_input if rng.random() < 0.5 else net.external_output
        field.append(rng.choice(["X", "nothing", MARK, ""]))
    elif kind == 8:
        net.name = rng.choice(["", "xor_predict", "xor_init", MARK, "n" * 3])
    elif kind == 9 and isinstance(msg, proto.PlanDef) and len(msg.execution_step):
        _edit_step(rng, msg, rng.choice(msg.execution_step))
    else:
        arg = op.arg.add(name=_arg_name(rng, op))
        random_value_arg(rng, arg, "t")


def _arg_name(rng: random.Random, op) -> str:
    names = list(REGISTRY.get(op.type).args) if op.type in REGISTRY else []
    return rng.choice(names + ["bogus", MARK, "order", "shape", "axis"])


def _edit_step(rng: random.Random, plan, step) -> None:
    kind = rng.randrange(6)
    if kind == 0:
        step.network.append(rng.choice([n.name for n in plan.network] + ["missing", MARK]))
    elif kind == 1:
        step.num_iter = rng.choice([0, 1, 2, 3, -1])    # never a long loop: that is the model's own right
    elif kind == 2:
        step.should_stop_blob = rng.choice(["X", "y", "missing", MARK])
        step.only_once = True    # a stop blob that never turns true loops forever: the model's right, not a bug
    elif kind == 3:
        sub = step.substep.add(name=rng.choice(["s", MARK]))
        sub.network.extend(n.name for n in plan.network[:1])
    elif kind == 4:
        step.create_workspace = not step.create_workspace
    else:
        step.report_net = rng.choice([n.name for n in plan.network] + ["missing"])
        step.report_interval = rng.choice([0, 1, -1])


def wrap_deep(rng: random.Random, net, levels: int) -> None:
    """Nest a copy of net's ops `levels` deep in RecurrentNetwork-like `step_net` arguments, built in place
    (protobuf's copies refuse more than 100 levels)."""
    inner = proto.NetDef()
    inner.CopyFrom(net)
    del net.op[:]
    cur = net
    for i in range(levels):
        cur = cur.op.add(type=rng.choice(["RecurrentNetwork", "Do", "Relu"])).arg.add(name="step_net").n
        cur.name = f"level{i}"
    cur.op.extend(inner.op)


def _net_text(rng: random.Random, levels: int) -> bytes:
    net = proto.NetDef(name="t")
    wrap_deep(rng, net, levels)
    text = proto.to_text(net) if levels < 60 else "n {" * levels
    return text.encode()


def mutate_strings(data: bytes) -> bytes:
    """Wire bytes with every MARK string made invalid UTF-8."""
    return data.replace(MARK.encode(), b"\xff" + MARK.encode()[1:])


def serialize(rng: random.Random, msg, text: bool | None = None) -> tuple[bytes, str]:
    """(bytes, suffix) of msg as binary (with MARK strings made invalid UTF-8) or text."""
    if text is None:
        text = rng.random() < 0.4
    if text:
        try:
            return proto.to_text(msg).replace(MARK, "bad").encode(), ".pbtxt"
        except RecursionError:   # protobuf's printer recurses: a message hundreds deep prints no text
            pass
    return mutate_strings(msg.SerializeToString()), ".pb"


# ------------------------------------------------------------------------------------------- minidb
def mutate_minidb(rng: random.Random, data: bytes) -> bytes:
    """Record-level edits of a minidb file (a record's BlobProto: dims, data type, segment, names, type; keys
    made invalid UTF-8), or byte-level ones."""
    records = _records(data)
    if not records or rng.random() < 0.3:
        return mutate_bytes(rng, data)
    i = rng.randrange(len(records))
    key, value = records[i]
    blob = proto.BlobProto()
    try:
        blob.ParseFromString(value)
    except Exception:  # noqa: BLE001 - not a BlobProto: edit the bytes instead
        records[i] = (key, mutate_bytes(rng, value))
    else:
        kind = rng.randrange(6)
        t = blob.tensor
        if kind == 0:
            del t.dims[:]
            t.dims.extend(rng.choice(INTS[:5] + [2**32, 2**62, 10**12]) for _ in range(rng.randint(0, 4)))
        elif kind == 1:
            t.data_type = rng.choice([0, 1, 2, 3, 4, 5, 6, 10, 12, 13, 15])
        elif kind == 2:
            t.segment.begin, t.segment.end = rng.choice([(0, 1), (5, 2), (-3, 2), (0, 10**12), (0, 0)])
        elif kind == 3:
            blob.type = rng.choice(["Tensor", "std::string", "DBReader", "Bogus", ""])
        elif kind == 4:
            key = key + b"\xff" if rng.random() < 0.5 else key.replace(b"#%", b"#%9")
        else:
            blob.content = rng.choice(STRINGS)
        records[i] = (key, blob.SerializeToString())
    if rng.random() < 0.2 and records:
        records.append(records[rng.randrange(len(records))])
    return b"".join(struct.pack("<ii", len(k), len(v)) + k + v for k, v in records if k and v)


def _records(data: bytes) -> list:
    out, pos = [], 0
    while pos + 8 <= len(data):
        klen, vlen = struct.unpack_from("<ii", data, pos)
        if klen <= 0 or vlen <= 0 or pos + 8 + klen + vlen > len(data):
            return []
        out.append((data[pos + 8:pos + 8 + klen], data[pos + 8 + klen:pos + 8 + klen + vlen]))
        pos += 8 + klen + vlen
    return out


# ------------------------------------------------------------------------------------------- feeds
def random_literal(rng: random.Random) -> str:
    """A --feed value: a nested list of numbers (ragged, deep, huge, not numbers) with an optional dtype, or junk."""
    if rng.random() < 0.15:
        return "".join(rng.choice("[](){}0123456789.,-+e:xjTrueNone'\" ") for _ in range(rng.randint(0, 40)))
    depth = rng.choice([0, 1, 2, 3, 64, 65, 200, 5000])
    if depth > 3:
        body = "[" * depth + str(rng.choice(INTS)) + "]" * depth
    else:
        body = _nested(rng, depth)
    dtype = rng.choice(["", "", ":float32", ":int64", ":int32", ":uint8", ":bool", ":float16", ":flaot"])
    return body + dtype


def _nested(rng: random.Random, depth: int) -> str:
    if depth == 0:
        return rng.choice([str(rng.choice(INTS)), repr(rng.choice(FLOATS)), "True", "'a'", "None", "1j",
                           "9" * rng.choice([1, 30, 5000]), "1e999"])
    width = rng.randint(0, 3)
    items = [_nested(rng, depth - 1 if rng.random() < 0.9 else max(depth - 2, 0)) for _ in range(width)]
    return "[" + ", ".join(items) + "]"


def npy_bytes(rng: random.Random) -> bytes:
    """An .npy file, perhaps with a header that lies about its shape, dtype or order, perhaps byte-mutated."""
    arr = np.arange(rng.choice([0, 1, 6, 24]), dtype=rng.choice([np.float32, np.int64, np.uint8]))
    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    if rng.random() < 0.5:
        lie = rng.choice([b"(9999999, 99999)", b"(-1,)", b"(4611686018427387904, 4)", b"(2, 3, 4, 5, 6)", b"()",
                          b"(0,)"])
        data = data.replace(repr(arr.shape).encode(), lie, 1)
    if rng.random() < 0.5:
        data = mutate_bytes(rng, data)
    return data


def npz_bytes(rng: random.Random) -> bytes:
    """An .npz archive of one or two members (stored or deflated), perhaps with a lying member or mutated bytes."""
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])) as z:
        z.writestr("X.npy", npy_bytes(rng))
        if rng.random() < 0.3:
            z.writestr("other.txt", b"not an array")
    data = buf.getvalue()
    return mutate_bytes(rng, data) if rng.random() < 0.5 else data


# ------------------------------------------------------------------------------------------- one-op nets
POOL = {
    "f23": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5, "f3": np.array([0.5, -1.0, 2.0], np.float32),
    "f4d": np.ones((1, 2, 3, 3), np.float32), "i4": np.array([0, 1, 2, 1], np.int32),
    "l2": np.array([1, 2], np.int64), "b23": np.array([[True, False, True]] * 2), "s": np.array(0.5, np.float32),
    "e": np.zeros((0, 3), np.float32), "d23": np.ones((2, 3)), "u8": np.zeros((1, 4, 4, 3), np.uint8),
    "neg": np.array([-1, 5], np.int32), "t1": np.array([0], np.int64),
}


def random_op(rng: random.Random):
    """(OperatorDef, its blob pool): a registered op type with inputs from POOL (a count around its arity) and
    random values for some of its declared arguments, or for arguments it does not declare."""
    schema = rng.choice(REGISTRY.schemas())
    lo, hi = schema.inputs
    n_in = max(0, rng.randint(lo - 1, int(min(hi, lo + 3)) + 1) if rng.random() < 0.2 else
               rng.randint(lo, int(min(hi, lo + 2))))
    olo, ohi = schema.outputs
    n_out = rng.randint(olo, int(min(ohi, olo + 2)))
    names = list(POOL)
    op = proto.OperatorDef(type=schema.type, input=[rng.choice(names) for _ in range(n_in)],
                           output=[f"out{i}" for i in range(n_out)])
    if n_in and n_out and rng.random() < 0.2:
        op.output[0] = op.input[0]
    kinds = {"int": "i", "bool": "i", "float": "f", "num": "f", "str": "s", "ints": "ints", "floats": "floats",
             "nums": "floats", "strs": "strings", "net": "n", "nets": "n", "tensor": "t", "tensors": "t"}
    for name, spec in schema.args.items():
        if rng.random() < 0.4:
            arg = op.arg.add(name=name)
            wrong = rng.random() < 0.1
            random_value_arg(rng, arg, None if wrong else kinds.get(spec.kind))
    if rng.random() < 0.1:
        random_value_arg(rng, op.arg.add(name="bogus"))
    return op, POOL
