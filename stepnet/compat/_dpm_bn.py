"""data_parallel_model's combine_spatial_bn (CPU devices): the ops of the K devices interleaved (op j of each
device in turn), and SpatialBN / SpatialBNGradient computed over the whole batch of all devices: each device's
ChannelStats (ChannelBackpropStats) are summed, and every device's batch-norm op reads the sums with
num_batches=K.
"""
from __future__ import annotations

from ..io.proto import make_argument
from . import core
from ._dpm_groups import stripBlobName


def interleave_ops(model) -> None:
    """The net's ops reordered: op j of every device, for each j (every device must run the same op types)."""
    ops = list(model.net.Proto().op)
    k = len(model._devices)
    per_device = len(ops) // k
    if per_device * k != len(ops):
        raise AssertionError("Number of ops per device in original net is not uniform")
    by_device: dict = {d: [] for d in model._devices}
    for op in ops:
        if op.device_option.device_id not in by_device:
            raise AssertionError(f"op {op.type} runs on device {op.device_option.device_id}, which is not one of "
                                 f"the model's devices {model._devices}")
        by_device[op.device_option.device_id].append(op)
    merged = []
    for j in range(per_device):
        kinds = {by_device[d][j].type for d in model._devices}
        if len(kinds) != 1:
            raise AssertionError(f"Type mismatch at op {j} of the devices: {sorted(kinds)}")
        merged.extend(by_device[d][j] for d in model._devices)
    _replace_ops(model.net, merged)


def _replace_ops(net, ops) -> None:
    copies = [type(op)() for op in ops]
    for new, old in zip(copies, ops):
        new.CopyFrom(old)
    proto = net.Proto()
    del proto.op[:]
    proto.op.extend(copies)


def inter_device_batch_normalization(model) -> None:
    """Every run of consecutive SpatialBN (SpatialBNGradient) ops of the devices computed over all devices."""
    k = len(model._devices)
    out, run, kind = [], [], None
    for op in list(model.net.Proto().op) + [None]:
        this = op.type if op is not None and op.type in ("SpatialBN", "SpatialBNGradient") else None
        if run and this != kind:
            out.extend(_combined(run, kind, k))
            run = []
        kind = this
        if this is None:
            if op is not None:
                out.append(op)
        else:
            run.append(op)
    _replace_ops(model.net, out)


def _combined(ops, kind: str, k: int) -> list:
    stats, norms = [], []
    if kind == "SpatialBN":
        first = ops[0].input[0]
        sums, sumsqs = [], []
        for op in ops:
            x = op.input[0]
            stats.append(core.CreateOperator("ChannelStats", x, [x + "_sums", x + "_sumsq"]))
            sums.append(x + "_sums")
            sumsqs.append(x + "_sumsq")
            op.input.extend([first + "_sums_combined", first + "_sumsq_combined"])
            op.arg.append(make_argument("num_batches", k))
            norms.append(op)
        return stats + [core.CreateOperator("Sum", sums, first + "_sums_combined"),
                        core.CreateOperator("Sum", sumsqs, first + "_sumsq_combined")] + norms
    scale_grads, bias_grads = [], []
    for op in ops:
        stats.append(core.CreateOperator("ChannelBackpropStats", [op.input[0], op.input[3], op.input[4],
                                                                  op.input[2]], [op.output[1], op.output[2]]))
        scale_grads.append(op.output[1])
        bias_grads.append(op.output[2])
        op.arg.append(make_argument("num_batches", k))
        op.input.extend([op.output[1], op.output[2]])
        norms.append(op)
    scale = "cpu_0/" + stripBlobName(scale_grads[0]) + "_combined"
    bias = "cpu_0/" + stripBlobName(bias_grads[0]) + "_combined"
    combine = [core.CreateOperator("Sum", scale_grads, scale), core.CreateOperator("Sum", bias_grads, bias)]
    combine += [core.CreateOperator("Copy", scale, b) for b in scale_grads]
    combine += [core.CreateOperator("Copy", bias, b) for b in bias_grads]
    return stats + combine + norms
