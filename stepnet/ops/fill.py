"""Fill operators: tensors made from arguments (constants, literal values, ranges) or drawn at random.

Every filler shares Caffe2's shape rules (filler_op.h): with no input the shape is the `shape` argument
(empty = a scalar); with one input it is the input's shape, or with `input_as_shape` the input's values,
followed by `extra_shape`; `shape` and an input are mutually exclusive. Fillers fill on every run, as in
PyTorch-era Caffe2 (facebookarchive/caffe2's FillerOp filled only on an op's first run). Random fillers
draw on the host from the op's generator, then move the result to the op's device, so CPU and GPU agree.
"""
from __future__ import annotations

import math

import numpy as np

from .. import backend
from ..errors import ArgumentError, ArityError, DTypeError, ShapeError
from ..proto import NUMPY_OF, DataType
from .registry import NO_GRADIENT, Arg, op

FILL_ARGS = {"shape": Arg("ints", [], "output shape (no input)"),
             "extra_shape": Arg("ints", [], "dims appended to the input's shape"),
             "input_as_shape": Arg("bool", False, "the input is a 1-D tensor holding the shape")}

# Where each DataType reads a scalar/list argument from (Caffe2's typed argument reads).
_FLOAT_TYPES = {DataType.FLOAT, DataType.DOUBLE}
_INT_TYPES = {DataType.BOOL, DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64, DataType.UINT8,
              DataType.UINT16}
CONSTANT_TYPES = _FLOAT_TYPES | _INT_TYPES | {DataType.STRING}
GIVEN_TYPES = _FLOAT_TYPES | {DataType.BOOL, DataType.INT16, DataType.UINT16, DataType.INT32, DataType.INT64,
                              DataType.STRING}


def _type_name(dt: int) -> str:
    return DataType.Name(dt) if dt in DataType.values() else str(dt)


def _type_list(types) -> str:
    return ", ".join(f"{_type_name(t)}={t}" for t in sorted(types))


# --------------------------------------------------------------------------------------------- shapes
def _host_ints(x, what: str) -> list[int]:
    host = np.asarray(backend.to_host(x))
    if host.dtype.kind not in "iu":
        raise DTypeError(f"{what} must hold integers (int64), got {host.dtype}; cast it first")
    return [int(v) for v in host.reshape(-1)]


def _check_dims(dims, where: str) -> tuple[int, ...]:
    if any(d < 0 for d in dims):
        raise ArgumentError(f"{where} {list(dims)} has a negative dimension; every dim must be >= 0")
    return tuple(dims)


def fill_shape(inputs, shape, extra_shape, input_as_shape) -> tuple[int, ...]:
    """The output shape of a filler from its (0 or 1) shape input and arguments, by Caffe2's rules."""
    if inputs:
        if shape:
            raise ArgumentError(f"'shape' {list(shape)} and an input were both given; the output takes the "
                                "input's shape, so drop one of them")
        x = inputs[0]
        if input_as_shape:
            if getattr(x, "ndim", None) != 1:
                raise ShapeError(f"with input_as_shape=1 the input must be a 1-D tensor of dims, got shape "
                                 f"{tuple(getattr(x, 'shape', ()))}")
            dims = _host_ints(x, "the shape input (input_as_shape=1)")
            base = _check_dims(dims, "the shape input")
        else:
            base = tuple(x.shape)
        return base + _check_dims(extra_shape, "'extra_shape'")
    if extra_shape:
        raise ArgumentError(f"'extra_shape' {list(extra_shape)} needs an input whose shape it extends; give "
                            "the full shape in 'shape' instead")
    if input_as_shape:
        raise ArgumentError("input_as_shape=1 needs an input holding the shape")
    return _check_dims(shape, "'shape'")


# --------------------------------------------------------------------------------------------- values
def _check_lossless(values: np.ndarray, dt: int, what: str) -> None:
    if dt == DataType.BOOL:
        bad = values[(values != 0) & (values != 1)]
        if bad.size:
            raise ArgumentError(f"{what} {bad[0]} is not a boolean (0 or 1)")
        return
    info = np.iinfo(NUMPY_OF[dt])
    bad = values[(values < info.min) | (values > info.max)]
    if bad.size:
        raise ArgumentError(f"{what} {bad[0]} does not fit {_type_name(dt)} [{info.min}, {info.max}]")


def typed_values(values, dt: int, what: str) -> np.ndarray:
    """A 1-D numpy array of `values` (a Python list read from an Argument) as DataType dt.

    Like Caffe2, float types read field floats/f, integer and bool types ints/i, STRING strings/s;
    a value stored in another field is an error, and integers must convert losslessly.
    """
    values = list(values)
    if dt in _FLOAT_TYPES:
        if any(not isinstance(v, float) for v in values):
            raise ArgumentError(f"{what} must be stored as floats for {_type_name(dt)}, but the file stores "
                                f"{_field_of(values)}; write floats (e.g. 1.0, not 1)")
        return np.asarray(values, dtype=NUMPY_OF[dt])
    if dt in _INT_TYPES:
        if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            raise ArgumentError(f"{what} must be stored as integers for {_type_name(dt)}, but the file "
                                f"stores {_field_of(values)}; write integers")
        raw = np.asarray(values, dtype=np.int64)
        _check_lossless(raw, dt, what)
        return raw.astype(NUMPY_OF[dt])
    if dt == DataType.STRING:
        if any(not isinstance(v, (str, bytes)) for v in values):
            raise ArgumentError(f"{what} must be stored as strings for STRING, but the file stores "
                                f"{_field_of(values)}")
        out = np.empty(len(values), dtype=object)
        out[:] = [v.encode() if isinstance(v, str) else v for v in values]
        return out
    raise ArgumentError(f"data type {_type_name(dt)} cannot be filled")  # pragma: no cover - callers check


def _field_of(values) -> str:
    kinds = {"floats" if isinstance(v, float) else "strings" if isinstance(v, (str, bytes)) else "integers"
             for v in values}
    return " and ".join(sorted(kinds))


def _place(xp, host: np.ndarray):
    """A host result moved to the op's device (strings stay on the host, as Caffe2 keeps them on the CPU)."""
    return host if host.dtype == object else xp.asarray(host)


def _cast_dtype(dtype) -> int:
    """Caffe2's GetCastDataType: an enum number or a case-insensitive type name ("float", "INT64")."""
    if isinstance(dtype, str):
        try:
            return DataType.Value(dtype.upper())
        except ValueError:
            raise ArgumentError(f"'dtype' {dtype!r} is not a TensorProto data type; use one of "
                                f"{_type_list(GIVEN_TYPES)}") from None
    if isinstance(dtype, int):
        return dtype
    raise ArgumentError(f"'dtype' must be a data type number or name, got {dtype!r}")


# --------------------------------------------------------------------------------------------- ConstantFill
def constant_dtype(value, dtype) -> int:
    """ConstantFill's data type: `dtype` if given, else FLOAT for a float `value`, INT64 for an integer."""
    if dtype is None:
        if value is None or isinstance(value, float):
            return DataType.FLOAT
        if isinstance(value, int):
            return DataType.INT64
        raise ArgumentError(f"'value' {value!r} is neither a float nor an integer; without 'dtype' the type "
                            f"is taken from 'value', so give dtype (e.g. dtype={DataType.STRING} for STRING)")
    if dtype not in CONSTANT_TYPES:
        raise ArgumentError(f"'dtype' {_type_name(dtype)} cannot be filled by ConstantFill; use one of "
                            f"{_type_list(CONSTANT_TYPES)}")
    return dtype


@op("ConstantFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT,
    args={**FILL_ARGS, "value": Arg("any", None, "the fill value (0 / '' by default)"),
          "dtype": Arg("int", None, "TensorProto.DataType of the output")})
def constant_fill(xp, *inputs, shape, extra_shape, input_as_shape, value, dtype):
    """Y filled with `value`, of `dtype` (default: FLOAT, or INT64 when `value` is an integer argument)."""
    if isinstance(value, list):  # a name-only Argument: an empty list, not a single value
        raise ArgumentError("'value' has no value (an empty list); give a single number")
    dt = constant_dtype(value, dtype)
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    if value is None:
        value = "" if dt == DataType.STRING else (0.0 if dt in _FLOAT_TYPES else 0)
    v = typed_values([value], dt, "'value'")
    if dt == DataType.STRING:
        out = np.empty(out_shape, dtype=object)
        out[...] = v[0]
        return out
    return xp.full(out_shape, v[0], dtype=NUMPY_OF[dt])


# ------------------------------------------------------------------------------------- GivenTensor*Fill
def _shaped(xp, arr: np.ndarray, out_shape):
    need = math.prod(out_shape)
    if arr.size != need:
        raise ArgumentError(f"the output shape {list(out_shape)} needs {need} values but 'values' holds "
                            f"{arr.size}; make 'shape' and 'values' agree")
    return _place(xp, arr.reshape(out_shape))


def _given_fill(xp, inputs, shape, extra_shape, input_as_shape, values, dt, op_type):
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    return _shaped(xp, typed_values(values, dt, f"{op_type} 'values'"), out_shape)


@op("GivenTensorFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT,
    args={**FILL_ARGS, "values": Arg("any", [], "the elements, row-major"),
          "dtype": Arg("any", None, "data type (number or name); FLOAT by default")})
def given_tensor_fill(xp, *inputs, shape, extra_shape, input_as_shape, values, dtype):
    """A literal tensor from `values` (floats; `dtype` selects another type and the field it reads)."""
    dt = DataType.FLOAT if dtype is None else _cast_dtype(dtype)
    if dt not in GIVEN_TYPES:
        raise ArgumentError(f"'dtype' {_type_name(dt)} is not supported by GivenTensorFill; use one of "
                            f"{_type_list(GIVEN_TYPES)}")
    return _given_fill(xp, inputs, shape, extra_shape, input_as_shape, values, dt, "GivenTensorFill")


def _register_given(op_type: str, dt: int, kind: str) -> None:
    def kernel(xp, *inputs, shape, extra_shape, input_as_shape, values):
        return _given_fill(xp, inputs, shape, extra_shape, input_as_shape, values, dt, op_type)

    kernel.__name__ = kernel.__qualname__ = op_type
    op(op_type, inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT,
       args={**FILL_ARGS, "values": Arg(kind, [], "the elements, row-major")},
       doc=f"A literal {_type_name(dt)} tensor of `shape` from `values`.")(kernel)


for _type, _dt, _kind in (("GivenTensorIntFill", DataType.INT32, "ints"),
                          ("GivenTensorInt64Fill", DataType.INT64, "ints"),
                          ("GivenTensorInt16Fill", DataType.INT16, "ints"),
                          ("GivenTensorBoolFill", DataType.BOOL, "ints"),
                          ("GivenTensorDoubleFill", DataType.DOUBLE, "floats"),
                          ("GivenTensorStringFill", DataType.STRING, "strs")):
    _register_given(_type, _dt, _kind)


@op("GivenTensorByteStringToUInt8Fill", inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT,
    args={**FILL_ARGS, "values": Arg("strs", [], "one byte string"),
          "dtype": Arg("any", None, "STRING if given")})
def given_byte_string_fill(xp, *inputs, shape, extra_shape, input_as_shape, values, dtype):
    """A uint8 tensor of `shape` whose elements are the bytes of the single string in `values`."""
    if dtype is not None and _cast_dtype(dtype) != DataType.STRING:
        raise ArgumentError(f"'dtype' must be STRING ({DataType.STRING}) if given, got {dtype!r}")
    if len(values) != 1:
        raise ArgumentError(f"'values' must hold exactly one byte string, got {len(values)} strings")
    raw = values[0].encode() if isinstance(values[0], str) else values[0]
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    return _shaped(xp, np.frombuffer(raw, dtype=np.uint8).copy(), out_shape)


# --------------------------------------------------------------------------------------------- ranges
@op("RangeFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT, args=FILL_ARGS)
def range_fill(xp, *inputs, shape, extra_shape, input_as_shape):
    """Y[i] = i over the flattened float32 output (a debugging aid for reshapes)."""
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    return xp.arange(math.prod(out_shape), dtype=np.float32).reshape(out_shape)


@op("LengthsRangeFill", inputs=1, inplace=(), gradient=NO_GRADIENT)
def lengths_range_fill(xp, lengths):
    """Concatenated ranges 0..len-1 for each length: [4, 3, 1] -> [0 1 2 3 0 1 2 0] (int32)."""
    if lengths.ndim != 1:
        raise ShapeError(f"lengths must be a 1-D vector, got shape {tuple(lengths.shape)}")
    if lengths.dtype.kind not in "iu":
        raise DTypeError(f"lengths must be int32, got {lengths.dtype}")
    if lengths.size and bool((lengths < 0).any()):
        raise ArgumentError("lengths must be >= 0, got a negative length")
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    starts = xp.cumsum(lengths) - lengths
    return (xp.arange(total, dtype=np.int64) - xp.repeat(starts, lengths)).astype(np.int32)


# --------------------------------------------------------------------------------------------- random
def _random(xp, host: np.ndarray, dtype):
    return xp.asarray(host.astype(dtype, copy=False))


def _uniform_range(inputs, lo, hi, default_lo, default_hi, integer: bool, op_type: str):
    """(shape inputs, low, high, empty_first_dim) of UniformFill / UniformIntFill's 0, 1 or 3 inputs."""
    if len(inputs) == 2:
        raise ArityError(f"{op_type} takes 0, 1 or 3 inputs (shape source, min, max), got 2")
    if len(inputs) == 3:
        if lo is not None or hi is not None:
            raise ArgumentError("min/max were given both as arguments and as inputs; drop the arguments")
        bounds = []
        for name, t in (("min", inputs[1]), ("max", inputs[2])):
            if t.size != 1:
                raise ShapeError(f"the {name} input must hold one element, got shape {tuple(t.shape)}")
            if t.dtype.kind not in ("iu" if integer else "f"):
                want = "int32" if integer else "float32"
                raise DTypeError(f"the {name} input must be {want}, got {t.dtype}")
            v = backend.to_host(t).reshape(-1)[0]
            bounds.append(int(v) if integer else float(v))
        return inputs[:1], bounds[0], bounds[1], bounds[0] > bounds[1]
    lo = default_lo if lo is None else lo
    hi = default_hi if hi is None else hi
    if lo > hi:
        raise ArgumentError(f"min {lo} is larger than max {hi}; give min <= max")
    return inputs, lo, hi, False


def _uniform(xp, inputs, fill_args, lo, hi, rng, integer: bool, op_type: str):
    defaults = (0, 1) if integer else (0.0, 1.0)
    shape_inputs, lo, hi, empty = _uniform_range(inputs, lo, hi, *defaults, integer, op_type)
    out_shape = fill_shape(shape_inputs, *fill_args)
    if empty:  # min > max given as inputs: Caffe2 returns an output whose first dim is 0
        if not out_shape:
            raise ShapeError("min > max makes the first dim 0, but the output is a scalar")
        return xp.zeros((0,) + out_shape[1:], dtype=np.int32 if integer else np.float32)
    if integer:
        return _random(xp, rng.integers(lo, hi, size=out_shape, endpoint=True), np.int32)
    return _random(xp, rng.uniform(lo, hi, size=out_shape), np.float32)


@op("UniformFill", inputs=(0, 3), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args={**FILL_ARGS, "min": Arg("float", None, "lower bound (0.0)"),
          "max": Arg("float", None, "upper bound (1.0)")})
def uniform_fill(xp, *inputs, shape, extra_shape, input_as_shape, min, max, rng):
    """float32 samples of U[min, max]; with 3 inputs (shape, min, max) the bounds are 1-element tensors."""
    return _uniform(xp, inputs, (shape, extra_shape, input_as_shape), min, max, rng, False, "UniformFill")


@op("UniformIntFill", inputs=(0, 3), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args={**FILL_ARGS, "min": Arg("int", None, "lower bound (0)"),
          "max": Arg("int", None, "upper bound (1)")})
def uniform_int_fill(xp, *inputs, shape, extra_shape, input_as_shape, min, max, rng):
    """int32 samples uniform on the integers min..max, both included; 3-input form as UniformFill."""
    return _uniform(xp, inputs, (shape, extra_shape, input_as_shape), min, max, rng, True, "UniformIntFill")


@op("GaussianFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args={**FILL_ARGS, "mean": 0.0, "std": 1.0})
def gaussian_fill(xp, *inputs, shape, extra_shape, input_as_shape, mean, std, rng):
    """float32 samples of N(mean, std^2)."""
    if std < 0:
        raise ArgumentError(f"std {std} is negative; a standard deviation must be >= 0")
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    return _random(xp, rng.normal(mean, std, size=out_shape), np.float32)


@op("XavierFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args=FILL_ARGS)
def xavier_fill(xp, *inputs, shape, extra_shape, input_as_shape, rng):
    """float32 samples of U[-s, s] with s = sqrt(3 / fan_in), fan_in = numel / shape[0]."""
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    if not out_shape:
        raise ShapeError("XavierFill needs at least 1 dim (fan_in = numel / shape[0]); got a scalar shape")
    fan_in = math.prod(out_shape[1:])
    if fan_in == 0 or out_shape[0] == 0:
        return xp.zeros(out_shape, dtype=np.float32)
    scale = float(np.sqrt(np.float32(3) / np.float32(fan_in)))
    return _random(xp, rng.uniform(-scale, scale, size=out_shape), np.float32)


@op("MSRAFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", random=True, gradient=NO_GRADIENT,
    args=FILL_ARGS)
def msra_fill(xp, *inputs, shape, extra_shape, input_as_shape, rng):
    """float32 samples of N(0, 2 / fan_out), fan_out = numel / shape[1] (std = sqrt(2 / fan_out))."""
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    if len(out_shape) < 2:
        raise ShapeError(f"MSRAFill needs at least 2 dims (fan_out = numel / shape[1]), got shape "
                         f"{list(out_shape)}")
    fan_out = out_shape[0] * math.prod(out_shape[2:])
    if fan_out == 0 or out_shape[1] == 0:
        return xp.zeros(out_shape, dtype=np.float32)
    std = float(np.sqrt(np.float32(2) / np.float32(fan_out)))
    return _random(xp, rng.normal(0.0, std, size=out_shape), np.float32)
