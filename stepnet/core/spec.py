"""What static inference knows of a blob before anything runs: TensorSpec (shape, dtype, small integer values,
Int8 quantization), and the helpers op records' shape functions use."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .int8 import Int8Tensor

SMALL_VALUE = 64  # constant int tensors up to this size carry their values (shape inputs, sizes)


@dataclass(frozen=True, eq=False)
class TensorSpec:
    """What is known of a blob before running: shape (a tuple; None for an unknown shape, a None entry for an
    unknown dim), dtype, for small integer constants the value (so shape inputs can be followed), and for an
    Int8Tensor its quantization (scale, zero_point) (None for every other value)."""
    shape: tuple | None
    dtype: Any = None
    value: Any = None
    quant: tuple | None = None

    @classmethod
    def of(cls, array, values: bool = False) -> "TensorSpec":
        """The spec of an array, with the values of a small integer one (as static inference keeps them); with
        `values`, those of every integer array and of small float ones (what sizes an op's outputs at run time:
        lengths, indices, scales), on the host."""
        if isinstance(array, Int8Tensor):
            return cls(array.shape, array.dtype, None, (array.scale, array.zero_point))
        arr = np.asarray(array) if not hasattr(array, "shape") else array
        value, small, kind = None, arr.size <= SMALL_VALUE, arr.dtype.kind
        if (kind in "iub" and (small or values)) or (values and small and kind == "f"):
            host = arr.get() if hasattr(arr, "get") else arr
            value = np.array(host) if small else np.asarray(host)
        return cls(tuple(arr.shape), np.dtype(arr.dtype), value)

    def __str__(self):
        shape = "?" if self.shape is None else str(tuple("?" if d is None else d for d in self.shape))
        quant = "" if self.quant is None else f" scale {self.quant[0]:g} zero_point {self.quant[1]}"
        return f"{shape} {self.dtype if self.dtype is not None else '?'}{quant}"  # like ops.binding.describe


UNKNOWN = TensorSpec(None)


def spec(shape, dtype=np.float32, value=None) -> TensorSpec:
    """Convenience for shape functions: TensorSpec(tuple(shape), np.dtype(dtype))."""
    return TensorSpec(tuple(int(d) for d in shape), np.dtype(dtype), value)


def same_as(i: int = 0, n: int = 1):
    """A shape function: n outputs shaped and typed like input i."""
    def shape(specs, **_):
        return [specs[i]] * n
    return shape
