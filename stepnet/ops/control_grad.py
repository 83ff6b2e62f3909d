"""Gradients of the ops that run nested nets: what they share (their net arguments, the output gradients made
distinct, the backward pass over a nested net) and the gradient of While. If's gradient is next to If in
control.py, Do's next to Do in scopes.py.

While's gradient is built as Caffe2's control_ops_grad.py builds it (gen_while_gradient): its loop_net must be one
Do op, which pushes a workspace per iteration onto its workspace stack, and the gradient is a While over the
backward net of that Do, whose gradient Do pops those workspaces in reverse (run while HasScope says some are left),
so each backward iteration reads the blobs of its forward iteration. A blob the loop body reads and writes (a
state) carries its gradient from one backward iteration to the one before: the gradient Do writes it, the
gradient While's cond_net copies it to the name the next gradient Do reads; before the loop it starts as the
output's gradient, so a loop that ran no iteration passes that through. Its running gradients have private names
(`_<blob>_grad_while`), published by Copy ops after the While (`<blob>_grad`), so the backward pass may rename
those as it renames any gradient op's output. Two cases Caffe2 got wrong are right here: a state whose output has
no gradient but which the loop body's backward pass gives one (started from zeros; Caffe2 dropped it), and a blob
the body only reads (a weight), whose gradients of all iterations are summed (Caffe2 kept the first iteration's).
cond_net is not differentiated: a gradient that needs a blob it writes is refused. The loop body's Do needs
copy_external_blobs where the backward loop reads a blob the iterations change, so each workspace keeps its
iteration's value (NetBuilder's WhileNet sets it).
"""
from __future__ import annotations

from ..core.errors import GradientError
from ..io.proto import NetDef, OperatorDef, make_argument, parse_text
from .base import GradientSlice


# ------------------------------------------------------------------------------------------- what they share
def net_argument(op: OperatorDef, name: str) -> NetDef | None:
    """The NetDef of op's argument `name` (field n, or its text form in s); None when absent."""
    for a in op.arg:
        if a.name == name:
            if a.HasField("n"):
                return a.n
            if a.HasField("s"):
                return parse_text(a.s.decode(), "net", where=f"{op.type} argument {name!r}")
    return None


def on_device_of(op: OperatorDef, ops, *names: str) -> OperatorDef:
    """op marked as a gradient op, with the device option of the last of `ops` that writes the first of `names`
    some op writes (where that gradient lives)."""
    for name in names:
        src = next((o for o in reversed(ops) if name in o.output), None)
        if src is not None:
            if src.HasField("device_option"):
                op.device_option.CopyFrom(src.device_option)
            break
    op.is_gradient_op = True
    return op


def gradient_copy(src: str, dst: str, ops=()) -> OperatorDef:
    return on_device_of(OperatorDef(type="Copy", input=[src], output=[dst]), ops, src)


def dedupe_gradients(g) -> list:
    """The output gradients with one name per output (Caffe2's dedupe_g_output: Do's bindings need distinct
    outer names): a name given for two outputs is copied to `<output>_<gradient>_DEDUP` for the second."""
    by_output: dict[str, str] = {}
    out = []
    for name, grad in zip(g.def_.output, g.g_output):
        if grad is None:
            out.append(None)
            continue
        if isinstance(grad, GradientSlice):
            raise GradientError(f"output {name!r} has a sparse gradient; gradients flowing into the "
                                f"nets of {g.def_.type} must be dense", at=g.label)
        if name not in by_output:
            if grad in by_output.values():
                new = f"{name}_{grad}_DEDUP"
                g.op("Copy", [grad], [new], copy_args=False)
                grad = new
            by_output[name] = grad
        out.append(by_output[name])
    return out


def nested_backward(g, arg: str, net: NetDef, seeds: dict):
    """(backward net, {blob: gradient}, names its ops read before writing, names they write) of a nested net,
    from the gradients `seeds` of its blobs (Caffe2's _gen_subnet_gradient)."""
    if g.backward is None:
        raise GradientError(f"the gradient of {g.def_.type} needs the backward pass over its nets", at=g.label)
    try:
        ops, grads = g.backward(net.op, dict(seeds))
    except GradientError as e:
        raise GradientError(f"{g.label}, {arg} {net.name!r}: {e}") from None
    reads, writes = [], []
    for o in ops:
        reads.extend(n for n in o.input if n not in writes and n not in reads)
        writes.extend(n for n in o.output if n not in writes)
    grad_net = NetDef()
    grad_net.CopyFrom(net)
    if grad_net.name:
        grad_net.name += "_grad"
    del grad_net.op[:], grad_net.external_input[:], grad_net.external_output[:]
    grad_net.op.extend(ops)
    return grad_net, grads, reads, writes


# ------------------------------------------------------------------------------------------- While's gradient
def _int_arg(op: OperatorDef, name: str) -> int:
    return next((a.i for a in op.arg if a.name == name), 0)


def _loop_body(g) -> tuple[NetDef, OperatorDef]:
    """(loop_net, its Do op), checked as Caffe2 checks them."""
    loop = net_argument(g.def_, "loop_net")
    if loop is None:
        raise GradientError("the While has no loop_net", at=g.label)
    if len(loop.op) != 1 or loop.op[0].type != "Do":
        raise GradientError(f"the gradient of While needs a loop_net of one Do op (NetBuilder's WhileNet makes one), "
                            f"whose workspaces keep each iteration's blobs; this one has "
                            f"{[o.type for o in loop.op]}", at=g.label)
    do = loop.op[0]
    if _int_arg(do, "reuse_workspace"):
        raise GradientError("the gradient of While needs the loop body's Do to push a workspace per iteration; "
                            "drop its reuse_workspace", at=g.label)
    return loop, do


def _loop_backward(g, loop: NetDef, states: list, given: dict):
    """(backward net, {state: its loop gradient}, {input: gradient}) of loop_net, its states seeded with the
    names the gradient Do reads; states the backward pass gives a gradient join the seeded ones."""
    seeded = [b for b in states if b in given]
    while True:
        seeds = {b: f"_{b}_grad_while_seed" for b in seeded}
        grad_net, grads, _, _ = nested_backward(g, "loop_net", loop, seeds)
        more = [b for b in states if b not in seeded and grads.get(b) is not None]
        if not more:
            break
        seeded += more
    for b, gr in grads.items():
        if isinstance(gr, GradientSlice):
            raise GradientError(f"blob {b!r} gets a sparse gradient in the While's loop_net; the gradient While "
                                "passes dense gradients only", at=g.label)
    loop_grads = {b: grads.get(b) if grads.get(b) != seeds[b] else None for b in seeded}
    return grad_net, seeds, loop_grads, grads


def _reads_writes(ops) -> tuple[list, list]:
    reads, writes = [], []
    for o in ops:
        reads.extend(n for n in o.input if n not in writes and n not in reads)
        writes.extend(n for n in o.output if n not in writes)
    return reads, writes


def while_gradient(g) -> None:
    """HasScope and the loop gradients' first values, then a While over the backward net of the loop body's Do
    (Caffe2's gen_while_gradient; the module's docstring says where it differs)."""
    op = g.def_
    loop, do = _loop_body(g)
    stack, body_in, body_out = do.output[-1], list(do.input[:-1]), list(do.output[:-1])
    given = {o: gr for o, gr in zip(op.output, dedupe_gradients(g)) if gr is not None}
    outside = [o for o in given if o not in body_out]
    if outside:
        raise GradientError(f"output(s) {', '.join(map(repr, outside))} get a gradient but are not written by the "
                            "loop body's Do (cond_net is not differentiated)", at=g.label)
    states = [b for b in body_out if b in body_in]
    grad_net, seeds, loop_grads, grads = _loop_backward(g, loop, states, given)
    weights = {w: grads[w] for w in body_in if w not in body_out and grads.get(w) is not None}
    cond_net = net_argument(op, "cond_net")
    cond_writes = set(_reads_writes(cond_net.op)[1]) if cond_net is not None else set()
    needed = sorted(cond_writes & (set(seeds) | set(weights)))
    if needed:
        raise GradientError(f"cond_net writes {', '.join(map(repr, needed))}, whose gradient the loop needs; "
                            "the gradient of While differentiates loop_net only", at=g.label)
    grad_do = next(o for o in grad_net.op if o.type == "Do")
    changing = [n for n in grad_do.input[:-1] if n in body_out or n in cond_writes]
    if changing and not _int_arg(do, "copy_external_blobs"):
        raise GradientError(f"the backward loop reads {', '.join(map(repr, changing))}, which each iteration "
                            "changes: set copy_external_blobs on the loop body's Do so its workspaces keep "
                            "each iteration's values", at=g.label)

    # The loop's running gradients have private names (a state's between iterations, a weight's sum), published
    # by Copy ops after the While, which the backward pass may rename like any gradient op's output.
    carry = {b: f"_{b}_grad_while" for b in seeds}
    sums = {w: f"_{w}_grad_while" for w in weights}
    outputs = list(grad_do.output)
    for b, name in loop_grads.items():
        if name is not None:
            grad_do.output[outputs.index(name)] = carry[b]
    for name in weights.values():
        grad_do.output[outputs.index(name)] = f"_{name}_while_step"
    cond = f"{stack}_grad_while_cond"
    g.op("HasScope", [stack], [cond], copy_args=False)
    for b, name in carry.items():
        if b in given:
            g.op("Copy", [given[b]], [name], copy_args=False)
        else:
            g.op("Scale", [b], [name], copy_args=False, scale=0.0)
    for w, name in sums.items():
        g.op("Scale", [w], [name], copy_args=False, scale=0.0)

    def inner(type_, inputs, outputs, **args):
        o = OperatorDef(type=type_, input=inputs, output=outputs, arg=[make_argument(k, v) for k, v in args.items()])
        if op.HasField("device_option"):
            o.device_option.CopyFrom(op.device_option)
        return o
    back_cond = NetDef(name=(cond_net.name if cond_net is not None and cond_net.name else "while") + "_grad_cond")
    back_cond.op.extend([inner("HasScope", [stack], [cond])] +
                        [inner("Copy", [carry[b]], [seed]) for b, seed in seeds.items()])
    grad_net.op.extend([inner("Scale", [carry[b]], [carry[b]], scale=0.0) for b in seeds if loop_grads[b] is None] +
                       [inner("Sum", [name, f"_{weights[w]}_while_step"], [name]) for w, name in sums.items()])
    reads, writes = _reads_writes([*back_cond.op, *grad_net.op])
    grad_while = OperatorDef()
    grad_while.CopyFrom(op)
    grad_while.input[:] = [cond] + [n for n in reads if n != cond]
    grad_while.output[:] = writes
    del grad_while.arg[:], grad_while.control_input[:]
    grad_while.arg.extend([make_argument("loop_net", grad_net), make_argument("cond_net", back_cond)])
    if grad_while.name:
        grad_while.name += "_grad"
    grad_while.is_gradient_op = True
    g.ops.append(grad_while)
    for k, name in enumerate(op.input):
        if name in carry or name in sums:
            g.op("Copy", [carry.get(name) or sums[name]], [g.GI(k)], copy_args=False)
