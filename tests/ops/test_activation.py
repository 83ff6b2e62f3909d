"""Unary math and activation ops against per-element references written with Python's math module."""
import math

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, infer_static, run_op

rng = np.random.default_rng(11)


def f32(*shape, lo=-3.0, hi=3.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def per_element(fn, x, dtype=None):
    """fn applied to every element as a Python float (or int), collected in x's dtype."""
    vals = [fn(v) for v in x.ravel().tolist()]
    return np.array(vals, dtype=dtype or x.dtype).reshape(x.shape)


def check(got, want, tol=1e-5):
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def exp_or_inf(v):
    return math.exp(v) if v < 700 else math.inf


def sigmoid(v):
    return 1.0 / (1.0 + exp_or_inf(-v))


def softplus(v):
    return math.log1p(math.exp(v)) if v < 700 else v


def elu(alpha):
    return lambda v: v if v > 0 else alpha * (math.exp(v) - 1.0)


def selu(alpha=1.6732632423543772848170429916717, scale=1.0507009873554804934193349852946):
    return lambda v: scale * (v if v > 0 else alpha * (math.exp(v) - 1.0))


def logit(eps=1e-6):
    lo, hi = float(np.float32(eps)), float(np.float32(1.0 - eps))  # Caffe2 stores the clamp bounds as float

    def fn(v):
        p = min(max(v, lo), hi)
        return math.log(p / (1.0 - p))
    return fn


def sign(v):
    return (v > 0) - (v < 0)


F = f32(3, 4)
WIDE = np.array([-1000.0, -100.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 100.0, 1000.0], np.float32)
POS = f32(3, 4, lo=0.05, hi=4.0)
UNIT = np.array([-0.5, 0.0, 1e-8, 0.1, 0.5, 0.9, 1.0, 1.5], np.float32)
INTS = rng.integers(-9, 10, size=(3, 4)).astype(np.int32)

CASES = [  # (id, op, x, args, reference, tolerance)
    ("Relu", "Relu", F, {}, lambda v: max(v, 0.0), 0),
    ("Sigmoid", "Sigmoid", F, {}, sigmoid, 1e-6),
    ("Sigmoid-wide", "Sigmoid", WIDE, {}, sigmoid, 1e-6),
    ("Tanh", "Tanh", F, {}, math.tanh, 1e-6),
    ("Tanh-wide", "Tanh", WIDE, {}, math.tanh, 1e-6),
    ("Softsign", "Softsign", WIDE, {}, lambda v: v / (1.0 + abs(v)), 1e-6),
    ("Softplus", "Softplus", F, {}, softplus, 1e-6),
    ("Softplus-wide", "Softplus", WIDE, {}, softplus, 1e-6),
    ("Elu", "Elu", F, {}, elu(1.0), 1e-6),
    ("Elu-alpha", "Elu", WIDE, {"alpha": 0.5}, elu(0.5), 1e-6),
    ("LeakyRelu", "LeakyRelu", F, {}, lambda v: v if v > 0 else 0.01 * v, 1e-7),
    ("LeakyRelu-alpha", "LeakyRelu", F, {"alpha": 0.2}, lambda v: v if v > 0 else 0.2 * v, 1e-7),
    ("Exp", "Exp", F, {}, math.exp, 1e-5),
    ("Log", "Log", POS, {}, math.log, 1e-6),
    ("Sqrt", "Sqrt", POS, {}, math.sqrt, 1e-6),
    ("Sqr", "Sqr", F, {}, lambda v: v * v, 1e-6),
    ("Sqr-int", "Sqr", INTS, {}, lambda v: v * v, 0),
    ("Abs", "Abs", F, {}, abs, 0),
    ("Abs-int", "Abs", INTS, {}, abs, 0),
    ("Negative", "Negative", F, {}, lambda v: -v, 0),
    ("Negative-int", "Negative", INTS, {}, lambda v: -v, 0),
    ("Sign", "Sign", np.array([-2.5, -0.0, 0.0, 3.0], np.float32), {}, sign, 0),
    ("Sign-int", "Sign", INTS, {}, sign, 0),
    ("Clip", "Clip", F, {"min": -1.0, "max": 0.5}, lambda v: min(max(v, -1.0), 0.5), 0),
    ("Clip-min-only", "Clip", WIDE, {"min": -1.5}, lambda v: max(v, -1.5), 0),
    ("Clip-max-only", "Clip", WIDE, {"max": 2.0}, lambda v: min(v, 2.0), 0),
    ("Clip-none", "Clip", WIDE, {}, lambda v: v, 0),
    ("Reciprocal", "Reciprocal", POS, {}, lambda v: 1.0 / v, 1e-5),
    ("Rsqrt", "Rsqrt", POS, {}, lambda v: 1.0 / math.sqrt(v), 1e-5),
    ("Sin", "Sin", F, {}, math.sin, 1e-6),
    ("Cos", "Cos", F, {}, math.cos, 1e-6),
    ("Swish", "Swish", F, {}, lambda v: v * sigmoid(v), 1e-6),
    ("Swish-wide", "Swish", WIDE, {}, lambda v: v * sigmoid(v), 1e-6),
    ("Selu", "Selu", F, {}, selu(), 1e-6),
    ("Selu-args", "Selu", WIDE, {"alpha": 1.5, "scale": 2.0}, selu(1.5, 2.0), 1e-6),
    ("HardSigmoid", "HardSigmoid", WIDE, {}, lambda v: max(0.0, min(1.0, 0.2 * v + 0.5)), 1e-7),
    ("HardSigmoid-args", "HardSigmoid", F, {"alpha": 0.5, "beta": 0.25},
     lambda v: max(0.0, min(1.0, 0.5 * v + 0.25)), 1e-7),
    ("Logit", "Logit", UNIT, {}, logit(), 1e-4),
    ("Logit-eps", "Logit", UNIT, {"eps": 0.01}, logit(0.01), 1e-5),
    ("Cbrt", "Cbrt", WIDE, {}, lambda v: math.copysign(abs(v) ** (1.0 / 3.0), v), 1e-6),
    ("Relu-f64", "Relu", F.astype(np.float64), {}, lambda v: max(v, 0.0), 0),
    ("Sigmoid-f64", "Sigmoid", WIDE.astype(np.float64), {}, sigmoid, 1e-12),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,x,args,ref,tol", CASES, ids=[c[0] for c in CASES])
def test_unary(device, cid, op_type, x, args, ref, tol):
    check(run_op(op_type, [x], device=device, **args), per_element(ref, x), tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,x,want", [
    ("Log", np.array([0.0, -1.0], np.float32), [-math.inf, math.nan]),
    ("Sqrt", np.array([-1.0, 4.0], np.float32), [math.nan, 2.0]),
    ("Reciprocal", np.array([0.0, -0.0], np.float32), [math.inf, -math.inf]),
    ("Clip", np.array([math.nan, math.inf, -math.inf], np.float32), [math.nan, 1.0, -1.0]),
], ids=["Log", "Sqrt", "Reciprocal", "Clip"])
def test_ieee_special_values(device, op_type, x, want):
    args = {"min": -1.0, "max": 1.0} if op_type == "Clip" else {}
    check(run_op(op_type, [x], device=device, **args), np.array(want, np.float32), 0)


def prelu_ref(x, w, order):
    """x if x > 0 else w[channel] * x, the channel read off the element's index."""
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape):
        c = 0 if w.size == 1 else (idx[1] if order == "NCHW" else idx[-1])
        v = float(x[idx])
        out[idx] = v if v > 0 else float(w.ravel()[c]) * v
    return out


PRELU_CASES = [
    ("NCHW", f32(2, 3, 4, 2), f32(3, lo=0, hi=1), "NCHW"),
    ("NCHW-2d", f32(4, 3), f32(3, lo=0, hi=1), "NCHW"),
    ("NHWC", f32(2, 4, 2, 3), f32(3, lo=0, hi=1), "NHWC"),
    ("NHWC-1d", f32(5), f32(5, lo=0, hi=1), "NHWC"),
    ("shared", f32(2, 3, 4), np.array([0.25], np.float32), "NCHW"),
    ("shared-NHWC", f32(2, 3, 4), np.array([0.25], np.float32), "NHWC"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,x,w,order", PRELU_CASES, ids=[c[0] for c in PRELU_CASES])
def test_prelu(device, cid, x, w, order):
    check(run_op("PRelu", [x, w], device=device, order=order), prelu_ref(x, w, order), 1e-7)


# --------------------------------------------------------------------------------------------- bad input

BAD = [
    ("Relu-int", "Relu", [INTS], {}, DTypeError,
     "Relu needs floating-point inputs: X must be a float tensor, got int32"),
    ("Sigmoid-bool", "Sigmoid", [F > 0], {}, DTypeError, "bool"),
    ("Negative-bool", "Negative", [F > 0], {}, DTypeError, "numeric"),
    ("Selu-scale", "Selu", [F], {"scale": 0.5}, ArgumentError, "scale must be greater than 1"),
    ("Logit-eps", "Logit", [F], {"eps": 0.6}, ArgumentError, r"eps must be in \(0, 0.5\)"),
    ("Clip-int-arg", "Clip", [F], {"min": 0}, ArgumentError, "'min'.*float"),
    ("PRelu-channels", "PRelu", [f32(2, 3, 4), f32(4)], {}, ShapeError,
     r"slope \(4,\).*X \(2, 3, 4\) has 3 channels on axis 1 \(order NCHW\)"),
    ("PRelu-channels-NHWC", "PRelu", [f32(2, 3, 4), f32(3)], {"order": "NHWC"}, ShapeError,
     r"has 4 channels on axis 2 \(order NHWC\)"),
    ("PRelu-order", "PRelu", [F, f32(4)], {"order": "CHWN"}, ArgumentError, "order"),
    ("PRelu-dtype", "PRelu", [F, np.ones(4)], {}, DTypeError, "float64"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[c[0] for c in BAD])
def test_bad_input(device, cid, op_type, inputs, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[c[0] for c in BAD])
def test_bad_input_caught_statically(cid, op_type, inputs, args, err, match):
    """Every bad input is refused by the shape function too, with the kernel's error, before anything runs."""
    with pytest.raises(err, match=match):
        infer_static(op_type, inputs, **args)


@pytest.mark.parametrize("op_type", ["Sqr", "Abs", "Negative", "Sign"])
def test_static_values_of_integer_inputs(op_type):
    """The integer-capable ops carry a small integer input's value through (shape arithmetic)."""
    x = np.array([3, -2, 0, 5], np.int64)
    fn = {"Sqr": lambda v: v * v, "Abs": abs, "Negative": lambda v: -v, "Sign": lambda v: (v > 0) - (v < 0)}
    (spec,) = infer_static(op_type, [x])
    assert spec.shape == (4,) and spec.dtype == np.int64
    assert spec.value.tolist() == [fn[op_type](v) for v in x.tolist()]
    (spec,) = infer_static(op_type, [F])
    assert spec.shape == F.shape and spec.dtype == np.float32 and spec.value is None


@pytest.mark.parametrize("op_type", ["Abs", "Sin", "Cos", "Swish", "Sign"])
def test_in_place_refused_where_caffe2_refuses(op_type):
    with pytest.raises(ArgumentError, match="in place"):
        run_op(op_type, {"x": F}, ["x"])


@pytest.mark.parametrize("op_type", ["Relu", "Sigmoid", "Tanh", "Exp", "Elu", "Clip", "Logit"])
def test_in_place_allowed(op_type):
    x = np.abs(F) / 4 if op_type == "Logit" else F
    assert run_op(op_type, {"x": x}, ["x"]).shape == x.shape


# -------------------------------------------------------------------------------------------- test the tester

def test_reference_check_catches_broken_kernels(broken):
    original = REGISTRY.get("Sigmoid").kernel
    check(run_op("Sigmoid", [WIDE]), per_element(sigmoid, WIDE), 1e-6)

    def naive(xp, x):  # overflows in exp(-x) for very negative x: NaN-free but warns; wrong at 0 shift
        return (1 / (1 + xp.exp(-x)) + 1e-4).astype(x.dtype)

    def upcasts(xp, x):
        return original(xp, x).astype(np.float64)

    def tanh_instead(xp, x):
        return xp.tanh(x)

    for wrong in (naive, upcasts, tanh_instead):
        broken("Sigmoid", wrong)
        with pytest.raises(AssertionError), np.errstate(over="ignore"):
            check(run_op("Sigmoid", [WIDE]), per_element(sigmoid, WIDE), 1e-6)


# --------------------------------------------------------------------------------------------- ThresholdedRelu, Glu
def _sigmoid_ref(v):
    return 1 / (1 + math.exp(-v))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha", [1.0, 0.0, 2.5, -0.5])
def test_thresholded_relu(alpha, device):
    x = np.array([[-3.0, -0.5, 0.0, 0.99], [1.0, 1.01, 2.5, 3.0]], np.float32)
    got = run_op("ThresholdedRelu", [x], device=device, alpha=alpha)
    want = np.array([[v if v > alpha else 0.0 for v in row] for row in x.tolist()], np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, dim", [((3, 4), -1), ((2, 6, 3), 1), ((4, 2), 0), ((2,), -1)])
def test_glu(shape, dim, device):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    axis = len(shape) - 1 if dim == -1 else dim
    half = shape[axis] // 2
    want = np.empty(shape[:axis] + (half,) + shape[axis + 1:], np.float64)
    for idx in np.ndindex(*want.shape):
        a = list(idx)
        b = list(idx)
        b[axis] += half
        want[idx] = float(x[tuple(a)]) * _sigmoid_ref(float(x[tuple(b)]))
    got = run_op("Glu", [x], device=device, dim=dim)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert infer_static("Glu", [x], dim=dim)[0].shape == want.shape


def test_glu_bad_inputs_and_no_gradient():
    with pytest.raises(ShapeError, match="size 3 is odd"):
        run_op("Glu", [np.ones((2, 3), np.float32)])
    with pytest.raises(ArgumentError, match="dim=2 is out of range"):
        run_op("Glu", [np.ones((2, 4), np.float32)], dim=2)
    assert REGISTRY.get("Glu").gradient is None


def test_glu_reference_catches_a_broken_kernel(patched):
    patched("Glu", kernel=lambda xp, x, dim=-1: x[..., :x.shape[-1] // 2])
    got = run_op("Glu", [np.ones((1, 2), np.float32)])
    assert not np.allclose(got, [[_sigmoid_ref(1.0)]])
