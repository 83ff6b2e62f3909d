"""Data-parallel training as a graph rewrite, after Caffe2's data_parallel_model with an MPI rendezvous.

Every process of an `mpiexec -n K` job runs the same nets on its own share of the data. `data_parallel` returns
new nets in which
- the init net creates the common world (`MPICreateCommonWorld`), broadcasts every parameter it makes from rank
  0 (`MPIBroadcast`) and computes 1/K (an allreduce of a one, so the nets run on any number of processes, and
  alone as plain single-process training);
- the training net, right after the backward pass and before anything reads a gradient (the optimizer), sums
  every parameter gradient over the ranks and scales it by 1/K: dense ones with `MPIAllreduce` (with `fuse`, the
  default, all those of one device in one buffer: one allreduce per step, as Horovod's tensor fusion), sparse ones
  (GradientSlice) with `MPIAllgather` of their indices and values, whose readers then read the gathered blobs.
Each rank's mean-loss gradient averaged over K equal batches is the gradient of the mean loss over the
concatenated batch, so K ranks train as one process on K times the batch.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from ..core.errors import GradientError, StepnetError
from ..graph.view import Graph, with_ops
from ..ops.base import GradientSlice
from ..io.proto import NetDef, OperatorDef, make_argument

COMM = "dp_comm"                 # the common world
WORLD_SIZE = "dp_world_size"     # K, as a float [1] tensor
GRAD_SCALE = "dp_grad_scale"     # 1/K (on the CPU; dp_grad_scale_gpu<k> on CUDA device k)
FUSED = "dp_fused_grads"         # the fused buffer of one device (dp_fused_grads_<k> for the next ones)
FUSE_DEFAULT = True              # one latency per step on a network; on one machine within a few % (RESULTS.md)
GPU_TYPES = (1, 6)               # CUDA, HIP


class DataParallel(NamedTuple):
    init_net: NetDef
    net: NetDef
    grads: dict      # parameter -> its gradient after the rewrite (sparse ones: the gathered blobs)


def _op(type_: str, inputs, outputs, device=None, **args) -> OperatorDef:
    op = OperatorDef(type=type_, input=list(inputs), output=list(outputs))
    for k, v in args.items():
        op.arg.append(make_argument(k, v))
    if device is not None:
        op.device_option.CopyFrom(device)
    return op


def _device(op: OperatorDef):
    return op.device_option if op.HasField("device_option") else None


def _key(device) -> tuple:
    return (0, 0) if device is None or device.device_type not in GPU_TYPES else (device.device_type,
                                                                                  device.device_id)


def _scale_of(device) -> str:
    kind, index = _key(device)
    return GRAD_SCALE if kind == 0 else f"{GRAD_SCALE}_gpu{index}"


def data_parallel(init_net: NetDef, net: NetDef, params: Sequence[str], grads: dict, fuse: bool = FUSE_DEFAULT,
                  ) -> DataParallel:
    """New init and training nets that train data-parallel over the processes of the job (see the module).
    params: the parameters to broadcast (those the init net makes); grads: {parameter: gradient blob or
    GradientSlice} to reduce. The nets given are not changed."""
    if any(op.type == "MPICreateCommonWorld" and COMM in op.output for op in init_net.op):
        raise StepnetError(f"init net {init_net.name!r} already creates {COMM!r}: the model is data-parallel")
    grads = {str(p): g for p, g in grads.items()}
    where = _insertion_point(net, grads)
    made = Graph.of(init_net).final
    init_ops = list(init_net.op) + [_op("MPICreateCommonWorld", [], [COMM])]
    writers = {name: op for op in init_net.op for name in op.output}
    for p in (str(p) for p in params):
        if p in made:
            init_ops.append(_op("MPIBroadcast", [COMM, p], [p], _device(writers[p]), root=0))
    init_ops += [_op("ConstantFill", [], [WORLD_SIZE], shape=[1], value=1.0),
                 _op("MPIAllreduce", [COMM, WORLD_SIZE], [WORLD_SIZE]),
                 _op("Reciprocal", [WORLD_SIZE], [GRAD_SCALE])]
    devices = {_key(d): d for d in where.devices.values() if _key(d)[0] != 0}
    for d in devices.values():
        init_ops.append(_op("CopyCPUToGPU", [GRAD_SCALE], [_scale_of(d)], d))

    dense = [g for g in grads.values() if isinstance(g, str)]
    sparse = [g for g in grads.values() if isinstance(g, GradientSlice)]
    new_ops = _fused(dense, where.devices) if fuse else _unfused(dense, where.devices)
    gathered = _gathered(sparse, where.devices, new_ops)
    after = _rename_readers(net, where, gathered)
    train = with_ops(net, list(net.op[:where.index]) + new_ops + after)
    scales = sorted({_scale_of(where.devices[g]) for g in dense + [s.values for s in sparse]})
    for name in [COMM, *scales]:
        if name not in train.external_input:
            train.external_input.append(name)
    new_grads = {p: GradientSlice(gathered[g.indices], gathered[g.values]) if isinstance(g, GradientSlice) else g
                 for p, g in grads.items()}
    return DataParallel(with_ops(init_net, init_ops), train, new_grads)


class _Where(NamedTuple):
    index: int            # where the collectives go: after the last gradient op writing a parameter gradient
    graph: Graph
    devices: dict         # gradient blob (dense or values) -> DeviceOption of the op that made it (None: CPU)


def _insertion_point(net: NetDef, grads: dict) -> _Where:
    """After the last gradient op (is_gradient_op) writing a dense gradient or a slice's values; nothing before
    that point may read a finished dense gradient."""
    graph = Graph.of(net)
    devices, last = {}, -1
    for p, g in grads.items():
        name = g.values if isinstance(g, GradientSlice) else g
        made = [i for i in graph.writers(name) if net.op[i].is_gradient_op]
        if not made:
            raise GradientError(f"net {net.name!r}: the gradient {name!r} of parameter {p!r} is made by no gradient "
                                "op of the net; add the gradient ops (add_gradient_ops) before making it "
                                "data-parallel")
        devices[name] = _device(net.op[made[-1]])
        last = max(last, made[-1])
    index = last + 1
    before = Graph(net.op[:index], net.external_input).final
    for g in (g for g in grads.values() if isinstance(g, str)):
        early = [i for i in graph.consumers.get((g, before.get(g, 0)), ()) if i < index]
        if early:
            i = early[0]
            raise GradientError(f"net {net.name!r}, op #{i} ({net.op[i].type}) reads the gradient {g!r} before the "
                                f"backward pass ends (op #{index - 1}), where data-parallel training sums the "
                                "gradients over the ranks; move it after the backward pass")
    return _Where(index, graph, devices)


def _unfused(dense: list[str], devices: dict) -> list[OperatorDef]:
    ops = []
    for g in dense:
        d = devices[g]
        ops += [_op("MPIAllreduce", [COMM, g], [g], d), _op("WeightedSum", [g, _scale_of(d)], [g], d)]
    return ops


def _fused(dense: list[str], devices: dict) -> list[OperatorDef]:
    """Per device: flatten, concatenate, one allreduce, scale, split, reshape back."""
    groups: dict[tuple, list[str]] = {}
    for g in dense:
        groups.setdefault(_key(devices[g]), []).append(g)
    ops = []
    for k, members in enumerate(groups.values()):
        d = devices[members[0]]
        fused = FUSED if k == 0 else f"{FUSED}_{k}"
        flats = [f"{g}_dp_flat" for g in members]
        for g, flat in zip(members, flats):
            ops.append(_op("Reshape", [g], [flat, f"{g}_dp_shape"], d, shape=[-1]))
        ops += [_op("Concat", flats, [fused, f"{fused}_split"], d, axis=0),
                _op("MPIAllreduce", [COMM, fused], [fused], d),
                _op("WeightedSum", [fused, _scale_of(d)], [fused], d),
                _op("Split", [fused, f"{fused}_split"], flats, d, axis=0)]
        for g, flat in zip(members, flats):
            ops.append(_op("Reshape", [flat, f"{g}_dp_shape"], [g, f"{flat}_shape"], d))
    return ops


def _gathered(sparse: list[GradientSlice], devices: dict, ops: list) -> dict[str, str]:
    """Allgather every slice's indices (once per blob) and values, scaling the values; {old: gathered name}."""
    names: dict[str, str] = {}
    for s in sparse:
        d = devices[s.values]
        for blob in (s.indices, s.values):
            if blob not in names:
                names[blob] = f"{blob}_dp_gathered"
                ops.append(_op("MPIAllgather", [COMM, blob], [names[blob]], d))
        ops.append(_op("WeightedSum", [names[s.values], _scale_of(d)], [names[s.values]], d))
    return names


def _rename_readers(net: NetDef, where: _Where, gathered: dict[str, str]) -> list[OperatorDef]:
    """The ops after the insertion point, reading the gathered blobs where they read the local slices."""
    before = Graph(net.op[:where.index], net.external_input).final
    readers: dict[int, set[str]] = {}
    for name in gathered:
        for i in where.graph.consumers.get((name, before.get(name, 0)), ()):
            if i >= where.index:
                readers.setdefault(i, set()).add(name)
    ops = []
    for i in range(where.index, len(net.op)):
        op = OperatorDef()
        op.CopyFrom(net.op[i])
        if i in readers:
            op.input[:] = [gathered[n] if n in readers[i] else n for n in op.input]
        ops.append(op)
    return ops
