"""Gradients of PadImage, ResizeNearest and ChannelShuffle: float64 finite differences for every mode, pad
form (incl. negative pads that crop), scale (up, down, from the scales input) and group, both orders, both
devices; the gradient ops against Caffe2's loops (pad_op.cc, resize_op.cc); the emitted ops; bad inputs;
broken kernels caught."""
import itertools

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(17)


def in_order(x, order):
    return x if order == "NCHW" else np.ascontiguousarray(np.moveaxis(x, 1, -1))


def sig(ops):
    return [(o.type, list(o.input), list(o.output)) for o in ops]


# ----------------------------------------------------------------------------------------------- PadImage
PAD_FORMS = [dict(pads=[2, 1, 0, 3]), dict(pad=1), dict(pad_t=-1, pad_l=2, pad_b=1, pad_r=-2),
             dict(pads=[3, 0, 1, 2])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", PAD_FORMS)
def test_pad_image_gradient_matches_finite_differences(pads, mode, order, device):
    X = rng.standard_normal((2, 2, 4, 5))
    check_gradient("PadImage", [in_order(X, order)], device=device, order=order, mode=mode, value=0.5, **pads)


def ref_pad_grad(dY, t, left, b, r, mode):
    """pad_op.cc's loops (NCHW): every padded pixel adds its gradient to the pixel it was copied from."""
    H, W = dY.shape[2] - t - b, dY.shape[3] - left - r
    dX = np.zeros(dY.shape[:2] + (H, W))
    for n, c, ph, pw in itertools.product(*(range(v) for v in dY.shape)):
        h, w = ph - t, pw - left
        if mode == "constant":
            if not (0 <= h < H and 0 <= w < W):
                continue
        elif mode == "reflect":
            h, w = max(h, -h), max(w, -w)
            h, w = min(h, 2 * H - h - 2), min(w, 2 * W - w - 2)
        else:
            h, w = min(H - 1, max(h, 0)), min(W - 1, max(w, 0))
        dX[n, c, h, w] += dY[n, c, ph, pw]
    return dX


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_image_gradient_matches_caffe2s_loops(mode, order, device):
    dY = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    dX = run_op("PadImageGradient", [in_order(dY, order)], device=device, order=order, mode=mode,
                pads=[2, 1, 1, 2])
    assert dX.dtype == np.float32
    np.testing.assert_allclose(dX, in_order(ref_pad_grad(dY, 2, 1, 1, 2, mode), order), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------- ResizeNearest
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("scales", [(2.0, 2.0), (1.7, 0.6), (0.5, 3.0), (1.0, 1.0)])
def test_resize_nearest_gradient_matches_finite_differences(scales, order, device):
    X = rng.standard_normal((2, 2, 4, 5))
    check_gradient("ResizeNearest", [in_order(X, order)], device=device, order=order, height_scale=scales[0],
                   width_scale=scales[1])


@pytest.mark.parametrize("device", DEVICES)
def test_resize_nearest_gradient_with_a_scales_input(device):
    X = rng.standard_normal((1, 2, 3, 4))
    check_gradient("ResizeNearest", [X, np.array([2.0, 1.5], np.float32)], wrt=[0], device=device)
    ops, grads = backward_ops([make_op("ResizeNearest", ["x", "scales"], ["y"])], {"y": "dy"})
    assert sig(ops) == [("ResizeNearestGradient", ["dy", "x", "scales"], ["x_grad"])]
    assert "scales" not in grads


@pytest.mark.parametrize("device", DEVICES)
def test_resize_nearest_gradient_matches_caffe2s_loops(device):
    X = np.zeros((1, 2, 3, 5), np.float32)
    hs, ws = 1.5, 0.7
    dY = rng.standard_normal((1, 2, 4, 3)).astype(np.float32)
    dX = run_op("ResizeNearestGradient", [dY, X], device=device, height_scale=hs, width_scale=ws)
    want = np.zeros(X.shape)
    for n, c, y, x in itertools.product(*(range(v) for v in dY.shape)):
        want[n, c, min(int(y / np.float32(hs)), 2), min(int(x / np.float32(ws)), 4)] += dY[n, c, y, x]
    np.testing.assert_allclose(dX, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------- ChannelShuffle
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape, group", [((2, 6, 2, 3), 2), ((2, 6, 2, 3), 3), ((1, 4, 5), 4),
                                          ((2, 3, 2, 2), 1)])
def test_channel_shuffle_gradient_matches_finite_differences(shape, group, order, device):
    X = in_order(rng.standard_normal(shape), order)
    check_gradient("ChannelShuffle", [X], device=device, order=order, group=group)


@pytest.mark.parametrize("device", DEVICES)
def test_channel_shuffle_gradient_undoes_the_shuffle(device):
    X = rng.standard_normal((2, 6, 3)).astype(np.float32)
    Y = run_op("ChannelShuffle", [X], device=device, group=2)
    np.testing.assert_array_equal(run_op("ChannelShuffleGradient", [Y], device=device, group=2), X)


# ------------------------------------------------------------------------------------------ makers, errors
def test_single_input_makers():
    for op_type, args in (("PadImage", dict(pad=1)), ("ChannelShuffle", dict(group=2)),
                          ("ResizeNearest", dict(width_scale=2.0))):
        ops, _ = backward_ops([make_op(op_type, ["x"], ["y"], **args)], {"y": "dy"})
        grad_inputs = ["dy", "x"] if op_type == "ResizeNearest" else ["dy"]
        assert sig(ops) == [(op_type + "Gradient", grad_inputs, ["x_grad"])]


def test_bad_inputs():
    dY = np.zeros((1, 1, 3, 3), np.float32)
    with pytest.raises(ShapeError, match=r"smaller than the pads \(2, 2, 2, 2\)"):
        run_op("PadImageGradient", [dY], pad=2)
    with pytest.raises(ShapeError, match="reflect padding"):
        run_op("PadImageGradient", [np.zeros((1, 1, 7, 7), np.float32)], pad=3, mode="reflect")
    with pytest.raises(ArgumentError, match="mode must be one of"):
        run_op("PadImageGradient", [dY], pad=1, mode="wrap")
    with pytest.raises(ShapeError, match=r"dY has shape \(1, 1, 3, 3\) but resizing X \(1, 1, 2, 2\)"):
        run_op("ResizeNearestGradient", [dY, np.zeros((1, 1, 2, 2), np.float32)], width_scale=2.0,
               height_scale=2.0)
    with pytest.raises(ShapeError, match="group=2 must divide the 3 channels"):
        run_op("ChannelShuffleGradient", [np.zeros((1, 3, 2), np.float32)], group=2)


# ----------------------------------------------------------------------------------------------- the testers
def test_check_gradient_catches_a_reflect_pad_gradient_that_drops_the_border(broken):
    kernel = REGISTRY.get("PadImageGradient").kernel
    broken("PadImageGradient", lambda xp, dY, **args: kernel(xp, dY, **dict(args, mode="constant")))
    check_gradient("PadImage", [rng.standard_normal((1, 1, 3, 4))], pad=1, mode="constant")  # still right
    with pytest.raises(AssertionError, match="PadImage: gradient of input 0"):
        check_gradient("PadImage", [rng.standard_normal((1, 1, 3, 4))], pad=1, mode="reflect")


def test_check_gradient_catches_a_shuffle_gradient_that_shuffles_forward(broken):
    kernel = REGISTRY.get("ChannelShuffleGradient").kernel
    broken("ChannelShuffleGradient",
           lambda xp, dY, *, group, **k: kernel(xp, dY, group=dY.shape[1] // group, **k))
    with pytest.raises(AssertionError, match="ChannelShuffle: gradient of input 0"):
        check_gradient("ChannelShuffle", [rng.standard_normal((1, 6, 2))], group=2)


def test_the_loop_reference_catches_a_resize_gradient_that_copies_instead_of_adding(broken):
    def wrong(xp, dY, X, *scales, width_scale, height_scale, order):
        dX = np.zeros(X.shape, dY.dtype)
        rows = np.minimum((np.arange(dY.shape[2]) / np.float32(height_scale)).astype(int), X.shape[2] - 1)
        cols = np.minimum((np.arange(dY.shape[3]) / np.float32(width_scale)).astype(int), X.shape[3] - 1)
        dX[:, :, rows[:, None], cols[None, :]] = dY   # the last write wins: sums are lost
        return dX
    broken("ResizeNearestGradient", wrong)
    with pytest.raises(AssertionError):
        test_resize_nearest_gradient_matches_caffe2s_loops("cpu")
