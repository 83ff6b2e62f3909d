"""Caffe2's caffe2.python.onnx.frontend: Caffe2 nets to ONNX models, made by stepnet's exporter
(stepnet.export.onnx, the one `stepnet export-onnx` uses).

    model = Caffe2Frontend.caffe2_net_to_onnx_model(predict_net, init_net, value_info)

value_info is Caffe2's {blob: (ONNX element type, shape)} of the predict net's inputs. As in Caffe2: an init-net
GivenTensor*Fill or ConstantFill of a blob value_info names is a placeholder (the blob is a graph input), the
other values the init net makes are initializers, and a predict-net input with neither raises
RuntimeError("Could not find value info of inputs: ..."). Where stepnet's frontend differs from Caffe2's:

- every op with a converter in stepnet's table exports (SparseLengthsSum, BatchGather, ...), and no run of the
  net on random inputs is needed to learn shapes;
- a net with a training part exports its forward part (the ops before the first gradient, optimizer or
  iteration op, or gradient seed), whose graph inputs are the blobs that part reads; what was left out is
  logged as a warning;
- a net that declares no external outputs (Caffe2's frontend makes a graph without outputs) exports the blobs
  its forward part writes and does not read again;
- blob names are kept (no `_<version>` suffixes), the nets and value_info given are left unchanged, and the
  opset is stepnet's (`target_opset_version` None: the newest both onnx and onnxruntime implement; 13 or more).
As Caffe2's frontend made them (ONNX IR 3), the init net's values are graph inputs too (with their types and
shapes; a runtime may be given other values for them), the inputs in the order of the predict net's external
inputs.

onnx is imported only when a conversion runs, so this module imports without it.
"""
from __future__ import annotations

import logging
import re

import numpy as np

from ...core.spec import TensorSpec
from ...graph.view import Graph, with_ops
from .._ssa import get_ssa
from ..errors import caffe2_errors

logger = logging.getLogger(__name__)
PLACEHOLDER_FILLS = re.compile(r"GivenTensor.*Fill|ConstantFill")   # Caffe2's "fake init" ops
SEED_SUFFIX = "_autogen_grad"                                     # gradient seeds' outputs


class Caffe2Frontend:
    """Caffe2's frontend: classmethods turning a predict net (NetDef or core.Net) and its init net into ONNX."""

    target_opset_version: int | None = None   # None: stepnet's default opset

    # caffe2_arg_to_onnx_attr's tables (Caffe2's): arguments ONNX has under another name, and arguments ONNX
    # drops (each with the values it may have: any other is an AssertionError)
    _global_renamed_args = {"kernels": "kernel_shape"}
    _per_op_renamed_args = {"Squeeze": {"dims": "axes"}, "Transpose": {"axes": "perm"}}
    _blacklist_caffe2_args = {"order": {b"NCHW"}, "cudnn_exhaustive_search": {0, 1}, "use_cudnn": {0, 1}}

    @classmethod
    def caffe2_arg_to_onnx_attr(cls, op_def, arg):
        """The ONNX AttributeProto of Caffe2 Argument `arg` of op_def: renamed by the tables above (an op with
        renames of its own takes only those), its value the first field set (f, i, s, floats, ints, strings);
        None for an argument ONNX drops (order NCHW, use_cudnn, cudnn_exhaustive_search)."""
        from onnx import helper
        renames = cls._per_op_renamed_args.get(op_def.type)
        name = renames.get(arg.name, arg.name) if renames is not None else cls._global_renamed_args.get(arg.name,
                                                                                                         arg.name)
        for field in ("f", "i", "s"):
            if arg.HasField(field):
                value = getattr(arg, field)
                break
        else:
            value = next((list(getattr(arg, f)) for f in ("floats", "ints", "strings") if len(getattr(arg, f))),
                         None)
            if value is None:
                raise ValueError(f"Could not find data field in arg: {arg}")
        if name in cls._blacklist_caffe2_args:
            if value not in cls._blacklist_caffe2_args[arg.name]:
                raise AssertionError(f"{op_def.type}: {arg.name}={value!r} has no ONNX form")
            return None
        return helper.make_attribute(name, value)

    @classmethod
    @caffe2_errors
    def caffe2_op_to_onnx_node(cls, op_def, shapes):
        """(ONNX nodes, constant TensorProtos) of one Caffe2 OperatorDef, by stepnet's exporter (its converter of
        op_def.type, at target_opset_version). shapes: {blob: shape} of at least the op's inputs (Caffe2's
        frontend learned them by running the net), a shape standing for a float32 tensor; an array or a
        TensorSpec gives another type (integer indices, ...). The nodes read and write the op's blob names (an
        output the op also reads gets `_out`); the constants are what the conversion adds (a Reshape's shape,
        ...)."""
        from ...export.onnx import export_onnx
        from ...io.proto import NetDef
        inputs = list(dict.fromkeys(op_def.input))
        missing = [n for n in inputs if n not in shapes]
        if missing:
            raise RuntimeError(f"{op_def.type}: no shape given for its inputs {', '.join(missing)}")
        net = NetDef(name=op_def.name or op_def.type, op=[op_def], external_input=inputs,
                     external_output=list(op_def.output))
        result = export_onnx(net, None, inputs={n: _dims(shapes[n]) for n in inputs}, outputs=list(op_def.output),
                             opset=cls.target_opset_version, check=False)
        return list(result.model.graph.node), list(result.model.graph.initializer)

    @classmethod
    def caffe2_net_to_onnx_model(cls, predict_net, init_net=None, value_info=None):
        """The ONNX ModelProto of predict_net with init_net's values, checked by onnx.checker."""
        return cls._export(predict_net, init_net, value_info).model

    @classmethod
    def caffe2_net_to_onnx_graph(cls, predict_net, init_net=None, value_info=None):
        """The GraphProto of caffe2_net_to_onnx_model's model."""
        return cls._export(predict_net, init_net, value_info).model.graph

    @classmethod
    @caffe2_errors
    def caffe2_init_net_to_initializer(cls, init_net) -> list:
        """The values init_net makes as ONNX TensorProtos, in the order its ops first write them (stepnet runs
        the net, so every fill converts, not only GivenTensor*Fill)."""
        from ...export.onnx.emit import to_tensor
        init = _proto(init_net)
        values = _run(init)
        names = dict.fromkeys(o for op in init.op for o in op.output)
        return [to_tensor(n, values[n]) for n in names if n in values]

    @classmethod
    @caffe2_errors
    def _export(cls, predict_net, init_net, value_info):
        from ...export.onnx import export_onnx
        from ...export.onnx.exporter import forward_part
        if value_info is None:
            value_info = {}
        if not isinstance(value_info, dict):
            raise ValueError("Please pass value_info as a name -> (type, shape) dictionary")
        predict, init = _proto(predict_net), _proto(init_net)
        specs = {name: _spec(name, entry) for name, entry in value_info.items()}
        init_ops = [] if init is None else [op for op in init.op if not _placeholder(op, specs)]
        made = {o for op in init_ops for o in op.output}
        forward = Graph(_before_seeds(forward_part(predict)[0]), predict.external_input)
        reads = forward.read_before_written()
        missing = [n for n in dict.fromkeys([*predict.external_input, *reads]) if n not in specs and n not in made]
        if missing:
            raise RuntimeError(f"Could not find value info of inputs: {', '.join(missing)}")
        result = export_onnx(predict, None if init is None else with_ops(init, init_ops),
                             inputs={n: specs[n] for n in reads if n not in made},
                             outputs=list(predict.external_output) or _results(forward),
                             opset=cls.target_opset_version)
        for note in result.notes:
            logger.warning(note)
        _initializers_as_inputs(result.model.graph, predict.external_input, made)
        return result


    @classmethod
    def _ssa_rewrite(cls, net, init_net, value_info) -> None:
        """Caffe2's renaming of net (and init_net, value_info) in place into single-assignment form: every blob
        `<name>_<version>`, version 0 for external inputs and init-net values, each write one more (Caffe2's
        core.get_ssa numbering); init_net may hold GivenTensor*Fill ops only."""
        def versioned(name, version):
            return f"{name}_{version}"
        if init_net:
            for op in init_net.op:
                if not re.match("GivenTensor.*Fill", op.type) or len(op.output) != 1:
                    raise AssertionError(f"type is {op.type}, \n{op}")
                op.output[0] = versioned(op.output[0], 0)
            init_net.external_input[:] = [versioned(n, 0) for n in init_net.external_input]
            init_net.external_output[:] = [versioned(n, 0) for n in init_net.external_output]
        if value_info:
            renamed = {versioned(n, 0): v for n, v in value_info.items()}
            value_info.clear()
            value_info.update(renamed)
        ssa, versions = get_ssa(net)
        for op, (inputs, outputs) in zip(net.op, ssa):
            op.input[:] = [versioned(n, v) for n, v in inputs]
            op.output[:] = [versioned(n, v) for n, v in outputs]
        net.external_input[:] = [versioned(n, 0) for n in net.external_input]
        net.external_output[:] = [versioned(n, versions.get(n, 0)) for n in net.external_output]


caffe2_net_to_onnx_graph = Caffe2Frontend.caffe2_net_to_onnx_graph
caffe2_net_to_onnx_model = Caffe2Frontend.caffe2_net_to_onnx_model
caffe2_init_net_to_initializer = Caffe2Frontend.caffe2_init_net_to_initializer


def _initializers_as_inputs(graph, external_inputs, made: set) -> None:
    """The init net's initializers become graph inputs too, and the inputs go in the predict net's order
    (Caffe2's frontend listed its external inputs, weights included)."""
    from onnx import helper
    inputs = {i.name: i for i in graph.input}
    inputs.update({t.name: helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in graph.initializer if t.name in made and t.name not in inputs})
    order = [n for n in dict.fromkeys(external_inputs) if n in inputs]
    order += [n for n in inputs if n not in order]
    made_inputs = [inputs[n] for n in order]
    del graph.input[:]
    graph.input.extend(made_inputs)


def _dims(value):
    """caffe2_op_to_onnx_node's shapes entry as export_onnx takes it: dims as a tuple, arrays and specs as they
    are."""
    return value if isinstance(value, TensorSpec) or hasattr(value, "dtype") else tuple(int(d) for d in value)


def _proto(net):
    return net.Proto() if hasattr(net, "Proto") else net


def _spec(name: str, entry) -> TensorSpec:
    """value_info's (ONNX element type, shape) of `name` as a TensorSpec."""
    from onnx import helper
    try:
        elem_type, shape = entry
        return TensorSpec(tuple(int(d) for d in shape), np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except (TypeError, ValueError, KeyError):
        raise ValueError(f"value_info[{name!r}] = {entry!r} is not an (ONNX element type, shape) pair") from None


def _placeholder(op, specs: dict) -> bool:
    """An init-net fill of a blob value_info describes: Caffe2 takes the blob as a graph input instead."""
    return len(op.output) == 1 and op.output[0] in specs and bool(PLACEHOLDER_FILLS.match(op.type))


def _before_seeds(ops: list) -> list:
    """The ops before the first gradient seed AddGradientOperators writes (ConstantFill(y) -> y_autogen_grad: not
    marked as a gradient op, as in Caffe2, but the start of the backward pass, and a reader of y)."""
    seed = next((i for i, op in enumerate(ops) if op.type == "ConstantFill" and len(op.output) == 1
                 and op.output[0].endswith(SEED_SUFFIX)), len(ops))
    return ops[:seed]


def _results(graph: Graph) -> list[str]:
    """The blobs the ops write whose last value no later op reads, in the order they are written."""
    out: dict[str, None] = {}
    for i, op in enumerate(graph.ops):
        for name, v in zip(op.output, graph.out_versions[i]):
            if v == graph.final[name] and not graph.consumers.get((name, v)):
                out[name] = None
    return list(out)


def _run(init) -> dict:
    """The arrays init makes, run in a workspace of its own."""
    from ...core.limits import Limits
    from ...runtime.workspace import Workspace
    ws = Workspace(limits=Limits(writes=False))
    ws.run_net_once(init)
    names = {o for op in init.op for o in op.output}
    return {n: np.asarray(ws.fetch(n)) for n in names if ws.has(n) and hasattr(ws.get_blob(n).value, "shape")}
