"""Int8Tensor: a quantized tensor, the value Caffe2's Int8 ops pass between them (caffe2/core/tensor_int8.h).

An Int8Tensor holds `data` (uint8 codes, or int32 for the biases of Int8Conv/Int8FC), a `scale` and a
`zero_point`; the real value of a code q is (q - zero_point) * scale. Caffe2 keeps the scale as a float, so
the scale is rounded to float32 when the value is made. Blobs hold an Int8Tensor like any value: it is fed
and fetched (Workspace.fetch returns an Int8Tensor whose data is a host numpy copy), saved and loaded as
Caffe2 saves an Int8TensorCPU (stepnet.io.int8_blob), printed by Print and `stepnet run --fetch`, and described
for static inference by a TensorSpec with dtype uint8/int32 and quant=(scale, zero_point).

Float ops cannot read one by mistake: turning it into a numpy array raises a TypeError that says to
dequantize it first (Int8Dequantize, or .dequantize() in Python).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import backend
from .errors import ArgumentError, DTypeError

DTYPES = (np.dtype(np.uint8), np.dtype(np.int32))   # codes, and the int32 biases of Int8Conv / Int8FC


@dataclass(frozen=True, eq=False)
class Int8Tensor:
    """A quantized tensor: `data` (a uint8 or int32 array on any device), `scale` (float32) and `zero_point`;
    code q stands for (q - zero_point) * scale."""
    data: Any
    scale: float = 1.0
    zero_point: int = 0

    def __post_init__(self):
        data = self.data if hasattr(self.data, "dtype") else np.asarray(self.data)
        if data.dtype not in DTYPES:
            raise DTypeError(f"an Int8 tensor holds uint8 codes (or int32 for biases), got {data.dtype} data")
        scale = float(np.float32(self.scale))
        if not math.isfinite(scale):
            raise ArgumentError(f"an Int8 tensor needs a finite scale, got {self.scale!r}")
        zero_point = int(self.zero_point)
        if not -2 ** 31 <= zero_point < 2 ** 31 or zero_point != self.zero_point:
            raise ArgumentError(f"an Int8 tensor's zero point is an int32, got {self.zero_point!r}")
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "zero_point", zero_point)

    shape = property(lambda self: tuple(self.data.shape))
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: int(self.data.size))

    @classmethod
    def quantize(cls, values, scale: float, zero_point: int = 0) -> "Int8Tensor":
        """Float values as uint8 codes, the way Int8Quantize makes them (on the host)."""
        return cls(quantize_uint8(np, np.asarray(values, np.float32), scale, zero_point), scale, zero_point)

    def dequantize(self) -> np.ndarray:
        """The real values, (q - zero_point) * scale, as a float32 host array."""
        return dequantize(np, np.asarray(backend.to_host(self.data)), self.scale, self.zero_point)

    def copy(self, device: backend.Device | None = None) -> "Int8Tensor":
        """A copy with its data on the host (device None or the CPU) or on `device`."""
        data = np.array(backend.to_host(self.data), copy=True)
        if device is not None and not device.is_cpu:
            data = backend.to_device(data, device)
        return Int8Tensor(data, self.scale, self.zero_point)

    def summary(self, count: int = 6) -> str:
        """'shape (2, 3) uint8 scale 0.5 zero_point 127 [127, 130, ...] (6 values)'."""
        flat = np.asarray(backend.to_host(self.data)).reshape(-1)
        head = np.array2string(flat[:count], separator=", ", max_line_width=200)
        more = f" ... ({flat.size} values)" if flat.size > count else ""
        return f"shape {self.shape} {self.dtype} scale {self.scale:g} zero_point {self.zero_point} {head}{more}"

    def __repr__(self):
        return f"Int8Tensor({self.summary()})"

    def __array__(self, dtype=None, copy=None):
        raise TypeError(f"an Int8 tensor ({self.summary(3)}) is not a float array: dequantize it first "
                        "(Int8Dequantize in a net, .dequantize() in Python) or pass it to an Int8 op")


def quantize_uint8(xp, x, scale: float, zero_point: int):
    """Caffe2's QuantizeUint8: zero_point + round-half-even(x / scale) in float32, clamped to [0, 255]
    (values beyond the int32 range saturate, NaN gives 0)."""
    q = xp.rint(x.astype(np.float32) / np.float32(scale)).astype(np.float64)
    q = xp.clip(xp.nan_to_num(q, nan=-2.0 ** 31), -2.0 ** 31, 2.0 ** 31 - 1) + zero_point
    return xp.clip(q, 0, 255).astype(np.uint8)


def dequantize(xp, q, scale: float, zero_point: int):
    """(q - zero_point) * scale in float32, as Int8Dequantize computes it."""
    return (q.astype(np.int64) - zero_point).astype(np.float32) * np.float32(scale)
