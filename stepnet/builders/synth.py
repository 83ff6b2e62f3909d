"""Random weights for weightless predict nets: an init net of fill ops shaped from the predict net itself.

Model-zoo predict nets come without their (large) init nets. synth_init walks the predict net in order,
tracking every blob's shape (the op records' shape functions, or one run of the op on placeholder inputs
where a record has none), and shapes each parameter from the op that first reads it and that op's data
input. The result runs the architecture end to end on random weights: good for timing, smoke tests and
checking that a file loads, never for predictions.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

from ..io import proto
from . import synth_widths as sw
from .synth_rules import RULES, Fill, Site, he
from ..core.errors import ArgumentError, StepnetError, did_you_mean
from ..ops.binding import check_arity, op_label, parse_args
from ..graph.view import Graph, nested_nets
from ..ops import REGISTRY
from ..core.spec import UNKNOWN, TensorSpec, spec
from ..passes.shapes import infer_op
from ..runtime.workspace import Workspace

LAYERS = {"Conv", "Conv1D", "Conv2D", "Conv3D", "ConvTranspose", "FC", "FCTransposed"}
SAME_WORKSPACE = {"If": ("then_net", "else_net"), "While": ("cond_net", "loop_net")}   # nested nets walked inline
PLAN_ROUNDS = 8


def synth_init(predict_net, inputs: dict, *, width: int = 64, classes: int = 1000, params: dict | None = None,
               seed: int = 0) -> proto.NetDef:
    """An init NetDef of fill ops making every parameter of `predict_net` (a NetDef or a file path).

    inputs: {data blob: dims, or a TensorSpec for a dtype other than float32}, the inputs the predict net will
    be fed (no fill is made for them); also the dims to assume for an op output whose size depends on values
    (the proposals of GenerateProposals, e.g. {"rpn_rois": (300, 5)}), so that the layers after it get shapes.
    A parameter is a blob that some op reads before any op writes it and that is not a data input (ops of the
    nets that If and While run in their own workspace count: their then/else, loop and condition nets are
    walked where the op stands). Its shape follows from the first op reading it and that op's data input:
    Conv* W is M×C/group×kernel (NCHW) or M×kernel×C/group (NHWC), ConvTranspose W is C×M/group×kernel, FC W
    is N×K (FCTransposed K×N), biases have M/N entries; SpatialBN, InstanceNorm, GroupNorm and PRelu take one
    value per channel, LayerNorm X.shape[axis:]; a parameter operand of Add/Sub/Mul/Div gets one value per
    channel at `axis` with broadcast=1 (the last dim without an axis), or the other operand's shape without
    broadcast; GenerateProposals' anchors are (A, 4) real anchors (synth_widths.anchors: sizes 2, 4, 8, ...
    times the stride, three aspect ratios), or (A, 5) rotated ones when the deltas have 5A channels.

    The output width M/N of a layer whose weight is not given follows synth_widths' channel classes: blobs
    whose channels must be equally wide (a Sum's operands, a layer's output through its activations,
    poolings, normalisations, RoIAlign, ...) share a width; a Conv with group g (its weight free) keeps its
    input's width, which becomes the least common multiple of the groups reading it (depthwise: out = in =
    group); the detection ops tie widths (GenerateProposals: deltas = 4 x scores = 4 x anchors; BoxWithNMSLimit:
    boxes = 4 x class scores, the scores `classes` wide); the last Conv/FC/ConvTranspose on the path back from
    the net's last output (following first inputs) gets `classes` (rounded up to its group); every other class
    gets `width`. An op output whose size depends on values (GenerateProposals' proposals, BoxWithNMSLimit's
    detections) is shaped by running the op once on zeros, unless inputs gives its dims.
    params {name: dims} overrides any of these. Fills: weights GaussianFill with std sqrt(2/fan_in) (He),
    biases and shifts 0, scales and BN variances 1, BN means 0, PRelu slopes 0.25; multiplicative operands
    of Mul/Div 1, additive ones 0; anchors GivenTensorFill. Each random fill carries device_option.random_seed
    derived from `seed`,
    so the same call gives the same weights; fills take the device option of the op reading the parameter
    (else the net's). External inputs that no op reads get no fill. Nothing is calibrated: BN statistics are
    0/1 whatever the activations, so deep residual nets can end in a saturated softmax. A parameter that
    cannot be shaped raises a ShapeError naming it and its op, and suggesting params={NAME: DIMS}; a name in
    inputs/params that the net does not read (or that is not a parameter) is an ArgumentError.

    CLI: `stepnet synth-init` parses --input / --param with feeds.parse_dims; or write_init(path, out, ...).
    """
    net = predict_net if isinstance(predict_net, proto.NetDef) else proto.load(predict_net, kind="net")
    fills, device = _Walk(net, inputs, width, classes, dict(params or {}), _plan(net, inputs, width, classes,
                                                                                  dict(params or {}))).run()
    init = proto.NetDef(name=f"{net.name or 'predict'}_init")
    rngs = np.random.SeedSequence(seed).spawn(len(fills))
    for (name, fill), ss in zip(fills.items(), rngs, strict=True):
        args = {"shape": list(fill.shape)}
        if fill.values is not None:
            args["values"] = [float(v) for v in fill.values]
        elif fill.std is None:
            args["value"] = float(fill.value)
        else:
            args["std"], args["mean"] = float(fill.std), 0.0
        kind = "GivenTensorFill" if fill.values is not None else "ConstantFill" if fill.std is None else "GaussianFill"
        opdef = init.op.add(type=kind, output=[name])
        opdef.arg.extend(proto.make_argument(k, v) for k, v in args.items())
        if name in device:
            opdef.device_option.CopyFrom(device[name])
        elif net.HasField("device_option"):
            opdef.device_option.CopyFrom(net.device_option)
        if fill.std is not None:
            opdef.device_option.random_seed = int(ss.generate_state(1)[0])
    init.external_output.extend(fills)
    return init


# --------------------------------------------------------------------------------------------- the walk
def _ops(net, key=()):
    """(key, net, index, op) of every op of net and, right after an If or While, of the nets it runs in its
    own workspace, depth first; key is the op's path (index, net argument, index, ...)."""
    for index, opdef in enumerate(net.op):
        yield key + (index,), net, index, opdef
        for name, sub in nested_nets(opdef):
            if name in SAME_WORKSPACE.get(opdef.type, ()):
                yield from _ops(sub, key + (index, name))


def _plan(net, inputs, width, classes, params) -> dict:
    """{layer key: output width} for the layers whose weights are free: walks of the net in planning mode
    collect channel classes and constraints until the widths they give stop changing (synth_widths)."""
    constraints, widths = set(), {}
    for _ in range(PLAN_ROUNDS):
        walk = _Walk(net, inputs, width, classes, params, widths, planning=True)
        walk.run()
        found = constraints | walk.constraints
        solved = sw.Classes(found).widths(walk.free.values(), int(width))
        new = {key: solved[tag] for key, tag in walk.free.items()}
        if found == constraints and new == widths:
            break
        constraints, widths = found, new
    return widths


class _Walk:
    def __init__(self, net, inputs, width, classes, params, widths=None, planning=False):
        self.net, self.width, self.classes, self.params = net, int(width), int(classes), params
        self.widths, self.planning = dict(widths or {}), planning
        self.specs = {n: d if isinstance(d, TensorSpec) else spec(_dims(n, d)) for n, d in inputs.items()}
        self.given = set(inputs)
        self.fills: dict[str, Fill] = {}
        self.device: dict = {}
        self.why: dict[str, str] = {}   # blob -> why its shape is unknown
        self.tags: dict[str, tuple] = {}     # blob -> (channel axis, class tag)
        self.constraints: set = set()
        self.free: dict = {}                 # layer key -> the tag of its free width
        self.graph = Graph.of(net)
        read = {name for _, _, _, opdef in _ops(net) for name in opdef.input}
        for name in (*inputs, *self.params):
            if name not in read:
                raise ArgumentError(f"{name!r} is not an input of any op of net {net.name!r}"
                                    f"{did_you_mean(name, read)}")
        self.params = {n: _dims(n, d) for n, d in self.params.items()}
        head = _head_layer(self.graph, net.external_output)
        self.head = None if head is None else (head,)

    def run(self):
        for key, net, index, opdef in _ops(self.net):
            label = op_label(net.name, index, opdef)
            schema = REGISTRY.get(opdef.type, at=label)
            check_arity(schema, opdef, label)      # the rules index the op's inputs
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                args = parse_args(schema, opdef, label, False)
            ins = [(n, self.specs.get(n, UNKNOWN)) for n in opdef.input]
            given = [(n, spec(self.params[n]) if n in self.params else s if n in self.given else UNKNOWN)
                     for n, s in ins]    # only what the caller fixed: planned shapes change from walk to walk
            self.constraints.update(sw.detection_constraints(opdef, args, given, self.tags, self.classes))
            todo = [j for j, n in enumerate(opdef.input) if n not in self.specs]
            site = self._shape_params(key, opdef, args, todo, label)
            if opdef.type in SAME_WORKSPACE:
                outs = [UNKNOWN] * len(opdef.output)    # its nets, walked next, write them
            else:
                outs = self._outputs(schema, opdef, dict(args, **(site.overrides if site else {})), label)
            for name, s in zip(opdef.output, outs, strict=False):
                if not (name in self.given and (s.shape is None or None in s.shape)):
                    self.specs[name] = s    # (a value-dependent output keeps the dims the caller gave)
            self._tag(key, opdef, args, site, ins)
        for name in self.params:
            if name not in self.fills and not self.planning:   # (a planning walk skips the rules that fail)
                raise ArgumentError(f"params gives dims for {name!r}, but it is not a parameter of net "
                                    f"{self.net.name!r}: an op makes it, or it is a data input")
        return self.fills, self.device

    def _tag(self, key, opdef, args, site, ins):
        """Channel classes of the op's outputs (see synth_widths)."""
        read = {name: self.tags[name] for name, _ in ins if name in self.tags}
        for name in opdef.output:
            self.tags.pop(name, None)
        outs = [(n, self.specs.get(n, UNKNOWN)) for n in opdef.output]
        if opdef.type in LAYERS:
            if site is None or not outs or outs[0][1].shape is None:
                return
            axis = sw.channel_axis(opdef.type, args, len(outs[0][1].shape))
            if site.follows_input and opdef.input[0] in read:
                self.tags[opdef.output[0]] = (axis, read[opdef.input[0]][1])
            elif site.free:
                self.tags[opdef.output[0]] = (axis, ("layer", key))
                self.free[key] = ("layer", key)
                if key == self.head:
                    self.constraints.add(("prefer", ("layer", key), self.classes, 1))
            return
        if opdef.type in sw.NO_CHANNEL_FLOW:
            return
        for name, s in outs:
            if s.shape is None or len(s.shape) < 2:
                continue
            found = sw.carried(ins, read, s.shape)
            if found:
                self.tags[name] = found[0]
                self.constraints.update(("same", found[0][1], other) for _, other in found[1:])

    def _shape_params(self, key, opdef, args, todo, label):
        """The op's Site after shaping its parameters (None for an op that is no layer and reads none)."""
        if not todo and opdef.type not in LAYERS:
            return None
        out = self.widths.get(key, self.classes if key == self.head else self.width)
        site = Site(self, opdef, args, todo, out, label, head=key == self.head)
        rule = RULES.get(opdef.type)
        if not todo:
            if rule is not None and opdef.type in LAYERS:
                try:
                    dict(rule(site))        # a layer with known weights: what they say of its input
                except StepnetError:
                    pass
            return site
        try:
            found = dict(rule(site)) if rule else {}
        except StepnetError:
            if self.planning:
                return site
            raise
        for j in dict.fromkeys(todo):
            name = opdef.input[j]
            fill = found.get(j)
            if name in self.params:
                fill = _resized(fill, self.params[name])
            if fill is None:
                if self.planning:
                    continue
                raise site.cannot(j, "stepnet has no rule for this op's parameters" if rule is None
                                  else "this input is not one of the op's parameters")
            self.fills[name] = fill
            self.specs[name] = spec(fill.shape)
            if opdef.HasField("device_option"):
                self.device[name] = opdef.device_option
        return site

    def _outputs(self, schema, opdef, args, label):
        ins = [self.specs.get(n, UNKNOWN) for n in opdef.input]
        unknown = [n for n, s in zip(opdef.input, ins, strict=True) if s.shape is None or None in s.shape]
        if unknown:
            why = self.why.get(unknown[0], f"{label} reads {unknown[0]!r}, whose shape is unknown")
            for name in opdef.output:
                self.why[name] = why
            return [UNKNOWN] * len(opdef.output)
        if schema.shape is None:
            return self._run_once(opdef, ins, label)
        try:
            outs = infer_op(schema, opdef, ins, dict(args, rng=None) if schema.random else args, label)
        except StepnetError as e:
            if not self.planning:
                raise
            for name in opdef.output:
                self.why[name] = str(e)
            return [UNKNOWN] * len(opdef.output)
        if any(s.shape is None for s, name in zip(outs, opdef.output) if name not in self.given):
            ran = self._run_once(opdef, ins, label)   # sizes that depend on values: those of zeros
            outs = [r if s.shape is None else s for s, r in zip(outs, ran)]
        return outs

    def _run_once(self, opdef, ins, label):
        """Output specs of an op without a shape function, or with outputs whose sizes depend on values: run
        it once on CPU on placeholder inputs (zeros, or the values the specs carry)."""
        ws = Workspace(seed=0, gpu="cpu")
        for name, s in zip(opdef.input, ins, strict=True):
            ws.feed(name, s.value if s.value is not None else np.zeros(s.shape, s.dtype or np.float32))
        single = proto.OperatorDef()
        single.CopyFrom(opdef)
        single.ClearField("device_option")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ws.run_operator_once(single)
        except StepnetError as e:
            for name in opdef.output:
                self.why[name] = f"{label} has no shape function and failed on placeholder inputs ({e})"
            return [UNKNOWN] * len(opdef.output)
        return [TensorSpec.of(ws.fetch(n)) if hasattr(ws.get_blob(n).value, "shape") else UNKNOWN
                for n in opdef.output]


def _dims(name, dims) -> tuple:
    try:
        shape = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        shape = None
    if shape is None or any(d < 0 for d in shape):
        raise ArgumentError(f"the dims of {name!r} must be a sequence of non-negative integers, got {dims!r}")
    return shape


def _resized(fill: Fill | None, shape: tuple) -> Fill:
    """The fill of a parameter whose dims the user gave: the rule's kind of fill (a Gaussian's std taken from
    the new fan-in, all dims but the first), or a Gaussian of std 1/sqrt(fan-in) for an op without a rule."""
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
    if fill is None:
        return Fill(shape, std=math.sqrt(1.0 / max(fan_in, 1)))
    if fill.std is None or fill.shape == shape:
        return Fill(shape, std=fill.std, value=fill.value)
    return he(shape, fan_in)


def _head_layer(graph: Graph, external_output) -> int | None:
    """Index of the last Conv/FC/ConvTranspose on the path back from the net's last output (first inputs)."""
    outputs = set(external_output)
    index = next((i for i in range(len(graph) - 1, -1, -1)
                  if not outputs or outputs.intersection(graph.ops[i].output)), None)
    while index is not None:
        opdef = graph.ops[index]
        if opdef.type in LAYERS:
            return index
        if not opdef.input:
            return None
        index = graph.producer(index, 0)
    return None


def write_init(predict_path, output_path, inputs: dict, **options) -> proto.NetDef:
    """synth_init on a file, saved to output_path (.pb or .pbtxt by its extension); returns the init net."""
    init = synth_init(proto.load(predict_path, kind="net"), inputs, **options)
    proto.save(init, Path(output_path))
    return init
