"""Blob renaming for core.Net.Clone, as Caffe2's remap functions do it: op inputs and outputs, and for
RecurrentNetwork(Gradient) the blob names in its string arguments and its step nets, for If/While their nets."""
from __future__ import annotations

from ..graph.view import copy_net, copy_op


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
