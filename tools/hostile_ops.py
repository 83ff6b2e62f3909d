"""Surface 2 of the hostile campaign: the op argument storm. Case i takes op type i mod N of the registry (so
every type is stormed with every N cases), builds a net of 1-3 ops of that type over random inputs (float32/64/16,
int8-64, uint8/16, bool, byte and unicode strings; 0-d, empty, up to 5-d, small values or extremes, NaN and inf),
chained or in place, with each declared argument drawn adversarially from its kind (and sometimes the wrong
kind), undeclared arguments, and odd engines or devices; huge sizes appear only as size arguments. It runs
through run (once, or three times: the third is compiled), run --engine onnxruntime, export-onnx, synth-init or
inspect --shapes."""
from __future__ import annotations

import io
import random

import numpy as np

from stepnet.io import proto
from stepnet.ops import REGISTRY

import hostile_values as hv

STRS = ["", "NCHW", "NHWC", "SUM", "MEAN", "MAX", "MIN", "sum", "mean", "max", "min", "avg", "AVG", "l1", "l2",
        "L1", "L2", "constant", "reflect", "edge", "linear", "rnn", "timestep", "minidb", "leveldb", "tcp",
        "NONE", "none", "float", "int32", "bool", "sigmoid", "tanh", "relu", "x", "\x00", "\u00e9", "NCHW\x00",
        "a" * 3000, "../x.minidb", "%s", "{rank}", "CUDNN", "1", "-1", "nan", "true", ","]
SIZE_INTS = [0, 1, 2, 3, -1, -2, 2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1, -2**63, 10**6]
DTYPES = [np.float32] * 6 + [np.float64, np.float16, np.int32, np.int32, np.int64, np.int64, np.int8, np.uint8,
                             np.int16, np.uint16, np.bool_, "S", "U"]
ENGINES = ["", "", "", "CUDNN", "DNNLOWP", "MKLDNN", "SIMD", "\x00", "x" * 300]


def array(rng: random.Random) -> np.ndarray:
    dtype = rng.choice(DTYPES)
    rank = rng.choice([0, 1, 1, 2, 2, 2, 3, 4, 4, 5])
    shape = tuple(rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5, 8]) for _ in range(rank))
    n = int(np.prod(shape)) if shape else 1
    nrng = np.random.default_rng(rng.randrange(2**32))
    if dtype in ("S", "U"):
        words = [b"", b"a", b"\xff\x00", b"x" * 40] if dtype == "S" else ["", "a", "\u00e9\x00", "y" * 40]
        return np.array([rng.choice(words) for _ in range(n)], dtype=dtype).reshape(shape)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        a = (nrng.standard_normal(n) * rng.choice([1, 1, 100, 1e-3])).astype(dt)
        if rng.random() < 0.15 and n:
            a[nrng.integers(0, n, size=max(1, n // 4))] = rng.choice([np.nan, np.inf, -np.inf, 0.0])
    elif dt.kind == "b":
        a = nrng.integers(0, 2, n).astype(bool)
    else:
        info = np.iinfo(dt)
        a = nrng.integers(max(info.min, -3), min(info.max, 10), n, endpoint=True).astype(dt)
        if rng.random() < 0.1 and n:
            a[0] = rng.choice([info.min, info.max])
    return a.reshape(shape)


def arg_value(rng: random.Random, kind: str, default=None):
    """A value for an argument of `kind`, adversarial (the declared kind, nine times in ten)."""
    if rng.random() < 0.1:
        kind = rng.choice(["int", "float", "str", "ints", "floats", "strs", "net", "tensor", "nets"])
    if kind in ("int", "bool"):
        return rng.choice(SIZE_INTS + hv.SMALL_INTS + ([int(default)] if isinstance(default, (int, bool)) else []))
    if kind in ("float", "num"):
        return hv.edge_float(rng) if rng.random() < 0.6 else rng.choice([0.1, 0.9, 2.5, -0.5, 3.0])
    if kind == "str":
        return rng.choice(STRS + ([default] if isinstance(default, str) else []))
    if kind in ("ints", "nums"):
        n = rng.choice([0, 1, 2, 2, 3, 4, 5, 9, 70])
        pool = SIZE_INTS if rng.random() < 0.4 else hv.SMALL_INTS
        return [rng.choice(pool) for _ in range(n)]
    if kind == "floats":
        return [hv.edge_float(rng) for _ in range(rng.choice([0, 1, 2, 4, 1000]))]
    if kind == "strs":
        return [rng.choice(STRS) for _ in range(rng.choice([0, 1, 2, 3, 40]))]
    if kind == "net":
        return hv.small_net(rng) if rng.random() < 0.7 else hv.net_text(rng)
    if kind == "nets":
        return [hv.small_net(rng, f"n{i}") for i in range(rng.choice([0, 1, 2, 30]))]
    if kind == "tensor":
        return hv.random_tensor(rng)
    return rng.choice([hv.edge_int(rng), hv.edge_float(rng), rng.choice(STRS), [1, 2]])


def _set(arg: proto.Argument, value) -> None:
    if isinstance(value, bool) or isinstance(value, int):
        arg.i = max(min(int(value), 2**63 - 1), -2**63)
    elif isinstance(value, float):
        arg.f = value
    elif isinstance(value, str):
        arg.s = value.encode("utf-8", "surrogatepass")
    elif isinstance(value, bytes):
        arg.s = value
    elif isinstance(value, proto.NetDef):
        arg.n.CopyFrom(value)
    elif isinstance(value, proto.TensorProto):
        arg.t.CopyFrom(value)
    elif isinstance(value, list):
        if value and isinstance(value[0], proto.NetDef):
            arg.nets.extend(value)
        elif value and isinstance(value[0], float):
            arg.floats.extend(value)
        elif value and isinstance(value[0], str):
            arg.strings.extend(v.encode("utf-8", "surrogatepass") for v in value)
        else:
            arg.ints.extend(max(min(v, 2**63 - 1), -2**63) for v in value)


def storm_net(rng: random.Random, schema) -> tuple[proto.NetDef, dict]:
    """1-3 ops of schema's type, their inputs (a dict of arrays) and arguments drawn adversarially."""
    pool: dict = {}
    ops = []
    made: list[str] = []
    for k in range(rng.choice([1, 1, 2, 3])):
        lo, hi = schema.inputs
        n_in = rng.randint(lo, int(min(hi, lo + 3)))
        if rng.random() < 0.08:
            n_in = max(0, n_in + rng.choice([-1, 1]))
        inputs = []
        for _j in range(n_in):
            if made and rng.random() < 0.4:
                inputs.append(rng.choice(made))
            elif pool and rng.random() < 0.15:
                inputs.append(rng.choice(list(pool)))
            else:
                name = f"in{len(pool)}"
                pool[name] = array(rng)
                inputs.append(name)
        olo, ohi = schema.outputs
        n_out = rng.randint(olo, int(min(ohi, olo + 2)))
        outputs = [f"o{k}_{j}" for j in range(n_out)]
        if inputs and outputs and rng.random() < 0.15:
            outputs[0] = rng.choice(inputs)
        o = proto.OperatorDef(type=schema.type, input=inputs, output=outputs, engine=rng.choice(ENGINES))
        for name, spec in schema.args.items():
            if rng.random() < 0.55:
                _set(o.arg.add(name=name), arg_value(rng, spec.kind, spec.default))
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            _set(o.arg.add(name=rng.choice(["bogus", "shape", "axis", "order", "dtype", "to", "value", "\x00",
                                            "x" * 300, "__class__"])), arg_value(rng, "any"))
        if rng.random() < 0.08:
            o.device_option.device_type = rng.choice([1, 2, 6, 7])
            o.device_option.device_id = rng.choice([0, 1, 2**31 - 1])
        if rng.random() < 0.05:
            o.control_input.extend(rng.choice([["in0"], ["missing"], made[:1]]))
        ops.append(o)
        made.extend(outputs)
    last = ops[-1].output[:1] or made[:1]
    net = proto.NetDef(name=rng.choice(["storm", "storm", "\u00e9"]), op=ops, external_input=list(pool),
                       external_output=list(last))
    return net, pool


def _spec(name: str, a: np.ndarray) -> str | None:
    if a.dtype.kind in "SU":
        return None
    return f"{name}={','.join(map(str, a.shape))}:{a.dtype.name}"


def make(rng: random.Random, case) -> None:
    schemas = REGISTRY.schemas()
    schema = schemas[case.index % len(schemas)]
    net, pool = storm_net(rng, schema)
    data, suffix = hv.serialize(rng, net)
    name = case.write("net" + suffix, data)
    buf = io.BytesIO()
    np.savez(buf, **pool)
    case.write("pool.npz", buf.getvalue())
    feed = ["--feed", "pool.npz"] if pool else []
    specs = [s for n, a in pool.items() if (s := _spec(n, a))]
    inputs = [w for s in specs for w in ("--input", s)]
    r = rng.random()
    if r < 0.42:
        case.argv = ["run", name, *feed, "-q", *rng.choice([[], [], ["--check-nan"], ["--device", "emulate"],
                                                          ["--strict"], ["--fused-cells", "off"]])]
    elif r < 0.67:
        case.argv = ["run", name, *feed, "-q", "-n", "3", *rng.choice([[], [], ["--check-nan"]])]
    elif r < 0.77:
        case.argv = ["run", name, *feed, "-q", "--engine", "onnxruntime", *rng.choice([[], ["-n", "2"]])]
    elif r < 0.86:
        case.argv = ["export-onnx", name, "-o", "out.onnx", *inputs]
    elif r < 0.92:
        case.argv = ["synth-init", name, "-o", "init.pb", *(inputs[:2] or ["--input", "in0=2,3"])]
    else:
        case.argv = ["inspect", name, "--shapes", *inputs]
