"""Copies between devices. Data crosses devices only here and in feed/fetch. A copy keeps shape, dtype and
value, so every op here has the shape function same_as(0). Gradients follow Caffe2: a CPU<->GPU copy's
gradient is the copy the other way, EnsureCPUOutput stops the gradient, the others have none registered."""
from __future__ import annotations

from ..core import backend
from ..core.spec import same_as
from .base import GradientSlice
from .registry import NO_GRADIENT, op


def _copy_to(value, device):
    return backend.to_device(value, device)


def _copy_back(back_type):
    """The gradient of a device copy is the copy the other way: one op for a dense gradient, two (indices
    and values) for a sparse one (Caffe2's GetGPUToCPUGradient / GetCPUToGPUGradient)."""
    def maker(g):
        if isinstance(g.g_output[0], GradientSlice):
            go, gi = g.GO_sparse(0), g.GI_sparse(0)
            g.op(back_type, [go.indices], [gi.indices])
            g.op(back_type, [go.values], [gi.values])
        else:
            g.op(back_type, [g.GO(0)], [g.GI(0)])
    return maker


@op("CopyCPUToGPU", context=True, devices="any", shape=same_as(0), gradient=_copy_back("CopyGPUToCPU"))
def copy_cpu_to_gpu(ctx, xp, x):
    """Copy a host tensor onto the op's (GPU) device."""
    return _copy_to(x, ctx.device)


@op("CopyGPUToCPU", context=True, devices="any", shape=same_as(0), gradient=_copy_back("CopyCPUToGPU"))
def copy_gpu_to_cpu(ctx, xp, x):
    """Copy a device tensor to the host."""
    return _copy_to(x, backend.CPU_DEVICE)


@op("CopyFromCPUInput", context="structure", devices="any", shape=same_as(0), shapes_from_inputs=True)
def copy_from_cpu_input(ctx, xp, x):
    """Copy a host input onto the op's device (whatever it is). Caffe2 registers no gradient for it."""
    return _copy_to(x, ctx.device)


@op("EnsureCPUOutput", context="structure", devices="any", shape=same_as(0), gradient=NO_GRADIENT,
    shapes_from_inputs=True)
def ensure_cpu_output(ctx, xp, x):
    """A host copy of the input, wherever it lives. No gradient flows back through it (Caffe2's
    NO_GRADIENT)."""
    return _copy_to(x, backend.CPU_DEVICE)


@op("CopyOnDeviceLike", inputs=2, context=True, devices="any", shape=same_as(0))
def copy_on_device_like(ctx, xp, x, like):
    """Copy X onto the device where `like` lives (the gradient of Copy)."""
    return _copy_to(x, backend.device_of(like) or ctx.device)
