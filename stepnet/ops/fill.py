"""Fill operators: tensors made from arguments (constants, literal values, ranges).

Every filler shares Caffe2's shape rules (filler_op.h): with no input the shape is the `shape` argument
(empty = a scalar); with one input it is the input's shape, or with `input_as_shape` the input's values,
followed by `extra_shape`; `shape` and an input are mutually exclusive. Fillers fill on every run, as in
PyTorch-era Caffe2 (facebookarchive/caffe2's FillerOp filled only on an op's first run). The random fillers
are in random_fill.py. Caffe2 registers every filler as NO_GRADIENT. Each declares `alloc` (what it will
allocate), so the executor refuses a fill over the blob limit before the kernel runs.
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..io.proto import NUMPY_OF, DataType
from ..core.spec import SMALL_VALUE, TensorSpec
from .base import check_dims, fold, out_spec, size_of, value_dependent
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
def host_ints(x, what: str) -> list[int] | None:
    """The integers held by an array, or by a TensorSpec (None when its values are not known statically)."""
    if x.dtype is not None and x.dtype.kind not in "iu":
        raise DTypeError(f"{what} must hold integers (int64), got {x.dtype}; cast it first")
    if isinstance(x, TensorSpec):
        return None if x.value is None else [int(v) for v in x.value.reshape(-1)]
    return [int(v) for v in np.asarray(backend.to_host(x)).reshape(-1)]


def fill_shape(inputs, shape, extra_shape, input_as_shape) -> tuple:
    """The output shape of a filler from its (0 or 1) shape input and arguments, by Caffe2's rules.

    The input may be an array or a TensorSpec; with input_as_shape and a TensorSpec whose values are not
    known statically, the dims it gives are None.
    """
    if inputs:
        if shape:
            raise ArgumentError(f"'shape' {list(shape)} and an input were both given; the output takes the "
                                "input's shape, so drop one of them")
        x = inputs[0]
        if input_as_shape:
            if len(x.shape) != 1:
                raise ShapeError(f"with input_as_shape=1 the input must be a 1-D tensor of dims, got shape "
                                 f"{tuple(x.shape)}")
            dims = host_ints(x, "the shape input (input_as_shape=1)")
            base = (None,) * x.shape[0] if dims is None else check_dims(dims, "the shape input")
        else:
            base = tuple(x.shape)
        return base + check_dims(extra_shape, "'extra_shape'")
    if extra_shape:
        raise ArgumentError(f"'extra_shape' {list(extra_shape)} needs an input whose shape it extends; give "
                            "the full shape in 'shape' instead")
    if input_as_shape:
        raise ArgumentError("input_as_shape=1 needs an input holding the shape")
    return check_dims(shape, "'shape'")


def _known(dims) -> bool:
    return all(d is not None for d in dims)


def fill_spec(dims, dtype, value=None) -> TensorSpec:
    """The output spec of a filler: exact when dims are known, keeping small integer values."""
    if not _known(dims):
        return value_dependent(dims, dtype)
    if value is not None and (value.size > SMALL_VALUE or value.dtype.kind not in "iub"):
        value = None
    return out_spec(dims, dtype, value)


def float32_shape(shape_of):
    """Shape function of a float32 filler whose shape is shape_of(inputs, **args)."""
    def shape(specs, **args):
        return [fill_spec(shape_of(specs, **args), np.float32)]
    return shape


def float32_alloc(shape_of):
    """The record's alloc of a float32 filler whose shape is shape_of(inputs, **args)."""
    def alloc(*inputs, **args):
        return [(0, shape_of(inputs, **args), np.float32)]
    return alloc


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
    if not isinstance(values, (list, tuple)):   # "any"-kind values stored in a single field: f, i, s, n or t
        kind = {float: "one float (field f)", int: "one integer (field i)", bytes: "one string (field s)",
                str: "one string (field s)"}.get(type(values), f"a {type(values).__name__} (field n or t)")
        raise ArgumentError(f"{what} must be a list (floats, ints or strings), but the file stores {kind}; write "
                            "the elements as a repeated field")
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


def constant_plan(inputs, shape, extra_shape, input_as_shape, value, dtype):
    """ConstantFill's checks (inputs: arrays or TensorSpecs): (DataType, output shape, the fill value)."""
    if isinstance(value, list):  # a name-only Argument: an empty list, not a single value
        raise ArgumentError("'value' has no value (an empty list); give a single number")
    dt = constant_dtype(value, dtype)
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    if value is None:
        value = "" if dt == DataType.STRING else (0.0 if dt in _FLOAT_TYPES else 0)
    return dt, out_shape, typed_values([value], dt, "'value'")[0]


def _constant_fill_shape(specs, **args):
    dt, out_shape, v = constant_plan(specs, **args)
    dtype = np.dtype(object) if dt == DataType.STRING else np.dtype(NUMPY_OF[dt])
    small = dt != DataType.STRING and _known(out_shape) and math.prod(out_shape) <= SMALL_VALUE
    return [fill_spec(out_shape, dtype, np.full(out_shape, v, dtype=dtype) if small else None)]


def _constant_alloc(*inputs, shape, extra_shape, input_as_shape, value, dtype):
    dt, out_shape, _ = constant_plan(inputs, shape, extra_shape, input_as_shape, value, dtype)
    return [(0, out_shape, NUMPY_OF[dt])]


@op("ConstantFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT,
    args={**FILL_ARGS, "value": Arg("any", None, "the fill value (0 / '' by default)"),
          "dtype": Arg("int", None, "TensorProto.DataType of the output")}, shape=_constant_fill_shape,
    alloc=_constant_alloc)
def constant_fill(xp, *inputs, shape, extra_shape, input_as_shape, value, dtype):
    """Y filled with `value`, of `dtype` (default: FLOAT, or INT64 when `value` is an integer argument)."""
    dt, out_shape, v = constant_plan(inputs, shape, extra_shape, input_as_shape, value, dtype)
    if dt == DataType.STRING:
        out = np.empty(out_shape, dtype=object)
        out[...] = v
        return out
    return xp.full(out_shape, v, dtype=NUMPY_OF[dt])


# ------------------------------------------------------------------------------------- GivenTensor*Fill
def _shaped(arr: np.ndarray, out_shape) -> np.ndarray | None:
    """arr reshaped to out_shape (None while out_shape has unknown dims); an ArgumentError if sizes differ."""
    if not _known(out_shape):
        return None
    need = math.prod(out_shape)
    if arr.size != need:
        raise ArgumentError(f"the output shape {list(out_shape)} needs {need} values but 'values' holds "
                            f"{arr.size}; make 'shape' and 'values' agree")
    return arr.reshape(out_shape)


def _given_dtype(dtype=None) -> int:
    dt = DataType.FLOAT if dtype is None else _cast_dtype(dtype)
    if dt not in GIVEN_TYPES:
        raise ArgumentError(f"'dtype' {_type_name(dt)} is not supported by GivenTensorFill; use one of "
                            f"{_type_list(GIVEN_TYPES)}")
    return dt


def _given_plan(op_type, dt_of):
    """plan(inputs, **args) -> (output shape, dtype, host tensor or None while the shape is not known) of a
    GivenTensor*Fill whose DataType is dt_of(**the dtype argument if any)."""
    def plan(inputs, shape, extra_shape, input_as_shape, values, **dtype):
        dt = dt_of(**dtype)
        out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
        host = _shaped(typed_values(values, dt, f"{op_type} 'values'"), out_shape)
        return out_shape, object if dt == DataType.STRING else NUMPY_OF[dt], host
    return plan


def _given_alloc(dt_of):
    """alloc of a GivenTensor*Fill: the output's shape and dtype, without converting its values."""
    def alloc(*inputs, shape, extra_shape, input_as_shape, values, **dtype):
        dt = dt_of(**dtype)  # the plan's order of checks
        return [(0, fill_shape(inputs, shape, extra_shape, input_as_shape), NUMPY_OF[dt])]
    return alloc


def _byte_string_plan(inputs, shape, extra_shape, input_as_shape, values, dtype):
    if dtype is not None and _cast_dtype(dtype) != DataType.STRING:
        raise ArgumentError(f"'dtype' must be STRING ({DataType.STRING}) if given, got {dtype!r}")
    if len(values) != 1:
        raise ArgumentError(f"'values' must hold exactly one byte string, got {len(values)} strings")
    raw = values[0].encode() if isinstance(values[0], str) else values[0]
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    return out_shape, np.uint8, _shaped(np.frombuffer(raw, dtype=np.uint8).copy(), out_shape)


def _register_literal(op_type: str, plan, args: dict, doc: str, alloc) -> None:
    """A fill whose whole tensor comes from its arguments: the kernel and the shape function share `plan`."""
    def kernel(xp, *inputs, **kwargs):
        return _place(xp, plan(inputs, **kwargs)[2])

    def shape_fn(specs, **kwargs):
        return [fill_spec(*plan(specs, **kwargs))]

    kernel.__name__ = kernel.__qualname__ = op_type
    op(op_type, inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT,
       args={**FILL_ARGS, **args}, shape=shape_fn, alloc=alloc, doc=doc)(kernel)


_register_literal("GivenTensorFill", _given_plan("GivenTensorFill", _given_dtype),
                  {"values": Arg("any", [], "the elements, row-major"),
                   "dtype": Arg("any", None, "data type (number or name); FLOAT by default")},
                  "A literal tensor from `values` (floats; `dtype` selects another type and the field it "
                  "reads).", _given_alloc(_given_dtype))
for _type, _dt, _kind in (("GivenTensorIntFill", DataType.INT32, "ints"),
                          ("GivenTensorInt64Fill", DataType.INT64, "ints"),
                          ("GivenTensorInt16Fill", DataType.INT16, "ints"),
                          ("GivenTensorBoolFill", DataType.BOOL, "ints"),
                          ("GivenTensorDoubleFill", DataType.DOUBLE, "floats"),
                          ("GivenTensorStringFill", DataType.STRING, "strs")):
    _register_literal(_type, _given_plan(_type, lambda _dt=_dt: _dt),
                      {"values": Arg(_kind, [], "the elements, row-major")},
                      f"A literal {_type_name(_dt)} tensor of `shape` from `values`.",
                      _given_alloc(lambda _dt=_dt: _dt))
_register_literal("GivenTensorByteStringToUInt8Fill", _byte_string_plan,
                  {"values": Arg("strs", [], "one byte string"),
                   "dtype": Arg("any", None, "STRING if given")},
                  "A uint8 tensor of `shape` holding the bytes of the single string in `values`.",
                  lambda *inputs, **args: [(0, _byte_string_plan(inputs, **args)[0], np.uint8)])


# --------------------------------------------------------------------------------------------- ranges
@op("RangeFill", inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT, args=FILL_ARGS,
    shape=float32_shape(fill_shape), alloc=float32_alloc(fill_shape))
def range_fill(xp, *inputs, shape, extra_shape, input_as_shape):
    """Y[i] = i over the flattened float32 output (a debugging aid for reshapes)."""
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    return xp.arange(math.prod(out_shape), dtype=np.float32).reshape(out_shape)


def _check_lengths(lengths) -> None:
    """LengthsRangeFill's checks on an array or a TensorSpec (the sign check when the values are known)."""
    if len(lengths.shape) != 1:
        raise ShapeError(f"lengths must be a 1-D vector, got shape {tuple(lengths.shape)}")
    if lengths.dtype is not None and lengths.dtype.kind not in "iu":
        raise DTypeError(f"lengths must be int32, got {lengths.dtype}")
    values = lengths.value if isinstance(lengths, TensorSpec) else lengths
    if values is not None and size_of(values) and bool((values < 0).any()):
        raise ArgumentError("lengths must be >= 0, got a negative length")


def _lengths_range_fill_shape(specs):
    """The output length is the sum of the lengths: known when their values are."""
    _check_lengths(specs[0])
    total = None if specs[0].value is None else int(specs[0].value.astype(np.int64).sum())
    value = fold(lengths_range_fill, specs) if total is not None and total <= SMALL_VALUE else None
    return [fill_spec((total,), np.int32, value)]


def _lengths_range_fill_alloc(lengths):
    _check_lengths(lengths)
    return [(0, (int(lengths.astype(np.int64).sum()),), np.int32)]


@op("LengthsRangeFill", inputs=1, inplace=(), gradient=NO_GRADIENT, shape=_lengths_range_fill_shape,
    alloc=_lengths_range_fill_alloc)
def lengths_range_fill(xp, lengths):
    """Concatenated ranges 0..len-1 for each length: [4, 3, 1] -> [0 1 2 3 0 1 2 0] (int32)."""
    _check_lengths(lengths)
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    starts = xp.cumsum(lengths) - lengths
    return (xp.arange(total, dtype=np.int64) - xp.repeat(starts, lengths)).astype(np.int32)
