"""Gradients of SpatialBN, Dropout, LayerNorm, InstanceNorm, GroupNorm and Normalize: every differentiable
input against float64 finite differences (training-mode SpatialBN with X, scale and bias; 1-D/2-D/3-D
images; both orders) on both devices; SpatialBNGradient against a per-channel loop reference, including
Caffe2's test-mode and num_batches forms; the emitted ops; bad inputs; broken kernels caught."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(13)
SHAPES = [(3, 4, 5), (2, 3, 4, 3), (2, 3, 2, 3, 2)]   # NCHW: 1-D, 2-D and 3-D images
GRADS = ["x_grad", "g_grad", "b_grad"]


def in_order(x, order):
    return x if order == "NCHW" else np.ascontiguousarray(np.moveaxis(x, 1, -1))


def sig(ops):
    return [(o.type, list(o.input), list(o.output)) for o in ops]


# ----------------------------------------------------------------------------------------------- SpatialBN
def bn_inputs(shape, order):
    c = shape[1]
    return {"x": in_order(rng.standard_normal(shape) * 2 + 1, order), "scale": rng.uniform(0.5, 1.5, c),
            "bias": rng.standard_normal(c), "rm": rng.standard_normal(c), "rv": rng.uniform(0.5, 2, c)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES)
def test_training_spatial_bn_gradient_matches_finite_differences(shape, order, device):
    got = check_gradient("SpatialBN", bn_inputs(shape, order), outputs=["y", "rm", "rv", "sm", "siv"],
                         outputs_with_grads=[0], wrt=[0, 1, 2], device=device, order=order, is_test=0,
                         epsilon=1e-3, momentum=0.8)
    assert set(got) == {"x", "scale", "bias"}


def test_spatial_bn_makers_follow_caffe2s_three_modes():
    train = make_op("SpatialBN", ["x", "s", "b", "rm", "rv"], ["y", "rm", "rv", "sm", "siv"], is_test=0)
    ops, grads = backward_ops([train], {"y": "dy"})
    assert sig(ops) == [("SpatialBNGradient", ["x", "s", "dy", "sm", "siv"], ["x_grad", "s_grad", "b_grad"])]
    assert "rm" not in grads and "rv" not in grads   # the running statistics have no gradient
    test = make_op("SpatialBN", ["x", "s", "b", "m", "v"], ["y"], is_test=1)
    ops, _ = backward_ops([test], {"y": "dy"})
    assert sig(ops) == [("SpatialBNGradient", ["x", "s", "dy", "m", "v"], ["x_grad", "s_grad", "b_grad"])]
    assert {a.name: argument_value(a) for a in ops[0].arg}["is_test"] == 1
    multi = make_op("SpatialBN", ["x", "s", "b", "rm", "rv", "sums", "sumsq"], ["y", "rm", "rv", "sm", "siv"],
                    is_test=0, num_batches=2)
    ops, _ = backward_ops([multi], {"y": "dy"})
    assert sig(ops) == [("SpatialBNGradient", ["x", "s", "dy", "sm", "siv", "s_grad", "b_grad"],
                         ["x_grad", "s_grad", "b_grad"])]
    with pytest.raises(GradientError, match="needs 5 inputs and 1 output"):
        backward_ops([make_op("SpatialBN", ["x", "s", "b", "m", "v"], ["y", "a", "b2", "c", "d"], is_test=1)],
                     {"y": "dy"})


def ref_bn_grad(X, scale, dY, mean, rstd, sums=None, num_batches=1):
    """Per channel, from the definitions (NCHW): dbias = sum dY, dscale = sum dY (x - mean) rstd (or the given
    sums / num_batches), dX = scale rstd (dY - (dbias + (x - mean) rstd dscale) / count)."""
    C = X.shape[1]
    dX, dscale, dbias = np.zeros(X.shape), np.zeros(C), np.zeros(C)
    for c in range(C):
        x, dy = X[:, c].astype(np.float64), dY[:, c].astype(np.float64)
        if sums is None:
            dbias[c] = dy.sum()
            dscale[c] = (dy * (x - mean[c]) * rstd[c]).sum()
        else:
            dscale[c], dbias[c] = sums[0][c] / num_batches, sums[1][c] / num_batches
        dX[:, c] = scale[c] * rstd[c] * (dy - (dbias[c] + (x - mean[c]) * rstd[c] * dscale[c]) / x.size)
    return dX, dscale, dbias


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["train", "test", "num_batches"])
def test_spatial_bn_gradient_op_matches_the_reference(mode, order, device):
    """Test mode is Caffe2's: the running mean and *variance* are read as if they were the saved mean and
    inverse std (the gradient op does not know the difference), so dX is the batch formula on them."""
    X = rng.standard_normal((3, 4, 2, 3)).astype(np.float32)
    dY = rng.standard_normal(X.shape).astype(np.float32)
    scale, mean, second = (rng.uniform(0.5, 1.5, 4).astype(np.float32) for _ in range(3))
    sums = [rng.standard_normal(4).astype(np.float32) for _ in range(2)] if mode == "num_batches" else []
    args = dict(is_test=int(mode == "test"), num_batches=2 if sums else 1, order=order)
    got = run_op("SpatialBNGradient", [in_order(X, order), scale, in_order(dY, order), mean, second, *sums],
                 outputs=3, device=device, **args)
    want = ref_bn_grad(X, scale, dY, mean, second, sums or None, 2)
    np.testing.assert_allclose(got[0], in_order(want[0], order), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-5)
    assert all(g.dtype == np.float32 for g in got)


# ----------------------------------------------------------------------------------------------- Dropout
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_test, outputs", [(0, 2), (1, 1), (1, 2)])
def test_dropout_gradient_matches_finite_differences(is_test, outputs, device):
    check_gradient("Dropout", [rng.standard_normal((4, 5))], outputs=outputs, outputs_with_grads=[0],
                   device=device, ratio=0.4, is_test=is_test)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_grad_op_scales_the_kept_elements(device):
    dY = rng.standard_normal((3, 4)).astype(np.float32)
    mask = rng.random((3, 4)) < 0.5
    got = run_op("DropoutGrad", [dY, mask], device=device, ratio=0.25)
    want = [[dY[i, j] / 0.75 if mask[i, j] else 0.0 for j in range(4)] for i in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(run_op("DropoutGrad", [dY], device=device, is_test=1), dY)


def test_dropout_makers_and_bad_inputs():
    ops, _ = backward_ops([make_op("Dropout", ["x"], ["y", "mask"], ratio=0.3)], {"y": "dy"})
    assert sig(ops) == [("DropoutGrad", ["dy", "mask"], ["x_grad"])]
    ops, _ = backward_ops([make_op("Dropout", ["x"], ["y"], is_test=1)], {"y": "dy"})
    assert sig(ops) == [("DropoutGrad", ["dy"], ["x_grad"])]
    dY = np.ones((2, 2), np.float32)
    with pytest.raises(ArgumentError, match="needs the mask input"):
        run_op("DropoutGrad", [dY])
    with pytest.raises(DTypeError, match="mask must be bool"):
        run_op("DropoutGrad", [dY, dY])


# ----------------------------------------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("shape, axis", [((3, 5), 1), ((2, 3, 4), 2), ((2, 3, 4), 1), ((4, 2, 3), -1)])
def test_layer_norm_gradient_matches_finite_differences(shape, axis, affine, device):
    cols = int(np.prod(shape[axis % len(shape):]))
    inputs = [rng.standard_normal(shape)] + ([rng.standard_normal(cols), rng.standard_normal(cols)] if affine
                                             else [])
    got = check_gradient("LayerNorm", inputs, outputs=3, outputs_with_grads=[0], device=device, axis=axis,
                         elementwise_affine=affine, epsilon=1e-3)
    assert len(got) == len(inputs)


def test_layer_norm_makers_and_bad_inputs():
    ops, _ = backward_ops([make_op("LayerNorm", ["x"], ["y", "m", "s"])], {"y": "dy"})
    assert sig(ops) == [("LayerNormGradient", ["dy", "y", "m", "s", "x"], ["x_grad"])]
    ops, _ = backward_ops([make_op("LayerNorm", ["x", "g", "b"], ["y", "m", "s"], elementwise_affine=1)],
                          {"y": "dy"})
    assert sig(ops) == [("LayerNormGradient", ["dy", "y", "m", "s", "x", "g"], GRADS)]
    x = np.ones((2, 3), np.float32)
    stats = np.ones((2, 1), np.float32)
    with pytest.raises(ArgumentError, match="gamma as a 6th input exactly when elementwise_affine=1"):
        run_op("LayerNormGradient", [x, x, stats, stats, x], outputs=3, elementwise_affine=1)
    with pytest.raises(ShapeError, match=r"mean must hold prod\(X.shape\[:axis\]\) = 2 values"):
        run_op("LayerNormGradient", [x, x, np.ones(3, np.float32), stats, x])


# -------------------------------------------------------------------------------- InstanceNorm / GroupNorm
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape, outputs", [(SHAPES[0], 1), (SHAPES[1], 2), (SHAPES[1], 3), (SHAPES[2], 3)])
def test_instance_norm_gradient_matches_finite_differences(shape, outputs, order, device):
    c = shape[1]
    inputs = [in_order(rng.standard_normal(shape), order), rng.uniform(0.5, 1.5, c), rng.standard_normal(c)]
    got = check_gradient("InstanceNorm", inputs, outputs=outputs, outputs_with_grads=[0], device=device,
                         order=order, epsilon=1e-3)
    assert len(got) == 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape, group", [((2, 4, 3, 2), 2), ((2, 6, 5), 3), ((1, 4, 2, 2, 3), 1),
                                          ((2, 3, 4, 2), 3)])
def test_group_norm_gradient_matches_finite_differences(shape, group, order, device):
    c = shape[1]
    inputs = [in_order(rng.standard_normal(shape), order), rng.uniform(0.5, 1.5, c), rng.standard_normal(c)]
    got = check_gradient("GroupNorm", inputs, outputs=3, outputs_with_grads=[0], device=device, order=order,
                         group=group, is_test=0, epsilon=1e-3)
    assert len(got) == 3


def test_instance_and_group_norm_makers_and_bad_inputs():
    for outs, extra in ((["y"], []), (["y", "m"], ["m"]), (["y", "m", "r"], ["m", "r"])):
        ops, _ = backward_ops([make_op("InstanceNorm", ["x", "s", "b"], outs)], {"y": "dy"})
        assert sig(ops) == [("InstanceNormGradient", ["x", "s", "b", "dy", *extra], ["x_grad", "s_grad",
                                                                                       "b_grad"])]
    ops, _ = backward_ops([make_op("GroupNorm", ["x", "g", "b"], ["y", "m", "r"], group=2, is_test=0)],
                          {"y": "dy"})
    assert sig(ops) == [("GroupNormGradient", ["dy", "x", "g", "b", "m", "r"], GRADS)]
    with pytest.raises(GradientError, match="reads its mean and inv_std outputs"):
        backward_ops([make_op("GroupNorm", ["x", "g", "b"], ["y"], group=2)], {"y": "dy"})
    x, v = np.ones((2, 4, 3), np.float32), np.ones(4, np.float32)
    with pytest.raises(ShapeError, match=r"inv_std must have shape \(N, group\) = \(2, 2\)"):
        run_op("GroupNormGradient", [x, x, v, v, np.ones((2, 2), np.float32), np.ones((2, 4), np.float32)],
               outputs=3, group=2)
    with pytest.raises(ShapeError, match=r"mean must have shape \(N, C\) = \(2, 4\)"):
        run_op("InstanceNormGradient", [x, v, v, x, np.ones((4, 2), np.float32)], outputs=3)


# ----------------------------------------------------------------------------------------------- Normalize
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_normalize_gradient_matches_finite_differences(axis, device):
    check_gradient("Normalize", [rng.standard_normal((3, 4, 2))], device=device, axis=axis)
    ops, _ = backward_ops([make_op("Normalize", ["x"], ["y"], axis=axis)], {"y": "dy"})
    assert sig(ops) == [("NormalizeGradient", ["x", "dy"], ["x_grad"])]


# ----------------------------------------------------------------------------------------------- the testers
def test_check_gradient_catches_a_batch_norm_gradient_without_the_mean_term(broken):
    def wrong(xp, X, scale, dY, mean, rstd, *sums, **args):
        keep = (1, -1, 1, 1)
        dbias = dY.sum(axis=(0, 2, 3))
        dscale = (dY * (X - mean.reshape(keep))).sum(axis=(0, 2, 3)) * rstd
        dx = scale.reshape(keep) * rstd.reshape(keep) * dY    # forgets that the batch statistics depend on X
        return dx, dscale, dbias
    broken("SpatialBNGradient", wrong)
    with pytest.raises(AssertionError, match="SpatialBN: gradient of input 0"):
        check_gradient("SpatialBN", bn_inputs((3, 2, 2, 2), "NCHW"), outputs=["y", "rm", "rv", "sm", "siv"],
                       outputs_with_grads=[0], wrt=[0, 1, 2], is_test=0)


def test_check_gradient_catches_a_group_norm_gradient_with_the_wrong_group(broken):
    kernel = REGISTRY.get("GroupNormGradient").kernel

    def wrong(xp, dY, X, gamma, beta, mu, rsig, *, group, **args):
        return kernel(xp, dY, X, gamma, beta, mu[:, ::-1], rsig[:, ::-1], group=group, **args)
    broken("GroupNormGradient", wrong)
    with pytest.raises(AssertionError, match="GroupNorm: gradient of input"):
        check_gradient("GroupNorm", [rng.standard_normal((2, 4, 3)), rng.uniform(0.5, 1.5, 4),
                                     rng.standard_normal(4)], outputs=3, outputs_with_grads=[0], group=2,
                       is_test=0)


def test_the_reference_catches_a_bn_gradient_that_ignores_the_summed_gradients(broken):
    kernel = REGISTRY.get("SpatialBNGradient").kernel

    def wrong(xp, X, scale, dY, mean, rstd, *sums, num_batches, **args):
        return kernel(xp, X, scale, dY, mean, rstd, num_batches=1, **args)  # recomputes them from this batch
    broken("SpatialBNGradient", wrong)
    X = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    v, sums = np.ones(3, np.float32), [np.full(3, 4.0, np.float32)] * 2
    got = run_op("SpatialBNGradient", [X, v, X, v * 0, v, *sums], outputs=3, num_batches=2)
    want = ref_bn_grad(X, v, X, v * 0, v, sums, 2)
    assert not all(np.allclose(g, w) for g, w in zip(got, want, strict=True))


def test_every_differentiable_input_is_covered():
    """The makers give each float input of these forwards a gradient (SpatialBN: all but the running stats,
    see above)."""
    for op_type, ins, outs, args in [
            ("InstanceNorm", ["x", "s", "b"], ["y"], {}), ("GroupNorm", ["x", "g", "b"], ["y", "m", "r"], {}),
            ("LayerNorm", ["x", "g", "b"], ["y", "m", "s"], {"elementwise_affine": 1}),
            ("Normalize", ["x"], ["y"], {}), ("Dropout", ["x"], ["y", "mask"], {})]:
        _, grads = backward_ops([make_op(op_type, ins, outs, **args)], {"y": "dy"})
        assert all(grads[i] == f"{i}_grad" for i in ins)
