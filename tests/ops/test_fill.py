"""Fill operators: literal and constant fills against hand-built references, Caffe2's shape rules, and bad
arguments. The random fills are tested in test_random_fill.py."""
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from stepnet import NetDef, Workspace, load
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, infer_static, make_op, run_op

FLOAT, INT32, STRING, BOOL, UINT8, INT8 = 1, 2, 4, 5, 6, 7
UINT16, INT16, INT64, FLOAT16, DOUBLE = 8, 9, 10, 12, 13


def repeat(value, shape):
    """The flat row-major list of a tensor of `shape` holding `value` everywhere, by loops."""
    return [value for _ in itertools.product(*(range(d) for d in shape))]


def flat_index(shape):
    """[0, 1, 2, ...] built from the multi-index, the definition of row-major order."""
    out = []
    for idx in itertools.product(*(range(d) for d in shape)):
        k = 0
        for i, d in zip(idx, shape, strict=True):
            k = k * d + i
        out.append(k)
    return out


def lengths_ranges(lengths):
    out = []
    for n in lengths:
        out.extend(range(n))
    return out


# (id, op type, inputs, args, expected shape, expected dtype, expected flat values)
CASES = [
    ("const-float", "ConstantFill", [], {"shape": [2, 3], "value": 2.5}, (2, 3), np.float32,
     repeat(2.5, (2, 3))),
    ("const-default", "ConstantFill", [], {"shape": [4]}, (4,), np.float32, repeat(0.0, (4,))),
    ("const-scalar", "ConstantFill", [], {"value": 1.5}, (), np.float32, [1.5]),
    ("const-empty-dim", "ConstantFill", [], {"shape": [0, 4], "value": 1.0}, (0, 4), np.float32, []),
    ("const-int-value-int64", "ConstantFill", [], {"shape": [3], "value": 7}, (3,), np.int64, [7, 7, 7]),
    ("const-int32", "ConstantFill", [], {"shape": [2, 2], "value": -3, "dtype": INT32}, (2, 2), np.int32,
     repeat(-3, (2, 2))),
    ("const-int32-default", "ConstantFill", [], {"shape": [2], "dtype": INT32}, (2,), np.int32, [0, 0]),
    ("const-bool", "ConstantFill", [], {"shape": [3], "value": 1, "dtype": BOOL}, (3,), np.bool_, [True] * 3),
    ("const-double", "ConstantFill", [], {"shape": [2], "value": 0.25, "dtype": DOUBLE}, (2,), np.float64,
     [0.25, 0.25]),
    ("const-int8", "ConstantFill", [], {"shape": [2], "value": -128, "dtype": INT8}, (2,), np.int8,
     [-128] * 2),
    ("const-uint8", "ConstantFill", [], {"shape": [2], "value": 255, "dtype": UINT8}, (2,), np.uint8,
     [255] * 2),
    ("const-int16", "ConstantFill", [], {"shape": [1], "value": -300, "dtype": INT16}, (1,), np.int16,
     [-300]),
    ("const-uint16", "ConstantFill", [], {"shape": [1], "value": 65535, "dtype": UINT16}, (1,), np.uint16,
     [65535]),
    ("const-like-input", "ConstantFill", [np.zeros((2, 2), np.int32)], {"value": 4.0, "extra_shape": [3]},
     (2, 2, 3), np.float32, repeat(4.0, (2, 2, 3))),
    ("const-input-as-shape", "ConstantFill", [np.array([3, 1, 2], np.int64)],
     {"input_as_shape": 1, "value": 1.0}, (3, 1, 2), np.float32, repeat(1.0, (3, 1, 2))),
    ("const-input-as-shape-extra", "ConstantFill", [np.array([2], np.int64)],
     {"input_as_shape": 1, "extra_shape": [2], "value": 3, "dtype": INT64}, (2, 2), np.int64, [3] * 4),
    ("given-float", "GivenTensorFill", [], {"shape": [2, 3], "values": [0.5, 1.0, 1.5, 2.0, -1.0, 8.0]},
     (2, 3), np.float32, [0.5, 1.0, 1.5, 2.0, -1.0, 8.0]),
    ("given-scalar", "GivenTensorFill", [], {"values": [3.0]}, (), np.float32, [3.0]),
    ("given-like-input", "GivenTensorFill", [np.zeros((2, 2), np.float32)], {"values": [1.0, 2.0, 3.0, 4.0]},
     (2, 2), np.float32, [1.0, 2.0, 3.0, 4.0]),
    ("given-dtype-int", "GivenTensorFill", [], {"shape": [3], "values": [1, -2, 3], "dtype": INT32}, (3,),
     np.int32, [1, -2, 3]),
    ("given-dtype-name", "GivenTensorFill", [], {"shape": [2], "values": [0.5, 0.25], "dtype": "double"},
     (2,), np.float64, [0.5, 0.25]),
    ("given-dtype-int64-name", "GivenTensorFill", [], {"shape": [1], "values": [2**40], "dtype": "INT64"},
     (1,), np.int64, [2**40]),
    ("given-int", "GivenTensorIntFill", [], {"shape": [2, 2], "values": [1, 2, 3, -4]}, (2, 2), np.int32,
     [1, 2, 3, -4]),
    ("given-int64", "GivenTensorInt64Fill", [], {"shape": [2], "values": [2**40, -1]}, (2,), np.int64,
     [2**40, -1]),
    ("given-bool", "GivenTensorBoolFill", [], {"shape": [3], "values": [1, 0, 1]}, (3,), np.bool_,
     [True, False, True]),
    # Argument.floats is a 32-bit field, so a double fill holds the float32 rounding of its values
    ("given-double", "GivenTensorDoubleFill", [], {"shape": [2], "values": [0.1, 0.2]}, (2,), np.float64,
     [float(np.float32(0.1)), float(np.float32(0.2))]),
    ("given-int16", "GivenTensorInt16Fill", [], {"shape": [2], "values": [-32768, 7]}, (2,), np.int16,
     [-32768, 7]),
    ("given-bytes", "GivenTensorByteStringToUInt8Fill", [], {"shape": [2, 2], "values": [b"\x80\x81\x02A"]},
     (2, 2), np.uint8, [0x80, 0x81, 2, 65]),
    ("given-empty", "GivenTensorFill", [], {"shape": [0], "values": []}, (0,), np.float32, []),
    ("range", "RangeFill", [], {"shape": [2, 3]}, (2, 3), np.float32, flat_index((2, 3))),
    ("range-like", "RangeFill", [np.zeros((3, 2, 2))], {}, (3, 2, 2), np.float32, flat_index((3, 2, 2))),
    ("lengths-range", "LengthsRangeFill", [np.array([4, 3, 1], np.int32)], {}, (8,), np.int32,
     lengths_ranges([4, 3, 1])),
    ("lengths-range-zeros", "LengthsRangeFill", [np.array([0, 2, 0], np.int32)], {}, (2,), np.int32, [0, 1]),
    ("lengths-range-empty", "LengthsRangeFill", [np.zeros(0, np.int32)], {}, (0,), np.int32, []),
]


def check_case(case, device):
    _, op_type, inputs, args, shape, dtype, flat = case
    got = run_op(op_type, inputs, 1, device=device, **args)
    assert got.shape == shape, f"{op_type}: shape {got.shape} != {shape}"
    assert got.dtype == np.dtype(dtype), f"{op_type}: dtype {got.dtype} != {np.dtype(dtype)}"
    assert got.reshape(-1).tolist() == [np.dtype(dtype).type(v).item() for v in flat], f"{op_type}: values"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_deterministic_fills(case, device):
    check_case(case, device)


def test_string_fills():
    got = run_op("ConstantFill", [], 1, shape=[2], value="ab", dtype=STRING)
    assert got.dtype == object and got.tolist() == [b"ab", b"ab"]
    got = run_op("GivenTensorStringFill", [], 1, shape=[3], values=["a", "bc", ""])
    assert got.shape == (3,) and got.tolist() == [b"a", b"bc", b""]


def test_string_fill_stays_on_host_on_gpu():
    ws = Workspace(gpu="emulate")
    ws.run_operator_once(make_op("GivenTensorStringFill", [], ["s"], device="emulated", shape=[1],
                                 values=["x"]))
    value = ws.get_blob("s").value
    assert type(value) is np.ndarray and value.tolist() == [b"x"]


def test_fill_every_run_and_in_place():
    """A filler writes its output on every run; in place it replaces the shape-giving input."""
    ws = Workspace()
    ws.feed("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    nd = NetDef(name="n")
    nd.op.extend([make_op("ConstantFill", ["x"], ["x"], value=5.0)])
    ws.create_net(nd)
    ws.run_net("n")
    assert ws.fetch("x").tolist() == [[5.0] * 3] * 2
    ws.feed("x", np.zeros((1, 2), np.float32))
    ws.run_net("n")
    assert ws.fetch("x").tolist() == [[5.0, 5.0]]


# --------------------------------------------------------------------------------------------- bad input
BAD = [
    ("ConstantFill", [np.zeros(2)], {"shape": [2]}, ArgumentError, "'shape'.*and an input were both given"),
    ("ConstantFill", [], {"extra_shape": [2]}, ArgumentError, "extra_shape.*needs an input"),
    ("ConstantFill", [], {"input_as_shape": 1}, ArgumentError, "input_as_shape=1 needs an input"),
    ("ConstantFill", [], {"shape": 3}, ArgumentError,
     "'shape' must be a list of integers.*stores an integer"),
    ("ConstantFill", [], {"shape": [2, -1]}, ArgumentError, "negative dimension"),
    ("ConstantFill", [], {"shape": [1], "dtype": FLOAT16}, ArgumentError, "FLOAT16 cannot be filled"),
    ("ConstantFill", [], {"shape": [1], "dtype": 0}, ArgumentError, "UNDEFINED cannot be filled"),
    ("ConstantFill", [], {"shape": [1], "value": "s"}, ArgumentError, "neither a float nor an integer"),
    ("ConstantFill", [], {"shape": [1], "value": 1, "dtype": FLOAT}, ArgumentError,
     "must be stored as floats for FLOAT.*integers"),
    ("ConstantFill", [], {"shape": [1], "value": 1.0, "dtype": INT32}, ArgumentError,
     "must be stored as integers for INT32"),
    ("ConstantFill", [], {"shape": [1], "value": 300, "dtype": INT8}, ArgumentError, "300 does not fit INT8"),
    ("ConstantFill", [], {"shape": [1], "value": 2, "dtype": BOOL}, ArgumentError, "2 is not a boolean"),
    ("ConstantFill", [np.zeros((2, 2), np.int64)], {"input_as_shape": 1}, ShapeError, "1-D tensor of dims"),
    ("ConstantFill", [np.array([2.0, 3.0])], {"input_as_shape": 1}, DTypeError, "must hold integers"),
    ("ConstantFill", [np.array([2, -3])], {"input_as_shape": 1}, ArgumentError, "negative dimension"),
    ("GivenTensorFill", [], {"shape": [2, 3], "values": [1.0] * 5}, ArgumentError,
     r"shape \[2, 3\] needs 6 values but 'values' holds 5"),
    ("GivenTensorFill", [], {"shape": [2], "values": [1, 2]}, ArgumentError, "must be stored as floats"),
    ("GivenTensorFill", [], {"shape": [1], "values": [1.0], "dtype": "complex"}, ArgumentError,
     "'complex' is not a TensorProto data type"),
    ("GivenTensorFill", [], {"shape": [1], "values": [1.0], "dtype": FLOAT16}, ArgumentError,
     "FLOAT16 is not supported by GivenTensorFill"),
    ("GivenTensorIntFill", [], {"shape": [1], "values": [1.5]}, ArgumentError,
     "'values' must be a list of integers"),
    ("GivenTensorIntFill", [], {"shape": [1], "values": [2**31]}, ArgumentError, "does not fit INT32"),
    ("GivenTensorBoolFill", [], {"shape": [1], "values": [3]}, ArgumentError, "3 is not a boolean"),
    ("GivenTensorInt16Fill", [], {"shape": [1], "values": [40000]}, ArgumentError, "does not fit INT16"),
    ("GivenTensorByteStringToUInt8Fill", [], {"shape": [2], "values": ["a", "b"]}, ArgumentError,
     "exactly one byte string, got 2"),
    ("GivenTensorByteStringToUInt8Fill", [], {"shape": [3], "values": ["ab"]}, ArgumentError,
     r"shape \[3\] needs 3 values but 'values' holds 2"),
    ("GivenTensorByteStringToUInt8Fill", [], {"shape": [1], "values": ["a"], "dtype": FLOAT}, ArgumentError,
     "must be STRING"),
    ("GivenTensorFill", [], {"shape": [1], "values": 1.5}, ArgumentError,
     r"GivenTensorFill 'values' must be a list \(floats, ints or strings\), but the file stores one float \(field f\)"),
    ("GivenTensorFill", [], {"shape": [2], "values": "ab", "dtype": 2}, ArgumentError,
     r"must be a list .* but the file stores one string \(field s\)"),
    ("GivenTensorFill", [], {"shape": [1], "values": NetDef(name="n")}, ArgumentError,
     r"must be a list .* but the file stores a NetDef \(field n or t\)"),
    ("GivenTensorInt16Fill", [], {"shape": [1, 3, 2**62, 0], "values": []}, ArgumentError,
     r"'shape' \[1, 3, 4611686018427387904, 0\]: its nonzero dims multiply to more than 576460752303423487"),
    ("ConstantFill", [], {"shape": [2**62, 4, 0]}, ArgumentError, "nonzero dims multiply to more than"),
    ("LengthsRangeFill", [np.ones((2, 2), np.int32)], {}, ShapeError, "1-D vector"),
    ("LengthsRangeFill", [np.ones(2, np.float32)], {}, DTypeError, "int32"),
    ("LengthsRangeFill", [np.array([2, -1], np.int32)], {}, ArgumentError, "negative length"),
]


@pytest.mark.parametrize("op_type,inputs,args,error,match", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(op_type, inputs, args, error, match):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, 1, **args)


@pytest.mark.parametrize("op_type,inputs,args,error,match", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_caught_statically(op_type, inputs, args, error, match):
    """Every bad input is refused by the shape function too, with the kernel's error, before anything runs."""
    with pytest.raises(error, match=match):
        infer_static(op_type, inputs, **args)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_static_specs_and_values(case):
    """The inferred spec of every deterministic fill; small integer results carry their values statically."""
    _, op_type, inputs, args, shape, dtype, values = case
    (got,) = infer_static(op_type, inputs, **args)
    assert got.shape == shape and got.dtype == np.dtype(dtype)
    if got.value is not None:
        assert got.value.reshape(-1).tolist() == list(values)
    small_int = np.dtype(dtype).kind in "iub" and math.prod(shape) <= 64
    assert (got.value is not None) == small_int


def test_static_value_dependent_shapes():
    """Dims that depend on values the specs do not carry stay unknown; known values give exact shapes."""
    big = np.ones(100, np.int32)  # too long to carry its values: LengthsRangeFill's length is unknown
    (spec,) = infer_static("LengthsRangeFill", [big])
    assert spec.shape is None and spec.dtype == np.int32
    (spec,) = infer_static("ConstantFill", [np.array([3, 4], np.int64)], input_as_shape=1, extra_shape=[2])
    assert spec.shape == (3, 4, 2) and spec.dtype == np.float32


def test_in_place_rules():
    ws = Workspace()
    ws.feed("len", np.array([2], np.int32))
    with pytest.raises(ArgumentError, match="cannot write output 0 in place"):
        ws.run_operator_once(make_op("LengthsRangeFill", ["len"], ["len"]))


# --------------------------------------------------------------------------------------------- the testers
def test_checkers_detect_broken_kernels(broken):
    check_case(CASES[0], "cpu")
    schema = REGISTRY.get("ConstantFill")
    broken("ConstantFill", lambda xp, *ins, **kw: schema.kernel(xp, *ins, **kw) + 1)
    with pytest.raises(AssertionError, match="values"):
        check_case(CASES[0], "cpu")


# --------------------------------------------------------------------------------------------- real files
GLOW = Path(__file__).resolve().parents[1] / "data" / "glow"


def run_glow(predict, init=None, **feeds):
    """Run Glow's Caffe2 test nets (third-party files, see tests/data/SOURCES.md) after feeding `feeds`."""
    ws = Workspace(seed=0)
    for name, value in feeds.items():
        ws.feed(name, value)
    for name in (init, predict):
        if name:
            ws.run_net_once(load(GLOW / f"{name}.pbtxt", "net"))
    return ws


def test_glow_fill_nets():
    y = run_glow("constant_fill_use_provided_shape").fetch("result")
    assert y.shape == (7, 11, 13, 17) and y.dtype == np.float32 and np.all(y == 3.0)
    y = run_glow("constant_fill_input_as_shape", "constant_fill_input_as_shape_init").fetch("result")
    assert y.shape == (17, 23, 29, 31) and np.all(y == 3.0)
    y = run_glow("constant_fill_use_input_shape", inputs_0=np.zeros((2, 5), np.float32)).fetch("result")
    assert y.shape == (2, 5) and np.all(y == 3.0)
    y = run_glow("gaussian_fill_input_as_shape", "gaussian_fill_input_as_shape_init").fetch("result")
    assert y.shape == (4, 5, 6, 7) and y.dtype == np.float32
    y = run_glow("gaussian_fill_use_input_shape_with_extra_shape", inputs_0=np.zeros((2, 2))).fetch("result")
    assert y.shape == (2, 2, 2, 3)
    y = run_glow("uniform_fill_input_as_shape", inputs_0=np.array([30, 40], np.int64)).fetch("result")
    assert y.shape == (30, 40) and y.min() >= 0.0 and y.max() <= 10.0 and y.std() > 1.0
    ws = run_glow(None, "fill_test_init_net")
    assert ws.fetch("tensor_fill_float").tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert ws.fetch("tensor_int_fill").dtype == np.int32 and ws.fetch("tensor_int64_fill").dtype == np.int64
    assert ws.fetch("tensor_string_to_uint8_fill").tolist() == [[0x80, 0x81], [0x82, 0x83]]
