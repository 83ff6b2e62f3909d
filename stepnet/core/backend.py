"""Array modules per device: numpy for the CPU, CuPy for CUDA (imported here only, lazily), and an emulated
CUDA device on numpy that refuses silent host/device mixing the way CuPy does, for machines without a GPU.

`BACKENDS` holds one `Backend` record per device kind; every public function here looks things up in it.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .extras import install_hint
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
# The emulated device an array made from no device array goes to (CuPy's current device): device_scope sets it.
_EMULATED_CURRENT = contextvars.ContextVar("stepnet_emulated_device", default=0)


class DeviceArray(np.ndarray):
    """An ndarray that stands for memory on an emulated GPU: mixing it with host arrays is an error. A view
    keeps its base's device; a new result goes to the current one (device_scope), as CuPy's do."""

    def __array_finalize__(self, obj):
        self.device_index = getattr(obj, "device_index", None)
        if self.device_index is None:
            self.device_index = _EMULATED_CURRENT.get()

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


# --------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Backend:
    """One device kind: its array module, how to recognise its arrays, and how arrays cross to and from it."""
    kind: str
    module: Callable[[], Any]                      # the array module (None where it is unavailable)
    owns: Callable[[Any], bool]                    # is the value an array of this kind?
    to_host: Callable[[Any], np.ndarray]           # a numpy array of an owned array
    from_host: Callable[[np.ndarray, int], Any]    # a copy of a host array on device `index`
    index_of: Callable[[Any], int]                 # the device index of an owned array


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
    """The cupy module, or None without CuPy or a GPU (imported on first use)."""
    return _cupy()


def _owns_cupy(value) -> bool:
    # No CuPy array exists before something has imported cupy: until then, answer without importing it.
    if "cupy" not in sys.modules:
        return False
    cp = cupy_module()
    return cp is not None and isinstance(value, cp.ndarray)


def _cupy_from_host(array: np.ndarray, index: int):
    cp = cupy_module()
    with cp.cuda.Device(index):
        return cp.asarray(array)


def _emulated_from_host(array: np.ndarray, index: int) -> DeviceArray:
    out = np.array(array, copy=True).view(DeviceArray)
    out.device_index = index
    return out


# Looked up in order by device_of / to_host: the emulated device's arrays are ndarrays too, so it precedes cpu.
BACKENDS: dict[str, Backend] = {
    "emulated": Backend("emulated", lambda: EMULATED, lambda v: isinstance(v, DeviceArray),
                        lambda v: v.get(), _emulated_from_host, lambda v: v.device_index),
    "cpu": Backend("cpu", lambda: np, lambda v: isinstance(v, np.ndarray), lambda v: v,
                   lambda a, _index: np.array(a, copy=True), lambda _v: 0),
    "cuda": Backend("cuda", cupy_module, _owns_cupy, lambda v: cupy_module().asnumpy(v), _cupy_from_host,
                    lambda v: v.device.id),
}


@contextlib.contextmanager
def device_scope(device: Device):
    """`device` made the current one while the context lasts, for the arrays a kernel makes (CuPy's
    cuda.Device(k); the emulated device's current index); nothing for the CPU."""
    if device.kind == "cuda":
        with cupy_module().cuda.Device(device.index):
            yield
    elif device.kind == "emulated":
        token = _EMULATED_CURRENT.set(device.index)
        try:
            yield
        finally:
            _EMULATED_CURRENT.reset(token)
    else:
        yield


def backend_of(value) -> Backend | None:
    """The backend whose array `value` is (None for non-arrays)."""
    for b in BACKENDS.values():
        if b.owns(value):
            return b
    return None


# --------------------------------------------------------------------------------------------- dispatch
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
    cp = BACKENDS["cuda"].module()
    if cp is not None:
        count = cp.cuda.runtime.getDeviceCount()
        if not 0 <= index < count:
            raise DeviceError(f"an op asks for CUDA device {index} but this machine has {count} GPU(s) "
                              f"(0..{count - 1}); set its device_option.device_id (cuda_gpu_id) to one of them")
        return Device("cuda", index)
    if gpu == "cuda":
        raise DeviceError(f"an op asks for CUDA device {index} but CuPy or a GPU is not available; install it "
                          f"on a GPU machine: {install_hint('gpu')}; or run on the CPU (gpu='cpu' / --device cpu)")
    return CPU_DEVICE


def array_module(device: Device):
    """numpy, cupy, or the emulated module."""
    return BACKENDS[device.kind].module()


def device_of(value) -> Device | None:
    """The device an array lives on (None for non-arrays)."""
    b = backend_of(value)
    return None if b is None else Device(b.kind, b.index_of(value))


def to_host(value):
    """A numpy array of any device's array (identity for host arrays and non-arrays)."""
    if type(value) is np.ndarray:      # (a host array, the common case: no backend lookup)
        return value
    b = backend_of(value)
    return value if b is None else b.to_host(value)


def to_device(value, device: Device):
    """value copied onto device (a copy even when it is already there, as Caffe2's copy ops do)."""
    return BACKENDS[device.kind].from_host(to_host(value), device.index)


def all_finite(value) -> bool:
    """False when value is a floating array of any backend holding a NaN or an infinity, else True; the check
    runs in the array's own module (on its device) and only the verdict comes to the host."""
    b = backend_of(value)
    if b is None or value.dtype.kind not in "fc":
        return True
    return bool(b.module().isfinite(value).all())


def any_nan(value) -> bool:
    """True when value is a floating array of any backend holding a NaN (checked in the array's module)."""
    b = backend_of(value)
    if b is None or value.dtype.kind not in "fc":
        return False
    return bool(b.module().isnan(value).any())
