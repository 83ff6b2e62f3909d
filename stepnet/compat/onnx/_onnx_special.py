"""The ONNX nodes that convert to Caffe2 beyond renaming (Caffe2's special converters, and the forms of the
opsets after Caffe2's 6 that still map onto the same Caffe2 ops). Each takes (node, opset_version, consts) and
returns a Caffe2Ops; see _onnx_nodes for consts."""
from __future__ import annotations

import numpy as np

from .error import Unsupported
from ._onnx_nodes import (INT32_MAX, ONNX_TO_CAFFE2_TYPE, Caffe2Ops, OnnxNode, _const, _inputs_to_attrs, _text,
                          build, common, tensor_filling_op)
from .helper import dummy_name


def constant(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    if len(node.outputs) != 1:
        raise Unsupported("Constant should have 1 output")
    value = node.attrs.get("value")
    if value is None:
        from onnx import numpy_helper
        array = np.asarray(consts[node.outputs[0]])
        value = numpy_helper.from_array(array)
    return Caffe2Ops([tensor_filling_op(value, node.outputs[0])], [], [])


def conv_pool(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """Conv and the pools on Caffe2's ConvPoolOpBase: Global* as global_pooling, pads given once per spatial
    axis doubled (Caffe2 takes begins then ends)."""
    if node.op_type.startswith("Global"):
        node.attrs["global_pooling"] = 1
    _auto_pad(node)
    kernel, pads = node.attrs.get("kernel_shape"), node.attrs.get("pads")
    if kernel is not None and pads is not None and len(kernel) == len(pads):
        node.attrs["pads"] = list(pads) * 2
    if node.attrs.pop("ceil_mode", 0):
        raise Unsupported(f"{node.op_type} with ceil_mode=1: Caffe2's pools round output sizes down")
    if node.op_type == "MaxPool" and len(node.outputs) > 1:
        raise Unsupported("MaxPool's Indices output has no Caffe2 counterpart")
    node.attrs.pop("storage_order", None)
    return common(node, opset_version)


def _auto_pad(node: OnnxNode) -> None:
    mode = _text(node.attrs.pop("auto_pad", b"NOTSET"))
    if mode not in ("NOTSET", "VALID"):
        raise Unsupported(f"{node.op_type} with auto_pad={mode}: Caffe2 takes explicit pads")


def conv_transpose(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    _auto_pad(node)
    if "output_shape" in node.attrs:
        raise Unsupported("ConvTranspose with output_shape: Caffe2 takes pads and adjs")
    if node.attrs.get("group", 1) != 1:
        raise Unsupported("ConvTranspose with group > 1: Caffe2's ConvTranspose has no groups")
    if any(d != 1 for d in node.attrs.pop("dilations", [])):
        raise Unsupported("ConvTranspose with dilations: Caffe2's ConvTranspose has none")
    node.attrs.pop("group", None)
    return common(node, opset_version)


def reshape(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """Caffe2's Reshape also outputs the old shape; opset 5 on takes the shape as an input, as Caffe2's can."""
    node.attrs.pop("allowzero", None) if node.attrs.get("allowzero", 0) == 0 else _refuse(node, "allowzero=1")
    ops = common(node, opset_version)
    ops.ops[0].output.append(dummy_name())
    return ops


def _refuse(node: OnnxNode, what: str):
    raise Unsupported(f"{node.op_type} with {what} has no Caffe2 counterpart")


def reciprocal(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise Unsupported("Caffe2 Reciprocal should have 1 input and 1 output")
    return Caffe2Ops([build("Pow", node.inputs, node.outputs, exponent=-1.0)], [], [])


def gather(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    if len(node.inputs) < 2 or len(node.outputs) < 1:
        raise Unsupported("Caffe2 Gather should have 2 inputs and 1 output")
    axis = node.attrs.get("axis", 0)
    if axis not in (0, 1):
        raise Unsupported(f"Caffe2 only supports Gather with axis being 0 or 1, whereas axis is {axis}")
    op_type = "Gather" if axis == 0 else "BatchGather"
    return Caffe2Ops([build(op_type, node.inputs[:2], node.outputs[:1])], [], [])


def gemm(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """alpha and beta as Scale ops; FC when B is transposed and C broadcast, MatMul + Add otherwise."""
    if len(node.inputs) < 2 or len(node.outputs) < 1:
        raise Unsupported("Caffe2 Gemm should have 2 or 3 inputs and 1 output")
    a, b = node.inputs[:2]
    c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
    broadcast = node.attrs.get("broadcast", 0 if opset_version < 7 else 1)
    ops = []
    if abs(alpha - 1) >= 1e-15:
        ops.append(build("Scale", [a], [dummy_name()], scale=float(alpha)))
        a = ops[-1].output[0]
    if c is not None and abs(beta - 1) >= 1e-15:
        ops.append(build("Scale", [c], [dummy_name()], scale=float(beta)))
        c = ops[-1].output[0]
    if c is not None and not trans_a and trans_b and broadcast and _is_vector(c, node, consts):
        ops.append(build("FC", [a, b, c], node.outputs[:1]))
    elif c is None:
        ops.append(build("MatMul", [a, b], node.outputs[:1], trans_a=trans_a, trans_b=trans_b))
    else:
        ab = dummy_name()
        ops.append(build("MatMul", [a, b], [ab], trans_a=trans_a, trans_b=trans_b))
        ops.append(build("Add", [ab, c], node.outputs[:1], broadcast=broadcast))
    return Caffe2Ops(ops, [], [])


def _is_vector(name: str, node: OnnxNode, consts: dict) -> bool:
    """FC adds a bias of shape (N,): true where C is known to be one (opset 6's broadcast Gemm always was)."""
    return name not in consts or np.ndim(consts[name]) == 1


def pad(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """PadImage: 4-D NCHW input padded on H and W only; pads [t, l, b, r] from ONNX's begins and ends."""
    pads = node.attrs.pop("paddings" if opset_version < 2 else "pads", None)
    if opset_version >= 11:
        pads = _const(node, 1, consts, "pads")
        value = _const(node, 2, consts, "the pad value")
        if value is not None:
            node.attrs["value"] = float(value.ravel()[0])
        if len(node.inputs) > 3 and node.inputs[3]:
            raise Unsupported("Pad with axes: Caffe2's PadImage pads H and W only")
        del node.inputs[1:]
    pads = [int(p) for p in np.asarray(pads if pads is not None else [], dtype=np.int64).ravel()]
    if any(p < 0 for p in pads):
        raise Unsupported(f"ONNX does not support negative pads in Pad, but get {pads}")
    if not (len(pads) == 8 and pads[0] + pads[1] + pads[4] + pads[5] == 0):
        raise Unsupported(f"Caffe2 only supports padding 2D Tensor, whereas padding is {pads}")
    node.attrs["pads"] = [pads[2], pads[3], pads[6], pads[7]]
    if "mode" in node.attrs:
        node.attrs["mode"] = _text(node.attrs["mode"])
    return common(node, opset_version)


def concat(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """Caffe2's Concat also outputs the split sizes."""
    ops = common(node, opset_version)
    ops.ops[0].output.append(dummy_name())
    return ops


def log_softmax(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    if opset_version >= 13:
        _last_axis_only(node)
    softmax = dummy_name()
    axis = node.attrs.get("axis", 1)
    return Caffe2Ops([build("Softmax", node.inputs[:1], [softmax], axis=axis),
                      build("Log", [softmax], node.outputs[:1])], [], [])


def softmax(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """Before opset 13 ONNX's Softmax is Caffe2's (the input flattened to 2-D at axis); from 13 on over one axis,
    which is Caffe2's for the last axis only."""
    if opset_version >= 13:
        _last_axis_only(node)
    return common(node, opset_version)


def _last_axis_only(node: OnnxNode) -> None:
    axis = node.attrs.get("axis", -1)
    if axis != -1:
        raise Unsupported(f"{node.op_type} of opset 13 over axis {axis}: Caffe2's Softmax flattens from axis on, "
                          "the same for the last axis (-1) only")
    node.attrs["axis"] = -1


def arg_max_min(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """ONNX's default axis is 0, Caffe2's -1."""
    node.attrs.setdefault("axis", 0)
    return common(node, opset_version)


def gelu(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    approximate = _text(node.attrs.pop("approximate", b"none"))
    if approximate == "tanh":
        node.attrs["fast_gelu"] = 1
    elif approximate != "none":
        raise Unsupported(f"Gelu with approximate={approximate}")
    return common(node, opset_version)


def slice_(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """Caffe2's Slice takes starts and ends for every axis: they are made at run time from the input's Shape
    (0 and -1 everywhere, the sliced axes scattered in). Caffe2 counts negative indices from one past the end."""
    if opset_version >= 10:
        steps = _const(node, 4, consts, "steps")
        if steps is not None and np.any(steps != 1):
            raise Unsupported("Slice with steps other than 1: Caffe2's Slice has no steps")
        _inputs_to_attrs(node, consts, ["starts", "ends", "axes"])
    starts = [int(s) for s in node.attrs.get("starts", [])]
    ends = [int(e) for e in node.attrs.get("ends", [])]
    axes = [int(a) for a in node.attrs.get("axes", range(len(starts)))]
    if any(a < 0 for a in axes):
        raise Unsupported("Slice with negative axes: the input's rank is not known when converting")
    starts = [min(s - 1 if s < 0 else s, INT32_MAX) for s in starts]
    ends = [-1 if e >= INT32_MAX else e - 1 if e < 0 else e for e in ends]
    data = node.inputs[0]
    shape, axes_t, starts_v, starts_t, starts_i, ends_v, ends_t, ends_i = (dummy_name() for _ in range(8))
    ops = [build("Shape", [data], [shape]),
           build("GivenTensorIntFill", [], [axes_t], shape=[len(axes)], values=axes),
           build("GivenTensorInt64Fill", [], [starts_v], shape=[len(starts)], values=starts),
           build("ConstantFill", [shape], [starts_t], dtype=10, value=0),
           build("ScatterAssign", [starts_t, axes_t, starts_v], [starts_t]),
           build("Cast", [starts_t], [starts_i], to=2),
           build("GivenTensorInt64Fill", [], [ends_v], shape=[len(ends)], values=ends),
           build("ConstantFill", [shape], [ends_t], dtype=10, value=-1),
           build("ScatterAssign", [ends_t, axes_t, ends_v], [ends_t]),
           build("Cast", [ends_t], [ends_i], to=2),
           build("Slice", [data, starts_i, ends_i], node.outputs)]
    ops[-1].name = node.name
    return Caffe2Ops(ops, [], [])


def batch_norm(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """SpatialBN; consumed_inputs (before opset 6) dropped; an inference node (one output, as every node of
    opset 7 on that has no is_test) runs in Caffe2's test mode."""
    node.attrs.pop("consumed_inputs", None)
    node.attrs.pop("spatial", None)
    if node.attrs.pop("training_mode", 0):
        raise Unsupported("BatchNormalization in training mode")
    if len(node.outputs) == 1:
        node.attrs["is_test"] = 1
    return common(node, opset_version)


def matmul(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    if len(node.inputs) != 2:
        raise Unsupported("MatMul should have 2 inputs")
    ops = common(node, opset_version)
    ops.ops[0].arg.add(name="broadcast", i=1)
    return ops


def cast(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """`to`: a type name before opset 6, an ONNX type number after (Caffe2 numbers its types otherwise)."""
    to = node.attrs.get("to")
    if isinstance(to, bytes):
        node.attrs["to"] = to.decode().upper()
    elif to in ONNX_TO_CAFFE2_TYPE:
        node.attrs["to"] = ONNX_TO_CAFFE2_TYPE[to]
    else:
        raise Unsupported(f"Cast to ONNX type {to}: Caffe2 has no such type")
    node.attrs.pop("saturate", None)
    return common(node, opset_version)


def dropout(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """An inference Dropout (is_test, or any of opset 7 on, where ONNX runs it as the identity)."""
    if opset_version >= 12:
        training = _const(node, 2, consts, "training_mode")
        if training is not None and bool(training.ravel()[0]):
            raise Unsupported("Dropout in training mode")
        ratio = _const(node, 1, consts, "ratio")
        node.attrs["ratio"] = 0.5 if ratio is None else float(ratio.ravel()[0])
        del node.inputs[1:]
    if opset_version >= 7 or node.attrs.get("is_test", 0):
        node.attrs["is_test"] = 1
    return common(node, opset_version)


def upsample(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """ResizeNearest: NCHW, nearest mode, scales 1 on N and C (from the attribute, or opset 9's input)."""
    mode = _text(node.attrs.get("mode", b"nearest"))
    if mode != "nearest":
        raise Unsupported(f"Upsample in {mode} mode: Caffe2's ResizeNearest is nearest only")
    scales = node.attrs.pop("scales", None)
    if opset_version >= 9:
        scales = _const(node, 1, consts, "scales")
        del node.inputs[1:]
    if scales is not None:
        scales = [float(s) for s in np.asarray(scales).ravel()]
        if len(scales) != 4 or scales[0] != 1 or scales[1] != 1:
            raise Unsupported(f"Upsample with scales {scales}: Caffe2's ResizeNearest scales H and W of NCHW")
        node.attrs["height_scale"], node.attrs["width_scale"] = scales[2], scales[3]
    return common(node, opset_version)


def axes_input(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """Squeeze, Unsqueeze (opset 13 on) and the reductions (18 on) take their axes as an input."""
    if len(node.inputs) > 1:
        _inputs_to_attrs(node, consts, ["axes"])
    return common(node, opset_version)


def split(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    if len(node.inputs) > 1:
        _inputs_to_attrs(node, consts, ["split"])
    node.attrs.pop("num_outputs", None)
    return common(node, opset_version)


def tile(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """ONNX's repeats (one per axis, an input from opset 6) as one Caffe2 Tile per repeated axis."""
    if opset_version < 6:
        return common(node, opset_version)
    repeats = [int(r) for r in _const(node, 1, consts, "repeats").ravel()]
    axes = [(axis, r) for axis, r in enumerate(repeats) if r != 1]
    if not axes:
        return Caffe2Ops([build("Copy", node.inputs[:1], node.outputs)], [], [])
    ops, current = [], node.inputs[0]
    for k, (axis, r) in enumerate(axes):
        out = node.outputs[0] if k == len(axes) - 1 else dummy_name()
        ops.append(build("Tile", [current], [out], tiles=r, axis=axis))
        current = out
    return Caffe2Ops(ops, [], [])


def mod(node: OnnxNode, opset_version: int, consts: dict) -> Caffe2Ops:
    """Caffe2's Mod divides by a constant integer: B must be one (a scalar initializer or Constant)."""
    divisor = _const(node, 1, consts, "divisor")
    if divisor.size != 1 or divisor.dtype.kind not in "iu":
        raise Unsupported("Mod by a tensor or a float: Caffe2's Mod divides integers by one constant integer")
    fmod = node.attrs.get("fmod", 0)
    return Caffe2Ops([build("Mod", node.inputs[:1], node.outputs, divisor=int(divisor.ravel()[0]),
                            sign_follow_divisor=0 if fmod else 1)], [], [])


SPECIAL = {
    "Constant": constant, "Conv": conv_pool, "AveragePool": conv_pool, "GlobalAveragePool": conv_pool,
    "GlobalMaxPool": conv_pool, "MaxPool": conv_pool, "ConvTranspose": conv_transpose, "Reshape": reshape,
    "Gather": gather, "Gemm": gemm, "Pad": pad, "Concat": concat, "LogSoftmax": log_softmax, "Softmax": softmax,
    "Slice": slice_, "Reciprocal": reciprocal, "BatchNormalization": batch_norm, "MatMul": matmul, "Cast": cast,
    "Dropout": dropout, "Upsample": upsample, "Squeeze": axes_input, "Unsqueeze": axes_input, "Split": split,
    "ArgMax": arg_max_min, "ArgMin": arg_max_min, "Gelu": gelu, "Tile": tile, "Mod": mod,
    **{f"Reduce{kind}": axes_input for kind in ("Mean", "Sum", "Max", "Min", "Prod", "L1", "L2", "LogSum",
                                                "LogSumExp", "SumSquare")},
}
