"""Caffe2's caffe2.python.onnx.backend: ONNX models run as Caffe2 nets (the ONNX backend interface of
onnx.backend.base).

    import caffe2.python.onnx.backend as backend
    rep = backend.prepare(onnx_model, device="CPU")     # a Caffe2Rep
    outputs = rep.run([x])                              # or {"x": x}; outputs.Y, outputs["Y"], outputs[0]
    init_net, predict_net = backend.Caffe2Backend.onnx_graph_to_caffe2_net(onnx_model)

Each node becomes Caffe2 ops by the table of Caffe2's backend (its C++ converter, whose Python side this module
is): the same op where Caffe2 has one of the ONNX name, renamed ops and attributes (_onnx_nodes), special
converters (_onnx_special: Conv and pools, Gemm, Reshape, Pad, Concat, Slice, ...) and LSTM / GRU / RNN as
RecurrentNetwork ops (_onnx_rnn). A node of an opset after Caffe2's (6) converts where it still maps onto those
ops (inputs that replaced attributes must then be constants); what cannot convert raises RuntimeError('ONNX
conversion failed: ...') naming each node and why.

Where it differs from Caffe2's: there is no C++ part (every node converts here, `run_node` included); the model
is split into its init and predict parts here, as onnx.optimizer (gone from onnx) did; a model onnx.checker
refuses is converted anyway with a warning (Caffe2's tests build nodes of ONNX's first opsets, e.g. Scale or Cast
to "float", which today's checker refuses); ONNX's Cast type numbers are mapped to Caffe2's; RNN outputs have
ONNX's layout (Caffe2's had [T, N, num_directions * H]).
"""
from __future__ import annotations

import warnings
import zipfile

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import ModelProto
from onnx.backend.base import Backend, Device, DeviceType

from ... import caffe2_pb2
from ...core.limits import default_max_blob_bytes
from .. import core, workspace
from . import _onnx_split
from ._onnx_nodes import (  # noqa: F401 - OnnxAttributes, convertAttributeProto: Caffe2's backend has them
    Caffe2Ops, OnnxAttributes, OnnxNode, common, convertAttributeProto, tensor_filling_op)
from ._onnx_rnn import create_rnn
from ._onnx_special import SPECIAL
from .backend_rep import Caffe2Rep
from .helper import dummy_name, namedtupledict
from .workspace import Workspace


MAX_PROTO_BYTES = 2 << 30   # protobuf's largest message


def force_unicode(s):
    """bytes as text; anything else as given."""
    try:
        return s.decode("utf-8")
    except AttributeError:
        return s


def get_device_option(device: Device) -> caffe2_pb2.DeviceOption:
    types = {DeviceType.CPU: caffe2_pb2.CPU, DeviceType.CUDA: caffe2_pb2.CUDA}
    return core.DeviceOption(types[device.type], device.device_id)


def _check(check, what: str) -> None:
    """Run onnx's checker; what it refuses is converted anyway, with a warning."""
    try:
        check()
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        warnings.warn(f"onnx.checker refuses the {what} ({first}); converting it anyway", stacklevel=3)


class Caffe2Backend(Backend):
    """ONNX's Backend on Caffe2 ops: prepare, run_model, run_node, supports_device, onnx_graph_to_caffe2_net."""

    _known_opset_version = 6       # the newest ONNX opset Caffe2's converter was written for
    _broken_operators: dict = {}   # op type -> the first opset whose form of it does not convert
    _rnn_operators = frozenset({"LSTM", "GRU", "RNN"})

    @classmethod
    def run_node(cls, node, inputs, device="CPU", opset_version=_known_opset_version, outputs_info=None, **kwargs):
        """Run one ONNX node on inputs (a dict, or values for node.input in order): its outputs."""
        _check(lambda: super(Caffe2Backend, cls).run_node(node, inputs, device=device, outputs_info=outputs_info),
               f"{node.op_type} node")
        device_option = get_device_option(Device(device))
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if len(node.input) != len(inputs):
                raise AssertionError(f"{node.op_type}: expected {len(node.input)} but got {len(inputs)}")
            feeds = dict(zip(node.input, inputs))
        with Workspace(), core.DeviceScope(device_option):
            for name, value in feeds.items():
                workspace.FeedBlob(name, value)
            dummy_name(set(node.input) | set(node.output))
            consts = {k: np.asarray(v) for k, v in feeds.items()}
            shapes = {k: list(np.shape(v)) for k, v in feeds.items()}
            c2ops = cls._convert(OnnxNode(node), opset_version or cls._known_opset_version, consts, shapes)
            ops = list(c2ops.init_ops) + list(c2ops.ops)
            for op in ops:
                op.device_option.CopyFrom(device_option)
            workspace.RunOperatorsOnce(ops)
            names = list(node.output)
            return namedtupledict("Outputs", names)(*[workspace.FetchBlob(n) for n in names])

    @classmethod
    def _create_tensor_filling_op(cls, onnx_tensor, name=None):
        """The Caffe2 GivenTensor*Fill op making ONNX TensorProto onnx_tensor (as blob name, default its name)."""
        return tensor_filling_op(onnx_tensor, name)

    @classmethod
    def _substitute_raw_value(cls, tp, raw_values_dict) -> None:
        if tp.HasField("raw_data") and tp.raw_data == b"__EXTERNAL":
            if tp.name not in raw_values_dict:
                raise RuntimeError(f"TensorProto for value {tp.name} referenced raw data but it was not found!")
            tp.raw_data = raw_values_dict[tp.name]

    @classmethod
    def _visit_and_substitute_raw_values(cls, nodes, raw_values_dict) -> None:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    cls._substitute_raw_value(attr.t, raw_values_dict)
                for t in attr.tensors:
                    cls._substitute_raw_value(t, raw_values_dict)
                if attr.HasField("g"):
                    cls._visit_and_substitute_raw_values(attr.g.node, raw_values_dict)
                for g in attr.graphs:
                    cls._visit_and_substitute_raw_values(g.node, raw_values_dict)

    @classmethod
    def _external_value_resolution_pass(cls, model, raw_values_dict) -> None:
        """Fill the tensors whose raw_data is b'__EXTERNAL' from raw_values_dict (by tensor name)."""
        for init in model.graph.initializer:
            cls._substitute_raw_value(init, raw_values_dict)
        cls._visit_and_substitute_raw_values(model.graph.node, raw_values_dict)

    @classmethod
    def _direct_initialize_parameters(cls, initializer, ws, device_option) -> None:
        for tp in initializer:
            ws.FeedBlob(tp.name, onnx.numpy_helper.to_array(tp), device_option)

    @classmethod
    def _direct_initialize_inputs(cls, inputs, initialized, ws, device_option) -> None:
        for value_info in inputs:
            if value_info.name not in initialized:
                shape = [d.dim_value for d in value_info.type.tensor_type.shape.dim]
                ws.FeedBlob(value_info.name, np.ones(shape), device_option)

    @staticmethod
    def optimize_onnx(input, init=False, predict=False):
        """Serialized model `input` reduced to its init part (init=True) or predict part (predict=True), as
        onnx.optimizer's split passes did; serialized."""
        model = ModelProto()
        model.ParseFromString(input)
        if init or predict:
            model = _onnx_split.split_model(model, init=bool(init))
        return model.SerializeToString()

    @classmethod
    def prepare_zip_archive(cls, file, device="CPU", **kwargs):
        """prepare() of a zip archive holding the model as __MODEL_PROTO and each b'__EXTERNAL' tensor's raw
        data as a member named for the tensor."""
        with zipfile.ZipFile(file, mode="r") as z:   # (sizes checked before anything is inflated: a zip bomb)
            limit = default_max_blob_bytes()
            for info in z.infolist():
                most = MAX_PROTO_BYTES if info.filename == "__MODEL_PROTO" else limit
                if info.file_size > most:
                    raise RuntimeError(f"zip archive member {info.filename!r} inflates to {info.file_size} bytes, "
                                       f"over the {most} a {'model' if most == MAX_PROTO_BYTES else 'tensor'} "
                                       "may take")
            with z.open("__MODEL_PROTO", "r") as f:
                model = onnx.load(f)
            raw_values = {name: z.read(name) for name in z.namelist() if name != "__MODEL_PROTO"}
        cls._external_value_resolution_pass(model, raw_values)
        return cls.prepare(model, device, **kwargs)

    @classmethod
    def _opset_version(cls, model) -> int:
        opset_version = None
        for imp in model.opset_import:
            if not imp.HasField("domain") or imp.domain == "":
                opset_version = imp.version
                if imp.version > cls._known_opset_version:
                    warnings.warn(f"This version of onnx-caffe2 targets ONNX operator set version "
                                  f"{cls._known_opset_version}, but the model we are trying to import uses version "
                                  f"{imp.version}.  We will try to import it anyway, but if the model uses operators "
                                  "which had BC-breaking changes in the intervening versions, import will fail.",
                                  stacklevel=3)
            else:
                warnings.warn(f"Unrecognized operator set {imp.domain}", stacklevel=3)
        if opset_version is None:
            if model.ir_version >= 3:
                raise RuntimeError("Model with IR version >= 3 did not specify ONNX operator set version "
                                   "(onnx-caffe2 requires it)")
            opset_version = 1
        return opset_version

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        """A Caffe2Rep running model: initializers fed into a workspace of its own, the other graph inputs fed
        with ones until run() feeds them; the init net runs on the first run. The graph's inputs must not be made
        by its initializers."""
        _check(lambda: super(Caffe2Backend, cls).prepare(model, device, **kwargs), "model")
        opset_version = cls._opset_version(model)
        ws = Workspace()
        device_option = get_device_option(Device(device))
        cls._direct_initialize_parameters(model.graph.initializer, ws, device_option)
        initialized = {init.name for init in model.graph.initializer}
        cls._direct_initialize_inputs(model.graph.input, initialized, ws, device_option)
        uninitialized = [v.name for v in model.graph.input if v.name not in initialized]
        init_net, predict_net = cls._onnx_model_to_caffe2_net(model, device, opset_version, False)
        return Caffe2Rep(init_net, predict_net, ws, uninitialized)

    @classmethod
    def _convert(cls, node: OnnxNode, opset_version: int, consts: dict, shapes: dict) -> Caffe2Ops:
        if node.domain not in ("", "ai.onnx"):
            raise ValueError(f"Don't know how to translate op {node.op_type} of domain {node.domain}")
        broken = cls._broken_operators.get(node.op_type, float("inf"))
        if broken <= opset_version:
            raise ValueError(f"Don't know how to translate op {node.op_type} in ONNX operator set "
                             f"v{opset_version} (I only support prior to v{broken})")
        if node.op_type in cls._rnn_operators:
            return create_rnn(node, opset_version, consts, shapes)
        translator = SPECIAL.get(node.op_type)
        if translator is None:
            return common(node, opset_version)
        return translator(node, opset_version, consts)

    @classmethod
    def _onnx_node_to_caffe2_op(cls, init_model, pred_model, node_def, opset_version) -> Caffe2Ops:
        """The Caffe2Ops of one NodeProto (the models, where given, supply constants and shapes)."""
        consts, shapes = {}, {}
        for model in (init_model, pred_model):
            if model is not None:
                consts.update(_onnx_split.constants(model))
                shapes.update(_onnx_split.shapes(model))
        return cls._convert(OnnxNode(node_def), opset_version, consts, shapes)

    @classmethod
    def _common_onnx_node_to_caffe2_op(cls, init_model, pred_model, onnx_node, opset_version):
        """The plain translation of an OnnxNode: one op, renamed as the tables say."""
        return common(onnx_node, opset_version).ops[0]

    @staticmethod
    def _all_names_in_graph(graph) -> set:
        if graph is None:
            return set()
        names = {v.name for v in graph.input} | {v.name for v in graph.output}
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
        return names

    @classmethod
    def _onnx_model_to_caffe2_net(cls, onnx_model, device, opset_version, include_initializers):
        """(init_net, predict_net) of onnx_model; with include_initializers the init net also fills the
        initializers (and takes the ops converters put before a node's own, such as an RNN's weight slices)."""
        device_option = get_device_option(Device(device))
        init_net = caffe2_pb2.NetDef(name=onnx_model.graph.name + "_init")
        pred_net = caffe2_pb2.NetDef(name=onnx_model.graph.name + "_predict")
        if include_initializers:
            init_net.op.extend(tensor_filling_op(tp) for tp in onnx_model.graph.initializer)
        init_nodes, pred_nodes = _onnx_split.split_nodes(onnx_model.graph)
        init_inputs = {i for n in init_nodes for i in n.input}
        made_by_init = [o for n in init_nodes for o in n.output]
        read_by_pred = {i for n in pred_nodes for i in n.input} | {v.name for v in onnx_model.graph.output}
        dummy_name(cls._all_names_in_graph(onnx_model.graph) | {t.name for t in onnx_model.graph.initializer})
        consts = _onnx_split.constants(onnx_model)
        shapes = _onnx_split.shapes(onnx_model)
        errors = []
        for net, nodes in ((init_net, init_nodes), (pred_net, pred_nodes)):
            net.device_option.CopyFrom(device_option)
            for node in nodes:
                try:
                    c2ops = cls._convert(OnnxNode(node), opset_version, consts, shapes)
                except Exception as e:   # every node is tried, so that one error lists all that fail
                    errors.append(f"{node.op_type} ({node.name or ', '.join(node.output)}): {e}")
                    continue
                (init_net if include_initializers else net).op.extend(c2ops.init_ops)
                net.op.extend(c2ops.ops)
                net.external_input.extend(c2ops.interface_blobs)
        pred_net.external_output.extend(v.name for v in onnx_model.graph.output)
        pred_net.external_input.extend(v.name for v in onnx_model.graph.input)
        pred_net.external_input.extend(sorted(set(made_by_init) & read_by_pred))
        init_net.external_input.extend(v.name for v in onnx_model.graph.input if v.name in init_inputs)
        for net in (init_net, pred_net):   # initializers need not be graph inputs (ONNX IR 4 on)
            listed = set(net.external_input)
            read = {i for op in net.op for i in op.input}
            net.external_input.extend(t.name for t in onnx_model.graph.initializer
                                      if t.name in read and t.name not in listed)
        init_net.external_output.extend(o for o in dict.fromkeys(made_by_init) if o in read_by_pred)
        if errors:
            more = f"; and {len(errors) - 10} more nodes" if len(errors) > 10 else ""
            raise RuntimeError("ONNX conversion failed: " + "; ".join(errors[:10]) + more)
        return init_net, pred_net

    @classmethod
    def onnx_graph_to_caffe2_net(cls, model, device="CPU", opset_version=_known_opset_version):
        """(init_net, predict_net) of an ONNX model, the init net filling its initializers."""
        return cls._onnx_model_to_caffe2_net(model, device=device, opset_version=opset_version,
                                             include_initializers=True)

    @classmethod
    def supports_device(cls, device_str) -> bool:
        device = Device(device_str)
        if device.type == DeviceType.CPU:
            return True
        if device.type == DeviceType.CUDA:
            return bool(getattr(workspace, "has_gpu_support", False))
        return False


prepare = Caffe2Backend.prepare
prepare_zip_archive = Caffe2Backend.prepare_zip_archive
run_node = Caffe2Backend.run_node
run_model = Caffe2Backend.run_model
supports_device = Caffe2Backend.supports_device
