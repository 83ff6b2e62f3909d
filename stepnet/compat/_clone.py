"""Caffe2's cloning of nets (core.Net.Clone, ClonePartial, clone_and_bind_net; re-exported by core) and its remap
functions: a clone renames op inputs and outputs, and through DEFAULT_REMAP_FUNCS (or the caller's remap_funcs,
called as f(op, prefix, blob_remap)) the blobs inside ops' nets: for RecurrentNetwork(Gradient) the blob names in
its string arguments and its step nets (remap_proto: a Clone named 'cloned_sub_net'), for If/While their nets
(a Clone named '<net>_remapped'). Those nested nets are core.Nets for the while, so their names are made unique in
the process, as Caffe2's were."""
from __future__ import annotations

from ..graph.view import Graph, copy_net, copy_op
from ._schema_fields import Field
from ._ssa import get_ssa, get_undefined_blobs
from ._steps import NET_TYPE


def remap_op(op, remap: dict, remap_funcs=None, prefix: str = ""):
    """A copy of op with every blob in `remap` renamed (nested nets included)."""
    new = copy_op(op)
    new.input[:] = [remap.get(b, b) for b in new.input]
    new.output[:] = [remap.get(b, b) for b in new.output]
    funcs = {**DEFAULT_REMAP_FUNCS, **(remap_funcs or {})}
    if new.type in funcs:
        funcs[new.type](new, prefix, remap)
    return new


def clone_proto(net, name, blob_remap=None, op_id_mask=None, remap_funcs=None):
    """A copy of net named `name`, its blobs renamed by blob_remap, with the ops listed in op_id_mask (default:
    all)."""
    remap = {str(k): str(v) for k, v in (blob_remap or {}).items()}
    new = copy_net(net)
    new.name = name
    del new.op[:]
    prefix = f"{name}/" if name else ""
    new.op.extend(remap_op(net.op[i], remap, remap_funcs, prefix)
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


def remap_proto(argument, blob_remap) -> None:
    """Rename the blobs of blob_remap in the net of an Argument (argument.n), in place: the net becomes its Clone
    named 'cloned_sub_net' (made unique)."""
    subnet = NET_TYPE[0](argument.n)
    argument.n.CopyFrom(subnet.Clone("cloned_sub_net", blob_remap).Proto())


def recurrent_network_op_remap(op, prefix, blob_remap) -> None:
    """RecurrentNetwork(Gradient)'s remap function (prefix unused, as in Caffe2): the blob names in its string
    arguments (links, aliases, recompute blobs, ...) and its `timestep`, and its step nets (remap_proto)."""
    def renamed(text) -> bytes:
        name = text.decode("utf-8") if isinstance(text, bytes) else text
        return str(blob_remap.get(name, name)).encode("utf-8")

    for arg in op.arg:
        if len(arg.strings):
            arg.strings[:] = [renamed(s) for s in arg.strings]
        elif arg.name == "timestep":
            arg.s = renamed(arg.s)
        elif arg.name.endswith("step_net") and arg.HasField("n"):
            remap_proto(arg, blob_remap)


def control_op_remap(op, prefix, blob_remap) -> None:
    """If's (then_net, else_net) and While's (loop_net, cond_net) remap function: each net becomes its Clone
    named '<net>_remapped'."""
    names = ("then_net", "else_net") if op.type == "If" else ("loop_net", "cond_net")
    for arg in op.arg:
        if arg.name in names and arg.HasField("n"):
            subnet = NET_TYPE[0](arg.n)
            arg.n.CopyFrom(subnet.Clone(name=subnet.Name() + "_remapped", blob_remap=blob_remap).Proto())


def clone_and_bind_net(net, name, prefix, blob_remap=None, inputs=None, keep_schema=True) -> tuple:
    """(a Clone of net named `name`, the blob renaming). Blobs the net defines get `prefix`; blobs it reads
    before defining them keep their names, except those of its input record, which become the blobs of the same
    fields of `inputs` (a record with every field of the input record, and maybe more). blob_remap: renamings
    to use first (updated, and returned). keep_schema: the clone keeps the records over the renamed blobs;
    otherwise its input record is `inputs`, when given."""
    assert isinstance(net, NET_TYPE[0])
    blob_remap = {} if blob_remap is None else blob_remap
    if inputs is not None:
        assert isinstance(inputs, Field)
        original = net.input_record()
        assert original is not None
        diff = set(original.field_names()) - set(inputs.field_names())
        assert not diff, (f"Schemas don't match, extra fields {diff} found in the net {net.Name()}. "
                          f"original: {original.field_names()}; inputs: {inputs.field_names()}")
        mine = dict(zip(original.field_names(), original.field_blobs()))
        for field, blob in zip(inputs.field_names(), inputs.field_blobs()):
            if field in mine:
                blob_remap[str(mine[field])] = str(blob)
    ssa, blob_versions = get_ssa(net.Proto())
    undefined = get_undefined_blobs(ssa)
    for blob in blob_versions:
        if blob not in blob_remap:
            blob_remap[blob] = blob if blob in undefined else prefix + blob
    cloned = net.Clone(name, blob_remap, keep_schema=keep_schema)
    if not keep_schema and inputs:
        cloned.set_input_record(inputs)
    return cloned, blob_remap


DEFAULT_REMAP_FUNCS = {
    "RecurrentNetwork": recurrent_network_op_remap,
    "RecurrentNetworkGradient": recurrent_network_op_remap,
    "If": control_op_remap,
    "While": control_op_remap,
}
