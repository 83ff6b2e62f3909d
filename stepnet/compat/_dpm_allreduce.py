"""The ops data_parallel_model adds to keep K devices in step, as ops in the nets (no hidden runtime):

- all-reduce of a blob over the devices of one process: `Sum` ops (named "dpm") into the first device's blob,
  pairwise as a tree for 4, 8 and 16 devices, then `Copy` from it to every other device (a broadcast);
- sparse gradients (GradientSlice): indices and values concatenated over the devices, copied to each;
- across processes (a rendezvous with num_shards > 1): Gloo-style `Allreduce` / `Broadcast` ops over common
  worlds made in the init net (`CreateCommonWorld`, or `CloneCommonWorld` of one with the same timeout), at most
  `max_concurrent_distributed_ops` worlds, each op after the previous one of its world (control_input).
"""
from __future__ import annotations

from ..ops.base import GradientSlice
from . import core
from ._dpm_groups import is_gpu_blob

CPU, CUDA = 0, 1
DEFAULT_TIMEOUT_SEC = 30


def broadcast(devices, model, net, param, use_nccl: bool = False) -> None:
    """Copy the first device's blob to the others."""
    group = model._device_grouped_blobs[param]
    master = devices[0]
    gpu = is_gpu_blob(model, param)
    if use_nccl and gpu:
        with core.DeviceScope(core.DeviceOption(model._device_type, master)):
            net.NCCLBroadcast(list(group.values()), list(group.values()), root=0)
        return
    for d in devices[1:]:
        with core.DeviceScope(core.DeviceOption(CUDA, d) if gpu else core.DeviceOption(CPU, 0)):
            net.Copy(group[master], group[d])


def _sum_tree(n: int) -> list[tuple]:
    """Groups of device positions summed in turn into their first, ending with the total in position 0."""
    if n in (4, 8, 16):
        rounds, step = [], 1
        while step < n:
            rounds += [(j, j + step) for j in range(0, n, 2 * step)]
            step *= 2
        return rounds
    return [tuple(range(n))]


def allreduce(devices, model, net, param, use_nccl: bool = False, control_input=None) -> None:
    """Sum a blob of every device into each (Sum ops into the first device, then a broadcast)."""
    group = list(model._device_grouped_blobs[param].values())
    if model._device_type == CUDA and use_nccl:
        model.NCCLAllreduce(group, group, control_input=control_input)
        return
    for positions in _sum_tree(len(devices)):
        blobs = [group[k] for k in positions]
        with core.DeviceScope(core.DeviceOption(model._device_type, model._devices[positions[0]])):
            net.Sum(blobs, [blobs[0]], name="dpm")
    broadcast(devices, model, net, param)


def allreduce_blobs(blob_names, devices, model, net, rendezvous, use_nccl, max_concurrent_distributed_ops) -> None:
    if rendezvous is None or rendezvous["num_shards"] <= 1:
        _allreduce_single_host(blob_names, devices, model, net, use_nccl)
    else:
        _allreduce_distributed(blob_names, devices, model, net, rendezvous, max_concurrent_distributed_ops)


def _allreduce_single_host(blob_names, devices, model, net, use_nccl) -> None:
    if len(devices) == 1:
        return
    master_device = core.DeviceOption(model._device_type, devices[0])
    last_out = None
    concatenated: set = set()
    for name in blob_names:
        group = list(model._device_grouped_blobs[name].values())
        if len(group) == 1:
            continue
        if len(group) != len(devices):
            raise AssertionError(f"Each GPU from {devices}, should have a copy of {name}.")
        if not is_gpu_blob(model, name):
            if isinstance(group[0], GradientSlice):
                raise AssertionError("Synchronizing gradient slices not supported")
            with core.DeviceScope(core.DeviceOption(CPU)):
                net.Sum(group, [group[0]], name="dpm")
                if not model._shared_model:
                    broadcast(devices, model, net, name)
            continue
        with core.DeviceScope(master_device):
            if not isinstance(group[0], GradientSlice):
                allreduce(devices, model, net, name, use_nccl, last_out)
                last_out = group[0]
                continue
            _gather_slices(model, net, name, group, devices, concatenated)


def _gather_slices(model, net, name, group, devices, concatenated: set) -> None:
    """A sparse gradient: every device gets all devices' indices (once per indices blob) and values."""
    master_ns = f"{model._device_prefix}_{devices[0]}"
    grouped = model._device_grouped_blobs[name]

    def concat_to_every_device(part: str, short: str) -> None:
        joined, _ = net.Concat([getattr(g, part) for g in group], [f"{master_ns}/{name}_{short}_concat",
                                                                   f"{master_ns}/{name}_{short}_splitinfo"],
                               axis=0, name="note:data_parallel_model")
        for d, g in grouped.items():
            with core.DeviceScope(core.DeviceOption(model._device_type, d)):
                model.Copy(joined, getattr(g, part))

    if not any(str(g.indices) in concatenated for g in group):
        concat_to_every_device("indices", "index")
        concatenated.update(str(g.indices) for g in grouped.values())
    concat_to_every_device("values", "val")


def _allreduce_distributed(blob_names, devices, model, net, rendezvous, max_concurrent_distributed_ops) -> None:
    if model.net.Proto().num_workers <= 1:
        raise AssertionError("Please specify more than 1 worker")
    engine = rendezvous["engine"]
    master_device = core.DeviceOption(model._device_type, devices[0])
    context = CollectivesConcurrencyControl("allreduce", max_concurrent_distributed_ops, model.param_init_net,
                                            rendezvous)
    nccl_control = None
    for name in blob_names:
        master = model._device_grouped_blobs[name][devices[0]]
        group = list(model._device_grouped_blobs[name].values())

        def reduce(blobs, name=name, **kwargs):
            with core.DeviceScope(master_device):
                world, control = context.get_control_and_context(blobs[0])
                net.Allreduce([world] + blobs, blobs, name=name, engine=engine, control_input=control,
                              status_blob=f"allreduce_{name}_status", **kwargs)

        if engine == "GLOO":
            reduce(group, gpu_direct=rendezvous.get("transport") == "ibverbs")
            continue
        reduced = str(master) + "_red"
        with core.DeviceScope(master_device):
            model.ConstantFill(master, reduced, value=0.0)
            net.NCCLAllreduce(group, group, control_input=nccl_control)
            nccl_control = group[0]
            net.Copy(master, reduced)
        reduce([reduced])
        with core.DeviceScope(master_device):
            net.Copy(reduced, master)
        broadcast(devices, model, net, name)


def sync_all_params(devices, model, init_net, net, rendezvous, unique_param_names,
                    max_concurrent_distributed_ops=4) -> None:
    """The first device's value of each named blob to every device (and, across processes, from rank 0)."""
    if rendezvous is None or rendezvous["num_shards"] <= 1:
        for name in unique_param_names:
            broadcast(devices, model, net, name)
        return
    gpu_device = core.DeviceOption(model._device_type, devices[0])
    cpu_device = core.DeviceOption(CPU)
    if model._broadcast_context is None:
        model._broadcast_context = CollectivesConcurrencyControl("broadcast", max_concurrent_distributed_ops,
                                                                 init_net, rendezvous)
    context = model._broadcast_context
    for name in sorted(unique_param_names):
        master = model._device_grouped_blobs[name][devices[0]]
        group = list(model._device_grouped_blobs[name].values())

        def bcast(blobs, name=name):
            world, control = context.get_control_and_context(blobs)
            net.Broadcast([world] + blobs, blobs, name=name, engine=rendezvous["engine"],
                          status_blob=f"broadcast_{name}_status", control_input=control)

        device = gpu_device if is_gpu_blob(model, name) else cpu_device
        if rendezvous["engine"] == "GLOO":
            with core.DeviceScope(device):
                bcast(group)
            continue
        with core.DeviceScope(device):
            master_cpu = net.CopyGPUToCPU(master, str(master) + "cpu")
        with core.DeviceScope(cpu_device):
            bcast([master_cpu])
        with core.DeviceScope(device):
            net.CopyCPUToGPU(master_cpu, master)
        broadcast(devices, model, net, name)


def broadcast_computed_params(devices, model, rendezvous, use_nccl: bool = False) -> None:
    """Computed params (e.g. batch-norm running statistics) copied from the first device to the others (across
    processes too, Caffe2 does not: each process keeps its own)."""
    if len(devices) == 1:
        return
    for name in model._computed_param_names:
        broadcast(devices, model, model.net, name, use_nccl)


def create_or_clone_common_world(net, common_world_blob, rendezvous, name=None, status_blob=None,
                                 timeout_sec=None):
    """A common world over the rendezvous: a clone of one this net already creates with the same timeout, or a
    new CreateCommonWorld."""
    timeout_ms = (DEFAULT_TIMEOUT_SEC if timeout_sec is None else timeout_sec) * 1000
    existing = None
    for op in net.Proto().op:
        if op.type == "CreateCommonWorld":
            op_timeout = next((a.i for a in op.arg if a.name == "timeout_ms"), -1)
            if op_timeout == timeout_ms:
                existing = op.output[0]
                break
    name = name or f"{common_world_blob}_op"
    if existing is not None:
        return net.CloneCommonWorld([existing], common_world_blob, name=name, engine=rendezvous["engine"],
                                    status_blob=status_blob)
    extra = {k: rendezvous[k] for k in ("transport", "interface", "mpi_rendezvous") if k in rendezvous}
    return net.CreateCommonWorld(rendezvous["kv_handler"] or [], common_world_blob, name=name,
                                 size=rendezvous["num_shards"], rank=rendezvous["shard_id"],
                                 engine=rendezvous["engine"], status_blob=status_blob, timeout_ms=timeout_ms, **extra)


class CollectivesConcurrencyControl:
    """Up to max_concurrent_context common worlds; the collectives of one world run in turn (each gets the
    previous one's output as its control input)."""

    def __init__(self, name, max_concurrent_context, param_init_net, rendezvous):
        self.name, self.max_concurrent_context = name, max_concurrent_context
        self.param_init_net, self.rendezvous = param_init_net, rendezvous
        self.counter = 0
        self.common_worlds: list = []
        self.control_inputs: list = []

    def get_control_and_context(self, control_output_blob):
        slot = self.counter % self.max_concurrent_context
        control = None
        if len(self.common_worlds) < self.max_concurrent_context:
            world = create_or_clone_common_world(self.param_init_net, f"{self.name}_{slot}_cw", self.rendezvous,
                                                 status_blob=f"create_{self.name}_cw_{slot}_status")
            self.common_worlds.append(world)
            self.control_inputs.append(control_output_blob)
        else:
            world, control = self.common_worlds[slot], self.control_inputs[slot]
            self.control_inputs[slot] = control_output_blob
        self.counter += 1
        return world, control
