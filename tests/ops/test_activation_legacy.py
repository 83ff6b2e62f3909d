"""Spellings and input orders of activation ops that real files hold (stepnet/ops/activation.py and
activation_grad.py): RSqrt, another name of Rsqrt; and SigmoidGradient in both of Caffe2's input orders, today's
(Y, dY) and the mid-2018 (dY, Y), told apart by the net the op is in."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import DeviceOption
from stepnet.ops.activation_grad import sigmoid_gradient_order
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(61)
X = rng.uniform(-3, 3, (3, 4)).astype(np.float32)
Y = (1 / (1 + np.exp(-X.astype(np.float64)))).astype(np.float32)
DY = rng.standard_normal((3, 4)).astype(np.float32)
WANT = (DY.astype(np.float64) * Y * (1 - Y.astype(np.float64))).astype(np.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_rsqrt_has_the_spelling_rsqrt_too(device):
    x = rng.uniform(0.2, 3, (2, 3)).astype(np.float32)
    np.testing.assert_array_equal(run_op("RSqrt", [x], device=device), run_op("Rsqrt", [x], device=device))
    np.testing.assert_allclose(run_op("RSqrt", [x], device=device), 1 / np.sqrt(x.astype(np.float64)), rtol=1e-6)
    assert REGISTRY.get("RSqrt").gradient is REGISTRY.get("Rsqrt").gradient
    check_gradient("RSqrt", [rng.uniform(0.5, 2, (2, 3))], device=device)


def net_of(*ops, external=()):
    net = NetDef(name="n", external_input=list(external))
    net.op.extend(ops)
    return net


@pytest.mark.parametrize("net, index, want", [
    # a training net of today: the backward pass emits (Y, dY)
    (net_of(make_op("Sigmoid", ["x"], ["y"]), make_op("SigmoidGradient", ["y", "y_grad"], ["x_grad"])), 1, (0, 1)),
    # a mid-2018 training net: (dY, Y), Y written by the Sigmoid op
    (net_of(make_op("Sigmoid", ["x"], ["y"]), make_op("SigmoidGradient", ["y_grad", "y"], ["x_grad"])), 1, (1, 0)),
    # the Sigmoid wins over names that say otherwise
    (net_of(make_op("Sigmoid", ["x"], ["p_grad"]), make_op("SigmoidGradient", ["q", "p_grad"], ["r"])), 1, (1, 0)),
    # a gradient net alone: dX written over dY (Caffe2 allowed it at input 0 in 2018, at input 1 later)
    (net_of(make_op("SigmoidGradient", ["a", "b"], ["a"])), 0, (1, 0)),
    (net_of(make_op("SigmoidGradient", ["a", "b"], ["b"])), 0, (0, 1)),
    # ... or by names: the gradient of Y is named Y_grad (possibly with a suffix)
    (net_of(make_op("SigmoidGradient", ["h_grad", "h"], ["g"])), 0, (1, 0)),
    (net_of(make_op("SigmoidGradient", ["h", "h_grad_autosplit_1"], ["g"])), 0, (0, 1)),
    (net_of(make_op("SigmoidGradient", ["gates_grad", "sig_out"], ["g"])), 0, (1, 0)),
    # nothing to tell: today's order
    (net_of(make_op("SigmoidGradient", ["a", "b"], ["c"])), 0, (0, 1)),
])
def test_the_order_is_read_from_the_net(net, index, want):
    assert sigmoid_gradient_order(net, index) == want


def check_training_net(inputs, device="cpu"):
    """Sigmoid then SigmoidGradient(inputs), as a file of either era holds them: dX must be dY * Y * (1 - Y)."""
    net = net_of(make_op("Sigmoid", ["x"], ["y"], device=device),
                 make_op("SigmoidGradient", inputs, ["x_grad"], device=device))
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    ws.feed("x", X, device_option=do)
    ws.feed("y_grad", DY, device_option=do)
    ws.run_net_once(net)
    np.testing.assert_allclose(ws.fetch("x_grad"), WANT, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inputs", [["y", "y_grad"], ["y_grad", "y"]])
def test_both_orders_run_correctly_in_a_training_net(inputs, device):
    check_training_net(inputs, device)


def test_a_2018_gradient_net_runs_in_place_over_dy():
    ws = Workspace()
    ws.feed("a", DY)
    ws.feed("b", Y)
    ws.run_net_once(net_of(make_op("SigmoidGradient", ["a", "b"], ["a"])))
    np.testing.assert_allclose(ws.fetch("a"), WANT, rtol=1e-5, atol=1e-6)


def test_the_backward_pass_emits_todays_order_and_trains():
    ops, _ = backward_ops([make_op("Sigmoid", ["x"], ["y"]), make_op("SumElements", ["y"], ["loss"])],
                          {"loss": "loss_grad"})
    sig = [op for op in ops if op.type == "SigmoidGradient"]
    assert [list(op.input) for op in sig] == [["y", "y_grad"]]
    check_gradient("Sigmoid", [X.astype(np.float64)])


def test_the_training_net_check_catches_a_kernel_that_ignores_the_order(broken):
    broken("SigmoidGradient", lambda ctx, xp, y, dy: dy * y * (1 - y))     # always today's order
    check_training_net(["y", "y_grad"])
    with pytest.raises(AssertionError):
        check_training_net(["y_grad", "y"])
