"""ONNX nodes as Caffe2 operators: the translation table of Caffe2's ONNX backend (its C++ converter of 2018:
renamed operators and attributes, and the special converters) and the node and tensor forms it works on.

A node converts to a Caffe2Ops (ops, init_ops, interface_blobs). `consts` maps the names whose values are known
when converting (initializers, Constant outputs, run_node's inputs) to arrays: the ONNX opsets after Caffe2's (6)
moved some attributes into inputs (Reshape's shape, Slice's starts and ends, Pad's pads, Squeeze's axes, ...),
and those convert when the input is such a constant.
"""
from __future__ import annotations

import collections

import numpy as np

from ... import caffe2_pb2
from .. import core
from ..utils import MakeArgument
from .error import Unsupported

Caffe2Ops = collections.namedtuple("Caffe2Ops", ["ops", "init_ops", "interface_blobs"])

INT32_MAX = 2 ** 31 - 1
# ONNX TensorProto.DataType -> Caffe2 TensorProto.DataType (the two enums number the types differently)
ONNX_TO_CAFFE2_TYPE = {1: caffe2_pb2.TensorProto.FLOAT, 2: caffe2_pb2.TensorProto.UINT8,
                       3: caffe2_pb2.TensorProto.INT8, 4: caffe2_pb2.TensorProto.UINT16,
                       5: caffe2_pb2.TensorProto.INT16, 6: caffe2_pb2.TensorProto.INT32,
                       7: caffe2_pb2.TensorProto.INT64, 8: caffe2_pb2.TensorProto.STRING,
                       9: caffe2_pb2.TensorProto.BOOL, 10: caffe2_pb2.TensorProto.FLOAT16,
                       11: caffe2_pb2.TensorProto.DOUBLE}

RENAMED_OPERATORS = {
    "Caffe2ConvTranspose": "ConvTranspose", "GlobalMaxPool": "MaxPool", "GlobalAveragePool": "AveragePool",
    "Pad": "PadImage", "Neg": "Negative", "BatchNormalization": "SpatialBN",
    "InstanceNormalization": "InstanceNorm", "MatMul": "BatchMatMul", "Upsample": "ResizeNearest",
    "Identity": "Copy", "Equal": "EQ", "Less": "LT", "Greater": "GT", "Unsqueeze": "ExpandDims",
}
RENAMED_ATTRS = {"kernel_shape": "kernels"}
PER_OP_RENAMED_ATTRS = {
    "Squeeze": {"axes": "dims"}, "Unsqueeze": {"axes": "dims"}, "Transpose": {"perm": "axes"},
    "Upsample": {"mode": ""}, "ConvTranspose": {"output_padding": "adjs"}, "Selu": {"gamma": "scale"},
}
# the (name, value) of tensor-filling ops by ONNX element type: GivenTensor*Fill and its values field
FILLS = {1: ("GivenTensorFill", "floats"), 11: ("GivenTensorDoubleFill", "floats"),
         7: ("GivenTensorInt64Fill", "ints"), 12: ("GivenTensorInt64Fill", "ints"),
         2: ("GivenTensorIntFill", "ints"), 3: ("GivenTensorIntFill", "ints"), 4: ("GivenTensorIntFill", "ints"),
         5: ("GivenTensorIntFill", "ints"), 6: ("GivenTensorIntFill", "ints"), 9: ("GivenTensorBoolFill", "ints"),
         8: ("GivenTensorStringFill", "strings")}


class OnnxAttributes(dict):
    """A node's attributes as {name: Python value} (convertAttributeProto's), with their Caffe2 form."""

    @staticmethod
    def from_onnx(args) -> "OnnxAttributes":
        """The attributes of a sequence of AttributeProtos (a NodeProto's `attribute`)."""
        return OnnxAttributes((arg.name, convertAttributeProto(arg)) for arg in args)

    def caffe2(self, kmap=lambda k: k):
        """Caffe2 Arguments (utils.MakeArgument) of the attributes, each named kmap(name); one kmap names ''
        is left out."""
        for k, v in self.items():
            if kmap(k) != "":
                yield MakeArgument(kmap(k), v)


class OnnxNode:
    """An ONNX NodeProto in a form easier to edit: name, op_type, attrs ({name: Python value}; a tensor stays a
    TensorProto), inputs, outputs."""

    def __init__(self, node):
        self.name = str(node.name)
        self.op_type = str(node.op_type)
        self.domain = str(node.domain)
        self.attrs = OnnxAttributes((a.name, attribute_value(a)) for a in node.attribute)
        self.inputs = list(node.input)
        self.outputs = list(node.output)


def attribute_value(attr):
    """The Python value of an ONNX AttributeProto, as Caffe2 read it (the first field set)."""
    if attr.HasField("f"):
        return attr.f
    if attr.HasField("i"):
        return attr.i
    if attr.HasField("s"):
        return attr.s
    if attr.HasField("t"):
        return attr.t
    for field in ("floats", "ints", "strings"):
        if len(getattr(attr, field)):
            return list(getattr(attr, field))
    if attr.HasField("g") or len(attr.graphs):
        raise Unsupported(f"Unsupported ONNX attribute {attr.name}: Caffe2 ops take no ONNX subgraphs")
    raise ValueError(f"Unsupported ONNX attribute: {attr}")


def convertAttributeProto(onnx_arg):  # noqa: N802 - Caffe2's name
    """The Python value of an ONNX AttributeProto: its f, i, s (bytes) or t (the TensorProto itself), else the
    list of its floats, ints or strings (the first field set, in that order); ValueError for any other."""
    try:
        return attribute_value(onnx_arg)
    except Unsupported:   # a graph attribute: Caffe2 read no graphs
        raise ValueError(f"Unsupported ONNX attribute: {onnx_arg}") from None


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def tensor_filling_op(tensor, name: str | None = None):
    """The GivenTensor*Fill OperatorDef making ONNX TensorProto `tensor` as blob `name` (default: its name)."""
    from onnx import numpy_helper
    name = name or tensor.name
    if not name:
        raise ValueError("A tensor filling op needs a name: the tensor has none and none was given")
    if tensor.data_type not in FILLS:
        raise RuntimeError(f"unrecognized tensor type {tensor.data_type}")
    op_type, field = FILLS[tensor.data_type]
    op = caffe2_pb2.OperatorDef(type=op_type, output=[name])
    values = op.arg.add(name="values")
    if field == "strings":
        values.strings.extend(tensor.string_data)
    else:
        flat = numpy_helper.to_array(tensor).ravel()
        getattr(values, field).extend(flat.astype(np.float64 if field == "floats" else np.int64).tolist())
    op.arg.add(name="shape", ints=list(tensor.dims))
    return op


def build(op_type: str, inputs, outputs, **args):
    """An OperatorDef with no name."""
    op = caffe2_pb2.OperatorDef(type=op_type, input=list(inputs), output=list(outputs))
    op.arg.extend(MakeArgument(k, v) for k, v in args.items())
    return op


def _argument(key: str, value):
    if hasattr(value, "SerializeToString"):       # a tensor attribute: Caffe2 kept it serialized
        return MakeArgument(key, value.SerializeToString())
    return MakeArgument(key, value)


RETIRED_ONNX_OPERATORS = frozenset({"Scale", "ImageScaler", "Caffe2ConvTranspose"})   # ONNX's experimental ops
# of Caffe2's time, gone from onnx.defs, which Caffe2's backend (and its tests) translated


def is_onnx_operator(op_type: str) -> bool:
    """Whether op_type is an operator of ONNX's default domain (any opset, or one of its retired experimental
    ops): the only names a model file may ask the plain translation for."""
    import onnx.defs
    return op_type in RETIRED_ONNX_OPERATORS or onnx.defs.has(op_type)


def common(node: OnnxNode, opset_version: int) -> Caffe2Ops:
    """The plain translation: the Caffe2 op of the same (or renamed) type, attributes renamed, inputs kept.
    An attribute the Caffe2 op does not take is dropped where it has ONNX's default value (the op then does what
    ONNX means), and refused otherwise (Caffe2 ignored it, computing something else)."""
    from ...ops import REGISTRY
    from ...ops.registry import KNOWN_HINTS
    c2_type = RENAMED_OPERATORS.get(node.op_type, node.op_type)
    if not core.IsOperator(c2_type):
        raise Unsupported(f"Don't know how to translate op {node.op_type}")
    if not is_onnx_operator(node.op_type):
        raise Unsupported(f"{node.op_type} is not an ONNX operator: a model file names ONNX operators only (Caffe2's "
                          f"own ops, such as Save, Load or Python, which touch files or run code, are refused)")
    declared = REGISTRY.get(c2_type).args
    renames = PER_OP_RENAMED_ATTRS.get(node.op_type, {})
    op = caffe2_pb2.OperatorDef(type=c2_type, name=node.name, input=node.inputs, output=node.outputs)
    for onnx_key, value in node.attrs.items():
        key = renames.get(onnx_key, RENAMED_ATTRS.get(onnx_key, onnx_key))
        if not key:
            continue
        if key not in declared and key not in KNOWN_HINTS:
            if _is_onnx_default(node.op_type, onnx_key, value):
                continue
            raise Unsupported(f"{node.op_type} with {onnx_key}={_text(value) if isinstance(value, bytes) else value}"
                              f": Caffe2's {c2_type} has no such argument")
        op.arg.append(_argument(key, value))
    return Caffe2Ops([op], [], [])


# ONNX attributes whose default value asks for what Caffe2's ops do anyway
ONNX_DEFAULTS = {"select_last_index": 0, "largest": 1, "sorted": 1, "noop_with_empty_axes": 0, "start": 0,
                 "approximate": "none", "allowzero": 0, "saturate": 1, "training_mode": 0, "spatial": 1,
                 "ceil_mode": 0, "auto_pad": "NOTSET", "storage_order": 0, "count_include_pad": 0, "layout": 0,
                 "fmod": 0, "exclusive": 0, "reverse": 0, "is_test": 1, "consumed_inputs": None}


PER_OP_DEFAULTS = {"Swish": {"alpha": 1.0}, "Dropout": {"seed": None}}


def _is_onnx_default(op_type: str, key: str, value) -> bool:
    defaults = {**ONNX_DEFAULTS, **PER_OP_DEFAULTS.get(op_type, {})}
    if key not in defaults:
        return False
    default = defaults[key]
    return default is None or (_text(value) if isinstance(value, bytes) else value) == default


def _const(node: OnnxNode, index: int, consts: dict, what: str):
    """The known value of node.inputs[index], or Unsupported."""
    name = node.inputs[index] if index < len(node.inputs) else ""
    if not name:
        return None
    if name not in consts:
        raise Unsupported(f"{node.op_type}: Caffe2 takes {what} as an argument; input {name!r} must be an "
                          "initializer or a Constant")
    return np.asarray(consts[name])


def _inputs_to_attrs(node: OnnxNode, consts: dict, names: list[str]) -> None:
    """Opsets after Caffe2's moved attributes into inputs: give them back as attributes (constants only)."""
    for index, attr in enumerate(names, start=1):
        value = _const(node, index, consts, attr)
        if value is not None:
            node.attrs[attr] = value.ravel().tolist()
    del node.inputs[1:]
