"""What Parallelize and Parallelize_BMUF share: the device kind of the model, building under each device's
scopes, and the backward pass seeded per device."""
from __future__ import annotations

import logging

from ..ops.base import GradientSlice
from . import core, memonger, scope, workspace
from ._dpm_allreduce import sync_all_params

log = logging.getLogger("data_parallel_model")
CPU, CUDA = 0, 1


def device_kind(model, cpu_device: bool, devices, shared_model: bool = False) -> None:
    """Checks there is no device scope (but the CPU's), then sets model._device_type, _device_prefix and
    _shared_model."""
    current = scope.CurrentDeviceScope()
    if current is not None and current.device_type != CPU:
        raise AssertionError(f"Parallelize must be called without device-scope, device scope was: {current}")
    if not cpu_device:
        if shared_model:
            raise AssertionError("Shared model only supported on CPU")
        available = workspace.NumCudaDevices()
        if devices is not None and any(d >= available for d in devices):
            log.warning("** Only %d GPUs available, GPUs %s requested", available, devices)
        model._device_type, model._device_prefix, model._shared_model = CUDA, "gpu", False
    else:
        model._device_type, model._device_prefix, model._shared_model = CPU, "cpu", shared_model


def for_each_device(model, devices, f) -> None:
    """f(device) under the device's device scope and name scope `<prefix>_<device>`."""
    for device in devices:
        with core.DeviceScope(core.DeviceOption(model._device_type, device)):
            with core.NameScope(f"{model._device_prefix}_{device}"):
                f(device)


def add_gradient_operators(devices, model, losses_by_gpu) -> None:
    """The backward pass from every device's losses, each seeded with ones made on its device."""
    seeds = {}
    for device in devices:
        with core.DeviceScope(core.DeviceOption(model._device_type, device)):
            for loss in losses_by_gpu[device]:
                seeds[str(loss)] = str(model.ConstantFill(loss, str(loss) + "_grad", value=1.0))
    model.AddGradientOperators(seeds)


def add_blob_sync(model, blobs, net=None) -> None:
    """Copy the first device's value of each (unscoped) blob to the other devices, in `net` (the model's)."""
    if not blobs:
        return
    net = model.net if net is None else net
    for b in blobs:
        if str(b).startswith(model._device_prefix):
            raise AssertionError(f"Provide unprefixed blob name: {b}")
        model._device_grouped_blobs[str(b)] = {
            d: core.BlobReference(f"{model._device_prefix}_{d}/{b}") for d in model._devices}
    sync_all_params(model._devices, model, model.param_init_net, net, model._rendezvous, {str(b) for b in blobs})


def optimize_gradient_memory_simple(model, losses_by_gpu, devices) -> None:
    """memonger.share_grad_blobs on each device's gradients (not activations), the result put in model.net."""
    for device in devices:
        namescope = f"{model._device_prefix}_{device}/"
        shared = memonger.share_grad_blobs(model.net, losses_by_gpu[device], set(model.param_to_grad.values()),
                                           namescope, share_activations=False)
        model.net.Proto().CopyFrom(shared)


def add_dynamic_memory_optimization(model, blobs_to_keep, devices) -> None:
    """A Free op after each blob's last use (but blobs_to_keep, and parameter gradients across processes)."""
    keep = {f"{model._device_prefix}_{d}/{b}" for d in devices for b in blobs_to_keep or ()}
    if model._rendezvous is not None:
        # collectives expect the same buffers every iteration: the parameter gradients are never freed
        keep.update(str(g) for g in model.param_to_grad.values() if not isinstance(g, GradientSlice))
    model.net.Proto().CopyFrom(memonger.release_blobs_when_used(model.net.Proto(), keep))
