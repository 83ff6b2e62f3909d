"""Gradients of MaxPool, AveragePool, LpPool (and the 1D/2D/3D forms) and LRN: every maker against float64
finite differences over many argument forms (strides, pads, Caffe's legacy pooling sizes, global pooling,
count_include_pad, both orders, 1-D/2-D/3-D) on both devices; the gradient ops against loop references of
Caffe2's rules (ties of MaxPool, counts of AveragePool); emitted ops; bad inputs; broken kernels caught."""
import itertools

import numpy as np
import pytest

from stepnet.core.errors import ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(7)


def distinct(*shape):
    """Values at least 0.1 apart (no ties, no near-ties under finite differences)."""
    return rng.permutation(int(np.prod(shape))).reshape(shape) * 0.1 - 0.05 * np.prod(shape)


def off_zero(*shape):
    return rng.uniform(0.3, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def to_nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def to_nchw(a):
    return np.ascontiguousarray(np.moveaxis(a, -1, 1))


# ------------------------------------------------------------------------------------- finite differences
# (image shape NCHW, pooling args)
CASES = [
    ((2, 3, 5, 6), dict(kernel=2, stride=2)),
    ((1, 2, 7, 5), dict(kernel=3, stride=2, pad=1)),
    ((1, 2, 6, 7), dict(kernels=[3, 2], strides=[1, 2], pads=[1, 0, 2, 1])),
    ((1, 2, 7, 6), dict(kernel=3, stride=2, pad=1, legacy_pad=3)),   # Caffe's ceil sizes: a clipped tail
    ((1, 2, 5, 5), dict(kernel=2, stride=2, legacy_pad=3)),
    ((1, 2, 5, 4), dict(kernel=3, stride=2, legacy_pad=2)),            # SAME
    ((2, 3, 4, 5), dict(global_pooling=True)),
    ((2, 3, 9), dict(kernel=3, stride=2, pad=1)),                       # 1-D
    ((1, 2, 4, 5, 3), dict(kernels=[2, 3, 2], strides=[2, 1, 1], pads=[1, 0, 0, 0, 1, 1])),  # 3-D
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape, args", CASES)
def test_max_pool_gradient_matches_finite_differences(shape, args, order, device):
    X = distinct(*shape)
    check_gradient("MaxPool", [X if order == "NCHW" else to_nhwc(X)], device=device, order=order, **args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("shape, args", CASES)
def test_average_pool_gradient_matches_finite_differences(shape, args, include, order, device):
    X = rng.standard_normal(shape)
    check_gradient("AveragePool", [X if order == "NCHW" else to_nhwc(X)], device=device, order=order,
                   count_include_pad=include, **args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("p", [2.0, 3.0, 1.5])
@pytest.mark.parametrize("shape, args", [CASES[1], CASES[3], CASES[6]])
def test_lp_pool_gradient_matches_finite_differences(shape, args, p, order, device):
    X = off_zero(*shape)
    check_gradient("LpPool", [X if order == "NCHW" else to_nhwc(X)], device=device, order=order, p=p, **args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", ["MaxPool1D", "AveragePool2D", "MaxPool3D"])
def test_sized_forms_use_their_own_gradient_ops(op_type, device):
    shape = {"1": (1, 2, 7), "2": (1, 2, 5, 4), "3": (1, 1, 3, 4, 3)}[op_type[-2]]
    X = distinct(*shape)
    check_gradient(op_type, [X], device=device, kernel=2, stride=1)
    ops, _ = backward_ops([make_op(op_type, ["x"], ["y"], kernel=2)], {"y": "dy"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        (op_type + "Gradient", ["x", "y", "dy"], ["x_grad"])]


# --------------------------------------------------------------------------------------------- LRN
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("size, outputs", [(3, 2), (5, 1), (4, 2), (1, 1)])
def test_lrn_gradient_matches_finite_differences(size, outputs, order, device):
    X = rng.standard_normal((2, 6, 3, 2))
    check_gradient("LRN", [X if order == "NCHW" else to_nhwc(X)], outputs=outputs, outputs_with_grads=[0],
                   device=device, order=order, size=size, alpha=0.7, beta=0.75, bias=1.3)


def test_lrn_emits_caffe2s_three_input_gradient():
    ops, grads = backward_ops([make_op("LRN", ["x"], ["y", "scale"], size=3, alpha=0.1, beta=0.5)],
                              {"y": "dy"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("LRNGradient", ["x", "y", "dy"], ["x_grad"])]
    assert {a.name for a in ops[0].arg} == {"size", "alpha", "beta"}  # the forward's arguments, copied
    assert grads["x"] == "x_grad"


# ---------------------------------------------------------------------------------------- loop references
def ref_pool_grad(X, Y, dY, kind, kernel, stride, pb, include_pad=False):
    """Caffe2's loops (pool_gradient_op.cc), channels first: each output position's window is clipped to the
    image; max: every pixel equal to Y gets dY; average: dY / (clipped window size, or the kernel size)."""
    dX = np.zeros(X.shape)
    for n, c in itertools.product(range(X.shape[0]), range(X.shape[1])):
        for o in itertools.product(*(range(v) for v in Y.shape[2:])):
            lo = [o[i] * stride[i] - pb[i] for i in range(len(o))]
            hi = [min(lo[i] + kernel[i], X.shape[2 + i]) for i in range(len(o))]
            lo = [max(v, 0) for v in lo]
            window = list(itertools.product(*(range(a, b) for a, b in zip(lo, hi, strict=True))))
            for pos in window:
                if kind == "max":
                    if X[(n, c, *pos)] == Y[(n, c, *o)]:
                        dX[(n, c, *pos)] += dY[(n, c, *o)]
                else:
                    dX[(n, c, *pos)] += dY[(n, c, *o)] / (np.prod(kernel) if include_pad else len(window))
    return dX


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_max_pool_ties_each_get_the_whole_gradient(order, device):
    """Caffe2's rule (both eras): X == Y selects every tied pixel of a window, not only the first."""
    X = rng.integers(0, 3, (2, 2, 5, 5)).astype(np.float32)   # many ties
    args = dict(kernel=3, stride=2, pad=1)
    Xo = X if order == "NCHW" else to_nhwc(X)
    Y = run_op("MaxPool", [Xo], device=device, order=order, **args)
    dY = rng.standard_normal(Y.shape).astype(np.float32)
    dX = run_op("MaxPoolGradient", [Xo, Y, dY], device=device, order=order, **args)
    back = (lambda a: a) if order == "NCHW" else to_nchw
    expected = ref_pool_grad(X, back(Y), back(dY), "max", (3, 3), (2, 2), (1, 1))
    np.testing.assert_allclose(back(dX), expected, rtol=1e-5, atol=1e-6)
    assert (expected != 0).sum() > (dY != 0).sum()  # ties really spread the gradient


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("shape, args, kernel, stride, pb", [
    ((1, 2, 7, 6), dict(kernel=3, stride=2, pad=1, legacy_pad=3), (3, 3), (2, 2), (1, 1)),
    ((2, 1, 6, 7), dict(kernels=[3, 2], strides=[1, 2], pads=[1, 0, 2, 1]), (3, 2), (1, 2), (1, 0)),
    ((1, 2, 8), dict(kernel=4, stride=3, pad=2), (4,), (3,), (2,))])
def test_average_pool_gradient_matches_caffe2s_loops(shape, args, kernel, stride, pb, include, device):
    X = rng.standard_normal(shape).astype(np.float32)
    Y = run_op("AveragePool", [X], device=device, count_include_pad=include, **args)
    dY = rng.standard_normal(Y.shape).astype(np.float32)
    dX = run_op("AveragePoolGradient", [X, Y, dY], device=device, count_include_pad=include, **args)
    assert dX.dtype == np.float32
    np.testing.assert_allclose(dX, ref_pool_grad(X, Y, dY, "avg", kernel, stride, pb, include), rtol=1e-5,
                               atol=1e-6)


# --------------------------------------------------------------------------------------------- errors
def test_pool_gradient_rejects_a_dy_of_the_wrong_shape():
    X = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    Y = np.zeros((1, 2, 3, 3), np.float32)
    with pytest.raises(ShapeError, match=r"dY has shape \(1, 2, 2, 2\).*gives \(1, 2, 3, 3\)"):
        run_op("MaxPoolGradient", [X, Y, np.zeros((1, 2, 2, 2), np.float32)], kernel=2, stride=2)
    with pytest.raises(ShapeError, match="LRNGradient takes the forward's X, Y and dY"):
        run_op("LRNGradient", [X, X, Y], size=3)


# --------------------------------------------------------------------------------------------- the testers
def test_check_gradient_catches_a_max_pool_gradient_off_by_a_factor(broken):
    kernel = REGISTRY.get("MaxPoolGradient").kernel
    broken("MaxPoolGradient", lambda xp, *a, **k: kernel(xp, *a, **k) * 1.01)
    with pytest.raises(AssertionError, match="MaxPool: gradient of input 0"):
        check_gradient("MaxPool", [distinct(1, 2, 5, 5)], kernel=3, stride=2, pad=1)


def test_the_tie_reference_catches_a_first_maximum_only_rule(broken):
    """A kernel routing each window's gradient to its first maximum passes finite differences on distinct
    values but not Caffe2's tie rule."""
    def first_only(xp, X, Y, dY, **args):
        Xc, Yc, dYc = X[0, 0], Y[0, 0], dY[0, 0]
        dX = np.zeros_like(X)
        for i, j in itertools.product(range(Yc.shape[0]), range(Yc.shape[1])):
            win = Xc[2 * i:2 * i + 2, 2 * j:2 * j + 2]
            a, b = np.unravel_index(np.argmax(win), win.shape)
            dX[0, 0, 2 * i + a, 2 * j + b] += dYc[i, j]
        return dX
    broken("MaxPoolGradient", first_only)
    check_gradient("MaxPool", [distinct(1, 1, 4, 4)], kernel=2, stride=2)  # no ties: looks right
    X = np.ones((1, 1, 4, 4), np.float32)
    dY = np.ones((1, 1, 2, 2), np.float32)
    dX = run_op("MaxPoolGradient", [X, np.ones_like(dY), dY], kernel=2, stride=2)
    assert not np.allclose(dX, ref_pool_grad(X, np.ones_like(dY), dY, "max", (2, 2), (2, 2), (0, 0)))


def test_check_gradient_catches_an_lrn_gradient_with_the_window_the_wrong_way(broken):
    """Reading the forward window instead of its mirror is wrong for even sizes: the test must see it."""
    from stepnet.ops.pool import channel_window_sum

    def wrong(xp, X, Y, dY, *, size, alpha, beta, bias, order):
        scale = channel_window_sum(xp, X * X, 1, size, (size - 1) // 2) * (alpha / size) + bias
        ratios = channel_window_sum(xp, dY * Y / scale, 1, size, (size - 1) // 2)
        return dY * scale ** -beta - (2.0 * alpha * beta / size) * X * ratios
    broken("LRNGradient", wrong)
    with pytest.raises(AssertionError, match="LRN: gradient of input 0"):
        check_gradient("LRN", [rng.standard_normal((1, 6, 2, 2))], outputs=2, outputs_with_grads=[0], size=4,
                       alpha=0.9, beta=0.75, bias=1.0)
