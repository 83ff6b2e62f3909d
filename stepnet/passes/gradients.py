"""The backward pass as a graph rewrite, after Caffe2's IR (spec §6.2).

Forward ops are played in SSA form (every write bumps a blob's version). Walking them in reverse, each op
whose outputs have gradients calls its registered gradient maker, which emits ordinary OperatorDefs and says
what each input's gradient is: a dense blob name, a GradientSlice (sparse: indices + values), or None. A blob
version consumed by several ops gets one gradient per consumer; they are summed (renaming all but the first to
`_<grad>_autosplit_<k>`) when the walk reaches its first consumer. Gradient ops that read forward blobs are
checked to see the version their forward op saw (in-place overwrites would make them read the wrong data).

`caffe2=True` gives what Caffe2's Python IR (core.py) gives where the two differ, for stepnet.compat: its
accumulation ops are not marked is_gradient_op; an op writing a blob version that has no gradient, while a later
version of the blob has one, is refused when its gradient ops would read that later gradient (Caffe2 hands an
op the latest gradient of each output name and checks its version); and in the returned map an op that reads
and writes a blob without giving it a gradient leaves it with none.
"""
from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from ..core.errors import ArityError, GradientError
from ..graph.view import Graph
from ..ops import REGISTRY
from ..ops.base import GradientContext, GradientSlice
from ..ops.base import forward_label as _label
from ..ops.binding import check_arity
from ..ops.control import rename_gradient_output
from ..ops.registry import GRADIENT_NOT_IMPLEMENTED, NO_GRADIENT, SHOULD_NOT_DO_GRADIENT
from ..io.proto import OperatorDef, make_argument


def _copy_device(op: OperatorDef, gens) -> None:
    """Accumulation ops run where the gradients were made (the first generator's device, as Caffe2 does)."""
    for g in gens:
        if g.device is not None:
            op.device_option.CopyFrom(g.device)
            return


class _Generator(NamedTuple):
    op: OperatorDef | None     # the gradient op that writes it (None: a pass-through or a sparse gradient)
    output_index: int
    name: object               # a blob name, or a GradientSlice
    device: object = None      # the DeviceOption of the op that made it (or of the forward op)


def _make_gradient(index: int, op: OperatorDef, g_output: list, extra=None, caffe2: bool = False):
    """(gradient ops, input gradients) of op: from `extra(op, g_output)` where it gives them (makers a caller
    adds, such as Caffe2's Python-registered ones in stepnet.compat), else from the op's record, once the op
    matches its record's arity."""
    made = extra(op, g_output) if extra is not None else None
    if made is not None:
        return made
    schema = REGISTRY.get(op.type)
    try:
        check_arity(schema, op, _label(index, op))
    except ArityError as e:
        raise GradientError(f"{_label(index, op)} does not pass its schema check ({e.message}); its gradient "
                            "cannot be made") from None
    maker = schema.gradient
    wanted = [op.output[i] for i, g in enumerate(g_output) if g is not None]
    if maker in (SHOULD_NOT_DO_GRADIENT, GRADIENT_NOT_IMPLEMENTED) or (maker is None and wanted):
        why = {SHOULD_NOT_DO_GRADIENT: "is registered as not differentiable",
               GRADIENT_NOT_IMPLEMENTED: "has no gradient implemented yet",
               None: "has no gradient registered"}[maker]
        raise GradientError(f"{_label(index, op)} {why}, but a gradient flows into its output(s) "
                            f"{', '.join(map(repr, wanted))}; put a StopGradient before the loss path or change "
                            "the net")
    if maker == NO_GRADIENT or maker is None:
        return [], [None] * len(op.input)
    def nested(ops, ys):
        return backward_ops(ops, ys, extra, caffe2=caffe2)
    ctx = GradientContext(op, g_output, index, nested)   # makers of If / Do run it over their nets
    maker(ctx)
    return ctx.ops, ctx.g_input


class BackwardPass:
    """Builds gradient ops for a list of forward ops (a whole net or a step net)."""

    def __init__(self, ops, extra=None, caffe2: bool = False):
        self.graph = Graph(ops)
        self.ops = self.graph.ops
        self.extra = extra   # extra(op, g_output) -> (ops, g_input), or None for the op's own maker
        self.caffe2 = caffe2

    def run(self, ys):
        """(gradient ops, {blob: gradient}) for ys: a list of blobs (gradient seeded with 1.0) or a dict
        {blob: gradient blob name, or None to seed with 1.0}."""
        ys = {y: None for y in ys} if not isinstance(ys, dict) else dict(ys)
        grad_ops: list[OperatorDef] = []
        current: dict[str, object] = {}   # blob name -> its gradient at the version being walked
        generators: dict[tuple[str, int], list[_Generator]] = defaultdict(list)
        for y, g in ys.items():
            seed = None
            if g is None:
                g = y + "_autogen_grad"
                seed = OperatorDef(type="ConstantFill", input=[y], output=[g], arg=[make_argument("value", 1.0)])
                writer = self.graph.writer.get((y, self.graph.final.get(y, 0)))
                if writer is not None and self.ops[writer].HasField("device_option"):
                    seed.device_option.CopyFrom(self.ops[writer].device_option)  # made where the loss lives
                grad_ops.append(seed)
            current[y] = g
            if seed is not None:
                # Caffe2's rule: an autogenerated seed is one more source of y's gradient (summed with what
                # ops reading y after its last write produce, at the first of them); a given gradient is not
                # (recurrent_net adds its own `_accum` Sum for gradients that also arrive from outside).
                generators[(y, self.graph.final.get(y, 0))].append(_Generator(seed, 0, g))
        result = dict(current)  # every blob -> its gradient (for several versions: the earliest one's)
        written_by_grads: dict[str, int] = {}
        for i in reversed(range(len(self.ops))):
            op = self.ops[i]
            g_output = [current.get(name) for name in op.output]
            if self.caffe2:
                self._check_stale(i, op, g_output, result)
            if any(g is not None for g in g_output) or op.type == "ZeroGradient":
                new_ops, g_input = _make_gradient(i, op, g_output, self.extra, self.caffe2)
                self._check_versions(i, op, new_ops, g_output, written_by_grads)
                for g in new_ops:
                    for name in g.output:
                        written_by_grads[name] = i
                grad_ops.extend(new_ops)
                for k, gen in self._generators(op, new_ops, g_input):
                    if gen.device is None and op.HasField("device_option"):
                        gen = gen._replace(device=op.device_option)
                    generators[(op.input[k], self.graph.in_versions[i][k])].append(gen)
                if self.caffe2:   # an input the op also writes, given no gradient, has none in Caffe2's map
                    for name, g in zip(op.input, g_input):
                        if g is None and name in op.output:
                            result.pop(name, None)
            # Outputs written here are now at their previous version: their gradient is consumed.
            for name in op.output:
                current.pop(name, None)
            for name, v in dict.fromkeys(zip(op.input, self.graph.in_versions[i])):
                if self.graph.consumers[(name, v)][0] != i:
                    continue
                gens = generators.get((name, v))
                if gens:
                    current[name] = result[name] = self._accumulate(name, v, gens, grad_ops)
        return grad_ops, result

    def _check_stale(self, i, op, g_output, latest) -> None:
        """Caffe2's version check: an output version without a gradient whose name has a later version's gradient
        (`latest`) is refused when the op's gradient ops would read that gradient."""
        stale = {n: latest[n] for n, g in zip(op.output, g_output) if g is None and latest.get(n) is not None}
        if not stale:
            return
        given = [g if g is not None else stale.get(n) for n, g in zip(op.output, g_output)]
        try:
            new_ops, _ = _make_gradient(i, op, given, self.extra, True)
        except GradientError:
            return   # the op takes no such gradient: nothing reads it
        names = {part: n for n, g in stale.items()
                 for part in ((g.indices, g.values) if isinstance(g, GradientSlice) else (g,))}
        read = next((name for g in new_ops for name in g.input if name in names), None)
        if read is not None:
            n = names[read]
            version = self.graph.out_versions[i][list(op.output).index(n)]
            raise GradientError(f"gradient of {_label(i, op)}: {read!r} is the gradient of a later version of "
                                f"{n!r}, not of version {version}, which this op writes and nothing reads; give "
                                "one of the writes of that blob another name")

    @staticmethod
    def _generators(op, new_ops, g_input):
        """(input index, generator) for every input gradient: which gradient op output writes it, in output
        order (an op may write two gradients of one blob, e.g. Mul(x, x)), or None for a pass-through."""
        unassigned = {k for k, g in enumerate(g_input) if g is not None}
        for g_op in reversed(new_ops):  # the last op writing a gradient name is the one that produces it
            for j, out in enumerate(g_op.output):
                k = next((k for k in sorted(unassigned) if g_input[k] == out), None)
                if k is not None:
                    unassigned.discard(k)
                    device = g_op.device_option if g_op.HasField("device_option") else None
                    yield k, _Generator(g_op, j, out, device)
        for k in sorted(unassigned):
            yield k, _Generator(None, -1, g_input[k])

    def _accumulate(self, name, version, gens, grad_ops):
        if len(gens) == 1:
            return gens[0].name
        if any(isinstance(g.name, GradientSlice) for g in gens):
            if not all(isinstance(g.name, GradientSlice) for g in gens):
                raise GradientError(f"blob {name!r} (version {version}) gets both dense and sparse gradients from "
                                    "its consumers; stepnet, like Caffe2, cannot add them")
            base = name + "_grad"
            idx_concat = OperatorDef(type="Concat", input=[g.name.indices for g in gens],
                                     output=[base + "_indices_concat", base + "_indices_concat_split"],
                                     arg=[make_argument("axis", 0)], is_gradient_op=True)
            val_concat = OperatorDef(type="Concat", input=[g.name.values for g in gens],
                                     output=[base + "_values_concat", base + "_values_concat_split"],
                                     arg=[make_argument("axis", 0)], is_gradient_op=True)
            _copy_device(idx_concat, gens)
            _copy_device(val_concat, gens)
            if self.caffe2:   # Caffe2's IR makes them with CreateOperator: the field unset
                idx_concat.ClearField("is_gradient_op")
                val_concat.ClearField("is_gradient_op")
            grad_ops.extend([idx_concat, val_concat])
            return GradientSlice(idx_concat.output[0], val_concat.output[0])
        out = next((g.op.output[g.output_index] for g in gens if g.op is not None), name + "_grad")
        inputs, k, first = [], 0, True
        for g in gens:
            if g.op is None:
                inputs.append(g.name)
            elif first:
                first = False
                inputs.append(g.name)
            else:
                renamed = f"_{g.name}_autosplit_{k}"
                k += 1
                rename_gradient_output(g.op, g.output_index, renamed)  # an If's branches write it too
                inputs.append(renamed)
        if out in inputs:  # Sum runs in place on its first input only
            j = inputs.index(out)
            inputs[0], inputs[j] = inputs[j], inputs[0]
        total = OperatorDef(type="Sum", input=inputs, output=[out])
        if not self.caffe2:
            total.is_gradient_op = True
        _copy_device(total, gens)
        grad_ops.append(total)
        return out

    def _check_versions(self, i, op, new_ops, g_output, written_by_grads) -> None:
        """A gradient op reading a forward blob must see the version the forward op saw."""
        graph = self.graph
        seen = dict(zip(op.input, graph.in_versions[i]))
        seen.update(zip(op.output, graph.out_versions[i]))
        grads = {g for g in g_output if isinstance(g, str)}
        local: set[str] = set()
        for g in new_ops:
            for name in g.input:
                if name in local or name in grads or name not in seen:
                    continue
                final = graph.final.get(name, 0)
                if seen[name] != final or name in written_by_grads:
                    later = graph.writer.get((name, final))
                    by = f" by {_label(later, self.ops[later])}" if later is not None and later != i else ""
                    raise GradientError(
                        f"gradient of {_label(i, op)}: {g.type} needs {name!r} at version {seen[name]}, but it was "
                        f"overwritten in place{by} (now at version {final}); give that output another name")
            local.update(g.output)


def backward_ops(ops, ys, extra=None, caffe2: bool = False):
    """(gradient ops, {blob: gradient name or GradientSlice}) for forward ops and targets ys (spec §6.2).
    extra(op, g_output): makers consulted before the records' (None from it: the record's maker); caffe2: what
    Caffe2's Python IR gives where it differs (the module's docstring)."""
    return BackwardPass(ops, extra, caffe2).run(ys)


def gradient_of_op(op: OperatorDef, g_output: list, extra=None):
    """(gradient ops, gradient of each input or None) of one op, given the gradients of its outputs (a blob
    name, a GradientSlice or None each): the op's gradient maker alone, as Caffe2's GetGradientForOp."""
    return _make_gradient(0, op, list(g_output), extra)


def add_gradient_ops(net, losses):
    """Append the gradient ops of losses to net (a NetDef) and return {blob: gradient}."""
    ops, grads = backward_ops(net.op, losses)
    net.op.extend(ops)
    return grads


__all__ = ["GradientContext", "GradientError", "GradientSlice", "add_gradient_ops", "backward_ops", "gradient_of_op"]
