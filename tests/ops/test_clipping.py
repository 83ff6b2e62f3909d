"""Gradient clipping: LpNorm (+ its gradient), ClipTensorByScaling, and the nets Caffe2 builds with them
(GradientClipping by_norm / by_value, and the optimizers' global-norm lr scaling) against references."""
import math

import numpy as np
import pytest
from optim_steps import CPU, GPU, assert_close, f32, feed, lr_blob, workspace

from stepnet import NetDef
from stepnet.core.errors import ArgumentError, ShapeError
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

RNG = np.random.default_rng(5)


def away_from_zero(*shape):
    x = RNG.uniform(0.2, 1.5, shape) * RNG.choice([-1.0, 1.0], shape)
    return x.astype(np.float32)


def ref_lp(x, p, average):
    total = 0.0
    for v in x.astype(np.float64).ravel():
        total += abs(v) if p == 1 else v * v
    return total / (x.size if average else 1)


# --------------------------------------------------------------------------------------------- LpNorm
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("average", [False, True])
@pytest.mark.parametrize("shape", [(3, 4), (7,), (2, 1, 3)])
def test_lp_norm(device, p, average, shape):
    x = f32(RNG, *shape)
    got = run_op("LpNorm", [x], 1, device=device, p=p, average=int(average))
    assert_close(got, np.array([ref_lp(x, p, average)]), rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("average", [False, True])
def test_lp_norm_gradient(device, p, average):
    check_gradient("LpNorm", [away_from_zero(3, 4)], device=device, p=p, average=int(average))
    check_gradient("LpNorm", [away_from_zero(20)], device=device, p=p, average=int(average))


def test_lp_norm_gradient_op_and_maker():
    from stepnet.passes.gradients import backward_ops
    ops, grads = backward_ops([make_op("LpNorm", ["x"], ["n"], p=1)], {"n": "n_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("LpNormGradient", ["x", "n_grad"],
                                                                        ["x_grad"])]
    assert [(a.name, a.i) for a in ops[0].arg] == [("p", 1)] and grads["x"] == "x_grad"
    x = np.array([0.5, -2.0, 0.0, 1e-13], np.float32)
    got = run_op("LpNormGradient", [x, np.array([3.0], np.float32)], 1, p=1, average=1)
    assert_close(got, np.array([0.75, -0.75, 0.0, 0.0]))  # sign(x)·dnorm/size, 0 within 1e-12 of 0
    with pytest.raises(ShapeError, match="dnorm must be a 1-D tensor of one element"):
        run_op("LpNormGradient", [x, np.array(3.0, np.float32)], 1)


def test_wrong_lp_norm_gradient_is_caught(broken):
    broken("LpNormGradient", lambda xp, X, d, *, p, average: X * d.reshape(()))  # no factor 2
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("LpNorm", [away_from_zero(3, 4)], p=2)


def test_lp_norm_bad_args():
    with pytest.raises(ArgumentError, match="p must be 1 or 2"):
        run_op("LpNorm", [f32(RNG, 3)], 1, p=3)
    with pytest.raises(ShapeError, match="average=1 needs a non-empty X"):
        run_op("LpNorm", [np.zeros(0, np.float32)], 1, average=1)


# ---------------------------------------------------------------------------------------- ClipTensorByScaling
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("val,threshold,extra", [(10.0, 5.0, None), (4.0, 5.0, None), (5.0, 5.0, None),
                                                 (10.0, 5.0, 4.0), (10.0, 5.0, 0.5)])
def test_clip_tensor_by_scaling(device, val, threshold, extra):
    x = f32(RNG, 3, 4)
    inputs = [x, np.array([val], np.float32)] + ([np.array([extra], np.float32)] if extra is not None else [])
    got = run_op("ClipTensorByScaling", inputs, 1, device=device, threshold=threshold)
    t = threshold * (extra if extra is not None else 1.0)
    if val > t:
        assert_close(got, x.astype(np.float64) * t / val)
    else:
        np.testing.assert_array_equal(got, x)  # an exact copy


def test_clip_tensor_by_scaling_bad_input():
    x = f32(RNG, 3)
    with pytest.raises(ArgumentError, match="threshold must be > 0"):
        run_op("ClipTensorByScaling", [x, lr_blob(1)], 1)
    with pytest.raises(ShapeError, match="val must hold exactly one element"):
        run_op("ClipTensorByScaling", [x, np.ones(2, np.float32)], 1, threshold=1.0)
    with pytest.raises(ShapeError, match="input tensor is empty"):
        run_op("ClipTensorByScaling", [np.zeros(0, np.float32), lr_blob(1)], 1, threshold=1.0)


# --------------------------------------------------------------------------------------------- nets
def gradient_clipping_net(method, p, param_norm, threshold, device):
    """The ops caffe2.python.modeling.gradient_clipping.GradientClipping adds for one (param, grad)."""
    net = NetDef(name=f"clip_{method}_{p}")
    if device != "cpu":
        net.device_option.CopyFrom(GPU)
    if method == "by_value":
        net.op.append(make_op("Clip", ["g"], ["g"], min=-0.3, max=0.2))
        return net
    net.op.append(make_op("LpNorm", ["g"], ["g_norm"], p=p))
    inputs = ["g", "g_norm"]
    if p == 2:
        net.op.append(make_op("Pow", ["g_norm"], ["g_norm_sqrt"], exponent=0.5))
        inputs = ["g", "g_norm_sqrt"]
    if param_norm:
        net.op.append(make_op("LpNorm", ["w"], ["w_norm"], p=p))
        net.op.append(make_op("Pow", ["w_norm"], ["w_norm_sqrt"], exponent=0.5) if p == 2 else
                      make_op("Copy", ["w_norm"], ["w_norm_sqrt"]))
        inputs.append("w_norm_sqrt")
    net.op.append(make_op("ClipTensorByScaling", inputs, ["g"], threshold=threshold))
    return net


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method,p,param_norm,threshold", [
    ("by_norm", 2, False, 0.5), ("by_norm", 2, False, 100.0), ("by_norm", 1, False, 1.0),
    ("by_norm", 2, True, 0.1), ("by_value", None, False, None)])
def test_gradient_clipping_modifier(device, method, p, param_norm, threshold):
    g, w = f32(RNG, 4, 3), f32(RNG, 4, 3)
    ws = workspace(device)
    feed(ws, "g", g, device)
    feed(ws, "w", w, device)
    ws.run_net_once(gradient_clipping_net(method, p, param_norm, threshold, device))
    g64 = g.astype(np.float64)
    if method == "by_value":
        want = np.minimum(np.maximum(g64, np.float32(-0.3)), np.float32(0.2))
    else:
        def norm(a):
            return math.sqrt(ref_lp(a, 2, False)) if p == 2 else ref_lp(a, 1, False)
        t = threshold * (norm(w) if param_norm else 1.0)
        want = g64 * (t / norm(g) if norm(g) > t else 1.0)
    assert_close(ws.fetch("g"), want, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_norm", [0.5, 1000.0])
def test_global_norm_lr_scaling(device, max_norm):
    # optimizer._calc_norm_ratio + build_lr: lr·clip/max(clip, ‖(g1, g2)‖), squared sums copied to the CPU.
    grads = {"g1": f32(RNG, 3, 4), "g2": f32(RNG, 5)}
    ws = workspace(device)
    for name, value in grads.items():
        feed(ws, name, value, device)
    ws.feed("iter", np.array([1], np.int64))
    ws.feed("clip_norm", np.array(max_norm, np.float32))
    dev = GPU if device != "cpu" else CPU
    ops = []
    for k, name in enumerate(grads):
        ops += [make_op("SumSqrElements", [name], [f"sq{k}"]),
                make_op("EnsureCPUOutput", [f"sq{k}"], [f"sq{k}_cpu"])]
        for o in ops[-2:]:
            o.device_option.CopyFrom(dev)
    cpu_ops = [make_op("Sum", ["sq0_cpu", "sq1_cpu"], ["sq_sum"]),
               make_op("Pow", ["sq_sum"], ["global_norm"], exponent=0.5),
               make_op("Max", ["global_norm", "clip_norm"], ["max_norm"]),
               make_op("Div", ["clip_norm", "max_norm"], ["norm_ratio"])]
    dev_ops = [make_op("LearningRate", ["iter"], ["lr"], base_lr=-0.1, policy="fixed"),
               make_op("CopyFromCPUInput", ["norm_ratio"], ["ratio_dev"]),
               make_op("Mul", ["lr", "ratio_dev"], ["scaled_lr"], broadcast=1)]
    for o in dev_ops:
        o.device_option.CopyFrom(dev)
    net = NetDef(name="global_norm")
    net.op.extend(ops + cpu_ops + dev_ops)
    ws.run_net_once(net)
    norm = math.sqrt(sum(ref_lp(v, 2, False) for v in grads.values()))
    want = -0.1 * max_norm / max(max_norm, norm)
    got = ws.fetch("scaled_lr")
    assert got.size == 1 and got.dtype == np.float32
    np.testing.assert_allclose(got.reshape(()), want, rtol=1e-5)
