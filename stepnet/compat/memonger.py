"""Caffe2's memonger: memory optimizations of nets as rewrites that return new NetDefs (the net given is never
changed).

- share_grad_blobs: the backward pass's gradient blobs (and, optionally, forward activations) recycled once
  their last reader ran, walking the op graph from the losses (Torch's shareGradInput);
- optimize_inference_for_dag: the same for a forward-only net, walking from its inputs;
- optimize_inference_fast: recycling in op order (a simple net);
- optimize_interference: live ranges in a topological order assigned to shared blobs (greedy or dynamic
  programming), with the ops reordered to that order;
- release_blobs_when_used: a Free op after each blob's last use;
- estimate_memory_usage, compute_statistics, collect_blob_sizes: what the nets allocate;
- verify_graph_equality / verify_inplace_blobs: that a rewritten net computes what the original did.
The recycling walks are in _memonger_dag, the assignments in _memonger_assign, the graph in _memonger_graph.
"""
from __future__ import annotations

import collections
import logging
import time

import numpy as np

from ..graph.view import copy_net
from ..io.proto import NetDef, OperatorDef, TensorProto
from . import workspace
from ._memonger_assign import (  # noqa: F401 - Caffe2's memonger has them
    AssignmentAlgorithm, LiveRange, compute_assignments, compute_assignments_dp, compute_assignments_greedy,
    compute_blob_assignments, compute_ranges, get_memory_usage, get_updated_ranges, is_compatible,
    verify_assignments)
from ._memonger_dag import STEP_NET_ARGS, recycle_for_dag, recycle_in_order
from ._memonger_graph import (  # noqa: F401
    DiGraph, compute_interference_graph, topological_sort_traversal, topological_sort_traversal_longest_path)

log = logging.getLogger("memonger")

Optimization = collections.namedtuple("Optimization", ["net", "assignments", "blob_assignments"])
Statistics = collections.namedtuple("Statistics", ["baseline_nbytes", "optimized_nbytes"])


def _proto(net) -> NetDef:
    return net.Proto() if hasattr(net, "Proto") else net


def _checked(original: NetDef, optimized: NetDef) -> NetDef:
    if not verify_graph_equality(original, optimized):
        raise AssertionError("Memonger graph is not equal to original.")
    if not verify_inplace_blobs(original, optimized):
        raise AssertionError("Inplace assignments differ in memonger net.")
    return optimized


def share_grad_blobs(net, losses, param_grads, namescope, dont_share_blobs=None, share_activations=False,
                     blob_shapes=None) -> NetDef:
    """A new NetDef in which the gradients passed between layers (blobs `<namescope>..._grad` that are not
    parameter gradients) share blobs once used; with share_activations, the forward activations (outputs of ops
    reading `<output>_w`, all but the last two) too. Assign it to the model's net (net.Proto().CopyFrom)."""
    proto = _proto(net)
    if namescope and not namescope.endswith("/"):
        namescope += "/"
    param_grads = {str(g) for g in param_grads}

    def is_grad_blob(name: str) -> bool:
        # "_" + namescope: the auto-split copies of a gradient
        return (name.endswith("_grad") and (name.startswith(namescope) or name.startswith("_" + namescope))
                and name not in param_grads)

    external_output = set(proto.external_output)
    activations = [b for op in proto.op for b in op.output if b + "_w" in op.input and b not in external_output]
    activations = set(activations[:-2])   # the last ones are usually read from outside
    grad_ops = [i for i, op in enumerate(proto.op) if any(is_grad_blob(b) for b in list(op.input) + list(op.output))]
    sharable = {b for op in proto.op for b in list(op.input) + list(op.output)
                if is_grad_blob(b) or (share_activations and b in activations)}
    start = time.time()
    optimized = recycle_for_dag(proto, [str(s) for s in losses], grad_ops, sharable, namescope,
                                {str(b) for b in dont_share_blobs or ()}, blob_shapes)
    log.info("Memonger memory optimization took %s secs", time.time() - start)
    return _checked(proto, optimized)


def optimize_inference_for_dag(net, input_blobs, namescope="") -> NetDef:
    """A new NetDef of a forward-only net in which activations (blobs neither external inputs nor outputs)
    share blobs, walking from input_blobs."""
    proto = _proto(net)
    external = set(proto.external_input) | set(proto.external_output)
    activations, written = set(), set()
    for op in proto.op:
        for b in op.input:
            if b not in external:
                activations.add(b)
                if b not in written:
                    raise AssertionError(f"{b} not in external input")
        activations.update(b for b in op.output if b not in external)
        written.update(op.output)
        if op.is_gradient_op:
            raise AssertionError("You can only pass inference-only nets to optimize_inference_for_dag")
    start = time.time()
    optimized = recycle_for_dag(proto, [str(s) for s in input_blobs], range(len(proto.op)), activations,
                                namescope)
    log.info("Memonger memory optimization took %s secs", time.time() - start)
    return _checked(proto, optimized)


def optimize_inference_fast(net, static_blobs) -> NetDef:
    """A new NetDef of a simple net in which each non-static output reuses a blob no later op reads."""
    return recycle_in_order(_proto(net), [str(s) for s in static_blobs])


def optimize_interference(net, static_blobs, ordering_function=topological_sort_traversal, blob_sizes=None,
                          algo=AssignmentAlgorithm.GREEDY) -> Optimization:
    """The ops in a topological order (ordering_function), the live ranges of their blobs in that order, and
    the blobs (but static_blobs) renamed to shared ones by `algo`; net is a NetDef."""
    proto = copy_net(_proto(net))
    graph = compute_interference_graph(proto.op)
    order = list(ordering_function(graph))
    ops = [proto.op[i] for i in order]
    ranges = compute_ranges(ops, blob_sizes)
    out = copy_net(proto)
    del out.op[:]
    out.op.extend(ops)
    assignments = compute_assignments(ranges, {str(s) for s in static_blobs}, algo)
    blob_assignments = compute_blob_assignments(assignments)
    apply_assignments(out, blob_assignments)
    return Optimization(net=out, assignments=assignments, blob_assignments=blob_assignments)


def apply_assignments(net: NetDef, blob_assignments: dict) -> None:
    """Renames, in place, net's op inputs and outputs (and recurrent step nets) by blob_assignments."""
    for op in net.op:
        if op.type.startswith("RecurrentNetwork"):
            apply_recurrent_blob_assignments(op, blob_assignments, lambda b: blob_assignments.get(b, b))
        op.input[:] = [blob_assignments.get(b, b) for b in op.input]
        op.output[:] = [blob_assignments.get(b, b) for b in op.output]


def apply_recurrent_blob_assignments(op: OperatorDef, blob_assignments: dict, canonical_name) -> None:
    for arg in op.arg:
        if arg.name in STEP_NET_ARGS and arg.HasField("n"):
            apply_assignments(arg.n, blob_assignments)
            arg.n.external_input[:] = [canonical_name(b) for b in arg.n.external_input]
    names = set(op.input) | set(op.output)
    for blob, renamed in blob_assignments.items():
        if blob in names:
            arg = op.arg.add()
            arg.name, arg.s = blob + ".rename", str(renamed).encode()


def release_blobs_when_used(netproto, dont_free_blobs, selector_fun=None) -> NetDef:
    """A new NetDef with a Free op after the last use of every blob the net makes and reads again (not external
    outputs, not dont_free_blobs, not inputs of Alias, and only those selector_fun accepts)."""
    proto = copy_net(_proto(netproto))
    read, made, aliased = set(), set(), set()
    for op in proto.op:
        if op.type == "Alias":
            aliased.add(op.input[0])
            continue
        read.update(op.input)
        made.update(b for b in op.output if b not in read and (selector_fun is None or selector_fun(b)))
    releasable = ((made - set(proto.external_output)) & read) - set(dont_free_blobs) - aliased
    ops = list(proto.op)
    for j in reversed(range(len(proto.op))):
        for name in proto.op[j].input:
            if name in releasable:
                releasable.discard(name)
                ops.insert(j + 1, OperatorDef(type="Free", input=[name], output=[name]))
    del proto.op[:]
    proto.op.extend(ops)
    return proto


_SIZEOF = {TensorProto.DOUBLE: 8, TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.INT32: 4,
           TensorProto.INT8: 1, TensorProto.UINT8: 1, TensorProto.UINT16: 2, TensorProto.INT16: 2,
           TensorProto.BOOL: 1, TensorProto.INT64: 8}


def estimate_memory_usage(protos, shapes, types, devicescope):
    """(total, high-water mark, {op type: bytes}) the ops of `protos` on `devicescope` allocate, run one after
    the other (each output counted once, at its final size; Free and Alias release)."""
    def num_bytes(blob) -> int:
        if blob not in shapes or blob not in types:
            log.warning("Unknown blob encountered: %s", blob)
            return 0
        return _SIZEOF[types[blob]] * int(np.prod(shapes[blob]))

    by_op = collections.defaultdict(int)
    current = highest = total = 0
    allocated: set = set()
    for proto in protos:
        for op in _proto(proto).op:
            if op.type in ("Free", "Alias"):
                for o in op.output:
                    if o in allocated:
                        current -= num_bytes(o)
                        allocated.discard(o)
            elif op.device_option == devicescope:
                for o in op.output:
                    if o not in allocated:
                        n = num_bytes(o)
                        total, current = total + n, current + n
                        highest = max(highest, current)
                        allocated.add(o)
                        by_op[op.type] += n
    return total, highest, by_op


def verify_inplace_blobs(net_a, net_b) -> bool:
    """Whether the ops of the two nets have the same types and the same in-place input/output pairs."""
    def inplace(op) -> list:
        outs = list(op.output)
        return [[j, outs.index(b)] for j, b in enumerate(op.input) if b in outs]

    return all(a.type == b.type and inplace(a) == inplace(b) for a, b in zip(_proto(net_a).op, _proto(net_b).op))


def verify_graph_equality(net_a, net_b) -> bool:
    """Whether the two nets run the same ops (type, device, engine) reading the values of the same ops."""
    a_ops, b_ops = _proto(net_a).op, _proto(net_b).op
    if len(a_ops) != len(b_ops):
        return False
    for a, b in zip(a_ops, b_ops):
        if a.type != b.type or a.device_option != b.device_option or a.engine != b.engine:
            return False

    def parents(ops) -> list:
        owner, out = {}, []
        for i, op in enumerate(ops):
            out.append([owner[b] for b in op.input if b in owner])
            owner.update((b, i) for b in op.output)
        return out

    pa, pb = parents(a_ops), parents(b_ops)
    for j, (x, y) in enumerate(zip(pa, pb)):
        if x != y:
            log.info("Difference at op %d: parents %s vs %s", j, x, y)
    return pa == pb


def blob_nbytes(blob) -> int:
    try:
        return int(np.asarray(workspace.FetchBlob(blob)).nbytes)
    except Exception:   # noqa: BLE001 - Caffe2 counts a blob it cannot fetch as empty
        log.warning("Error when fetching blob %s", blob)
        return 0


def compute_statistics(assignments) -> Statistics:
    """Bytes of the assigned blobs as they are in the workspace: each on its own, and shared."""
    nbytes = {blob: blob_nbytes(blob) for assignment in assignments for blob, _ in assignment}
    shared = sum(max(nbytes[blob] for blob, _ in assignment) for assignment in assignments)
    return Statistics(baseline_nbytes=sum(nbytes.values()), optimized_nbytes=shared)


def collect_blob_sizes(net) -> dict:
    """{blob: bytes in the workspace} for every blob the net's ops read or write."""
    return {blob: blob_nbytes(blob) for op in _proto(net).op for blob in list(op.input) + list(op.output)}
