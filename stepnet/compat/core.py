"""Caffe2's core module: Net (a NetBuilder with Caffe2's method names), BlobReference, CreateOperator,
DeviceOption, the scopes, ExecutionStep and Plan.

As in Caffe2: a string blob name is prefixed with the current NameScope, a BlobReference is used as it is; new
ops get the current DeviceScope; every registered operator is a method of a Net (`net.FC(...)`) and of a
BlobReference that knows its net (`x.Relu([], "y")`); net names are unique in the process (`net`, `net_1`, ...).
Arguments an op does not declare are kept and warned about when the net is created (stepnet never ignores
one silently); argument types are checked as each op is added, its numbers of inputs and outputs and its
in-place rules when the net is created or run (as Caffe2 does). Ops made by Net methods record where they were made.
"""
from __future__ import annotations

import importlib
import sys
import warnings
from collections import defaultdict

import numpy as np

from ..builders.builder import NetBuilder
from ..core.errors import did_you_mean
from ..ops import REGISTRY
from ..ops.binding import parse_args
from ..ops.base import GradientSlice
from ..io.proto import DeviceOption as _DeviceOptionProto
from ..io.proto import NetDef, OperatorDef, TensorProto, make_argument
from . import _python_ops, _steps, _tracebacks, c_api as C, dyndep, immediate  # noqa: F401, N812 - core.C: Caffe2's
from ._net_records import NetRecords
from ._observers import NetObserverMethods
from ._ssa import get_ssa  # noqa: F401 - Caffe2's core.get_ssa
from .blob_reference import BlobReference
from .engines import (IsOperatorWithEngine, SetEnginePref, SetGlobalEnginePref,  # noqa: F401 - Caffe2's core
                      SetOpEnginePref)
from .gradients import GradientRegistry, python_makers  # noqa: F401 - Caffe2's core has GradientRegistry
from ._steps import ExecutionStep, Plan, execution_step, scoped_execution_step, to_execution_step  # noqa: F401
from .scope import SCOPE, CurrentDeviceScope, CurrentNameScope, DeviceScope, EmptyDeviceScope, NameScope  # noqa: F401

DataType = TensorProto.DataType
_GLOBAL_INIT_ARGS: list = []


def GlobalInit(args) -> None:
    """Caffe2's flag parsing: the flags (`--caffe2_log_level=0`, ...) are recorded and have no effect here."""
    _GLOBAL_INIT_ARGS[:] = list(args)


def IsOperator(op_type: str) -> bool:
    return op_type in REGISTRY


def DeviceOption(device_type, cuda_gpu_id: int = 0, random_seed=None, node_name=None, numa_node_id=None,
                 extra_info=None, device_id=None):
    """A caffe2_pb2.DeviceOption; cuda_gpu_id (older Caffe2) and device_id (newer) both set device_id."""
    option = _DeviceOptionProto(device_type=device_type, device_id=cuda_gpu_id if device_id is None else device_id,
                                extra_info=extra_info or [])
    for field, value in (("random_seed", random_seed), ("node_name", node_name), ("numa_node_id", numa_node_id)):
        if value is not None:
            setattr(option, field, value)
    return option


def device_option_equal(opt1, opt2, ignore_node_name=True, ignore_random_seed=True) -> bool:
    if not opt1 or not opt2:
        return opt1 == opt2
    if (not ignore_node_name and opt1.node_name != opt2.node_name) or (
            not ignore_random_seed and opt1.random_seed != opt2.random_seed):
        return False
    if not opt1.device_type or not opt2.device_type:
        return not opt1.device_type and not opt2.device_type
    return opt1.device_id == opt2.device_id


def InferBlobDevices(net) -> dict:
    """{blob: the DeviceOption of the op that writes it} (an empty option for ops without one)."""
    return {b: op.device_option for op in net.Proto().op for b in op.output}


# ----------------------------------------------------------------------------------------------- blobs
def ScopedName(name) -> str:
    """name prefixed with the current name scope."""
    return CurrentNameScope() + (name.decode() if isinstance(name, bytes) else name)


def ScopedBlobReference(name, *args, **kwargs) -> BlobReference:
    return BlobReference(ScopedName(name), *args, **kwargs)


def _names(blobs, what: str) -> list[str]:
    """Caffe2's _RectifyInputOutput: strings get the name scope, BlobReferences are used as they are."""
    if isinstance(blobs, (str, bytes)):
        blobs = [blobs]
    if not isinstance(blobs, (list, tuple)):
        raise TypeError(f"Unknown {what} type: {blobs!r} of type {type(blobs).__name__}")
    for b in blobs:
        if not isinstance(b, (str, bytes)):
            raise TypeError(f"{what} blob {b!r} of unsupported type {type(b).__name__}")
    return [SCOPE.scoped(b) for b in blobs]


def CreateOperator(operator_type, inputs, outputs, name="", control_input=None, device_option=None, arg=None,
                   engine=None, **kwargs) -> OperatorDef:
    """An OperatorDef (nothing runs): names scoped, the current device scope unless device_option is given,
    random_seed into the device option, the other keywords as arguments."""
    op = OperatorDef(type=operator_type, name=name, input=_names(inputs, "input"), output=_names(outputs, "output"))
    if control_input:
        op.control_input.extend(_names(control_input, "control input"))
    device = device_option if device_option is not None else CurrentDeviceScope()
    if device is not None:
        op.device_option.CopyFrom(device)
    if engine is not None:
        op.engine = engine
    if "random_seed" in kwargs:
        op.device_option.random_seed = kwargs.pop("random_seed")
    if arg is not None:
        op.arg.extend(arg)
    for key, value in kwargs.items():
        if value is None:   # Caffe2's MakeArgument refuses it (no argument type holds None)
            raise ValueError(f"argument {key!r} of {operator_type} is None: give it a value or leave it out")
        op.arg.append(make_argument(key, value))
    immediate.run_if_on(op)
    return op


def CreatePythonOperator(f, inputs, outputs, grad_f=None, pass_workspace=False, python_func_type=None, *args,
                         **kwargs) -> OperatorDef:
    """A Python op of f(inputs, outputs[, workspace]), f registered in this process under the op's token."""
    kwargs["token"] = _python_ops.register(f, grad_f, python_func_type, pass_workspace)
    return CreateOperator("Python", inputs, outputs, *args, **kwargs)


# ----------------------------------------------------------------------------------------------- nets
class Net(NetRecords, NetObserverMethods, NetBuilder):
    """Caffe2's core.Net: Net(name) or Net(netdef) (a copy), its name made unique in the process."""

    _net_names_used: set = set()
    undeclared_args_are_errors = False   # kept and warned about when the net is bound, as Caffe2 keeps them

    def __init__(self, name_or_proto, inputs=None):
        proto = name_or_proto if isinstance(name_or_proto, NetDef) else None
        name = proto.name if proto is not None else str(name_or_proto)
        super().__init__(name, scope=SCOPE, proto=proto)
        self._net.name = Net._get_next_net_name(name)
        self._registered_blob_names: set = set()
        self._attr_dict = defaultdict(list)
        self._proto_handed_out = False
        if inputs:
            self.AddExternalInput(*inputs)

    @staticmethod
    def _get_next_net_name(basename: str) -> str:
        name, k = basename, 1
        while name in Net._net_names_used:
            name, k = f"{basename}_{k}", k + 1
        Net._net_names_used.add(name)
        return name

    # ------------------------------------------------------------------------------------- ops
    def __getattr__(self, op_type):
        if op_type.startswith("_") or op_type not in REGISTRY:
            raise AttributeError(f"Method {op_type} is not a registered operator"
                                 f"{did_you_mean(op_type, list(REGISTRY))}{dyndep.unloaded_note()}")

        def add(inputs=None, outputs=None, **kwargs):
            outs = self.add_op(op_type, [] if inputs is None else inputs, outputs, **kwargs)
            _tracebacks.record(self.Name(), len(self._net.op) - 1, sys._getframe(1))   # the caller: where it was made
            outs = [outs] if isinstance(outs, str) else outs
            refs = tuple(BlobReference(o, self) for o in outs)
            return None if not refs else refs[0] if len(refs) == 1 else refs
        add.__name__, add.__doc__ = op_type, REGISTRY.get(op_type).doc
        return add

    def add_op(self, op_type, inputs=(), outputs=None, **kwargs):
        self._sync()
        outs = super().add_op(op_type, inputs, outputs, **kwargs)
        immediate.run_if_on(self._net.op[-1])
        return outs

    def _check(self, opdef: OperatorDef) -> None:
        """NetBuilder's checks but arity and in-place rules (binding raises the same errors, naming the op)."""
        label = f"net {self.name!r}, new op #{len(self._net.op)} ({opdef.type})"
        schema = REGISTRY.get(opdef.type)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # undeclared arguments: kept, and warned about at binding
            parse_args(schema, opdef, label, strict=False)

    def _sync(self) -> None:
        """After Proto() was handed out the NetDef may have been changed directly: re-read what it defines."""
        if self._proto_handed_out:
            self._defined = set(self._net.external_input) | {o for op in self._net.op for o in op.output}
            self._proto_handed_out = False

    # ------------------------------------------------------------------------------------- the net
    def Name(self) -> str:
        return self._net.name

    def __str__(self):
        return self.Name()

    def Proto(self) -> NetDef:
        """The live NetDef (changes to it are seen by later calls)."""
        self._proto_handed_out = True
        return self._net

    def BlobIsDefined(self, blob) -> bool:
        self._sync()
        return str(blob) in self._defined

    def UsesBlob(self, blob) -> bool:
        name = str(blob)
        return any(name in op.input for op in self._net.op) or name in self._net.external_input

    def UsedBlobNames(self) -> set:
        names = set(self._net.external_input) | set(self._net.external_output)
        for op in self._net.op:
            names.update(op.input, op.output)
        return names

    def GetBlobRef(self, blob_name) -> BlobReference:
        if not self.BlobIsDefined(blob_name):
            raise KeyError(f"Net does not define blob {blob_name}")
        return BlobReference(str(blob_name), self)

    def NextName(self, prefix=None, output_id=None) -> str:
        """'<net>/<prefix>[:<id>]' made unique (to be scoped when used), or '<net>_blob_<k>'."""
        self._sync()
        if prefix is None:
            return str(self.next_name())
        name = str(self.next_name(prefix, output_id))
        scope = CurrentNameScope()
        return name[len(scope):] if scope and name.startswith(scope) else name

    def NextBlob(self, prefix="unnamed") -> BlobReference:
        base, blob, k = str(prefix), str(prefix), 0
        while blob in self._registered_blob_names or self.BlobIsDefined(blob):
            blob, k = f"{base}_auto_{k}", k + 1
        self._registered_blob_names.add(blob)
        return BlobReference(blob)

    def NextScopedBlob(self, prefix="unnamed") -> BlobReference:
        return self.NextBlob(ScopedName(prefix))

    def AddExternalInput(self, *inputs):
        """Declare external inputs (each once); returns their BlobReferences (one, or a list)."""
        if not inputs:
            raise ValueError("AddExternalInput needs at least one blob")
        names = [str(i) for i in inputs]
        for name in names:
            if name in self._net.external_input:
                raise ValueError(f"Net already contains an input named {name}")
        self.add_external_inputs(*names)
        refs = [BlobReference(n, self) for n in names]
        return refs[0] if len(refs) == 1 else refs

    def AddExternalInputs(self, *inputs):
        return self.AddExternalInput(*inputs)

    def AddExternalOutput(self, *outputs):
        """Declare blobs the net makes as its outputs; returns their BlobReferences (one, or a list)."""
        self._sync()
        self.add_external_outputs(*(str(o) for o in outputs))
        refs = [BlobReference(str(o), self) for o in outputs]
        return refs[0] if len(refs) == 1 else refs

    def AddExternalOutputs(self, *outputs):
        return self.AddExternalOutput(*outputs)

    def AddScopedExternalInputs(self, *inputs) -> list:
        res = self.AddExternalInput(*(ScopedBlobReference(b) for b in inputs))
        return res if isinstance(res, list) else [res]

    def AddScopedExternalOutputs(self, *outputs):
        return self.AddExternalOutput(*(ScopedBlobReference(b) for b in outputs))

    @property
    def external_inputs(self) -> list:
        return [BlobReference(x, self) for x in self._net.external_input]

    @property
    def external_outputs(self) -> list:
        return [BlobReference(x, self) for x in self._net.external_output]

    def is_external_input(self, blob) -> bool:
        return str(blob) in self._net.external_input

    def AddGradientOperators(self, ys, skip: int = 0) -> dict:
        """Append the backward pass of ys (a list: gradients seeded with ones; a dict: {y: gradient blob or
        None}) over the ops after the first `skip`; returns {blob: gradient BlobReference or GradientSlice}."""
        from .gradients import caffe2_backward
        self._sync()
        ys = [ys] if isinstance(ys, str) else ys
        if isinstance(ys, dict):
            ys = {str(k): (None if v is None else str(v)) for k, v in ys.items()}
            self.add_external_inputs(*(g for g in ys.values() if g is not None and not self.is_defined(g)))
        else:
            ys = [str(y) for y in ys]
        ops, grads = caffe2_backward(self._net.op[skip:], ys)
        self._net.op.extend(ops)
        self._defined.update(o for op in ops for o in op.output)
        return {BlobReference(k): (GradientSlice(BlobReference(v.indices), BlobReference(v.values))
                                   if isinstance(v, GradientSlice) else BlobReference(v))
                for k, v in grads.items() if v is not None}

    def Clone(self, name, blob_remap=None, op_id_mask=None, remap_funcs=None, keep_schema=True) -> "Net":
        """A copy named `name` with blobs renamed by blob_remap (inside RecurrentNetwork, If and While nets
        too), keeping the ops listed in op_id_mask (default: all)."""
        from ._clone import clone_proto
        net = Net(clone_proto(self._net, name, blob_remap, op_id_mask, remap_funcs))
        net._attr_dict.update(self._attr_dict)
        return net

    def ClonePartial(self, name, inputs, outputs, remap_funcs=None) -> tuple:
        """A net of only the ops needed to compute `outputs` from `inputs` (a {blob: name in the clone} dict, a
        list of such pairs, or a list of blobs kept by name); blobs made inside are prefixed `name/`.
        Returns (the net, [BlobReferences of its outputs])."""
        from ._clone import clone_partial
        return clone_partial(self, name, inputs, outputs, remap_funcs)

    def PopulateProtoWithFileName(self) -> None:
        """Name each op a Net method added '<file>:<line>:<function>', where it was created."""
        created = _tracebacks.operator_tracebacks.get(self.Name(), {})
        for index, op in enumerate(self._net.op):
            if index in created:
                op.name = ":".join(map(str, created[index][0]))

    def _CheckLookupTables(self) -> None:
        """(Caffe2's test hook) every op output and external input is known to the net as defined."""
        self._sync()
        outputs = {o for op in self._net.op for o in op.output}
        assert outputs <= self._defined and set(self._net.external_input) <= self._defined

    def AppendNet(self, net) -> "Net":
        """Add another net's ops, its external inputs not made here and its external outputs."""
        other = net.Proto() if hasattr(net, "Proto") else net
        self._sync()
        made = {o for op in self._net.op for o in op.output}
        self.add_external_inputs(*(i for i in other.external_input if i not in made))
        self._net.external_output.extend(o for o in other.external_output if o not in self._net.external_output)
        self._net.op.extend(other.op)
        self._defined.update(o for op in other.op for o in op.output)
        return self

    def Const(self, array, blob_out=None, dtype=None):
        """A GivenTensor*Fill (ConstantFill for a bool) of the array."""
        if isinstance(array, bool):
            return self.ConstantFill([], blob_out or 1, dtype=DataType.BOOL, value=array)
        array = np.array(array, dtype=dtype)
        kind = {np.dtype(np.int32): "GivenTensorIntFill", np.dtype(np.int64): "GivenTensorInt64Fill",
                np.dtype(bool): "GivenTensorBoolFill"}.get(array.dtype, "GivenTensorFill")
        if array.dtype.kind in "SUO":
            kind = "GivenTensorStringFill"
        return getattr(self, kind)([], blob_out or 1, shape=list(array.shape), values=array.flatten().tolist())

    def RunAllOnGPU(self, gpu_id: int = 0, use_cudnn: bool = False) -> None:
        self._net.device_option.CopyFrom(DeviceOption(1, gpu_id))
        if use_cudnn:
            for op in self._net.op:
                op.engine = "CUDNN"

    def set_rand_seed(self, seed: int = 100, sequence_seed: bool = True, seed_on_op_def: bool = False) -> None:
        if sequence_seed and seed_on_op_def:
            raise ValueError("sequence_seed and seed_on_op_def cannot both be True")
        for i, op in enumerate(self._net.op):
            value = seed + i if sequence_seed else hash(str(op) + str(seed)) % (2**32 - 1) if seed_on_op_def else seed
            op.device_option.random_seed = value

    def LogInfo(self, *msg_or_blobs) -> None:
        for m in msg_or_blobs:
            blob = m if isinstance(m, BlobReference) else self.GivenTensorStringFill(
                [], self.NextName("log"), shape=[], values=[m])
            self.Print(blob, [])

    def Python(self, f, grad_f=None, python_func_type=None, pass_workspace=False, **indices):
        """net.Python(f)(inputs, outputs): f registered now, then a Python op of it added (_python_ops)."""
        return _python_ops.net_python(self, f, grad_f, python_func_type, pass_workspace, **indices)

    def add_attribute(self, name, obj) -> None:
        self._attr_dict[name].append(obj)

    def get_attributes(self, name) -> list:
        return self._attr_dict.get(name, [])

    def extend_ops(self, new_ops) -> None:
        self._sync()
        self._net.op.extend(new_ops)
        self._defined.update(o for op in new_ops for o in op.output)

    def __repr__(self):
        return f"core.Net({self.Name()!r}, {len(self._net.op)} ops)"


_steps.NET_TYPE[:] = [Net]   # steps and plans made from protos make core.Nets



def __getattr__(name: str):
    """core.workspace, as Caffe2's core imports it (core.workspace.RunPlan); here workspace imports core."""
    if name == "workspace":
        return importlib.import_module(f"{__package__}.workspace")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
