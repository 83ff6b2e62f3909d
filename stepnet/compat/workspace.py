"""Caffe2's workspace module over a process-wide set of named stepnet Workspaces, one of them current
("default" at first). This is the compat layer's convenience only: stepnet's core keeps no global state.

Nets are given as core.Net, NetDef or (for RunNet) a name, as in Caffe2; CreateNet and RunNetOnce take a copy
of the NetDef at that moment. Errors are Caffe2's RuntimeError (each also the StepnetError subclass that says
what went wrong, with stepnet's message).
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..core import backend
from ..core.errors import StepnetError
from ..graph.view import copy_net
from ..ops import REGISTRY
from ..io.proto import NetDef, OperatorDef, PlanDef, TensorProto
from ..core.spec import TensorSpec
from . import c_api as C  # noqa: F401, N812 - workspace.C: Caffe2's name for its C++ extension
from . import core
from . import _tracebacks, immediate
from ._workspaces import (  # noqa: F401 - the named workspaces: Caffe2's workspace functions over them
    CurrentWorkspace, ResetWorkspace, RootFolder, SwitchWorkspace, WorkspaceGuard, Workspaces, _current, _workspaces,
    _ws, reset_all)
from ._tracebacks import operator_tracebacks  # noqa: F401 - {net: {op index: where it was made}}, as Caffe2's
from .errors import caffe2_errors
from .immediate import (  # noqa: F401 - Caffe2's immediate mode
    FeedImmediate, FetchImmediate, ImmediateBlobs, IsImmediate, RunOperatorImmediate, StartImmediate, StopImmediate)
from .scope import CurrentDeviceScope, CurrentNameScope


class _CurrentWorkspace:
    """C.Workspace.current: the workspace workspace.* works on, as a C.Workspace."""

    def __get__(self, obj, cls=None) -> "C.Workspace":
        return C.Workspace(_ws())


C.Workspace.current = _CurrentWorkspace()


def GlobalInit(args) -> None:
    """Caffe2's C.global_init: its C++ flags (`--caffe2_log_level=0`, ...) have no effect here; unlike
    core.GlobalInit it does not record them for core.GetGlobalInitArgs."""


def _reset_all() -> None:
    """Drop every workspace and start again from an empty "default", out of immediate mode, with no operator
    tracebacks (a fresh process's state, for tests)."""
    immediate.StopImmediate()
    reset_all()
    operator_tracebacks.clear()


# ----------------------------------------------------------------------------------------------- blobs
_blob_name = C.blob_name


def Blobs() -> list:
    return _ws().blobs()


def HasBlob(name) -> bool:
    return _ws().has(_blob_name(name))


def CreateBlob(name) -> bool:
    _ws().create_blob(_blob_name(name))
    return True


@caffe2_errors
def FeedBlob(name, arr, device_option=None) -> bool:
    """Store a copy of arr (an array, a string or a TensorProto) on the device of device_option, else of the
    current device scope. A str is kept as its UTF-8 bytes, as Caffe2 keeps it (FetchBlob gives bytes)."""
    if isinstance(arr, np.ndarray) and arr.dtype.kind in "SU":
        arr = arr.astype(object)
    elif isinstance(arr, str):
        arr = arr.encode("utf-8")
    if device_option is None:
        device_option = CurrentDeviceScope()
    _ws().feed(_blob_name(name), arr, device_option=device_option)
    return True


@caffe2_errors
def FetchBlob(name):
    """A host numpy copy of the blob (a string blob as it is)."""
    return _ws().fetch(_blob_name(name))


def FetchBlobs(names) -> list:
    return [FetchBlob(n) for n in names]


def SerializeBlob(name) -> bytes:
    """The blob as a serialized BlobProto (a tensor whole, with its device), as stepnet's db files hold it."""
    return C.serialize(_ws(), _blob_name(name))


def DeserializeBlob(name, serialized: bytes) -> None:
    """Store in blob `name` (created if missing) the value of a serialized BlobProto."""
    C.deserialize(_ws(), _blob_name(name), serialized)


class _BlobDict:
    """workspace.blobs: fetch and feed with [] (`workspace.blobs["loss"]`)."""

    def __getitem__(self, key):
        return FetchBlob(key)

    def __setitem__(self, key, value):
        FeedBlob(key, value)

    def __len__(self):
        return len(Blobs())

    def __iter__(self):
        return iter(Blobs())

    def __contains__(self, item):
        return HasBlob(item)


blobs = _BlobDict()


# ----------------------------------------------------------------------------------------------- nets
def GetNetName(net) -> str:
    if isinstance(net, str):
        return str(net)
    if hasattr(net, "Name"):
        return net.Name()
    if isinstance(net, NetDef):
        return net.name
    raise TypeError(f"Not a Net object: {net!r}")


StringifyNetName = GetNetName


def StringifyBlobName(name) -> str:
    return _blob_name(name)


def StringifyProto(obj) -> bytes:
    if isinstance(obj, (str, bytes)):
        return obj
    if hasattr(obj, "Proto"):
        obj = obj.Proto()
    return obj.SerializeToString()


def _netdef(net) -> NetDef:
    if isinstance(net, bytes):   # a serialized NetDef, as Caffe2's StringifyProto makes
        net = NetDef.FromString(net)
    proto = net.Proto() if hasattr(net, "Proto") else net
    if not isinstance(proto, NetDef):
        raise TypeError(f"expected a core.Net or NetDef, got {type(net).__name__}")
    return copy_net(proto)


@_tracebacks.intercepted
@caffe2_errors
def CreateNet(net, overwrite: bool = False, input_blobs=None) -> bool:
    """Bind a copy of the net in the current workspace under its name (to run with RunNet); input_blobs are
    created first."""
    _ws().create_net(_netdef(net), overwrite=overwrite, input_blobs=[str(b) for b in input_blobs or ()])
    return True


@_tracebacks.intercepted
@caffe2_errors
def RunNet(name, num_iter: int = 1, allow_fail: bool = False) -> bool:
    """Run a created net num_iter times; with allow_fail a failure returns False instead of raising."""
    try:
        _ws().run_net(GetNetName(name), num_iter)
    except StepnetError:
        if allow_fail:
            return False
        raise
    return True


@_tracebacks.intercepted
@caffe2_errors
def RunNetOnce(net) -> bool:
    _ws().run_net_once(_netdef(net))
    return True


@caffe2_errors
def RunOperatorOnce(operator) -> bool:
    if isinstance(operator, bytes):
        operator = OperatorDef.FromString(operator)
    if not isinstance(operator, OperatorDef):
        raise TypeError(f"expected an OperatorDef, got {type(operator).__name__}")
    _ws().run_operator_once(operator)
    return True


def RunOperatorsOnce(operators) -> bool:
    for op in operators:
        RunOperatorOnce(op)
    return True


@caffe2_errors
def RunPlan(plan_or_step) -> bool:
    """Run a core.Plan, core.ExecutionStep (as a plan of its own) or PlanDef."""
    if isinstance(plan_or_step, core.ExecutionStep):
        plan_or_step = core.Plan(plan_or_step)
    plan = plan_or_step.Proto() if hasattr(plan_or_step, "Proto") else plan_or_step
    if isinstance(plan, bytes):
        plan = PlanDef.FromString(plan)
    if not isinstance(plan, PlanDef):
        raise TypeError(f"expected a core.Plan, core.ExecutionStep or PlanDef, got {type(plan).__name__}")
    _ws().run_plan(plan)
    return True


@caffe2_errors
def BenchmarkNet(name, warmup_runs: int, main_runs: int, run_individual: bool = False) -> list:
    """Run a created net warmup_runs times, then time main_runs runs; prints and returns [ms per run].
    run_individual (Caffe2's per-operator timing) is not available and is said so."""
    net = _ws().net(GetNetName(name))
    print("Starting benchmark.")
    print(f"Running warmup runs: {warmup_runs}")
    for _ in range(warmup_runs):
        net.run()
    print(f"Main runs: {main_runs}")
    start = time.perf_counter()
    for _ in range(main_runs):
        net.run()
    ms = (time.perf_counter() - start) * 1000 / max(main_runs, 1)
    print(f"Main run finished. Milliseconds per iter: {ms:g}. Iters per second: {1000 / ms if ms else 0:g}")
    if run_individual:
        print("Per-operator timing (run_individual) is not available in stepnet; only the whole net was timed.")
    return [ms]


def _gather_ranges_bound(specs, **_):
    """Caffe2's GatherRanges shape: DATA's size as an upper bound of the values, RANGES' type for the lengths."""
    data, ranges = specs
    return [TensorSpec((math.prod(data.shape),), data.dtype), TensorSpec(tuple(ranges.shape[:1]), ranges.dtype)]


def _concat_as_inferred(specs, *, axis, order, add_axis, split):
    """Caffe2's shape inference stacks with add_axis even when the axis comes from `order` (its kernel, and so
    stepnet's record, concatenates then)."""
    if add_axis and axis is None:
        axis, order = (1 if (order or "NCHW").upper() == "NCHW" else 3), None
    return REGISTRY.get("Concat").shape(specs, axis=axis, order=order, add_axis=add_axis, split=split)


def _softmax_with_loss_as_inferred(specs, *, axis=1, **_):
    """Caffe2's SoftmaxWithLoss shape: the logits' 2-D view at axis and a float loss, the labels not looked at
    (given only dimensions, Caffe2 takes every blob for float)."""
    dims = specs[0].shape
    a = axis + len(dims) if axis < 0 else axis
    return [TensorSpec((math.prod(dims[:a]), math.prod(dims[a:])), specs[0].dtype),
            TensorSpec((), np.dtype(np.float32))]


def _top_k_as_inferred(specs, **args):
    """Caffe2's TopK shape: stepnet's, but with the indices (and flattened indices) INT32, as Caffe2's
    inference function declares them (its kernel writes int64 ones)."""
    values, *indices = REGISTRY.get("TopK").shape(specs, **args)
    return [values] + [TensorSpec(i.shape, np.dtype(np.int32)) for i in indices]


# Caffe2's shape functions where they differ from stepnet's (which gives exact sizes when values are known).
CAFFE2_SHAPES = {"GatherRanges": _gather_ranges_bound, "Concat": _concat_as_inferred,
                 "SoftmaxWithLoss": _softmax_with_loss_as_inferred, "TopK": _top_k_as_inferred}


@caffe2_errors
def InferShapesAndTypes(nets, blob_dimensions=None) -> tuple:
    """({blob: dims}, {blob: TensorProto data type}) of the nets' blobs and the workspace's (Caffe2 starts from
    every blob in the current workspace), or from blob_dimensions ({name: dims}, float32) alone."""
    from ..core.spec import spec
    from ..passes.shapes import infer_net, specs_of_workspace
    from ..io.tensors import data_type_of
    protos = [n.Proto() if hasattr(n, "Proto") else n for n in nets]
    if blob_dimensions is None:
        names = {b for p in protos for op in p.op for b in op.input} | {b for p in protos for b in p.external_input}
        known = specs_of_workspace(_ws(), names | set(_ws().blobs()))
    else:
        known = {k: spec(v) for k, v in blob_dimensions.items()}
    for proto in protos:
        known = infer_net(proto, known, shapes=CAFFE2_SHAPES)
    shapes, types = {}, {}
    for name, s in known.items():
        if s.shape is not None and None not in s.shape:
            shapes[name] = list(s.shape)
            types[name] = data_type_of(s.dtype) if s.dtype is not None else TensorProto.UNDEFINED
    return shapes, types


def Predictor(init_net, predict_net) -> "C.Predictor":
    """A C.Predictor over the current workspace (see c_api.Predictor)."""
    return C.Predictor(StringifyProto(init_net), StringifyProto(predict_net))


@caffe2_errors
def GetOperatorCost(operator, blobs) -> tuple:
    """(flops, bytes moved) of one op (an OperatorDef or its bytes) on the current shapes of the named blobs,
    by Caffe2's cost formulas (_costs)."""
    from ._costs import operator_cost
    op = OperatorDef.FromString(operator) if isinstance(operator, bytes) else operator
    return operator_cost(op, [np.shape(_ws().get_blob(_blob_name(b)).value) for b in blobs])


@caffe2_errors
def ApplyTransform(transform_key, net) -> NetDef:
    """A new NetDef: Caffe2's transform registered as transform_key applied to net (see _transforms)."""
    from ._transforms import apply_transform
    return apply_transform(str(transform_key), _netdef(net))


@caffe2_errors
def ApplyTransformIfFaster(transform_key, net, init_net, warmup_runs: int = 5, main_runs: int = 10,
                           improvement_threshold: float = 1.01) -> NetDef:
    """The transformed net if, timed in fresh workspaces that init_net sets up, it runs more than
    improvement_threshold times faster than net; else a copy of net."""
    from ._transforms import apply_transform_if_faster
    return apply_transform_if_faster(str(transform_key), _netdef(net), _netdef(init_net), int(warmup_runs),
                                     int(main_runs), float(improvement_threshold))


# ----------------------------------------------------------------------------------------------- the rest
def RegisteredOperators() -> list:
    return list(REGISTRY)


def GetNameScope() -> str:
    return CurrentNameScope()


is_asan = False   # Caffe2 built with AddressSanitizer: never, here


def GetCUDAVersion() -> int:
    """0, as a Caffe2 build without CUDA answers (stepnet's GPU path is CuPy's)."""
    return 0


def GetCuDNNVersion() -> int:
    """0, as a Caffe2 build without cuDNN answers: stepnet never calls cuDNN."""
    return 0


def NumCudaDevices() -> int:
    cupy = backend.cupy_module()
    return int(cupy.cuda.runtime.getDeviceCount()) if cupy is not None else 0


NumGpuDevices = NumCudaDevices   # the names later Caffe2 (PyTorch's tree) gave them: DLRM's --use-gpu uses these
GpuDeviceType = 1            # caffe2_pb2.CUDA


def __getattr__(name):
    """has_gpu_support / has_cuda_support, looked up when asked (CuPy is only imported then); the immediate
    mode's folder."""
    if name in ("has_gpu_support", "has_cuda_support"):
        return backend.cupy_module() is not None
    if name == "_immediate_root_folder":   # Caffe2 keeps it here; Caffe2's tests read it
        return immediate.root_folder()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
