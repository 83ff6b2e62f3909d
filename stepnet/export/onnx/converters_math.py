"""Converters of the math families: unary activations, binary elementwise ops (both of Caffe2's broadcasting
rules), sums and casts, FC / MatMul / BatchMatMul, Softmax and the reductions.

Caffe2 reads N-d tensors as matrices split at an `axis` (FC, Softmax, MatMul); ONNX Flatten is exactly that
view. Legacy broadcasting (`broadcast=1`, `axis`) becomes a Reshape of B to A's rank, after which ONNX's numpy
broadcasting is Caffe2's rule (the shape comes from stepnet's own elementwise.broadcast_b_shape).
"""
from __future__ import annotations

import math

import numpy as np

from ...ops.elementwise import broadcast_b_shape, sum_to_shape_axes
from ...ops.math import canonical_axis
from ...ops.reduce import front_back_shape
from ...ops.sums import cast_dtype
from .table import converts

# --------------------------------------------------------------------------------------------- unary
UNARY = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
         "Reciprocal": "Reciprocal", "Abs": "Abs", "Negative": "Neg", "Sign": "Sign", "Sin": "Sin", "Cos": "Cos",
         "Softsign": "Softsign", "Softplus": "Softplus", "Not": "Not"}


@converts(*UNARY)
def unary(c):
    c.emit(UNARY[c.op.type], [c.x(0)], out=0)


@converts("Elu", "LeakyRelu", "Selu", "HardSigmoid")
def activation_with_args(c):
    a = c.args
    attrs = {"Elu": {"alpha": a.get("alpha")}, "LeakyRelu": {"alpha": a.get("alpha")},
             "Selu": {"alpha": a.get("alpha"), "gamma": a.get("scale")},
             "HardSigmoid": {"alpha": a.get("alpha"), "beta": a.get("beta")}}[c.op.type]
    c.emit(c.op.type, [c.x(0)], out=0, **{k: float(v) for k, v in attrs.items()})


def _scalar(c, value, j=0) -> str:
    return c.e.scalar(value, c.dtype(j))


@converts("Rsqrt", "Cbrt", "Sqr", "Swish", "Logit")
def unary_composite(c):
    x, t = c.x(0), c.op.type
    if t == "Rsqrt":
        c.emit("Reciprocal", [c.e.node("Sqrt", [x])], out=0)
    elif t == "Sqr":
        c.emit("Mul", [x, x], out=0)
    elif t == "Swish":
        c.emit("Mul", [x, c.e.node("Sigmoid", [x])], out=0)
    elif t == "Cbrt":  # sign(x)·|x|^(1/3)
        root = c.e.node("Pow", [c.e.node("Abs", [x]), _scalar(c, 1.0 / 3.0)])
        c.emit("Mul", [c.e.node("Sign", [x]), root], out=0)
    else:              # log(p / (1 - p)), p = x clamped to [eps, 1 - eps]
        eps = c.args["eps"]
        p = c.e.node("Clip", [x, _scalar(c, eps), _scalar(c, 1.0 - eps)])
        c.emit("Log", [c.e.node("Div", [p, c.e.node("Sub", [_scalar(c, 1.0), p])])], out=0)


@converts("Clip")
def clip(c):
    lo, hi = c.args["min"], c.args["max"]
    ins = [c.x(0), "" if lo is None else _scalar(c, lo), "" if hi is None else _scalar(c, hi)]
    while ins[-1] == "":
        ins.pop()
    c.emit("Clip", ins, out=0)


@converts("PRelu")
def prelu(c):
    from ...ops.activation import prelu_view
    view = prelu_view(c.shape(0), None, c.shape(1), None, c.args["order"])
    slope = c.e.reshape(c.x(1), view or [1])
    c.emit("PRelu", [c.x(0), slope], out=0)


# --------------------------------------------------------------------------------------------- binary
BINARY = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div", "EQ": "Equal", "LT": "Less",
          "LE": "LessOrEqual", "GT": "Greater", "GE": "GreaterOrEqual", "And": "And", "Or": "Or", "Xor": "Xor",
          "Pow": "Pow", "NE": "Equal"}


def broadcast_b(c, j: int = 1) -> str:
    """Input j as the second operand of a binary op: reshaped to Caffe2's legacy view with broadcast=1."""
    a = c.args
    if not a.get("broadcast"):
        return c.x(j)
    view = broadcast_b_shape(c.shape(0), c.shape(j), True, a["axis"], a["axis_str"], a["order"])
    return c.x(j) if tuple(view) == c.shape(j) else c.e.reshape(c.x(j), view)


@converts(*BINARY)
def binary(c):
    t = c.op.type
    if t == "Pow" and len(c.inputs) == 1:
        c.emit("Pow", [c.x(0), _scalar(c, c.args["exponent"])], out=0)
        return
    b = broadcast_b(c)
    if t == "NE":
        c.emit("Not", [c.e.node("Equal", [c.x(0), b])], out=0)
    else:
        c.emit(BINARY[t], [c.x(0), b], out=0)


def add_all(c, terms: list[str], out: int = 0) -> None:
    """Output `out` = the sum of same-shaped terms (ONNX Sum for floats, a chain of Adds for integers)."""
    if len(terms) == 1:
        c.emit("Identity", terms, out=out)
    elif c.dtype(0).kind == "f":
        c.emit("Sum", terms, out=out)
    else:
        acc = terms[0]
        for k, t in enumerate(terms[1:], 2):
            acc = c.emit("Add", [acc, t], out=out) if k == len(terms) else c.e.node("Add", [acc, t])


@converts("SumReduceLike")
def sum_reduce_like(c):
    """A summed down to B's shape, B placed in A by the legacy broadcast rule."""
    a = c.args
    axes = sum_to_shape_axes(c.shape(0), c.shape(1), True, a["axis"], a["axis_str"], a["order"])
    y = c.e.reduce("ReduceSum", c.x(0), axes, True) if axes else c.x(0)
    c.e.reshape(y, c.shape(1), out=[c.out(0)])


@converts("ClipTensorByScaling")
def clip_tensor_by_scaling(c):
    """X · t/val where val > t (t = threshold, times the third input when given), else X."""
    dt = c.dtype(0)
    t = c.e.scalar(c.args["threshold"], dt)
    if len(c.inputs) > 2:
        t = c.e.node("Mul", [t, c.e.reshape(c.e.cast(c.x(2), dt), [])])
    v = c.e.reshape(c.e.cast(c.x(1), dt), [])
    ratio = c.e.node("Where", [c.e.node("Greater", [v, t]), c.e.node("Div", [t, v]), c.e.scalar(1, dt)])
    c.emit("Mul", [c.x(0), ratio], out=0)


@converts("Sum", "SumInt")
def sum_(c):
    add_all(c, list(c.inputs))


@converts("Max", "Min")
def max_min(c):
    c.emit(c.op.type, list(c.inputs), out=0) if len(c.inputs) > 1 else c.emit("Identity", [c.x(0)], out=0)


@converts("Scale")
def scale(c):
    c.emit("Mul", [c.x(0), _scalar(c, c.args["scale"])], out=0)


@converts("WeightedSum")
def weighted_sum(c):
    shape, dtype = c.shape(0), c.dtype(0)
    terms = []
    for k in range(0, len(c.inputs), 2):
        x = c.x(k) if c.shape(k) == shape else c.e.reshape(c.x(k), shape)
        w = c.e.reshape(c.x(k + 1) if c.dtype(k + 1) == dtype else c.e.cast(c.x(k + 1), dtype), [])
        terms.append(c.e.node("Mul", [x, w]))
    add_all(c, terms)


@converts("ElementwiseLinear")
def elementwise_linear(c):
    shape = c.shape(0)
    tail = shape[canonical_axis(c.args["axis"], len(shape)):]
    a, b = (c.e.reshape(c.x(j), tail) for j in (1, 2))
    c.emit("Add", [c.e.node("Mul", [c.x(0), a]), b], out=0)


@converts("Cast")
def cast(c):
    c.emit("Cast", [c.x(0)], out=0, to=_onnx_type(cast_dtype(c.args["to"])))


def _onnx_type(dtype) -> int:
    from .emit import onnx_type
    return onnx_type(dtype)


# --------------------------------------------------------------------------------------------- products
def flat2d(c, j: int, axis: int) -> str:
    """Input j as Caffe2's matrix view split at axis (ONNX Flatten is exactly that view)."""
    shape = c.shape(j)
    a = canonical_axis(axis, len(shape))
    return c.x(j) if len(shape) == 2 and a == 1 else c.e.node("Flatten", [c.x(j)], axis=a)


@converts("FC", "FCTransposed")
def fc(c):
    xs = c.shape(0)
    a = canonical_axis(c.args["axis"], len(xs))
    y_shape = tuple(xs[:a]) + (math.prod(c.shape(2)),)
    bias = c.x(2) if len(c.shape(2)) == 1 else c.e.reshape(c.x(2), [-1])
    ins = [flat2d(c, 0, a), flat2d(c, 1, c.args["axis_w"]), bias]
    trans_b = 0 if c.op.type == "FCTransposed" else 1
    if len(y_shape) == 2:
        c.emit("Gemm", ins, out=0, transB=trans_b)
    else:
        c.e.reshape(c.e.node("Gemm", ins, transB=trans_b), y_shape, out=[c.out(0)])


@converts("MatMul")
def matmul(c):
    a = c.args
    y = c.e.node("Gemm", [flat2d(c, 0, a["axis_a"]), flat2d(c, 1, a["axis_b"])],
                 transA=int(bool(a["trans_a"])), transB=int(bool(a["trans_b"])))
    if len(c.inputs) > 2:
        y = c.e.reshape(y, c.shape(2))
    c.set(0, y)


@converts("BatchMatMul")
def batch_matmul(c):
    ins = []
    for j, t in ((0, c.args["trans_a"]), (1, c.args["trans_b"])):
        rank = len(c.shape(j))
        if t and rank >= 2:
            ins.append(c.e.transpose(c.x(j), list(range(rank - 2)) + [rank - 1, rank - 2]))
        else:
            ins.append(c.x(j))
    if len(c.shape(0)) == 1 and len(c.shape(1)) == 1:
        c.e.reshape(c.e.node("MatMul", ins), [1], out=[c.out(0)])
    else:
        c.emit("MatMul", ins, out=0)


@converts("Softmax")
def softmax(c):
    shape = c.shape(0)
    a = canonical_axis(c.args["axis"], len(shape))
    if a == len(shape) - 1:
        c.emit("Softmax", [c.x(0)], out=0, axis=-1)
        return
    y = c.e.node("Softmax", [c.e.node("Flatten", [c.x(0)], axis=a)], axis=1)
    c.e.reshape(y, shape, out=[c.out(0)])


# --------------------------------------------------------------------------------------------- reductions
REDUCE = {"ReduceSum": "ReduceSum", "ReduceMean": "ReduceMean", "ReduceMax": "ReduceMax", "ReduceMin": "ReduceMin",
          "ReduceL1": "ReduceL1", "ReduceL2": "ReduceL2"}


@converts(*REDUCE)
def reduce(c):
    rank = len(c.shape(0))
    axes = sorted({canonical_axis(x, rank) for x in c.args["axes"]}) or list(range(rank))
    c.e.reduce(REDUCE[c.op.type], c.x(0), axes, c.args["keepdims"], out=[c.out(0)])


@converts("ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean", "ReduceFrontMax",
          "ReduceBackMax")
def reduce_front_back(c):
    t = c.op.type
    front, kind = "Front" in t, t[len("ReduceFront"):].lower() if "Front" in t else t[len("ReduceBack"):].lower()
    out_shape, rows, cols = front_back_shape(t, c.spec(0), None, c.args["num_reduce_dim"], front, kind)
    x2 = c.e.reshape(c.x(0), [rows, cols])
    axis = 0 if front else 1
    if len(c.inputs) == 1:
        y = c.e.reduce({"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax"}[kind], x2, [axis], False)
        c.e.reshape(y, out_shape, out=[c.out(0)])
        return
    if kind == "mean" and c.dtype(0).kind != "f":
        raise c.refuse("an integer mean over lengths has no exact ONNX form; Cast the data to float first")
    size = rows if front else cols
    steps = c.e.const(np.arange(size, dtype=np.int64).reshape((size, 1) if front else (1, size)))
    lengths = c.e.reshape(c.e.cast(c.x(1), np.int64), [1, cols] if front else [rows, 1])
    mask = c.e.node("Less", [steps, lengths])
    dt = c.dtype(0)
    fill = np.finfo(dt).min if kind == "max" and dt.kind == "f" else np.iinfo(dt).min if kind == "max" else 0
    masked = c.e.node("Where", [mask, x2, c.e.scalar(fill, dt)])
    y = c.e.reduce("ReduceMax" if kind == "max" else "ReduceSum", masked, [axis], False)
    if kind == "mean":
        count = c.e.cast(c.e.reshape(lengths, [-1]), dt)
        y = c.e.node("Div", [y, count])   # 0 / 0 is NaN, as stepnet gives for an empty length
    c.e.reshape(y, out_shape, out=[c.out(0)])


def _all_elements(c, op_type: str, average: bool) -> None:
    shape = c.shape(0)
    y = c.e.reduce(op_type, c.x(0), list(range(len(shape))), False)
    n = math.prod(shape)
    if average and n:
        dt = c.dtype(0).type
        y = c.e.node("Mul", [y, c.e.scalar(dt(1) / dt(n), c.dtype(0))])
    c.set(0, y)


@converts("SumElements", "SumElementsInt", "SumSqrElements")
def sum_elements(c):
    op_type = "ReduceSumSquare" if c.op.type == "SumSqrElements" else "ReduceSum"
    _all_elements(c, op_type, c.args.get("average", False))


@converts("RowwiseMax", "ColwiseMax")
def rowwise_colwise_max(c):
    c.e.reduce("ReduceMax", c.x(0), [2 if c.op.type == "RowwiseMax" else 1], False, out=[c.out(0)])


@converts("LpNorm")
def lp_norm(c):
    shape = c.shape(0)
    op_type = "ReduceL1" if c.args["p"] == 1 else "ReduceSumSquare"
    y = c.e.reduce(op_type, c.x(0), list(range(len(shape))), True)
    if c.args["average"]:
        y = c.e.node("Div", [y, c.e.scalar(math.prod(shape), c.dtype(0))])
    c.e.reshape(y, [1], out=[c.out(0)])
