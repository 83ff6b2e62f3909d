"""RecurrentNetwork and its gradient: step nets run once per timestep over link/alias views (spec §3).

The forward op rewrites its step net once (stepnet.graph.step_nets.FORWARD: the links become an op that
views each link internal's rows), keeps one workspace per timestep (or K rotating ones when there is no
backward pass) in the `step_workspaces` output, and per timestep sets the timestep blob and runs the step net
bound in that workspace. The gradient op rewrites the backward step net (BACKWARD), zeroes the gradient
tensors, runs it from T-1 down to 0 in the forward op's workspaces, then runs the net of weight gradients
that the rewrite deferred to after the loop. Both loops only run nets.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ShapeError, StepnetError
from ..core.limits import check_blob
from ..graph.step_nets import FORWARD, Link, Recurrence, StepNets, run, saved_steps, shared_scratch
from ..io.proto import NetDef, parse_text
from ..io.validate import NET_IN_ARG, decode_text
from .registry import NO_GRADIENT, Arg, op


class StepWorkspaces:
    """The `step_workspaces` blob: per-timestep workspaces and the workspace of blobs shared by all steps.
    `own`: the per-step blobs stepnet adds that Caffe2's step net has not (the saved LSTM activations), which
    RecurrentNetworkBlobFetcher leaves out."""

    def __init__(self, shared):
        self.shared = shared
        self.steps: list = []
        self.own: frozenset = frozenset()

    def step(self, t: int):
        while len(self.steps) <= t:
            self.steps.append(self.shared.child())
        return self.steps[t]

    def __repr__(self):
        return f"StepWorkspaces({len(self.steps)} steps)"


# ------------------------------------------------------------------------------------------- arguments
RNN_ARGS = {
    "step_net": Arg("net"), "backward_step_net": Arg("any", None),
    "recurrent_states": Arg("strs", []), "initial_recurrent_state_ids": Arg("ints", []),
    "link_internal": Arg("strs", []), "link_external": Arg("strs", []), "link_offset": Arg("ints", []),
    "link_window": Arg("ints", []),
    "alias_src": Arg("strs", []), "alias_dst": Arg("strs", []), "alias_offset": Arg("ints", []),
    "timestep": "timestep", "param": Arg("ints", []), "param_grads": Arg("strs", []),
    "outputs_with_grads": Arg("ints", []),
    "backward_link_internal": Arg("strs", []), "backward_link_external": Arg("strs", []),
    "backward_link_offset": Arg("ints", []),
    "recompute_blobs_on_backward": Arg("strs", []), "num_workspaces": 2,
    "enable_rnn_executor": 0,
}


def _backward_net(value, where: str, level: int):
    """The backward step net, or None in forward-only mode (absent, name-only or empty argument). `level`: that
    of the op's net."""
    if isinstance(value, NetDef):
        return value
    if isinstance(value, (str, bytes)) and value:
        where = f"{where}, argument 'backward_step_net'"
        text = value if isinstance(value, str) else decode_text(value, where, "the net's text")
        return parse_text(text, "net", where=where, depth=level + NET_IN_ARG)
    return None


def _links(internal, external, offset, window, what: str) -> list[Link]:
    if not len(internal) == len(external) == len(offset):
        raise ArgumentError(f"{what}_internal, {what}_external and {what}_offset must have the same length, got "
                            f"{len(internal)}, {len(external)}, {len(offset)}")
    window = list(window) or [1] * len(internal)
    if len(window) != len(internal):
        raise ArgumentError(f"link_window has {len(window)} entries for {len(internal)} links")
    for name, off in zip(internal, offset):
        if off < 0:
            raise ArgumentError(f"{what}_offset of {name!r} is {off}; link offsets must be >= 0")
    return [Link(*link) for link in zip(internal, external, offset, window)]


def _distinct_names(step_net: NetDef, backward: NetDef | None) -> None:
    if backward is not None and backward.name == step_net.name:
        raise ArgumentError(f"step_net and backward_step_net are both named {step_net.name!r}; a step workspace "
                            "keeps its nets by name (as Caffe2's does), so they need different names")


def _init_state(ws, name: str, init, T: int, N: int, where):
    """The (T + L) x N x D state tensor with its first L rows from the initial value (spec §3.5), held to the
    blob limit before it is allocated (T and N come from the sequence, D from the initial value)."""
    if init.ndim not in (1, 2, 3):
        raise ShapeError(f"initial value of recurrent state {name!r} has rank {init.ndim} {tuple(init.shape)}; "
                         "it must be 1-D (D, broadcast), 2-D (N x D) or 3-D (L x N x D)")
    D = init.shape[-1]
    L = init.shape[0] if init.ndim == 3 else 1
    if init.ndim >= 2 and init.shape[-2] != N:
        raise ShapeError(f"initial value of recurrent state {name!r} {tuple(init.shape)} has batch size "
                         f"{init.shape[-2]} but the input sequence has N = {N}")
    blob = ws.create_blob(name)
    shape = (T + L, N, D)
    state = blob.value
    if state is None or tuple(state.shape) != shape or state.dtype != init.dtype or type(state) is not type(init):
        check_blob(ws.limits.max_blob_bytes, name, shape, init.dtype, where)
        state = blob.value = _empty_like(init, shape)
    state[:L] = init.reshape((L, N, D)) if init.ndim >= 2 else init.reshape(1, 1, D)
    blob.view = False


def _empty_like(like, shape):
    out = np.zeros(shape, dtype=like.dtype)
    if type(like) is not np.ndarray:  # a device array: allocate on its device
        out = backend.to_device(out, backend.device_of(like))
    return out


def _sized(blob, shape, like, limit: int, where) -> None:
    """blob holds an array of `shape` (like's dtype and device): its own when it fits, else a new one, held to
    the blob limit before it is allocated (the values are the caller's to write)."""
    cur = blob.value
    if type(cur) is type(like) and cur.shape == shape and cur.dtype == like.dtype and not blob.view:
        return
    check_blob(limit, blob.name, shape, like.dtype, where)
    blob.value, blob.view = _empty_like(like, shape), False


def _zeroed(xp, blob, like):
    """Set blob to zeros shaped like `like` and return them: its previous array refilled when it fits (Caffe2
    keeps a tensor's buffer from run to run), else a new one."""
    cur = blob.value
    if not blob.view and type(cur) is type(like) and cur.shape == like.shape and cur.dtype == like.dtype:
        cur.fill(0)
        return cur
    blob.value = xp.zeros_like(like)
    blob.view = False
    return blob.value


# ------------------------------------------------------------------------------------------- forward op
class _Forward:
    """The forward op's configuration, parsed, checked and rewritten once (Caffe2 does this at op
    construction)."""

    def __init__(self, ctx, a):
        self.label = ctx.label
        self.timestep = a["timestep"]
        self.states = list(a["recurrent_states"])
        self.init_ids = list(a["initial_recurrent_state_ids"])
        if len(self.states) != len(self.init_ids):
            raise ArgumentError(f"recurrent_states ({len(self.states)}) and initial_recurrent_state_ids "
                                f"({len(self.init_ids)}) must have the same length")
        n_in = len(ctx.opdef.input)
        for r in self.init_ids:
            if not 0 <= r < n_in:
                raise ArgumentError(f"initial_recurrent_state_ids holds {r}, but the op has {n_in} inputs")
        links = _links(a["link_internal"], a["link_external"], a["link_offset"], a["link_window"], "link")
        if not len(a["alias_src"]) == len(a["alias_dst"]) == len(a["alias_offset"]):
            raise ArgumentError("alias_src, alias_dst and alias_offset must have the same length")
        self.aliases = list(zip(a["alias_src"], a["alias_dst"], a["alias_offset"]))
        for src, dst, _ in self.aliases:
            if src not in self.states:
                raise ArgumentError(f"alias {dst!r} names source {src!r}, which is not a recurrent state "
                                    f"({', '.join(self.states)})")
            if dst not in ctx.opdef.output:
                raise ArgumentError(f"alias destination {dst!r} is not an output of the op")
        backward = _backward_net(a["backward_step_net"], ctx.label, ctx.net.level)
        _distinct_names(a["step_net"], backward)
        self.recompute = list(a["recompute_blobs_on_backward"])
        self.forward_only = backward is None
        # saved LSTM activations: row t of one tensor per cell, allocated below for the run's T, N and D
        self.saved_steps = saved_steps(a["step_net"], backward, self.recompute, links, self.states)
        links += [s.link for s in self.saved_steps]
        rec = Recurrence(self.timestep, tuple(links), tuple(self.recompute),
                         owned=(*self.states, *(s.link.external for s in self.saved_steps)))
        self.own = frozenset(s.link.internal for s in self.saved_steps)
        nets = run(FORWARD, StepNets(a["step_net"], backward), rec)
        self.shared = [*self.recompute, *shared_scratch(nets, rec)]
        self.num_workspaces = max(1, a["num_workspaces"])
        self.loop = ctx.step_loop(nets.step, nets.local, self.timestep)

    def run(self, ctx, xp, inputs):
        if self.loop.rerun(inputs):      # the last run again, its checks and lookups done (compiled only)
            return
        ws = ctx.workspace
        x0 = inputs[0]
        if x0.ndim < 2:
            raise ShapeError(f"input 0 (the sequence) must be T x N x ..., got {tuple(x0.shape)}")
        T, N = x0.shape[0], x0.shape[1]
        for state, r in zip(self.states, self.init_ids):
            _init_state(ws, state, inputs[r], T, N, ctx.label)
        scratch_blob = ctx.outputs[-1]
        scratch = scratch_blob.value
        if not isinstance(scratch, StepWorkspaces):
            scratch = scratch_blob.value = StepWorkspaces(ws.child())
        scratch.own = self.own
        for name in self.shared:
            scratch.shared.create_local_blob(name)
        for saved in self.saved_steps:
            state = ws.find(saved.state).value
            _sized(scratch.shared.create_local_blob(saved.link.external), (T, 4, N, state.shape[-1]), state,
                   ws.limits.max_blob_bytes, ctx.label)
        k = self.num_workspaces if self.forward_only else None
        self.loop.run([scratch.step(t if k is None else t % k) for t in range(T)], range(T))
        for src, dst, offset in self.aliases:
            state = ws.find(src).value
            start = offset if offset >= 0 else state.shape[0] + offset
            if not 0 <= start <= state.shape[0]:
                raise ArgumentError(f"alias {dst!r}: offset {offset} is outside recurrent state {src!r} with "
                                    f"{state.shape[0]} rows")
            ws.create_blob(dst).set_view(state[start:])
        if T:
            self._keep(ctx, inputs)

    def _keep(self, ctx, inputs) -> None:
        """What a rerun needs (StepLoop.keep): each state's first rows and the shape an initial value takes
        there, the alias views, the step-workspaces blob."""
        ws, states = ctx.workspace, []
        for name, r in zip(self.states, self.init_ids):
            blob = ws.find(name)
            state, init = blob.value, inputs[r]
            L = init.shape[0] if init.ndim == 3 else 1
            rows = state[:L]
            shape = None if init.shape == rows.shape else (L, *state.shape[1:]) if init.ndim >= 2 else (1, 1, -1)
            states.append((blob, state, rows, shape, r))
        aliases = [(blob, blob.value) for blob in (ws.find(dst) for _, dst, _ in self.aliases)]
        scratch = ctx.outputs[-1]
        self.loop.keep(inputs, [*ctx.inputs, *(s[0] for s in states)], states, aliases, (scratch, scratch.value))

    def rerun(self, inputs, checked: bool = False) -> bool:
        """The last run again for inputs of its signature (checked: the caller checked them), where it ran
        compiled; False, having changed nothing, otherwise (then `run`)."""
        return self.loop.rerun(inputs, checked)

    @property
    def kept(self):
        """The run a rerun replays (a new object whenever a run keeps another), or None."""
        return self.loop.replay


def _recurrent_network_gradient(g):
    """RecurrentNetworkGradient([GO(i) for i in outputs_with_grads] + inputs + outputs) ->
    [GI(0)] + [GI(p) for p in param] + [GI(r) for r in initial_recurrent_state_ids] (spec §3.10)."""
    with_grads = list(g.arg("outputs_with_grads", []))
    if not with_grads:
        raise StepnetError("outputs_with_grads is empty, so no gradient can flow into the "
                           "RecurrentNetwork op; list the outputs that receive gradients", at=g.label)
    for i in with_grads:
        if not g.has_grad(i):
            raise StepnetError(f"gradient of output {i} ({g.O(i)!r}) is not provided, but it is in "
                               "outputs_with_grads", at=g.label)
    params = list(g.arg("param", []))
    inits = list(g.arg("initial_recurrent_state_ids", []))
    outputs = [g.GI(0)] + [g.GI(p) for p in params] + [g.GI(r) for r in inits]
    inputs = [g.GO(i) for i in with_grads] + list(g.def_.input) + list(g.def_.output)
    g.op("RecurrentNetworkGradient", inputs, outputs)


@op("RecurrentNetwork", inputs=(1, None), outputs=(2, None), context=True, args=RNN_ARGS,
    gradient=_recurrent_network_gradient,
    doc="Runs step_net once per timestep over link/alias windows of larger tensors (Caffe2's RNN op).",
    writes_unnamed=True, shapes_from_inputs=True)
def recurrent_network(ctx, xp, *inputs, **args):
    fwd = ctx.state.get("forward")
    if fwd is None:
        fwd = ctx.state["forward"] = _Forward(ctx, args)
    fwd.run(ctx, xp, inputs)
    return None


@op("RecurrentNetworkBlobFetcher", inputs=1, outputs=1, context=True, args={"prefix": "rnn"},
    gradient=NO_GRADIENT, writes_unnamed=True)
def blob_fetcher(ctx, xp, scratch, *, prefix):
    """Copy every step workspace's local blobs (those of Caffe2's step net: not the activations stepnet saves
    for the gradient) into this workspace as <prefix>_<blob><t>; output their names."""
    if not isinstance(scratch, StepWorkspaces):
        raise ArgumentError(f"input {ctx.opdef.input[0]!r} is not the step_workspaces output of a "
                            "RecurrentNetwork op")
    names = []
    for i, step_ws in enumerate(scratch.steps):
        for name in step_ws.local_blobs():
            value = step_ws.find(name).value
            if value is None or isinstance(value, StepWorkspaces) or name in scratch.own:
                continue
            new = f"{prefix}_{name}{i}"
            ctx.workspace.create_blob(new).value = np.array(value, copy=True) if hasattr(value, "shape") else value
            names.append(new)
    return np.array([n.encode("utf-8") for n in names], dtype=object)   # a string tensor: bytes
