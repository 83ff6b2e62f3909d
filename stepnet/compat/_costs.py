"""Caffe2's operator cost inference (workspace.GetOperatorCost): (flops, bytes moved) of one op from its
input shapes, by the formulas Caffe2's schemas register (caffe2/operators/conv_pool_op_base.h
CostInferenceForConv, fully_connected_op.cc CostInferenceForFC, elementwise_sum_op.cc, and the pointwise
formula of Add/Sub/Mul/Div). Ops Caffe2 has no cost function for are refused, as there."""
from __future__ import annotations

import math
import warnings

from ..core.errors import ArgumentError, ShapeError
from ..ops import REGISTRY
from ..ops.binding import parse_args
from ..ops.window import geometry, image_dims

FLOAT_BYTES = 4   # Caffe2 counts every element as a float (sizeof(float)), whatever the dtype


def _conv(op, shapes, args) -> tuple[int, int]:
    """2 x N x output positions x kernel x in channels x out channels (groups not counted, as in Caffe2)."""
    (x, w), order = shapes[:2], args.get("order", "NCHW").upper()
    if len(x) not in (4, 5) or len(w) != len(x):
        raise ShapeError(f"{op.type}: cost inference needs a 4-D (or 3-D NCHW: 5-D) input and filter of that "
                         f"rank, got {x} and {w}")
    if len(x) == 5 and order != "NCHW":
        raise ArgumentError(f"{op.type}: a 3-D convolution is NCHW only, got order {order}")
    n, _, spatial = image_dims(x, order)
    kernel = tuple(w[2:]) if order == "NCHW" else tuple(w[1:-1])
    in_channels = w[1] if order == "NCHW" else w[-1]
    window = {k: v for k, v in args.items() if k in _WINDOW_ARGS}
    out = geometry(window, spatial, kernel).out
    out_channels = w[0]
    flops = n * math.prod(out) * math.prod(kernel) * in_channels * out_channels * 2
    return flops, n * out_channels * math.prod(out) * FLOAT_BYTES


def _fc(transposed: bool):
    def cost(op, shapes, args) -> tuple[int, int]:
        x, w = shapes[:2]
        axis = args.get("axis", 1) % max(len(x), 1)
        axis_w = args.get("axis_w", 1) % max(len(w), 1)
        m, k = math.prod(x[:axis]), math.prod(x[axis:])
        n = math.prod(w[axis_w:]) if transposed else math.prod(w[:axis_w])
        return 2 * k * m * n + m * n, m * n * FLOAT_BYTES
    return cost


def _pointwise(op, shapes, args) -> tuple[int, int]:
    size = math.prod(shapes[0])
    return size, size * FLOAT_BYTES


def _sum(op, shapes, args) -> tuple[int, int]:
    flops, moved = _pointwise(op, shapes, args)
    return flops * (len(shapes) - 1), moved


_WINDOW_ARGS = {"kernel", "kernel_h", "kernel_w", "kernels", "stride", "stride_h", "stride_w", "strides", "pad",
                "pad_t", "pad_l", "pad_b", "pad_r", "pads", "dilation", "dilation_h", "dilation_w", "dilations",
                "legacy_pad"}

COSTS = {"Conv": _conv, "Conv1D": _conv, "Conv2D": _conv, "Conv3D": _conv, "FC": _fc(False),
         "FCTransposed": _fc(True), "Sum": _sum, "Add": _pointwise, "Sub": _pointwise, "Mul": _pointwise,
         "Div": _pointwise}


def operator_cost(op, shapes: list) -> tuple[int, int]:
    """(flops, bytes moved) of OperatorDef op given its input shapes (tuples of ints)."""
    label = f"GetOperatorCost({op.type})"
    if op.type not in COSTS:
        raise ArgumentError(f"Caffe2 defines no cost inference for {op.type}; it has one for "
                            f"{', '.join(sorted(COSTS))}", at=label)
    need = 2 if op.type.startswith(("Conv", "FC")) else 1
    if len(shapes) < need:
        raise ArgumentError(f"the cost of {op.type} needs the shapes of its first {need} inputs, got "
                            f"{len(shapes)}", at=label)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # an argument the op does not use changes no cost
        args = parse_args(REGISTRY.get(op.type), op, label, strict=False)
    try:
        flops, moved = COSTS[op.type](op, [tuple(int(d) for d in s) for s in shapes], args)
    except (ArgumentError, ShapeError) as e:
        raise e.located(label) from None
    return int(flops), int(moved)
