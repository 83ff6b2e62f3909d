"""Surface 3 of the hostile campaign (surface 4, feeds, is in hostile_feeds.py).

checkpoints: real checkpoints of the digits, binary-adder and xor plans (taken at an iteration boundary, and
finished; built once per worker) edited record by record: the __stepnet__ position (paths long, negative, past
the plan, into steps that do not loop, counts past num_iter, other dtypes and ranks), the readers' and
generator's JSON (other shapes, sources outside the root, huge or non-integer positions, deep nesting, NaN,
duplicate keys), blob types (DBReader, Int8, strings, unknown), chunk tricks (overlaps, gaps, duplicates,
segments past the tensor, odd chunk keys), huge dims, keys, truncation and garbage; then run --resume /
--load, export-predict --load or export-onnx --load."""
from __future__ import annotations

import json
import random
import struct

import numpy as np

from stepnet.io import proto

import hostile_values as hv

PLANS = {"digits": "models/digits/train.pbtxt", "adder": "models/binary_adder/binary_adder.pbtxt",
         "xor": "models/xor/plan.pbtxt"}
POSITION, READERS, RNG = "__stepnet__/plan_position", "__stepnet__/readers", "__stepnet__/rng"


# ------------------------------------------------------------------------------------------- minidb records
def records(data: bytes) -> list:
    out, pos = [], 0
    while pos + 8 <= len(data):
        k, v = struct.unpack_from("<ii", data, pos)
        out.append([data[pos + 8:pos + 8 + k], data[pos + 8 + k:pos + 8 + k + v]])
        pos += 8 + k + v
    return out


def pack(recs) -> bytes:
    return b"".join(struct.pack("<ii", len(k), len(v)) + k + v for k, v in recs)


def blob(value) -> bytes:
    from stepnet.io import minidb
    return minidb.serialize_blob("x", value)[0][1]


def tensor_blob(dims, data_type=10, **fields) -> bytes:
    b = proto.BlobProto(name="x", type="Tensor")
    b.tensor.dims.extend(dims)
    hv.set_data_type(b.tensor, data_type)
    for k, v in fields.items():
        getattr(b.tensor, k).extend(v) if isinstance(v, list) else setattr(b.tensor, k, v)
    return b.SerializeToString()


def hostile_json(rng: random.Random, outside: str) -> str:
    reader = {"source": rng.choice(["models/digits/train.minidb", "models/digits/test.minidb", outside,
                                    "../../outside/secret.minidb", "/dev/zero", "", "\x00", "models"]),
              "pos": rng.choice([0, 1, -1, 2**63 - 1, 2**63, 10**30, 1.5, "3", True, None, [0]])}
    state = {"bit_generator": rng.choice(["PCG64", "MT19937", "Philox", "", 1]),
             "state": rng.choice([{"state": 2**127, "inc": 1}, {"state": -1, "inc": 2**128}, {"state": 1.5, "inc": 3},
                                  {"state": 1}, [], {"state": 0, "inc": 0, "extra": 1}]),
             "has_uint32": rng.choice([0, 1, 2, -1, True]), "uinteger": rng.choice([0, 2**32, -1, 2**32 - 1])}
    kind = rng.randrange(9)
    if kind == 0:
        return json.dumps({rng.choice(["train_reader", "test_reader", "X", "", "\u00e9"]): reader})
    if kind == 1:
        return json.dumps(state)
    if kind == 2:
        return "[" * rng.choice([1000, 100000]) + "]" * rng.choice([0, 1000])
    if kind == 3:
        return rng.choice(["NaN", "Infinity", "-Infinity", '{"pos": NaN}', "1" * 5000, '"\\ud800"', "", "null",
                           "{}", "[]", '{"a": 1, "a": 2}', "\xff", '{"state": 1e999}'])
    if kind == 4:
        return json.dumps({f"r{i}": reader for i in range(rng.choice([2, 500]))})
    if kind == 5:
        return json.dumps({"train_reader": {**reader, "extra": 1}})
    if kind == 6:
        return json.dumps({"train_reader": {"source": reader["source"]}})
    if kind == 7:
        return json.dumps({"bit_generator": "PCG64", "state": {"state": 2**128 - 1, "inc": 2**128 - 1},
                           "has_uint32": 1, "uinteger": 2**32 - 1})
    return json.dumps(rng.choice([reader, state, [reader], 3, "s"]))


def position_blob(rng: random.Random) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return blob(np.array(rng.choice([[1, 0], [1, 1], [1, 11], [1, 12], [1, 13], [0, 0], [2, 0], [9, 0],
                                         [1, 0, 0], [1, 1, 49], [1, 0, 50], [-1], [-1, 0], [-1, 5]]), np.int64))
    if kind == 1:
        return blob(np.array([1] + [0] * rng.choice([50, 99, 100, 101, 5000]) + [0], np.int64))
    if kind == 2:
        return blob(np.array([rng.choice([0, 1, 2**62, 2**63 - 1]), rng.choice([0, 2**63 - 1, 2**62, 10**12])],
                             np.int64))
    if kind == 3:
        return blob(np.array([1, 2], rng.choice([np.float32, np.bool_, np.uint16, np.int8, np.float16])))
    if kind == 4:
        return blob(np.array([[1, 0]], np.int64) if rng.random() < 0.5 else np.array(1, np.int64))
    if kind == 5:
        return tensor_blob([2], 10, raw_data=b"\xff" * 8 + b"\0" * 8)   # 2**64 - 1 read as int64: -1
    if kind == 6:
        return blob(rng.choice([b"[1, 0]", "1,0", b""]))
    return tensor_blob([2], 10, int64_data=[1])   # dims that the data does not fill


def record_edit(rng: random.Random, recs: list, outside: str) -> list:
    keys = [k for k, _ in recs]
    tensors = [i for i, (k, _) in enumerate(recs) if not k.startswith(b"__stepnet__")]
    kind = rng.randrange(12)
    if kind == 0:
        recs = [[k, position_blob(rng) if k == POSITION.encode() else v] for k, v in recs]
        if POSITION.encode() not in keys:
            recs.append([POSITION.encode(), position_blob(rng)])
    elif kind in (1, 2):
        name = (READERS if kind == 1 else RNG).encode()
        recs = [[k, v] for k, v in recs if k != name] + [[name, blob(hostile_json(rng, outside))]]
    elif kind == 3 and tensors:   # another blob type in place of a tensor
        i = rng.choice(tensors)
        b = proto.BlobProto(name=recs[i][0].decode("utf-8", "replace"))
        b.type = rng.choice(["DBReader", "Int8TensorCPU", "std::string", "Bogus", "", "Tensor", "QTensor"])
        if b.type == "DBReader":
            b.content = proto.DBReaderProto(name="r", source=rng.choice([outside, "../../outside/secret.minidb",
                                                                         "models/digits/train.minidb", "/dev/zero",
                                                                         "nowhere.minidb"]),
                                            db_type=rng.choice(["minidb", "leveldb", "", "../x"]),
                                            key=rng.choice(["", "k"])).SerializeToString()
        elif b.type == "QTensor" or rng.random() < 0.3:
            b.qtensor.dims.extend([2, 2])
            b.qtensor.precision, b.qtensor.scale, b.qtensor.bias, b.qtensor.is_signed = 8, 1.0, 0.0, True
            b.qtensor.data.extend([1] * rng.choice([0, 4, 5]))
        else:
            b.content = rng.choice([b"", b"\xff" * 10, b"x" * 100000, hv.net_text(rng)])
        if rng.random() < 0.3:
            b.content_num_chunks, b.content_chunk_id = rng.choice([(2, 0), (2, 5), (-1, 0), (2**31 - 1, 1)])
        recs[i][1] = b.SerializeToString()
    elif kind == 4 and tensors:   # chunks: the tensor split in parts whose segments lie
        i = rng.choice(tensors)
        name = recs[i][0].split(b"#%")[0]
        n = rng.choice([4, 6, 2**20, 2**40])
        parts = []
        for j, (b_, e_) in enumerate(rng.choice([[(0, 2), (2, 4)], [(0, 3), (2, 4)], [(0, 2), (3, 4)],
                                                  [(2, 4), (0, 2)], [(0, 2), (0, 2)], [(0, 4), (4, 8)],
                                                  [(0, 2), (2, 2**40)], [(-2, 2), (2, 4)], [(0, 2)]])):
            t = proto.BlobProto(name=name.decode("utf-8", "replace"), type="Tensor")
            t.tensor.dims.extend([n])
            t.tensor.data_type = rng.choice([1, 1, 10, 2])
            t.tensor.float_data.extend([1.0] * max(0, min(e_ - b_, 8))) if t.tensor.data_type == 1 else \
                t.tensor.int64_data.extend([1] * max(0, min(e_ - b_, 8)))
            t.tensor.segment.begin, t.tensor.segment.end = b_, e_
            suffix = rng.choice([str(j), str(j), "-1", "x", "99999999999999999999", "", "0"])
            parts.append([name + b"#%" + suffix.encode(), t.SerializeToString()])
        recs = recs[:i] + parts + recs[i + 1:]
    elif kind == 5 and tensors:   # huge dims over little data
        i = rng.choice(tensors)
        dims = rng.choice([[2**40], [65536, 65536], [2**32, 2**32], [0, 2**62], [-1, 4], [1] * 65, [3, -3],
                           [2**31 - 1, 2], [5000, 5000]])
        recs[i][1] = tensor_blob(dims, rng.choice([1, 10, 2, 4, 12, 5]), **rng.choice(
            [{}, {"float_data": [1.0] * 4}, {"raw_data": b"\x00" * 16}, {"string_data": [b"a"] * 3}]))
    elif kind == 6 and tensors:   # a tensor with a million dims entries, or a deeply nested value
        i = rng.choice(tensors)
        recs[i][1] = tensor_blob([1] * rng.choice([70, 10**6]), 1, float_data=[1.0]) if rng.random() < 0.5 else \
            b"\x1a\x02" * 5000   # lengths that nest and then do not fit
    elif kind == 7:   # keys
        i = rng.randrange(len(recs)) if recs else None
        if i is not None:
            recs[i][0] = rng.choice([b"\xff\xfe", b"__stepnet__/evil", b"x" * 70000, b"#%0", b"a#%0#%1",
                                     recs[i][0] + b"\x00", b"../../etc", POSITION.encode()])
    elif kind == 8 and recs:   # a blob twice, with other shapes
        k, v = rng.choice(recs)
        recs.append([k, blob(np.zeros((3, 5), np.float32))])
    elif kind == 9:
        recs.append([b"big_string", blob(b"s" * rng.choice([10, 70 << 20 if rng.random() < 0.1 else 1000]))])
    elif kind == 10 and tensors:   # a tensor of a type and data that do not agree
        i = rng.choice(tensors)
        recs[i][1] = tensor_blob([2, 2], rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16]),
                                 **rng.choice([{"raw_data": b"\x01" * rng.choice([3, 4, 16, 32])},
                                               {"byte_data": b"\x01" * 4}, {"int32_data": [1, 2**31 - 1, -1, 7]},
                                               {"double_data": [float("nan")] * 4}, {"string_data": [b"\xff"] * 4}]))
    else:   # garbage bytes in a value
        if recs:
            i = rng.randrange(len(recs))
            v = bytearray(recs[i][1])
            for _ in range(rng.randint(1, 6)):
                if v:
                    v[rng.randrange(len(v))] = rng.randrange(256)
            recs[i][1] = bytes(v)
    return recs


def make_checkpoint(rng: random.Random, case) -> None:
    name = rng.choice(["digits", "adder", "xor"])
    state = rng.choice(["mid", "done"]) if name != "xor" else "done"
    data = (case.env.assets / "ckpt" / f"{name}_{state}.minidb").read_bytes()
    recs = records(data)
    outside = str(case.env.outside / "secret.minidb")
    for _ in range(rng.randint(1, 3)):
        recs = record_edit(rng, recs, outside)
    raw = pack([r for r in recs if r[0] or r[1]])
    if rng.random() < 0.12:   # cut anywhere: in a header, a key, a value
        raw = raw[:rng.choice([rng.randrange(len(raw) + 1), 4, 8, 9, len(raw) - 1])]
    if rng.random() < 0.1:
        raw += rng.choice([b"\x00" * 3, struct.pack("<ii", 2**31 - 1, 2**31 - 1), struct.pack("<ii", -1, 5),
                           struct.pack("<ii", 1, 1) + b"k"])
    case.write("ck.minidb", raw)
    case.link("models/digits/train.minidb", "models/digits/test.minidb", "models/binary_adder/train.minidb",
              "models/binary_adder/test.minidb")
    plan = PLANS[name] if rng.random() < 0.85 else PLANS[rng.choice(list(PLANS))]
    plan_path = str(case.env.assets / plan)
    xor = case.env.assets / "models/xor"
    case.argv = rng.choice([
        ["run", plan_path, "--resume", "ck.minidb", "-q"], ["run", plan_path, "--resume", "ck.minidb", "-q"],
        ["run", plan_path, "--resume", "ck.minidb", "-q", "--checkpoint", "next.minidb", "--checkpoint-every", "1"],
        ["run", plan_path, "--load", "ck.minidb", "-q", "-n", "1"],
        ["run", str(xor / "init_net.pbtxt"), str(xor / "predict_net.pbtxt"), "--load", "ck.minidb", "--feed",
         "X=[[1, 0]]", "-q"],
        ["export-predict", plan_path, "--load", "ck.minidb", "-o", "exported"],
        ["export-onnx", str(xor / "init_net.pbtxt"), str(xor / "predict_net.pbtxt"), "--load", "ck.minidb", "-o",
         "out.onnx", "--input", "X=1,2"]])
