"""The conversion loop shared by the main graph and RecurrentNetwork step nets (Scan bodies).

`NetConverter` walks a net's ops in order over its graph.Graph view: each (blob, version) becomes one ONNX value.
For every op it parses the arguments with the op record (ops.binding.parse_args), looks up the converter in the
table and calls it with an `OpCtx`; ops without a converter whose inputs are all constants (the init net's
values, fills) are computed by stepnet itself at export time. Output specs come from the op records' shape
functions (shapes.infer_op), or from the converter for ops without one (RecurrentNetwork).
"""
from __future__ import annotations

import warnings
from typing import Callable

import numpy as np

from ...ops.binding import check_arity, check_inplace, parse_args
from ...graph.view import Graph
from ...ops import REGISTRY
from ...core.spec import UNKNOWN, TensorSpec
from ...passes.shapes import infer_op
from .emit import Emitter
from .errors import ExportError, OpsetError, UnsupportedOpError
from .table import table, what_to_do

Key = tuple[str, int]


def needs(graph: Graph, targets, stop=frozenset(), implicit=None) -> tuple[set[int], set[Key]]:
    """(the ops producing targets, every (blob, version) they read, targets included), walking back from the
    target versions and stopping at version 0 and at the `stop` versions; implicit(i) lists what op i reads
    beyond its inputs."""
    needed: set[int] = set()
    wanted: set[Key] = set()
    stack = list(targets)
    while stack:
        key = stack.pop()
        if key in wanted:
            continue
        wanted.add(key)
        if key in stop or key[1] == 0 or graph.writer[key] in needed:
            continue
        i = graph.writer[key]
        needed.add(i)
        stack.extend(zip(graph.ops[i].input, graph.in_versions[i]))
        if implicit is not None:
            stack.extend(implicit(i))
    return needed, wanted


def version_before(graph: Graph, name: str, i: int) -> int:
    """The version of `name` that op i sees (how many ops before it wrote it)."""
    return sum(1 for w in graph.writers(name) if w < i)


class ModelState:
    """What every net of one model shares: the opset, the spec of every ONNX value, notes for the user."""

    def __init__(self, opset: int):
        self.opset = opset
        self.specs: dict[str, TensorSpec] = {}
        self.notes: list[str] = []
        self.options: dict = {}   # rnn: "auto" (an LSTM layer as ONNX LSTM) or "scan" (every RNN as a Scan)


class NetConverter:
    """Converts the ops of one net. values: ONNX name of each (blob, version) known before the ops (inputs,
    constants); wanted: the (blob, version) pairs later ops or the graph's outputs read; outputs: the reserved
    ONNX name of each (blob, version) that is a graph output; outer(blob): the ONNX value of a blob the net
    reads but does not define (a step net's outer-scope reads), or None."""

    def __init__(self, state: ModelState, e: Emitter, net_name: str, graph: Graph, values: dict[Key, str],
                 wanted: set[Key], outputs: dict[Key, str] | None = None,
                 outer: Callable[[str], str | None] | None = None):
        self.state, self.e, self.graph = state, e, graph
        self.where = net_name if net_name.startswith("net ") else f"net {net_name!r}"
        self.values, self.wanted, self.outputs = values, wanted, outputs or {}
        self.outer = outer or (lambda name: None)
        self.fed_keys: set[Key] = set()   # versions fed as graph inputs: what their writers make is dropped
        self.needed: set[int] = set()

    def value(self, key: Key) -> str:
        if key not in self.values:
            name = self.outer(key[0]) if key[1] == 0 else None
            if name is None:
                raise ExportError(f"{self.where}: blob {key[0]!r} (version {key[1]}) has no value in the "
                                  "export; nothing before the op reading it makes it")
            self.values[key] = name
        return self.values[key]

    def name_for(self, key: Key) -> str:
        """The ONNX name output (blob, version) gets: its reserved graph-output name, or a fresh one."""
        return self.outputs.get(key) or self.e.names.fresh(key[0])

    def run(self, indices) -> None:
        convs = table()
        self.needed = set(indices)
        for i in indices:
            self.convert(i, convs)

    def convert(self, i: int, convs) -> None:
        opdef = self.graph.ops[i]
        label = f"{self.where}, op #{i} ({opdef.type}{f' {opdef.name!r}' if opdef.name else ''})"
        if opdef.type not in REGISTRY:
            raise UnsupportedOpError(f"stepnet does not know this op, so it cannot export it; "
                                     f"{what_to_do(opdef, '')}", at=label)
        schema = REGISTRY.get(opdef.type)
        check_arity(schema, opdef, label)     # what the executor checks before a kernel runs: converters index
        check_inplace(schema, opdef, label)   # inputs and outputs by the schema's arity
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = parse_args(schema, opdef, label, strict=False)
        names = [self.value((n, v)) for n, v in zip(opdef.input, self.graph.in_versions[i])]
        ctx = OpCtx(self, i, opdef, schema, args, names, label)
        conv = convs.get(opdef.type)
        self.e.prefix = (opdef.output[0] if opdef.output else opdef.type) or opdef.type
        if conv is None or (schema.family in ("fill", "random_fill") and not opdef.input):
            self.fold(ctx, conv)
        else:
            if self.state.opset < conv.opset:
                raise OpsetError(f"its ONNX form needs opset {conv.opset}, but the export is at opset "
                                 f"{self.state.opset}; export with --opset {conv.opset} or newer", at=label)
            with warnings.catch_warnings():   # argument warnings were given (or not) when the args were parsed
                warnings.simplefilter("ignore")
                ctx.inferred()   # the op record's shape checks first: a converter trusts the shapes and args it reads
            conv.fn(ctx)
        self.finish(ctx)

    def fold(self, ctx: "OpCtx", conv) -> None:
        """An op without a converter (or a fill) whose inputs are all constants: computed here by stepnet."""
        values = [ctx.value(j) for j in range(len(ctx.inputs))]
        if ctx.schema.random or any(v is None for v in values) or ctx.schema.context:
            if conv is not None:
                return conv.fn(ctx)
            raise UnsupportedOpError(f"no ONNX counterpart; {what_to_do(ctx.op, ctx.schema.family)}", at=ctx.label)
        from ...core.limits import Limits
        from ...runtime.workspace import Workspace

        ws = Workspace(limits=Limits(writes=False))
        for name, v in zip(ctx.op.input, values):
            ws.feed(name, v)
        ws.run_operator_once(ctx.op)
        for j, name in enumerate(ctx.op.output):
            if ctx.wants(j):
                out = ws.fetch(name)
                if not isinstance(out, np.ndarray):   # an Int8 tensor, a string: no ONNX constant of it here
                    raise UnsupportedOpError(f"output {j} ({name!r}) is a {type(out).__name__}, which "
                                             "has no ONNX constant; export the outputs that do not depend on it",
                                             at=ctx.label)
                ctx.set(j, self.e.const(out), TensorSpec.of(out))

    def finish(self, ctx: "OpCtx") -> None:
        ctx.place_outputs()
        outs = ctx.inferred()
        for j, blob in enumerate(ctx.op.output):
            key = (blob, self.graph.out_versions[ctx.index][j])
            if key in self.fed_keys:
                continue
            name = self.values.get(key)
            if name is None:
                if ctx.wants(j):
                    raise UnsupportedOpError(f"output {j} ({blob!r}) has no ONNX form, but the export "
                                             "needs it; export the outputs that do not depend on it", at=ctx.label)
                continue
            spec = ctx.given.get(j) or outs[j]
            if spec.shape is not None or name not in self.state.specs:
                self.state.specs[name] = spec


class OpCtx:
    """One op being converted: its definition, arguments, input values, and where its outputs go."""

    def __init__(self, conv: NetConverter, index: int, opdef, schema, args: dict, inputs: list[str], label: str):
        self.conv, self.e, self.index, self.op, self.schema = conv, conv.e, index, opdef, schema
        self.args, self.inputs, self.label = args, inputs, label
        self.opset = conv.state.opset
        self.given: dict[int, TensorSpec] = {}
        self._inferred: list[TensorSpec] | None = None
        self.start = len(conv.e.nodes)   # the first node this op emits
        self.pending: list[tuple[str, str]] = []

    # ------------------------------------------------------------------------------------------- inputs
    def x(self, j: int) -> str:
        return self.inputs[j]

    def spec(self, j: int) -> TensorSpec:
        s = self.conv.state.specs.get(self.inputs[j])
        if s is None and self.inputs[j] in self.e.consts:
            s = TensorSpec.of(self.e.consts[self.inputs[j]])
        return s or UNKNOWN

    def shape(self, j: int) -> tuple:
        """Input j's static shape (the export needs every shape it reshapes with)."""
        s = self.spec(j).shape
        if s is None or None in s:
            raise UnsupportedOpError(f"the shape of input {j} ({self.op.input[j]!r}) is not known "
                                     "statically; give the dims of the net's inputs with --input", at=self.label)
        return tuple(s)

    def inferred(self) -> list[TensorSpec]:
        """The output specs the op record's shape function gives (unknown where it has none)."""
        if self._inferred is None:
            specs = [self.spec(j) for j in range(len(self.inputs))]
            args = dict(self.args, rng=None) if self.schema.random else dict(self.args)
            self._inferred = infer_op(self.schema, self.op, specs, args, self.label)
        return self._inferred

    def out_shape(self, j: int = 0) -> tuple | None:
        """Output j's static shape, or None when it is not known."""
        s = self.inferred()[j].shape if j < len(self.inferred()) else None
        return None if s is None or None in s else tuple(s)

    def meta(self, j: int):
        """Input j as a shape-only stand-in for an array (what the op records' check helpers take)."""
        from ...ops.base import Meta
        self.shape(j)
        return Meta(self.spec(j))

    def dtype(self, j: int):
        d = self.spec(j).dtype
        return np.dtype(d) if d is not None else np.dtype(np.float32)

    def value(self, j: int):
        """Input j's value when it is a constant (init net value, fill), else None."""
        v = self.e.consts.get(self.inputs[j])
        if v is None and self.spec(j).value is not None:
            v = np.asarray(self.spec(j).value)
        return v

    # ------------------------------------------------------------------------------------------- outputs
    def key(self, j: int) -> Key:
        return (self.op.output[j], self.conv.graph.out_versions[self.index][j])

    def wants(self, j: int) -> bool:
        return j < len(self.op.output) and self.key(j) in self.conv.wanted

    def out(self, j: int) -> str:
        """The ONNX name for output j (allocated once)."""
        key = self.key(j)
        if key in self.conv.fed_keys:
            return self.e.fresh("unused")
        if key not in self.conv.values:
            self.conv.values[key] = self.conv.name_for(key)
        return self.conv.values[key]

    def set(self, j: int, name: str, spec: TensorSpec | None = None) -> None:
        """Output j is the value `name` (an Identity when output j is a graph output of another name)."""
        key = self.key(j)
        if key in self.conv.fed_keys:
            return
        reserved = self.conv.outputs.get(key)
        if reserved is not None and reserved != name:
            self.pending.append((name, reserved))   # renamed or copied once the op's nodes are all there
            name = reserved
        self.conv.values[key] = name
        if spec is not None:
            self.given[j] = spec

    def place_outputs(self) -> None:
        """Values set as graph outputs of other names: the node this op made them with is renamed when nothing
        else reads them, else an Identity copies them."""
        mine = self.e.nodes[self.start:]
        kept = {self.conv.values.get(self.key(k)) for k in range(len(self.op.output))}   # read by later ops
        done: dict[str, str] = {}
        for name, new in self.pending:
            if name in done:
                self.e.identity(done[name], out=[new])
                continue
            maker = next((nd for nd in mine if name in nd.output), None)
            if maker is None or name in kept or any(name in nd.input for nd in mine):
                self.e.identity(name, out=[new])
            else:
                maker.output[list(maker.output).index(name)] = new
            done[name] = new

    def emit(self, op_type: str, inputs, out=None, n: int = 1, **attrs):
        """A node whose outputs are this op's outputs `out` (an index or a list), or new values."""
        if out is None:
            return self.e.node(op_type, inputs, n=n, **attrs)
        slots = [out] if isinstance(out, int) else list(out)
        return self.e.node(op_type, inputs, out=[self.out(j) for j in slots], **attrs)

    def refuse(self, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{why}", at=self.label)
