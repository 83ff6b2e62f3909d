"""`workspace.C`: the objects of Caffe2's C++ extension that Python programs and tests use directly, over stepnet's
Workspace: `C.Workspace()` (a workspace of its own, not one of the named ones), `C.Workspace.current` (set by the
workspace module), its `blobs` and `nets` dicts, `create_blob(name).feed(x)` / `.fetch()` / `.tensor()` /
`.serialize()`, `create_net`, `run(op | net | plan)`; `create_db` and its Mode, DB, Transaction and Cursor
(`_db`); the net observers (`_observers`); and the build facts a CPU-only Caffe2 reports (no MKL-DNN, no GPU)."""
from __future__ import annotations

import numpy as np

from ..io.blobs import serialize_blob
from ..io.proto import BlobProto, NetDef, OperatorDef, PlanDef, TensorProto, numpy_dtype
from ..core.errors import NO_VALUE, MissingBlobError
from ..core.limits import Limits
from ..runtime.workspace import Workspace as _Workspace
from . import _tracebacks
from ._db import DB, Cursor, Mode, Transaction, create_db, registered_dbs  # noqa: F401 - C's db objects
from ._observers import (  # noqa: F401 - C's net observers
    Observer, add_observer_to_net, num_observers_on_net, remove_observer_from_net)
from ._steps import ExecutionStep, Plan
from .errors import caffe2_errors

has_mkldnn = False
use_mkldnn = False
has_hip_support = False
has_gpu_support = False
has_cuda_support = False
define_caffe2_ops = True


def _cpu_flag(flag: str) -> bool:
    """Whether the CPU has the instruction set extension (read from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f" {flag} " in f.read().replace("\n", " ")
    except OSError:
        return False


def builtin_cpu_supports_avx() -> bool:
    return _cpu_flag("avx")


def builtin_cpu_supports_avx2() -> bool:
    return _cpu_flag("avx2")


class TensorCPU:
    """Blob.tensor(): the tensor itself. `data` is the stored array (writes go to the blob); feed and init replace
    it; fetch copies it."""

    def __init__(self, blob):
        self._blob = blob

    @property
    def data(self):
        return self._blob.value

    @property
    def _shape(self) -> list:
        return list(np.shape(self._blob.value))

    def feed(self, value) -> None:
        value = np.array(value, copy=True)
        self._blob.value = value.astype(object) if value.dtype.kind in "SU" else value
        self._blob.view = False

    def fetch(self):
        return np.array(self._blob.value, copy=True)

    def init(self, dims, data_type) -> None:
        """An array of dims and the TensorProto data type, zero-filled; strings cannot be made from Python."""
        if data_type == TensorProto.STRING:
            raise RuntimeError("a string tensor cannot be initialized from Python; feed an array of strings")
        self._blob.value = np.zeros([int(d) for d in dims], dtype=numpy_dtype(data_type))
        self._blob.view = False


class Blob:
    """One blob of a C.Workspace."""

    def __init__(self, ws: _Workspace, name: str):
        self._ws, self._name = ws, name

    def feed(self, value, device_option=None) -> bool:
        if isinstance(value, np.ndarray) and value.dtype.kind in "SU":
            value = value.astype(object)
        elif isinstance(value, str):   # Caffe2 keeps a str as its UTF-8 bytes (fetched as bytes)
            value = value.encode("utf-8")
        _guard(self._ws.feed, self._name, value, device_option=device_option)
        return True

    def fetch(self):
        return _guard(self._ws.fetch, self._name)

    def tensor(self) -> TensorCPU:
        return TensorCPU(self._ws.get_blob(self._name))

    def is_tensor(self) -> bool:
        return isinstance(self._ws.get_blob(self._name).value, np.ndarray)

    def serialize(self, name) -> bytes:
        """The BlobProto of this blob's value under `name` (a tensor whole, in one record)."""
        return serialize(self._ws, self._name, name)

    def deserialize(self, data: bytes) -> None:
        deserialize(self._ws, self._name, data)

    def __eq__(self, other):
        return isinstance(other, Blob) and other._ws is self._ws and other._name == self._name

    def __hash__(self):
        return hash((id(self._ws), self._name))


class Net:
    """A net created in a C.Workspace."""

    def __init__(self, net):
        self._net = net

    def run(self) -> bool:
        _guard(self._net.run)
        return True

    @property
    def name(self) -> str:
        return self._net.netdef.name


class Workspace:
    """A Caffe2 workspace object: Workspace() makes a fresh one; Workspace.current is the one workspace.* works on."""

    def __init__(self, _ws: _Workspace | None = None):
        self._ws = _ws if _ws is not None else _Workspace(limits=Limits(trusted=True))

    @property
    def blobs(self) -> dict:
        return {name: Blob(self._ws, name) for name in self._ws.blobs()}

    @property
    def nets(self) -> dict:
        return {name: Net(self._ws.net(name)) for name in self._ws.nets()}

    def keys(self) -> list:
        return self._ws.blobs()

    def items(self):
        return self.blobs.items()

    def create_blob(self, name) -> Blob:
        name = blob_name(name)
        self._ws.create_blob(name)
        return Blob(self._ws, name)

    def feed_blob(self, name, value, device_option=None) -> bool:
        return self.create_blob(name).feed(value, device_option)

    def fetch_blob(self, name):
        return Blob(self._ws, blob_name(name)).fetch()

    def has_blob(self, name) -> bool:
        return self._ws.has(blob_name(name))

    @_tracebacks.intercepted
    def create_net(self, net, overwrite: bool = False) -> Net:
        return Net(_guard(self._ws.create_net, _proto(net, NetDef), overwrite=overwrite))

    @_tracebacks.intercepted
    def run(self, obj) -> bool:
        """Run an operator, a net (once, not kept) or a plan."""
        proto = _proto(obj, (OperatorDef, NetDef, PlanDef))
        run = {OperatorDef: self._ws.run_operator_once, NetDef: self._ws.run_net_once,
               PlanDef: self._ws.run_plan}[type(proto)]
        _guard(run, proto)
        return True

    def _run_net(self, data: bytes) -> bool:
        return self.run(NetDef.FromString(data))

    def _run_operator(self, data: bytes) -> bool:
        return self.run(OperatorDef.FromString(data))

    def _run_plan(self, data: bytes) -> bool:
        return self.run(PlanDef.FromString(data))


def serialize(ws: _Workspace, name: str, as_name: str | None = None) -> bytes:
    """The BlobProto bytes of blob `name` of ws, recorded under as_name (default: its own name), as stepnet's
    io layer writes a db record: a tensor whole, with the device it is on."""
    def run():
        blob = ws.get_blob(name)
        if blob.value is None:
            raise MissingBlobError(f"blob {name!r} exists but {NO_VALUE}")
        (_, data), = serialize_blob(str(name if as_name is None else as_name), blob.value, chunk_size=2**62)
        return data
    return _guard(run)


def deserialize(ws: _Workspace, name: str, data: bytes) -> None:
    """Store in blob `name` of ws (created if missing) the value of a serialized BlobProto."""
    from ..io.blobs import BlobAssembler, parse_blob_proto

    def run():
        where = f"blob {name!r}"
        assembler = BlobAssembler()
        assembler.add(name, parse_blob_proto(bytes(data), where), where)
        (value, _), = assembler.finish(where).values()
        ws.feed(name, value)
    _guard(run)


class Predictor:
    """Caffe2's C.Predictor: init_net runs once in a child of the current workspace (so it sees the current
    blobs, and its own stay its own); run(inputs) feeds the predict net's external inputs (a list, in order,
    or a dict by name), runs it and returns its external outputs as host arrays."""

    def __init__(self, init_net: bytes, predict_net: bytes):
        parent = Workspace.current._ws
        self._ws = _Workspace(parent)
        init, self._net = (_parsed(init_net, "init_net"), _parsed(predict_net, "predict_net"))
        _guard(self._ws.run_net_once, init)
        for name in self._net.external_input:
            self._ws.create_blob(name)      # inputs fed at run time; an existing blob is used as it is
        _guard(self._ws.create_net, self._net, overwrite=True)

    def run(self, inputs) -> list:
        names = list(self._net.external_input)
        if isinstance(inputs, dict):
            pairs = [(str(k), v) for k, v in inputs.items()]
        else:
            inputs = list(inputs)
            if len(inputs) > len(names):
                raise RuntimeError(f"Predictor.run: {len(inputs)} inputs given, but the predict net "
                                   f"{self._net.name!r} has {len(names)} external inputs")
            pairs = list(zip(names, inputs))
        for name, value in pairs:
            if not isinstance(value, np.ndarray):
                raise RuntimeError(f"Predictor.run: input {name!r} must be a numpy array, "
                                   f"got {type(value).__name__}")
            _guard(self._ws.feed, name, value)
        _guard(self._ws.run_net, self._net.name)
        return [_guard(self._ws.fetch, name) for name in self._net.external_output]


def _parsed(data, what: str) -> NetDef:
    if isinstance(data, NetDef):
        return data
    if not isinstance(data, bytes):
        raise TypeError(f"{what} must be a serialized NetDef (bytes), got {type(data).__name__}")
    from ..io.validate import parse_checked

    return _guard(parse_checked, NetDef(), data, what)


def blob_name(name) -> str:
    """A blob name as Caffe2 takes it (str, BlobReference or bytes); TypeError for anything else."""
    if isinstance(name, bytes):
        return name.decode()
    if not isinstance(name, str):
        raise TypeError(f"a blob name is a string or BlobReference, got {type(name).__name__}")
    return str(name)


def _proto(obj, kinds):
    """The protobuf message of a core.Net / core.Plan / ExecutionStep / message; TypeError for anything else."""
    if isinstance(obj, ExecutionStep):
        obj = Plan(obj)
    proto = obj.Proto() if hasattr(obj, "Proto") else obj
    if not isinstance(proto, kinds):
        names = ", ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise TypeError(f"expected a {names} (or the core object holding one), got {type(obj).__name__}")
    if isinstance(proto, NetDef):
        from ..graph.view import copy_net

        proto = copy_net(proto)
    return proto


def _guard(fn, *args, **kwargs):
    """fn's result, its StepnetError raised as Caffe2's RuntimeError."""
    return caffe2_errors(fn)(*args, **kwargs)


__all__ = ["Workspace", "Blob", "Net", "TensorCPU", "BlobProto", "Predictor", "has_mkldnn", "use_mkldnn",
           "builtin_cpu_supports_avx", "create_db", "Mode", "DB", "Transaction", "Cursor", "registered_dbs"]
