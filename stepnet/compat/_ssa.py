"""Caffe2's core.get_ssa: a net's ops in single-assignment numbering (each blob's version as each op reads and
writes it), which mobile_exporter and the ONNX frontend's SSA rewrite both read."""
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
