"""Copies between devices. Data crosses devices only here and in feed/fetch."""
from __future__ import annotations

from .. import backend
from .registry import op


def _copy_to(value, device):
    return backend.to_device(value, device)


@op("CopyCPUToGPU", context=True, devices="any")
def copy_cpu_to_gpu(ctx, xp, x):
    """Copy a host tensor onto the op's (GPU) device."""
    return _copy_to(x, ctx.device)


@op("CopyGPUToCPU", context=True, devices="any")
def copy_gpu_to_cpu(ctx, xp, x):
    """Copy a device tensor to the host."""
    return _copy_to(x, backend.CPU_DEVICE)


@op("CopyFromCPUInput", context=True, devices="any")
def copy_from_cpu_input(ctx, xp, x):
    """Copy a host input onto the op's device (whatever it is)."""
    return _copy_to(x, ctx.device)


@op("EnsureCPUOutput", context=True, devices="any")
def ensure_cpu_output(ctx, xp, x):
    """A host copy of the input, wherever it lives."""
    return _copy_to(x, backend.CPU_DEVICE)


@op("CopyOnDeviceLike", inputs=2, context=True, devices="any")
def copy_on_device_like(ctx, xp, x, like):
    """Copy X onto the device where `like` lives (the gradient of Copy)."""
    return _copy_to(x, backend.device_of(like) or ctx.device)
