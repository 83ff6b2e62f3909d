"""Control flow on the sub-net primitive (Caffe2's if_op, while_op, conditional_op and IsEmpty): If, While,
IsEmpty, Conditional, the gradient of If, and what the control-flow ops share (scopes.py has Do and its stack).

If and While run their nets in the op's own workspace. Every nested net is bound through ctx.bind
(Workspace.bind: bound once, kept by the workspace it runs in); the nets are copied once, when the op first runs,
under a name unique to the op and argument, because workspaces keep bound nets by name and files reuse names
(If's branches are often both unnamed, or named like the outer net).

The gradient of If is built as Caffe2's control_ops_grad.py builds it, with the backward pass run over each branch
(GradientContext.backward): an If on the same condition whose branches are the branches' backward nets, seeded
with the gradients of the If's outputs. Each If input's gradient gets one name that whichever branch runs writes:
a branch that reads the input has the backward pass's gradient, one that leaves it alone passes the output
gradient through (a Copy) or has zeros, one that overwrites it before reading it has zeros (Caffe2 passed the
output gradient through there). When the backward pass renames a gradient If's output (`_<g>_autosplit_<k>`),
rename_gradient_output renames the writes in its branches too. While's gradient, and what the gradients of the
ops with nested nets share, are in control_grad.py.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from ..graph.view import Graph, nested_nets
from ..io.proto import NetDef, OperatorDef, make_argument
from .base import like, on_device, out_spec
from .control_grad import gradient_copy  # noqa: F401 - scopes.py takes it from here
from .control_grad import dedupe_gradients, nested_backward, net_argument, on_device_of, while_gradient
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op

NOT_IN_PLACE = ()   # Caffe2's default: an output may not reuse an input's blob
BRANCHES = ("then_net", "else_net")


# ------------------------------------------------------------------------------------------- nested nets
def own_net(ctx, arg: str, netdef: NetDef) -> NetDef:
    """A copy of `netdef` named after the op that runs it: '<outer net>/<Type>#<index>.<arg>(<its name>)'."""
    net = NetDef()
    net.CopyFrom(netdef)
    net.name = f"{ctx.net.name}/{ctx.opdef.type}#{ctx.index}.{arg}" + (f"({netdef.name})" if netdef.name else "")
    return net


def _nets(ctx, **nets) -> dict:
    """The op's nested nets, copied once (ctx.state) and, as Caffe2 creates them with the op, all bound at once
    in the op's workspace."""
    own = ctx.state.get("nets")
    if own is None:
        own = {arg: own_net(ctx, arg, n) for arg, n in nets.items() if n is not None}
        for n in own.values():
            ctx.bind(n)
        ctx.state["nets"] = own
    return own


def condition_value(value, name: str) -> bool:
    """The value of a control op's condition blob: a bool tensor of one element, on any device."""
    if getattr(value, "dtype", None) != np.bool_ or value.size != 1:
        what = (f"{tuple(value.shape)} {value.dtype}" if hasattr(value, "shape") and hasattr(value, "dtype")
                else "<empty>" if value is None else type(value).__name__)
        raise ArgumentError(f"the condition {name!r} must be a bool tensor with one element, got {what}")
    return bool(np.asarray(backend.to_host(value)).reshape(-1)[0])


# ------------------------------------------------------------------------------------------- If's gradient
def _branch_gradient(fwd: NetDef | None, grads: dict, seeds: dict, blob: str):
    """The gradient of If input `blob` (its value before the If) when this branch runs: (name or None, zero).
    A branch that reads it has the backward pass's gradient; one that overwrites it before any read has zero
    (`zero` True); one that leaves it alone passes the If output's gradient through (or has none)."""
    if fwd is None:
        return seeds.get(blob), False
    graph = Graph(fwd.op)
    if graph.consumers.get((blob, 0)):
        return grads.get(blob), False
    if graph.final.get(blob, 0):
        return None, True
    return seeds.get(blob), False


def _set_gradient(net: NetDef, writes: list, blob: str, name: str, have, zero: bool, other: NetDef,
                  if_op: OperatorDef) -> None:
    """Make the branch's backward net write input gradient `name`: a Copy of the gradient it has under another
    name, or zeros shaped like the blob where it has none (Caffe2's _gen_grad_zero_init_ops, which fills float32
    zeros with ConstantFill; Scale(blob, 0) keeps the blob's dtype, so float64 and float16 nets sum them)."""
    if have is not None and not zero:
        fill = OperatorDef(type="Copy", input=[have], output=[name])
    else:
        fill = OperatorDef(type="Scale", input=[blob], output=[name], arg=[make_argument("scale", 0.0)])
    net.op.append(on_device_of(fill, [*net.op, *other.op], *([name] if have is None or zero else [have, name])))
    if not fill.HasField("device_option") and if_op.HasField("device_option"):
        net.op[-1].device_option.CopyFrom(if_op.device_option)
    writes.append(name)


def _fresh(name: str, taken: set) -> str:
    k, base = 0, name
    while name in taken:
        name, k = f"_{base}_if_{k}", k + 1
    return name


def if_gradient(g) -> None:
    """If(condition, then_net=backward(then_net), else_net=backward(else_net)), reading what the backward nets
    read and writing what they write (Caffe2's gen_if_gradient). Each input's gradient gets one name that
    whichever branch runs writes (or, when both pass it through, the output gradient itself)."""
    op = g.def_
    seeds = {o: gr for o, gr in zip(op.output, dedupe_gradients(g)) if gr is not None}
    fwd = {arg: net_argument(op, arg) for arg in BRANCHES}
    if fwd["then_net"] is None:
        raise GradientError("the If has no then_net", at=g.label)
    back = {arg: nested_backward(g, arg, net, seeds) for arg, net in fwd.items() if net is not None}
    if "else_net" not in back:   # made when a gradient needs setting where the forward If runs nothing
        then = back["then_net"][0]
        empty = NetDef(name=then.name + "_auto_else_zero_blobs_" if then.name else "")
        if then.HasField("device_option"):
            empty.device_option.CopyFrom(then.device_option)
        back["else_net"] = (empty, {}, [], [])
    taken = set(seeds.values()).union(*(b[3] for b in back.values()))
    for i, blob in enumerate(op.input[1:], 1):
        per = {arg: _branch_gradient(fwd[arg], back[arg][1], seeds, blob) for arg in BRANCHES}
        names = [n for n, zero in per.values() if n is not None and not zero]
        if not names:
            continue
        made = [n for n in names if n not in seeds.values()]
        if made:   # a branch's backward ops write it: the other branch writes that name too
            name = made[0]
        elif len(set(names)) == 1 and len(names) == len(per):   # both pass the same output gradient through
            name = names[0]
        else:      # never overwrite an output gradient: other inputs may pass it through
            name = _fresh(f"{blob}_grad", taken)
        taken.add(name)
        for arg, (have, zero) in per.items():
            if have != name or zero:
                other = back["else_net" if arg == "then_net" else "then_net"][0]
                _set_gradient(back[arg][0], back[arg][3], blob, name, have, zero, other, op)
        g.g_input[i] = name
    if not back["else_net"][0].op and fwd["else_net"] is None:
        del back["else_net"]
    if not any(b[0].op for b in back.values()):
        return   # every gradient passes through: no op

    cond = op.input[0]
    reads = [n for b in back.values() for n in b[2]]
    writes = [n for b in back.values() for n in b[3]]
    grad_if = OperatorDef()
    grad_if.CopyFrom(op)
    grad_if.input[:] = [cond] + [n for n in dict.fromkeys(reads) if n != cond]
    grad_if.output[:] = list(dict.fromkeys(writes))
    del grad_if.arg[:], grad_if.control_input[:]
    for arg in BRANCHES:
        if arg in back:
            grad_if.arg.append(make_argument(arg, back[arg][0]))
    if grad_if.name:
        grad_if.name += "_grad"
    grad_if.is_gradient_op = True
    g.ops.append(grad_if)


def rename_gradient_output(op: OperatorDef, index: int, new: str) -> None:
    """Rename output `index` of a gradient op to `new` in place (the backward pass's `_<g>_autosplit_<k>`). The
    branches of an If write its outputs themselves: their writes of the old name, and their reads after the
    first write, are renamed too (Caffe2's disambiguate_grad_if_op_output). A Do binds its outputs by position,
    so renaming the output is enough."""
    old = op.output[index]
    op.output[index] = new
    if op.type != "If":
        return
    for a in op.arg:
        if a.name not in BRANCHES:
            continue
        if not a.HasField("n"):
            net = net_argument(op, a.name)
            if net is None:
                continue
            a.n.CopyFrom(net)
            a.ClearField("s")
        written = False
        for inner in a.n.op:
            if written:
                inner.input[:] = [new if n == old else n for n in inner.input]
            for j, out in enumerate(inner.output):
                if out == old:
                    rename_gradient_output(inner, j, new)
                    written = True


# ------------------------------------------------------------------------------------------- If, While
@op("If", inputs=(1, None), outputs=(0, None), context=True, devices="any", gradient=if_gradient,
    args={"then_net": Arg("net", doc="net run when the condition is true"),
          "else_net": Arg("net", None, "net run when the condition is false (optional)")},
    doc="Runs then_net if the one-element bool input 0 is true, else else_net (when given), in the op's own "
        "workspace; the other inputs and the outputs declare what the nets read and write.")
def if_op(ctx, xp, condition, *_, then_net, else_net):
    nets = _nets(ctx, then_net=then_net, else_net=else_net)
    chosen = nets["then_net"] if condition_value(condition, ctx.opdef.input[0]) else nets.get("else_net")
    if chosen is not None:
        ctx.bind(chosen).run()


@op("While", inputs=(1, None), outputs=(0, None), context=True, devices="any", gradient=while_gradient,
    args={"loop_net": Arg("net", doc="net run on each iteration"),
          "cond_net": Arg("net", None, "net that recomputes the condition before each iteration (optional)")},
    doc="Runs cond_net (when given), then loop_net while the one-element bool input 0 is true, in the op's own "
        "workspace.")
def while_op(ctx, xp, *_, loop_net, cond_net):
    """No bound on the iterations, as in Caffe2: a loop runs until its condition turns false, which only the
    model knows (decoders loop until an end token), and a cap would be arbitrary or fail real models. A loop
    that never ends is the model's (as a plan step whose stop blob never turns true); it stays interruptible:
    each iteration runs Python code, so Ctrl-C (SIGINT) stops it at once with `stepnet: interrupted` (exit
    130), and `timeout` or --max-blob-bytes bound the time or what a growing blob may take. One case is
    refused: a true condition that nothing in loop_net or cond_net can change (_may_change), which Caffe2
    would loop on forever."""
    nets = _nets(ctx, loop_net=loop_net, cond_net=cond_net)
    loop, cond = nets["loop_net"], nets.get("cond_net")
    blob, name = ctx.inputs[0], ctx.opdef.input[0]
    first = True
    while True:
        if cond is not None:
            ctx.bind(cond).run()
        if not condition_value(blob.value, name):   # re-read: the nets write the condition blob
            return
        if first:
            writes = ctx.state.get("writes")
            if writes is None:
                writes = ctx.state["writes"] = _writes(nets.values())   # (the nets are fixed: looked at once)
            if not _may_change(blob, name, writes, ctx.workspace):
                raise ArgumentError(f"the condition {name!r} is true and no op of loop_net or cond_net writes "
                                    "it, so the loop would never end; have cond_net (or loop_net) recompute it")
        first = False
        ctx.bind(loop).run()


def _writes(netdefs) -> tuple[frozenset, bool]:
    """(the blobs the ops of these nets, and of the nets nested in them, name as outputs; whether one of them
    could write a blob without naming it: an op whose record says writes_unnamed (Do's name mapping, Load's
    load_all, RecurrentNetwork's states, the queues; If and While are looked into instead); Alias, whose output
    is its input's array; an unknown type)."""
    from .registry import REGISTRY  # (the registry is complete by the time a net runs)

    names, unnamed, stack = set(), False, list(netdefs)
    while stack:
        for o in stack.pop().op:
            names.update(o.output)
            unnamed = unnamed or o.type == "Alias" or o.type not in REGISTRY or REGISTRY.get(o.type).writes_unnamed
            stack.extend(n for _, n in nested_nets(o))
    return frozenset(names), unnamed


def _may_change(blob, name: str, writes: tuple, ws) -> bool:
    """Whether running the nets whose _writes these are could change the condition blob: one writes it or
    could write it unnamed, an output's current array shares the condition's, or the condition is a view of
    another tensor. False only when the loop provably never ends."""
    names, unnamed = writes
    if unnamed or name in names or blob.view:
        return True
    for out in names:
        held = ws.find(out)
        if held is not None and held.value is not None and np.may_share_memory(held.value, blob.value):
            return True
    return False


# ------------------------------------------------------------------------------------------- small ops
@op("IsEmpty", inputs=1, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=lambda s: [out_spec((), np.bool_, 0 in s[0].shape)])
def is_empty(xp, x):
    """A 0-D bool tensor: whether X has no elements."""
    if not hasattr(x, "size"):
        raise DTypeError(f"IsEmpty needs a tensor, got a {type(x).__name__}")
    return on_device(xp, x.size == 0, np.bool_)


def _check_conditional(cond, t, f) -> None:
    if cond.dtype is not None and cond.dtype != np.bool_:
        raise DTypeError(f"Condition must be a bool tensor, got {cond.dtype}")
    if len(cond.shape) != 1:
        raise ShapeError(f"Condition must be 1-D, got shape {tuple(cond.shape)}")
    if len(t.shape) < 1 or t.shape[0] != cond.shape[0]:
        raise ShapeError(f"DataT {tuple(t.shape)} must have {cond.shape[0]} rows, one per condition value")
    if tuple(t.shape) != tuple(f.shape):
        raise ShapeError(f"DataT {tuple(t.shape)} and DataF {tuple(f.shape)} must have the same shape")
    if t.dtype is not None and f.dtype is not None and t.dtype != f.dtype:
        raise DTypeError(f"DataT is {t.dtype} but DataF is {f.dtype}; they must have the same type")


def _conditional_shape(specs):
    _check_conditional(*specs)
    return [like(specs[1])]


@op("Conditional", inputs=3, outputs=1, inplace=NOT_IN_PLACE, gradient=NO_GRADIENT, shape=_conditional_shape)
def conditional(xp, cond, t, f):
    """Row i of DataO is row i of DataT where Condition[i] is true, else row i of DataF (the first dimension)."""
    _check_conditional(cond, t, f)
    return xp.where(cond.reshape((-1,) + (1,) * (t.ndim - 1)), t, f)
