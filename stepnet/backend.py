"""Array modules per device: numpy for the CPU, CuPy for CUDA (imported here only), and an emulated
CUDA device on numpy that refuses silent host/device mixing the way CuPy does, for machines without a GPU.
"""
from __future__ import annotations

import functools
import types
from dataclasses import dataclass

import numpy as np

from .errors import DeviceError

CPU, CUDA = 0, 1


@dataclass(frozen=True)
class Device:
    """Where an op runs and its arrays live: ('cpu', 0), ('cuda', k) or ('emulated', k)."""
    kind: str = "cpu"
    index: int = 0

    def __str__(self):
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.index}"

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"


CPU_DEVICE = Device()


# --------------------------------------------------------------------------------------------- emulation
class DeviceArray(np.ndarray):
    """An ndarray that stands for memory on an emulated GPU: mixing it with host arrays is an error."""

    def __array_finalize__(self, obj):
        self.device_index = getattr(obj, "device_index", 0)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _check_no_host(inputs, ufunc.__name__)
        out = kwargs.get("out")
        if out is not None:
            _check_no_host(out, ufunc.__name__)
            kwargs["out"] = tuple(_host_view(o) for o in out)
        result = getattr(ufunc, method)(*(_host_view(x) for x in inputs), **kwargs)
        if out is not None:  # in-place (x += y, out=...): the very arrays given, as numpy and CuPy return
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types_, args, kwargs):
        _check_no_host((args, kwargs), func.__name__)
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def get(self) -> np.ndarray:
        """A host copy, as cupy.ndarray.get() gives."""
        return np.array(self.view(np.ndarray))

    def __repr__(self):
        return f"DeviceArray({self.view(np.ndarray)!r}, device=emulated:{self.device_index})"


def _host_view(x):
    return x.view(np.ndarray) if isinstance(x, DeviceArray) else x


def _unwrap(x):
    if isinstance(x, DeviceArray):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x):
    if isinstance(x, np.ndarray) and not isinstance(x, DeviceArray):
        return x.view(DeviceArray)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _check_no_host(obj, what: str):
    if isinstance(obj, np.ndarray) and not isinstance(obj, DeviceArray):
        raise TypeError(f"{what}: a host numpy array was mixed with emulated-device arrays; "
                        "copy it to the device first (CopyCPUToGPU / backend.to_device)")
    if isinstance(obj, (list, tuple)):
        for v in obj:
            _check_no_host(v, what)
    elif isinstance(obj, dict):
        for v in obj.values():
            _check_no_host(v, what)


class EmulatedArrayModule(types.ModuleType):
    """A stand-in for the `cupy` module: numpy's functions, taking and returning DeviceArrays.

    Like cupy, `asarray`/`array` accept host arrays (an explicit transfer); every other function
    refuses them, and so do operators between a DeviceArray and a host array.
    """
    _TRANSFER = {"asarray", "array", "ascontiguousarray", "asanyarray"}

    def __init__(self, base=np, name="stepnet.emulated_cupy"):
        super().__init__(name)
        self._base = base

    def __getattr__(self, name):
        attr = getattr(self._base, name)
        if isinstance(attr, types.ModuleType):
            wrapped = EmulatedArrayModule(attr, f"{self.__name__}.{name}")
        elif callable(attr) and not isinstance(attr, type):
            wrapped = self._wrap_function(name, attr)
        else:
            wrapped = attr
        setattr(self, name, wrapped)
        return wrapped

    def _wrap_function(self, name, fn):
        transfer = name in self._TRANSFER

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not transfer:
                _check_no_host((args, kwargs), name)
            return _wrap(fn(*_unwrap(args), **_unwrap(kwargs)))
        return call

    def asnumpy(self, x):
        return x.get() if isinstance(x, DeviceArray) else np.asarray(x)

    ndarray = DeviceArray


EMULATED = EmulatedArrayModule()


# --------------------------------------------------------------------------------------------- dispatch
def _cupy():
    try:
        import cupy  # noqa: PLC0415 - the only place stepnet imports CuPy
    except ImportError:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # noqa: BLE001 - no driver / no device
        return None
    return cupy


@functools.lru_cache(maxsize=1)
def cupy_module():
    return _cupy()


def resolve(device_option, gpu: str = "auto") -> Device:
    """The Device an op with this DeviceOption runs on.

    gpu: "auto" (CUDA ops on CuPy when a GPU is present, otherwise on the CPU), "cpu" (every op on the
    CPU), "emulate" (CUDA ops on the emulated device) or "cuda" (CuPy required).
    """
    if device_option is None or device_option.device_type != CUDA or gpu == "cpu":
        return CPU_DEVICE
    index = device_option.device_id
    if gpu == "emulate":
        return Device("emulated", index)
    if cupy_module() is not None:
        return Device("cuda", index)
    if gpu == "cuda":
        raise DeviceError(f"an op asks for CUDA device {index} but CuPy or a GPU is not available; "
                          "install stepnet[gpu] on a GPU machine, or run on the CPU (gpu='cpu' / --device cpu)")
    return CPU_DEVICE


def array_module(device: Device):
    """numpy, cupy, or the emulated module."""
    if device.kind == "cpu":
        return np
    if device.kind == "emulated":
        return EMULATED
    return cupy_module()


def device_of(value) -> Device | None:
    """The device an array lives on (None for non-arrays)."""
    if isinstance(value, DeviceArray):
        return Device("emulated", value.device_index)
    if isinstance(value, np.ndarray):
        return CPU_DEVICE
    cp = cupy_module()
    if cp is not None and isinstance(value, cp.ndarray):
        return Device("cuda", value.device.id)
    return None


def to_host(value):
    """A numpy array of any device's array (identity for host arrays)."""
    if isinstance(value, DeviceArray):
        return value.get()
    if isinstance(value, np.ndarray):
        return value
    cp = cupy_module()
    if cp is not None and isinstance(value, cp.ndarray):
        return cp.asnumpy(value)
    return value


def to_device(value, device: Device):
    """value copied onto device (a copy even when it is already there, as Caffe2's copy ops do)."""
    host = to_host(value)
    if device.kind == "cpu":
        return np.array(host, copy=True)
    if device.kind == "emulated":
        out = np.array(host, copy=True).view(DeviceArray)
        out.device_index = device.index
        return out
    cp = cupy_module()
    with cp.cuda.Device(device.index):
        return cp.asarray(host)
