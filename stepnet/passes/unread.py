"""Gradient values nothing reads, left out of a plan that `stepnet run` runs whole.

Caffe2's backward pass gives every forward input a gradient, a data input too: a char-rnn's FCGradient
computes dX = dY·W of its one-hot input (a GEMM as large as the weight gradient's) and a Reshape gradient
reshapes it, though nothing reads either. Where nothing can observe them (the command line with no
--checkpoint: only fetched blobs, a plan's own ops and its nets' external outputs see its blobs), this pass
drops them: a gradient op all of whose outputs nothing reads, and the dX output of an FC or Conv gradient
(Caffe2 computes dX only for an op that names it: a first convolution's data gradient, a one-hot input's).
What every remaining op computes is unchanged, so everything observable (printed losses, saved files, fetched
blobs) is the same bits.

A blob counts as read when any op at any nesting level names it as an input, any string argument holds its
name, a net lists it as an external output, an execution step stops on it, or the caller keeps it. Only a
plan's top-level gradient ops are candidates, and only pure ones (no random numbers, no context beyond their
own structure, nothing written unnamed, no nested net): dropping one changes no other value. An op in place
reads its own output, so it is never unread.
The Python API never applies it (any blob may be fetched there)."""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from ..graph.view import copy_op, nested_nets, walk, with_ops
from ..io.proto import NetDef, OperatorDef, PlanDef
from ..ops import REGISTRY

# Gradient ops whose last output (dX) Caffe2 computes only when the op names it (fc_op.h, conv_op_impl.h,
# conv_transpose_op_impl.h): their outputs without it, by whether the op has no bias.
OPTIONAL_INPUT_GRADIENT = {"FCGradient": (2, 2), "FCTransposedGradient": (2, 2), "ConvGradient": (2, 1),
                           "ConvTransposeGradient": (2, 1)}


def drop_unread_gradients(model: PlanDef | NetDef, keep: Iterable[str] = ()) -> tuple[PlanDef | NetDef, int]:
    """(the plan or net without the gradient values nothing reads, how many ops and outputs it left out: 0,
    the model itself); keep: blob names the caller reads after the run (fetched). The model given is not
    changed."""
    is_plan = isinstance(model, PlanDef)
    networks = list(model.network) if is_plan else [model]
    pinned = set(keep)
    reads: Counter = Counter()
    for net in networks:
        pinned.update(net.external_output)
        for _, _, _, op in walk(net, level=1):       # (nested ops too: they are never dropped)
            reads.update(op.input)
            for arg in op.arg:
                pinned.update(_strings(arg))
    for step in _steps(model) if is_plan else ():
        if step.should_stop_blob:
            pinned.add(step.should_stop_blob)

    def unread(name: str) -> bool:
        return name not in pinned and reads[name] == 0

    nets = [list(net.op) for net in networks]
    pending = [(k, i) for k, ops in enumerate(nets) for i, op in enumerate(ops) if op.is_gradient_op]
    writers: dict[str, list] = {}                # blob -> the top-level gradient ops writing it (net, index)
    for k, i in pending:
        for name in nets[k][i].output:
            writers.setdefault(name, []).append((k, i))
    left_out = 0
    while pending:      # a dropped op's inputs that nothing else reads make their writers candidates again
        k, i = pending.pop()
        op = nets[k][i]
        if op is None:
            continue
        if _droppable(op) and op.output and all(unread(n) for n in op.output):
            nets[k][i] = None
            left_out += 1
            for name in op.input:
                reads[name] -= 1
                if unread(name):
                    pending.extend(writers.get(name, ()))
        elif len(op.output) == _with_input_gradient(op) and unread(op.output[-1]):
            nets[k][i] = _without_last_output(op)
            left_out += 1
    if not left_out:
        return model, 0
    new = [with_ops(net, [op for op in ops if op is not None]) for net, ops in zip(networks, nets)]
    if not is_plan:
        return new[0], left_out
    out = PlanDef()
    out.CopyFrom(model)
    for k, net in enumerate(new):
        out.network[k].CopyFrom(net)
    return out, left_out


def _with_input_gradient(op: OperatorDef) -> int | None:
    """How many outputs an FC or Conv gradient op has with its optional dX (None: another type)."""
    counts = OPTIONAL_INPUT_GRADIENT.get(op.type)
    if counts is None:
        return None
    no_bias = any(a.name == "no_bias" and a.i for a in op.arg)
    return counts[1 if no_bias else 0] + 1


def _droppable(op: OperatorDef) -> bool:
    """A gradient op whose record says it computes only its named outputs from its inputs."""
    if op.type not in REGISTRY:
        return False
    schema = REGISTRY.get(op.type)
    return (not schema.random and schema.context in (False, "structure") and not schema.writes_unnamed
            and not any(True for _ in nested_nets(op)))


def _without_last_output(op: OperatorDef) -> OperatorDef:
    out = copy_op(op)
    del out.output[-1]
    return out


def _strings(arg) -> list[str]:
    values = [arg.s] if arg.HasField("s") else []
    values += list(arg.strings)
    return [v.decode("utf-8", "replace") for v in values]


def _steps(plan: PlanDef):
    pending = list(plan.execution_step)
    while pending:
        step = pending.pop()
        yield step
        pending.extend(step.substep)

