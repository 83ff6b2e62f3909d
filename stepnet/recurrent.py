"""RecurrentNetwork and its gradient: step nets run once per timestep over link/alias views (spec §3).

The forward op prepares its step net once, keeps one workspace per timestep (or K rotating ones when there
is no backward pass) in the `step_workspaces` output, and runs the step net T times, first pointing each link
internal at its rows (what Caffe2's prepended rnn_internal_apply_link ops do). Link internals are views into
the state/input tensors, so what step ops write lands in them. The gradient op rewrites the backward step net
(gradient accumulation, `_tmpstep` parameter gradients summed across timesteps), sets the forward and
backward links the same way and runs it from T-1 down to 0 in the forward op's workspaces.
"""
from __future__ import annotations

import weakref

import numpy as np

from .errors import ArgumentError, MissingBlobError, ShapeError, StepnetError
from .ops.registry import NO_GRADIENT, Arg, op
from .proto import NetDef, OperatorDef, make_argument, parse_text
from .rnn_internal import _defer_fc_parameter_gradients, bind_links, lstm_pairs, save_lstm_activations, set_links
from .workspace import Workspace


class StepWorkspaces:
    """The `step_workspaces` blob: per-timestep workspaces and the workspace of blobs shared by all steps."""

    def __init__(self, shared: Workspace):
        self.shared = shared
        self.steps: list[Workspace] = []

    def step(self, t: int) -> Workspace:
        while len(self.steps) <= t:
            self.steps.append(Workspace(parent=self.shared))
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


def _backward_net(value, where: str):
    """The backward step net, or None in forward-only mode (absent, name-only or empty argument)."""
    if isinstance(value, NetDef):
        return value
    if isinstance(value, (str, bytes)) and value:
        return parse_text(value if isinstance(value, str) else value.decode(), "net",
                          where=f"{where}, argument 'backward_step_net'")
    return None


def _links(internal, external, offset, window, what: str):
    if not len(internal) == len(external) == len(offset):
        raise ArgumentError(f"{what}_internal, {what}_external and {what}_offset must have the same length, got "
                            f"{len(internal)}, {len(external)}, {len(offset)}")
    window = list(window) or [1] * len(internal)
    if len(window) != len(internal):
        raise ArgumentError(f"link_window has {len(window)} entries for {len(internal)} links")
    for name, off in zip(internal, offset):
        if off < 0:
            raise ArgumentError(f"{what}_offset of {name!r} is {off}; link offsets must be >= 0")
    return list(zip(internal, external, offset, window))


def _extend_inputs(net: NetDef, names) -> None:
    for name in names:
        if name not in net.external_input:
            net.external_input.append(name)


def _prepend(net: NetDef, ops) -> None:
    rest = list(net.op)
    del net.op[:]
    net.op.extend(list(ops) + rest)


def _init_state(ws: Workspace, name: str, init, T: int, N: int, label: str):
    """The (T + L) x N x D state tensor with its first L rows from the initial value (spec §3.5)."""
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
        state = blob.value = _empty_like(init, shape)
    state[:L] = init.reshape((L, N, D)) if init.ndim >= 2 else init.reshape(1, 1, D)
    blob.view = False
    return state, L


def _empty_like(like, shape):
    out = np.zeros(shape, dtype=like.dtype)
    if type(like) is not np.ndarray:  # a device array: allocate on its device
        from . import backend
        out = backend.to_device(out, backend.device_of(like))
    return out


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


def _step_net(step_ws: Workspace, net: NetDef, timestep: str):
    """The step net bound in its step workspace (bound on first use). A missing input is reported with the
    timestep blob's name, since a step net reading another timestep name than the op's `timestep` argument is
    the usual cause (Caffe2 fails the same way: "Encountered a non-existing input blob")."""
    bound = step_ws._nets.get(net.name)
    if bound is not None:
        return bound
    try:
        return step_ws.create_net(net)
    except MissingBlobError as e:
        raise MissingBlobError(f"{e}. The step net's inputs must be op inputs, link internals, blobs made by "
                               f"earlier step ops, or the timestep blob, which argument 'timestep' names "
                               f"{timestep!r}") from None


# ------------------------------------------------------------------------------------------- forward op
class _Forward:
    """The forward op's configuration, parsed and checked once (Caffe2 does this at op construction)."""

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
        self.links = _links(a["link_internal"], a["link_external"], a["link_offset"], a["link_window"], "link")
        if not len(a["alias_src"]) == len(a["alias_dst"]) == len(a["alias_offset"]):
            raise ArgumentError("alias_src, alias_dst and alias_offset must have the same length")
        self.aliases = list(zip(a["alias_src"], a["alias_dst"], a["alias_offset"]))
        for src, dst, _ in self.aliases:
            if src not in self.states:
                raise ArgumentError(f"alias {dst!r} names source {src!r}, which is not a recurrent state "
                                    f"({', '.join(self.states)})")
            if dst not in ctx.opdef.output:
                raise ArgumentError(f"alias destination {dst!r} is not an output of the op")
        self.backward = _backward_net(a["backward_step_net"], ctx.label)
        self.step_net = self._rewrite(a["step_net"])
        if self.backward is not None and self.backward.name == self.step_net.name:
            raise ArgumentError(f"step_net and backward_step_net are both named {self.step_net.name!r}; they "
                                "are cached by name in each step workspace, so they need different names")
        self.recompute = list(a["recompute_blobs_on_backward"])
        self.saved = {}
        if self.backward is not None:
            self.saved = lstm_pairs(a["step_net"], self.backward, self.recompute)
            save_lstm_activations(self.step_net, self.saved, True)
        self.bound = weakref.WeakKeyDictionary()  # step workspace -> (its timestep blob, its link blobs)
        self.num_workspaces = max(1, a["num_workspaces"])

    def _rewrite(self, step_net: NetDef) -> NetDef:
        net = NetDef()
        net.CopyFrom(step_net)
        if net.type == "rnn":
            net.type = "async_simple"
        _extend_inputs(net, [self.timestep])
        for internal, external, _, _ in self.links:
            _extend_inputs(net, [internal, external])
        return net  # link views are set by the loop (set_links), not by prepended rnn_internal_apply_link ops

    def run(self, ctx, xp, inputs):
        ws = ctx.workspace
        x0 = inputs[0]
        if x0.ndim < 2:
            raise ShapeError(f"input 0 (the sequence) must be T x N x ..., got {tuple(x0.shape)}")
        T, N = x0.shape[0], x0.shape[1]
        rows = {}
        for state, r in zip(self.states, self.init_ids):
            arr, L = _init_state(ws, state, inputs[r], T, N, self.label)
            rows[state] = arr
        scratch_blob = ctx.outputs[-1]
        scratch = scratch_blob.value
        if not isinstance(scratch, StepWorkspaces):
            scratch = scratch_blob.value = StepWorkspaces(Workspace(parent=ws))
        for name in self.recompute:
            scratch.shared.create_local_blob(name)
        k = None if self.backward is not None else self.num_workspaces
        for t in range(T):
            step_ws = scratch.step(t if k is None else t % k)
            bound = self.bound.get(step_ws)
            if bound is None:
                timestep = step_ws.create_blob(self.timestep)
                for name in self.saved.values():  # per step, even if an outer workspace has a blob of that name
                    step_ws.create_local_blob(name)
                bound = self.bound[step_ws] = (timestep, bind_links(step_ws, self.links))
            bound[0].value = np.array([t], dtype=np.int32)
            set_links(bound[1], t)
            _step_net(step_ws, self.step_net, self.timestep).run()
        for src, dst, offset in self.aliases:
            state = ws.find(src).value
            start = offset if offset >= 0 else state.shape[0] + offset
            if not 0 <= start <= state.shape[0]:
                raise ArgumentError(f"alias {dst!r}: offset {offset} is outside recurrent state {src!r} with "
                                    f"{state.shape[0]} rows")
            ws.create_blob(dst).set_view(state[start:])


def _recurrent_network_gradient(g):
    """RecurrentNetworkGradient([GO(i) for i in outputs_with_grads] + inputs + outputs) ->
    [GI(0)] + [GI(p) for p in param] + [GI(r) for r in initial_recurrent_state_ids] (spec §3.10)."""
    with_grads = list(g.arg("outputs_with_grads", []))
    if not with_grads:
        raise StepnetError(f"{g.label}: outputs_with_grads is empty, so no gradient can flow into the "
                           "RecurrentNetwork op; list the outputs that receive gradients")
    for i in with_grads:
        if not g.has_grad(i):
            raise StepnetError(f"{g.label}: gradient of output {i} ({g.O(i)!r}) is not provided, but it is in "
                               "outputs_with_grads")
    params = list(g.arg("param", []))
    inits = list(g.arg("initial_recurrent_state_ids", []))
    outputs = [g.GI(0)] + [g.GI(p) for p in params] + [g.GI(r) for r in inits]
    inputs = [g.GO(i) for i in with_grads] + list(g.def_.input) + list(g.def_.output)
    g.op("RecurrentNetworkGradient", inputs, outputs)


@op("RecurrentNetwork", inputs=(1, None), outputs=(2, None), context=True, args=RNN_ARGS,
    gradient=_recurrent_network_gradient,
    doc="Runs step_net once per timestep over link/alias windows of larger tensors (Caffe2's RNN op).")
def recurrent_network(ctx, xp, *inputs, **args):
    fwd = ctx.state.get("forward")
    if fwd is None:
        fwd = ctx.state["forward"] = _Forward(ctx, args)
    fwd.run(ctx, xp, inputs)
    return None


# ------------------------------------------------------------------------------------------- gradient
class _Backward:
    """The gradient op's rewritten backward step net and bookkeeping (spec §3.11)."""

    def __init__(self, ctx, a):
        opdef = ctx.opdef
        self.label = ctx.label
        renames = {arg.name[:-len(".rename")]: arg.s.decode() for arg in opdef.arg if arg.name.endswith(".rename")}
        self.remap = lambda name: renames.get(name, name)
        self.timestep = a["timestep"]
        self.G = len(a["outputs_with_grads"])
        self.states = list(a["recurrent_states"])
        self.init_ids = list(a["initial_recurrent_state_ids"])
        self.params = list(a["param"])
        net = _backward_net(a["backward_step_net"], ctx.label)
        if net is None:
            raise ArgumentError("RecurrentNetworkGradient needs a backward_step_net")
        step_net = a["step_net"]
        if net.name == step_net.name:
            raise ArgumentError(f"step_net and backward_step_net are both named {net.name!r}; give them "
                                "different names")
        r = self.remap
        links = _links(a["link_internal"], a["link_external"], a["link_offset"], a["link_window"], "link")
        links += [(i, e, o, 1) for i, e, o, _ in _links(a["backward_link_internal"], a["backward_link_external"],
                                                          a["backward_link_offset"], [], "backward_link")]
        links = [(r(i), r(e), o, w) for i, e, o, w in links]
        bnet = NetDef()
        bnet.CopyFrom(net)
        self.saved = lstm_pairs(step_net, net, list(a["recompute_blobs_on_backward"]))
        save_lstm_activations(bnet, self.saved, False)
        self.param_grads = []
        grad_names = list(a["param_grads"])
        for i, p in enumerate(self.params):
            grad = opdef.output[1 + i]
            cell = (r(grad_names[i]) if grad_names else grad)
            tmp = cell + "_tmpstep"
            for o in bnet.op:
                o.input[:] = [tmp if n == cell else n for n in o.input]
                o.output[:] = [tmp if n == cell else n for n in o.output]
            self.param_grads.append((opdef.input[self.G + p], grad, tmp))
        self.state_grads = []
        accumulate = []
        aliases = list(zip(a["alias_src"], a["alias_dst"], a["alias_offset"]))
        device = opdef.device_option if opdef.HasField("device_option") else None
        for s in self.states:
            rg = r(s + "_grad")
            last = None
            for j, (src, dst, offset) in enumerate(aliases):  # alias j is output j (Caffe2's convention)
                if src != s or j not in a["outputs_with_grads"]:
                    continue
                k = list(a["outputs_with_grads"]).index(j)
                if offset == 1:
                    acc = OperatorDef(type="rnn_internal_accumulate_gradient_input",
                                      input=[self.timestep, opdef.input[k], rg], output=[rg],
                                      arg=[make_argument("offset", 1)])
                    if device is not None:
                        acc.device_option.CopyFrom(device)
                    accumulate.append(acc)
                    _extend_inputs(bnet, [opdef.input[k], rg])
                elif offset == -1:
                    last = opdef.input[k]
                else:
                    raise ArgumentError(f"alias {dst!r} has offset {offset}; only aliases with offset 1 (all "
                                        "steps) or -1 (last step) can receive gradients")
            self.state_grads.append((s, rg, last))
        _extend_inputs(bnet, [self.timestep])
        for internal, external, _, _ in links:
            _extend_inputs(bnet, [internal, external])
        self.links = links  # set as views by the loop before each step (what Caffe2's prepended link ops do)
        _prepend(bnet, accumulate)
        for _, grad, tmp in self.param_grads:
            bnet.op.append(OperatorDef(type="Sum", input=[grad, tmp], output=[grad]))
            _extend_inputs(bnet, [grad])
        self.deferred = _defer_fc_parameter_gradients(bnet, self.param_grads)
        self.bound = weakref.WeakKeyDictionary()
        self.net = bnet
        self.produced = [name for o in bnet.op for name in o.output] + [link[0] for link in links]
        self.input_grad = r(opdef.input[self.G] + "_grad")

    def run(self, ctx, xp, inputs):
        ws = ctx.workspace
        G = self.G
        x0 = inputs[G]
        T = x0.shape[0]
        scratch = inputs[-1]
        if not isinstance(scratch, StepWorkspaces) or len(scratch.steps) < T:
            have = len(scratch.steps) if isinstance(scratch, StepWorkspaces) else 0
            raise MissingBlobError(
                f"the forward RecurrentNetwork kept {have} step workspaces in {ctx.opdef.input[-1]!r} but this "
                f"gradient needs {T}: run the forward op (with a backward_step_net, not forward-only) first")
        fresh = [_zeroed(xp, ws.create_blob(grad), ws.get_blob(param).value) for param, grad, _ in self.param_grads]
        for s, rg, last in self.state_grads:
            state = ws.get_blob(s).value
            if state.ndim != 3:
                raise ShapeError(f"recurrent state {s!r} must be 3-D, got {tuple(state.shape)}")
            grad = _zeroed(xp, ws.create_blob(rg), state)
            if last is not None:
                lg = ws.get_blob(last).value
                if lg.size != grad[-1].size:
                    raise ShapeError(f"gradient {last!r} {tuple(lg.shape)} does not match a row of {s!r} "
                                     f"{tuple(state.shape[1:])}")
                grad[-1] += lg.reshape(grad[-1].shape)
        _zeroed(xp, ws.create_blob(self.input_grad), x0)
        first = scratch.steps[0]
        for gates, acts in self.saved.items():
            if first.find(acts) is None:
                raise MissingBlobError(
                    f"the forward RecurrentNetwork kept no {acts!r} (the activations of its LSTMUnit over "
                    f"{gates!r}) in its step workspaces: the forward and gradient ops must have the same step_net, "
                    "backward_step_net and recompute_blobs_on_backward arguments")
        for name in self.produced:  # backward-only temporaries (link internals included) are shared by all steps
            if first.find(name) is None:
                scratch.shared.create_local_blob(name)
        for d in self.deferred:
            d.start(scratch.shared, T)
        for t in range(T - 1, -1, -1):
            step_ws = scratch.steps[t]
            bound = self.bound.get(step_ws)
            if bound is None:
                bound = self.bound[step_ws] = bind_links(step_ws, self.links)
            set_links(bound, t)
            _step_net(step_ws, self.net, self.timestep).run()
        for d in self.deferred:
            d.finish(xp, ws, scratch.shared, fresh)
        results = []
        for (_, rg, _), r in zip(self.state_grads, self.init_ids):
            init = inputs[G + r]
            grad = ws.get_blob(rg).value
            if init.ndim >= 2:
                L = init.shape[0] if init.ndim == 3 else 1
                results.append(grad[:L].reshape(init.shape))
            else:
                results.append(grad[0].sum(axis=0))
        return results


@op("RecurrentNetworkGradient", inputs=(1, None), outputs=(1, None), context=True, args=RNN_ARGS,
    doc="Backpropagation through time for RecurrentNetwork, running backward_step_net from T-1 to 0.")
def recurrent_network_gradient(ctx, xp, *inputs, **args):
    bwd = ctx.state.get("backward")
    if bwd is None:
        bwd = ctx.state["backward"] = _Backward(ctx, args)
    init_grads = bwd.run(ctx, xp, inputs)
    n_params = len(bwd.params)
    for blob, value in zip(ctx.outputs[1 + n_params:], init_grads):
        if value.base is not None:
            blob.set_view(value)
        else:
            blob.value = value
            blob.view = False
    return None


@op("RecurrentNetworkBlobFetcher", inputs=1, outputs=1, context=True, args={"prefix": "rnn"},
    gradient=NO_GRADIENT)
def blob_fetcher(ctx, xp, scratch, *, prefix):
    """Copy every step workspace's local blobs into this workspace as <prefix>_<blob><t>; output their names."""
    if not isinstance(scratch, StepWorkspaces):
        raise ArgumentError(f"input {ctx.opdef.input[0]!r} is not the step_workspaces output of a "
                            "RecurrentNetwork op")
    names = []
    for i, step_ws in enumerate(scratch.steps):
        for name in step_ws.local_blobs():
            value = step_ws.find(name).value
            if value is None or isinstance(value, StepWorkspaces):
                continue
            new = f"{prefix}_{name}{i}"
            ctx.workspace.create_blob(new).value = np.array(value, copy=True) if hasattr(value, "shape") else value
            names.append(new)
    return np.array(names, dtype=object)

