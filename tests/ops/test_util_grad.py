"""Gradients of the utility and fill ops: NanCheck's pass-through check, ZeroGradient, and the no-gradient
kinds of the deterministic fill and utility ops as Caffe2 registers them; a gradient kernel broken on purpose
is caught. The device copies' gradients are tested in test_device.py, the random fills' and sums' kinds in
test_random_fill.py and test_sums.py."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import OpError
from stepnet.passes.gradients import GradientError, add_gradient_ops, backward_ops
from stepnet.ops import REGISTRY
from stepnet.ops.registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT
from stepnet.io.proto import DeviceOption, argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(3)
GPU = DeviceOption(device_type=1)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


def workspace(device):
    return Workspace(gpu="emulate" if device != "cpu" else None)


def run_net(ops, feeds, device, losses=None):
    """Run ops (plus their gradient ops for losses) on a fresh workspace; (workspace, gradient map)."""
    ws = workspace(device)
    for name, v in feeds.items():
        ws.feed(name, v, device_option=GPU if device != "cpu" else None)
    net = NetDef(name="n")
    net.op.extend(ops)
    if device != "cpu":
        net.device_option.CopyFrom(GPU)
    grads = add_gradient_ops(net, losses) if losses else {}
    ws.run_net_once(net)
    return ws, grads


# --------------------------------------------------------------------------------------------------- NanCheck
@pytest.mark.parametrize("device", DEVICES)
def test_nan_check_gradient_passes_through_and_is_checked(device):
    ops, grads = backward_ops([make_op("NanCheck", ["x", "other"], ["y"])], {"y": "g"})
    assert sig(ops) == [("NanCheck", ["g"], ["x_grad"], {})] and "other" not in grads
    check_gradient("NanCheck", [f32(3, 4)], device=device)
    g = f32(3, 4)
    g[1, 2] = np.nan
    with pytest.raises(OpError, match=r"blob 'g' contains 1 NaN"):
        run_op("NanCheck", {"g": g}, device=device)


# ----------------------------------------------------------------------------------------------- ZeroGradient
def test_zero_gradient_runs_as_a_no_op():
    assert run_op("ZeroGradient", [f32(2)], outputs=0) == []


@pytest.mark.parametrize("device", DEVICES)
def test_zero_gradient_gives_zeros_though_no_gradient_reaches_it(device):
    fwd = [make_op("Scale", ["x"], ["h"], scale=3.0), make_op("ZeroGradient", ["h"], []),
           make_op("Scale", ["x"], ["y"], scale=2.0)]
    ops, grads = backward_ops(fwd, {"y": "g"})
    assert sig(ops) == [("Scale", ["g"], ["x_grad"], {"scale": 2.0}),
                        ("ConstantFill", ["h"], ["h_grad"], {"value": 0.0}),
                        ("Scale", ["h_grad"], ["_x_grad_autosplit_0"], {"scale": 3.0}),
                        ("Sum", ["x_grad", "_x_grad_autosplit_0"], ["x_grad"], {})]
    x, g = f32(2, 3), f32(2, 3)
    ws, grads = run_net([make_op("Scale", ["x"], ["h"], scale=3.0), make_op("ZeroGradient", ["h"], []),
                         make_op("Scale", ["x"], ["y"], scale=2.0)], {"x": x, "g": g}, device, {"y": "g"})
    np.testing.assert_array_equal(ws.fetch("h_grad"), np.zeros((2, 3), np.float32))
    np.testing.assert_allclose(ws.fetch(grads["x"]), 2.0 * g.astype(np.float64), rtol=1e-6)


# ------------------------------------------------------------------------------------------ no-gradient kinds
CAFFE2_KINDS = {
    NO_GRADIENT: ["ConstantFill", "RangeFill", "LengthsRangeFill", "GivenTensorFill", "GivenTensorDoubleFill",
                  "GivenTensorBoolFill", "GivenTensorInt16Fill", "GivenTensorIntFill", "GivenTensorInt64Fill",
                  "GivenTensorStringFill", "GivenTensorByteStringToUInt8Fill", "Iter", "AtomicIter"],
    SHOULD_NOT_DO_GRADIENT: ["Print", "CreateMutex", "Accumulate", "SumElementsInt"],
    None: ["Assert", "SumSqrElements"],
}


@pytest.mark.parametrize("kind, op_type", [(k, t) for k, ts in CAFFE2_KINDS.items() for t in ts])
def test_no_gradient_kinds_are_caffe2s(kind, op_type):
    assert REGISTRY.get(op_type).gradient == kind


def test_no_gradient_stops_quietly_and_should_not_do_gradient_is_an_error():
    fwd = [make_op("ConstantFill", ["x"], ["c"], value=2.0), make_op("Sum", ["c", "x"], ["y"])]
    ops, grads = backward_ops(fwd, {"y": "g"})
    assert ops == [] and grads["x"] == "g" and grads["c"] == "g"
    with pytest.raises(GradientError, match=r"op #0 \(Accumulate\) is registered as not differentiable"):
        backward_ops([make_op("Accumulate", ["x"], ["y"]), make_op("Scale", ["y"], ["z"])], {"z": "g"})
    fwd = [make_op("Print", ["x"], []), make_op("Assert", ["x"], []), make_op("Scale", ["x"], ["z"])]
    ops, grads = backward_ops(fwd, {"z": "g"})   # no output gradient reaches ops without outputs
    assert [o.type for o in ops] == ["Scale"] and grads["x"] == "x_grad"


# ------------------------------------------------------------------------------------------------- the tester
def test_check_gradient_catches_a_nan_check_that_scales_gradients(broken):
    kernel = REGISTRY.get("NanCheck").kernel

    def wrong(ctx, xp, x, *others):
        y = kernel(ctx, xp, x, *others)
        return y * 2 if ctx.opdef.is_gradient_op else y
    broken("NanCheck", wrong)
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("NanCheck", [f32(2, 3)])


