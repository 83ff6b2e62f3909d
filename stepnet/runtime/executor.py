"""Bind a NetDef once (registry lookup, arity, arguments, in-place rules, devices, blob bindings), then
run it as a flat loop that only moves arrays."""
from __future__ import annotations

import functools
import sys
import types

import numpy as np

from ..core import backend
from ..core.errors import DeviceError, MissingBlobError, NetError, OpError, did_you_mean
from ..core.limits import check_blob, check_specs
from ..core.spec import TensorSpec
from ..graph.view import Graph
from ..io.validate import MAX_DEPTH, NET_IN_ARG, too_deep_text
from ..ops.binding import (
    check_arity, check_inplace, describe, device_option, failure, op_label, parse_args, store_results,
    writes_over_inputs)
from ..ops.registry import REGISTRY
from ..compiled.program import StepCompiler
from .profile import active_observers, observing
from .steps import StepLoop


class OpContext:
    """What a context op (one that runs sub-nets or keeps per-op state) sees beyond its arrays. device_option
    is the op's effective DeviceOption (its own or its net's; None for the CPU default)."""
    __slots__ = ("net", "workspace", "opdef", "index", "inputs", "outputs", "device", "device_option", "state",
                 "label", "args")

    def __init__(self, net, workspace, opdef, index, inputs, outputs, device, device_option, label, args):
        self.net, self.workspace, self.opdef, self.index = net, workspace, opdef, index
        self.inputs, self.outputs, self.device, self.label, self.args = inputs, outputs, device, label, args
        self.device_option = device_option
        self.state = {}

    def bind(self, netdef, workspace=None, local=()):
        """A sub-net of this op: `netdef` bound once in `workspace` (default: the op's) with this net's
        strictness (Workspace.bind); run it with `.run()`."""
        return (workspace or self.workspace).bind(netdef, local, self.net.strict, self.net.level + NET_IN_ARG)

    def step_loop(self, netdef, local, timestep: str) -> StepLoop:
        """A step net of this op, to run once per timestep in workspaces the op gives (runtime.steps.StepLoop):
        op by op or compiled, as the workspace's compile_steps allows."""
        return StepLoop(netdef, local, timestep, self.net.strict, self.net.level + NET_IN_ARG,
                        self.workspace.compile_steps)


class BoundOp:
    __slots__ = ("schema", "opdef", "index", "inputs", "outputs", "call", "device", "label", "plain", "into")

    def __init__(self, schema, opdef, index, inputs, outputs, call, device, label, plain=None, into=None):
        self.schema, self.opdef, self.index = schema, opdef, index
        self.inputs, self.outputs, self.call, self.device, self.label = inputs, outputs, call, device, label
        self.plain = call if plain is None else plain   # the call without observers (what compiled forms use)
        self.into = into     # a Specialized call that may write the one output into its blob's buffer, or None


def _refs(holder) -> int:
    """References to holder.value, counted the same way for every holder (a blob)."""
    value = holder.value
    return sys.getrefcount(value)


_ALONE = _refs(types.SimpleNamespace(value=np.empty(1)))    # the count of a value nothing else holds


def reusable(blob) -> bool:
    """Whether an op may write its result into the buffer `blob` holds (Caffe2 keeps an output tensor's memory
    from run to run): a writeable numpy array that owns its memory, C-contiguous, and held by nothing but the blob (no
    view of it anywhere, no other blob, no reference a user or another op's inputs kept), so no value anyone
    holds changes under it."""
    if _refs(blob) != _ALONE:      # (first: counted while this frame holds no reference of its own)
        return False
    cur = blob.value
    return (type(cur) is np.ndarray and not blob.view and cur.base is None and cur.flags.c_contiguous
            and cur.flags.writeable)


class Specialized:
    """A bound op's call that checks once per input signature (hot CPU ops with `specialize`, ops that grow
    their outputs by their inputs' shapes): bind once, check once per signature. The first call with a new
    signature (shape and dtype of every input) runs `check` (the blob limit's) and asks the record's
    specialize(*inputs, **args), which does every check that depends only on those and returns the kernel
    without them; later calls of that signature go straight to it. Non-numpy inputs take the checked kernel.
    The (signature, kernel) pair is one attribute, replaced whole: threads running the same bound net (concurrent
    instances of a plan step) never pair one signature with another's kernel."""
    __slots__ = ("call", "specialize", "check", "state")

    def __init__(self, call, specialize, check=None):
        self.call, self.specialize, self.check, self.state = call, specialize, check, (None, None)

    def _kernel(self, values):
        """The kernel for these inputs' signature (checked and specialized on a new one), or None for inputs
        that are not all numpy arrays (after the blob limit's check: they take the checked call)."""
        sig = []
        for v in values:
            if type(v) is not np.ndarray:
                if self.check is not None:
                    self.check(*values)
                return None
            sig.append((v.shape, v.dtype))
        sig = tuple(sig)
        state = self.state
        if sig != state[0]:
            if self.check is not None:
                self.check(*values)
            fast = self.specialize(*values) if self.specialize is not None else None
            state = self.state = (sig, fast or self.call)   # (specialize raises as the kernel would on bad inputs)
        return state[1]

    def __call__(self, *values):
        kernel = self._kernel(values)
        return self.call(*values) if kernel is None else kernel(*values)

    def into(self, out, *values):
        """As a call, but the result written into `out` (returned) where the specialized kernel can write into
        an array of out's shape and dtype (its `writes_into`); otherwise a new result, as a call."""
        kernel = self._kernel(values)
        if kernel is None:
            return self.call(*values)
        if getattr(kernel, "writes_into", None) == (out.shape, out.dtype):
            return kernel(*values, out=out)
        return kernel(*values)


class Net:
    """A NetDef bound to a workspace: every op resolved once; run() is a flat loop. `level`: how deep the net
    is nested in messages (a net in an op's argument is NET_IN_ARG levels below the op's net), at most
    MAX_DEPTH in all, as protobuf's parser allows in one file."""

    def __init__(self, netdef, workspace, *, strict: bool | None = None, level: int = 0):
        if level > MAX_DEPTH:
            raise NetError(too_deep_text(level), at=f"net {netdef.name!r}")
        self.level = level
        self.netdef = netdef
        self.name = netdef.name
        self.workspace = workspace
        self.strict = workspace.strict if strict is None else strict
        self.check_nan = workspace.check_nan
        self._check_sources()
        self.ops = [self._bind(i, opdef) for i, opdef in enumerate(netdef.op)]
        self.mixed_devices = any(not b.device.is_cpu for b in self.ops)
        # a top-level net run many times runs compiled once its inputs' signature holds
        self.compiler = StepCompiler(workspace.compile_steps, main=True) if level == 0 else None
        self.observers: list = []    # profile.Observer hooks on this net's runs (a net with some runs op by op)

    def _check_sources(self) -> None:
        """Caffe2's NetBase checks: with external inputs declared, every op input needs a source; declared
        external outputs must be produced (always)."""
        nd = self.netdef
        graph = Graph.of(nd)
        if nd.external_input:
            declared = set(nd.external_input)
            for name, i in graph.read_before_written().items():
                if name not in declared:
                    raise NetError(f"source for input {name!r} is unknown: it "
                                   "is neither an external_input of the net nor an output of an earlier op",
                                   at=op_label(self.name, i, nd.op[i]))
        missing = [o for o in nd.external_output if o not in graph.final]
        if missing:
            raise NetError(f"external_output {', '.join(map(repr, missing))} is produced by no op",
                           at=f"net {self.name!r}")

    def _bind(self, index: int, opdef) -> BoundOp:
        ws = self.workspace
        label = op_label(self.name, index, opdef)
        do = device_option(opdef, self.netdef)
        if do is not None and do.node_name:
            raise NetError(f"device_option.node_name is {do.node_name!r}; it must be "
                           "empty at execution time (it is a partitioning hint): clear it to run the net here",
                           at=label)
        schema = REGISTRY.get(opdef.type, at=label)
        check_arity(schema, opdef, label)
        check_inplace(schema, opdef, label)
        args = parse_args(schema, opdef, label, self.strict, self.level)
        inputs = []
        for name in opdef.input:
            blob = ws.find(name)
            if blob is None:
                raise MissingBlobError(f"input blob {name!r} does not exist"
                                       f"{did_you_mean(name, ws.blobs())}; run the net that makes it first, "
                                       "or feed it", at=label)
            inputs.append(blob)
        outputs = [ws.create_blob(name) for name in opdef.output]
        device = backend.resolve(do, ws.gpu)
        xp = backend.array_module(device)
        kernel = schema.gpu_kernel if (schema.gpu_kernel and not device.is_cpu) else schema.kernel
        if schema.fused_kernel is not None and device.is_cpu:
            kernel = schema.fused_kernel if ws.jit_kernels() else kernel
        if schema.inplace_kernel and writes_over_inputs(schema, opdef):
            # Caffe2 writes such an op's results into those inputs' buffers (a fused kernel may carry its own)
            kernel = getattr(kernel, "inplace", None) or schema.inplace_kernel
        if not device.is_cpu and device.index:
            kernel = _on_device(kernel, device)
        if schema.random:
            args["rng"] = (np.random.default_rng(do.random_seed)
                           if do is not None and do.HasField("random_seed") else ws.rng)
        if schema.context:
            ctx = OpContext(self, ws, opdef, index, inputs, outputs, device, do, label, args)
            call = functools.partial(kernel, ctx, xp, **args)
        else:
            call = functools.partial(kernel, xp, **args)
        check = _size_check(schema, args, ws.limits.max_blob_bytes, label, list(opdef.output))
        specialize = (schema.specialize if kernel is schema.kernel else    # a fused kernel may carry its own
                      getattr(kernel, "specialize", None) if kernel is schema.fused_kernel else None)
        once = device.is_cpu and not schema.context and not schema.random    # checks once per input signature
        by_shapes = check is not None and schema.alloc is None and schema.grows == "shapes" and once
        if check is not None and not by_shapes:
            call = _checked(call, check)
        elif once and (by_shapes or specialize is not None):
            call = Specialized(call, None if specialize is None else functools.partial(specialize, **args),
                               check)
        plain = call
        # only records whose specialized kernels may write into a buffer (FC) ask, per run, whether one is free
        into = call if (type(call) is Specialized and len(outputs) == 1
                        and getattr(specialize, "writes_into", False)) else None
        if ws.profiler is not None:   # opt-in timing, chosen once here: nets without a profiler run unchanged
            call = ws.profiler.timed(call, self.name, index, opdef.type)
            into = None
        return BoundOp(schema, opdef, index, inputs, outputs, call, device, label, plain, into)

    # ----------------------------------------------------------------------------- running
    def run(self) -> None:
        """Run every op once; a top-level net holds BLAS at the workspace's `threads` meanwhile."""
        limit = self.workspace.blas_threads() if self.level == 0 and self.workspace.threads is not None else None
        if limit is None:
            self._run()
            return
        with limit:
            self._run()

    def _run(self) -> None:
        if self.observers:
            self._run_observed()
            return
        compiler = self.compiler
        if compiler is None:
            self.run_ops()
        elif not (compiler.start(self) and compiler.run(self)):
            compiler.interpret(self)

    def _run_observed(self) -> None:
        """A run told to the net's observers (profile.Observer), op by op: nets its ops run report their ops
        to them too."""
        observers = tuple(self.observers)
        for o in observers:
            o.net_started(self)
        with observing(observers):
            self.run_ops()
        for o in observers:
            o.net_stopped(self)

    def run_ops(self, trace: list | None = None, start: int = 0) -> None:
        """The flat loop: per bound op, read its input blobs, call it, store its results. trace: a list to get
        each op's (input values, output values) as the op saw and left them (what a compiled program is built
        from: a blob written again later holds another op's value at the end). start: the first op to run (the
        rest of a run its compiled routine began)."""
        check, check_nan, limit = self.mixed_devices, self.check_nan, self.workspace.limits.max_blob_bytes
        observers = active_observers()
        for bop in (self.ops if not start else self.ops[start:]):
            values = [b.value for b in bop.inputs]
            if check:
                _place(bop, values)
            if observers:
                for o in observers:
                    o.op_started(self, bop.index, bop.opdef.type)
            try:
                into = bop.into
                if into is not None and reusable(bop.outputs[0]):
                    result = into.into(bop.outputs[0].value, *values)
                else:
                    result = bop.call(*values)
            except Exception as e:  # noqa: BLE001 - any kernel failure becomes an error naming the op
                error = failure(bop, values, e)
                if error is e:
                    raise
                raise error from e
            if result is not None:
                outs = bop.outputs
                if (type(result) is np.ndarray and len(outs) == 1 and not outs[0].view
                        and result.nbytes <= limit):
                    outs[0].value = result          # the common case of store_results, inline
                else:
                    store_results(bop, values, result, limit)
            if check_nan:
                _check_finite(bop)
            if observers:
                for o in observers:
                    o.op_stopped(self, bop.index, bop.opdef.type)
            if trace is not None:
                trace.append((values, [b.value for b in bop.outputs]))


def _size_check(schema, args: dict, limit: int, label, outputs: list[str]):
    """check(*inputs) refusing, before the kernel, an output over the blob limit: those the record's `alloc`
    lists, or for a record that `grows`, those its shape function gives for the inputs' specs (with their
    values for grows="values"); None for other ops (their results meet the limit when stored)."""
    if schema.alloc is not None:
        alloc = functools.partial(schema.alloc, **args)

        def check(*values):
            for i, shape, dtype in alloc(*values):
                check_blob(limit, outputs[i], shape, dtype, label)
        return check
    if schema.grows is None:
        return None
    shape_fn, with_values = functools.partial(schema.shape, **args), schema.grows == "values"

    def check(*values):
        if all(hasattr(v, "shape") for v in values):     # (other values: the kernel's own error)
            check_specs(limit, outputs, shape_fn([TensorSpec.of(v, with_values) for v in values]), label)
    return check


def _checked(call, check):
    """call, preceded by check at every call."""
    def checked(*values):
        check(*values)
        return call(*values)
    checked.call = call      # (the plain call, as Specialized keeps it: compiled forms read its arguments)
    return checked


def _on_device(kernel, device):
    """kernel run with `device` current (backend.device_scope): the arrays it makes from nothing (zeros, a
    result of host-side sizes) go to the op's device, not device 0."""
    @functools.wraps(kernel)
    def run(*args, **kwargs):
        with backend.device_scope(device):
            return kernel(*args, **kwargs)
    return run


def _place(bop, values: list) -> None:
    """The op's input values where its kernel can read them (in place in `values`): on the op's device, or on
    the host where its record reads that input there (host_inputs); a one-element host array (a scalar, which
    Caffe2's device ops read from either side) is copied to the op's device. Any other input on another device
    is a DeviceError, before the kernel."""
    if bop.schema.devices == "any":
        return
    host_ok = bop.schema.host_inputs
    for i, (name, v) in enumerate(zip(bop.opdef.input, values)):
        dev = backend.device_of(v)
        if dev is None or dev == bop.device or (dev.is_cpu and i in host_ok):
            continue
        if dev.is_cpu and v.size == 1:
            values[i] = backend.to_device(v, bop.device)
            continue
        raise DeviceError(f"input {name!r} is on {dev} but the op runs on {bop.device}; "
                          f"copy it first (CopyCPUToGPU / CopyGPUToCPU)", at=bop.label)


def _check_finite(bop) -> None:
    for blob in bop.outputs:
        v = blob.value
        if not backend.all_finite(v):  # a floating array of any backend (numpy, CuPy, emulated)
            bad = "NaN" if backend.any_nan(v) else "Inf"
            raise OpError(f"produced {bad} in output {blob.name!r} ({describe(v)})", at=bop.label, sep=" ")
