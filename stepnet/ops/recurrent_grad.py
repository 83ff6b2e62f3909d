"""RecurrentNetworkGradient: backpropagation through time over the forward op's step workspaces (spec §3.10–
§3.12). The backward step net is rewritten once (stepnet.graph.step_nets.BACKWARD); each run zeroes the
gradient tensors, runs it from T-1 down to 0, then runs the net of FC weight gradients deferred to after the
loop, and returns the gradients of the initial states."""
from __future__ import annotations

import dataclasses

from ..core.errors import ArgumentError, MissingBlobError, ShapeError
from ..graph.step_nets import (ACTIVATIONS, BACKWARD, Link, ParamGradient, Recurrence, StepNets,
                               rolling_gradients, run, saved_steps)
from ..graph.view import Graph
from .recurrent import RNN_ARGS, StepWorkspaces, _backward_net, _distinct_names, _links, _zeroed
from .registry import op


class _Backward:
    """The gradient op's rewritten backward step net and bookkeeping (spec §3.11)."""

    def __init__(self, ctx, a):
        opdef = ctx.opdef
        self.label = ctx.label
        renames = {arg.name[:-len(".rename")]: arg.s.decode() for arg in opdef.arg if arg.name.endswith(".rename")}

        def r(name: str) -> str:   # memonger's renaming map
            return renames.get(name, name)
        self.timestep = a["timestep"]
        G = self.G = len(a["outputs_with_grads"])
        self.states = list(a["recurrent_states"])
        self.init_ids = list(a["initial_recurrent_state_ids"])
        self.params = list(a["param"])
        net = _backward_net(a["backward_step_net"], ctx.label, ctx.net.level)
        if net is None:
            raise ArgumentError("RecurrentNetworkGradient needs a backward_step_net")
        _distinct_names(a["step_net"], net)
        links = _links(a["link_internal"], a["link_external"], a["link_offset"], a["link_window"], "link")
        steps = saved_steps(a["step_net"], net, a["recompute_blobs_on_backward"], links, self.states)  # as forward
        links += [Link(i, e, o, 1) for i, e, o, _ in _links(a["backward_link_internal"], a["backward_link_external"],
                                                             a["backward_link_offset"], [], "backward_link")]
        links = [Link(r(i), r(e), o, w) for i, e, o, w in links] + [s.link for s in steps]
        grad_names = list(a["param_grads"])
        params = []
        self.param_grads = []   # (forward parameter blob, its gradient output)
        for i, p in enumerate(self.params):
            grad = opdef.output[1 + i]
            params.append(ParamGradient(grad, r(grad_names[i]) if grad_names else grad))
            self.param_grads.append((opdef.input[G + p], grad))
        self.state_grads = []   # (state, its gradient tensor, the gradient of its last row from an offset -1 alias)
        accumulate = []
        with_grads = list(a["outputs_with_grads"])
        aliases = list(zip(a["alias_src"], a["alias_dst"], a["alias_offset"]))
        for s in self.states:
            rg, last = r(s + "_grad"), None
            for j, (src, dst, offset) in enumerate(aliases):  # alias j is output j (Caffe2's convention)
                if src != s or j not in with_grads:
                    continue
                k = with_grads.index(j)
                if offset == 1:
                    accumulate.append((opdef.input[k], rg))
                elif offset == -1:
                    last = opdef.input[k]
                else:
                    raise ArgumentError(f"alias {dst!r} has offset {offset}; only aliases with offset 1 (all "
                                        "steps) or -1 (last step) can receive gradients")
            self.state_grads.append((s, rg, last))
        self.input_grad = r(opdef.input[G] + "_grad")
        self.in_activations = _input_gradient_home(steps, links, self.input_grad, net)
        owned = (*self.states, *(rg for _, rg, _ in self.state_grads), *(s.link.external for s in steps),
                 *([self.input_grad] if self.in_activations else []))   # (then the op's memory too)
        rec = Recurrence(self.timestep, tuple(links), tuple(a["recompute_blobs_on_backward"]), tuple(params),
                         tuple(accumulate), opdef.input[G], ctx.device_option, owned,
                         rolling_gradients(links, [rg for _, rg, _ in self.state_grads], net))
        # link internals viewing tensors the op does not own (the input projection and its gradient): let go
        # after the loop, so that the main net may compute the next input projection into this one's memory
        self.borrowed = tuple({link.internal for link in links if link.external not in owned})
        nets = run(BACKWARD, StepNets(a["step_net"], net), rec)
        if nets.weight_gradients is not None and set(rec.rolling) & {
                n for o in nets.weight_gradients.op for n in (*o.input, *o.output)}:
            rec = dataclasses.replace(rec, rolling=())       # the weight gradients read every row: keep them
            nets = run(BACKWARD, StepNets(a["step_net"], net), rec)
        self.rolling = set(rec.rolling)
        self.net, self.weight_gradients, self.saved = nets.backward, nets.weight_gradients, nets.local
        self.produced = [name for o in self.net.op for name in o.output]
        self.home = (None, None)    # (the activations tensor, the input gradient's view of it), made once
        self.loop = ctx.step_loop(self.net, (), self.timestep)

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
        for param, grad in self.param_grads:
            _zeroed(xp, ws.create_blob(grad), ws.get_blob(param).value)
        for i, (s, rg, last) in enumerate(self.state_grads):
            state = ws.get_blob(s).value
            if state.ndim != 3:
                raise ShapeError(f"recurrent state {s!r} must be 3-D, got {tuple(state.shape)}")
            # a rolling gradient: rows t and t + 1 (mod 2) are all step t touches, and the initial state's
            # gradient is row 0 (an initial value of one row)
            init = inputs[G + self.init_ids[i]] if i < len(self.init_ids) else None
            rolls = (rg in self.rolling and init is not None and (init.ndim < 3 or init.shape[0] == 1)
                     and state.shape[0] > 2)
            grad = _zeroed(xp, ws.create_blob(rg), state[:2] if rolls else state)
            if last is not None:
                row = grad[(state.shape[0] - 1) % grad.shape[0]]       # the last row of the state's gradient
                lg = ws.get_blob(last).value
                if lg.size != row.size:
                    raise ShapeError(f"gradient {last!r} {tuple(lg.shape)} does not match a row of {s!r} "
                                     f"{tuple(state.shape[1:])}")
                row += lg.reshape(row.shape)
        home = scratch.shared.local_blob(self.in_activations) if self.in_activations else None
        acts = None if home is None else home.value
        if type(acts) is type(x0) and acts.dtype == x0.dtype and acts.size == x0.size and acts.flags.c_contiguous:
            if self.home[0] is not acts or self.home[1].shape != x0.shape:
                self.home = (acts, acts.reshape(x0.shape))   # (the same view run after run: its rows' views kept)
            blob = ws.create_blob(self.input_grad)      # every row is written by the loop: no zeroing
            blob.value, blob.view = self.home[1], False
        else:
            _zeroed(xp, ws.create_blob(self.input_grad), x0)
        if T:
            self._loop(ctx, scratch, T)
        return self._initial_state_gradients(ws, inputs)

    def _loop(self, ctx, scratch, T: int) -> None:
        first = scratch.steps[0]
        for acts in self.saved:
            if first.find(acts) is None:
                raise MissingBlobError(
                    f"the forward RecurrentNetwork kept no {acts!r} (the activations of its LSTMUnit over "
                    f"{acts[:-len(ACTIVATIONS)]!r}) in its step workspaces: the forward and gradient ops must have "
                    "the same step_net, backward_step_net and recompute_blobs_on_backward arguments")
        for name in self.produced:  # backward-only temporaries (link internals included) are shared by all steps
            if first.find(name) is None:
                scratch.shared.create_local_blob(name)
        self.loop.run(scratch.steps[:T], range(T - 1, -1, -1))
        if self.weight_gradients is not None:
            ctx.bind(self.weight_gradients, scratch.shared).run()
        for step in scratch.steps[:T]:    # every link is pointed at its rows again before a step reads it
            for name in self.borrowed:
                blob = step.local_blob(name)
                if blob is not None and blob.view:
                    blob.value, blob.view = None, False

    def _initial_state_gradients(self, ws, inputs) -> list:
        results = []
        for (_, rg, _), r in zip(self.state_grads, self.init_ids):
            init = inputs[self.G + r]
            grad = ws.get_blob(rg).value
            if init.ndim >= 2:
                L = init.shape[0] if init.ndim == 3 else 1
                results.append(grad[:L].reshape(init.shape))
            else:
                results.append(grad[0].sum(axis=0))
        return results


def _input_gradient_home(steps, links, input_grad: str, backward) -> str | None:
    """The tensor of saved activations that can hold the op's input gradient too (None: none can): that of the
    LSTM cell whose gate gradients are the input gradient's rows (a window-1 link at offset 0), which nothing in
    the backward step net reads before the cell's gradient writes them. Step t's gate gradients then take the
    place of step t's activations, which that gradient has read (a copy first: they share rows), and the input
    gradient needs no zeroing and no memory of its own."""
    read_first = Graph(backward.op).read_before_written()
    homes = [s.link.external for s in steps if s.dgates not in read_first and any(
        link.internal == s.dgates and link.external == input_grad and link.offset == 0 and link.window == 1
        for link in links)]
    return homes[0] if len(homes) == 1 else None


@op("RecurrentNetworkGradient", inputs=(1, None), outputs=(1, None), context=True, args=RNN_ARGS,
    doc="Backpropagation through time for RecurrentNetwork, running backward_step_net from T-1 to 0.",
    writes_unnamed=True, shapes_from_inputs=True)
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

