"""Do and its workspace stack (Caffe2's do_op and create_scope_op): CreateScope, HasScope, Do, and Do's gradient.

Do runs its net in a child workspace taken from the workspace stack that its last input and output name (the
blob CreateScope makes). That workspace sees only the outer blobs the op binds into it: inner blob
`inner_blobs[k]` is outer blob `outer_blobs_idx[k]` of the op's inputs followed by its outputs (the stack blob
left out of both). A forward Do pushes a workspace (or, with `reuse_workspace`, runs in the last one again), a
gradient Do pops one, so it finds the blobs its forward Do computed there.

Do's gradient is built as Caffe2's control_ops_grad.py builds it: a Do over the backward net of the forward net
(GradientContext.backward), run (is_gradient_op) in the forward Do's workspace, so it reads the forward blobs
saved there (`saved_fwd_blobs`). Output gradients enter under `<inner output>/_DO_OPERATOR_INNER_GRAD_`; input
gradients leave through copies `<inner input>/_DO_OPERATOR_INNER_GRAD_COPY_` bound to `<outer input>_grad`.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, GradientError, NetError
from ..io.proto import OperatorDef, make_argument
from .base import GradientSlice, on_device
from .control import NOT_IN_PLACE, dedupe_gradients, gradient_copy, nested_backward, net_argument, own_net
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op

INNER_GRAD = "/_DO_OPERATOR_INNER_GRAD_"
INNER_GRAD_COPY = "/_DO_OPERATOR_INNER_GRAD_COPY_"


# ------------------------------------------------------------------------------------------- workspace stack
class WorkspaceStack:
    """The blob CreateScope makes: the workspaces of the Do ops sharing it. Forward Do ops push (reusing the
    workspaces of earlier runs), gradient Do ops pop, CreateScope empties it and keeps the workspaces."""

    def __init__(self):
        self.workspaces: list = []   # each a runtime ScopeWorkspace (Workspace.scope)
        self.top = -1

    def push_forward(self, outer, bindings):
        if self.top == len(self.workspaces) - 1:
            self.workspaces.append(outer.scope())
        self.top += 1
        ws = self.workspaces[self.top]
        ws.forward(bindings, replace_local=True)
        return ws

    def reuse_last_forward(self, outer, bindings):
        ws = self.workspaces[self.top]
        ws.forward(bindings, replace_local=True)
        return ws

    def pop_gradient(self, outer, bindings):
        if self.top < 0:
            return None
        ws = self.workspaces[self.top]
        ws.forward(bindings, replace_local=False)
        self.top -= 1
        return ws

    def clear(self) -> None:
        self.top = -1

    def empty(self) -> bool:
        return self.top < 0

    def __repr__(self):
        return f"WorkspaceStack({self.top + 1} of {len(self.workspaces)} workspaces in use)"


@op("CreateScope", inputs=0, outputs=1, context=True, devices="any", gradient=SHOULD_NOT_DO_GRADIENT)
def create_scope(ctx, xp):
    """An empty workspace stack for Do ops (the one already in the blob is emptied, its workspaces kept)."""
    blob = ctx.outputs[0]
    if not isinstance(blob.value, WorkspaceStack):
        blob.value = WorkspaceStack()
    blob.value.clear()


@op("HasScope", inputs=1, outputs=1, inplace=NOT_IN_PLACE, devices="any", gradient=SHOULD_NOT_DO_GRADIENT)
def has_scope(xp, stack):
    """A (1,) bool tensor: whether the workspace stack still holds workspaces (of forward Do ops not yet popped)."""
    if not isinstance(stack, WorkspaceStack):
        what = "<empty>" if stack is None else type(stack).__name__
        raise ArgumentError(f"input 0 must hold a workspace stack (the output of CreateScope), got {what}")
    return on_device(xp, [not stack.empty()], np.bool_)


# ------------------------------------------------------------------------------------------- Do
DO_ARGS = {
    "net": Arg("net", doc="the net run in the child workspace"),
    "inner_blobs": Arg("strs", [], "inner names of the outer blobs bound into the child workspace"),
    "outer_blobs_idx": Arg("ints", [], "for each inner blob, its outer blob: an index into the op's inputs then "
                                       "outputs, the workspace-stack blob left out of both"),
    "saved_fwd_blobs": Arg("strs", [], "(gradient Do) blobs of the forward Do's workspace the net reads"),
    "reuse_workspace": Arg("bool", False, "run in the last pushed workspace instead of pushing a new one"),
    "copy_external_blobs": Arg("bool", False, "after the run, keep copies of the bound blobs' values in the child "
                                              "workspace instead of the bindings"),
}


def _outer_names(opdef) -> list[str]:
    ins, outs = list(opdef.input), list(opdef.output)
    if ins[-1] != outs[-1]:
        raise ArgumentError(f"the last input ({ins[-1]!r}) and the last output ({outs[-1]!r}) must be the same "
                            "workspace-stack blob (made by CreateScope)")
    for what, names in (("inputs", ins[:-1]), ("outputs", outs[:-1])):
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ArgumentError(f"duplicate {what} {', '.join(map(repr, dup))}")
    return ins[:-1] + outs[:-1]


class _DoConfig:
    """A Do op's arguments, checked once (Caffe2 checks them when it creates the op)."""

    def __init__(self, ctx, a):
        opdef = ctx.opdef
        self.gradient = opdef.is_gradient_op
        self.reuse, self.copy = a["reuse_workspace"], a["copy_external_blobs"]
        if self.gradient and self.reuse:
            raise ArgumentError("a gradient Do (is_gradient_op) pops the forward workspaces: reuse_workspace must "
                                "be 0")
        if self.copy and self.reuse:
            raise ArgumentError("reuse_workspace and copy_external_blobs cannot be set together")
        inner, idx = list(a["inner_blobs"]), list(a["outer_blobs_idx"])
        if len(inner) != len(idx):
            raise ArgumentError(f"inner_blobs has {len(inner)} names but outer_blobs_idx {len(idx)} indices")
        outer = _outer_names(opdef)
        n_in = len(opdef.input) - 1
        blobs = [*ctx.inputs[:-1], *ctx.outputs[:-1]]
        self.bindings: dict = {}
        used: dict[str, str] = {}
        for name, k in zip(inner, idx):
            if name in self.bindings:
                raise ArgumentError(f"inner blob {name!r} is bound twice in inner_blobs")
            if not 0 <= k < len(outer):
                raise ArgumentError(f"outer_blobs_idx {k} (inner blob {name!r}) is outside 0..{len(outer) - 1}, the "
                                    f"op's {n_in} inputs and {len(outer) - n_in} outputs before the workspace blob")
            if outer[k] in used:
                raise ArgumentError(f"outer blob {outer[k]!r} is bound to both {used[outer[k]]!r} and {name!r}")
            used[outer[k]] = name
            self.bindings[name] = blobs[k]
        unbound = [n for n in outer if n not in used]
        if unbound:
            raise ArgumentError(f"outer blobs {', '.join(map(repr, unbound))} are bound to no inner blob; every "
                                "input and output (but the workspace blob) needs an entry in inner_blobs")
        self.saved = list(a["saved_fwd_blobs"])
        self.net = own_net(ctx, "net", a["net"])


def _do_bindings(g):
    """(net, {outer: inner}, {inner: outer}, workspace blob) of a Do op, checked."""
    op = g.def_
    net = net_argument(op, "net")
    if net is None:
        raise GradientError("the Do has no net", at=g.label)
    inner = [s for a in op.arg if a.name == "inner_blobs" for s in a.strings]
    idx = [k for a in op.arg if a.name == "outer_blobs_idx" for k in a.ints]
    ws_blob = op.output[-1]
    outer = list(op.input[:-1]) + list(op.output[:-1])
    if op.input[-1] != ws_blob or len(inner) != len(idx) or not all(0 <= k < len(outer) for k in idx):
        raise GradientError("the Do's blob bindings are malformed (inner_blobs, outer_blobs_idx and "
                            "the workspace blob last among inputs and outputs)", at=g.label)
    inner_names = [s.decode() if isinstance(s, bytes) else s for s in inner]
    outer_to_inner = {outer[k]: name for name, k in zip(inner_names, idx)}
    if len(outer_to_inner) != len(set(outer)):
        raise GradientError("every input and output of the Do must be bound to an inner blob", at=g.label)
    return net, outer_to_inner, {v: k for k, v in outer_to_inner.items()}, ws_blob


def do_gradient(g) -> None:
    """A gradient Do over the backward net of the forward Do's net (Caffe2's gen_do_gradient)."""
    op = g.def_
    net, outer_to_inner, inner_to_outer, ws_blob = _do_bindings(g)
    g_output = dedupe_gradients(g)
    seeds, outer_of_seed = {}, {}
    for out, grad in zip(op.output[:-1], g_output):
        if grad is not None:
            name = outer_to_inner[out] + INNER_GRAD
            seeds[outer_to_inner[out]] = name
            outer_of_seed[name] = grad
    grad_net, grads, _, _ = nested_backward(g, "net", net, seeds)
    copies, outputs, bindings = [], [], {}
    for i, outer in enumerate(op.input[:-1]):
        inner_grad = grads.get(outer_to_inner[outer])
        if inner_grad is None:
            continue
        if isinstance(inner_grad, GradientSlice):
            raise GradientError(f"input {outer!r} gets a sparse gradient inside the Do's net; the "
                                "gradient Do passes dense gradients only", at=g.label)
        copy_name = outer_to_inner[outer] + INNER_GRAD_COPY
        copies.append(gradient_copy(inner_grad, copy_name, grad_net.op))
        bindings[copy_name] = outer + "_grad"
        outputs.append(outer + "_grad")
        g.set_dense(i, outer + "_grad")
    if not copies:
        return   # no input of the Do gets a gradient
    inputs, saved, written = [], [], set()
    for o in [*grad_net.op, *copies]:   # a copy may read an output gradient passed through (by Sum, Alias)
        for name in o.input:
            if name in written:
                continue
            outer = inner_to_outer.get(name) or outer_of_seed.get(name)
            if outer is not None:
                if outer not in inputs:
                    inputs.append(outer)
                bindings[name] = outer
            elif name not in saved:
                saved.append(name)
        written.update(o.output)
    grad_net.op.extend(copies)
    everything = inputs + outputs
    grad_do = OperatorDef()
    grad_do.CopyFrom(op)
    if grad_do.name:
        grad_do.name += "_grad"
    grad_do.input[:] = inputs + [ws_blob]
    grad_do.output[:] = outputs + [ws_blob]
    del grad_do.arg[:], grad_do.control_input[:]
    grad_do.arg.extend([make_argument("net", grad_net), make_argument("inner_blobs", list(bindings)),
                        make_argument("outer_blobs_idx", [everything.index(o) for o in bindings.values()]),
                        make_argument("saved_fwd_blobs", saved)])
    grad_do.is_gradient_op = True
    g.ops.append(grad_do)


@op("Do", inputs=(1, None), outputs=(1, None), context=True, devices="any", args=DO_ARGS, gradient=do_gradient,
    doc="Runs `net` in a child workspace from the workspace stack in its last input/output (CreateScope's blob); "
        "inner_blobs/outer_blobs_idx bind the op's other inputs and outputs into it under inner names.",
    writes_unnamed=True)
def do_op(ctx, xp, *_, **args):
    cfg = ctx.state.get("do")
    if cfg is None:
        cfg = ctx.state["do"] = _DoConfig(ctx, args)
    blob, outer = ctx.outputs[-1], ctx.workspace
    if not isinstance(blob.value, WorkspaceStack):   # as Caffe2's Output<WorkspaceStack> makes one
        blob.value = WorkspaceStack()
    stack = blob.value
    if cfg.gradient:
        ws = stack.pop_gradient(outer, cfg.bindings)
        if ws is None:
            raise NetError(f"the workspace stack {blob.name!r} is empty: this gradient Do has no forward Do "
                           "workspace left to run in (run the forward net first, once per gradient Do)")
        missing = [n for n in cfg.saved if not ws.has(n)]
        if missing:
            raise NetError(f"the forward Do's workspace lacks {', '.join(map(repr, missing))} (saved_fwd_blobs)")
    elif cfg.reuse and not stack.empty():
        ws = stack.reuse_last_forward(outer, cfg.bindings)
    else:
        ws = stack.push_forward(outer, cfg.bindings)
    ctx.bind(cfg.net, ws).run()
    if cfg.copy and not cfg.gradient:
        ws.copy_forwarded(cfg.bindings)


