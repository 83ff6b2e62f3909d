"""Mod, Log1p, Gelu, ReplaceNaN, EnforceFinite, Bucketize, BatchBoxCox and Mean (stepnet/ops/pointwise.py)
against references written here from the definitions (Python's math module, loops; Caffe2's
operator_test/{mod,gelu,bucketize,batch_box_cox,...}_op_test.py references are the model) on every device; bad
inputs at run time and statically; the no-gradient kinds Caffe2 registers; broken kernels caught."""
import bisect
import math

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, OpError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops.registry import GRADIENT_NOT_IMPLEMENTED, NO_GRADIENT, SHOULD_NOT_DO_GRADIENT
from stepnet.testing import DEVICES, infer_alone, infer_static, make_op, run_op

rng = np.random.default_rng(31)


def f32(*shape, lo=-3.0, hi=3.0, dtype=np.float32):
    return rng.uniform(lo, hi, shape).astype(dtype)


def each(fn, *arrays, dtype):
    """fn applied to the elements of the arrays (as Python numbers), into an array of `dtype`."""
    out = np.empty(arrays[0].shape, dtype=np.float64 if np.dtype(dtype).kind == "f" else dtype)
    for idx in np.ndindex(*arrays[0].shape):
        out[idx] = fn(*(a[idx].item() for a in arrays))
    return out.astype(dtype)


# --------------------------------------------------------------------------------------------- references
def c_mod(a, d, sign_follow_divisor=False):
    """C++'s a % d (the quotient truncated toward zero), then moved to the divisor's sign if asked."""
    q = abs(a) // abs(d)
    r = a - d * (q if (a >= 0) == (d > 0) else -q)
    if sign_follow_divisor and r != 0 and (r > 0) != (d > 0):
        r += d
    return r


def gelu(v):
    return v * 0.5 * math.erfc(-v / math.sqrt(2.0))


def fast_gelu(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def box_cox(x, l1, l2):
    """Per column j: t = max(x + l2[j], 1e-6); log t if l1[j] == 0 else (t ** l1[j] - 1) / l1[j]."""
    cols = l1.size
    rows = x.reshape(x.shape[0], cols) if x.size else x.reshape(0, cols)
    out = np.empty(rows.shape)
    for i, j in np.ndindex(*rows.shape):
        t = max(float(rows[i, j]) + float(l2.ravel()[j]), 1e-6)
        lam = float(l1.ravel()[j])
        out[i, j] = math.log(t) if lam == 0 else (t ** lam - 1) / lam
    return out.reshape(x.shape).astype(x.dtype)


def bucket(boundaries, v):
    edges = [float(np.float32(b)) for b in boundaries]
    return 0 if math.isnan(v) else bisect.bisect_left(edges, v)


def mean_of(*xs):
    return each(lambda *v: math.fsum(v) / len(v), *xs, dtype=xs[0].dtype)


INTS = np.array([-9, -7, -3, -1, 0, 1, 2, 3, 7, 10, 2 ** 40], np.int64)
X34 = f32(3, 4)
WIDE = f32(4, 6, lo=-9.0, hi=9.0)
NANS = np.array([[1.0, np.nan, -np.inf], [np.nan, 2.5, np.inf]], np.float32)
BOX = f32(5, 4, lo=0.5, hi=4.0)
L1 = np.array([0.0, 0.5, -1.5, 2.0], np.float32)
L2 = np.array([0.0, 1.0, -0.25, 0.3], np.float32)

CASES = [   # (id, op, inputs, args, expected outputs)
    ("mod", "Mod", [INTS], {"divisor": 3}, [each(lambda a: c_mod(a, 3), INTS, dtype=np.int64)]),
    ("mod_negative_divisor", "Mod", [INTS], {"divisor": -4},
     [each(lambda a: c_mod(a, -4), INTS, dtype=np.int64)]),
    ("mod_sign_follow", "Mod", [INTS], {"divisor": 3, "sign_follow_divisor": True},
     [each(lambda a: c_mod(a, 3, True), INTS, dtype=np.int64)]),
    ("mod_sign_follow_negative", "Mod", [INTS.astype(np.int32)[:-1]], {"divisor": -4, "sign_follow_divisor": 1},
     [each(lambda a: c_mod(a, -4, True), INTS[:-1], dtype=np.int32)]),
    ("log1p", "Log1p", [f32(3, 4, lo=-0.9, hi=5.0)], {}, None),
    ("log1p_small", "Log1p", [np.array([1e-10, -1e-12, 3e-8], np.float64)], {}, None),
    ("gelu", "Gelu", [WIDE], {}, [each(gelu, WIDE, dtype=np.float32)]),
    ("gelu_tails", "Gelu", [np.array([-40.0, -12.0, -6.0, -2.5, -2.4999, 0.0, 2.5, 6.0, 40.0])], {},
     [each(gelu, np.array([-40.0, -12.0, -6.0, -2.5, -2.4999, 0.0, 2.5, 6.0, 40.0]), dtype=np.float64)]),
    ("gelu_fast", "Gelu", [WIDE], {"fast_gelu": True}, [each(fast_gelu, WIDE, dtype=np.float32)]),
    ("replace_nan", "ReplaceNaN", [NANS], {"value": 7.5},
     [each(lambda v: 7.5 if math.isnan(v) else v, NANS, dtype=np.float32)]),
    ("replace_nan_default", "ReplaceNaN", [NANS.astype(np.float64)], {},
     [each(lambda v: 0.0 if math.isnan(v) else v, NANS, dtype=np.float64)]),
    ("bucketize", "Bucketize", [np.array([[2, 4], [1, 0.1], [2.5, -3], [np.nan, 9]], np.float32)],
     {"boundaries": [0.1, 2.5]}, None),
    ("bucketize_repeated", "Bucketize", [X34], {"boundaries": [-1.0, 0.0, 0.0, 1.5]}, None),
    ("bucketize_no_boundaries", "Bucketize", [X34], {}, [np.zeros((3, 4), np.int32)]),
    ("box_cox", "BatchBoxCox", [BOX, L1, L2], {}, [box_cox(BOX, L1, L2)]),
    ("box_cox_clamped", "BatchBoxCox", [np.array([[-5.0, 0.0], [1.0, -1.0]]), np.array([1.0, 0.0]),
                                        np.array([0.0, 1.0])], {},
     [box_cox(np.array([[-5.0, 0.0], [1.0, -1.0]]), np.array([1.0, 0.0]), np.array([0.0, 1.0]))]),
    ("box_cox_3d", "BatchBoxCox", [BOX.reshape(5, 2, 2), L1.reshape(2, 2), L2], {"min_block_size": 1},
     [box_cox(BOX.reshape(5, 2, 2), L1, L2)]),
    ("box_cox_empty", "BatchBoxCox", [np.zeros((0, 3), np.float32), L1, L2], {}, [np.zeros((0, 3), np.float32)]),
    ("mean", "Mean", [X34, X34 * 2, f32(3, 4)], {}, None),
    ("mean_one", "Mean", [X34], {}, [X34.copy()]),
    ("mean_double", "Mean", [X34.astype(np.float64), f32(3, 4, dtype=np.float64)], {}, None),
]


def expected(op_type, inputs, args):
    if op_type == "Log1p":
        return [each(math.log1p, inputs[0], dtype=inputs[0].dtype)]
    if op_type == "Bucketize":
        return [each(lambda v: bucket(args.get("boundaries", []), v), inputs[0], dtype=np.int32)]
    return [mean_of(*inputs)]


TOL = {"gelu_tails": 1e-12, "log1p_small": 1e-12, "mean_double": 1e-7}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    cid, op_type, inputs, args, want = case
    check(op_type, inputs, args, want or expected(op_type, inputs, args), device, TOL.get(cid, 2e-6))


def test_gelu_glows_tanh_numbers_are_within_its_tolerance_of_the_exact_form():
    """Glow checks Gelu against 0.5x(1 + tanh(0.797885x + 0.035677x^3)) within 1e-3 on [-10, 10]; Caffe2's
    default (fast_gelu=0) is the exact form, which that check accepts too."""
    x = np.linspace(-10, 10, 201).astype(np.float32)
    got = run_op("Gelu", [x])
    glow = [0.5 * v * (1 + math.tanh(0.797885 * v + 0.035677 * v ** 3)) for v in x.tolist()]
    np.testing.assert_allclose(got, glow, atol=1e-3)


def test_mean_scales_by_a_float32_third_as_caffe2_does():
    """math::Scale(1.0f / n): a float64 Mean of three inputs is scaled by float32(1/3), not 1/3."""
    ones = np.ones(2)
    got = run_op("Mean", [ones, ones, ones])
    assert got.tolist() == [3 * float(np.float32(1 / 3))] * 2 and got[0] != 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_enforce_finite(device):
    assert run_op("EnforceFinite", [X34], 0, device=device) == []
    for bad, shown in [(np.array([1.0, 2.0, np.inf], np.float32), "element 2 .* inf"),
                       (np.array([[0.0, np.nan]]), "element 1 .* nan")]:
        with pytest.raises(OpError, match=rf"op #0 \(EnforceFinite\): EnforceFinite: {shown}.*\[inputs: in0"):
            run_op("EnforceFinite", [bad], 0, device=device)


@pytest.mark.parametrize("op_type, args", [("Mod", {"divisor": 3}), ("ReplaceNaN", {}), ("BatchBoxCox", {}),
                                           ("Mean", {})])
def test_in_place_as_caffe2_allows(op_type, args):
    x = INTS.copy() if op_type == "Mod" else BOX.copy()
    inputs = {"x": x} if op_type != "BatchBoxCox" else {"x": x, "l1": L1, "l2": L2}
    want = run_op(op_type, list(inputs.values()), **args)
    from stepnet import Workspace
    ws = Workspace()
    for k, v in inputs.items():
        ws.feed(k, v)
    ws.run_operator_once(make_op(op_type, list(inputs), ["x"], **args))
    np.testing.assert_array_equal(ws.fetch("x"), want)


@pytest.mark.parametrize("op_type", ["Log1p", "Gelu", "Bucketize"])
def test_in_place_refused_as_caffe2_refuses(op_type):
    from stepnet import Workspace
    ws = Workspace()
    ws.feed("x", X34)
    with pytest.raises(ArgumentError, match="in place"):
        ws.run_operator_once(make_op(op_type, ["x"], ["x"]))


def test_mod_folds_known_small_values():
    """Shape inference carries Mod's result when its integer input is known (as for shape arithmetic)."""
    spec = infer_static("Mod", [np.array([7, -7], np.int64)], divisor=4, sign_follow_divisor=True)[0]
    assert spec.shape == (2,) and spec.value.tolist() == [3, 1]


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("Mod", [X34], {"divisor": 3}, DTypeError, "int32 or int64 tensor, got float32"),
    ("Mod", [INTS], {}, ArgumentError, "divisor must not be 0"),
    ("Log1p", [INTS], {}, DTypeError, "Log1p needs floating-point inputs"),
    ("Gelu", [INTS.astype(np.int32)], {"fast_gelu": True}, DTypeError, "Gelu needs floating-point"),
    ("ReplaceNaN", [X34.astype(np.float16)], {}, DTypeError, "float32 or float64 tensor, got float16"),
    ("EnforceFinite", [INTS], {}, DTypeError, "EnforceFinite takes a float32 or float64"),
    ("Bucketize", [X34], {"boundaries": [1.0, 0.5]}, ArgumentError, r"boundaries\[1\] = 0.5 is below"),
    ("Bucketize", [np.float32(1.0)], {"boundaries": [1.0]}, ShapeError, "at least 1 dimension"),
    ("Bucketize", [INTS], {"boundaries": [1.0]}, DTypeError, "float tensor, got int64"),
    ("BatchBoxCox", [BOX, L1[:3], L2], {}, ShapeError, r"lambda1 has shape \(3,\) .* 4 columns"),
    ("BatchBoxCox", [BOX, L1, L2.astype(np.float64)], {}, DTypeError, "input 2 has dtype float64"),
    ("BatchBoxCox", [BOX.astype(np.int32), L1, L2], {}, DTypeError, "int32"),
    ("Mean", [X34, X34[:2]], {}, ShapeError, r"input 1 has shape \(2, 4\) but input 0 has \(3, 4\)"),
    ("Mean", [X34, X34.astype(np.float64)], {}, DTypeError, "share one type"),
    ("Mean", [INTS], {}, DTypeError, "must be one of float32, float64"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, match, device):
    outputs = 0 if op_type == "EnforceFinite" else 1
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, outputs, device=device, **args)


@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, args, error, match):
    outputs = 0 if op_type == "EnforceFinite" else 1
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs, outputs, **args)


# --------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("op_type, kind", [("Mod", SHOULD_NOT_DO_GRADIENT), ("ReplaceNaN", SHOULD_NOT_DO_GRADIENT),
                                           ("EnforceFinite", SHOULD_NOT_DO_GRADIENT), ("Bucketize", NO_GRADIENT),
                                           ("BatchBoxCox", GRADIENT_NOT_IMPLEMENTED)])
def test_no_gradient_kinds_are_caffe2s(op_type, kind):
    assert REGISTRY.get(op_type).gradient == kind


# ------------------------------------------------------------------------------------------ test the tester
WRONG = [
    ("mod_sign_follow", lambda xp, x, *, divisor, sign_follow_divisor: xp.fmod(x, divisor)),
    ("gelu", lambda xp, x, *, fast_gelu: 0.5 * x * (1 + xp.tanh(0.7978846 * (x + 0.044715 * x ** 3)))),
    ("bucketize", lambda xp, x, *, boundaries: xp.searchsorted(xp.asarray(np.float32(boundaries)), x, side="right")
     .astype(np.int32)),
    ("box_cox", lambda xp, d, l1, l2, *, min_block_size: xp.log(xp.maximum(d + l2, 1e-6))),
    ("mean", lambda xp, *xs: sum(xs[1:], xs[0]) / np.float32(len(xs) + 1)),
    ("replace_nan", lambda xp, x, *, value: xp.nan_to_num(x, nan=value)),
]


@pytest.mark.parametrize("case_id, wrong", WRONG, ids=[w[0] for w in WRONG])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    want = want or expected(op_type, inputs, args)
    check(op_type, inputs, args, want, "cpu", 2e-6)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu", 2e-6)


def test_enforce_finite_check_catches_a_kernel_that_lets_nan_through(broken):
    broken("EnforceFinite", lambda xp, x: None)
    with pytest.raises(pytest.fail.Exception):
        with pytest.raises(OpError):
            run_op("EnforceFinite", [NANS], 0)


# --------------------------------------------------------------------------------------------- Ceil, Floor
ROUNDING = np.array([[-2.5, -1.0, -0.2, 0.0], [0.3, 1.0, 2.7, np.inf], [-np.inf, np.nan, 1e20, -7.5]], np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, fn", [("Ceil", math.ceil), ("Floor", math.floor)])
def test_ceil_and_floor(op_type, fn, device):
    want = each(lambda v: v if not math.isfinite(v) else float(fn(v)), ROUNDING, dtype=np.float32)
    check(op_type, [ROUNDING], {}, [want], device)
    assert REGISTRY.get(op_type).gradient == GRADIENT_NOT_IMPLEMENTED
    with pytest.raises(DTypeError, match="X must be a float tensor"):
        run_op(op_type, [np.arange(3, dtype=np.int32)])


def test_ceil_reference_catches_a_broken_kernel(broken):
    broken("Ceil", lambda xp, x: xp.floor(x))
    with pytest.raises(AssertionError):
        check("Ceil", [ROUNDING[:1]], {}, [np.array([[-2.0, -1.0, -0.0, 0.0]], np.float32)], "cpu")
