"""data_parallel_model's bookkeeping: blobs grouped by device (`{name without the device scope: {device:
blob}}`), the blobs the init net makes per device (what parameter syncs and checkpoints cover), which device
each blob lives on, and the checks that no op reads another device's blobs.

Blob names are scoped `<prefix>_<device>/<name>` (prefix `gpu` or `cpu`).
"""
from __future__ import annotations

from collections import OrderedDict

from ..io.proto import DeviceOption
from ..ops.base import GradientSlice
from .blob_reference import BlobReference
from .scope import _NAMESCOPE_SEPARATOR

CUDA = 1


def stripBlobName(param) -> str:    # noqa: N802 - Caffe2's name
    """The name without its first scope: "gpu_0/fc/w" -> "fc/w" (a GradientSlice: "indices:values")."""
    if isinstance(param, GradientSlice):
        return stripBlobName(param.indices) + ":" + stripBlobName(param.values)
    name = str(param)
    if _NAMESCOPE_SEPARATOR not in name:
        raise ValueError(f"blob {name!r} has no device name scope (like 'gpu_0/')")
    return name[name.index(_NAMESCOPE_SEPARATOR) + 1:]


def device_of(blob, prefix: str) -> int:
    """The device id of a blob named `<prefix>_<id>/...`; an AssertionError naming the blob otherwise."""
    name = str(blob)
    head = name.split(_NAMESCOPE_SEPARATOR, 1)[0]
    scope, _, number = head.rpartition("_")
    if scope != prefix or not number.isdigit() or _NAMESCOPE_SEPARATOR not in name:
        raise AssertionError(f"Param {name} expected to have namescope '{prefix}_<device>'")
    return int(number)


def group_by_device(model, devices, params, non_data_params) -> OrderedDict:
    """{stripped name: {device: blob or GradientSlice}} for the params made per device (those after
    non_data_params, which came before data parallelism), in their order."""
    grouped: OrderedDict = OrderedDict()
    for p in params[len(non_data_params):]:
        if isinstance(p, GradientSlice):
            device = device_of(p.indices, model._device_prefix)
            if device_of(p.values, model._device_prefix) != device:
                raise AssertionError(f"Values {p.values} expected to have namescope "
                                     f"'{model._device_prefix}_{device}'")
        elif isinstance(p, str):
            device = device_of(p, model._device_prefix)
        else:
            raise AssertionError(f"Param {p} is not BlobReference or GradientSlice")
        grouped.setdefault(stripBlobName(p), {})[device] = p
    return grouped


def validate_params(params) -> None:
    seen, dupes = set(), []
    for p in params:
        if p in seen:
            dupes.append(p)
        seen.add(p)
    if dupes:
        raise AssertionError(f"Duplicate entries in params: {sorted(dupes)}")


def blobs_to_sync(model) -> tuple[list, set]:
    """(blobs, their stripped names): every device-scoped blob the init net makes (a shared model: its
    computed params), sorted by device then name."""
    prefix = model._device_prefix
    if model._shared_model:
        blobs = [str(p) for p in model.GetComputedParams("")]
        names = {stripBlobName(p) for p in blobs}
    else:
        blobs, names = [], set()
        for op in model.param_init_net.Proto().op:
            scoped = [o for o in op.output if o.startswith(prefix + "_")]
            names.update(stripBlobName(o) for o in scoped)
            blobs.extend(scoped)
        missing = set(model._param_names) - names
        if missing:
            raise AssertionError(f"Some params not instantiated in param init net: {missing}")
    ordered = sorted(set(blobs), key=lambda b: (device_of(b, prefix), b))
    return [BlobReference(b) for b in ordered], names


def infer_blob_devices(model) -> None:
    """model._blob_to_device: the device option of the first op (init net first) naming each blob; Iter's
    blobs are on the CPU; step nets of recurrent ops count."""
    mapping: dict = {}

    def visit(proto) -> None:
        for op in proto.op:
            device = op.device_option
            if op.type == "Iter":
                device = DeviceOption(device_type=0)
            for b in list(op.input) + list(op.output):
                mapping.setdefault(b, device)
            if op.type.startswith("RecurrentNetwork"):
                for arg in op.arg:
                    if arg.name.endswith("step_net") and arg.HasField("n"):
                        visit(arg.n)

    visit(model.param_init_net.Proto())
    visit(model.net.Proto())
    model._blob_to_device = mapping


def is_gpu_blob(model, blob_name) -> bool:
    where = getattr(model, "_blob_to_device", {})
    name = str(blob_name)
    if name not in where:
        name = f"{model._device_prefix}_{model._devices[0]}/{name}"
        if name not in where:
            return model._device_type == CUDA
    return where[name].device_type == CUDA


def analyze_operators(model) -> None:
    """Every GPU op (but copies, NCCL ops, concats, the all-reduce sums and Gloo all-reduces) reads and writes
    only blobs of its own device scope."""
    prefix = model._device_prefix
    for op in model.Proto().op:
        if "NCCL" in op.type or "Copy" in op.type or "Concat" in op.type:
            continue
        if (op.type == "Sum" and op.name == "dpm") or ("Allreduce" in op.type and "GLOO" in op.engine):
            continue
        if op.device_option.device_type != CUDA:
            continue
        scope = f"{prefix}_{op.device_option.device_id}/"
        for b in list(op.input) + list(op.output):
            if b.startswith(prefix + "_") and not b.startswith(scope):
                raise Exception(f"Blob {b} of op {op.type}, should have namescope {scope}. Op: {op}")


def prune_parameters_for_sharing(model) -> None:
    """A shared model: only the master device's parameters get updates."""
    master = f"{model._device_prefix}_{model._devices[0]}/"
    model.params = model.GetParams(master)
    keep = set(model.params)
    model.param_to_grad = {p: g for p, g in model.param_to_grad.items() if p in keep}
    model.weights = [w for w in model.weights if w in keep]
    model.biases = [b for b in model.biases if b in keep]


def remap_parameters_for_shared_model(model, all_params) -> None:
    """A shared model: the other devices' parameters are not made, and their readers read the master's."""
    master = f"{model._device_prefix}_{model._devices[0]}/"
    all_params = {str(p) for p in all_params}
    masters = {str(p) for p in model.GetParams()}
    for net in (model.param_init_net, model.net):
        proto = net.Proto()
        ops = []
        for op in proto.op:
            if any(o in all_params and o not in masters for o in op.output):
                continue
            op.input[:] = [master + stripBlobName(b) if b in all_params and b not in masters else b
                           for b in op.input]
            ops.append(op)
        kept = [type(op)() for op in ops]
        for new, old in zip(kept, ops):
            new.CopyFrom(old)
        del proto.op[:]
        proto.op.extend(kept)
