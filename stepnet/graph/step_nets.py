"""RecurrentNetwork's step-net rewrites (spec §3.6–§3.13): from the step nets a file holds to the nets the
forward and gradient ops run, as ordered lists of pure rewrites of `StepNets` (FORWARD, BACKWARD).

Forward: the LSTM activations kept for the gradient, the timestep and link blobs declared as inputs, and one
`rnn_internal_apply_links` op first that points every link internal at its rows (what Caffe2's prepended
rnn_internal_apply_link ops do). Backward: the kept activations read instead of recomputed, per-step
parameter gradients (`<grad>_tmpstep`) summed into the op's gradients, the gradients of `_all` outputs
accumulated into the state gradients, FC weight gradients formed after the loop in one GEMM (the
`weight_gradients` net), and the links op first. Every rewrite returns new NetDefs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from .view import Graph, add_external_inputs, blob_names, copy_op, nested_nets, renamed, with_ops
from ..io.proto import DeviceOption, NetDef, OperatorDef, make_argument


ACTIVATIONS = "_rnn_activations"   # <gates><ACTIVATIONS>: the step-local blob of a saved LSTMUnit's activations
STEPS = "_steps"                   # <acts><STEPS>: every step's saved activations, T x 4 x N x D, the op's own


class Link(NamedTuple):
    """At timestep t, `internal` is a view of rows [t + offset, t + offset + window) of `external`."""
    internal: str
    external: str
    offset: int
    window: int


class ParamGradient(NamedTuple):
    """A parameter gradient of the gradient op: `grad`, its output, and `inner`, the name the backward step
    net writes one step's gradient under."""
    grad: str
    inner: str


@dataclass(frozen=True)
class Recurrence:
    """What the rewrites read from a RecurrentNetwork op (or its gradient op: the fields after `recompute`)."""
    timestep: str
    links: tuple[Link, ...]
    recompute: tuple[str, ...] = ()
    params: tuple[ParamGradient, ...] = ()
    accumulate: tuple[tuple[str, str], ...] = ()   # (gradient of an offset-1 alias, its state's gradient)
    sequence: str = ""                             # the op's sequence input, T x N x ...
    device_option: DeviceOption | None = None
    owned: tuple[str, ...] = ()    # tensors the op allocates and reuses from run to run (states, their gradients)
    rolling: tuple[str, ...] = ()  # state gradients kept as 2 rows: linked at rows (t + offset) mod their rows


class StepNets(NamedTuple):
    step: NetDef
    backward: NetDef | None = None
    weight_gradients: NetDef | None = None   # run once after the backward loop
    local: tuple[str, ...] = ()              # blobs each step workspace keeps for itself


Rewrite = Callable[[StepNets, Recurrence], StepNets]


def run(rewrites: tuple[Rewrite, ...], nets: StepNets, rec: Recurrence) -> StepNets:
    for rewrite in rewrites:
        nets = rewrite(nets, rec)
    return nets


# ------------------------------------------------------------------------------------------- saved LSTM
def lstm_pairs(step_net: NetDef, backward_net: NetDef, recompute) -> dict[str, str]:
    """{gates blob: activations blob} for every LSTMUnit of the step net whose LSTMUnitGradient in the backward
    step net reads the same states, gates, arguments and outputs, where nothing else writes the gates or the
    cell after the LSTMUnit and the gates are not recomputed on backward. Such a pair can run as
    rnn_internal_lstm_unit / rnn_internal_lstm_unit_gradient: the gradient then reads the activations the
    forward kept in the step workspace instead of recomputing them (same results, no second tanh pass)."""
    names = blob_names(step_net, backward_net)
    forward, backward = Graph(step_net.op), Graph(backward_net.op)
    pairs = {}
    for k, u in enumerate(step_net.op):
        if u.type != "LSTMUnit" or len(u.input) < 4 or len(u.output) != 2:
            continue
        gates, cell, acts = u.input[2], u.output[1], u.input[2] + ACTIVATIONS
        grads = [v for v in backward_net.op if v.type == "LSTMUnitGradient" and len(v.input) > 2
                 and v.input[2] == gates]
        rewritten = any(i > k for i in forward.writers(gates) + forward.writers(cell)) or \
            backward.writers(gates) or backward.writers(cell)
        if (gates in recompute or acts in names or gates in pairs or len(grads) != 1 or rewritten
                or sum(o.type == "LSTMUnit" and o.input[2:3] == [gates] for o in step_net.op) != 1):
            continue
        v = grads[0]
        n = len(u.input)
        if (list(v.input[:n]) != list(u.input) or list(v.input[n:n + 2]) != list(u.output)
                or sorted(a.SerializeToString() for a in v.arg) != sorted(a.SerializeToString() for a in u.arg)):
            continue
        pairs[gates] = acts
    return pairs


class SavedSteps(NamedTuple):
    """Where a saved LSTMUnit's activations live: `link` puts the step-local blob at row t of one T x 4 x N x D
    tensor the op keeps (link.external); `state` is the recurrent state the cell's c_prev links into (its N and
    D size the tensor); `dgates` is the gradient's output of the gate gradients."""
    link: Link
    state: str
    dgates: str


def saved_steps(step_net: NetDef, backward_net: NetDef | None, recompute, links, states) -> tuple[SavedSteps, ...]:
    """For each lstm_pairs pair whose LSTMUnit reads c_prev through a window-1 link into a recurrent state: its
    activations at row t of one tensor for all steps instead of an array per step (same memory), which the
    gradient op can then also hold its input gradient in (RecurrentNetworkGradient). Decided from the op's
    arguments alone, so the forward and the gradient op agree."""
    if backward_net is None:
        return ()
    pairs = lstm_pairs(step_net, backward_net, recompute)
    into_state = {link.internal: link.external for link in links if link.window == 1 and link.external in states}
    found = []
    for u in step_net.op:
        acts = pairs.get(u.input[2]) if u.type == "LSTMUnit" and len(u.input) > 2 else None
        if acts is None or u.input[1] not in into_state:
            continue
        grad = next(v for v in backward_net.op if v.type == "LSTMUnitGradient" and v.input[2] == u.input[2])
        if len(grad.output) != 3:
            continue
        found.append(SavedSteps(Link(acts, acts + STEPS, 0, 1), into_state[u.input[1]], grad.output[2]))
    return tuple(found)


def save_lstm_activations(nets: StepNets, rec: Recurrence) -> StepNets:
    """The lstm_pairs' LSTMUnit keeps its activations (rnn_internal_lstm_unit, one more output, step-local)
    and their LSTMUnitGradient reads them (rnn_internal_lstm_unit_gradient). Decided from the nets as written,
    so the forward and the gradient op agree."""
    if nets.backward is None:
        return nets
    pairs = lstm_pairs(nets.step, nets.backward, rec.recompute)
    step, back = [], []
    for o in nets.step.op:
        acts = pairs.get(o.input[2]) if len(o.input) > 2 and o.type == "LSTMUnit" else None
        if acts is not None:
            o = copy_op(o)
            o.type = "rnn_internal_lstm_unit"
            o.output.append(acts)
        step.append(o)
    for o in nets.backward.op:
        acts = pairs.get(o.input[2]) if len(o.input) > 2 and o.type == "LSTMUnitGradient" else None
        if acts is not None:
            o = copy_op(o)
            o.type = "rnn_internal_lstm_unit_gradient"
            o.input[2] = acts
        back.append(o)
    backward = add_external_inputs(with_ops(nets.backward, back), pairs.values())
    return nets._replace(step=with_ops(nets.step, step), backward=backward, local=nets.local + tuple(pairs.values()))


# ------------------------------------------------------------------------------------------- forward
def declare_step_inputs(nets: StepNets, rec: Recurrence) -> StepNets:
    """The timestep and every link's internal and external blob become external inputs of the step net."""
    step = add_external_inputs(nets.step, [rec.timestep, *(n for link in rec.links for n in link[:2])])
    if step.type == "rnn":
        step.type = "async_simple"
    return nets._replace(step=step)


def _links_op(rec: Recurrence, net: NetDef | None = None) -> OperatorDef:
    """The op that points every link internal at its rows (for the step net `net`); `keep` marks the links into
    tensors the op owns (rec.owned: the same arrays run after run), whose row views a compiled run makes once
    and keeps; `cyclic` the links into rolling state gradients (rec.rolling: rows (t + offset) mod the tensor's
    rows), and `zeroed` those of them at offset 0 that no op of the step writes before one reads them, or none
    writes at all (zeroed when pointed at, as the row of a full gradient tensor still is then)."""
    links = rec.links
    read_first = Graph(net.op).read_before_written() if net is not None else {}
    written = {name for o in net.op for name in o.output} if net is not None else set()
    cyclic = [int(link.external in rec.rolling) for link in links]
    args = [make_argument("offsets", [link.offset for link in links]),
            make_argument("windows", [link.window for link in links]),
            make_argument("keep", [int(link.external in rec.owned) for link in links])]
    if any(cyclic):
        args += [make_argument("cyclic", cyclic),
                 make_argument("zeroed", [c * int(link.offset == 0 and (link.internal in read_first
                                                                        or link.internal not in written))
                                          for c, link in zip(cyclic, links)])]
    return OperatorDef(type="rnn_internal_apply_links", input=[rec.timestep, *(link.external for link in links)],
                       output=[link.internal for link in links], arg=args)


def rolling_gradients(links, state_grads, backward: NetDef) -> tuple[str, ...]:
    """The state gradients that 2 rows can hold (rows t and t + 1 are all a backward step touches): every link
    into one has window 1 and offset 0 or 1, with one link at offset 0, and no op of the backward step net reads
    or writes the tensor itself (the gradient op also keeps every row where its weight-gradients net reads it)."""
    whole = {n for o in backward.op for n in (*o.input, *o.output)}
    rolling = []
    for grad in state_grads:
        into = [link for link in links if link.external == grad]
        if (into and grad not in whole and all(link.window == 1 and link.offset in (0, 1) for link in into)
                and sum(link.offset == 0 for link in into) == 1):
            rolling.append(grad)
    return tuple(rolling)


def apply_forward_links(nets: StepNets, rec: Recurrence) -> StepNets:
    if not rec.links:
        return nets
    return nets._replace(step=with_ops(nets.step, [_links_op(rec), *nets.step.op]))


FORWARD: tuple[Rewrite, ...] = (save_lstm_activations, declare_step_inputs, apply_forward_links)


def shared_scratch(nets: StepNets, rec: Recurrence) -> tuple[str, ...]:
    """The blobs of a training step net that need no copy per timestep: written before any op reads them in a
    step, and read by nothing after it (not the backward step net, which reads what it needs by name, nor the
    weight-gradients net), nor a link, the timestep, a step-local or recomputed blob. The forward op keeps them
    in the shared workspace, one buffer for all timesteps, as Caffe2 keeps recompute_blobs_on_backward blobs
    (an LSTM's gates before the saved activations: a quarter of its memory per timestep). None where a step
    net holds nested nets (their reads are not followed) or there is no backward step net."""
    if nets.backward is None or any(True for net in (nets.step, nets.backward) for o in net.op
                                    for _ in nested_nets(o)):
        return ()
    graph = Graph(nets.step.op)
    read_first = graph.read_before_written()
    kept = {*nets.local, *rec.recompute, rec.timestep, *(n for link in rec.links for n in link[:2]),
            *nets.step.external_input, *(n for o in nets.backward.op for n in o.input)}
    return tuple(name for name, version in graph.final.items()
                 if version and name not in read_first and name not in kept)


# ------------------------------------------------------------------------------------------- backward
def per_step_parameter_gradients(nets: StepNets, rec: Recurrence) -> StepNets:
    """Each step writes a parameter's gradient under `<inner>_tmpstep`, and a Sum at the end of the step adds
    it into the op's gradient output (spec §3.12)."""
    back = nets.backward
    for p in rec.params:
        back = renamed(back, {p.inner: p.inner + "_tmpstep"})
    sums = [OperatorDef(type="Sum", input=[p.grad, p.inner + "_tmpstep"], output=[p.grad]) for p in rec.params]
    return nets._replace(backward=add_external_inputs(with_ops(back, [*back.op, *sums]), [p.grad for p in rec.params]))


def accumulate_state_gradients(nets: StepNets, rec: Recurrence) -> StepNets:
    """Before each step, the gradient of an `_all` alias (offset 1) is added into row t + 1 of its state's
    gradient tensor (rnn_internal_accumulate_gradient_input); the timestep and link blobs become inputs."""
    ops = []
    for og, rg in rec.accumulate:
        acc = OperatorDef(type="rnn_internal_accumulate_gradient_input", input=[rec.timestep, og, rg],
                          output=[rg], arg=[make_argument("offset", 1)])
        if rg in rec.rolling:
            acc.arg.append(make_argument("cyclic", 1))
        if rec.device_option is not None:
            acc.device_option.CopyFrom(rec.device_option)
        ops.append(acc)
    back = with_ops(nets.backward, [*ops, *nets.backward.op])
    names = [*(n for pair in rec.accumulate for n in pair), rec.timestep, *(n for link in rec.links for n in link[:2])]
    return nets._replace(backward=add_external_inputs(back, names))


def _axis_args(o: OperatorDef) -> list | None:
    """The axis / axis_w Arguments of an FCGradient that can be deferred: three inputs, and each of those
    arguments (when given) a plain integer. Anything else is left as it is, for the op's own binding to report
    (naming its net and index)."""
    if len(o.input) != 3:
        return None
    kept = []
    for a in o.arg:
        if a.name in ("axis", "axis_w"):
            if {field.name for field, _ in a.ListFields()} != {"name", "i"}:
                return None
            kept.append(a)
    return kept


def _row_links(graph: Graph, index: int, x: str, dy: str, rec: Recurrence):
    """((X's linked tensor, offset), (dY's, offset)) when the FCGradient at `index` of the backward step net
    reads X and dY as window-1 link views whose rows hold, after the backward loop, every step's X and dY: no
    backward op writes X, dY after that FCGradient, or either linked tensor by name; no backward op writes a
    link into X's tensor, and dY's tensor has no other link. Else None (the rows are then copied per step)."""
    links = {link.internal: link for link in rec.links}
    lx, ldy = links.get(x), links.get(dy)
    if lx is None or ldy is None or lx.window != 1 or ldy.window != 1 or lx.external == ldy.external:
        return None
    written = {name for o in graph.ops for name in o.output}
    if (x in written or lx.external in written or ldy.external in written
            or any(i > index for i in graph.writers(dy))
            or any(link.external == lx.external and link.internal in written for link in rec.links)
            or sum(link.external == ldy.external for link in rec.links) != 1):
        return None
    return (lx.external, lx.offset), (ldy.external, ldy.offset)


def defer_fc_weight_gradients(nets: StepNets, rec: Recurrence) -> StepNets:
    """An FCGradient whose dW and db are `_tmpstep` parameter gradients used nowhere else computes dX per step
    and keeps that step's X and dY rows (rnn_internal_fc_gradient_deferred); after the loop one GEMM over all
    rows adds dW and db into the op's gradients (rnn_internal_fc_weight_gradient, in `weight_gradients`).
    Where X and dY are link views whose tensors hold every step's rows after the loop (_row_links: an LSTM's
    previous hidden state and its gates' gradient), nothing is copied: the step computes dX alone
    (rnn_internal_fc_input_gradient) and the GEMM reads those tensors' rows
    (rnn_internal_fc_weight_gradient_linked). The per-step Sums of the two gradients go away. The same sum, in
    far fewer and larger products."""
    back = nets.backward
    tmp_to_grad = {p.inner + "_tmpstep": p.grad for p in rec.params}
    graph = Graph(back.op)
    ops, after, drop, rows = [], [], set(), []
    for i, o in enumerate(back.op):
        dw, db = (o.output[0], o.output[1]) if o.type == "FCGradient" and len(o.output) == 3 else (None, None)
        if dw not in tmp_to_grad or db not in tmp_to_grad or graph.uses(dw) != 2 or graph.uses(db) != 2:
            ops.append(o)
            continue
        axes = _axis_args(o)
        if axes is None:
            ops.append(o)
            continue
        grad_w, grad_b = tmp_to_grad[dw], tmp_to_grad[db]
        xs, dys = grad_w + "_rnn_x", grad_w + "_rnn_dy"
        x, w, dy = o.input
        deferred = copy_op(o)
        del deferred.arg[:]
        deferred.arg.extend(axes)
        linked = _row_links(graph, i, x, dy, rec)
        if linked is None:
            deferred.type = "rnn_internal_fc_gradient_deferred"
            deferred.input[:] = [rec.timestep, rec.sequence, x, w, dy, xs, dys]
            deferred.output[:] = [o.output[2], xs, dys]
            gemm = OperatorDef(type="rnn_internal_fc_weight_gradient", input=[xs, dys, grad_w, grad_b],
                               output=[grad_w, grad_b])
            rows += [xs, dys]
        else:
            (x_states, x_offset), (dy_states, dy_offset) = linked
            deferred.type = "rnn_internal_fc_input_gradient"
            deferred.input[:] = [x, w, dy]
            deferred.output[:] = [o.output[2]]
            gemm = OperatorDef(type="rnn_internal_fc_weight_gradient_linked",
                               input=[rec.sequence, x_states, dy_states, grad_w, grad_b], output=[grad_w, grad_b],
                               arg=[make_argument("x_offset", x_offset), make_argument("dy_offset", dy_offset)])
        ops.append(deferred)
        if o.HasField("device_option"):
            gemm.device_option.CopyFrom(o.device_option)
        after.append(gemm)
        drop.update((dw, db))
    if not after:
        return nets
    ops = [o for o in ops if not (o.type == "Sum" and len(o.input) == 2 and o.input[1] in drop)]
    weights = NetDef(name=f"{back.name or 'backward_step'}_weight_gradients", op=after,
                     external_input=[n for o in after for n in o.input])
    return nets._replace(backward=add_external_inputs(with_ops(back, ops), rows), weight_gradients=weights)


def apply_backward_links(nets: StepNets, rec: Recurrence) -> StepNets:
    if not rec.links:
        return nets
    return nets._replace(backward=with_ops(nets.backward, [_links_op(rec, nets.backward), *nets.backward.op]))


BACKWARD: tuple[Rewrite, ...] = (save_lstm_activations, per_step_parameter_gradients, accumulate_state_gradients,
                                 defer_fc_weight_gradients, apply_backward_links)
