"""Caffe2's core.get_ssa: a net's ops in single-assignment numbering (each blob's version as each op reads and
writes it), which mobile_exporter and the ONNX frontend's SSA rewrite both read; and the analyses Caffe2 made of
it (re-exported by core): get_undefined_blobs, get_output_producers, get_op_ids_in_path."""
from __future__ import annotations

from ..io.proto import NetDef


def get_ssa(net, blob_versions: dict | None = None):
    """(ssa, blob_versions) of a core.Net or NetDef (or a list of them, numbered in turn): ssa holds, per op,
    ([(input, version)], [(output, version)]); external inputs are version 0 (where the net declares none, every
    blob read before it is written), and each write adds one. blob_versions: each blob's last version."""
    if blob_versions is None:
        blob_versions = {}
    if isinstance(net, list):
        return [get_ssa(n, blob_versions)[0] for n in net], blob_versions
    proto = net if isinstance(net, NetDef) else net.Proto()
    for name in proto.external_input:
        blob_versions.setdefault(str(name), 0)
    ssa = []
    for op in proto.op:
        if not proto.external_input:
            for name in op.input:
                blob_versions.setdefault(str(name), 0)
        inputs = [(str(i), blob_versions.get(str(i), 0)) for i in op.input]
        for name in op.output:
            blob_versions[str(name)] = blob_versions.get(str(name), 0) + 1
        ssa.append((inputs, [(str(o), blob_versions[str(o)]) for o in op.output]))
    return ssa, blob_versions


def get_undefined_blobs(ssa) -> set:
    """The blobs an op of ssa (get_ssa's) reads before any op writes them: the inputs at version 0."""
    return {name for inputs, _ in ssa for name, version in inputs if version == 0}


def get_output_producers(ssa) -> dict:
    """{(blob, version): the index of the op of ssa that writes that version}."""
    return {out: i for i, (_, outputs) in enumerate(ssa) for out in outputs}


def get_op_ids_in_path(ssa, blob_versions, inputs, outputs) -> list:
    """The sorted indices of the ops needed to compute the latest versions of `outputs` when the latest
    versions of `inputs` are given (ssa and blob_versions: get_ssa's)."""
    given = {(str(b), blob_versions[str(b)]) for b in inputs}
    producers = get_output_producers(ssa)
    queue, used = [(str(b), blob_versions[str(b)]) for b in outputs], set()
    while queue:
        blob = queue.pop()
        if blob in given or blob not in producers or producers[blob] in used:
            continue
        used.add(producers[blob])
        queue.extend(ssa[producers[blob]][0])
    return sorted(used)
