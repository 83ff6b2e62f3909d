"""Binary elementwise ops, comparisons, logic, Pow, Max/Min, SumReduceLike and the broadcast helpers,
against index-loop references of Caffe2's two broadcasting rules."""
import math
import operator

import numpy as np
import pytest

from stepnet.core import backend
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops.elementwise import broadcast_b_shape, broadcast_result_shape, sum_to_shape
from stepnet.testing import DEVICES, infer_static, run_op

rng = np.random.default_rng(7)


def f32(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def i32(*shape, lo=-9, hi=10, dtype=np.int32):
    return rng.integers(lo, hi, size=shape).astype(dtype)


# --------------------------------------------------------------------------------------------- references

def legacy_index(a_shape, b_shape, idx, axis):
    """B's index for A's index `idx` under the legacy rule, worked out dim by dim."""
    if math.prod(b_shape) == 1:
        return (0,) * len(b_shape)
    start = len(a_shape) - len(b_shape) if axis == -1 else axis
    return tuple(0 if b_shape[j] == 1 else idx[start + j] for j in range(len(b_shape)))


def ref_legacy(fn, a, b, axis=-1, dtype=None):
    out = np.empty(a.shape, dtype=dtype or a.dtype)
    for idx in np.ndindex(*a.shape):
        out[idx] = fn(a[idx].item(), b[legacy_index(a.shape, b.shape, idx, axis)].item())
    return out


def ref_numpy(fn, a, b, dtype=None):
    nd = max(a.ndim, b.ndim)
    pa, pb = (1,) * (nd - a.ndim) + a.shape, (1,) * (nd - b.ndim) + b.shape
    shape = tuple(x if y == 1 else y for x, y in zip(pa, pb, strict=True))
    out = np.empty(shape, dtype=dtype or a.dtype)
    for idx in np.ndindex(*shape):
        ia = tuple(0 if pa[k] == 1 else idx[k] for k in range(nd))[nd - a.ndim:]
        ib = tuple(0 if pb[k] == 1 else idx[k] for k in range(nd))[nd - b.ndim:]
        out[idx] = fn(a[ia].item(), b[ib].item())
    return out


def c_div(x, y):
    """C++ division: true division for floats, truncation toward zero for ints."""
    if isinstance(x, float):
        return x / y
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


FNS = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Div": c_div,
       "EQ": operator.eq, "NE": operator.ne, "LT": operator.lt, "LE": operator.le, "GT": operator.gt,
       "GE": operator.ge, "And": lambda x, y: x and y, "Or": lambda x, y: x or y, "Xor": operator.ne,
       "Pow": lambda x, y: x ** y}
BOOL_OUT = {"EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Xor"}


def expected(op_type, a, b, args):
    dtype = np.bool_ if op_type in BOOL_OUT else None
    if args.get("broadcast"):
        axis = args.get("axis", -1)
        if "axis_str" in args:
            axis = args.get("order", "NCHW").index(args["axis_str"])
        return ref_legacy(FNS[op_type], a, b, axis, dtype)
    return ref_numpy(FNS[op_type], a, b, dtype)


def check(got, want, tol=1e-6):
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------------------------- cases

A4 = f32(2, 3, 4, 5)
BINARY_SHAPES = [  # (id, A, B, args)
    ("same", f32(2, 3), f32(2, 3), {}),
    ("legacy-suffix", f32(2, 3, 4), f32(4), {"broadcast": 1}),
    ("legacy-suffix2", A4, f32(4, 5), {"broadcast": 1}),
    ("legacy-axis1", A4, f32(3, 4), {"broadcast": 1, "axis": 1}),
    ("legacy-axis0", f32(2, 3, 3), f32(2), {"broadcast": 1, "axis": 0}),
    ("legacy-axis1-square", f32(2, 3, 3), f32(3), {"broadcast": 1, "axis": 1}),
    ("legacy-axis_str-NCHW", A4, f32(3), {"broadcast": 1, "axis_str": "C", "order": "NCHW"}),
    ("legacy-axis_str-NHWC", f32(2, 4, 5, 3), f32(3), {"broadcast": 1, "axis_str": "C", "order": "NHWC"}),
    ("legacy-trailing-ones", f32(2, 3, 4), f32(3, 1), {"broadcast": 1, "axis": 1}),
    ("legacy-inner-ones", f32(2, 3, 4), f32(1, 3, 1), {"broadcast": 1}),
    ("legacy-scalar", f32(2, 3), f32(1), {"broadcast": 1}),
    ("legacy-scalar-high-rank", f32(3), f32(1, 1, 1, 1), {"broadcast": 1}),
    ("numpy-both", f32(2, 1, 4), f32(3, 1), {}),
    ("numpy-b-larger", f32(4), f32(2, 3, 4), {}),
    ("numpy-zero-dim", f32(0, 3), f32(3), {"broadcast": 0}),
    ("numpy-scalar", f32(2, 3), np.array(1.5, np.float32), {}),
]
ARITH_CASES = [(f"{op}-{cid}", op, a, (np.abs(b) + 0.5 if op == "Div" else b), args)
               for op in ("Add", "Sub", "Mul", "Div") for cid, a, b, args in BINARY_SHAPES]
ARITH_CASES += [
    ("Add-int32", "Add", i32(3, 4), i32(4), {"broadcast": 1}),
    ("Mul-int64", "Mul", i32(2, 3, dtype=np.int64), i32(2, 3, dtype=np.int64), {}),
    ("Sub-int32-numpy", "Sub", i32(2, 1), i32(1, 3), {}),
    ("Div-int32-trunc", "Div", np.array([7, -7, 7, -7, 6, -1], np.int32),
     np.array([2, 2, -2, -2, 3, 4], np.int32), {}),
    ("Div-int64-legacy", "Div", i32(3, 4, dtype=np.int64), np.array([3, -2, 5, -7], np.int64),
     {"broadcast": 1}),
]

ti, tj = i32(3, 4, lo=0, hi=3), i32(3, 4, lo=0, hi=3)
COMPARE_CASES = [(f"{op}-{cid}", op, a, b, args) for op in ("EQ", "NE", "LT", "LE", "GT", "GE")
                 for cid, a, b, args in [
                     ("int-ties", ti, tj, {}),
                     ("float", f32(2, 3), f32(2, 3), {}),
                     ("float-ties", np.array([1, 2, 3], np.float32), np.array([1, 3, 2], np.float32), {}),
                     ("legacy", i32(2, 3, 4, lo=0, hi=3), i32(3, lo=0, hi=3), {"broadcast": 1, "axis": 1}),
                     ("numpy", i32(2, 1, lo=0, hi=3, dtype=np.int64), i32(3, lo=0, hi=3, dtype=np.int64), {}),
                 ]]
COMPARE_CASES += [("EQ-bool", "EQ", np.array([True, False, True]), np.array([True, True, False]), {})]

ba, bb = rng.random((2, 3, 4)) > 0.5, rng.random((2, 3, 4)) > 0.5
LOGIC_CASES = [(f"{op}-{cid}", op, a, b, args) for op in ("And", "Or", "Xor")
               for cid, a, b, args in [
                   ("same", ba, bb, {}),
                   ("legacy", ba, rng.random(3) > 0.5, {"broadcast": 1, "axis": 1}),
                   ("numpy", ba, rng.random((3, 1)) > 0.5, {}),
               ]]

POW_CASES = [
    ("same", f32(2, 3, lo=0.1), f32(2, 3), {}),
    ("legacy", f32(2, 3, 4, lo=0.1), f32(3), {"broadcast": 1, "axis": 1}),
    ("legacy-scalar", f32(2, 3, lo=0.1), np.array([2.0], np.float32), {"broadcast": 1}),
    ("numpy", f32(2, 1, lo=0.1), f32(3), {}),
]

BINARY_CASES = (ARITH_CASES + COMPARE_CASES + LOGIC_CASES
                + [(f"Pow-{c}", "Pow", a, b, g) for c, a, b, g in POW_CASES])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,a,b,args", BINARY_CASES, ids=[c[0] for c in BINARY_CASES])
def test_binary(device, cid, op_type, a, b, args):
    tol = 1e-5 if op_type in ("Div", "Pow") else 1e-6
    check(run_op(op_type, [a, b], device=device, **args), expected(op_type, a, b, args), tol)


@pytest.mark.parametrize("device", DEVICES)
def test_not(device):
    x = rng.random((3, 4)) > 0.5
    want = np.array([not v for v in x.ravel()]).reshape(x.shape)
    check(run_op("Not", [x], device=device), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("exponent", [2.0, 0.5, -1.0, 3.3])
def test_pow_exponent_arg(device, exponent):
    x = f32(2, 5, lo=0.2, hi=3.0)
    want = np.array([v ** exponent for v in x.ravel().tolist()], np.float32).reshape(x.shape)
    check(run_op("Pow", [x], device=device, exponent=exponent), want, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,pick", [("Max", max), ("Min", min)])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_max_min(device, op_type, pick, n):
    xs = [f32(3, 4) for _ in range(n)]
    columns = zip(*(x.ravel().tolist() for x in xs), strict=True)
    want = np.array([pick(vals) for vals in columns], np.float32).reshape(3, 4)
    check(run_op(op_type, xs, device=device), want)


def ref_sum_reduce(a, b_shape, axis=-1):
    out = np.zeros(b_shape, dtype=np.float64)
    for idx in np.ndindex(*a.shape):
        out[legacy_index(a.shape, b_shape, idx, axis)] += a[idx]
    return out.astype(a.dtype)


SRL_CASES = [
    ("suffix", A4, (4, 5), {}),
    ("axis1", A4, (3, 4), {"axis": 1}),
    ("axis0", f32(2, 3, 2, 5), (2,), {"axis": 0}),
    ("axis_str", A4, (3,), {"axis_str": "C"}),
    ("axis_str-NHWC", f32(2, 4, 5, 3), (3,), {"axis_str": "C", "order": "NHWC"}),
    ("scalar", A4, (1,), {}),
    ("ones-around", f32(2, 3, 4), (1, 3, 1), {}),
    ("same", f32(3, 4), (3, 4), {}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,a,b_shape,args", SRL_CASES, ids=[c[0] for c in SRL_CASES])
def test_sum_reduce_like(device, cid, a, b_shape, args):
    axis = args.get("axis", -1)
    if "axis_str" in args:
        axis = args.get("order", "NCHW").index(args["axis_str"])
    b = np.zeros(b_shape, np.float32)
    check(run_op("SumReduceLike", [a, b], device=device, **args), ref_sum_reduce(a, b_shape, axis), 1e-5)


# --------------------------------------------------------------------------------------------- helpers

@pytest.mark.parametrize("cid,a,b,args", BINARY_SHAPES, ids=[c[0] for c in BINARY_SHAPES])
def test_broadcast_b_shape_matches_reference(cid, a, b, args):
    view = broadcast_b_shape(a.shape, b.shape, **args)
    got = a + b.reshape(view)
    check(got, expected("Add", a, b, args))
    assert broadcast_result_shape(a.shape, b.shape, **args) == got.shape


def numpy_index(g_shape, shape, idx):
    lead = len(g_shape) - len(shape)
    return tuple(0 if shape[k] == 1 else idx[lead + k] for k in range(len(shape)))


def ref_reduce(g, shape, args):
    """Sum of g's elements into the element of `shape` each one was broadcast from."""
    axis = args.get("axis", -1)
    if "axis_str" in args:
        axis = args.get("order", "NCHW").index(args["axis_str"])
    if shape == g.shape:  # A's own gradient under the legacy rule: nothing was broadcast
        return g.copy()
    out = np.zeros(shape, np.float64)
    for idx in np.ndindex(*g.shape):
        if args.get("broadcast"):
            out[legacy_index(g.shape, shape, idx, axis)] += g[idx]
        else:
            out[numpy_index(g.shape, shape, idx)] += g[idx]
    return out.astype(g.dtype)


@pytest.mark.parametrize("xp", [np, backend.EMULATED], ids=["numpy", "emulated"])
@pytest.mark.parametrize("cid,a,b,args", BINARY_SHAPES, ids=[c[0] for c in BINARY_SHAPES])
def test_sum_to_shape(xp, cid, a, b, args):
    """Broadcast forward, sum-reduce backward: the gradient of each input sums over its broadcast dims."""
    g = f32(*broadcast_result_shape(a.shape, b.shape, **args))
    for x in (a, b):
        got = sum_to_shape(xp, xp.asarray(g), x.shape, **args)
        assert got is not g
        check(backend.to_host(got), ref_reduce(g, x.shape, args), 1e-5)


# --------------------------------------------------------------------------------------------- bad input

BAD = [
    ("legacy-mismatch", "Add", [f32(2, 3, 4), f32(5)], {"broadcast": 1}, ShapeError,
     r"B \(5,\) onto A \(2, 3, 4\) at axis 2"),
    ("legacy-axis-mismatch", "Mul", [A4, f32(4, 5)], {"broadcast": 1, "axis": 1}, ShapeError,
     r"B \(4, 5\) onto A \(2, 3, 4, 5\) at axis 1"),
    ("legacy-axis-range", "Add", [f32(2, 3), f32(3)], {"broadcast": 1, "axis": 2}, ShapeError,
     r"axis 2 is out of range"),
    ("legacy-b-bigger", "Sub", [f32(3), f32(2, 3)], {"broadcast": 1}, ShapeError, r"B \(2, 3\).*A \(3,\)"),
    ("numpy-mismatch", "Add", [f32(2, 3), f32(4)], {}, ShapeError, r"A \(2, 3\) and B \(4,\).*axis -1"),
    ("axis-and-axis_str", "Add", [A4, f32(3)], {"broadcast": 1, "axis": 1, "axis_str": "C"}, ArgumentError,
     "cannot be used together"),
    ("axis_str-unknown", "Add", [A4, f32(3)], {"broadcast": 1, "axis_str": "X"}, ArgumentError,
     r"axis_str 'X'.*order 'NCHW'"),
    ("dtype-mismatch", "Add", [f32(3), np.ones(3)], {}, DTypeError, "float64.*float32.*Cast"),
    ("bool-arith", "Mul", [ba, bb], {}, DTypeError, "bool"),
    ("float-logic", "And", [f32(3), f32(3)], {}, DTypeError, "float32.*bool"),
    ("float-not", "Not", [f32(3)], {}, DTypeError, "bool"),
    ("pow-no-exponent", "Pow", [f32(3)], {}, ArgumentError, "exponent"),
    ("pow-int", "Pow", [i32(3), i32(3)], {}, DTypeError, "int32"),
    ("max-shapes", "Max", [f32(2, 3), f32(3, 2)], {}, ShapeError, r"\(3, 2\).*\(2, 3\)"),
    ("srl-mismatch", "SumReduceLike", [A4, f32(5)], {"axis": 1}, ShapeError,
     r"B \(5,\) onto A \(2, 3, 4, 5\)"),
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


FOLD_CASES = [  # small integer/bool results carry their values, so shape arithmetic can be followed
    ("Add", np.array([2, 3, 4], np.int64), np.array([1], np.int64), {"broadcast": 1}),
    ("Mul", np.array([[2], [3]], np.int32), np.array([1, -2, 5], np.int32), {}),
    ("Div", np.array([7, -7, 6], np.int64), np.array([2, 2, -4], np.int64), {}),
    ("GE", np.array([1, 5, 3], np.int64), np.array([3, 3, 3], np.int64), {}),
    ("Xor", np.array([True, False]), np.array([True, True]), {}),
]


@pytest.mark.parametrize("op_type,a,b,args", FOLD_CASES, ids=[c[0] for c in FOLD_CASES])
def test_static_values_of_small_integer_results(op_type, a, b, args):
    (spec,) = infer_static(op_type, [a, b], **args)
    want = expected(op_type, a, b, args)
    assert spec.shape == want.shape and spec.dtype == want.dtype
    assert spec.value is not None and spec.value.tolist() == want.tolist()


def test_static_values_only_for_small_integers():
    (floats,) = infer_static("Add", [f32(3), f32(3)])
    (big,) = infer_static("Add", [np.ones(65, np.int32), np.ones(1, np.int32)], broadcast=1)
    (unknown,) = infer_static("Max", [np.ones(65, np.int32), np.ones(65, np.int32)])
    assert floats.value is None and big.value is None and unknown.value is None
    assert big.shape == (65,) and big.dtype == np.int32


@pytest.mark.parametrize("op_type,in_place_on", [("EQ", "a"), ("Div", "b"), ("SumReduceLike", "a"),
                                                 ("Not", "a")])
def test_in_place_refused_where_caffe2_refuses(op_type, in_place_on):
    inputs = {"a": np.ones(3, bool)} if op_type == "Not" else {"a": f32(3), "b": f32(3)}
    with pytest.raises(ArgumentError, match="in place"):
        run_op(op_type, inputs, [in_place_on])


@pytest.mark.parametrize("op_type,out", [("Add", "b"), ("Mul", "a"), ("Div", "a"), ("Max", "a")])
def test_in_place_allowed(op_type, out):
    a, b = f32(2, 3), np.abs(f32(2, 3)) + 0.5
    got = run_op(op_type, {"a": a, "b": b}, [out])
    check(got, ref_numpy(max if op_type == "Max" else FNS[op_type], a, b), 1e-6)


# -------------------------------------------------------------------------------------------- test the tester

def test_reference_check_catches_broken_kernels(broken):
    schema = REGISTRY.get("Add")
    original = schema.kernel
    a, b, args = f32(2, 3, 3), f32(3), {"broadcast": 1, "axis": 1}
    check(run_op("Add", [a, b], **args), expected("Add", a, b, args))

    def ignores_axis(xp, a, b, broadcast=False, axis=-1, axis_str="", order="NCHW"):
        return original(xp, a, b, broadcast, -1, axis_str, order)

    def upcasts(xp, a, b, **kw):
        return original(xp, a, b, **kw).astype(np.float64)

    def off_by_a_bit(xp, a, b, **kw):
        return original(xp, a, b, **kw) * np.float32(1.0001)

    for wrong in (ignores_axis, upcasts, off_by_a_bit):
        broken("Add", wrong)
        with pytest.raises(AssertionError):
            check(run_op("Add", [a, b], **args), expected("Add", a, b, args))
