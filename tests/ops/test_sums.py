"""Sum, SumInt, WeightedSum, Scale, ElementwiseLinear and Cast (stepnet/ops/sums.py) against loop references
computed in Python floats (float64) on every device; bad inputs (also caught statically); in-place rules and
the in-place kernels (Caffe2 writes into input 0's buffer: same results, the array updated where it is, no
corruption when input 0 is also another input); their gradients against float64 finite differences and the ops
their makers emit; and checkers that catch broken kernels."""
import numpy as np
import pytest
from loop_reference import table_check, view2d

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import DeviceOption, argument_value
from stepnet.testing import DEVICES, check_gradient, infer_static, make_op, run_op

rng = np.random.default_rng(11)


def f32(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def w1(value):
    return np.array([value], dtype=np.float32)


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


# --------------------------------------------------------------------------------------------- references
def ref_elementwise(fn, *arrays):
    out = np.empty(arrays[0].shape, dtype=np.float64)
    for idx in np.ndindex(*arrays[0].shape):
        out[idx] = fn(*(a[idx].item() for a in arrays))
    return out


def ref_ewlinear(X, a, b, axis=1):
    rows, D = view2d(X, axis)
    return np.array([[r[d] * float(a[d]) + float(b[d]) for d in range(D)] for r in rows]).reshape(X.shape)


def ref_weighted(*inputs):
    pairs = [(inputs[k], float(inputs[k + 1].ravel()[0])) for k in range(0, len(inputs), 2)]
    shape = inputs[0].shape
    flat = [sum(w * float(x.ravel()[i]) for x, w in pairs) for i in range(inputs[0].size)]
    return np.array(flat, dtype=np.float64).reshape(shape)


# --------------------------------------------------------------------------------------------- cases
X234 = f32(2, 3, 4)
_A, _B, _C = f32(2, 3), f32(2, 3), f32(2, 3)
_I, _J = rng.integers(-50, 50, (3, 4)).astype(np.int32), rng.integers(-50, 50, (3, 4)).astype(np.int32)
_X6 = f32(6)
CASES = [
    # (id, op, inputs, args, reference, tolerance)
    ("sum1", "Sum", [_A], {}, lambda: ref_elementwise(lambda a: a, _A), 0),
    ("sum3", "Sum", [_A, _B, _C], {}, lambda: ref_elementwise(lambda a, b, c: a + b + c, _A, _B, _C), 1e-6),
    ("sum_int", "Sum", [_I, _J], {}, lambda: ref_elementwise(lambda a, b: a + b, _I, _J), 0),
    ("sumint", "SumInt", [_I, _J, _I], {}, lambda: ref_elementwise(lambda a, b, c: a + b + c, _I, _J, _I), 0),
    ("wsum1", "WeightedSum", [_A, w1(0.5)], {}, lambda: ref_weighted(_A, w1(0.5)), 1e-6),
    ("wsum3", "WeightedSum", [_A, w1(2.0), _B, w1(-1.5), _C, w1(0.25)], {"grad_on_w": 1},
     lambda: ref_weighted(_A, w1(2.0), _B, w1(-1.5), _C, w1(0.25)), 1e-6),
    ("wsum_numel", "WeightedSum", [_A, w1(1.0), _X6, np.full((1, 1), 3.0, np.float32)], {},
     lambda: ref_weighted(_A, w1(1.0), _X6.reshape(2, 3), w1(3.0)), 1e-6),
    ("scale", "Scale", [_A], {"scale": -2.5}, lambda: ref_elementwise(lambda a: -2.5 * a, _A), 1e-6),
    ("scale_default", "Scale", [_A], {}, lambda: ref_elementwise(lambda a: a, _A), 0),
    ("ewlinear", "ElementwiseLinear", [X234, f32(12), f32(12)], {}, None, 1e-6),
    ("ewlinear_axis2", "ElementwiseLinear", [X234, f32(4), f32(4)], {"axis": 2}, None, 1e-6),
]
_REFS = {
    "ElementwiseLinear": lambda ins, a: ref_ewlinear(*ins, **a),
}


check = table_check(_REFS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, ref, tol = case
    check(op_type, inputs, args, ref, tol, device)


# --------------------------------------------------------------------------------------------- Cast
CAST_X = np.array([[-2.7, -0.5, 0.0], [0.4, 1.9, 130.6]], dtype=np.float32)
CAST_CASES = [
    ("float", CAST_X, 1, np.float32, float),
    ("INT32", CAST_X, "int32", np.int32, int),
    ("int64 upper", CAST_X, "INT64", np.int64, int),
    ("int64 code", CAST_X, 10, np.int64, int),
    ("bool name", CAST_X, "bool", np.bool_, lambda v: v != 0),
    ("double", CAST_X, "Double", np.float64, float),
    ("int16", CAST_X, 9, np.int16, int),
    ("uint8 from int", np.array([0, 7, 255], np.int32), "uint8", np.uint8, int),
    ("from bool", np.array([True, False, True]), "float", np.float32, float),
    ("int to float", np.array([[-3, 2]], np.int64), "FLOAT", np.float32, float),
    ("float16", CAST_X, 12, np.float16, float),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CAST_CASES, ids=[c[0] for c in CAST_CASES])
def test_cast(case, device):
    _, x, to, dtype, convert = case
    got = run_op("Cast", [x], device=device, to=to)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    want = np.array([convert(v.item()) for v in x.ravel()], dtype=np.float64).reshape(x.shape)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3 if dtype == np.float16 else 0)


def test_cast_from_type_is_accepted():
    got = run_op("Cast", [CAST_X], to="int32", from_type="float")
    assert got.dtype == np.int32


# --------------------------------------------------------------------------------------------- bad input
BAD = [
    ("Sum", [_A, f32(3, 2)], {}, ShapeError, r"does not broadcast.*input 1 has shape \(3, 2\)"),
    ("Sum", [_A, _A.astype(np.float64)], {}, DTypeError, r"input 1 is float64"),
    ("Sum", [np.ones(3, np.uint8)], {}, DTypeError, r"Sum supports"),
    ("SumInt", [_A], {}, DTypeError, r"SumInt supports"),
    ("WeightedSum", [_A, w1(1.0), _B], {}, ArityError, r"pairs"),
    ("WeightedSum", [_A, np.ones(2, np.float32)], {}, ShapeError, r"w0.*1 element"),
    ("WeightedSum", [_A, w1(1.0), f32(5), w1(1.0)], {}, ShapeError, r"X1 \(5,\).*as many elements"),
    ("ElementwiseLinear", [X234, f32(4), f32(12)], {}, ShapeError, r"a must be 1-D of length 12"),
    ("Cast", [CAST_X], {"to": "int"}, ArgumentError, r"unknown to='int'.*INT32"),
    ("Cast", [CAST_X], {"to": 4}, ArgumentError, r"strings"),
    ("Cast", [CAST_X], {"to": 3}, ArgumentError, r"BYTE is deprecated"),
    ("Cast", [CAST_X], {"to": 0}, ArgumentError, r"UNDEFINED"),
    ("Cast", [CAST_X], {"to": 11}, ArgumentError, r"not a castable"),
    ("Cast", [CAST_X], {"to": 1.0}, ArgumentError, r"DataType number or name"),
    ("Cast", [CAST_X], {}, ArgumentError, r"required argument 'to'"),
    ("Cast", [CAST_X], {"to": 1, "from_type": "floaty"}, ArgumentError, r"from_type"),
    ("Cast", [np.array(["a"], dtype=object)], {"to": 1}, DTypeError, r"strings"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, pattern", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(op_type, inputs, args, error, pattern, device):
    with pytest.raises(error, match=pattern):
        run_op(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("op_type, inputs, args, error, pattern", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_caught_statically(op_type, inputs, args, error, pattern):
    """Every bad input is refused by the shape function too, with the kernel's error, before anything runs."""
    with pytest.raises(error, match=pattern):
        infer_static(op_type, inputs, **args)


def test_static_cast_and_sum_follow_small_integer_values():
    shape = np.array([2, 3, 4], np.int64)
    (as_int32,) = infer_static("Cast", [shape], to="int32")
    assert as_int32.dtype == np.int32 and as_int32.value.tolist() == [2, 3, 4]
    (as_float,) = infer_static("Cast", [shape], to=1)
    assert as_float.dtype == np.float32 and as_float.shape == (3,) and as_float.value is None
    (total,) = infer_static("Sum", [shape, shape, np.array([1, 0, -1], np.int64)])
    assert total.value.tolist() == [5, 6, 7]


@pytest.mark.parametrize("op_type, inputs, args", [("Cast", [CAST_X], {"to": 1})])
def test_in_place_refused_where_caffe2_refuses(op_type, inputs, args):
    names = {f"in{i}": v for i, v in enumerate(inputs)}
    with pytest.raises(ArgumentError, match="in place"):
        run_op(op_type, names, ["in0"], **args)


@pytest.mark.parametrize("op_type, inputs, args", [("Sum", [_A, _B], {}), ("Scale", [_A], {"scale": 2.0}),
                                                   ("WeightedSum", [_A, w1(2.0), _B, w1(1.0)], {})])
def test_in_place_on_input_0_allowed(op_type, inputs, args):
    names = {f"in{i}": v for i, v in enumerate(inputs)}
    got = run_op(op_type, names, ["in0"], **args)
    assert got.shape == _A.shape


# --------------------------------------------------------------------------------------------- in-place kernels
def run(device, op, feeds):
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for k, v in feeds.items():
        ws.feed(k, v, device_option=do)
    before = ws.get_blob(op.input[0]).value
    net = NetDef(name="n")
    net.op.append(op)
    ws.run_net_once(net)
    return ws, before


@pytest.mark.parametrize("device", DEVICES)
def test_sum_in_place_matches_definition_and_updates_the_buffer(device):
    a, b, c = (np.random.default_rng(i).standard_normal((3, 4)).astype(np.float32) for i in range(3))
    ws, before = run(device, make_op("Sum", ["a", "b", "c"], ["a"], device=device), {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(ws.fetch("a"), a + b + c, rtol=1e-6)
    assert ws.get_blob("a").value is before  # written where it was, as Caffe2's in-place Sum
    ws, _ = run(device, make_op("Sum", ["a", "b"], ["s"], device=device), {"a": a, "b": b})
    np.testing.assert_array_equal(ws.fetch("a"), a)  # out of place: input untouched


def test_in_place_kernels_guard_an_input_0_that_is_also_another_input():
    """Nets cannot name input 0 twice in an in-place Sum (Caffe2's in-place rule), but arrays can alias."""
    from stepnet.ops import REGISTRY
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(REGISTRY.get("Sum").inplace_kernel(np, a.copy(), a, a), 3 * a)
    x = a.copy()
    np.testing.assert_array_equal(REGISTRY.get("Sum").inplace_kernel(np, x, x, x), 3 * a)
    half = np.array([0.5], np.float32)
    x = a.copy()
    np.testing.assert_allclose(REGISTRY.get("WeightedSum").inplace_kernel(np, x, half, x, half), a)
    frozen = a.copy()
    frozen.flags.writeable = False
    np.testing.assert_array_equal(REGISTRY.get("Sum").inplace_kernel(np, frozen, a), 2 * a)  # falls back


@pytest.mark.parametrize("device", DEVICES)
def test_weighted_sum_in_place_is_the_sgd_update(device):
    rng = np.random.default_rng(5)
    p, g = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    one, lr = np.ones(1, np.float32), np.array([-0.1], np.float32)
    ws, before = run(device, make_op("WeightedSum", ["p", "one", "g", "lr"], ["p"], device=device),
                     {"p": p, "one": one, "g": g, "lr": lr})
    np.testing.assert_allclose(ws.fetch("p"), p - 0.1 * g, rtol=1e-6)
    assert ws.get_blob("p").value is before


# ----------------------------------------------------------------------------------------- finite differences
GRAD_CASES = [
    ("Sum", [f32(2, 3), f32(2, 3), f32(2, 3)], {}),
    ("WeightedSum", [f32(2, 3), f32(1), f32(2, 3), f32(1)], {"grad_on_w": 1}),
    ("WeightedSum", [f32(2, 3), f32(1), f32(6), f32(1), f32(3, 2), f32(1)], {"grad_on_w": 1}),
    ("Scale", [f32(2, 3)], {"scale": -1.5}),
    ("ElementwiseLinear", [f32(3, 4), f32(4), f32(4)], {}),
    ("ElementwiseLinear", [f32(2, 2, 3), f32(6), f32(6)], {"axis": 1}),
    ("ElementwiseLinear", [f32(2, 2, 3), f32(3), f32(3)], {"axis": 2}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args", GRAD_CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_gradient_matches_finite_differences(op_type, inputs, args, device):
    check_gradient(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("device", DEVICES)
def test_weighted_sum_without_grad_on_w_gives_only_data_gradients(device):
    inputs = [f32(2, 3), f32(1), f32(2, 3), f32(1)]
    check_gradient("WeightedSum", inputs, wrt=[0, 2], device=device)
    ops, grads = backward_ops([make_op("WeightedSum", ["x0", "w0", "x1", "w1"], ["y"])], {"y": "y_grad"})
    assert grads.get("w0") is None and grads.get("w1") is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("to, from_type", [("float", "double"), ("DOUBLE", 13), (13, "double")])
def test_cast_gradient_casts_back(to, from_type, device):
    # linear, so a large step only avoids float32 rounding in the finite differences
    check_gradient("Cast", [f32(3, 4)], to=to, from_type=from_type, eps=1e-2, device=device)


# ------------------------------------------------------------------------------------------------ emitted ops
def test_sum_passes_the_gradient_through_and_others_emit_caffe2s_ops():
    ops, grads = backward_ops([make_op("Sum", ["a", "b", "c"], ["y"])], {"y": "g"})
    assert ops == [] and grads["a"] == grads["b"] == grads["c"] == "g"
    fwd = make_op("WeightedSum", ["x0", "w0", "x1", "w1"], ["y"], grad_on_w=1)
    ops, _ = backward_ops([fwd], {"y": "g"})
    assert sig(ops) == [("WeightedSumGradient", ["g", "x0", "w0", "x1", "w1"],
                         ["x0_grad", "x1_grad", "w0_grad", "w1_grad"], {"grad_on_w": 1})]
    ops, _ = backward_ops([make_op("Scale", ["x"], ["y"], scale=0.5)], {"y": "g"})
    assert sig(ops) == [("Scale", ["g"], ["x_grad"], {"scale": 0.5})]
    ops, _ = backward_ops([make_op("ElementwiseLinear", ["x", "a", "b"], ["y"], axis=2)], {"y": "g"})
    assert sig(ops) == [("ElementwiseLinearGradient", ["g", "x", "a"], ["x_grad", "a_grad", "b_grad"],
                         {"axis": 2})]


def test_cast_gradient_swaps_the_types_as_numbers_and_needs_from_type():
    ops, _ = backward_ops([make_op("Cast", ["x"], ["y"], to="float16", from_type="FLOAT")], {"y": "g"})
    assert sig(ops) == [("Cast", ["g"], ["x_grad"], {"to": 1, "from_type": 12})]
    with pytest.raises(GradientError, match="from_type"):
        backward_ops([make_op("Cast", ["x"], ["y"], to=1)], {"y": "g"})


def test_sum_int_has_no_gradient_registered():
    with pytest.raises(GradientError, match="no gradient registered"):
        backward_ops([make_op("SumInt", ["a", "b"], ["y"])], {"y": "g"})


@pytest.mark.parametrize("kind, op_type", [(None, "SumInt")])
def test_no_gradient_kinds_are_caffe2s(kind, op_type):
    assert REGISTRY.get(op_type).gradient == kind


# ------------------------------------------------------------------------------------------------- the testers
@pytest.mark.parametrize("case_id, wrong", [
    ("sum3", lambda xp, *xs: xs[0] + xs[1]),                                    # drops the last input
    ("sum_int", lambda xp, *xs: xs[0] - xs[1]),                                 # subtracts
    ("wsum3", lambda xp, *ins, grad_on_w=False: ins[0] + ins[2] + ins[4]),       # ignores the weights
    ("scale", lambda xp, X, scale=1.0: X * xp.float32(-2.0)),                   # a rounded scale
    ("ewlinear_axis2", lambda xp, X, a, b, axis=1: X * a.reshape(1, 1, -1)),    # forgets b
])
def test_reference_catches_broken_kernels(case_id, wrong, broken):
    _, op_type, inputs, args, ref, tol = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, ref, tol, "cpu")   # the real kernel passes ...
    broken(op_type, wrong)
    with pytest.raises(AssertionError):             # ... the wrong one does not
        check(op_type, inputs, args, ref, tol, "cpu")


def test_cast_reference_catches_rounding_instead_of_truncation(broken):
    case = CAST_CASES[[c[0] for c in CAST_CASES].index("INT32")]
    test_cast(case, "cpu")
    broken("Cast", lambda xp, X, to, from_type=None: xp.rint(X).astype(np.int32))
    with pytest.raises(AssertionError):
        test_cast(case, "cpu")


def _elementwise_linear_gradient_halving_da(xp, dY, X, a, axis=1):
    """dX and db right, da half of its value (an independent numpy form of the gradient)."""
    g, x = dY.reshape(-1, a.size), X.reshape(-1, a.size)
    return (g * a).reshape(X.shape), (g * x).sum(axis=0) * 0.5, g.sum(axis=0)


def _weighted_sum_gradient_swapping_dw(ctx, xp, dY, *pairs, grad_on_w=False):
    """dX right, the weights' gradients given to each other's weight."""
    xs, ws = pairs[0::2], pairs[1::2]
    dxs = [(dY * w).reshape(x.shape) for x, w in zip(xs, ws)]
    dws = [(dY * x.reshape(dY.shape)).sum().reshape(1) for x in xs]
    return tuple(dxs + dws[::-1])


@pytest.mark.parametrize("op_type, inputs, args, gradient_op, wrong, bad_input", [
    ("ElementwiseLinear", [f32(3, 4), f32(4), f32(4)], {}, "ElementwiseLinearGradient",
     _elementwise_linear_gradient_halving_da, 1),
    ("WeightedSum", [f32(2, 3), f32(1), f32(2, 3), f32(1)], {"grad_on_w": 1}, "WeightedSumGradient",
     _weighted_sum_gradient_swapping_dw, 1),
])
def test_check_gradient_catches_broken_gradient_kernels(op_type, inputs, args, gradient_op, wrong, bad_input,
                                                        broken):
    check_gradient(op_type, inputs, **args)
    broken(gradient_op, wrong)
    with pytest.raises(AssertionError, match=rf"{op_type}: gradient of input {bad_input}"):
        check_gradient(op_type, inputs, **args)


def test_a_wrong_in_place_kernel_is_caught(patched):
    patched("Sum", inplace_kernel=lambda xp, *ins: ins[0])  # forgets to add
    a, b = np.ones(3, np.float32), np.ones(3, np.float32)
    ws, _ = run("cpu", make_op("Sum", ["a", "b"], ["a"]), {"a": a, "b": b})
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(ws.fetch("a"), a + b)
