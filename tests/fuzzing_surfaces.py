"""Hostile inputs for the newer command-line surfaces (draw, export-onnx, export-predict, plot, run --metrics
--profile) and op families (MPI/Gloo collectives, If/While/Do, Int8, detection), shared by tests/test_fuzz.py
(hypothesis, in CI) and tools/fuzz_surfaces.py (the campaign's families). Like tests/fuzzing.py, every value
is small or astronomically large, so a case runs fast or fails fast.
"""
from __future__ import annotations

import random

import numpy as np

import fuzzing
from stepnet.io import proto
from stepnet.ops import REGISTRY
from stepnet.io.proto import NetDef, OperatorDef, make_argument

# Names that would break a dot file, an HTML label, a CSV row or a terminal if any of them went through raw.
HOSTILE_NAMES = ['a"b', "<B>x</B>", "]", "[", "}; a -> b; {", "x" * 3000, "\\", "&amp;", "label=<x>", "\n", "\t",
                 "\x7f", "\u202e", "\u00e9", "", " ", "-", "--", "-o", "{rank}", "{size}", "../../x", "/tmp/x",
                 "a,b", "\r", "<", ">", "'", "&#93;", "node", "digraph", "subgraph cluster_x", fuzzing.MARK]


def op(type_: str, inputs=(), outputs=(), **args) -> OperatorDef:
    o = OperatorDef(type=type_, input=list(inputs), output=list(outputs))
    o.arg.extend(make_argument(k, v) for k, v in args.items())
    return o


def fill(name: str, value, dtype: int = 1, shape=(1,)) -> OperatorDef:
    return op("ConstantFill", [], [name], shape=list(shape), value=value, dtype=dtype)


# ------------------------------------------------------------------------------------------- control flow
def control_net(rng: random.Random) -> NetDef:
    """A net with a bounded While (its counter lives in cond_net), an If with then/else nets, and a Do whose net
    holds another If: nested nets three deep."""
    inner_if = op("If", ["c2", "a"], ["b"], then_net=NetDef(name="then2", op=[op("Relu", ["a"], ["b"])]),
                  else_net=NetDef(name="else2", op=[op("Sigmoid", ["a"], ["b"])]))
    do_net = NetDef(name="do_body", op=[op("GT", ["a", "zero"], ["c2"], broadcast=1), inner_if])
    cond = NetDef(name="cond", op=[op("Add", ["i", "one"], ["i"]), op("LT", ["i", "limit"], ["cond"])])
    body = NetDef(name="body", op=[op("Scale", ["x"], ["x"], scale=0.5), op("Tanh", ["x"], ["x"])])
    net = NetDef(name="control", external_input=["x"], external_output=["y", "z"], op=[
        fill("i", 0, 10), fill("limit", rng.choice([0, 1, 3]), 10), fill("one", 1, 10), fill("zero", 0.0),
        op("LT", ["i", "limit"], ["cond"]),
        op("While", ["cond", "i", "limit", "one", "x"], ["x", "i"], loop_net=body, cond_net=cond),
        op("GT", ["x", "zero"], ["flag"], broadcast=1),
        op("Slice", ["flag"], ["c"], starts=[0], ends=[1]),
        op("Reshape", ["c"], ["c1", "old"], shape=[]),
        op("If", ["c1", "x"], ["y"], then_net=NetDef(name="then", op=[op("Exp", ["x"], ["y"])]),
           else_net=NetDef(name="else", op=[op("Negative", ["x"], ["y"])])),
        op("CreateScope", [], ["scope"]),
        op("Do", ["x", "zero", "scope"], ["z", "scope"], net=do_net, inner_blobs=["a", "zero", "b"],
           outer_blobs_idx=[0, 1, 3]),
    ])
    return net


def mutate_control(rng: random.Random, net: NetDef) -> None:
    """Field edits anywhere in the net except the While's cond_net, which is put back: the loop stays bounded
    (a While whose condition never turns false is the model's right, and is interruptible; see control.py)."""
    whiles = [o for o in net.op if o.type == "While"]
    saved = [proto.NetDef() for _ in whiles]
    for keep, w in zip(saved, whiles):
        keep.CopyFrom(next(a.n for a in w.arg if a.name == "cond_net"))
    fuzzing.edit_message(rng, net)
    if rng.random() < 0.3:
        rename(rng, net)
    for keep, w in zip(saved, [o for o in net.op if o.type == "While"]):
        args = [a for a in w.arg if a.name == "cond_net"]
        if args:
            args[0].n.CopyFrom(keep)
        else:
            w.arg.add(name="cond_net").n.CopyFrom(keep)
        w.input[:] = list(w.input[:1]) + ["i", "limit", "one"] + list(w.input[1:])


def rename(rng: random.Random, msg) -> None:
    """Give a random net, op, blob or argument of msg a hostile name."""
    nets = fuzzing.nets_of(msg)
    if not nets:
        return
    net = rng.choice(nets)
    name = rng.choice(HOSTILE_NAMES)
    kind = rng.randrange(5)
    if kind == 0 or not len(net.op):
        net.name = name
        return
    o = rng.choice(net.op)
    if kind == 1:
        o.name = name
    elif kind == 2:
        o.type = name
    elif kind == 3 and (len(o.input) or len(o.output)):
        old = rng.choice(list(o.input) + list(o.output))
        for other in net.op:   # the blob renamed everywhere in this net, so the graph still holds together
            other.input[:] = [name if b == old else b for b in other.input]
            other.output[:] = [name if b == old else b for b in other.output]
        net.external_input[:] = [name if b == old else b for b in net.external_input]
        net.external_output[:] = [name if b == old else b for b in net.external_output]
    elif len(o.arg):
        rng.choice(o.arg).name = name


# ------------------------------------------------------------------------------------------- collectives
COLLECTIVE_ARGS = [0, 1, -1, -2, 2, 7, 2**31, 2**31 - 1, 2**62, -2**63, 32767, 32768]


def collective_net(rng: random.Random) -> NetDef:
    """A net making a common world (MPI or Gloo), then one or two collectives or point-to-point ops with hostile
    root / tag / src / dst / size / rank arguments, on a small tensor `X` (or a scalar, strings, nothing)."""
    v = lambda: rng.choice(COLLECTIVE_ARGS)  # noqa: E731
    gloo = rng.random() < 0.4
    if gloo:
        args = {k: v() for k in rng.sample(["size", "rank", "timeout_ms"], rng.randint(0, 2))}
        make = op("CreateCommonWorld", [], ["comm"], **args)
        choices = [op("Broadcast", ["comm", "X"], ["X"], root=v()), op("Allreduce", ["comm", "X"], ["X"]),
                   op("Allgather", ["comm", "X"], ["G"]), op("Barrier", ["comm"]),
                   op("Allreduce", ["comm", "X", "X2"], ["X", "X2"]), op("CloneCommonWorld", ["comm"], ["c2"]),
                   op("DestroyCommonWorld", ["comm"], ["comm"])]
    else:
        make = op("MPICreateCommonWorld", [], ["comm"])
        tag = {"tag": v()} if rng.random() < 0.7 else {}
        choices = [op("MPIBroadcast", ["comm", "X"], ["X"], root=v()), op("MPIReduce", ["comm", "X"], ["Y"], root=v()),
                   op("MPIAllgather", ["comm", "X"], ["Y"]), op("MPIAllreduce", ["comm", "X"], ["X"]),
                   op("MPISendTensor", ["comm", "X"], [], dst=v(), raw_buffer=rng.choice([0, 1]), **tag),
                   op("MPIReceiveTensor", ["comm", "X"], ["Y", "src", "tag"], src=v(), raw_buffer=1, **tag),
                   op("MPISendTensor", ["comm", "X", "r", "t"], [], raw_buffer=1),
                   op("MPIReceiveTensor", ["comm", "X", "r", "t"], ["Y", "s", "g"], raw_buffer=1)]
    value = rng.choice([np.ones((2, 3), np.float32), np.array(2.0, np.float32), np.zeros((0, 2), np.float32),
                        np.array([True, False]), np.arange(4, dtype=np.int64)])
    fill_type = {"f": "GivenTensorFill", "b": "GivenTensorBoolFill", "i": "GivenTensorInt64Fill"}[value.dtype.kind]
    ops = [make] if rng.random() < 0.9 else []
    ops.append(op(fill_type, [], ["X"], shape=list(value.shape), values=value.reshape(-1).tolist()))
    ops += [op("ConstantFill", [], ["X2"], shape=[2, 3], value=1.0),
            op("GivenTensorIntFill", [], ["r"], shape=[1], values=[v() % 2**31]),
            op("GivenTensorIntFill", [], ["t"], shape=[1], values=[rng.choice([0, 5, -3, 2**31 - 1])])]
    ops += [rng.choice(choices) for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.3:   # the MPI send the receive below it takes back, on the lone rank
        ops.insert(-1, op("MPISendTensor", ["comm", "X"], [], dst=0, tag=rng.choice([0, 1, 2**31 - 1]), raw_buffer=1))
    return NetDef(name="collectives" if rng.random() < 0.95 else fuzzing.MARK, op=ops)


# ------------------------------------------------------------------------------------------- Int8, detection
HOSTILE_POOL = {
    "boxes": np.array([[0, 0, 10, 10], [5, 5, 2, 2]], np.float32), "boxes5": np.ones((2, 5), np.float32),
    "deltas": np.zeros((2, 8), np.float32), "iminfo": np.array([[20, 20, 1]], np.float32),
    "scores": np.array([[0.1, 0.9], [0.8, 0.2]], np.float32), "nanb": np.full((2, 4), np.nan, np.float32),
    "infb": np.array([[0, 0, np.inf, 1e38]], np.float32), "rois": np.array([[0, 0, 0, 3, 3]], np.float32),
    "badroi": np.array([[7, -5, -5, 1e30, 1e30]], np.float32), "feat": np.ones((1, 2, 4, 4), np.float32),
    "anchors": np.ones((2, 4), np.float32), "rpn_s": np.ones((1, 2, 2, 2), np.float32),
    "rpn_d": np.zeros((1, 8, 2, 2), np.float32), "empty4": np.zeros((0, 4), np.float32),
    "u8img": np.zeros((1, 3, 3, 2), np.uint8), "big": np.zeros((1, 1, 1, 70000), np.float32),
    "neg1": np.array([-1], np.int32), "w4": np.ones((2, 2, 1, 1), np.float32), "huge": np.array([1e30], np.float32),
}
INT8_DETECTION = [s for s in REGISTRY.schemas() if s.family.startswith("int8") or s.family in
                  ("detection", "roi_align", "roi_pool", "fpn")]


def hostile_op(rng: random.Random):
    """(OperatorDef, pool) of an Int8 or detection op on tensors of hostile shapes and values: NaN and inf
    boxes, empty and five-column boxes, RoIs outside the image, Int8 args (scale, zero point) out of range."""
    schema = rng.choice(INT8_DETECTION)
    pool = {**fuzzing.POOL, **HOSTILE_POOL}
    lo, hi = schema.inputs
    n_in = rng.randint(max(lo - 1, 0), int(min(hi, lo + 2)))
    olo, ohi = schema.outputs
    o = OperatorDef(type=schema.type, input=[rng.choice(list(pool)) for _ in range(n_in)],
                    output=[f"out{i}" for i in range(rng.randint(olo, int(min(ohi, olo + 1))))])
    int8_values = {"Y_scale": [0.0, -1.0, 1e-45, float("nan"), float("inf"), 0.5],
                   "Y_zero_point": [0, -1, 255, 256, 2**62], "spatial_scale": [0.0, -1.0, float("nan"), 1e30],
                   "pooled_h": [0, -1, 2**31], "pooled_w": [0, -1, 2], "sampling_ratio": [-1, 0, 2**40],
                   "nms": [0.0, 1.5, float("nan")], "post_nms_topN": [-1, 0, 2**62], "pre_nms_topN": [-1, 0, 2**62],
                   "detections_per_im": [-5, 0, 2**62], "kernel": [0, -1, 2**31], "stride": [0, -3],
                   "pad": [-1, 2**30], "min_size": [-1.0, float("nan")], "score_thresh": [float("nan"), -1.0]}
    for name in schema.args:
        if rng.random() < 0.5:
            values = int8_values.get(name)
            if values is not None:
                o.arg.append(make_argument(name, rng.choice(values)))
            else:
                fuzzing.random_value_arg(rng, o.arg.add(name=name))
    return o, pool


def _hostile(rng: random.Random, arr: np.ndarray) -> np.ndarray:
    """arr, or a variant: NaN/inf/huge/negative entries, no rows, an extra column."""
    kind = rng.randrange(6)
    arr = arr.copy()
    if kind == 0 and arr.size:
        arr.reshape(-1)[rng.randrange(arr.size)] = rng.choice([np.nan, np.inf, -np.inf, 1e30, -1e30, -5.0])
    elif kind == 1 and arr.ndim:
        arr = arr[:0]
    elif kind == 2 and arr.ndim == 2:
        arr = np.concatenate([arr, arr[:, :1]], axis=1)
    return arr


def _q(name: str, src: str, rng: random.Random) -> OperatorDef:
    return op("Int8Quantize", [src], [name], Y_scale=rng.choice([0.05, 1.0, 1e-30, 0.5]),
              Y_zero_point=rng.choice([0, 128, 255]))


def detection_net(rng: random.Random):
    """(NetDef, feeds) of one detection or Int8 op with well-formed inputs (so that the op itself runs) made
    hostile in one place: NaN/inf boxes, empty inputs, an extra column, out-of-range arguments."""
    f = lambda *shape: rng.choice([np.ones, lambda s: np.arange(np.prod(s), dtype=np.float32).reshape(s)])(shape)  # noqa: E731
    kind = rng.choice(["bbox", "nms", "proposals", "roialign", "roipool", "int8pool", "int8conv", "int8fc",
                       "int8add", "int8misc"])
    ops, feeds = [], {}
    if kind == "bbox":
        feeds = {"rois": np.array([[0, 0, 0, 4, 4], [0, 1, 1, 3, 5]], np.float32), "deltas": f(2, 8) * 0.1,
                 "im_info": np.array([[10, 10, 1]], np.float32)}
        ops.append(op("BBoxTransform", ["rois", "deltas", "im_info"], ["boxes", "splits"][:rng.randint(1, 2)]))
    elif kind == "nms":
        feeds = {"scores": np.array([[0.1, 0.9], [0.2, 0.8], [0.7, 0.3]], np.float32),
                 "boxes": np.array([[0, 0, 4, 4, 0, 0, 4, 4], [1, 1, 5, 5, 1, 1, 5, 5], [0, 0, 2, 2, 6, 6, 9, 9]],
                                   np.float32)}
        ops.append(op("BoxWithNMSLimit", ["scores", "boxes"], ["s", "b", "c"]))
    elif kind == "proposals":
        feeds = {"scores": f(1, 2, 3, 3), "deltas": np.zeros((1, 8, 3, 3), np.float32),
                 "im_info": np.array([[12, 12, 1]], np.float32), "anchors": np.array([[0, 0, 3, 3], [0, 0, 7, 7]],
                                                                                      np.float32)}
        ops.append(op("GenerateProposals", ["scores", "deltas", "im_info", "anchors"], ["rois", "probs"]))
    elif kind in ("roialign", "roipool"):
        feeds = {"X": f(1, 2, 6, 6), "R": np.array([[0, 0, 0, 3, 3], [0, 1, 2, 5, 4]], np.float32)}
        ops.append(op("RoIAlign" if kind == "roialign" else "RoIPool", ["X", "R"], ["Y"], pooled_h=2, pooled_w=2))
    else:
        feeds = {"X": f(1, 2, 4, 4) if kind != "int8fc" else f(2, 3), "W": f(2, 2, 1, 1) - 0.5, "b": np.zeros(2,
                                                                                                       np.float32)}
        ops.append(_q("Xq", "X", rng))
        if kind == "int8pool":
            ops.append(op(rng.choice(["Int8MaxPool", "Int8AveragePool", "Int8MaxPoolRelu"]), ["Xq"], ["Y"], kernel=2,
                          order="NHWC", Y_scale=1.0, Y_zero_point=0))
        elif kind == "int8conv":
            ops += [_q("Wq", "W", rng), op("Int8GivenIntTensorFill", [], ["bq"], shape=[2], values=[0, 0],
                                           Y_scale=1.0, Y_zero_point=0),
                    op("Int8Conv", ["Xq", "Wq", "bq"], ["Y"], kernel=1, order="NHWC", Y_scale=1.0, Y_zero_point=0)]
        elif kind == "int8fc":
            feeds["W"] = f(2, 3)
            ops += [_q("Wq", "W", rng), op("Int8GivenIntTensorFill", [], ["bq"], shape=[2], values=[0, 0],
                                           Y_scale=1.0, Y_zero_point=0),
                    op("Int8FC", ["Xq", "Wq", "bq"], ["Y"], Y_scale=1.0, Y_zero_point=0)]
        elif kind == "int8add":
            ops += [_q("X2", "X", rng), op(rng.choice(["Int8Add", "Int8AddRelu", "Int8Sum"]), ["Xq", "X2"], ["Y"],
                                           Y_scale=1.0, Y_zero_point=0)]
        else:
            ops.append(rng.choice([op("Int8Reshape", ["Xq"], ["Y", "old"], shape=[2, -1], Y_scale=1.0, Y_zero_point=0),
                                   op("Int8Transpose", ["Xq"], ["Y"], axes=[0, 3, 1, 2], Y_scale=1.0, Y_zero_point=0),
                                   op("Int8Softmax", ["Xq"], ["Y"], Y_scale=1 / 256, Y_zero_point=0),
                                   op("Int8ResizeNearest", ["Xq"], ["Y"], width_scale=2.0, height_scale=2.0,
                                      Y_scale=1.0, Y_zero_point=0),
                                   op("Int8Concat", ["Xq", "Xq"], ["Y", "split"], axis=3, Y_scale=1.0,
                                      Y_zero_point=0),
                                   op("Int8Dequantize", ["Xq"], ["Y"]), op("Int8Flatten", ["Xq"], ["Y"], axis=1,
                                                                           Y_scale=1.0, Y_zero_point=0)]))
    name = rng.choice(list(feeds))
    feeds = {k: np.asarray(v, np.float32) for k, v in feeds.items()}
    feeds[name] = _hostile(rng, feeds[name])
    target = ops[-1]
    schema = REGISTRY.get(target.type)
    if rng.random() < 0.6 and schema.args:   # one argument out of range
        arg = rng.choice(list(schema.args))
        values = {"Y_scale": [0.0, -1.0, float("nan"), float("inf")], "Y_zero_point": [-1, 256, 2**62],
                  "kernel": [0, -1, 2**31], "pooled_h": [0, -1, 2**31], "pooled_w": [0, -1], "axis": [9, -9, 2**62],
                  "spatial_scale": [0.0, -1.0, float("nan"), 1e30], "sampling_ratio": [-2, 2**40],
                  "nms": [float("nan"), 2.0], "detections_per_im": [-5, 0, 2**62], "pre_nms_topN": [-1, 2**62],
                  "post_nms_topN": [-1, 0], "min_size": [-1.0, float("nan")], "score_thresh": [float("nan")]}
        if arg in values:
            for a in [a for a in target.arg if a.name == arg]:
                target.arg.remove(a)
            target.arg.append(make_argument(arg, rng.choice(values[arg])))
        else:
            fuzzing.random_value_arg(rng, target.arg.add(name=arg))
    return NetDef(name=rng.choice(["detect", fuzzing.MARK]), op=ops), feeds


# ------------------------------------------------------------------------------------------- metrics CSVs
def hostile_csv(rng: random.Random) -> bytes:
    """A metrics CSV that lies: NaN/inf and huge values, non-numeric fields, NULs, invalid UTF-8, quoted newlines,
    fields longer than the csv module takes, many names, a wrong or missing header; half of them well-formed
    (hostile names properly quoted, values NaN, inf, huge, iterations huge or out of order)."""
    if rng.random() < 0.5:
        import csv
        import io
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["iteration", "name", "value"])
        names = rng.sample([h for h in HOSTILE_NAMES if h != fuzzing.MARK and len(h) < 100] + ["loss"] * 5,
                           rng.randint(1, 4))
        odd = rng.random() < 0.3   # iterations out of range, values spanning more than a float
        for _ in range(rng.randint(1, 30)):
            w.writerow([rng.choice([0, 1, 5, -3, 2**62, 10**30, 7] if odd else range(0, 100, 7)), rng.choice(names),
                        rng.choice(["0.5", "nan", "inf", "-inf", "5e-324", "0", "-0.0", "3", "1e300"]
                                   + (["1e308", "-1e308"] if odd else []))])
        return buf.getvalue().encode()
    header = rng.choice([b"iteration,name,value\n"] * 6 + [b"", b"iteration;name;value\n", b"\xff\xfe\n",
                                                            b"iteration,name\n", b"\x00iteration,name,value\n"])
    rows = []
    for _ in range(rng.randint(0, 12)):
        it = rng.choice([b"0", b"1", b"-5", b"1e3", b"x", b"", b"9" * rng.choice([3, 30, 5000]), b"1.5",
                         str(2**63).encode(), b" 3 "])
        name = rng.choice([b"loss", b"acc", b"", b'"a,b"', b'"multi\nline"', b"\xff\xfe", b"\x00", b"n" * 200000,
                           b"\x1b[31m", b"a\rb"])
        value = rng.choice([b"0.5", b"nan", b"inf", b"-inf", b"1e308", b"1e309", b"-0", b"x", b"", b"0x10",
                            b"1_000", b"\x00", b"9" * 400])
        sep = b"," if rng.random() < 0.95 else b";"
        row = sep.join([it, name, value] + ([b"extra"] if rng.random() < 0.05 else []))
        rows.append(row)
    if rng.random() < 0.1:   # many names, one point each (a legend that long must not hang)
        rows += [b"%d,n%d,%d" % (i, i, i) for i in range(rng.choice([100, 2000, 20000]))]
    if rng.random() < 0.05:  # many points of one name
        rows += [b"%d,loss,%r" % (i, 1.0 / (i + 1)) for i in range(200000)]
    data = header + b"\n".join(rows) + rng.choice([b"\n", b"", b"\r\n"])
    return fuzzing.mutate_bytes(rng, data) if rng.random() < 0.2 else data


# ------------------------------------------------------------------------------------------- command lines
def input_spec(rng: random.Random) -> str:
    """An export-onnx --input value: NAME=D1,D2,...[:dtype], a bare name, or junk."""
    name = rng.choice(["X", "data", "x", "", "missing", "=", "X=X", "fc1", "W1", "\u00e9"])
    if rng.random() < 0.15:
        return name
    dims = ",".join(str(rng.choice([1, 2, 0, -1, 3, 2**31, 2**62, 10**30])) for _ in range(rng.randint(0, 5)))
    dims = rng.choice([dims, dims, "", "a,b", "1,,2", "(1,2)", "1.5", " 1 , 2 "])
    dtype = rng.choice(["", "", "", ":float32", ":int64", ":uint8", ":float16", ":bool", ":object", ":flaot", ":"])
    return f"{name}={dims}{dtype}"
