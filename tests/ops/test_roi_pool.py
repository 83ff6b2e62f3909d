"""RoIPool and RoIPoolGradient against a pixel-by-pixel loop written from Caffe2's definition (roi_pool_op.cc:
rounded corners, floor/ceil bins, strict > so the first maximum wins, empty bins 0 with argmax -1), on every
device; is_test, NaN and -inf bins, float64 finite differences through the emitted gradient op, bad inputs
(at run time and statically), broken kernels caught."""
import math

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

rng = np.random.default_rng(41)
F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)


def c_round(v):
    return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)


def roi_pool_ref(x, rois, pooled_h, pooled_w, scale=1.0):
    """(Y, argmaxes) by visiting every pixel of every bin."""
    n, c, height, width = x.shape
    y = np.zeros((len(rois), c, pooled_h, pooled_w))
    arg = np.full(y.shape, -1, np.int32)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = (c_round(float(np.float32(v) * np.float32(scale))) for v in roi[1:])
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bh, bw = np.float32(rh) / np.float32(pooled_h), np.float32(rw) / np.float32(pooled_w)
        for p in range(pooled_h):
            for q in range(pooled_w):
                hs = min(max(int(math.floor(np.float32(p) * bh)) + y1, 0), height)
                he = min(max(int(math.ceil(np.float32(p + 1) * bh)) + y1, 0), height)
                ws = min(max(int(math.floor(np.float32(q) * bw)) + x1, 0), width)
                we = min(max(int(math.ceil(np.float32(q + 1) * bw)) + x1, 0), width)
                if he <= hs or we <= ws:
                    continue
                for ch in range(c):
                    best, where = -FLT_MAX, -1
                    for i in range(hs, he):
                        for j in range(ws, we):
                            if x[b, ch, i, j] > best:
                                best, where = float(x[b, ch, i, j]), i * width + j
                    y[r, ch, p, q], arg[r, ch, p, q] = best, where
    return y, arg


def roi_pool_grad_ref(x_shape, rois, arg, dy):
    dx = np.zeros(x_shape)
    for r, roi in enumerate(rois):
        for ch in range(x_shape[1]):
            for k, a in enumerate(arg[r, ch].ravel()):
                if a >= 0:
                    dx[int(roi[0]), ch].flat[a] += dy[r, ch].flat[k]
    return dx


def make_rois(n_images, count, height, width, scale):
    rows = []
    for k in range(count):
        x1, y1 = rng.uniform(-4, width / scale), rng.uniform(-4, height / scale)
        w, h = rng.uniform(0, 1.3 * width / scale), rng.uniform(0, 1.3 * height / scale)
        rows.append([k % n_images, x1, y1, x1 + w, y1 + h])
    rows += [[0, 2.5, 1.5, 1.0, 0.5], [n_images - 1, 1000, 1000, 1010, 1010]]   # malformed: 1x1; off the map
    return np.array(rows, F32)


CASES = [  # (id, X shape, RoI count, args)
    ("default-1x1", (1, 2, 5, 6), 3, {}),
    ("2x3", (2, 3, 7, 9), 5, {"pooled_h": 2, "pooled_w": 3}),
    ("scale", (2, 2, 8, 10), 5, {"pooled_h": 3, "pooled_w": 3, "spatial_scale": 0.25}),
    ("more-bins-than-pixels", (1, 2, 4, 4), 4, {"pooled_h": 7, "pooled_w": 6, "spatial_scale": 0.5}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,shape,count,args", CASES, ids=[c[0] for c in CASES])
def test_roi_pool(device, cid, shape, count, args):
    x = rng.standard_normal(shape).astype(F32)
    x[0, 0, 1, :3] = 5.0     # equal maxima: the first in row-major order wins
    rois = make_rois(shape[0], count, shape[2], shape[3], args.get("spatial_scale", 1.0))
    y, arg = run_op("RoIPool", [x, rois], 2, device=device, **args)
    want_y, want_arg = roi_pool_ref(x, rois, args.get("pooled_h", 1), args.get("pooled_w", 1),
                                    args.get("spatial_scale", 1.0))
    assert y.dtype == F32 and arg.dtype == np.int32
    np.testing.assert_array_equal(y, want_y.astype(F32))
    np.testing.assert_array_equal(arg, want_arg)
    assert (arg == -1).any() and (arg >= 0).any(), "the case should have empty and full bins"
    y_test = run_op("RoIPool", [x, rois], 1, device=device, is_test=True, **args)
    np.testing.assert_array_equal(y_test, y)


def test_roi_pool_hand_case():
    """A 2x2 RoI on a 3x4 map, 2x2 bins of one pixel each; a RoI past the map is all empty bins."""
    x = np.arange(12, dtype=F32).reshape(1, 1, 3, 4)
    rois = np.array([[0, 1, 0, 2, 1], [0, 9, 9, 12, 12]], F32)
    y, arg = run_op("RoIPool", [x, rois], 2, pooled_h=2, pooled_w=2)
    np.testing.assert_array_equal(y[0, 0], [[1, 2], [5, 6]])
    np.testing.assert_array_equal(arg[0, 0], [[1, 2], [5, 6]])
    np.testing.assert_array_equal(y[1], 0)
    np.testing.assert_array_equal(arg[1], -1)


def test_nan_and_minus_inf_never_win():
    x = np.array([[[[np.nan, 1.0], [-np.inf, np.nan]]], [[[-np.inf, np.nan], [np.nan, -np.inf]]]], F32)
    rois = np.array([[0, 0, 0, 1, 1], [1, 0, 0, 1, 1]], F32)
    y, arg = run_op("RoIPool", [x.reshape(2, 1, 2, 2), rois], 2)
    np.testing.assert_array_equal(y.ravel(), [1.0, -FLT_MAX])
    np.testing.assert_array_equal(arg.ravel(), [1, -1])


@pytest.mark.parametrize("device", DEVICES)
def test_roi_pool_gradient(device):
    x = rng.standard_normal((2, 3, 6, 7))
    rois = make_rois(2, 4, 6, 7, 1.0)
    check_gradient("RoIPool", [x, rois], 2, wrt=[0], outputs_with_grads=[0], device=device, pooled_h=2,
                   pooled_w=3)
    y, arg = run_op("RoIPool", [x.astype(F32), rois], 2, pooled_h=2, pooled_w=3)
    dy = rng.standard_normal(y.shape).astype(F32)
    dx = run_op("RoIPoolGradient", [x.astype(F32), rois, arg, dy], 1, device=device, pooled_h=2, pooled_w=3)
    np.testing.assert_allclose(dx, roi_pool_grad_ref(x.shape, rois, arg, dy), rtol=1e-6, atol=1e-6)


def test_gradient_op_as_caffe2_emits_it():
    fwd = make_op("RoIPool", ["X", "R"], ["Y", "A"], pooled_h=2)
    (grad,), _ = backward_ops([fwd], {"Y": "Y_grad"})
    assert grad.type == "RoIPoolGradient" and list(grad.input) == ["X", "R", "A", "Y_grad"]
    assert list(grad.output) == ["X_grad"]
    with pytest.raises(GradientError):   # is_test: no argmaxes to route the gradient through
        backward_ops([make_op("RoIPool", ["X", "R"], ["Y"], is_test=True)], {"Y": "Y_grad"})


X4 = np.zeros((1, 2, 4, 4), F32)
R5 = np.array([[0, 0, 0, 2, 2]], F32)
BAD = [  # (id, op, inputs, outputs, args, error, match)
    ("nhwc", "RoIPool", [X4, R5], 2, {"order": "NHWC"}, ArgumentError, "NCHW. only"),
    ("scale", "RoIPool", [X4, R5], 2, {"spatial_scale": 0.0}, ArgumentError, "spatial_scale"),
    ("pooled", "RoIPool", [X4, R5], 2, {"pooled_w": 0}, ArgumentError, "pooled_h and pooled_w"),
    ("rois-4-cols", "RoIPool", [X4, R5[:, 1:]], 2, {}, ShapeError, r"\(R, 5\)"),
    ("x-3d", "RoIPool", [X4[0], R5], 2, {}, ShapeError, "4-d"),
    ("int-x", "RoIPool", [X4.astype(np.int32), R5], 2, {}, DTypeError, "float"),
    ("grad-argmax-dtype", "RoIPoolGradient", [X4, R5, np.zeros((1, 2, 1, 1), np.int64), np.zeros((1, 2, 1, 1), F32)],
     1, {}, DTypeError, "int32"),
    ("grad-dy-shape", "RoIPoolGradient", [X4, R5, np.zeros((1, 2, 1, 1), np.int32), np.zeros((1, 2, 2, 1), F32)], 1,
     {}, ShapeError, "dY must have RoIPool's output shape"),
]
RUNTIME_ONLY = [
    ("batch-index", "RoIPool", [X4, R5 + np.array([1, 0, 0, 0, 0], F32)], 2, {}, ShapeError, "batch index 1"),
    ("grad-argmax-range", "RoIPoolGradient", [X4, R5, np.full((1, 2, 1, 1), 16, np.int32), np.zeros((1, 2, 1, 1), F32)],
     1, {}, ShapeError, r"\[-1, H\*W\)"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,n_out,args,err,match", BAD + RUNTIME_ONLY,
                         ids=[b[0] for b in BAD + RUNTIME_ONLY])
def test_bad_input(device, cid, op_type, inputs, n_out, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, n_out, device=device, **args)


@pytest.mark.parametrize("cid,op_type,inputs,n_out,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_found_statically(cid, op_type, inputs, n_out, args, err, match):
    with pytest.raises(err, match=match):
        infer_alone(op_type, inputs, n_out, **args)


def test_reference_checks_catch_broken_kernels(broken):
    pool = REGISTRY.get("RoIPool").kernel

    def last_max_wins(xp, x, rois, **k):     # ties resolved the other way round
        y, arg = pool(xp, x[..., ::-1, ::-1].copy(), rois, **k)
        return y, arg
    broken("RoIPool", last_max_wins)
    with pytest.raises(AssertionError):
        test_roi_pool("cpu", *CASES[1])
    grad = REGISTRY.get("RoIPoolGradient").kernel
    broken("RoIPoolGradient", lambda xp, x, r, a, dy, **k: grad(xp, x, r, a, dy * 2, **k))
    with pytest.raises(AssertionError):
        test_roi_pool_gradient("cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_with_no_rois_is_zero(device):
    """No RoIs (a detector's batch without proposals): dX is zeros of X's shape."""
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    rois = np.zeros((0, 5), np.float32)
    y, argmax = run_op("RoIPool", [x, rois], 2, device=device, pooled_h=2, pooled_w=2)
    dx = run_op("RoIPoolGradient", [x, rois, argmax, y], 1, device=device, pooled_h=2, pooled_w=2)
    assert dx.shape == x.shape and not dx.any()


@pytest.mark.parametrize("op_type", ["RoIPool", "RoIAlign"])
def test_no_rois_with_a_huge_pooled_size_allocates_nothing(op_type):
    """pooled_h is an argument of the file: with no RoIs the output is empty, and nothing pooled_h long is
    built (an arange of 2^31 floats once: 8 GB of page faults)."""
    from stepnet.testing import allocates_under

    x = np.ones((1, 2, 6, 6), np.float32)
    rois = np.zeros((0, 5), np.float32)
    with allocates_under(1 << 20):
        y = run_op(op_type, [x, rois], 1, pooled_h=2 ** 31, pooled_w=2, spatial_scale=1.0)
    assert y.shape == (0, 2, 2 ** 31, 2)
