"""Workspace: named blobs with Caffe2's parent-chain binding rules, and the nets created in it."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ..core import backend
from ..core.errors import NO_VALUE, MissingBlobError, NetError, did_you_mean
from ..core.limits import Limits
from ..core.writes import WriteLog
from ..core.int8 import Int8Tensor
from ..core.waits import Threads
from ..core.extras import install_hint
from ..kernels import jit
from ..kernels.blas import ThreadHold, numpy_blas, thread_count


class Blob:
    """A mutable holder. `view` marks a value that is a window into a larger tensor (a link internal or an
    alias output): an op writing a same-sized result into such a blob writes through into that tensor."""
    __slots__ = ("name", "value", "view")

    def __init__(self, name: str, value: Any = None):
        self.name = name
        self.value = value
        self.view = False

    def set(self, value) -> None:
        """Store an op's result, writing through a view when the element count and dtype match (Caffe2's
        Resize-keeps-the-buffer rule, which is how link/alias views receive step results)."""
        if self.view:
            cur = self.value
            if (cur is not None and getattr(value, "size", -1) == cur.size and value.dtype == cur.dtype
                    and type(value) is type(cur)):
                if value is not cur:
                    if cur.shape != value.shape:
                        cur = cur.reshape(value.shape)
                    cur[...] = value
                    self.value = cur
                return
            self.view = False
        self.value = value

    def set_view(self, value) -> None:
        """Point this blob at a view of another tensor (link internals, aliases)."""
        self.value = value
        self.view = True

    def __repr__(self):
        v = self.value
        what = "empty" if v is None else f"{type(v).__name__}{getattr(v, 'shape', '')}"
        return f"Blob({self.name!r}, {what}{', view' if self.view else ''})"


# BLAS threads while a workspace's nets run, unless told otherwise: the one place that decides it for the command
# line, Workspace, ModelBuilder's runs and stepnet.compat. Measured: on a shared 2-CPU machine two threads made a
# char-rnn step up to 2.2x slower, and the Python API at the process's own count ran a 1-layer LSTM step 7-20x
# slower than the CLI under load. 0 leaves BLAS as the process has it.
DEFAULT_THREADS = 1


class Workspace:
    """Blobs and nets. A child workspace sees its parent's blobs: lookups go local first, then up the
    chain; creating a blob that exists anywhere in the chain binds to that existing blob (§2). `limits` says
    what its models may read, write and allocate (default Limits(): paths under the working directory of now,
    blobs up to a quarter of the memory); child workspaces inherit their parent's. compile_steps=False runs
    RecurrentNetwork step nets, and plain nets run many times, op by op (the reference path); fused_cells=False
    keeps the LSTM/GRU cells, Softmax, Sigmoid, FC of one row, the one-hot FC weight gradient and Adam in numpy,
    True asks for their numba forms (the `fast` extra), None (default) uses them when numba is installed. threads:
    BLAS threads while its top-level nets and plans run (None: DEFAULT_THREADS, 1; 0: BLAS as the process has it)."""

    def __init__(self, parent: "Workspace | None" = None, *, seed: int | None = None, gpu: str | None = None,
                 strict: bool | None = None, check_nan: bool | None = None, limits: Limits | None = None,
                 profiler=None, reporter=None, compile_steps: bool | None = None, threads: int | None = None,
                 fused_cells: bool | None = None):
        self.parent = parent
        if limits is None and parent is not None:
            self.limits = parent.limits
        else:
            self.limits = (limits if limits is not None else Limits()).resolved()
        self._blobs: dict[str, Blob] = {}
        self._nets: dict[str, Any] = {}
        root = parent is None
        self.written = WriteLog() if root else parent.written   # the files this workspace's models wrote
        self.gpu = gpu if gpu is not None else ("auto" if root else parent.gpu)
        self.strict = bool(strict) if strict is not None else (False if root else parent.strict)
        self.check_nan = bool(check_nan) if check_nan is not None else (False if root else parent.check_nan)
        # step nets and plain nets run many times run compiled (stepnet.compiled) unless False (op by op: the reference)
        self.compile_steps = (bool(compile_steps) if compile_steps is not None
                              else (True if root else parent.compile_steps))
        # numba's fused kernels (cells, Softmax, Sigmoid, one-row FC, one-hot FC gradient, Adam; the fast extra);
        # None: if installed
        if fused_cells and not jit.installed():
            raise ValueError(f"fused_cells=True needs numba: {install_hint('fast')}")
        self.fused_cells = fused_cells if fused_cells is not None or root else parent.fused_cells
        if threads is not None and (type(threads) is not int or threads < 0):
            raise ValueError(f"threads must be an int >= 0, got {threads!r}")
        self.threads = (threads if threads is not None else DEFAULT_THREADS if root else parent.threads) or None
        # (None from here on: BLAS left as the process has it)
        self._blas = None if root or threads is not None else parent._blas   # BlasThreads, made when first used
        self.rng = np.random.default_rng(seed) if (root or seed is not None) else parent.rng
        # opt-in observers, inherited: a profile.Profiler times every op of nets bound here; a reporter
        # (name, value) -> bool takes the scalars Print ops print (True: it showed them)
        self.profiler = profiler if (root or profiler is not None) else parent.profiler
        self.reporter = reporter if (root or reporter is not None) else parent.reporter
        # which plan run each thread running ops here belongs to, for the queue ops' waits (core.waits)
        self.waits = Threads() if root else parent.waits
        # what op families keep per workspace tree ({"stats": the default StatRegistry, ...}; Caffe2: per process)
        self.shared: dict = {} if root else parent.shared

    def jit_kernels(self) -> bool:
        """Whether ops bound here use numba's jitted arithmetic where they have it (fused_cells; None: when
        numba is installed)."""
        return jit.installed() if self.fused_cells is None else bool(self.fused_cells)

    def child(self) -> "Workspace":
        """A new workspace whose parent is this one (a plan step's create_workspace, RecurrentNetwork's step
        workspaces)."""
        return Workspace(parent=self)

    def scope(self) -> "ScopeWorkspace":
        """A new Do-op workspace over this one (no parent chain; see ScopeWorkspace)."""
        return ScopeWorkspace(self)

    def blas_threads(self):
        """A context manager holding numpy's BLAS at this workspace's `threads` while a top-level net runs
        (kernels.blas.ThreadHold: about 3.5 µs to enter and leave), or None when `threads` is None (BLAS as the
        process has it) or numpy's BLAS already runs that many threads (asked per call: kernels.blas.thread_count,
        about 0.2 µs a library). numpy's BLAS
        (numpy_blas): other BLAS libraries loaded beside it, such as SciPy's, which numba imports, are not what
        stepnet's kernels call."""
        if self.threads is None:
            return None
        if self._blas is None:
            libs = tuple(numpy_blas().lib_controllers)
            counts = tuple(thread_count(lib) for lib in libs)

            def limit():
                threads = self.threads
                for count in counts:
                    if count() != threads:
                        return ThreadHold(libs, threads, [c() for c in counts])
                return None
            self._blas = limit
        return self._blas()

    # ----------------------------------------------------------------------------- blobs
    def find(self, name: str) -> Blob | None:
        ws = self
        while ws is not None:
            blob = ws._blobs.get(name)
            if blob is not None:
                return blob
            ws = ws.parent
        return None

    def get_blob(self, name: str) -> Blob:
        blob = self.find(name)
        if blob is None:
            raise MissingBlobError(f"blob {name!r} does not exist{did_you_mean(name, self.blobs())}")
        return blob

    def create_blob(self, name: str) -> Blob:
        """The blob of that name anywhere in the chain, else a new local one (Caffe2's CreateBlob)."""
        blob = self.find(name)
        if blob is None:   # setdefault: threads binding nets at once (concurrent substeps) get the same blob
            blob = self._blobs.setdefault(name, Blob(name))
        return blob

    def create_local_blob(self, name: str) -> Blob:
        blob = self._blobs.get(name)
        if blob is None:
            blob = self._blobs.setdefault(name, Blob(name))
        return blob

    def local_blob(self, name: str) -> Blob | None:
        """The blob of that name in this workspace itself (not an ancestor's), or None."""
        return self._blobs.get(name)

    def has(self, name: str) -> bool:
        return self.find(name) is not None

    def local_blobs(self) -> list[str]:
        return sorted(self._blobs)

    def blobs(self) -> list[str]:
        """Names of every blob visible from here (this workspace and its ancestors)."""
        names: set[str] = set()
        ws = self
        while ws is not None:
            names.update(ws._blobs)
            ws = ws.parent
        return sorted(names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.blobs())

    def __contains__(self, name: str) -> bool:
        return self.has(name)

    def feed(self, name: str, value, device_option=None) -> None:
        """Store a copy of value (dtype kept; str/bytes become string blobs; TensorProto converted; an
        Int8Tensor is stored as an Int8Tensor)."""
        if type(value) is np.ndarray and device_option is None:   # the common case, without the dispatch below
            blob = self.create_blob(name)
            blob.value = value.copy(order="K")
            blob.view = False
            return
        from ..io.proto import TensorProto, tensor_to_array

        if isinstance(value, TensorProto):
            value = tensor_to_array(value)
        if isinstance(value, (str, bytes)):
            stored = value
        elif isinstance(value, Int8Tensor):
            stored = value.copy(None if device_option is None else backend.resolve(device_option, self.gpu))
        else:
            stored = np.array(backend.to_host(value), copy=True)
            if device_option is not None:
                device = backend.resolve(device_option, self.gpu)
                if not device.is_cpu:
                    stored = backend.to_device(stored, device)
        blob = self.create_blob(name)
        blob.value = stored
        blob.view = False

    def fetch(self, name: str):
        """A host numpy copy of a tensor blob (strings as they are; an Int8Tensor as an Int8Tensor whose data is a
        host copy; other objects described)."""
        blob = self.get_blob(name)
        v = blob.value
        if type(v) is np.ndarray:                 # a host tensor: the common case
            return v.copy(order="K")
        if v is None:
            raise MissingBlobError(f"blob {name!r} exists but {NO_VALUE}")
        if isinstance(v, (str, bytes)):
            return v
        if isinstance(v, Int8Tensor):
            return v.copy()
        host = backend.to_host(v)
        if isinstance(host, np.ndarray):
            return np.array(host, copy=True)
        return f"<blob {name!r}: a {type(v).__name__}, not a tensor>"

    # ----------------------------------------------------------------------------- nets
    def create_net(self, netdef, overwrite: bool = False, input_blobs=()):
        """Bind netdef in this workspace (inputs must exist) and keep it under its name."""
        from .executor import Net

        for name in input_blobs:
            self.create_blob(name)
        name = netdef.name
        if name in self._nets and not overwrite:
            raise NetError(f"a net named {name!r} already exists in this workspace; pass overwrite=True to replace it")
        net = Net(netdef, self)
        self._nets[name] = net
        return net

    def bind(self, netdef, local=(), strict: bool | None = None, level: int = 0):
        """The sub-net primitive: `netdef` bound in this workspace once and kept under its name (Caffe2's
        CreateNet); every later call with the same NetDef object returns that binding, and another NetDef of the
        same name replaces it. `local` names blobs to create in this workspace even when an ancestor has one
        of that name (per-step values). Plans, RecurrentNetwork and control-flow ops run their nets through
        this, so a workspace is the one place bound nets are kept. `level`: the net's nesting depth (Net)."""
        net = self._nets.get(netdef.name)
        if net is not None and net.netdef is netdef:
            return net
        from .executor import Net

        for name in local:
            self.create_local_blob(name)
        net = self._nets[netdef.name] = Net(netdef, self, strict=strict, level=level)
        return net

    def net(self, name: str):
        try:
            return self._nets[name]
        except KeyError:
            raise NetError(f"no net named {name!r} has been created{did_you_mean(name, self._nets)}") from None

    def nets(self) -> list[str]:
        return sorted(self._nets)

    def run_net(self, name, iterations: int = 1) -> None:
        net = self.net(name if isinstance(name, str) else name.name)
        for _ in range(iterations):
            net.run()

    def run_net_once(self, netdef) -> None:
        from .executor import Net

        Net(netdef, self).run()

    def run_operator_once(self, opdef) -> None:
        from ..io.proto import NetDef

        netdef = NetDef(name=opdef.type or "op")
        netdef.op.add().CopyFrom(opdef)
        self.run_net_once(netdef)

    def run_plan(self, plan, **options) -> None:
        from .plan import run_plan

        limit = self.blas_threads()   # a plan's nets sit one level down: hold BLAS here, once for the whole plan
        if limit is None:
            run_plan(plan, self, **options)
        else:
            with limit:
                run_plan(plan, self, **options)


class ScopeWorkspace(Workspace):
    """A Do op's workspace. It has no parent chain: it sees its own blobs and the outer blobs bound into it under
    inner names (Caffe2's forwarded blobs); it shares the outer workspace's device mode, strictness and random
    generator, and its policy: the limits and the log of files written (a model's nets in a Do meet the same
    --max-blob-bytes, file root and write budget)."""

    def __init__(self, outer: Workspace):
        super().__init__(None, gpu=outer.gpu, strict=outer.strict, check_nan=outer.check_nan, limits=outer.limits,
                         profiler=outer.profiler, reporter=outer.reporter)
        self.rng, self.written, self.waits, self.shared = outer.rng, outer.written, outer.waits, outer.shared
        self.forwarded: dict[str, Blob] = {}   # inner name -> the outer blob it stands for
        self._copies: dict[str, Blob] = {}     # inner name -> its local copy (copy_external_blobs), kept for reuse

    def forward(self, bindings: dict[str, Blob], replace_local: bool) -> None:
        """Bind outer blobs under inner names. A local blob of such a name is dropped (a forward Do, Caffe2's
        pushForwardWorkspace) or kept (a gradient Do reads the copy its forward Do saved)."""
        stale = False
        for inner, blob in bindings.items():
            current = self._blobs.get(inner)
            if current is blob:
                continue
            if inner not in self.forwarded and current is not None and not replace_local:
                continue
            stale |= inner in self.forwarded   # bound before to another outer blob: rebind the nets here
            self._blobs[inner] = self.forwarded[inner] = blob
        if stale:
            self._nets.clear()

    def copy_forwarded(self, names) -> None:
        """Replace the bindings of `names` by local copies of their current values (copy_external_blobs)."""
        for name in names:
            outer = self.forwarded.pop(name, None)
            if outer is None:
                continue
            copy = self._copies.setdefault(name, Blob(name))
            value = outer.value
            copy.value = value.copy() if hasattr(value, "copy") else value
            self._blobs[name] = copy

    def has_local(self, name: str) -> bool:
        return name in self._blobs and name not in self.forwarded
