"""Gradients of Add/Sub/Mul/Div, Pow, Max/Min: gradient ops against loop references, makers against finite
differences (both broadcasting conventions), the emitted ops against Caffe2's makers, and the 2017-18 gradient
nets (SumReduceLike / Mul / Negative / 3-input DivGradient) against today's makers."""
import warnings

import numpy as np
import pytest

from stepnet import NetDef, StepnetWarning, Workspace
from stepnet.core.errors import ShapeError
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.ops import REGISTRY
from stepnet.ops.registry import SHOULD_NOT_DO_GRADIENT
from stepnet.io.proto import DeviceOption, argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(5)


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def away_from_zero(*shape, dtype=np.float32):
    return (rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


# --------------------------------------------------------------------------------------------- references
def b_position(legacy, a_ndim, b_shape, axis=-1, axis_str="", order="NCHW"):
    """idx of C -> idx of B, by the rule's definition: legacy places B's dims at `axis` in A; numpy aligns
    from the right. Size-1 dims of B always read index 0."""
    if legacy:
        start = order.index(axis_str) if axis_str else (a_ndim - len(b_shape) if axis == -1 else axis)
        return lambda idx: tuple(0 if d == 1 else idx[start + j] for j, d in enumerate(b_shape))
    return lambda idx: tuple(0 if d == 1 else idx[len(idx) - len(b_shape) + j] for j, d in enumerate(b_shape))


def ref_binary(kind, dC, A, B, legacy, **args):
    """(C, dA, dB) by looping over C's elements and accumulating each partial derivative."""
    a_at = b_position(False, dC.ndim, A.shape)
    b_at = b_position(legacy, dC.ndim, B.shape, **args)
    C = np.zeros(dC.shape)
    dA, dB = np.zeros(A.shape), np.zeros(B.shape)
    for idx in np.ndindex(*dC.shape):
        ia, ib = a_at(idx), b_at(idx)
        a, b, g = float(A[ia]), float(B[ib]), float(dC[idx])
        C[idx], da, db = {"Add": (a + b, g, g), "Sub": (a - b, g, -g), "Mul": (a * b, g * b, g * a),
                          "Div": (a / b, g / b, -g * a / (b * b))}[kind]
        dA[ia] += da
        dB[ib] += db
    return C, dA, dB


# (id, A shape, B shape, forward arguments); C has the broadcast shape
CASES = [
    ("same", (2, 3), (2, 3), {}),
    ("same_broadcast0", (2, 3), (2, 3), {"broadcast": 0}),
    ("numpy_both_sides", (2, 1, 4), (3, 1), {}),
    ("numpy_a_smaller", (3,), (2, 3), {}),
    ("numpy_scalar_b", (2, 3), (), {}),
    ("legacy_suffix", (2, 3, 4), (3, 4), {"broadcast": 1}),
    ("legacy_axis", (2, 3, 4), (3,), {"broadcast": 1, "axis": 1}),
    ("legacy_axis_str", (2, 3, 2, 2), (3,), {"broadcast": 1, "axis_str": "C", "order": "NCHW"}),
    ("legacy_scalar", (2, 3), (1,), {"broadcast": 1}),
    ("legacy_unit_dims", (2, 3, 4), (1, 3, 1), {"broadcast": 1, "axis": 0}),
]
C_SHAPE = {"same": (2, 3), "same_broadcast0": (2, 3), "numpy_both_sides": (2, 3, 4),
           "numpy_a_smaller": (2, 3), "numpy_scalar_b": (2, 3), "legacy_suffix": (2, 3, 4),
           "legacy_axis": (2, 3, 4), "legacy_axis_str": (2, 3, 2, 2), "legacy_scalar": (2, 3),
           "legacy_unit_dims": (2, 3, 4)}


def legacy_args(args):
    return bool(args.get("broadcast")), {k: v for k, v in args.items() if k != "broadcast"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradient_op_matches_loop_reference(case, kind, device):
    name, a_shape, b_shape, args = case
    A, B, dC = normal(*a_shape), away_from_zero(*b_shape), normal(*C_SHAPE[name])
    legacy, where = legacy_args(args)
    C, want_a, want_b = ref_binary(kind, dC, A, B, legacy, **where)
    ins = [dC, A, B] + ([C.astype(np.float32)] if kind == "Div" else [])
    dA, dB = run_op(f"{kind}Gradient", ins, 2, device=device, **args)
    for got, want in ((dA, want_a), (dB, want_b)):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


THREE_INPUT = [c for c in CASES if c[1] == C_SHAPE[c[0]]]  # no A input: A must have C's shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", THREE_INPUT, ids=[c[0] for c in THREE_INPUT])
def test_div_gradient_2017_form_b_c_dc(case, device):
    """DivGradient([B, C, dC]) -> [dA, dB], what the 2017-18 maker emitted; dA takes C's shape."""
    name, a_shape, b_shape, args = case
    A, B, dC = normal(*a_shape), away_from_zero(*b_shape), normal(*a_shape)
    legacy, where = legacy_args(args)
    C, want_a, want_b = ref_binary("Div", dC, A, B, legacy, **where)
    dA, dB = run_op("DivGradient", [B, C.astype(np.float32), dC], 2, device=device, **args)
    np.testing.assert_allclose(dA, want_a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dB, want_b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_check_gradient_both_inputs(case, kind, device):
    _, a_shape, b_shape, args = case
    check_gradient(kind, [normal(*a_shape), away_from_zero(*b_shape)], wrt=[0, 1], device=device, **args)


@pytest.mark.parametrize("device", DEVICES)
def test_mul_of_a_blob_with_itself_accumulates(device):
    """Mul(x, x) writes two gradients of x; the backward pass sums them: d(x^2) = 2x."""
    x, dy = normal(2, 3), normal(2, 3)
    grads = net_gradients([make_op("Mul", ["x", "x"], ["y"], device=device)], {"x": x}, {"y": dy}, device)
    np.testing.assert_allclose(grads["x"], 2 * x * dy, rtol=1e-5)


# --------------------------------------------------------------------------------------------- Pow
POW_CASES = [
    ("exponent_arg", [rng.uniform(0.5, 2.0, (2, 3))], {"exponent": 2.5}, {}),
    ("negative_exponent", [rng.uniform(0.5, 2.0, (3,))], {"exponent": -1.5}, {}),
    ("integer_exponent_negative_x", [away_from_zero(2, 3, dtype=np.float64)], {"exponent": 3.0}, {}),
    ("tensor_exponent", [rng.uniform(0.5, 2.0, (2, 3)).astype(np.float32),
                         rng.uniform(0.5, 2.0, (2, 3)).astype(np.float32)], {}, {"float64": False}),
    ("tensor_exponent_legacy", [rng.uniform(0.5, 2.0, (2, 3, 2)).astype(np.float32),
                                rng.uniform(0.5, 2.0, (3,)).astype(np.float32)],
     {"broadcast": 1, "axis": 1}, {"float64": False}),
]
LOOSE = {"eps": 1e-2, "rtol": 2e-2, "atol": 1e-3}  # float32 finite differences (Caffe2 fills e - 1 as FLOAT)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", POW_CASES, ids=[c[0] for c in POW_CASES])
def test_pow_check_gradient(case, device):
    _, ins, args, opts = case
    tol = LOOSE if opts.get("float64") is False else {}
    check_gradient("Pow", ins, wrt=list(range(len(ins))), device=device, **args, **opts, **tol)


@pytest.mark.parametrize("device", DEVICES)
def test_pow_in_place_uses_the_output(device):
    """Pow(X) -> X in place: Caffe2 raises Y to (e-1)/e to recover X**(e-1)."""
    x, dy = rng.uniform(0.5, 2.0, (2, 3)).astype(np.float32), normal(2, 3)
    grads = net_gradients([make_op("Pow", ["X"], ["X"], device=device, exponent=3.0)], {"X": x}, {"X": dy},
                          device)
    np.testing.assert_allclose(grads["X"], 3 * x ** 2 * dy, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["Add", "Sub", "Div"])
def test_in_place_add_sub_div_need_only_the_shape_of_a(kind, device):
    A, B, dC = normal(2, 3), away_from_zero(3), normal(2, 3)
    forward = [make_op(kind, ["A", "B"], ["A"], device=device, broadcast=1)]
    got = net_gradients(forward, {"A": A, "B": B}, {"A": dC}, device)
    _, want_a, want_b = ref_binary(kind, dC, A, B, True)
    np.testing.assert_allclose(got["A"], want_a, rtol=1e-5)
    np.testing.assert_allclose(got["B"], want_b, rtol=1e-4)


@pytest.mark.parametrize("kind,ins", [("Mul", ["A", "B"]), ("Mul", ["B", "A"]), ("Max", ["A", "B"]),
                                      ("Min", ["A"])])
def test_in_place_forward_whose_gradient_needs_the_inputs_is_refused(kind, ins):
    with pytest.raises(GradientError, match="in place"):
        backward_ops([make_op(kind, ins, ["A"])], {"A": "dA"})


def test_pow_in_place_errors():
    with pytest.raises(GradientError, match="in place"):
        backward_ops([make_op("Pow", ["X", "E"], ["X"])], {"X": "dX"})
    with pytest.raises(GradientError, match="exponent 0"):
        backward_ops([make_op("Pow", ["X"], ["X"], exponent=0.0)], {"X": "dX"})


# --------------------------------------------------------------------------------------------- Max, Min
def distinct(*shape, k):
    """k arrays whose elements are all different (no ties: Max/Min are differentiable there)."""
    vals = rng.permutation(np.linspace(-2.0, 2.0, k * int(np.prod(shape))))
    return [v.reshape(shape) for v in np.split(vals, k)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["Max", "Min"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_max_min_check_gradient(kind, k, device):
    check_gradient(kind, distinct(2, 3, k=k), wrt=list(range(k)), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["MaxGradient", "MinGradient"])
def test_max_min_gradient_ops_give_ties_the_full_gradient(kind, device):
    xs = [np.array([1.0, 5.0, 2.0, 2.0], np.float32), np.array([3.0, 5.0, 0.0, 2.0], np.float32)]
    pick = max if kind == "MaxGradient" else min
    y = np.array([pick(a, b) for a, b in zip(*xs, strict=True)], np.float32)
    dy = normal(4)
    got = run_op(kind, [y, dy, *xs], 2, device=device)
    for x, g in zip(xs, got, strict=True):
        want = np.array([d if v == w else 0.0 for v, w, d in zip(x, y, dy, strict=True)], np.float32)
        np.testing.assert_array_equal(g, want)


# --------------------------------------------------------------------------------------------- makers
def emitted(op_type, ins, outs, **args):
    ops, grads = backward_ops([make_op(op_type, ins, outs, **args)], {o: o + "_grad" for o in outs})
    return [(g.type, list(g.input), list(g.output), {a.name: argument_value(a) for a in g.arg})
            for g in ops], grads


def test_emitted_ops_match_caffe2_makers():
    ops, grads = emitted("Add", ["A", "B"], ["C"], broadcast=1, axis=1)
    assert ops == [("AddGradient", ["C_grad", "A", "B"], ["A_grad", "B_grad"], {"broadcast": 1, "axis": 1})]
    assert grads["A"] == "A_grad" and grads["B"] == "B_grad"
    for kind in ("Sub", "Mul"):
        assert emitted(kind, ["A", "B"], ["C"])[0] == [
            (f"{kind}Gradient", ["C_grad", "A", "B"], ["A_grad", "B_grad"], {})]
    assert emitted("Div", ["A", "B"], ["C"])[0] == [
        ("DivGradient", ["C_grad", "A", "B", "C"], ["A_grad", "B_grad"], {})]
    assert emitted("Max", ["X0", "X1", "X2"], ["Y"])[0] == [
        ("MaxGradient", ["Y", "Y_grad", "X0", "X1", "X2"], ["X0_grad", "X1_grad", "X2_grad"], {})]
    assert emitted("Min", ["X0"], ["Y"])[0] == [("MinGradient", ["Y", "Y_grad", "X0"], ["X0_grad"], {})]


def test_pow_maker_emits_caffe2_ops_without_forward_arguments():
    ops, _ = emitted("Pow", ["X"], ["Y"], exponent=3.0)
    assert [(t, a) for t, _, _, a in ops] == [
        ("Pow", {"exponent": 2.0}), ("Mul", {}), ("Scale", {"scale": 3.0})]
    assert ops[0][1] == ["X"] and ops[1][1][1] == "Y_grad" and ops[-1][2] == ["X_grad"]
    ops, grads = emitted("Pow", ["X", "E"], ["Y"], broadcast=1, axis=1)
    assert [t for t, *_ in ops] == [
        "ConstantFill", "Sub", "Pow", "Mul", "Mul", "Log", "Mul", "Mul", "SumReduceLike"]
    where = {"axis": 1, "axis_str": "", "order": "NCHW"}
    assert ops[0][3] == {"value": 1.0} and ops[2][3] == {"broadcast": 1, **where}
    assert ops[-1][1:] == (["E_grad_autogen_pre_red", "E"], ["E_grad"], where)
    assert grads["X"] == "X_grad" and grads["E"] == "E_grad"
    ops, _ = emitted("Pow", ["X", "E"], ["Y"])
    assert [t for t, *_ in ops][-1] == "Mul" and ops[-1][2] == ["E_grad"]


@pytest.mark.parametrize("kind", ["EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Xor", "Not"])
def test_comparisons_and_logic_should_not_do_gradient(kind):
    assert REGISTRY.get(kind).gradient == SHOULD_NOT_DO_GRADIENT
    ins = ["A"] if kind == "Not" else ["A", "B"]
    with pytest.raises(GradientError, match="not differentiable"):
        backward_ops([make_op(kind, ins, ["C"])], {"C": "dC"})


def test_sum_reduce_like_has_no_gradient_registered():
    assert REGISTRY.get("SumReduceLike").gradient is None
    with pytest.raises(GradientError, match="no gradient registered"):
        backward_ops([make_op("SumReduceLike", ["A", "B"], ["C"])], {"C": "dC"})


# --------------------------------------------------------------------------------------------- 2017-18 nets
def net_gradients(forward_ops, feeds, seeds, device, extra_ops=None):
    """Run forward ops, then their gradient ops (from our makers, or extra_ops if given); {blob: gradient}."""
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in {**feeds, **{k + "_seed": v for k, v in seeds.items()}}.items():
        ws.feed(name, value, device_option=do)
    ws.run_net_once(NetDef(name="forward", op=forward_ops))
    if extra_ops is None:
        grad_ops, grads = backward_ops(forward_ops, {k: k + "_seed" for k in seeds})
    else:
        grad_ops, grads = extra_ops, {k: k + "_grad" for k in feeds}
    backward = NetDef(name="backward", op=grad_ops)
    if do is not None:  # the backward pass leaves its Sum ops without a device option (reported to the lead)
        backward.device_option.CopyFrom(do)
    with warnings.catch_warnings():  # e.g. SumReduceLike must accept the `broadcast` copied from Add
        warnings.simplefilter("error", StepnetWarning)
        ws.run_net_once(backward)
    return {k: ws.fetch(grads[k]) for k in feeds}


def legacy_net(kind, device, **args):
    """The exact ops facebookarchive/caffe2's elementwise_op_schema.cc makers emitted for A op B -> C."""
    def mk(type_, ins, outs, name="", **a):
        o = make_op(type_, ins, outs, device=device, **a)
        o.name = name
        o.is_gradient_op = True
        return o
    where = {k: args.get(k, d) for k, d in (("axis", -1), ("axis_str", ""), ("order", "NCHW"))}
    if kind == "Add":  # dA = dC (pass-through); SumReduceLike gets all of Add's arguments
        return [mk("Copy", ["C_seed"], ["A_grad"]), mk("SumReduceLike", ["C_seed", "B"], ["B_grad"], **args)]
    if kind == "Sub":
        return [mk("Copy", ["C_seed"], ["A_grad"]), mk("Negative", ["C_seed"], ["B_grad_autogen_pre_red"]),
                mk("SumReduceLike", ["B_grad_autogen_pre_red", "B"], ["B_grad"], **where)]
    if kind == "Mul":
        return [mk("Mul", ["C_seed", "B"], ["A_grad"], "mul_grad_1st_op", broadcast=args["broadcast"],
                   **where),
                mk("Mul", ["C_seed", "A"], ["B_grad_autogen_pre_red"], "mul_gradient_2nd_op"),
                mk("SumReduceLike", ["B_grad_autogen_pre_red", "B"], ["B_grad"], "mul_with_broadcast_grad_3",
                   **where)]
    return [mk("DivGradient", ["B", "C", "C_seed"], ["A_grad", "B_grad"])]  # Div: no broadcast in 2017


LEGACY = [("Add", {"broadcast": 1, "axis": 1}, (3,)), ("Add", {"broadcast": 1}, (3, 4)),
          ("Sub", {"broadcast": 1, "axis": 0}, (2, 3)), ("Mul", {"broadcast": 1, "axis": 1}, (3,)),
          ("Mul", {"broadcast": 1, "axis_str": "C", "order": "NCHW"}, (3,)), ("Div", {}, (2, 3, 4))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind,args,b_shape", LEGACY, ids=[f"{k}-{i}" for i, (k, *_) in enumerate(LEGACY)])
def test_legacy_gradient_net_agrees_with_makers(kind, args, b_shape, device):
    A, B, dC = normal(2, 3, 4), away_from_zero(*b_shape), normal(2, 3, 4)
    forward = [make_op(kind, ["A", "B"], ["C"], device=device, **args)]
    ours = net_gradients(forward, {"A": A, "B": B}, {"C": dC}, device)
    old = net_gradients(forward, {"A": A, "B": B}, {"C": dC}, device, legacy_net(kind, device, **args))
    _, want_a, want_b = ref_binary(kind, dC, A, B, bool(args), **legacy_args(args)[1])
    for name, want in (("A", want_a), ("B", want_b)):
        np.testing.assert_allclose(ours[name], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(old[name], ours[name], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------- bad input
def test_wrong_gradient_shape_is_named():
    with pytest.raises(ShapeError, match=r"dC has shape \(2, 4\) but A \(2, 3\) and B \(3,\)"):
        run_op("MulGradient", [normal(2, 4), normal(2, 3), normal(3)], 2, broadcast=1)
    with pytest.raises(ShapeError, match="Max and Min take inputs of one shape"):
        run_op("MaxGradient", [normal(3), normal(3), normal(4)], 1)


# --------------------------------------------------------------------------------------------- the testers
def test_check_gradient_catches_a_wrong_mul_gradient(broken):
    good = REGISTRY.get("MulGradient").kernel
    broken("MulGradient", lambda xp, *ins, **kw: (good(xp, *ins, **kw)[0], good(xp, *ins, **kw)[1] * 2))
    check_gradient("Mul", [normal(2, 3), normal(3)], wrt=[0])  # dA is still right
    with pytest.raises(AssertionError, match="input 1"):
        check_gradient("Mul", [normal(2, 3), normal(3)], wrt=[0, 1])


def test_loop_reference_catches_a_sub_gradient_without_the_sign(broken):
    broken("SubGradient", REGISTRY.get("AddGradient").kernel)
    dC, A, B = normal(2, 3), normal(2, 3), normal(3)
    _, _, want_b = ref_binary("Sub", dC, A, B, False)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(run_op("SubGradient", [dC, A, B], 2)[1], want_b, rtol=1e-4)
