"""Gradients of Log1p, Gelu (exact and fast_gelu) and Mean (stepnet/ops/pointwise_grad.py): the gradient ops
against derivatives written here with Python's math module, the makers against float64 finite differences on
every device, the ops the makers emit (Caffe2's), bad inputs, and broken gradient kernels caught."""
import math

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.io.proto import NetDef, argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(37)


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


def d_gelu(v):
    """d/dv of v * Phi(v): Phi(v) + v * phi(v)."""
    return 0.5 * math.erfc(-v / math.sqrt(2)) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi)


def d_fast_gelu(v):
    """d/dv of 0.5 v (1 + tanh(a (v + c v^3))), a = sqrt(2/pi), c = 0.044715."""
    a, c = math.sqrt(2 / math.pi), 0.044715
    t = math.tanh(a * (v + c * v ** 3))
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * a * (1 + 3 * c * v * v)


def per_element(fn, x):
    return np.array([fn(v) for v in x.ravel().tolist()]).reshape(x.shape)


X = rng.uniform(-5, 5, (3, 4))
DY = rng.standard_normal((3, 4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradient_ops_are_the_derivatives(dtype, device):
    x, dy = X.astype(dtype), DY.astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    pos = (np.abs(x) + 0.1).astype(dtype)
    got = run_op("Log1pGradient", [pos, dy], device=device)
    np.testing.assert_allclose(got, per_element(lambda v: 1 / (1 + v), pos) * dy, rtol=tol)
    got = run_op("GeluGradient", [dy, x], device=device)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, per_element(d_gelu, x) * dy, rtol=tol, atol=tol)
    got = run_op("GeluGradient", [dy, x], device=device, fast_gelu=True)
    np.testing.assert_allclose(got, per_element(d_fast_gelu, x) * dy, rtol=tol * 10, atol=tol)
    got = run_op("MeanGradient", [dy], 3, device=device)
    third = float(np.float32(1 / 3))
    for g in got:
        assert g.dtype == dtype
        np.testing.assert_allclose(g, dy * third, rtol=tol)
    assert got[0] is not got[1] and not np.shares_memory(got[0], got[1])


CASES = [   # (forward op, inputs, args)
    ("Log1p", [rng.uniform(-0.5, 3, (2, 3))], {}),
    ("Gelu", [rng.uniform(-4, 4, (2, 3))], {}),
    ("Gelu", [np.array([-30.0, -7.0, -2.6, -2.4, 0.0, 1.0, 2.6, 7.0])], {}),
    ("Gelu", [rng.uniform(-4, 4, (2, 3))], {"fast_gelu": True}),
    ("Gelu", [rng.uniform(-4, 4, (5, 6))], {}),
    ("Mean", [rng.standard_normal((2, 3)) for _ in range(3)], {}),
    ("Mean", [rng.standard_normal(4)], {}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gradients_match_finite_differences(op_type, inputs, args, device):
    check_gradient(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("forward, inputs, args, want", [
    ("Log1p", ["x"], {}, [("Log1pGradient", ["x", "y_grad"], ["x_grad"], {})]),
    ("Gelu", ["x"], {"fast_gelu": True}, [("GeluGradient", ["y_grad", "x"], ["x_grad"], {"fast_gelu": 1})]),
    ("Mean", ["a", "b", "c"], {}, [("MeanGradient", ["y_grad"], ["a_grad", "b_grad", "c_grad"], {})]),
])
def test_makers_emit_caffe2s_ops(forward, inputs, args, want):
    ops, grads = backward_ops([make_op(forward, inputs, ["y"], **args)], {"y": "y_grad"})
    assert sig(ops) == want
    assert all(grads[i] == i + "_grad" for i in inputs)


def test_mean_gradient_in_a_net_with_a_shared_input():
    """Mean(a, a): both gradient outputs add up into a's gradient, 2 * float32(1/2) * dY."""
    net = NetDef(name="mean")
    net.op.append(make_op("Mean", ["a", "a"], ["y"]))
    ops, grads = backward_ops(list(net.op), {"y": "y_grad"})
    ws = Workspace()
    ws.feed("a", np.ones(3))
    ws.feed("y_grad", np.array([1.0, 2.0, 3.0]))
    gnet = NetDef(name="g")
    gnet.op.extend(ops)
    ws.run_net_once(gnet)
    np.testing.assert_allclose(ws.fetch(grads["a"]), [1.0, 2.0, 3.0])


def test_bad_gradient_inputs_are_named():
    with pytest.raises(ShapeError, match=r"GeluGradient: dY has shape \(2,\) but X has \(3,\)"):
        run_op("GeluGradient", [np.ones(2, np.float32), np.ones(3, np.float32)])
    with pytest.raises(DTypeError, match="share one type"):
        run_op("Log1pGradient", [np.ones(2, np.float32), np.ones(2)])
    with pytest.raises(DTypeError, match="MeanGradient"):
        run_op("MeanGradient", [np.ones(2, np.int32)], 2)


# --------------------------------------------------------------------------------------------- the testers
@pytest.mark.parametrize("forward, inputs, args, grad_type, wrong", [
    ("Gelu", [rng.uniform(-3, 3, (2, 3))], {}, "GeluGradient",
     lambda xp, dY, X, *, fast_gelu: dY * (X > 0)),                      # the Relu derivative
    ("Gelu", [rng.uniform(-3, 3, (2, 3))], {"fast_gelu": True}, "GeluGradient",
     lambda xp, dY, X, *, fast_gelu: dY * 0.5 * (1 + xp.tanh(0.7978846 * X))),   # the cubic term dropped
    ("Log1p", [rng.uniform(0, 3, (2, 3))], {}, "Log1pGradient", lambda xp, X, dY: dY / X),
    ("Mean", [rng.standard_normal((2, 2))] * 2, {}, "MeanGradient", lambda ctx, xp, dY: (dY, dY)),
])
def test_check_gradient_catches_a_broken_gradient_kernel(forward, inputs, args, grad_type, wrong, broken):
    check_gradient(forward, inputs, **args)
    broken(grad_type, wrong)
    with pytest.raises(AssertionError, match=f"{forward}: gradient of input"):
        check_gradient(forward, inputs, **args)
