"""Export a Caffe2 init/predict net pair to one ONNX model (`stepnet export-onnx`, `export_onnx`).

Initializers are the values the init net makes (stepnet runs it, so every fill works) and any `params` given;
graph inputs are the blobs named in `inputs` (dims, a TensorSpec or an array; dtype from the init net's fill
or float32); graph outputs are the predict net's external outputs or `outputs`. A net with a training part is
cut before its first gradient or optimizer op; only the ops the outputs need are converted (the rest are named
in the notes), each by the converter table (table.py) inside convert.NetConverter. The model is checked with
onnx.checker (full_check) before it is returned.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...core.version import VERSION
from ...io import proto
from ...core.errors import FileFormatError, StepnetError, did_you_mean
from ...io.files import describe_size
from ...ops.binding import op_label
from ...graph.view import Graph
from ...ops import REGISTRY
from ...core.spec import TensorSpec, spec
from .errors import ExportError, InputDimsError, MissingWeightError, OpsetError, require
from .emit import MIN_OPSET, Emitter, to_tensor, value_info
from .convert import ModelState, NetConverter, needs, version_before
from .table import table

MAX_INLINE_BYTES = 2**31 - 2**20   # weights one .onnx file holds: protobuf serializes no message of 2 GiB (less
                                   # 1 MiB for the graph); more need --external-data
TRAINING_FAMILIES = {"optim", "sparse_optim", "lr"}
TRAINING_TYPES = {"Iter", "AtomicIter"}
FORWARD_TYPES = {"StopGradient", "ZeroGradient"}   # named like gradient ops, but forward ops


@dataclass
class ExportResult:
    """An exported model: graph inputs and outputs by blob name, and what the export left out or changed."""
    model: object                                   # onnx.ModelProto
    inputs: list[str]
    outputs: dict[str, str]                         # blob -> graph output name (the blob's, unless taken)
    opset: int
    notes: list[str] = field(default_factory=list)

    external_data: bool = False                     # the weights go to PATH.data beside the .onnx (save)

    def save(self, path) -> None:
        """Write the model to path atomically; with external_data its weights go to `path.data` (ONNX's external
        data, in one file beside it; the model is then checked from the files and self.model refers to them)."""
        path = Path(path)
        if not self.external_data:
            proto.atomic_write(path, self.model.SerializeToString())
            return
        save_external(self.model, path)


def default_opset() -> int:
    """The newest opset that both the installed onnx and onnxruntime (when installed) implement."""
    onnx = require("onnx")
    newest = onnx.defs.onnx_opset_version()
    try:
        from onnxruntime.capi import _pybind_state as ort
        kernels = ort.get_all_opkernel_def()
        newest = min(newest, max(k.version_range[0] for k in kernels if k.domain in ("", "ai.onnx")))
    except Exception:  # noqa: BLE001 - no onnxruntime, or another build of it: onnx's newest opset
        pass
    return newest


def _opset(opset: int | None) -> int:
    if opset is None:
        return default_opset()
    newest = require("onnx").defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise OpsetError(f"opset {opset} is outside what the exporter writes ({MIN_OPSET} to {newest}, the newest "
                         "the installed onnx knows); choose --opset in that range")
    return opset


def is_training(opdef) -> bool:
    """A gradient, optimizer, learning-rate or iteration-counter op: where a net's training part begins."""
    if opdef.type in FORWARD_TYPES:
        return False
    if opdef.is_gradient_op or opdef.type.endswith(("Gradient", "Grad")) or opdef.type in TRAINING_TYPES:
        return True
    fam = REGISTRY.get(opdef.type).family if opdef.type in REGISTRY else ""
    return fam.endswith("_grad") or fam in TRAINING_FAMILIES


def forward_part(net) -> tuple[list, str | None]:
    """(the ops before the first training op, a note naming what was left out or None). Fills just before it
    whose outputs only the training part reads (the gradient seed AddGradientOperators puts there: ConstantFill of
    the loss's shape) belong to the training part."""
    ops = list(net.op)
    cut = next((i for i, o in enumerate(ops) if is_training(o)), len(ops))
    if cut == len(ops):
        return ops, None
    while cut and _seeds_training(ops[cut - 1], ops[cut:], net):
        cut -= 1
    left = Counter(o.type for o in ops[cut:])
    kinds = ", ".join(f"{t}×{c}" for t, c in sorted(left.items()))
    return ops[:cut], (f"net {net.name!r} has a training part: exported its forward part (ops #0-#{cut - 1}); "
                       f"left out ops #{cut}-#{len(ops) - 1} ({kinds})")


def _seeds_training(opdef, training: list, net) -> bool:
    """Whether a fill op's outputs are read by the training ops alone (and are not the net's outputs)."""
    if opdef.type not in REGISTRY or REGISTRY.get(opdef.type).family != "fill" or not opdef.output:
        return False
    read = {name for o in training for name in o.input}
    return all(out in read and out not in net.external_output for out in opdef.output)


def _as_spec(name: str, value, fill) -> TensorSpec:
    """An input's TensorSpec from dims, a TensorSpec or an array; dtype from the init net's fill or float32."""
    if isinstance(value, TensorSpec):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return TensorSpec(tuple(value.shape), np.dtype(value.dtype))
    if value is None:
        if fill is None:
            raise InputDimsError(f"input {name!r} has no dims and the init net does not fill it, so none can be "
                                 f"inferred; give them with --input {name}=D1,D2,...")
        return TensorSpec(tuple(fill.shape), fill.dtype)
    dtype = fill.dtype if fill is not None and fill.dtype.kind != "O" else np.float32
    return spec(tuple(value), dtype)


def _load(net, kind="net"):
    return net if isinstance(net, proto.NetDef) or net is None else proto.load(net, kind=kind)


def _weight(name: str, value) -> np.ndarray:
    """A weight as an array; an Int8 tensor (from an Int8 fill, or a checkpoint) is an ExportError: the
    exporter writes float and integer tensors, and no ONNX node here takes Caffe2's Int8 layout."""
    from ...core.int8 import Int8Tensor
    if isinstance(value, Int8Tensor):
        raise ExportError(f"blob {name!r} is an Int8 tensor ({value.summary(3)}); Int8 nets do not export to ONNX "
                          "(dequantize the weights, or export the float model)")
    return np.asarray(value)


def _init_values(init, used: set) -> dict:
    """The arrays the init net makes (run by stepnet, so any fill works) of the blobs in `used`."""
    if init is None:
        return {}
    from ...core.limits import Limits
    from ...runtime.workspace import Workspace

    ws = Workspace(limits=Limits(writes=False))   # the export writes the .onnx and nothing else
    ws.run_net_once(init)
    out = {}
    for name, v in Graph.of(init).final.items():
        if v and name in used and ws.has(name) and hasattr(ws.get_blob(name).value, "shape"):
            out[name] = _weight(name, ws.fetch(name))
    return out


class _Plan:
    """Which ops and values of the forward part the outputs need, cut at the given inputs."""

    def __init__(self, graph: Graph, outputs: list[str], fed: dict, convs, net_name: str = ""):
        self.graph, self.convs, self.net_name = graph, convs, net_name
        self.fed_keys = {self._fed_key(name) for name in fed}
        targets = [(b, graph.final.get(b, 0)) for b in outputs]
        self.needed, self.wanted = needs(graph, targets, self.fed_keys, self.implicit)

    def _fed_key(self, name: str):
        g = self.graph
        read0 = name in g.external_input or (name, 0) in g.consumers
        return (name, 0) if read0 or not g.final.get(name) else (name, 1)

    def implicit(self, i: int) -> list:
        """(blob, version) the op reads beyond its inputs (what its step nets read from the outer net)."""
        op = self.graph.ops[i]
        conv = self.convs.get(op.type)
        if conv is None or conv.reads is None:
            return []
        try:
            reads = conv.reads(op)
        except StepnetError as e:          # (a malformed argument, read before the op's converter checks it)
            raise e.located(op_label(self.net_name, i, op)) from None
        return [(n, version_before(self.graph, n, i)) for n in reads]

    def readers(self, name: str) -> list[tuple[int, int]]:
        """(op, input slot) of the needed ops reading version 0 of name."""
        return [(i, j) for i in sorted(self.needed) for j, (n, v) in
                enumerate(zip(self.graph.ops[i].input, self.graph.in_versions[i])) if n == name and v == 0]


def _missing(net, plan: _Plan, name: str, have_init: bool) -> Exception:
    reads = plan.readers(name)
    where = ", ".join(f"op #{i} ({plan.graph.ops[i].type}) input {j}" for i, j in reads[:3]) or "a step net"
    if reads and all(j > 0 for _, j in reads):
        source = "the init net does not fill" if have_init else "no init net was given to fill"
        return MissingWeightError(f"net {net.name!r}: {source} {name!r}, a weight read by {where}; give the init "
                                  "net that goes with this predict net (stepnet synth-init makes random weights), "
                                  f"or if it is data, its dims with --input {name}=D1,D2,...")
    return InputDimsError(f"net {net.name!r}: input {name!r} (read by {where}) has no dims and none can be "
                          f"inferred; give them with --input {name}=D1,D2,...[:dtype]")


def export_onnx(predict, init=None, *, inputs: dict | None = None, outputs=None, params: dict | None = None,
                opset: int | None = None, rnn: str = "auto", check: bool = True,
                external_data: bool = False) -> ExportResult:
    """Export a predict net (NetDef or path) with its init net (NetDef, path or None) to an ONNX model.

    inputs: {blob: dims, TensorSpec, array or None (dims from the init net's fill)} — the graph inputs; a blob
    an op of the net writes cuts the net there (its first write is fed). outputs: blob names (default: the
    predict net's external outputs). params: more constant values {blob: array} (e.g. a checkpoint's).
    opset: default `default_opset()`. rnn: "auto" exports a RecurrentNetwork that is exactly an LSTM layer as an
    ONNX LSTM node, "scan" every RecurrentNetwork as a Scan. external_data: the result's save writes the weights
    beside the .onnx (needed when they take more than MAX_INLINE_BYTES; the check then runs on the saved files).
    Raises an ExportError subclass naming the op or blob and the fix.
    """
    onnx = require("onnx")
    from onnx import helper

    predict, init = _load(predict), _load(init)
    opset = _opset(opset)
    ops, cut_note = forward_part(predict)
    graph = Graph(ops, predict.external_input)
    # weights the exported ops read or the outputs name (a checkpoint may hold many more)
    used = set(graph.blobs()) | set(outputs or []) | set(predict.external_output)
    consts = _init_values(init, used)
    consts.update({k: _weight(k, v) for k, v in (params or {}).items() if k in used})
    fed = {name: _as_spec(name, v, consts.get(name)) for name, v in (inputs or {}).items()}
    unknown = [n for n in fed if n not in graph.blobs()]
    if unknown:
        raise ExportError(f"net {predict.name!r} has no blob {unknown[0]!r} to take as an input"
                          f"{did_you_mean(unknown[0], graph.blobs())}; --input names blobs the net's ops read")
    written = {k[0] for k in graph.writer}
    declared = list(predict.external_output)
    outs = list(outputs) if outputs else [b for b in declared if b in written or b in fed]
    if not outs:
        raise ExportError(f"net {predict.name!r} has no outputs to export (it declares "
                          f"{'only ones its training part makes' if declared else 'none'}); name the blobs to "
                          "export with --output NAME")
    for b in outs:
        if b not in written and b not in fed and b not in consts:
            raise ExportError(f"net {predict.name!r}: output {b!r} is not made by the net's forward part; choose "
                              "--output among the blobs its ops write")
    convs = table()
    plan = _Plan(graph, outs, fed, convs, predict.name)
    if rnn not in ("auto", "scan"):
        raise ExportError(f"rnn={rnn!r}: choose 'auto' (LSTM layers as ONNX LSTM) or 'scan'")
    state, e = ModelState(opset), Emitter(opset)
    state.options["rnn"] = rnn
    values = {}
    for key in sorted(k for k in plan.wanted if k[1] == 0 or k in plan.fed_keys):
        name = key[0]
        if name in fed:
            state.specs[e.names.reserve(name)] = fed[name]
        elif name in consts:
            e.const(consts[name], name=name)
        else:
            raise _missing(predict, plan, name, init is not None)
        values[key] = name
    out_names = {}
    for b in outs:   # a graph output keeps its blob's name unless an input or weight has it
        key = (b, graph.final.get(b, 0))
        out_names[key] = values.get(key) or (e.names.reserve(b) if b not in e.names.used
                                             else e.names.fresh(b + "_out"))
    conv = NetConverter(state, e, predict.name or "predict", graph, values, plan.wanted, out_names)
    conv.fed_keys = plan.fed_keys
    conv.run(sorted(plan.needed))
    e.nodes = _live(e.nodes, set(out_names.values()))
    model = _model(helper, e, state, fed, out_names, predict.name or "stepnet", opset, external_data)
    notes = [n for n in (cut_note, *_pruned_note(predict, ops, plan), *state.notes) if n]
    if check and not external_data:
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as err:  # noqa: BLE001 - the checker raises several kinds
            raise ExportError(f"the exported model fails onnx.checker: {str(err).splitlines()[0]}") from None
    return ExportResult(model, list(fed), {k[0]: v for k, v in out_names.items()}, opset, notes, external_data)


def _pruned_note(net, ops, plan: _Plan) -> list[str]:
    left = [o.type for i, o in enumerate(ops) if i not in plan.needed]
    if not left:
        return []
    kinds = ", ".join(f"{t}×{c}" for t, c in sorted(Counter(left).items()))
    return [f"net {net.name!r}: left out {len(left)} op(s) that no exported output needs ({kinds})"]


def _model(helper, e: Emitter, state: ModelState, fed: dict, out_names: dict, name: str, opset: int,
           external_data: bool):
    graph_inputs = [value_info(n, s.dtype, s.shape) for n, s in fed.items()]
    graph_outputs = []
    for (blob, _), n in out_names.items():
        s = state.specs.get(n) or (TensorSpec.of(e.consts[n]) if n in e.consts else None)
        if s is None or s.dtype is None:
            raise ExportError(f"output {blob!r}: its type is not known statically, so the model cannot declare it")
        graph_outputs.append(value_info(n, s.dtype, s.shape))
    produced = {o for node in e.nodes for o in node.output}
    infos = [value_info(n, s.dtype, s.shape) for n, s in state.specs.items()
             if n in produced and n not in set(out_names.values()) and s.dtype is not None and s.dtype != object
             and s.shape is not None and None not in s.shape]
    used = _used_names(e.nodes)
    weights = {n: v for n, v in e.consts.items() if n in used or n in out_names.values()}
    size = sum(_nbytes(v) for v in weights.values())
    if size > MAX_INLINE_BYTES and not external_data:   # before any copy: serializing would fail after minutes
        exact = f" ({size} bytes)" if size >= 1024 else ""
        raise ExportError(f"the model's weights take {describe_size(size)}{exact}, more than one ONNX file "
                          f"holds ({describe_size(MAX_INLINE_BYTES)}: protobuf's 2 GiB limit); export with "
                          "--external-data to write them to a .data file beside the .onnx")
    inits = [to_tensor(n, v) for n, v in weights.items()]
    g = helper.make_graph(e.nodes, name, graph_inputs, graph_outputs, initializer=inits, value_info=infos)
    ids = [helper.make_opsetid("", opset)]
    model = helper.make_model(g, opset_imports=ids, producer_name="stepnet", producer_version=VERSION)
    model.ir_version = helper.find_min_ir_version_for(ids)
    return model


def _nbytes(value) -> int:
    arr = np.asarray(value)
    return sum(len(v) if isinstance(v, bytes) else len(str(v).encode()) for v in arr.reshape(-1)) \
        if arr.dtype == object else arr.nbytes


def save_external(model, path: Path) -> None:
    """onnx.save with the weights in `path.data`, both written whole or not at all (onnx appends to a data file
    already there, so it writes into a fresh directory beside path, checks the model from there, then both files
    replace the old ones); FileFormatError when it cannot write."""
    import os
    import shutil
    import tempfile

    onnx = require("onnx")
    data = path.with_name(path.name + ".data")
    for p in (path, data):
        proto.check_replaceable(p)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as err:
        raise FileFormatError(f"{path}: cannot write ({err.strerror})") from None
    try:
        onnx.save_model(model, tmp / path.name, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=0)
        (tmp / data.name).touch()   # (a model without weights: an empty file, never a stale one)
        try:
            onnx.checker.check_model(str(tmp / path.name), full_check=True)
        except Exception as err:  # noqa: BLE001 - the checker raises several kinds
            raise ExportError(f"the exported model fails onnx.checker: {str(err).splitlines()[0]}") from None
        os.replace(tmp / data.name, data)
        os.replace(tmp / path.name, path)
    except OSError as err:
        raise FileFormatError(f"{path}: cannot write ({err.strerror})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _live(nodes, outputs: set[str]) -> list:
    """The nodes the outputs depend on (a converter may leave some unused, e.g. an FC folded into an LSTM)."""
    live, keep = set(outputs), []
    for node in reversed(nodes):
        if any(o in live for o in node.output):
            keep.append(node)
            live |= _used_names([node])
    return keep[::-1]


def _used_names(nodes) -> set[str]:
    """Every value name the nodes (and their subgraphs) read."""
    used = set()
    for node in nodes:
        used.update(node.input)
        for a in node.attribute:
            if a.HasField("g"):
                used |= _used_names(a.g.node) | {o.name for o in a.g.output}
    return used
