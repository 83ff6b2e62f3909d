"""The operator registry: one record per operator type, made by the @op decorator.

A record says everything about an op: arity, declared arguments (kind and default), in-place rules,
kernel (a pure function of arrays), optional GPU kernel, gradient maker, shape function, docstring.
Kernels are called as kernel(xp, *inputs, **args) -> array or tuple of arrays; ops that run sub-nets
or keep per-op state declare context=True and are called as kernel(ctx, xp, *inputs, **args).

Records are closed: each is complete when @op makes it, and importing stepnet.ops freezes the registry
(registering afterwards raises). Tests change records only through two hooks, `patched` and `temporary`
(context managers, wrapped as fixtures in tests/conftest.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..core.errors import ArgumentError, UnknownOpError, did_you_mean

REQUIRED = object()
ANY_INPLACE = "any"

# What the kinds read from an Argument: kind -> accepted fields.
KIND_FIELDS = {
    "int": ("i",), "bool": ("i",), "float": ("f",), "num": ("f", "i"), "str": ("s",),
    "ints": ("ints",), "floats": ("floats",), "nums": ("floats", "ints"), "strs": ("strings",),
    "net": ("n", "s"), "nets": ("nets",), "tensor": ("t",), "tensors": ("tensors",), "any": (),
}
REPEATED = {"ints", "floats", "nums", "strs", "nets", "tensors"}

# No gradient kinds, after Caffe2: NO_GRADIENT (nothing flows back), SHOULD_NOT_DO_GRADIENT (asking is an
# error), GRADIENT_NOT_IMPLEMENTED_YET (asking is an error that says so).
NO_GRADIENT = "no_gradient"
SHOULD_NOT_DO_GRADIENT = "should_not_do_gradient"
GRADIENT_NOT_IMPLEMENTED = "gradient_not_implemented"


@dataclass(frozen=True)
class Arg:
    kind: str
    default: Any = REQUIRED
    doc: str = ""

    def __post_init__(self):
        if self.kind not in KIND_FIELDS:
            raise ValueError(f"unknown argument kind {self.kind!r}")


def _as_arg(value) -> Arg:
    if isinstance(value, Arg):
        return value
    if value is REQUIRED:
        raise ValueError("a required argument needs an explicit Arg(kind)")
    if isinstance(value, bool):
        return Arg("bool", value)
    if isinstance(value, int):
        return Arg("int", value)
    if isinstance(value, float):
        return Arg("float", value)
    if isinstance(value, str):
        return Arg("str", value)
    raise ValueError(f"give Arg(kind, default) for a default of type {type(value).__name__}")


@dataclass(frozen=True)
class OpSchema:
    type: str
    kernel: Callable
    inputs: tuple[int, float]
    outputs: tuple[int, float]
    args: dict[str, Arg]
    allow_inplace: Any = ANY_INPLACE          # "any", or a frozenset of (input, output) pairs
    enforce_inplace: frozenset = frozenset()  # pairs that must be in place
    context: bool | str = False               # True: called with the op's context; "structure": reads only its own op's
                                              # structure there (output count, net, device), never other blobs
    random: bool = False
    devices: str = "same"                     # "any": inputs may live on another device (copy ops)
    host_inputs: frozenset = frozenset()      # inputs Caffe2 keeps on the CPU even for GPU ops (shapes, sizes)
    host_outputs: frozenset = frozenset()     # outputs a GPU op still writes on the CPU (Concat's split_info)
    gpu_kernel: Callable | None = None
    inplace_kernel: Callable | None = None    # used when every output is an input it may be written over
                                              # (its in-place pairs): may update those arrays in place
    gradient: Any = None                      # a maker function, one of the no-gradient kinds, or None
    shape: Callable | None = None
    alloc: Callable | None = None             # alloc(*inputs, **args) -> [(output, shape, dtype)] it will allocate
    specialize: Callable | None = None        # specialize(*inputs, **args) -> fast(*inputs) for that input signature
    fused_kernel: Callable | None = None      # the kernel with numba's fused arithmetic (Workspace.fused_cells)
    writes_unnamed: bool = False              # a context op that may write blobs it does not name as outputs
                                              # (Load's load_all, Do's mapping, RecurrentNetwork's states, queues)
    shapes_from_inputs: bool = False          # output shapes and dtypes follow from the inputs' shapes and dtypes,
                                              # never from their values (what the compiled runner may buffer)
    grows: str | None = None                  # "shapes" / "values": an output may outgrow the inputs, by their
                                              # shapes and the arguments / by their values too (checked before the
                                              # kernel against the blob limit through `shape`)
    doc: str = ""
    family: str = ""

    def arity_text(self, which: str) -> str:
        lo, hi = self.inputs if which == "inputs" else self.outputs
        if lo == hi:
            return str(lo)
        return f"{lo} or more" if hi == float("inf") else f"{lo} to {hi}"


def _grows(type_: str, grows, shape, shapes_from_inputs: bool):
    if grows not in (None, "shapes", "values"):
        raise ValueError(f"{type_}: grows must be None, 'shapes' or 'values', got {grows!r}")
    if grows and shape is None:
        raise ValueError(f"{type_}: an op that grows its outputs needs a shape function (the executor's size check)")
    if grows == "values" and shapes_from_inputs:   # (the compiled runner would keep one run's sizes)
        raise ValueError(f"{type_}: outputs sized by input values do not follow from the input shapes")
    return grows


def _range(n) -> tuple[int, float]:
    if isinstance(n, int):
        return (n, n)
    lo, hi = n
    return (lo, float("inf") if hi is None else hi)


class Registry:
    """Operator records by type name; closed by freeze() once every family has registered."""

    def __init__(self):
        self._ops: dict[str, OpSchema] = {}
        self._registered: dict[str, OpSchema] = {}   # each record as registered, whatever a test hook patched
        self._frozen = False

    def op(self, type_: str, **record) -> Callable[[Callable], Callable]:
        """Decorator registering kernel under type_ with its full record: inputs=1, outputs=1 (a count or a
        (min, max) pair, None = unbounded), args, inplace, enforce_inplace, context, random, devices,
        host_inputs, host_outputs, gradient, shape, alloc, doc, aliases, inplace_kernel, specialize, fused,
        shapes_from_inputs, grows.
        Raises once the registry is frozen. specialize (for hot CPU ops) is called once per input signature (the
        shape and dtype of every input) with that call's inputs and the arguments, does every check that depends
        only on them and returns fast(*inputs), the kernel without those checks for inputs of that signature
        (None: use the kernel). fused(kernel) -> the kernel with numba's fused arithmetic (LSTM/GRU cells,
        Softmax, Sigmoid, FC of one row, the one-hot FC gradient, Adam), which the executor binds on the CPU in a
        workspace whose fused_cells is on (stepnet.kernels.jit); a `specialize` attribute on it is its own
        specialization, an `inplace` one its own inplace_kernel.
        alloc (for ops whose output sizes a file dictates, such as fills) is called with the kernel's inputs and
        arguments before the kernel and returns (output index, shape, dtype) of each array the kernel will
        allocate; the executor refuses any over the workspace's Limits.max_blob_bytes. shapes_from_inputs: the
        output shapes and dtypes follow from the inputs' shapes and dtypes (never their values), so the compiled
        runner may keep the outputs in buffers; context="structure": a context op that reads only its own op's
        structure from the context. grows ("shapes" or "values"): an output may be larger than the inputs by
        more than a dtype's width (a broadcast, a product of dims, a size argument, lengths): the executor runs
        the shape function on the inputs' specs before the kernel (for "shapes" once per input signature, for
        "values" at every call with the inputs' values) and refuses any output over Limits.max_blob_bytes."""
        def register(kernel: Callable) -> Callable:
            if self._frozen:
                raise RuntimeError(f"cannot register operator {type_}: the registry is frozen once stepnet.ops "
                                   "is imported; register it in a module stepnet.ops imports (FAMILIES)")
            self._add(type_, kernel, **record)
            return kernel
        return register

    def _add(self, type_, kernel, *, inputs=1, outputs=1, args=None, inplace=ANY_INPLACE, enforce_inplace=(),
             context=False, random=False, devices="same", host_inputs=(), host_outputs=(), gradient=None, shape=None,
             alloc=None,
             doc=None, aliases=(), inplace_kernel=None, specialize=None, fused=None,
             shapes_from_inputs=False, writes_unnamed=False, grows=None) -> tuple[str, ...]:
        allow = inplace if inplace == ANY_INPLACE else frozenset(inplace)
        schema = OpSchema(
            type=type_, kernel=kernel, inputs=_range(inputs), outputs=_range(outputs),
            args={k: _as_arg(v) for k, v in (args or {}).items()}, allow_inplace=allow,
            enforce_inplace=frozenset(enforce_inplace), context=context, random=random, devices=devices,
            host_inputs=frozenset(host_inputs), host_outputs=frozenset(host_outputs), inplace_kernel=inplace_kernel,
            gradient=gradient, shape=shape, alloc=alloc, specialize=specialize,
            fused_kernel=None if fused is None else fused(kernel), shapes_from_inputs=shapes_from_inputs,
            writes_unnamed=writes_unnamed,
            grows=_grows(type_, grows, shape, shapes_from_inputs),
            doc=(doc or kernel.__doc__ or "").strip(),
            family=kernel.__module__.rsplit(".", 1)[-1])
        names = (type_, *aliases)
        for name in names:
            if name in self._ops:
                raise ValueError(f"operator {name} registered twice")
        for name in names:
            record = schema if name == type_ else dataclasses.replace(schema, type=name)
            self._ops[name] = self._registered[name] = record
        return names

    def freeze(self) -> None:
        """Close the registry: every record is complete, and registering another op raises."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    # ------------------------------------------------------------------------------------- test hooks
    @contextlib.contextmanager
    def patched(self, type_: str, **fields) -> Iterator[OpSchema]:
        """Test hook: type_'s record with `fields` (OpSchema fields: kernel, shape, inplace_kernel, ...)
        replaced while the context lasts; the original record is restored on exit."""
        saved = self.get(type_)
        if "kernel" in fields:         # a specialization or fused form belongs to the kernel it was written for
            fields.setdefault("specialize", None)
            fields.setdefault("fused_kernel", None)
        self._ops[type_] = dataclasses.replace(saved, **fields)
        try:
            yield self._ops[type_]
        finally:
            self._ops[type_] = saved

    @contextlib.contextmanager
    def temporary(self, type_: str, kernel: Callable, **record) -> Iterator[OpSchema]:
        """Test hook: a throwaway op registered (frozen or not) with op()'s record while the context lasts,
        removed on exit."""
        names = self._add(type_, kernel, **record)
        try:
            yield self._ops[type_]
        finally:
            for name in names:
                del self._ops[name], self._registered[name]

    def get(self, type_: str, at=None) -> OpSchema:
        """type_'s record; an UnknownOpError (placed at `at`, the op asking: net, index, type) if there is none."""
        try:
            return self._ops[type_]
        except KeyError:
            raise UnknownOpError(f"unknown operator type {type_!r}{did_you_mean(type_, self._ops)}", at=at) from None

    def registered(self, type_: str) -> OpSchema:
        """type_'s record as its module registered it (not as a test hook has patched it): a compiled form
        written for an op's kernel applies only while the op has that kernel."""
        return self._registered[type_]

    def __contains__(self, type_: str) -> bool:
        return type_ in self._ops

    def __iter__(self):
        return iter(sorted(self._ops))

    def __len__(self):
        return len(self._ops)

    def schemas(self):
        return [self._ops[k] for k in sorted(self._ops)]


REGISTRY = Registry()
op = REGISTRY.op


def read_arg(kind: str, argument, where: str, level: int = 0) -> Any:
    """The value of a protobuf Argument read as `kind`; a wrong field is an ArgumentError. `level`: the nesting
    level of the net holding the argument, which a net given as text adds to its own depth."""
    from ..io.proto import argument_value, parse_text
    from ..io.validate import NET_IN_ARG, decode_text

    name = argument.name
    if kind == "any":
        return argument_value(argument)
    fields = KIND_FIELDS[kind]
    present = [f for f in ("f", "i", "s", "n", "t") if argument.HasField(f)]
    present += [f for f in ("floats", "ints", "strings", "nets", "tensors", "qtensors") if len(getattr(argument, f))]
    if not present:
        if kind in REPEATED:
            return []
        raise ArgumentError(f"argument {name!r} has no value (expected {_kind_text(kind)})", at=where)
    got = present[0]
    if got not in fields:
        raise ArgumentError(f"argument {name!r} must be {_kind_text(kind)}, "
                            f"but the file stores {_field_text(got)}", at=where)
    value = argument_value(argument)
    if kind == "bool":
        return bool(value)
    if kind == "float":
        return float(value)
    if kind in ("nums", "floats"):
        return [float(v) for v in value]
    if kind == "net" and got == "s":
        where = f"{where}, argument {name!r}"
        text = value if isinstance(value, str) else decode_text(value, where, "the net's text")
        return parse_text(text, "net", where=where, depth=level + NET_IN_ARG)
    return value


_KIND_TEXT = {"int": "an integer (field i)", "bool": "a boolean (field i)", "float": "a float (field f)",
              "num": "a number (field f or i)", "str": "a string (field s)", "ints": "a list of integers (ints)",
              "floats": "a list of floats (floats)", "nums": "a list of numbers", "strs": "a list of strings (strings)",
              "net": "a NetDef (field n, or text in s)", "nets": "a list of NetDefs (nets)",
              "tensor": "a TensorProto (field t)", "tensors": "a list of TensorProtos (tensors)"}
_FIELD_TEXT = {"f": "a float (f)", "i": "an integer (i)", "s": "a string (s)", "n": "a NetDef (n)",
               "t": "a tensor (t)", "floats": "a list of floats", "ints": "a list of integers",
               "strings": "a list of strings", "nets": "a list of NetDefs", "tensors": "a list of tensors",
               "qtensors": "a list of quantized tensors"}


def _kind_text(kind):
    return _KIND_TEXT[kind]


def _field_text(f):
    return _FIELD_TEXT[f]


@dataclass
class KnownHints:
    """Arguments that real files carry for engines and executors stepnet does not have: accepted silently."""
    names: frozenset = frozenset({
        "use_cudnn", "cudnn_exhaustive_search", "exhaustive_search", "ws_nbytes_limit", "deterministic",
        "enable_tensor_core", "enable_rnn_executor", "rnn_executor_debug", "order", "shared_buffer", "engine",
    })
    prefixes: tuple = ("rnn_executor.", "rnn_dependency.")
    suffixes: tuple = (".rename",)  # memonger's renaming map on RecurrentNetworkGradient, read from the OperatorDef

    def __contains__(self, name: str) -> bool:
        return (name in self.names or name.startswith(self.prefixes)
                or name.endswith(self.suffixes))


KNOWN_HINTS = KnownHints()
