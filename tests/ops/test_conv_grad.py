"""Gradients of Conv (+ Conv1D/2D/3D) and ConvTranspose: every input against float64 finite differences
(strides, pads, dilations, groups, legacy padding, 1-D/2-D/3-D, both orders, with and without bias) on both
devices; ConvGradient against a loop reference; the emitted ops (no_bias, no_gradient_to_input); bad inputs;
and a small CNN (Conv -> Relu -> MaxPool -> SpatialBN -> FC -> SoftmaxWithLoss) whose add_gradient_ops
gradients match finite differences of the whole net's loss, with broken gradient kernels caught."""
import itertools

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.builder import NetBuilder
from stepnet.core.errors import ArgumentError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import DeviceOption, NetDef, argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(11)


def nhwc_filter(w):
    return np.ascontiguousarray(np.moveaxis(w, 1, -1))


def in_order(x, order):
    return x if order == "NCHW" else np.ascontiguousarray(np.moveaxis(x, 1, -1))


# ------------------------------------------------------------------------------------- finite differences
# (X shape NCHW, filter shape (M, C/group, *kernel), group, args)
CONV_CASES = [
    ((2, 3, 6, 5), (4, 3, 3, 3), 1, dict(stride=2, pad=1)),
    ((1, 4, 6, 7), (6, 2, 2, 3), 2, dict(dilations=[2, 1], pads=[0, 1, 1, 0])),
    ((1, 2, 7, 6), (3, 2, 3, 2), 1, dict(stride=2, legacy_pad=2)),                 # SAME
    ((2, 2, 5, 5), (3, 2, 1, 1), 1, {}),                                           # 1x1
    ((2, 6, 9), (6, 2, 3), 3, dict(strides=[2], pads=[1, 0])),                     # 1-D, 3 groups
    ((1, 2, 4, 5, 4), (2, 2, 2, 3, 2), 1, dict(strides=[2, 1, 1], pads=[1, 0, 1, 0, 1, 0])),  # 3-D
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("x_shape, w_shape, group, args", CONV_CASES)
def test_conv_gradient_matches_finite_differences(x_shape, w_shape, group, args, order, bias, device):
    X, W = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    inputs = [in_order(X, order), in_order(W, order)] + ([rng.standard_normal(w_shape[0])] if bias else [])
    got = check_gradient("Conv", inputs, device=device, order=order, group=group, **args)
    assert len(got) == len(inputs)  # every input was checked


# (X shape NCHW, filter shape (M = X's C, C_out/group, *kernel), group, args)
TRANSPOSE_CASES = [
    ((2, 3, 3, 4), (3, 2, 3, 3), 1, dict(stride=2, pad=1, adj=1)),
    ((1, 4, 3, 3), (4, 1, 2, 3), 2, dict(strides=[1, 2], pads=[1, 0, 0, 1])),
    ((2, 2, 5), (2, 3, 4), 1, dict(strides=[3], adjs=[2])),                         # 1-D
    ((1, 2, 2, 3, 2), (2, 2, 2, 2, 3), 1, dict(strides=[2, 1, 2], pads=[0, 1, 0, 0, 0, 1])),  # 3-D
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("x_shape, w_shape, group, args", TRANSPOSE_CASES)
def test_conv_transpose_gradient_matches_finite_differences(x_shape, w_shape, group, args, order, bias,
                                                            device):
    X, W = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    inputs = [in_order(X, order), in_order(W, order)]
    inputs += [rng.standard_normal(w_shape[1] * group)] if bias else []
    got = check_gradient("ConvTranspose", inputs, device=device, order=order, group=group, **args)
    assert len(got) == len(inputs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, x_shape, w_shape", [
    ("Conv1D", (1, 2, 7), (3, 2, 3)), ("Conv2D", (1, 2, 5, 4), (2, 2, 2, 2)),
    ("Conv3D", (1, 1, 3, 4, 3), (2, 1, 2, 2, 2))])
def test_sized_convs_use_their_own_gradient_ops(op_type, x_shape, w_shape, device):
    check_gradient(op_type, [rng.standard_normal(x_shape), rng.standard_normal(w_shape),
                             rng.standard_normal(w_shape[0])], device=device, stride=1)
    ops, _ = backward_ops([make_op(op_type, ["x", "w", "b"], ["y"])], {"y": "dy"})
    assert [o.type for o in ops] == [op_type + "Gradient"]


# ----------------------------------------------------------------------------------------------- makers
def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


@pytest.mark.parametrize("op_type", ["Conv", "ConvTranspose"])
def test_makers_emit_caffe2s_gradient_ops(op_type):
    def grads(inputs, **args):
        return sig(backward_ops([make_op(op_type, inputs, ["y"], kernel=3, **args)], {"y": "dy"})[0])
    g = op_type + "Gradient"
    assert grads(["x", "w", "b"]) == [(g, ["x", "w", "dy"], ["w_grad", "b_grad", "x_grad"], {"kernel": 3})]
    assert grads(["x", "w"]) == [(g, ["x", "w", "dy"], ["w_grad", "x_grad"], {"kernel": 3, "no_bias": 1})]
    assert grads(["x", "w", "b"], no_gradient_to_input=1) == [
        (g, ["x", "w", "dy"], ["w_grad", "b_grad"], {"kernel": 3, "no_gradient_to_input": 1})]
    assert grads(["x", "w"], no_gradient_to_input=1) == [
        (g, ["x", "w", "dy"], ["w_grad"], {"kernel": 3, "no_gradient_to_input": 1, "no_bias": 1})]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", ["ConvGradient", "ConvTransposeGradient"])
def test_gradient_ops_write_only_the_outputs_they_have(op_type, device):
    X, W = rng.standard_normal((2, 4, 5, 5)).astype(np.float32), rng.standard_normal((4, 2, 3, 3))
    W = W.astype(np.float32)
    dY = np.ones(run_op(op_type[:-len("Gradient")], [X, W], device=device, group=2).shape, np.float32)
    dw, db, dx = run_op(op_type, [X, W, dY], outputs=3, device=device, group=2)
    dw2, dx2 = run_op(op_type, [X, W, dY], outputs=2, device=device, group=2, no_bias=1)
    only = run_op(op_type, [X, W, dY], outputs=1, device=device, group=2, no_bias=1)
    np.testing.assert_array_equal(dw, dw2)
    np.testing.assert_array_equal(dw, only)
    np.testing.assert_array_equal(dx, dx2)
    assert db.shape == (dY.shape[1],) and dw.dtype == dx.dtype == db.dtype == np.float32
    np.testing.assert_allclose(db, dY.sum(axis=(0, 2, 3)))


def ref_conv_grads(X, W, dY, stride, pad, group):
    """Loops over every output position and filter tap of a 2-D NCHW convolution (symmetric pad)."""
    dX, dW = np.zeros(X.shape), np.zeros(W.shape)
    m_per, c_per = W.shape[0] // group, W.shape[1]
    for n, m, i, j in itertools.product(*(range(v) for v in dY.shape)):
        c0 = (m // m_per) * c_per
        for c, a, b in itertools.product(range(c_per), range(W.shape[2]), range(W.shape[3])):
            h, w = i * stride - pad + a, j * stride - pad + b
            if 0 <= h < X.shape[2] and 0 <= w < X.shape[3]:
                dW[m, c, a, b] += dY[n, m, i, j] * X[n, c0 + c, h, w]
                dX[n, c0 + c, h, w] += dY[n, m, i, j] * W[m, c, a, b]
    return dW, dY.sum(axis=(0, 2, 3)), dX


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_conv_gradient_matches_a_loop_reference(order, device):
    X = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    W = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    dY = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    got = run_op("ConvGradient", [in_order(X, order), in_order(W, order), in_order(dY, order)], outputs=3,
                 device=device, order=order, group=2, stride=2, pad=1)
    for g, r in zip(got, ref_conv_grads(X, W, dY, 2, 1, 2), strict=True):
        np.testing.assert_allclose(g, in_order(r, order) if g.ndim == 4 else r, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------- errors
def test_conv_gradient_bad_inputs():
    X, W = np.zeros((1, 2, 5, 5), np.float32), np.zeros((3, 2, 3, 3), np.float32)
    with pytest.raises(ShapeError, match=r"dY has shape \(1, 3, 4, 4\) but the forward output is \(1, 3, 3"):
        run_op("ConvGradient", [X, W, np.zeros((1, 3, 4, 4), np.float32)], outputs=3)
    dY = np.zeros((1, 3, 3, 3), np.float32)
    with pytest.raises(ArgumentError, match="needs 2 or 3 outputs"):
        run_op("ConvGradient", [X, W, dY], outputs=1)
    with pytest.raises(ArgumentError, match=r"no_bias=1 has outputs \(dfilter\[, dX\]\), got 3"):
        run_op("ConvGradient", [X, W, dY], outputs=3, no_bias=1)
    with pytest.raises(ShapeError, match="filter"):
        run_op("ConvTransposeGradient", [X, np.zeros((3, 2, 3, 3), np.float32), dY], outputs=3)


# ----------------------------------------------------------------------------------------------- the testers
def test_check_gradient_catches_a_conv_filter_gradient_of_the_wrong_group(broken):
    kernel = REGISTRY.get("ConvGradient").kernel

    def wrong(ctx, xp, X, W, dY, **args):
        dw, *rest = kernel(ctx, xp, X, W, dY, **args)
        return (xp.roll(dw, 1, axis=0), *rest)     # each filter's gradient given to its neighbour
    broken("ConvGradient", wrong)
    with pytest.raises(AssertionError, match="Conv: gradient of input 1"):
        check_gradient("Conv", [rng.standard_normal((1, 4, 4, 4)), rng.standard_normal((4, 2, 2, 2))],
                       group=2)


def test_check_gradient_catches_a_conv_transpose_input_gradient_off_by_one_pixel(broken):
    kernel = REGISTRY.get("ConvTransposeGradient").kernel

    def wrong(ctx, xp, X, W, dY, **args):
        *first, dx = kernel(ctx, xp, X, W, dY, **args)
        return (*first, xp.roll(dx, 1, axis=-1))
    broken("ConvTransposeGradient", wrong)
    with pytest.raises(AssertionError, match="ConvTranspose: gradient of input 0"):
        check_gradient("ConvTranspose", [rng.standard_normal((1, 2, 3, 3)), rng.standard_normal((2, 2, 2, 2)),
                                         rng.standard_normal(2)], stride=2)


# ----------------------------------------------------------------------------------------------- a small CNN
PARAMS = {"data": (4, 2, 6, 6), "conv_w": (3, 2, 3, 3), "conv_b": (3,), "bn_s": (3,), "bn_b": (3,),
          "fc_w": (5, 27), "fc_b": (5,)}


def cnn(device):
    """Conv -> Relu -> MaxPool -> SpatialBN (training) -> FC -> SoftmaxWithLoss; (forward net, whole net,
    gradients)."""
    net = NetBuilder("cnn")
    where = DeviceOption(device_type=1) if device != "cpu" else None
    with net.device_scope(where):
        net.Conv(["data", "conv_w", "conv_b"], "conv", kernel=3, pad=1)
        net.Relu("conv", "relu")
        net.MaxPool("relu", "pool", kernel=2, stride=2)
        net.SpatialBN(["pool", "bn_s", "bn_b", "bn_rm", "bn_rv"], ["bn", "bn_rm", "bn_rv", "bn_sm", "bn_siv"],
                      is_test=0, epsilon=1e-3)
        net.FC(["bn", "fc_w", "fc_b"], "fc")
        net.SoftmaxWithLoss(["fc", "label"], ["prob", "loss"])
    forward = NetDef()
    forward.CopyFrom(net.proto())
    grads = net.add_gradient_ops(["loss"])
    seed = net.proto().op[len(forward.op)]
    assert seed.type == "ConstantFill" and list(seed.output) == ["loss_autogen_grad"]
    if where is not None:  # Caffe2 makes the seed in the caller's DeviceScope; stepnet leaves it on the CPU
        seed.device_option.CopyFrom(where)
    return forward, net.proto(), grads


def cnn_feeds():
    r = np.random.default_rng(5)
    feeds = {k: r.standard_normal(s) * (0.5 if k.endswith("_w") else 1.0) for k, s in PARAMS.items()}
    feeds["bn_s"] = r.uniform(0.5, 1.5, 3)
    feeds.update(bn_rm=np.zeros(3), bn_rv=np.ones(3), label=r.integers(0, 5, 4).astype(np.int32))
    return feeds


def run(netdef, feeds, device):
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    for k, v in feeds.items():
        ws.feed(k, v, device_option=DeviceOption(device_type=1) if device != "cpu" else None)
    ws.run_net_once(netdef)
    return ws


def check_cnn(device, eps=1e-6):
    """Every parameter's gradient from the gradient ops against central differences of the loss along two
    random directions (float64 throughout)."""
    forward, whole, grads = cnn(device)
    feeds = cnn_feeds()
    ws = run(whole, feeds, device)
    r = np.random.default_rng(6)
    for name in PARAMS:
        g = ws.fetch(grads[name])
        for _ in range(2):
            d = r.standard_normal(PARAMS[name])
            loss = [float(run(forward, dict(feeds, **{name: feeds[name] + s * eps * d}), device)
                          .fetch("loss")) for s in (1, -1)]
            numeric, exact = (loss[0] - loss[1]) / (2 * eps), float((g * d).sum())
            assert abs(numeric - exact) <= 1e-7 + 1e-5 * abs(numeric), (name, exact, numeric)
    return whole


@pytest.mark.parametrize("device", DEVICES)
def test_small_cnn_gradients_match_finite_differences_of_the_loss(device):
    whole = check_cnn(device)
    types = [op.type for op in whole.op if op.is_gradient_op]
    for t in ("SoftmaxWithLossGradient", "FCGradient", "SpatialBNGradient", "MaxPoolGradient", "ReluGradient",
              "ConvGradient"):
        assert t in types


@pytest.mark.parametrize("op_type, fault", [
    ("SpatialBNGradient", lambda out: (out[0] * 1.001, out[1], out[2])),
    ("MaxPoolGradient", lambda out: out[..., ::-1]),
    ("ConvGradient", lambda out: (out[0], out[1] + 0.01, out[2])),
])
def test_the_cnn_check_catches_broken_gradient_kernels(op_type, fault, broken):
    kernel = REGISTRY.get(op_type).kernel
    if REGISTRY.get(op_type).context:
        broken(op_type, lambda ctx, xp, *a, **k: fault(kernel(ctx, xp, *a, **k)))
    else:
        broken(op_type, lambda xp, *a, **k: fault(kernel(xp, *a, **k)))
    with pytest.raises(AssertionError):
        check_cnn("cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel, group", [(1, 1), (3, 1), (3, 2)])
def test_conv_gradient_of_an_empty_batch(device, kernel, group):
    """N = 0 (the GEMM layout reshaped with -1, which numpy refuses for zero rows): zero filter and bias
    gradients, an empty dX."""
    x = np.zeros((0, 2, 5, 5), np.float32)
    w = np.random.default_rng(0).standard_normal((4, 2 // group, kernel, kernel)).astype(np.float32)
    y = run_op("Conv", [x, w], 1, device=device, kernel=kernel, group=group)
    dw, db, dx = run_op("ConvGradient", [x, w, y], 3, device=device, kernel=kernel, group=group)
    assert dw.shape == w.shape and not dw.any() and db.shape == (4,) and not db.any() and dx.shape == x.shape
