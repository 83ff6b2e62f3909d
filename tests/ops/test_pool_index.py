"""MaxPoolWithIndex and its gradient (stepnet/ops/pool.py, pool_grad.py) against a loop written from Caffe2's
CUDA kernels (max_pool_with_index.cu): per output, the window's pixels in row-major order, a float32 running
maximum from -FLT_MAX replaced on a strict >, Index = h·W + w in the (n, c) plane (-1 when nothing beat the
start); the gradient adds dY at each Index. Ties, padding, -inf and NaN windows, float16; finite differences;
the maker's wiring; bad inputs; a broken kernel caught; brew's helper runs."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, check_gradient, make_op, run_op

rng = np.random.default_rng(23)
LOWEST = np.finfo(np.float32).min


def out_size(n, k, s, p0, p1):
    return (n + p0 + p1 - k) // s + 1


def reference(x, k, s, p, strict=True):
    """The CUDA kernel's loop (float32 comparisons, strict >), for square kernel/stride/pad (strict=False: >=,
    a broken kernel's rule)."""
    n, c, h, w = x.shape
    oh, ow = out_size(h, k, s, p, p), out_size(w, k, s, p, p)
    y = np.empty((n, c, oh, ow), np.float32)
    index = np.empty((n, c, oh, ow), np.int32)
    xf = x.astype(np.float32)
    for b, ch, i, j in np.ndindex(n, c, oh, ow):
        best, at = LOWEST, -1
        for hh in range(max(i * s - p, 0), min(i * s - p + k, h)):
            for ww in range(max(j * s - p, 0), min(j * s - p + k, w)):
                if xf[b, ch, hh, ww] > best or (not strict and xf[b, ch, hh, ww] == best):
                    best, at = xf[b, ch, hh, ww], hh * w + ww
        y[b, ch, i, j], index[b, ch, i, j] = best, at
    return y.astype(x.dtype), index.reshape(-1)


def gradient_reference(x, dy, index):
    dx = np.zeros(x.size, np.float64)
    n, c, h, w = x.shape
    planes = np.repeat(np.arange(n * c) * h * w, dy.size // (n * c))
    for base, at, g in zip(planes, index, dy.reshape(-1).astype(np.float64)):
        if at >= 0:
            dx[base + at] += g
    return dx.reshape(x.shape).astype(x.dtype)


CASES = [((2, 3, 5, 6), 2, 2, 0), ((1, 2, 7, 7), 3, 2, 1), ((2, 1, 4, 5), 3, 1, 1), ((1, 1, 6, 4), 2, 1, 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, k, s, p", CASES)
def test_values_and_indices_match_the_kernel_loop(shape, k, s, p, device):
    for x in (rng.standard_normal(shape).astype(np.float32),
              rng.integers(-2, 3, shape).astype(np.float32)):       # small integers: ties in most windows
        y, index = run_op("MaxPoolWithIndex", [x], 2, device=device, kernel=k, stride=s, pad=p)
        want_y, want_index = reference(x, k, s, p)
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(index, want_index)
        assert index.dtype == np.int32 and y.dtype == np.float32


def test_windows_with_nothing_above_the_start_and_float16():
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    x[0, 0, :2, :2] = -np.inf
    x[0, 1, 2:, 2:] = np.nan
    y, index = run_op("MaxPoolWithIndex", [x], 2, kernel=2, stride=2)
    want_y, want_index = reference(x, 2, 2, 0)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(index, want_index)
    assert y[0, 0, 0, 0] == LOWEST and index[0] == -1 and index[7] == -1
    h = rng.standard_normal((2, 2, 5, 5)).astype(np.float16)
    y16, index16 = run_op("MaxPoolWithIndex", [h], 2, kernel=3, stride=2, pad=1)
    want_y, want_index = reference(h, 3, 2, 1)
    assert y16.dtype == np.float16
    np.testing.assert_array_equal(y16, want_y)
    np.testing.assert_array_equal(index16, want_index)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, k, s, p", CASES)
def test_gradient_adds_dy_at_each_index(shape, k, s, p, device):
    x = rng.integers(-2, 3, shape).astype(np.float32)
    _, index = reference(x, k, s, p)
    dy = rng.standard_normal((shape[0], shape[1], out_size(shape[2], k, s, p, p),
                              out_size(shape[3], k, s, p, p))).astype(np.float32)
    dx = run_op("MaxPoolWithIndexGradient", [x, dy, index], device=device, kernel=k, stride=s, pad=p)
    np.testing.assert_allclose(dx, gradient_reference(x, dy, index), rtol=1e-6, atol=1e-6)   # (sum order)


def test_gradient_matches_finite_differences_and_the_maker_wires_it():
    x = rng.permutation(2 * 2 * 6 * 6).reshape(2, 2, 6, 6).astype(np.float64) / 7   # distinct: no ties
    check_gradient("MaxPoolWithIndex", [x.astype(np.float32)], outputs=2, outputs_with_grads=[0],
                   kernel=3, stride=2, pad=1)
    ops, grads = backward_ops([make_op("MaxPoolWithIndex", ["x"], ["y", "idx"], kernel=2)], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("MaxPoolWithIndexGradient", ["x", "y_grad", "idx"], ["x_grad"])]
    assert grads["x"] == "x_grad"


def test_bad_inputs_are_refused_with_one_line():
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    with pytest.raises(ArgumentError, match="NCHW only"):
        run_op("MaxPoolWithIndex", [x], 2, kernel=2, order="NHWC")
    with pytest.raises(ArgumentError, match="4-D"):
        run_op("MaxPoolWithIndex", [x[0]], 2, kernel=2)
    with pytest.raises(DTypeError, match="float32, float16 or float64"):
        run_op("MaxPoolWithIndex", [x.astype(np.int32)], 2, kernel=2)
    _, index = reference(x, 2, 2, 0)
    dy = np.ones((1, 2, 2, 2), np.float32)
    for bad, match in ((np.where(np.arange(8) == 3, 16, index).astype(np.int32), r"Index\[3\] = 16 is outside"),
                       (index.astype(np.int64), "int32"), (index[:4], "shape")):
        with pytest.raises((ShapeError, DTypeError), match=match):
            run_op("MaxPoolWithIndexGradient", [x, dy, bad], kernel=2, stride=2)


def test_the_check_catches_a_kernel_that_keeps_the_last_tie(broken):
    broken("MaxPoolWithIndex", lambda xp, X, **args: reference(X, args["kernel"], args["stride"], args["pad"],
                                                               strict=False))
    with pytest.raises(AssertionError):
        test_values_and_indices_match_the_kernel_loop((1, 2, 7, 7), 3, 2, 1, "cpu")


def test_brews_max_pool_with_index_runs():
    from stepnet.compat import brew, model_helper, workspace
    model = model_helper.ModelHelper(name="mpi")
    brew.max_pool_with_index(model, "data", "pool", kernel=3, stride=2, pad=1)
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    workspace.ResetWorkspace()
    workspace.FeedBlob("data", x)
    workspace.RunNetOnce(model.net)
    want_y, want_index = reference(x, 3, 2, 1)
    np.testing.assert_array_equal(workspace.FetchBlob("pool"), want_y)
    np.testing.assert_array_equal(workspace.FetchBlob(model.net.Proto().op[0].output[1]), want_index)
    workspace.ResetWorkspace()
