"""Converters of the layout, shape, index, fill and device families: reshapes, transposes, concat/split/slice,
gathers and one-hots, ConstantFill from a shape, and the copies (Identity in ONNX, which has one device).

Shapes are static in an export (every input's dims are given), so new shapes, split sizes and the extra outputs
Caffe2 ops keep for their gradients (Reshape's old shape, Concat's split info) are constants computed from
the op records' own shape functions.
"""
from __future__ import annotations

import math

import numpy as np

from ...ops.fill import constant_dtype, typed_values
from ...ops.math import canonical_axis
from ...ops.shape import _axis_from
from ...io.proto import NUMPY_OF, DataType
from ...core.spec import TensorSpec
from .table import converts

IDENTITY = ("Copy", "Alias", "StopGradient", "EnsureDense", "CopyCPUToGPU", "CopyGPUToCPU", "CopyFromCPUInput",
            "EnsureCPUOutput", "CopyOnDeviceLike")


@converts(*IDENTITY)
def identity(c):
    c.set(0, c.x(0))   # the same value (an Identity only where the output is a graph output)


@converts("NanCheck")
def nan_check(c):
    c.conv.state.notes.append(f"{c.label}: NanCheck exported as its input (ONNX has no assertion)")
    c.set(0, c.x(0))


# --------------------------------------------------------------------------------------------- reshapes
@converts("Reshape")
def reshape(c):
    new = c.out_shape(0)
    if new is not None:
        c.e.reshape(c.x(0), new, out=[c.out(0)])
    else:   # the new shape comes from an input of unknown value: ONNX's 0 and -1 mean what Caffe2's do
        c.emit("Reshape", [c.x(0), c.e.cast(c.x(1), np.int64)], out=0)
    if c.wants(1):
        dtype = c.dtype(1) if len(c.inputs) > 1 else np.int64
        c.set(1, c.e.const(np.asarray(c.shape(0), dtype=dtype)))


@converts("Flatten")
def flatten(c):
    c.emit("Flatten", [c.x(0)], out=0, axis=c.args["axis"])


@converts("FlattenToVec")
def flatten_to_vec(c):
    c.e.reshape(c.x(0), [-1], out=[c.out(0)])


@converts("ResizeLike")
def resize_like(c):
    c.e.reshape(c.x(0), c.shape(1), out=[c.out(0)])


@converts("Transpose")
def transpose(c):
    rank = len(c.shape(0))
    perm = list(c.args["axes"]) if c.args["axes"] else list(range(rank))[::-1]
    c.e.transpose(c.x(0), perm, out=[c.out(0)])


@converts("NCHW2NHWC", "NHWC2NCHW")
def layout_switch(c):
    r = len(c.shape(0))
    perm = [0, *range(2, r), 1] if c.op.type == "NCHW2NHWC" else [0, r - 1, *range(1, r - 1)]
    c.e.transpose(c.x(0), perm, out=[c.out(0)])


@converts("Squeeze", "ExpandDims")
def squeeze_expand(c):
    dims = sorted(set(c.args["dims"]))
    op = c.e.squeeze if c.op.type == "Squeeze" else c.e.unsqueeze
    op(c.x(0), dims, out=[c.out(0)])


@converts("Shape")
def shape(c):
    s = c.e.node("Shape", [c.x(0)])
    if c.args["axes"]:
        c.emit("Gather", [s, c.e.ints(c.args["axes"])], out=0, axis=0)
    else:
        c.set(0, s)


@converts("Size")
def size(c):
    c.emit("Size", [c.x(0)], out=0)


# --------------------------------------------------------------------------------------------- concat / split
@converts("Concat")
def concat(c):
    a = c.args
    add = bool(a["add_axis"]) and a["axis"] is not None
    rank = len(c.shape(0)) + add
    axis = canonical_axis(_axis_from(a["axis"], a["order"]), rank)
    xs = [c.e.unsqueeze(x, [axis]) for x in c.inputs] if add else list(c.inputs)
    c.emit("Concat", xs, out=0, axis=axis)
    if c.wants(1):
        sizes = [1] * len(xs) if add else [c.shape(j)[axis] for j in range(len(xs))]
        c.set(1, c.e.const(np.asarray(sizes, np.int32)))


@converts("Split")
def split(c):
    a = c.args
    shape = c.shape(0)
    axis = canonical_axis(_axis_from(a["axis"], a["order"]), len(shape))
    n = len(c.op.output)
    if bool(a["add_axis"]) and a["axis"] is not None:
        parts = c.e.split(c.x(0), [1] * n, axis)
        for j, p in enumerate(parts):
            c.e.squeeze(p, [axis], out=[c.out(j)])
            c.given[j] = TensorSpec(shape[:axis] + shape[axis + 1:], c.dtype(0))
        return
    if len(c.inputs) > 1:
        v = c.value(1)
        if v is None:
            raise c.refuse("its split sizes come from an input whose value is not known when exporting")
        sizes = [int(s) for s in np.asarray(v).reshape(-1)]
    else:
        sizes = list(a["split"]) if a["split"] else [shape[axis] // n] * n
    c.e.split(c.x(0), sizes, axis, out=[c.out(j) for j in range(n)])
    for j, size in enumerate(sizes):
        c.given[j] = TensorSpec(shape[:axis] + (size,) + shape[axis + 1:], c.dtype(0))


@converts("Slice")
def slice_(c):
    shape = c.shape(0)
    if len(c.inputs) > 1:
        starts, ends = c.value(1), c.value(2)
        if starts is None or ends is None:
            return _dynamic_slice(c, shape)
        starts, ends = [int(v) for v in starts.reshape(-1)], [int(v) for v in ends.reshape(-1)]
    else:
        starts, ends = list(c.args["starts"]), list(c.args["ends"])
    lo, hi = [], []
    for d, (s, e) in enumerate(zip(starts, ends)):   # Caffe2: a negative bound b means size + 1 + b
        size = shape[d]
        lo.append(min(size + 1 + s if s < 0 else s, size))
        hi.append(min(size + 1 + e if e < 0 else e, size))
    c.e.slice(c.x(0), lo, hi, list(range(len(lo))), out=[c.out(0)])


def _dynamic_slice(c, shape):
    k = len(c.shape(1)) and c.shape(1)[0]
    sizes = c.e.ints(shape[:k])
    bounds = []
    for j in (1, 2):
        b = c.e.cast(c.x(j), np.int64)
        neg = c.e.node("Less", [b, c.e.scalar(0, np.int64)])
        wrapped = c.e.node("Add", [b, c.e.node("Add", [sizes, c.e.scalar(1, np.int64)])])
        bounds.append(c.e.node("Min", [c.e.node("Where", [neg, wrapped, b]), sizes]))
    c.emit("Slice", [c.x(0), *bounds, c.e.ints(range(k))], out=0)


@converts("Tile")
def tile(c):
    a = c.args
    tiles, axis = a["tiles"], a["axis"]
    for j, name in ((1, "tiles"), (2, "axis")):
        if len(c.inputs) > j:
            v = c.value(j)
            if v is None:
                raise c.refuse(f"its {name} input is not a constant when exporting")
            tiles, axis = (int(v.reshape(-1)[0]), axis) if j == 1 else (tiles, int(v.reshape(-1)[0]))
    rank = len(c.shape(0))
    reps = [1] * rank
    reps[canonical_axis(axis, rank)] = tiles
    c.emit("Tile", [c.x(0), c.e.ints(reps)], out=0)


# --------------------------------------------------------------------------------------------- index
@converts("Gather", "BatchGather")
def gather(c):
    if c.op.type == "Gather" and c.args["match_outer"]:
        raise c.refuse("match_outer has no ONNX form")
    axis = 1 if c.op.type == "BatchGather" else canonical_axis(c.args["axis"], len(c.shape(0)))
    c.emit("Gather", [c.x(0), c.x(1)], out=0, axis=axis)


@converts("OneHot")
def one_hot(c):
    values = c.e.const(np.asarray([0, 1], np.float32))
    c.emit("OneHot", [c.x(0), c.x(1), values], out=0, axis=-1)


@converts("BatchOneHot")
def batch_one_hot(c):
    lengths, values = c.value(1), c.value(2)
    if lengths is None or values is None:
        raise c.refuse("its lengths and values must be constants (the init net's) to export")
    shape = c.shape(0)
    d = int(np.prod(shape[1:]))
    column = np.repeat(np.arange(d), np.asarray(lengths).reshape(-1).astype(np.int64))
    table = c.e.node("Gather", [c.e.reshape(c.x(0), [shape[0], d]), c.e.const(column)], axis=1)
    hits = c.e.node("Equal", [table, c.e.reshape(c.x(2), [1, -1])])
    c.e.cast(hits, c.dtype(0), out=[c.out(0)])


@converts("ArgMax", "ArgMin")
def arg_max_min(c):
    axis = canonical_axis(c.args["axis"], len(c.shape(0)))
    c.emit(c.op.type, [c.x(0)], out=0, axis=axis, keepdims=int(bool(c.args["keepdims"])))


# --------------------------------------------------------------------------------------------- fills
@converts("ConstantFill")
def constant_fill(c):
    """With an input: a tensor of the input's shape (or of the shape it holds) filled with `value`."""
    a = c.args
    dt = constant_dtype(a["value"], a["dtype"])
    if dt == DataType.STRING:
        raise c.refuse("a string fill has no ONNX form")
    value = typed_values([0 if a["value"] is None else a["value"]], dt, "'value'")
    out = c.out_shape(0)
    if out is not None:
        dims = c.e.ints(out)
    elif a["input_as_shape"]:
        dims = c.e.cast(c.x(0), np.int64)
        if a["extra_shape"]:
            dims = c.e.concat([dims, c.e.ints(a["extra_shape"])], 0)
    else:
        raise c.refuse("its output shape is not known statically")
    from onnx import numpy_helper
    c.emit("ConstantOfShape", [dims], out=0, value=numpy_helper.from_array(value.astype(NUMPY_OF[dt])))


@converts("RangeFill")
def range_fill(c):
    """0, 1, 2, ... in float32 over the output's (static) shape."""
    shape = c.out_shape(0)
    if shape is None:
        raise c.refuse("its output shape is not known statically")
    c.set(0, c.e.const(np.arange(math.prod(shape), dtype=np.float32).reshape(shape)))
