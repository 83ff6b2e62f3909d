"""Parallelize_BMUF: block-wise model-update filtering (Chen & Huo, ICASSP 2016) over K devices.

Each device trains its own copy for some iterations (model.net, no gradient all-reduce); then
`_global_model_param_updates_net` averages the copies and moves the global model g by a filtered step: with
v the block momentum and avg the devices' mean,
    v <- block_momentum * v + block_learning_rate * (avg - g);   g <- g + v   (Nesterov: g - block_momentum *
    (v - v_prev) ... as Caffe2), and copies g to every device.
The global model `<param>_g` and `<param>_v` live on the master device; `_global_model_init_net` makes them.
"""
from __future__ import annotations

import copy

from . import core, model_helper, workspace
from ._dpm_allreduce import allreduce_blobs, sync_all_params
from ._dpm_groups import group_by_device, infer_blob_devices, validate_params
from ._dpm_setup import (add_blob_sync, add_gradient_operators, device_kind, for_each_device,
                         optimize_gradient_memory_simple)


def Parallelize_GPU_BMUF(*args, **kwargs):   # noqa: N802 - Caffe2's names
    kwargs["cpu_device"] = False
    Parallelize_BMUF(*args, **kwargs)


def Parallelize_CPU_BMUF(*args, **kwargs):   # noqa: N802
    kwargs["cpu_device"] = True
    Parallelize_BMUF(*args, **kwargs)


def _net(name: str, net_type: str, num_workers: int):
    net = core.Net(name)
    net.Proto().type = net_type
    net.Proto().num_workers = num_workers
    return net


def Parallelize_BMUF(model_helper_obj, input_builder_fun, forward_pass_builder_fun, param_update_builder_fun,  # noqa: N802
                     block_learning_rate=1.0, block_momentum=None, devices=None, rendezvous=None, net_type="dag",
                     master_device=None, use_nccl=False, nesterov=False, optimize_gradient_memory=False,
                     reset_momentum_sgd=False, warmup_iterations=None, max_concurrent_distributed_ops=4,
                     add_blobs_to_sync=None, num_threads_per_device=4, cpu_device=False):
    """The model on every device with local updates (model.net), and the nets of the block update (see the
    module); RunInitNet / RunNet run them."""
    model = model_helper_obj
    device_kind(model, cpu_device, devices)
    if not isinstance(model, model_helper.ModelHelper):
        raise AssertionError("Parallelize_BMUF needs a ModelHelper")
    if devices is None:
        devices = list(range(workspace.NumCudaDevices()))
    master_device = devices[0] if master_device is None else master_device
    model._devices = list(devices)
    model._rendezvous = rendezvous
    model._broadcast_context = None
    master = core.DeviceOption(model._device_type, master_device)
    num_devices = len(devices) * (rendezvous["num_shards"] if rendezvous else 1)
    num_workers = num_threads_per_device * len(devices) + (8 if rendezvous else 0)
    loss_scale = 1.0 / num_devices
    block_momentum = 1.0 - 1.0 / num_devices if block_momentum is None else block_momentum
    max_concurrent_distributed_ops = min(max_concurrent_distributed_ops, num_workers - 1)
    model.net.Proto().num_workers = num_workers
    model.net.Proto().type = net_type
    model._global_model_init_net = _net("global_model_init", net_type, num_workers)
    model._global_model_param_updates_net = updates = _net("global_model", net_type, num_workers)

    non_datapar_params = copy.copy(model.params)
    model._losses_by_gpu = {}

    def build(device):
        input_builder_fun(model)
        model._losses_by_gpu[device] = forward_pass_builder_fun(model, loss_scale)

    for_each_device(model, devices, build)
    validate_params(model.params)
    model._device_grouped_blobs = group_by_device(model, devices, model.params, non_datapar_params)
    model._param_names = list(model._device_grouped_blobs)
    add_gradient_operators(devices, model, model._losses_by_gpu)
    validate_params(model.params)
    infer_blob_devices(model)
    for_each_device(model, devices, lambda _: param_update_builder_fun(model))
    names = list(model._device_grouped_blobs)

    def on_master(name):
        return model._device_grouped_blobs[name][master_device]

    if warmup_iterations is not None:
        model._warmup_iterations = warmup_iterations
        model._warmup_broadcast = _net("warmup-broadcast", net_type, num_workers)
        sync_all_params(devices, model, model.param_init_net, model._warmup_broadcast, rendezvous, names,
                        max_concurrent_distributed_ops)
        for name in names:
            with core.DeviceScope(master):
                model._warmup_broadcast.Copy(on_master(name), f"{on_master(name)}_g")

    for name in names:                 # the global model and its momentum start from the initial parameters
        p = on_master(name)
        with core.DeviceScope(master):
            model._global_model_init_net.ConstantFill(p, f"{p}_v", value=0.0)
            model._global_model_init_net.Copy(p, f"{p}_g")
            if nesterov:
                model._global_model_init_net.ConstantFill(p, f"{p}_prev", value=0.0)

    allreduce_blobs(names, devices, model, updates, rendezvous, use_nccl, max_concurrent_distributed_ops)
    for name in names:
        p = on_master(name)
        v, g, prev = f"{p}_v", f"{p}_g", f"{p}_prev"
        with core.DeviceScope(master):
            updates.Scale(p, p, scale=1.0 / num_devices)          # the average
            updates.Sub([p, g], p)
            updates.Scale(p, p, scale=block_learning_rate)
            updates.Scale(v, v, scale=block_momentum)
            updates.Add([v, p], v)
            updates.Add([g, v], g)
            if nesterov:
                updates.Sub([v, prev], prev)
                updates.Scale(prev, prev, scale=block_momentum)
                updates.Sub([g, prev], g)
                updates.Copy(v, prev)
            updates.Copy(g, p)
    sync_all_params(devices, model, model.param_init_net, updates, rendezvous, names,
                    max_concurrent_distributed_ops)
    if add_blobs_to_sync is not None:
        add_blob_sync(model, add_blobs_to_sync, net=updates)
    if reset_momentum_sgd:
        for op in [op for op in model.net.Proto().op if op.type == "MomentumSGDUpdate"]:
            with core.DeviceScope(op.device_option):
                updates.ConstantFill([op.input[1]], op.input[1], value=0.0)
    if optimize_gradient_memory:
        optimize_gradient_memory_simple(model, model._losses_by_gpu, devices)
    model._data_parallel_model_init_nets = [model.param_init_net, model._global_model_init_net]
    model._data_parallel_model_nets = [model.net, (updates, 1)]
