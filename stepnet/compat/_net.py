"""Caffe2's core.Net (re-exported by core): a NetBuilder with Caffe2's method names, and the helpers about nets
and their outputs (get_net_name, output_to_list, GetIndexFromGradientList).

As in Caffe2: every registered operator is a method of a Net (`net.FC(...)`) and of a BlobReference that knows its
net (`x.Relu([], "y")`); net names are unique in the process (`net`, `net_1`, ...). Arguments an op does not
declare are kept and warned about when the net is created (stepnet never ignores one silently); argument types
are checked as each op is added, its numbers of inputs and outputs and its in-place rules when the net is created
or run (as Caffe2 does). Ops made by Net methods record where they were made.
"""
from __future__ import annotations

import sys
import warnings
from collections import defaultdict

import numpy as np

from ..builders.builder import NetBuilder
from ..core.errors import did_you_mean
from ..io.proto import NetDef, OperatorDef, TensorProto
from ..ops import REGISTRY
from ..ops.base import GradientSlice
from ..ops.binding import parse_args
from . import _python_ops, _steps, _tracebacks, dyndep, immediate
from ._devices import CUDA, DeviceOption
from ._net_records import NetRecords
from ._observers import NetObserverMethods
from ._operators import ScopedBlobReference, ScopedName
from .blob_reference import BlobReference
from .scope import SCOPE, CurrentNameScope

DataType = TensorProto.DataType
MKLDNN = 2   # caffe2_pb2.MKLDNN


class Net(NetRecords, NetObserverMethods, NetBuilder):
    """Caffe2's core.Net: Net(name) or Net(netdef) (a copy), its name made unique in the process."""

    __module__ = "stepnet.compat.core"   # where programs meet it: Caffe2's core.Net
    _net_names_used: set = set()
    undeclared_args_are_errors = False   # kept and warned about when the net is bound, as Caffe2 keeps them

    def __init__(self, name_or_proto, inputs=None):
        proto = name_or_proto if isinstance(name_or_proto, NetDef) else None
        name = proto.name if proto is not None else "" if name_or_proto is None else str(name_or_proto)
        super().__init__(name, scope=SCOPE, proto=proto)
        self._net.name = Net._get_next_net_name(name)
        self._registered_blob_names: set = set()
        self._attr_dict = defaultdict(list)
        self._proto_handed_out = False
        if inputs:
            self.AddExternalInput(*inputs)

    @staticmethod
    def current_prefix() -> str:
        """The name of the active net_builder.NetBuilder ('' outside any)."""
        builders = sys.modules.get(f"{__package__}._netbuilder")   # none active before that module is loaded
        builder = builders.NetBuilder.current(required=False) if builders is not None else None
        return builder.name if builder else ""

    @staticmethod
    def _get_next_net_name(basename: str) -> str:
        """basename under the active NetBuilder's name (current_prefix), then _1, _2, ... where that is taken."""
        name = basename = "/".join(x for x in (Net.current_prefix(), basename) if x)
        k = 1
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
        too), keeping the ops listed in op_id_mask (default: all); with keep_schema, the input and output records
        too, over the renamed blobs."""
        from ._clone import clone_proto
        net = Net(clone_proto(self._net, name, blob_remap, op_id_mask, remap_funcs))
        if keep_schema:
            self._copy_records_to(net, {str(k): str(v) for k, v in (blob_remap or {}).items()})
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
        """Every op without its own device option on GPU gpu_id (the net's device option); use_cudnn: the CUDNN
        engine for every op."""
        self._net.device_option.CopyFrom(DeviceOption(CUDA, gpu_id))
        if use_cudnn:
            for op in self._net.op:
                op.engine = "CUDNN"

    def RunAllOnMKL(self) -> None:
        """The net's device option MKLDNN (Caffe2's MKL-DNN ops; here they run as the CPU's)."""
        self._net.device_option.Clear()
        self._net.device_option.device_type = MKLDNN

    def DeduplicateGradientSlices(self, g, aggregator="sum") -> GradientSlice:
        """A GradientSlice with each index of g once: the values of its repeats summed ('sum') or averaged
        ('mean'), by Unique and UnsortedSegmentSum / UnsortedSegmentMean ops added to this net."""
        assert isinstance(g, GradientSlice)
        unique, remapping = self.Unique([g.indices], 2, engine="SparseHash")
        kind = aggregator.lower()
        if kind not in ("sum", "mean"):
            raise ValueError(f"{aggregator} is not supported")
        op = self.UnsortedSegmentSum if kind == "sum" else self.UnsortedSegmentMean
        return GradientSlice(indices=unique, values=op([g.values, remapping], 1))

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


def get_net_name(netlike):
    """The name of a Net or NetDef; anything else (a name) as it is."""
    if isinstance(netlike, Net):
        return netlike.Proto().name
    if isinstance(netlike, NetDef):
        return netlike.name
    return netlike


def output_to_list(op_output) -> list:
    """An op method's outputs as a list (one BlobReference, or a list or tuple of them)."""
    assert type(op_output) in (list, tuple, BlobReference)
    return [op_output] if isinstance(op_output, BlobReference) else list(op_output)


def GetIndexFromGradientList(g_list, name):
    """The index in g_list of the gradient `name` (a blob, or the indices or values of a GradientSlice), or
    None."""
    for i, g in enumerate(g_list):
        if g == name or (type(g) is GradientSlice and name in (g.indices, g.values)):
            return i
    return None


_steps.NET_TYPE[:] = [Net]   # steps, plans and the clones of nested nets made from protos make core.Nets
