"""RoIAlign and RoIAlignGradient against Caffe2's per-sample loops (box_reference.py) in both orders, with
every grid rule (sampling_ratio > 0, adaptive), aligned or not, RoIs with and without a batch column, RoIs
over the border and empty RoIs, on every device; float64 finite differences; the emitted gradient op; bad
inputs; broken kernels caught."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

import box_reference as ref

rng = np.random.default_rng(31)
F32 = np.float32


def nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


def rois_for(n_images, count, height, width, scale):
    """RoIs in image pixels: most inside the map, some over its border, one smaller than a pixel."""
    rows = []
    for k in range(count):
        b = k % n_images
        x1, y1 = rng.uniform(-3, width / scale), rng.uniform(-3, height / scale)
        w, h = rng.uniform(0.3, 1.2 * width / scale), rng.uniform(0.3, 1.2 * height / scale)
        rows.append([b, x1, y1, x1 + w, y1 + h])
    rows.append([0, 2.0, 3.0, 2.4, 3.2])
    return np.array(rows, F32)


CASES = [  # (id, X shape NCHW, RoIs, args)
    ("adaptive", (2, 3, 7, 9), 5, {"pooled_h": 2, "pooled_w": 3}),
    ("ratio-2", (1, 2, 6, 6), 4, {"pooled_h": 3, "pooled_w": 3, "sampling_ratio": 2, "spatial_scale": 0.5}),
    ("aligned", (2, 2, 8, 5), 4, {"pooled_h": 4, "pooled_w": 2, "aligned": True, "spatial_scale": 0.25}),
    ("detectron", (1, 4, 10, 12), 3, {"pooled_h": 14, "pooled_w": 14, "sampling_ratio": 0, "spatial_scale": 0.0625}),
    ("one-image-4-cols", (1, 2, 5, 6), 3, {"pooled_h": 2, "pooled_w": 2, "sampling_ratio": 1}),
]


def case_data(shape, count, args, dtype=F32):
    x = rng.standard_normal(shape).astype(dtype)
    rois = rois_for(shape[0], count, shape[2], shape[3], args.get("spatial_scale", 1.0)).astype(dtype)
    return x, rois


def ref_args(args):
    return dict(pooled_h=args["pooled_h"], pooled_w=args["pooled_w"], scale=args.get("spatial_scale", 1.0),
                ratio=args.get("sampling_ratio", -1), aligned=args.get("aligned", False))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("cid,shape,count,args", CASES, ids=[c[0] for c in CASES])
def test_roi_align(device, order, cid, shape, count, args):
    x, rois = case_data(shape, count, args)
    if cid.endswith("4-cols"):
        rois = np.ascontiguousarray(rois[:, 1:])
    got = run_op("RoIAlign", [x if order == "NCHW" else nhwc(x), rois], 1, device=device, order=order, **args)
    want = ref.roi_align(x, rois, **ref_args(args))
    assert got.dtype == F32
    np.testing.assert_allclose(got, want if order == "NCHW" else nhwc(want), rtol=1e-5, atol=1e-5)


def test_roi_align_hand_case():
    """One sample per bin on a 2x2 map: at (0.5, 0.5) it averages the four pixels; a RoI over 2 pixels
    outside the map reads 0; at (1, 1) it reads the last pixel; aligned, the first RoI's sample is (0, 0)."""
    x = np.array([[[[1, 2], [3, 4]]]], F32)
    rois = np.array([[0, 0, 0, 1, 1], [0, -4, -4, -3, -3], [0, 0, 0, 2, 2]], F32)
    y = run_op("RoIAlign", [x, rois], 1, sampling_ratio=1)
    np.testing.assert_array_equal(y.ravel(), [2.5, 0.0, 4.0])
    y = run_op("RoIAlign", [x, rois[:1]], 1, sampling_ratio=1, aligned=True)   # centre (0, 0): pixel 1
    np.testing.assert_array_equal(y.ravel(), [1.0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_roi_align_without_rois(device, order):
    x = rng.standard_normal((1, 3, 4, 4)).astype(F32)
    y = run_op("RoIAlign", [x if order == "NCHW" else nhwc(x), np.zeros((0, 5), F32)], 1, device=device,
               pooled_h=2, pooled_w=5, order=order)
    assert y.shape == ((0, 3, 2, 5) if order == "NCHW" else (0, 2, 5, 3))
    dx = run_op("RoIAlignGradient", [x, np.zeros((0, 5), F32), np.zeros((0, 3, 2, 5), F32)], 1, device=device,
                pooled_h=2, pooled_w=5)
    np.testing.assert_array_equal(dx, np.zeros_like(x))


# ------------------------------------------------------------------------------------------- gradient
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("cid,shape,count,args", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_roi_align_gradient_matches_finite_differences(device, order, cid, shape, count, args):
    x, rois = case_data(shape, count, args, np.float64)
    check_gradient("RoIAlign", [x if order == "NCHW" else nhwc(x), rois], wrt=[0], device=device, order=order,
                   **args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("cid,shape,count,args", CASES, ids=[c[0] for c in CASES])
def test_roi_align_gradient_matches_caffe2s_loops(device, order, cid, shape, count, args):
    x, rois = case_data(shape, count, args)
    dy = rng.standard_normal((len(rois), shape[1], args["pooled_h"], args["pooled_w"])).astype(F32)
    got = run_op("RoIAlignGradient", [x if order == "NCHW" else nhwc(x), rois, dy if order == "NCHW" else nhwc(dy)],
                 1, device=device, order=order, **args)
    want = ref.roi_align_gradient(x.shape, rois, dy, **ref_args(args))
    np.testing.assert_allclose(got, want if order == "NCHW" else nhwc(want), rtol=1e-5, atol=1e-5)


def test_gradient_maker_emits_caffe2s_op():
    forward = make_op("RoIAlign", ["X", "R"], ["Y"], pooled_h=2, pooled_w=2, spatial_scale=0.5)
    ops, grads = backward_ops([forward], {"Y": "Y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("RoIAlignGradient", ["X", "R", "Y_grad"],
                                                                       ["X_grad"])]
    assert {a.name for a in ops[0].arg} == {"pooled_h", "pooled_w", "spatial_scale"}
    assert "R" not in grads or grads["R"] is None


# ------------------------------------------------------------------------------------------- bad input
X = np.zeros((1, 2, 4, 4), F32)
R = np.array([[0, 0, 0, 2, 2]], F32)
BAD = [  # (id, op, inputs, args, error, match)
    ("pooled", "RoIAlign", [X, R], {"pooled_h": 0}, ArgumentError, "pooled_h and pooled_w must be > 0"),
    ("scale", "RoIAlign", [X, R], {"spatial_scale": -1.0}, ArgumentError, "spatial_scale"),
    ("order", "RoIAlign", [X, R], {"order": "CHW"}, ArgumentError, "order"),
    ("3d", "RoIAlign", [X[0], R], {}, ShapeError, "4-d feature map"),
    ("roi-cols", "RoIAlign", [X, R[:, :3]], {}, ShapeError, r"\(R, 5\)"),
    ("int", "RoIAlign", [X.astype(np.int32), R], {}, DTypeError, "float"),
    ("mixed", "RoIAlign", [X, R.astype(np.float64)], {}, DTypeError, "one dtype"),
    ("grad-dy", "RoIAlignGradient", [X, R, np.zeros((1, 2, 2, 2), F32)], {"pooled_h": 3}, ShapeError,
     r"output shape \(1, 2, 3, 1\)"),
]
RUNTIME_ONLY = [
    ("batch-index", "RoIAlign", [X, R + np.array([1, 0, 0, 0, 0], F32)], {}, ShapeError,
     "batch index 1, outside the 1 images"),
    ("aligned-negative", "RoIAlign", [X, np.array([[0, 3, 0, 1, 2]], F32)], {"aligned": True}, ShapeError,
     "negative width"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD + RUNTIME_ONLY,
                         ids=[b[0] for b in BAD + RUNTIME_ONLY])
def test_bad_input(device, cid, op_type, inputs, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, 1, device=device, **args)


@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_found_statically(cid, op_type, inputs, args, err, match):
    with pytest.raises(err, match=match):
        infer_alone(op_type, inputs, 1, **args)


def test_malformed_rois_become_one_pixel_without_aligned():
    """x2 < x1: Caffe2 forces the RoI to 1 x 1 (it does not refuse it) unless aligned."""
    y = run_op("RoIAlign", [np.arange(16, dtype=F32).reshape(1, 1, 4, 4), np.array([[0, 3, 1, 1, 0]], F32)], 1,
               sampling_ratio=1)
    np.testing.assert_array_equal(y.ravel(), [4 * 1.5 + 3])   # the sample (1.5, 3.5): x clamped to 3


# ------------------------------------------------------------------------------------------- the testers
def test_checkers_catch_broken_kernels(broken):
    forward = REGISTRY.get("RoIAlign").kernel
    broken("RoIAlign", lambda xp, x, rois, **k: forward(xp, x, rois, **dict(k, aligned=not k["aligned"])))
    with pytest.raises(AssertionError):
        test_roi_align("cpu", "NCHW", *CASES[0])

    backward = REGISTRY.get("RoIAlignGradient").kernel
    broken("RoIAlign", forward)
    broken("RoIAlignGradient", lambda xp, x, rois, dy, **k: backward(xp, x, rois, dy[..., ::-1], **k))
    with pytest.raises(AssertionError, match="RoIAlign: gradient of input 0"):
        test_roi_align_gradient_matches_finite_differences("cpu", "NCHW", *CASES[0])
    with pytest.raises(AssertionError):
        test_roi_align_gradient_matches_caffe2s_loops("cpu", "NCHW", *CASES[0])


@pytest.mark.parametrize("args, rois", [
    ({"sampling_ratio": 2**40}, [[0, 0, 0, 3, 3]]),                       # the file's sampling ratio
    ({"sampling_ratio": 0, "spatial_scale": 1e9}, [[0, 0, 0, 3e3, 3e3]]),   # Caffe2's default grid of a huge RoI
])
@pytest.mark.parametrize("op_type", ["RoIAlign", "RoIAlignGradient"])
def test_a_sampling_grid_past_the_limit_is_refused_before_it_is_allocated(op_type, args, rois):
    from stepnet.core.errors import ResourceError

    x = np.ones((1, 2, 6, 6), np.float32)
    inputs = [x, np.array(rois, np.float32)] + ([np.ones((1, 2, 2, 2), np.float32)] if "Gradient" in op_type else [])
    with pytest.raises(ResourceError, match=r"sampling \d+ points per bin side for 1 RoI\(s\) x 2 bins is \d+ "
                                            r"samples along one axis, over the limit of 16777216; give a smaller "
                                            "sampling_ratio"):
        run_op(op_type, inputs, 1, pooled_h=2, pooled_w=2, **args)
