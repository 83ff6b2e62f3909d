"""Blob renaming for core.Net.Clone, as Caffe2's remap functions do it: op inputs and outputs, and for
RecurrentNetwork(Gradient) the blob names in its string arguments and its step nets, for If/While their nets."""
from __future__ import annotations

from ..graph.view import Graph, copy_net, copy_op


def remap_op(op, remap: dict, remap_funcs=None):
    """A copy of op with every blob in `remap` renamed (nested nets included)."""
    new = copy_op(op)
    new.input[:] = [remap.get(b, b) for b in new.input]
    new.output[:] = [remap.get(b, b) for b in new.output]
    funcs = {**DEFAULT_REMAP_FUNCS, **(remap_funcs or {})}
    if new.type in funcs:
        funcs[new.type](new, "", remap)
    return new


def clone_proto(net, name, blob_remap=None, op_id_mask=None, remap_funcs=None):
    """A copy of net named `name`, its blobs renamed by blob_remap, with the ops listed in op_id_mask (default:
    all)."""
    remap = {str(k): str(v) for k, v in (blob_remap or {}).items()}
    new = copy_net(net)
    new.name = name
    del new.op[:]
    new.op.extend(remap_op(net.op[i], remap, remap_funcs)
                  for i in (range(len(net.op)) if op_id_mask is None else op_id_mask))
    new.external_input[:] = [remap.get(b, b) for b in new.external_input]
    new.external_output[:] = [remap.get(b, b) for b in new.external_output]
    return new


def _ops_in_path(g: Graph, sources, targets) -> set:
    """The ops needed to make the latest versions of targets from the latest versions of sources."""
    stop = {(b, g.final.get(b, 0)) for b in sources}
    queue, used = [(b, g.final.get(b, 0)) for b in targets], set()
    while queue:
        key = queue.pop()
        i = g.writer.get(key)
        if key in stop or i is None or i in used:
            continue
        used.add(i)
        queue.extend(zip(g.ops[i].input, g.in_versions[i]))
    return used


def partial_clone_plan(net, name: str, inputs: dict, outputs: list) -> tuple[list, dict, list, list]:
    """Caffe2's ClonePartial: (the ops needed to compute outputs from inputs, in order; the blob renaming;
    the new net's external inputs and outputs). inputs maps blob -> its name in the clone; blobs made inside
    get the prefix `name/`, blobs read from outside keep their names. AssertionError (as Caffe2 asserts) when
    one of those ops would also be needed to make an input."""
    g = Graph.of(net)
    used = _ops_in_path(g, inputs, outputs)
    feeding = _ops_in_path(g, [], inputs)
    if used & feeding:
        raise AssertionError(f"cannot partially clone net {net.name!r}: ops {sorted(used & feeding)} are needed "
                             "for the outputs but also make the given inputs")
    op_ids = sorted(used)
    outside = {b for i in op_ids for b, v in zip(g.ops[i].input, g.in_versions[i]) if v == 0} - set(inputs)
    prefix = f"{name}/" if name else ""
    remap = {b: inputs[b] if b in inputs else b if b in outside else prefix + b
             for b in set(g.final) | set(inputs) | outside}
    new_in = [remap[b] for b in inputs] + sorted(outside)
    return op_ids, remap, new_in, [remap[o] for o in outputs]


def clone_partial(net, name, inputs, outputs, remap_funcs=None) -> tuple:
    """core.Net.ClonePartial on a core.Net (see partial_clone_plan): (the new core.Net, its output references)."""
    if isinstance(inputs, dict):
        pairs = list(inputs.items())
    elif isinstance(inputs, list) and all(isinstance(i, tuple) and len(i) == 2 for i in inputs):
        pairs = inputs
    else:
        pairs = [(i, i) for i in inputs]
    for output in outputs:
        if not net.BlobIsDefined(output):
            raise AssertionError(f"ClonePartial: net {net.Name()!r} does not define output {str(output)!r}")
    ops, remap, new_in, new_out = partial_clone_plan(
        net.Proto(), name, {str(k): str(v) for k, v in pairs}, [str(o) for o in outputs])
    new = net.Clone(name, remap, ops, remap_funcs)
    proto = new.Proto()
    proto.external_input[:] = new_in
    proto.external_output[:] = new_out
    return new, [new.GetBlobRef(o) for o in new_out]


def remap_net(net, remap: dict):
    new = copy_net(net)
    del new.op[:]
    new.op.extend(remap_op(op, remap) for op in net.op)
    new.external_input[:] = [remap.get(b, b) for b in new.external_input]
    new.external_output[:] = [remap.get(b, b) for b in new.external_output]
    return new


def recurrent_network_op_remap(op, prefix, remap) -> None:
    for arg in op.arg:
        if len(arg.strings):
            arg.strings[:] = [remap.get(s.decode(), s.decode()).encode() for s in arg.strings]
        elif arg.name == "timestep":
            arg.s = remap.get(arg.s.decode(), arg.s.decode()).encode()
        elif arg.name.endswith("step_net") and arg.HasField("n"):
            arg.n.CopyFrom(remap_net(arg.n, remap))


def control_op_remap(op, prefix, remap) -> None:
    names = ("then_net", "else_net") if op.type == "If" else ("loop_net", "cond_net")
    for arg in op.arg:
        if arg.name in names and arg.HasField("n"):
            arg.n.CopyFrom(remap_net(arg.n, remap))


DEFAULT_REMAP_FUNCS = {
    "RecurrentNetwork": recurrent_network_op_remap,
    "RecurrentNetworkGradient": recurrent_network_op_remap,
    "If": control_op_remap,
    "While": control_op_remap,
}
