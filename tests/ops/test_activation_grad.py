"""Gradients of the unary math and activation ops: every <Op>Gradient op against the mathematical derivative
(computed from X with Python's math module), every maker against finite differences, the emitted ops against
Caffe2's makers, in-place and gradient-accumulation cases."""
import math
import warnings

import numpy as np
import pytest

from stepnet import NetDef, StepnetWarning, Workspace
from stepnet.core.errors import DTypeError, ShapeError
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.ops import REGISTRY
from stepnet.ops.registry import SHOULD_NOT_DO_GRADIENT
from stepnet.io.proto import DeviceOption, argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(23)
SELU_A, SELU_S = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def off_zero(*shape, lo=0.2, hi=2.0):
    return rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)


def positive(*shape):
    return rng.uniform(0.3, 2.0, shape)


def grid(*values):
    return np.array(values, dtype=np.float64).reshape(2, -1)


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def logit(v, eps):
    p = min(max(v, eps), 1 - eps)
    return math.log(p / (1 - p))


def dlogit(v, eps):
    return 1 / (v * (1 - v)) if eps <= v <= 1 - eps else 0.0


# forward op: (x values, forward f(x), derivative f'(x), forward args) -- all from the definitions
OPS = {
    "Relu": (off_zero(2, 3), lambda v: max(v, 0.0), lambda v: 1.0 if v > 0 else 0.0, {}),
    "Sigmoid": (off_zero(2, 3), sigmoid, lambda v: math.exp(-v) / (1 + math.exp(-v)) ** 2, {}),
    "Tanh": (off_zero(2, 3), math.tanh, lambda v: 1 / math.cosh(v) ** 2, {}),
    "Softplus": (off_zero(2, 3), lambda v: math.log1p(math.exp(v)), sigmoid, {}),
    "Elu": (off_zero(2, 3), lambda v: v if v > 0 else 0.7 * math.expm1(v),
            lambda v: 1.0 if v > 0 else 0.7 * math.exp(v), {"alpha": 0.7}),
    "LeakyRelu": (off_zero(2, 3), lambda v: v if v > 0 else 0.1 * v, lambda v: 1.0 if v > 0 else 0.1,
                  {"alpha": 0.1}),
    "Selu": (off_zero(2, 3), lambda v: SELU_S * (v if v > 0 else SELU_A * math.expm1(v)),
             lambda v: SELU_S * (1.0 if v > 0 else SELU_A * math.exp(v)), {}),
    "HardSigmoid": (grid(-3.0, -2.0, -0.5, 0.3, 1.2, 2.5), lambda v: min(max(0.3 * v + 0.4, 0.0), 1.0),
                    lambda v: 0.3 if 0 < 0.3 * v + 0.4 < 1 else 0.0, {"alpha": 0.3, "beta": 0.4}),
    "Clip": (grid(-2.0, -0.5, 0.2, 1.0, 1.4, 2.5), lambda v: min(max(v, -1.0), 1.5),
             lambda v: 1.0 if -1.0 < v < 1.5 else 0.0, {"min": -1.0, "max": 1.5}),
    "Reciprocal": (off_zero(2, 3, lo=0.5), lambda v: 1 / v, lambda v: -1 / v ** 2, {}),
    "Rsqrt": (positive(2, 3), lambda v: v ** -0.5, lambda v: -0.5 * v ** -1.5, {}),
    "Cbrt": (off_zero(2, 3), lambda v: math.copysign(abs(v) ** (1 / 3), v), lambda v: abs(v) ** (-2 / 3) / 3,
             {}),
    "Softsign": (off_zero(2, 3), lambda v: v / (1 + abs(v)), lambda v: 1 / (1 + abs(v)) ** 2, {}),
    "Abs": (off_zero(2, 3), abs, lambda v: math.copysign(1.0, v), {}),
    "Sin": (off_zero(2, 3), math.sin, math.cos, {}),
    "Cos": (off_zero(2, 3), math.cos, lambda v: -math.sin(v), {}),
    # default eps (1e-6): check_gradient's own `eps` keyword would shadow Logit's (reported to the lead)
    "Logit": (grid(-0.1, 0.05, 0.3, 0.6, 0.95, 1.1), lambda v: logit(v, 1e-6), lambda v: dlogit(v, 1e-6), {}),
    "Swish": (off_zero(2, 3), lambda v: v * sigmoid(v), lambda v: sigmoid(v) * (1 + v * sigmoid(-v)), {}),
    "Exp": (off_zero(2, 3), math.exp, math.exp, {}),
    "Log": (positive(2, 3), math.log, lambda v: 1 / v, {}),
    "Sqrt": (positive(2, 3), math.sqrt, lambda v: 0.5 / math.sqrt(v), {}),
    "Sqr": (off_zero(2, 3), lambda v: v * v, lambda v: 2 * v, {}),
    "Negative": (off_zero(2, 3), lambda v: -v, lambda v: -1.0, {}),
}
# gradient op: (forward op, its inputs in order: X, Y = f(X), dY)
GRAD_OPS = {f"{k}Gradient": (k, ("Y", "dY")) for k in (
    "Relu", "Sigmoid", "Tanh", "Softplus", "Elu", "LeakyRelu", "Selu", "HardSigmoid", "Clip", "Reciprocal")}
GRAD_OPS.update({f"{k}Gradient": (k, ("X", "dY")) for k in ("Softsign", "Abs", "Sin", "Cos", "Logit")})
GRAD_OPS.update({"RsqrtGradient": ("Rsqrt", ("dY", "Y")), "CbrtGradient": ("Cbrt", ("dY", "Y")),
                 "SwishGradient": ("Swish", ("X", "Y", "dY"))})


def per_element(fn, x):
    return np.array([fn(v) for v in x.ravel().tolist()]).reshape(x.shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_type", sorted(GRAD_OPS))
def test_gradient_op_is_the_derivative(grad_type, device):
    forward, names = GRAD_OPS[grad_type]
    x, f, df, args = OPS[forward]
    x = x.astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    values = {"X": x, "Y": per_element(f, x).astype(np.float32), "dY": dy}
    got = run_op(grad_type, [values[n] for n in names], device=device, **args)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, per_element(df, x) * dy, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_logit_gradient_with_eps(device):
    x = grid(-0.1, 0.05, 0.3, 0.6, 0.95, 1.1).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    got = run_op("LogitGradient", [x, dy], device=device, eps=0.1)
    np.testing.assert_allclose(got, per_element(lambda v: dlogit(v, 0.1), x) * dy, rtol=1e-4)
    assert got[0, 1] == 0 and got[1, 1] == 0 and got[0, 2] != 0  # 0.05 and 0.95 lie outside [0.1, 0.9]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("forward", sorted(OPS))
def test_check_gradient(forward, device):
    x, _, _, args = OPS[forward]
    check_gradient(forward, [x], device=device, **args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("forward", ["Sigmoid", "Tanh", "Softsign"])
def test_check_gradient_along_random_directions(forward, device):
    check_gradient(forward, [off_zero(4, 5, 2)], device=device, directions=6)


# --------------------------------------------------------------------------------------------- PRelu
def ref_prelu_grad(x, w, dy, order):
    """(dX, dSlope) by looping: slope index from the channel axis, or 0 for a shared slope."""
    c_axis = 1 if order == "NCHW" else x.ndim - 1
    dx, dw = np.zeros(x.shape), np.zeros(w.shape)
    for idx in np.ndindex(*x.shape):
        c = 0 if w.size == 1 else idx[c_axis]
        v, g = float(x[idx]), float(dy[idx])
        dx[idx] = g if v > 0 else float(w.ravel()[c]) * g
        dw.ravel()[c] += 0.0 if v > 0 else g * v
    return dx, dw


PRELU = [("NCHW", (2, 3, 2), (3,)), ("NHWC", (2, 2, 3), (3,)), ("NCHW", (2, 3, 2), (1,)),
         ("NHWC", (3, 4), (4,))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order,x_shape,w_shape", PRELU)
def test_prelu_gradient(order, x_shape, w_shape, device):
    x, w = off_zero(*x_shape), rng.uniform(0.05, 0.5, w_shape)
    check_gradient("PRelu", [x, w], wrt=[0, 1], device=device, order=order)
    x32, w32, dy = x.astype(np.float32), w.astype(np.float32), rng.standard_normal(x_shape).astype(np.float32)
    y = run_op("PRelu", [x32, w32], order=order)
    dx, dw = run_op("PReluGradient", [y, dy, x32, w32], 2, device=device, order=order)
    want_x, want_w = ref_prelu_grad(x32, w32, dy, order)
    np.testing.assert_allclose(dx, want_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dw, want_w, rtol=1e-4, atol=1e-5)
    assert dx.dtype == dw.dtype == np.float32 and dw.shape == w_shape


# --------------------------------------------------------------------------------------------- makers
def emitted(op_type, ins=("X",), outs=("Y",), **args):
    ops, _ = backward_ops([make_op(op_type, list(ins), list(outs), **args)], {o: o + "_grad" for o in outs})
    return [(g.type, list(g.input), list(g.output), {a.name: argument_value(a) for a in g.arg}) for g in ops]


@pytest.mark.parametrize("forward,want", [
    ("Relu", [("ReluGradient", ["Y", "Y_grad"], ["X_grad"], {})]),
    ("Sigmoid", [("SigmoidGradient", ["Y", "Y_grad"], ["X_grad"], {})]),
    ("Tanh", [("TanhGradient", ["Y", "Y_grad"], ["X_grad"], {})]),
    ("Softsign", [("SoftsignGradient", ["X", "Y_grad"], ["X_grad"], {})]),
    ("Abs", [("AbsGradient", ["X", "Y_grad"], ["X_grad"], {})]),
    ("Rsqrt", [("RsqrtGradient", ["Y_grad", "Y"], ["X_grad"], {})]),
    ("Cbrt", [("CbrtGradient", ["Y_grad", "Y"], ["X_grad"], {})]),
    ("Swish", [("SwishGradient", ["X", "Y", "Y_grad"], ["X_grad"], {})]),
    ("Exp", [("Mul", ["Y", "Y_grad"], ["X_grad"], {})]),
    ("Log", [("Div", ["Y_grad", "X"], ["X_grad"], {})]),
    ("Negative", [("Negative", ["Y_grad"], ["X_grad"], {})]),
    ("Sqrt", [("Scale", ["Y_grad"], ["X_grad_autogen_pre"], {"scale": 0.5}),
              ("Div", ["X_grad_autogen_pre", "Y"], ["X_grad"], {})]),
    ("Sqr", [("Scale", ["Y_grad"], ["X_grad_autogen_pre"], {"scale": 2.0}),
             ("Mul", ["X_grad_autogen_pre", "X"], ["X_grad"], {})]),
])
def test_emitted_ops_match_caffe2_makers(forward, want):
    assert emitted(forward) == want


def test_makers_copy_forward_arguments():
    assert emitted("Elu", alpha=0.5) == [("EluGradient", ["Y", "Y_grad"], ["X_grad"], {"alpha": 0.5})]
    assert emitted("Clip", min=0.0, max=6.0)[0][3] == {"min": 0.0, "max": 6.0}
    assert emitted("Logit", eps=0.01)[0][:3] == ("LogitGradient", ["X", "Y_grad"], ["X_grad"])
    assert emitted("PRelu", ["X", "W"], order="NHWC") == [
        ("PReluGradient", ["Y", "Y_grad", "X", "W"], ["X_grad", "W_grad"], {"order": "NHWC"})]


def test_sign_should_not_do_gradient():
    assert REGISTRY.get("Sign").gradient == SHOULD_NOT_DO_GRADIENT
    with pytest.raises(GradientError, match="not differentiable"):
        backward_ops([make_op("Sign", ["X"], ["Y"])], {"Y": "dY"})


# --------------------------------------------------------------------------------------------- nets
def net_gradients(forward_ops, feeds, seeds, device):
    """Run forward ops, then the gradient ops our makers build; {fed blob: its gradient} (host arrays)."""
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in {**feeds, **{k + "_seed": v for k, v in seeds.items()}}.items():
        ws.feed(name, value, device_option=do)
    ws.run_net_once(NetDef(name="forward", op=forward_ops))
    grad_ops, grads = backward_ops(forward_ops, {k: k + "_seed" for k in seeds})
    backward = NetDef(name="backward", op=grad_ops)
    if do is not None:  # the backward pass leaves its Sum ops without a device option (reported to the lead)
        backward.device_option.CopyFrom(do)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepnetWarning)
        ws.run_net_once(backward)
    return {k: ws.fetch(grads[k]) for k in feeds}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("forward", ["Relu", "Sigmoid", "Elu", "Pow"])
def test_in_place_forward_that_reads_the_output(forward, device):
    x = (positive(2, 3) if forward == "Pow" else off_zero(2, 3)).astype(np.float32)  # Y**(2/3) needs Y > 0
    dy = rng.standard_normal((2, 3)).astype(np.float32)
    args = {"exponent": 3.0} if forward == "Pow" else {}
    deriv = {"Relu": lambda v: float(v > 0), "Sigmoid": OPS["Sigmoid"][2], "Elu": OPS["Elu"][2],
             "Pow": lambda v: 3 * v * v}[forward]
    if forward == "Elu":
        args = {"alpha": 0.7}
    got = net_gradients([make_op(forward, ["X"], ["X"], device=device, **args)], {"X": x}, {"X": dy}, device)
    np.testing.assert_allclose(got["X"], per_element(deriv, x) * dy, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("forward", ["Log", "Softsign", "Sqr", "PRelu"])
def test_in_place_forward_whose_gradient_needs_the_input_is_refused(forward):
    ins = ["X", "W"] if forward == "PRelu" else ["X"]
    with pytest.raises(GradientError, match="in place"):
        backward_ops([make_op(forward, ins, ["X"])], {"X": "dX"})


@pytest.mark.parametrize("device", DEVICES)
def test_sqrt_gradient_accumulates_with_another_consumer(device):
    """Sqrt(x) -> y, Add(x, y) -> z: x gets two gradients; the one written in two steps is renamed whole."""
    x, dz = positive(2, 3).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    ops = [make_op("Sqrt", ["x"], ["y"], device=device), make_op("Add", ["x", "y"], ["z"], device=device)]
    got = net_gradients(ops, {"x": x}, {"z": dz}, device)
    np.testing.assert_allclose(got["x"], dz * (1 + 0.5 / np.sqrt(x.astype(np.float64))), rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_sqr_does_not_scale_a_shared_output_gradient(device):
    """Sum(Sqr(x), w) -> z passes dz to both branches; Caffe2's Sqr gradient scaled dz in place (doubling w's
    gradient). Here w's gradient stays dz."""
    x, w, dz = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(3))
    ops = [make_op("Sqr", ["x"], ["s"], device=device), make_op("Sum", ["s", "w"], ["z"], device=device)]
    got = net_gradients(ops, {"x": x, "w": w}, {"z": dz}, device)
    np.testing.assert_allclose(got["w"], dz)
    np.testing.assert_allclose(got["x"], 2 * x * dz, rtol=1e-6)


# --------------------------------------------------------------------------------------------- bad input
def test_bad_gradient_inputs_are_named():
    with pytest.raises(ShapeError, match=r"dY has shape \(3,\) but Y has \(2,\)"):
        run_op("ReluGradient", [np.ones(2, np.float32), np.ones(3, np.float32)])
    with pytest.raises(DTypeError, match="int32"):
        run_op("SigmoidGradient", [np.ones(2, np.int32), np.ones(2, np.int32)])
    with pytest.raises(DTypeError, match="share one type"):
        run_op("TanhGradient", [np.ones(2, np.float32), np.ones(2, np.float64)])
    with pytest.raises(ShapeError, match="channels"):
        run_op("PReluGradient", [np.ones((2, 3), np.float32)] * 3 + [np.ones(2, np.float32)], 2)


def test_selu_gradient_needs_one_size_only_and_shapes_dx_like_y():
    """Caffe2's SeluGradient checks dY.size() == Y.size() and resizes dX like Y (dX may overwrite a dY of
    another shape)."""
    y = np.array([[0.5, -0.25], [-1.0, 2.0]], np.float32)
    dy = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    got = run_op("SeluGradient", [y, dy], alpha=1.5, scale=2.0)
    want = [[2.0 * 1.0, 2.0 * (-0.25 + 3.0)], [3.0 * (-1.0 + 3.0), 2.0 * 4.0]]
    assert got.shape == (2, 2)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(ShapeError, match=r"dY has shape \(3,\) but Y has \(2, 2\)"):
        run_op("SeluGradient", [y, np.ones(3, np.float32)])


# --------------------------------------------------------------------------------------------- the testers
def test_check_gradient_catches_a_wrong_sigmoid_gradient(broken):
    broken("SigmoidGradient", lambda ctx, xp, Y, dY: dY * Y)  # forgot the (1 - Y)
    with pytest.raises(AssertionError, match="Sigmoid: gradient of input 0"):
        check_gradient("Sigmoid", [off_zero(2, 3)])


def test_check_gradient_catches_a_wrong_prelu_slope_gradient(broken):
    good = REGISTRY.get("PReluGradient").kernel
    broken("PReluGradient", lambda xp, *ins, **kw: (good(xp, *ins, **kw)[0], -good(xp, *ins, **kw)[1]))
    with pytest.raises(AssertionError, match="input 1"):
        check_gradient("PRelu", [off_zero(2, 3, 2), rng.uniform(0.1, 0.5, 3)], wrt=[0, 1])


def test_derivative_reference_catches_a_relu_gradient_that_passes_everything(broken):
    broken("ReluGradient", lambda xp, Y, dY: dY.copy())
    x = OPS["Relu"][0].astype(np.float32)
    dy = np.ones_like(x)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(run_op("ReluGradient", [np.maximum(x, 0), dy]),
                                   per_element(OPS["Relu"][2], x))


# --------------------------------------------------------------------------------------------- ThresholdedRelu
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha", [1.0, 0.3, 2.0])
def test_thresholded_relu_gradient(alpha, device):
    x = np.array([[-2.0, -0.4, 0.1, 0.7], [1.3, 1.8, 2.6, 3.1]])
    check_gradient("ThresholdedRelu", [x], device=device, alpha=alpha)
    ops, _ = backward_ops([make_op("ThresholdedRelu", ["x"], ["y"], alpha=alpha)], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("ThresholdedReluGradient", ["y", "y_grad"],
                                                                       ["x_grad"])]


def test_thresholded_relu_gradient_is_dy_times_the_sign_of_y():
    """Caffe2's kernel: dX = dY * sign(Y), so a negative alpha passes -dY for inputs in (alpha, 0)."""
    y = np.array([-0.3, 0.0, 2.0], np.float32)
    dy = np.array([1.5, 2.0, -1.0], np.float32)
    np.testing.assert_array_equal(run_op("ThresholdedReluGradient", [y, dy], alpha=-1.0), [-1.5, 0.0, -1.0])


def test_check_gradient_catches_a_broken_thresholded_relu_gradient(broken):
    broken("ThresholdedReluGradient", lambda xp, Y, dY, alpha=1.0: dY)
    with pytest.raises(AssertionError, match="ThresholdedRelu: gradient of input 0"):
        check_gradient("ThresholdedRelu", [np.array([-2.0, 0.5, 1.5, 3.0])])
