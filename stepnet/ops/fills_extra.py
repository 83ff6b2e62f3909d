"""More fillers and growing tensors: DiagonalFill, Range, UniqueUniformFill, WeightedMultiSampling and
ExtendTensor (Caffe2's filler_op.h, utility_ops.h, weighted_multi_sampling_op.cc, extend_tensor_op.cc).

DiagonalFill and UniqueUniformFill take their shapes by fill.py's filler rules. DiagonalFill writes `value`
on the diagonal of a zero tensor of >= 2 dims (all dims equal past 2; a 2-D one steps cols + 1 elements, so a
tall matrix wraps as numpy's fill_diagonal(wrap=True) does). UniqueUniformFill draws distinct integers in
[min, max] that are not in its optional second input. Range is numpy's arange over 1-3 one-element inputs of
one type, sized by Caffe2's rule: (stop - start) / step truncated, plus one if that falls short of stop, so an
integer step < 0 that does not divide stop - start gives one element fewer than numpy (floats: the ceiling).
WeightedMultiSampling draws indices from a cumulative weight vector (lower bound of U[0, cdf[-1]) in the cdf).
ExtendTensor (in place) grows the first dimension of a tensor with zeros until its element count exceeds the
largest index given.

Caffe2 registers NO_GRADIENT for the fills and Range; it registers no gradient for ExtendTensor nor for
WeightedMultiSampling (its SHOULD_NOT_DO_GRADIENT names "WeightedMultiSample", no op).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..io.proto import NUMPY_OF, DataType
from ..core.spec import TensorSpec
from .base import host_ints, known_ints, on_device, out_spec, value_dependent
from .fill import FILL_ARGS, fill_shape, fill_spec, typed_values
from .registry import NO_GRADIENT, Arg, op

DIAGONAL_TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.BOOL, DataType.INT8, DataType.INT16, DataType.INT32,
                  DataType.INT64, DataType.UINT8, DataType.UINT16)


# --------------------------------------------------------------------------------------------- DiagonalFill
def _diagonal_plan(inputs, shape, extra_shape, input_as_shape, value, dtype):
    """(DataType, output shape, the value) of a DiagonalFill, after Caffe2's checks."""
    if dtype is None:
        dt = DataType.INT64 if isinstance(value, int) and not isinstance(value, bool) else DataType.FLOAT
        if value is not None and not isinstance(value, (int, float)):
            raise ArgumentError(f"DiagonalFill: 'value' {value!r} is neither a float nor an integer; give dtype")
    elif dtype not in DIAGONAL_TYPES:
        name = DataType.Name(dtype) if dtype in DataType.values() else "unknown"
        raise ArgumentError(f"DiagonalFill: 'dtype' {name} ({dtype}) is not one of "
                            f"{', '.join(f'{DataType.Name(t)}={t}' for t in DIAGONAL_TYPES)}")
    else:
        dt = dtype
    if value is None:
        value = 0.0 if dt in (DataType.FLOAT, DataType.DOUBLE) else 0
    v = typed_values([value], dt, "DiagonalFill 'value'")[0]
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    if len(out_shape) < 2:
        raise ShapeError(f"DiagonalFill: the output must have at least 2 dims, got shape {list(out_shape)}")
    if len(out_shape) > 2 and None not in out_shape and len(set(out_shape)) > 1:
        raise ShapeError(f"DiagonalFill: past 2 dims every dim must be equal, got shape {list(out_shape)}")
    return dt, out_shape, v


def _diagonal_shape(specs, **args):
    dt, out_shape, _ = _diagonal_plan(specs, **args)
    return [fill_spec(out_shape, NUMPY_OF[dt])]


def _diagonal_alloc(*inputs, **args):
    dt, out_shape, _ = _diagonal_plan(inputs, **args)
    return [(0, out_shape, NUMPY_OF[dt])]


@op("DiagonalFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT,
    args={**FILL_ARGS, "value": Arg("any", None, "the diagonal's value (0 by default)"),
          "dtype": Arg("int", None, "TensorProto.DataType (FLOAT, or INT64 for an integer value)")},
    shape=_diagonal_shape, alloc=_diagonal_alloc)
def diagonal_fill(xp, *inputs, shape, extra_shape, input_as_shape, value, dtype):
    """Zeros with `value` at every step-th element from the first (step: cols + 1 for 2 dims, else
    1 + n + n^2 + ... for dims all n): the diagonal."""
    dt, out_shape, v = _diagonal_plan(inputs, shape, extra_shape, input_as_shape, value, dtype)
    size = math.prod(out_shape)
    ndim = len(out_shape)
    step = out_shape[1] + 1 if ndim == 2 else 1 + sum(math.prod(out_shape[:i]) for i in range(1, ndim))
    out = np.zeros(size, dtype=NUMPY_OF[dt])
    out[::step] = v
    return xp.asarray(out.reshape(out_shape))


# --------------------------------------------------------------------------------------------- Range
RANGE_TYPES = ("int32", "int64", "float32", "float64")


def _range_checks(bounds) -> None:
    dtype = bounds[0].dtype
    for i, t in enumerate(bounds):
        if t.dtype is not None and t.dtype.name not in RANGE_TYPES:
            raise DTypeError(f"Range: input {i} must be int32, int64, float32 or float64, got {t.dtype}")
        if t.dtype is not None and dtype is not None and t.dtype != dtype:
            raise DTypeError(f"Range: input {i} is {t.dtype} but input 0 is {dtype}; the inputs must share one type")
        if math.prod(t.shape) != 1:
            raise ShapeError(f"Range: input {i} must hold one element (a scalar), got shape {tuple(t.shape)}")


def _range_length(values, integer: bool) -> tuple:
    """(start, step, length) from [stop], [start, stop] or [start, stop, step] (numpy scalars of the inputs'
    type, or Python ints), sized as Caffe2 does: truncating division for integers, ceil for floats."""
    zero, one = type(values[0])(0), type(values[0])(1)     # (start and step in the inputs' type)
    start, stop, step = ((zero, values[0], one) if len(values) == 1 else
                         (values[0], values[1], one) if len(values) == 2 else tuple(values))
    if step == 0:
        raise ArgumentError("Range: Step size cannot be 0.")
    diff = stop - start
    if integer:
        diff, step_ = int(diff), int(step)
        length = abs(diff) // abs(step_) * (1 if (diff >= 0) == (step_ > 0) else -1)   # C++'s division
        length += 1 if length * step_ < diff else 0
    else:
        with np.errstate(all="ignore"):
            ratio = diff / step
        if not np.isfinite(ratio):
            raise ArgumentError(f"Range: start {start}, stop {stop} and step {step} give no finite length")
        length = math.ceil(ratio)
    return start, step, max(int(length), 0)


def _range_shape(specs):
    _range_checks(specs)
    values = [known_ints(s, "Range input") if s.dtype is not None and s.dtype.kind in "iu" else None for s in specs]
    if any(v is None for v in values):
        return [value_dependent((None,), specs[0].dtype)]
    _, _, length = _range_length([v[0] for v in values], True)
    return [out_spec((length,), specs[0].dtype)]


@op("Range", inputs=(1, 3), outputs=1, inplace=(), shape=_range_shape, grows="values",
    gradient=NO_GRADIENT)
def range_(xp, *bounds):
    """start, start + step, ... up to stop (excluded), from inputs (stop), (start, stop) or (start, stop,
    step), each one element of int32, int64, float32 or float64; the output has their type."""
    _range_checks(bounds)
    dtype = bounds[0].dtype
    integer = dtype.kind in "iu"
    values = [np.asarray(backend.to_host(t)).reshape(-1)[0] for t in bounds]
    values = [int(v) for v in values] if integer else values
    start, step, length = _range_length(values, integer)
    with np.errstate(over="ignore"):
        host = np.arange(length, dtype=dtype) * dtype.type(step) + dtype.type(start)
    return on_device(xp, host, dtype)


# --------------------------------------------------------------------------------------------- UniqueUniformFill
UNIQUE_TYPES = {DataType.INT32: np.int32, DataType.INT64: np.int64}


def _unique_plan(inputs, shape, extra_shape, input_as_shape, min, max, dtype):  # noqa: A002 - Caffe2's names
    """(output shape, numpy dtype) of a UniqueUniformFill, after Caffe2's checks of its arguments."""
    if dtype not in UNIQUE_TYPES:
        raise ArgumentError(f"UniqueUniformFill: 'dtype' must be INT32 ({DataType.INT32}) or INT64 "
                            f"({DataType.INT64}), got {dtype}")
    np_dtype = UNIQUE_TYPES[dtype]
    if min is None or max is None:
        raise ArgumentError("UniqueUniformFill needs both 'min' and 'max' (integer arguments)")
    info = np.iinfo(np_dtype)
    if not info.min <= min < max <= info.max:
        raise ArgumentError(f"UniqueUniformFill: needs min < max within {np.dtype(np_dtype).name}, got min {min} "
                            f"and max {max}")
    if len(inputs) > 1 and inputs[1].dtype is not None and inputs[1].dtype != np_dtype:
        raise DTypeError(f"UniqueUniformFill: the avoid input must be {np.dtype(np_dtype).name} (the 'dtype'), "
                         f"got {inputs[1].dtype}")
    out_shape = fill_shape(inputs[:1], shape, extra_shape, input_as_shape)
    avoid = _values(inputs[1]) if len(inputs) > 1 else np.empty(0, np.int64)
    if avoid is not None and np.unique(avoid).size != avoid.size:
        raise ArgumentError("UniqueUniformFill: the avoid input holds repeated values; they must be distinct")
    n, m = math.prod(d or 0 for d in out_shape), math.prod(inputs[1].shape) if len(inputs) > 1 else 0
    if None not in out_shape and n > max - min + 1 - m:
        raise ArgumentError(f"UniqueUniformFill: cannot draw {n} distinct values from {min}..{max} while avoiding "
                            f"{m}")
    return out_shape, np_dtype


def _values(t) -> np.ndarray | None:
    """The elements of an array (on any device) or of a TensorSpec (None when not known statically)."""
    if isinstance(t, TensorSpec):
        return None if t.value is None else np.asarray(t.value).reshape(-1)
    return np.asarray(backend.to_host(t)).reshape(-1)


def _unique_shape(specs, rng=None, **args):
    out_shape, np_dtype = _unique_plan(specs, **args)
    return [fill_spec(out_shape, np_dtype)]


def _unique_alloc(*inputs, rng=None, **args):
    out_shape, np_dtype = _unique_plan(inputs, **args)
    return [(0, out_shape, np_dtype)]


def _draw_unique(rng, n: int, lo: int, hi: int, avoid: np.ndarray) -> np.ndarray:
    """n distinct integers uniform on lo..hi outside `avoid`: from the list of candidates when the range is
    small, else by drawing again whatever repeats or is avoided."""
    span = hi - lo + 1
    if span <= max(4 * (n + avoid.size), 1 << 16):
        return rng.choice(np.setdiff1d(np.arange(lo, hi + 1, dtype=np.int64), avoid), size=n, replace=False)
    got = np.empty(0, dtype=np.int64)
    while got.size < n:
        draw = rng.integers(lo, hi, size=2 * (n - got.size) + 16, endpoint=True, dtype=np.int64)
        both = np.concatenate([got, draw[~np.isin(draw, avoid)]])
        got = both[np.sort(np.unique(both, return_index=True)[1])][:n]
    return got


@op("UniqueUniformFill", inputs=(0, 2), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args={**FILL_ARGS, "min": Arg("int", None, "lower bound, included"), "max": Arg("int", None, "upper bound, "
          "included"), "dtype": Arg("int", DataType.INT32, "INT32 or INT64")},
    shape=_unique_shape, alloc=_unique_alloc)
def unique_uniform_fill(xp, *inputs, shape, extra_shape, input_as_shape, min, max, dtype, rng):  # noqa: A002
    """Distinct integers drawn uniformly from min..max, none of them in the second input (whose elements must
    be distinct too); int32 or int64 (`dtype`)."""
    out_shape, np_dtype = _unique_plan(inputs, shape, extra_shape, input_as_shape, min, max, dtype)
    avoid = _values(inputs[1]).astype(np.int64) if len(inputs) > 1 else np.empty(0, np.int64)
    n = math.prod(out_shape)
    return on_device(xp, _draw_unique(rng, n, min, max, avoid).reshape(out_shape), np_dtype)


# --------------------------------------------------------------------------------------------- sampling
def _sampling_plan(weights, shape_input, num_samples) -> tuple:
    if weights.dtype is not None and weights.dtype != np.float32:
        raise DTypeError(f"WeightedMultiSampling: sampling_cdf must be float32, got {weights.dtype}")
    if len(weights.shape) != 1:
        raise ShapeError(f"WeightedMultiSampling: sampling_cdf must be a 1-D vector, got shape "
                         f"{tuple(weights.shape)}")
    if shape_input is not None and num_samples is not None:
        raise ArgumentError("WeightedMultiSampling: the output shape comes from input 1; do not also pass "
                            "num_samples")
    if shape_input is None and (num_samples or 0) < 0:
        raise ArgumentError(f"WeightedMultiSampling: num_samples must be >= 0, got {num_samples}")
    if weights.shape[0] == 0:
        return (0,)
    return tuple(shape_input.shape) if shape_input is not None else (num_samples or 0,)


def _sampling_shape(specs, *, num_samples, rng=None):
    return [out_spec(_sampling_plan(specs[0], specs[1] if len(specs) > 1 else None, num_samples), np.int32)]


@op("WeightedMultiSampling", inputs=(1, 2), outputs=1, inplace=(), random=True, shape=_sampling_shape,
    grows="shapes", args={"num_samples": Arg("int", None, "the number of samples (0 when absent)")})
def weighted_multi_sampling(xp, weights, *shape_input, num_samples, rng):
    """int32 indices into the cumulative weights sampling_cdf: each the first i with cdf[i] >= r for r
    uniform on [0, cdf[-1]); shaped like input 1, else num_samples of them (none for an empty cdf)."""
    out_shape = _sampling_plan(weights, shape_input[0] if shape_input else None, num_samples)
    cdf = np.asarray(backend.to_host(weights))
    n = math.prod(out_shape)
    if cdf.size == 0 or n == 0:
        return xp.zeros(out_shape, dtype=np.int32)
    if not np.isfinite(cdf[-1]) or cdf[-1] < 0:
        raise ArgumentError(f"WeightedMultiSampling: the last cumulative weight must be finite and >= 0, got "
                            f"{cdf[-1]}")
    r = (rng.uniform(0.0, 1.0, size=n) * float(cdf[-1])).astype(np.float32)
    picks = np.searchsorted(cdf, r, side="left")
    if (picks >= cdf.size).any():
        raise ArgumentError("WeightedMultiSampling: a draw falls past the end of sampling_cdf; the cumulative "
                            "weights must be non-decreasing")
    return on_device(xp, picks.reshape(out_shape), np.int32)


# --------------------------------------------------------------------------------------------- ExtendTensor
def _extend_checks(tensor, indices) -> None:
    if indices.dtype is not None and indices.dtype != np.int32:
        raise DTypeError(f"ExtendTensor: new_indices must be int32, got {indices.dtype}")
    if len(indices.shape) < 1:
        raise ShapeError("ExtendTensor: new_indices must be at least 1-D, got a 0-D tensor")
    if len(tensor.shape) != len(indices.shape):
        raise ShapeError(f"ExtendTensor: the tensor {tuple(tensor.shape)} and new_indices "
                         f"{tuple(indices.shape)} must have the same number of dims")


def _extended(shape, top) -> tuple:
    """The tensor's shape after extending it to hold index `top` (None: unknown)."""
    grow = max(0, top + 1 - math.prod(shape)) if top is not None else None
    return (None if grow is None else shape[0] + grow, *shape[1:])


def _extend_shape(specs, *, growthPct):  # noqa: N803 - Caffe2's name
    tensor, indices = specs
    _extend_checks(tensor, indices)
    values = known_ints(indices, "ExtendTensor: new_indices")
    top = None if values is None else (max(values) if values else -1)
    return [value_dependent(_extended(tuple(tensor.shape), top), tensor.dtype)]


@op("ExtendTensor", inputs=2, outputs=1, inplace=(), enforce_inplace=[(0, 0)], shape=_extend_shape,
    grows="values", args={"growthPct": Arg("int", 40, "Caffe2's capacity growth; the values do not depend on it")})
def extend_tensor(xp, tensor, indices, *, growthPct):  # noqa: N803
    """The tensor with zero rows appended to its first dimension, as many as its element count falls short
    of max(new_indices) + 1 (Caffe2 compares the whole element count, then grows dim 0 by the difference)."""
    _extend_checks(tensor, indices)
    values = host_ints(indices, "ExtendTensor: new_indices")
    new_shape = _extended(tuple(tensor.shape), max(values) if values else -1)
    if new_shape[0] == tensor.shape[0]:
        return tensor
    mod = np if tensor.dtype == object else xp
    extra = np.full((new_shape[0] - tensor.shape[0], *new_shape[1:]), b"", dtype=object) \
        if tensor.dtype == object else xp.zeros((new_shape[0] - tensor.shape[0], *new_shape[1:]), dtype=tensor.dtype)
    return mod.concatenate([tensor, extra])
