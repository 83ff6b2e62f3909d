"""Caffe2's control_ops_util: add an If or a While op whose nets run in Do ops, with the outer blobs they use
bound in and everything else local.

A blob of a branch (or loop body, or condition) net is outer when its name is in the lexical scope (the outer
blob names visible to the op) or when the net reads it before writing it (which must then be in the scope):
outer blobs are read from and written to the outer workspace; any other blob lives only in the Do's own
workspace (a CreateScope blob per net, made just before the If/While), so it is not seen afterwards.

Lists are kept in a fixed order (first read, first write) where Caffe2 iterates sets, so the ops built are the
same from run to run.
"""
from __future__ import annotations

from ..graph.view import Graph
from . import core


def _outer_blobs(net, lexical_scope) -> tuple[list, list]:
    """(names the net reads before writing them, names it writes that are in the scope), each in order."""
    proto = net.Proto()
    inputs = list(Graph(proto.op).read_before_written())
    scope = {str(b) for b in lexical_scope}
    for name in inputs:
        if name not in scope:
            raise AssertionError(f"Input blob {name} is undefined")
    outputs = list(dict.fromkeys(o for op in proto.op for o in op.output if o in scope))
    return inputs, outputs


def get_external_blob_names(net, lexical_scope) -> tuple[set, set]:
    """(the blobs net reads from outside, the blobs in lexical_scope it writes); an outside read of a name not
    in the scope is an error."""
    inputs, outputs = _outer_blobs(net, lexical_scope)
    return set(inputs), set(outputs)


def _do_net(name: str, inner_net, inputs: list, outputs: list, ws_blob, **do_args):
    """A net of one Do op running inner_net with `inputs` and `outputs` bound under their own names (each to
    its first place among the Do's inputs then outputs), in the workspace kept by ws_blob."""
    refs_in = [core.BlobReference(b) for b in inputs] + [ws_blob]
    refs_out = [core.BlobReference(b) for b in outputs] + [ws_blob]
    ordered = list(inputs) + list(outputs)
    bound = list(dict.fromkeys(ordered))
    net = core.Net(name)
    net.Do(refs_in, refs_out, net=inner_net.Proto(), inner_blobs=bound,
           outer_blobs_idx=[ordered.index(b) for b in bound], **do_args)
    net.AddExternalOutput(*refs_out)
    return net


def _union(*lists) -> list:
    return list(dict.fromkeys(b for names in lists for b in names))


def add_if_op(if_net, cond_blob, lexical_scope, then_net, else_net=None) -> None:
    """Add to if_net an If on cond_blob running then_net (else else_net, when given) through Do ops; the If
    reads the outer blobs the branches read and writes those they write (see the module docstring)."""
    branches = [("then", then_net)] + ([("else", else_net)] if else_net else [])
    args, ins, outs, ws_blobs = {}, [], [], []
    for which, net in branches:
        b_in, b_out = _outer_blobs(net, lexical_scope)
        ws_blob = if_net.NextScopedBlob(if_net.Name() + f"/workspace_if_{which}")
        args[f"{which}_net"] = _do_net(f"do_{which}_net", net, b_in, b_out, ws_blob).Proto()
        ins, outs = _union(ins, b_in), _union(outs, b_out)
        ws_blobs.append(ws_blob)
    if_inputs = [cond_blob] + [core.BlobReference(b) for b in ins] + ws_blobs
    if_outputs = [core.BlobReference(b) for b in outs] + ws_blobs
    for ws_blob in ws_blobs:
        if_net.CreateScope([], [ws_blob])
    if_net.If(if_inputs, if_outputs, **args)
    if_net.AddExternalOutput(*if_outputs)


def add_while_op(while_net, cond_blob, lexical_scope, loop_body_net, condition_body_net=None) -> None:
    """Add to while_net a While on cond_blob running loop_body_net through a Do op; with condition_body_net,
    that net (in a Do of its own) computes cond_blob before each iteration and must write it. The loop's
    outputs are inputs too (it may run no iteration); a cond_blob outside the scope is first set False."""
    body_in, body_out = _outer_blobs(loop_body_net, lexical_scope)
    body_in = _union(body_in, body_out)
    body_ws = while_net.NextScopedBlob(while_net.Name() + "/workspace_loop_body")
    args = {"loop_net": _do_net("do_loop_body_net", loop_body_net, body_in, body_out, body_ws,
                                copy_external_blobs=True).Proto()}
    while_inputs = [cond_blob] + [core.BlobReference(b) for b in body_in] + [body_ws]
    while_outputs = [core.BlobReference(b) for b in body_out] + [body_ws]
    ws_blobs = [body_ws]
    if condition_body_net:
        cond_in, cond_out = _outer_blobs(condition_body_net, lexical_scope)
        if not any(str(cond_blob) in op.output for op in condition_body_net.Proto().op):
            raise AssertionError("Condition net does not write into condition blob")
        cond_out = _union(cond_out, [str(cond_blob)])
        cond_ws = while_net.NextScopedBlob(while_net.Name() + "/workspace_loop_cond")
        args["cond_net"] = _do_net("do_loop_condition_net", condition_body_net, cond_in, cond_out,
                                   cond_ws).Proto()
        while_inputs += [core.BlobReference(b) for b in cond_in if b not in body_in] + [cond_ws]
        while_outputs += [core.BlobReference(b) for b in cond_out if b not in body_out] + [cond_ws]
        ws_blobs.append(cond_ws)
        if str(cond_blob) not in {str(b) for b in lexical_scope}:
            while_net.ConstantFill([], cond_blob, dtype=core.DataType.BOOL, value=False)
    for ws_blob in ws_blobs:
        while_net.CreateScope([], [ws_blob])
    while_net.While(while_inputs, while_outputs, **args)
    while_net.AddExternalOutput(*while_outputs)
