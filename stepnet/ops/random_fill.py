"""Random fillers: UniformFill, UniformIntFill, GaussianFill, XavierFill, MSRAFill (Caffe2's filler_op.h).

They share fill.py's shape rules. Each draws on the host from the op's generator, then moves the result to
the op's device, so CPU and GPU runs start identical. Like every filler, they are NO_GRADIENT in Caffe2, and
they declare `alloc` (the executor checks the blob limit before the kernel draws).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from ..core.spec import TensorSpec
from .base import size_of
from .fill import FILL_ARGS, fill_shape, fill_spec, float32_alloc, float32_shape
from .registry import NO_GRADIENT, Arg, op


def _random(xp, host: np.ndarray, dtype):
    return xp.asarray(host.astype(dtype, copy=False))


def _uniform_range(inputs, lo, hi, default_lo, default_hi, integer: bool, op_type: str):
    """(shape inputs, low, high, empty_first_dim) of UniformFill / UniformIntFill's 0, 1 or 3 inputs.

    Inputs may be arrays or TensorSpecs; bounds given as TensorSpecs whose values are not known statically
    are None, and so is empty_first_dim then.
    """
    if len(inputs) == 2:
        raise ArityError(f"{op_type} takes 0, 1 or 3 inputs (shape source, min, max), got 2")
    if len(inputs) == 3:
        if lo is not None or hi is not None:
            raise ArgumentError("min/max were given both as arguments and as inputs; drop the arguments")
        bounds = []
        for name, t in (("min", inputs[1]), ("max", inputs[2])):
            if size_of(t) != 1:
                raise ShapeError(f"the {name} input must hold one element, got shape {tuple(t.shape)}")
            if t.dtype is not None and t.dtype.kind not in ("iu" if integer else "f"):
                want = "int32" if integer else "float32"
                raise DTypeError(f"the {name} input must be {want}, got {t.dtype}")
            host = t.value if isinstance(t, TensorSpec) else backend.to_host(t)
            v = None if host is None else host.reshape(-1)[0]
            bounds.append(None if v is None else int(v) if integer else float(v))
        empty = None if None in bounds else bounds[0] > bounds[1]
        return inputs[:1], bounds[0], bounds[1], empty
    lo = default_lo if lo is None else lo
    hi = default_hi if hi is None else hi
    if lo > hi:
        raise ArgumentError(f"min {lo} is larger than max {hi}; give min <= max")
    return inputs, lo, hi, False


def _uniform_shape(inputs, fill_args, lo, hi, integer: bool, op_type: str):
    """(output shape, low, high): with min > max given as inputs Caffe2 makes the first dim 0."""
    defaults = (0, 1) if integer else (0.0, 1.0)
    shape_inputs, lo, hi, empty = _uniform_range(inputs, lo, hi, *defaults, integer, op_type)
    out_shape = fill_shape(shape_inputs, *fill_args)
    if empty is None:
        return (None,) + tuple(out_shape[1:]), lo, hi
    if empty:
        if not out_shape:
            raise ShapeError("min > max makes the first dim 0, but the output is a scalar")
        return (0,) + tuple(out_shape[1:]), lo, hi
    return out_shape, lo, hi


def _uniform(xp, inputs, fill_args, lo, hi, rng, integer: bool, op_type: str):
    out_shape, lo, hi = _uniform_shape(inputs, fill_args, lo, hi, integer, op_type)
    dtype = np.int32 if integer else np.float32
    if lo > hi:  # min > max given as inputs: an output with no elements
        return xp.zeros(out_shape, dtype=dtype)
    _check_bounds(lo, hi, integer, op_type)
    if integer:
        return _random(xp, rng.integers(lo, hi, size=out_shape, endpoint=True), dtype)
    return _random(xp, rng.uniform(lo, hi, size=out_shape), dtype)


def _check_bounds(lo, hi, integer: bool, op_type: str) -> None:
    """Bounds the samples can lie between: int32 values for UniformIntFill, finite floats whose difference is
    finite for UniformFill."""
    if integer:
        info = np.iinfo(np.int32)
        if not (info.min <= lo and hi <= info.max):
            raise ArgumentError(f"min {lo} and max {hi} must lie in int32 ({info.min} to {info.max}), "
                                "the output's type")
    elif not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(hi - lo)):
        raise ArgumentError(f"min {lo} and max {hi} must be finite, and max - min too (it is "
                            f"{hi - lo}); give bounds within float range")


def _uniform_fill_shape(op_type, integer):
    def shape(specs, shape, extra_shape, input_as_shape, min, max, rng):
        fill_args = (shape, extra_shape, input_as_shape)
        out_shape, _, _ = _uniform_shape(specs, fill_args, min, max, integer, op_type)
        return [fill_spec(out_shape, np.int32 if integer else np.float32)]
    return shape


def _uniform_alloc(op_type, integer):
    def alloc(*inputs, shape, extra_shape, input_as_shape, min, max, rng):
        out_shape, _, _ = _uniform_shape(inputs, (shape, extra_shape, input_as_shape), min, max, integer, op_type)
        return [(0, out_shape, np.int32 if integer else np.float32)]
    return alloc


@op("UniformFill", inputs=(0, 3), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args={**FILL_ARGS, "min": Arg("float", None, "lower bound (0.0)"),
          "max": Arg("float", None, "upper bound (1.0)")}, shape=_uniform_fill_shape("UniformFill", False),
    alloc=_uniform_alloc("UniformFill", False))
def uniform_fill(xp, *inputs, shape, extra_shape, input_as_shape, min, max, rng):
    """float32 samples of U[min, max]; with 3 inputs (shape, min, max) the bounds are 1-element tensors."""
    return _uniform(xp, inputs, (shape, extra_shape, input_as_shape), min, max, rng, False, "UniformFill")


@op("UniformIntFill", inputs=(0, 3), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args={**FILL_ARGS, "min": Arg("int", None, "lower bound (0)"),
          "max": Arg("int", None, "upper bound (1)")}, shape=_uniform_fill_shape("UniformIntFill", True),
    alloc=_uniform_alloc("UniformIntFill", True))
def uniform_int_fill(xp, *inputs, shape, extra_shape, input_as_shape, min, max, rng):
    """int32 samples uniform on the integers min..max, both included; 3-input form as UniformFill."""
    return _uniform(xp, inputs, (shape, extra_shape, input_as_shape), min, max, rng, True, "UniformIntFill")


def gaussian_shape(inputs, shape, extra_shape, input_as_shape, std, **_) -> tuple:
    if std < 0:
        raise ArgumentError(f"std {std} is negative; a standard deviation must be >= 0")
    return fill_shape(inputs, shape, extra_shape, input_as_shape)


def xavier_shape(inputs, shape, extra_shape, input_as_shape, **_) -> tuple:
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    if not out_shape:
        raise ShapeError("XavierFill needs at least 1 dim (fan_in = numel / shape[0]); got a scalar shape")
    return out_shape


def msra_shape(inputs, shape, extra_shape, input_as_shape, **_) -> tuple:
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    if len(out_shape) < 2:
        raise ShapeError(f"MSRAFill needs at least 2 dims (fan_out = numel / shape[1]), got shape "
                         f"{list(out_shape)}")
    return out_shape


@op("GaussianFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args={**FILL_ARGS, "mean": 0.0, "std": 1.0}, shape=float32_shape(gaussian_shape),
    alloc=float32_alloc(gaussian_shape))
def gaussian_fill(xp, *inputs, shape, extra_shape, input_as_shape, mean, std, rng):
    """float32 samples of N(mean, std^2)."""
    out_shape = gaussian_shape(inputs, shape, extra_shape, input_as_shape, std)
    return _random(xp, rng.normal(mean, abs(std), size=out_shape), np.float32)   # (abs: -0.0 as 0, which numpy refuses)


@op("XavierFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args=FILL_ARGS, shape=float32_shape(xavier_shape), alloc=float32_alloc(xavier_shape))
def xavier_fill(xp, *inputs, shape, extra_shape, input_as_shape, rng):
    """float32 samples of U[-s, s] with s = sqrt(3 / fan_in), fan_in = numel / shape[0]."""
    out_shape = xavier_shape(inputs, shape, extra_shape, input_as_shape)
    fan_in = math.prod(out_shape[1:])
    if fan_in == 0 or out_shape[0] == 0:
        return xp.zeros(out_shape, dtype=np.float32)
    scale = float(np.sqrt(np.float32(3) / np.float32(fan_in)))
    return _random(xp, rng.uniform(-scale, scale, size=out_shape), np.float32)


@op("MSRAFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args=FILL_ARGS, shape=float32_shape(msra_shape), alloc=float32_alloc(msra_shape))
def msra_fill(xp, *inputs, shape, extra_shape, input_as_shape, rng):
    """float32 samples of N(0, 2 / fan_out), fan_out = numel / shape[1] (std = sqrt(2 / fan_out))."""
    out_shape = msra_shape(inputs, shape, extra_shape, input_as_shape)
    fan_out = out_shape[0] * math.prod(out_shape[2:])
    if fan_out == 0 or out_shape[1] == 0:
        return xp.zeros(out_shape, dtype=np.float32)
    std = float(np.sqrt(np.float32(2) / np.float32(fan_out)))
    return _random(xp, rng.normal(0.0, std, size=out_shape), np.float32)
