"""Image-layout ops against per-pixel loop references and hand-computed cases."""
import math
import pathlib

import numpy as np
import pytest

from stepnet import Workspace, caffe2_pb2
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.testing import DEVICES, infer_alone, run_op

rng = np.random.default_rng(9)
STYLE_NET = pathlib.Path("/work/shared/realmodels/models/style_transfer_crayon_predict.pb")


def f32(*shape, lo=-2.0, hi=3.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def to_nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


# ----------------------------------------------------------------------------------------------- PadImage
def mirror(i, n):
    """Reflect an out-of-range index back inside [0, n) without repeating the edge sample."""
    while i < 0 or i >= n:
        i = -i if i < 0 else 2 * (n - 1) - i
    return i


def pad_reference(x, t, left, b, r, mode, value=0.0):
    """NCHW padding by per-pixel loops."""
    n, c, h, w = x.shape
    y = np.zeros((n, c, h + t + b, w + left + r), np.float32)
    for i, j, ph, pw in np.ndindex(*y.shape):
        sh, sw = ph - t, pw - left
        if mode == "constant":
            y[i, j, ph, pw] = x[i, j, sh, sw] if 0 <= sh < h and 0 <= sw < w else value
        elif mode == "edge":
            y[i, j, ph, pw] = x[i, j, min(max(sh, 0), h - 1), min(max(sw, 0), w - 1)]
        else:
            y[i, j, ph, pw] = x[i, j, mirror(sh, h), mirror(sw, w)]
    return y


PADS = [  # (id, x shape NCHW, args, (t, l, b, r))
    ("pad", (2, 3, 4, 5), {"pad": 2}, (2, 2, 2, 2)),
    ("sides", (1, 2, 5, 4), {"pad_t": 1, "pad_l": 3, "pad_b": 0, "pad_r": 2}, (1, 3, 0, 2)),
    ("pads", (1, 2, 4, 4), {"pads": [0, 1, 3, 2]}, (0, 1, 3, 2)),
    ("stylizer", (1, 2, 12, 11), {"pad_t": 10, "pad_l": 10, "pad_b": 9, "pad_r": 9}, (10, 10, 9, 9)),
    ("crop", (1, 2, 6, 7), {"pads": [-1, 2, -2, -3]}, (-1, 2, -2, -3)),
    ("none", (1, 1, 3, 3), {}, (0, 0, 0, 0)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode,value", [("constant", 0.0), ("constant", 1.5), ("reflect", 0.0),
                                        ("edge", 0.0)])
@pytest.mark.parametrize("cid,shape,args,sides", PADS, ids=[p[0] for p in PADS])
def test_pad_image(device, order, mode, value, cid, shape, args, sides):
    x = f32(*shape)
    extra = {"value": value} if value else {}
    got = run_op("PadImage", [x if order == "NCHW" else to_nhwc(x)], 1, device=device, mode=mode, order=order,
                 **args, **extra)
    want = pad_reference(x, *sides, mode, value)
    np.testing.assert_array_equal(got, want if order == "NCHW" else to_nhwc(want))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_image_agrees_with_numpy_pad(mode):
    x = f32(2, 3, 5, 6)
    got = run_op("PadImage", [x], 1, pads=[2, 1, 3, 4], mode=mode)
    np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (0, 0), (2, 3), (1, 4)), mode=mode))


# ------------------------------------------------------------------------------------------- ResizeNearest
def resize_reference(x, hs, ws):
    """NCHW nearest resize by loops, with Caffe2's float32 size and index arithmetic."""
    n, c, h, w = x.shape
    oh, ow = math.floor(np.float32(h) * np.float32(hs)), math.floor(np.float32(w) * np.float32(ws))
    y = np.zeros((n, c, oh, ow), x.dtype)
    for i, j, oy, ox in np.ndindex(*y.shape):
        sy = min(math.floor(np.float32(oy) / np.float32(hs)), h - 1)
        sx = min(math.floor(np.float32(ox) / np.float32(ws)), w - 1)
        y[i, j, oy, ox] = x[i, j, sy, sx]
    return y


SCALES = [(2.0, 2.0), (0.5, 0.5), (1.5, 1.0), (3.0, 1 / 3), (1.0, 2.5), (0.7, 1.3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("hs,ws", SCALES)
@pytest.mark.parametrize("as_input", [False, True])
def test_resize_nearest(device, order, hs, ws, as_input):
    x = f32(2, 3, 6, 7)
    xin = x if order == "NCHW" else to_nhwc(x)
    if as_input:  # the later form: [height_scale, width_scale] as a second input, overriding the arguments
        got = run_op("ResizeNearest", [xin, np.array([hs, ws], np.float32)], 1, device=device, order=order,
                     width_scale=9.0)
    else:
        got = run_op("ResizeNearest", [xin], 1, device=device, order=order, width_scale=ws, height_scale=hs)
    want = resize_reference(x, hs, ws)
    np.testing.assert_array_equal(got, want if order == "NCHW" else to_nhwc(want))


def test_resize_nearest_hand_case():
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 3, 2)  # rows 0..2, columns 0..1
    got = run_op("ResizeNearest", [x], 1, height_scale=1.5, width_scale=1.0)
    # out height floor(3 * 1.5) = 4; source rows floor(i / 1.5) = 0, 0, 1, 2
    np.testing.assert_array_equal(got[0, 0], [[0, 1], [0, 1], [2, 3], [4, 5]])
    assert run_op("ResizeNearest", [x], 1).shape == (1, 1, 3, 2)  # defaults: scale 1


# ------------------------------------------------------------------------------------------- ChannelShuffle
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("channels,group", [(6, 2), (6, 3), (12, 4), (5, 1), (4, 4)])
def test_channel_shuffle(device, order, channels, group):
    x = f32(2, channels, 3, 4)
    got = run_op("ChannelShuffle", [x if order == "NCHW" else to_nhwc(x)], 1, device=device, group=group,
                 order=order, kernel=1)
    per = channels // group
    want = np.zeros_like(x)
    for out_c in range(channels):
        k, g = divmod(out_c, group)
        want[:, out_c] = x[:, g * per + k]
    np.testing.assert_array_equal(got, want if order == "NCHW" else to_nhwc(want))


def test_channel_shuffle_hand_case():
    x = np.arange(6, dtype=np.float32).reshape(1, 6, 1, 1)
    np.testing.assert_array_equal(run_op("ChannelShuffle", [x], 1, group=2).ravel(), [0, 3, 1, 4, 2, 5])


# ----------------------------------------------------------------------------------------------- stylizer ops
MEAN = np.array([100.25, 50.5, 150.75], np.float32)


def stylizer_ws(device, seed=0):
    return Workspace(seed=seed, gpu="emulate" if device != "cpu" else None, strict=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("noise_size", [None, 7, 5000])
def test_stylizer_preprocess(device, noise_size):
    x = rng.integers(0, 256, size=(2, 3, 5, 4), dtype=np.uint8)
    ws = stylizer_ws(device)
    args = {"noise_std": 5.0} if noise_size is None else {"noise_std": 5.0, "noise_size": noise_size}
    y = run_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [x, MEAN], 1, device=device, ws=ws, **args)
    noise = ws.fetch("__CAFFE2_STYLIZER_NOISE__")
    size = noise_size or 491
    assert noise.shape == (size,) and noise.dtype == np.float32
    assert y.shape == (2, 3, 3, 5) and y.dtype == np.float32
    n_count, h, w, _ = x.shape
    for n in range(n_count):
        k = 0  # the noise cycle restarts at each image and runs over (pixel, channel)
        for p in range(h * w):
            for c in range(3):
                pix = x[n, p // w, p % w, c]
                want = np.float32(np.float32(pix) - MEAN[c]) + noise[k]
                assert y[n, c, p // w, p % w] == want, (n, c, p)
                k = (k + 1) % size


def test_stylizer_noise_is_drawn_once_and_scaled_by_noise_std():
    ws = stylizer_ws("cpu", seed=3)
    x = np.zeros((1, 40, 50, 4), np.uint8)
    first = run_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [x, MEAN], 1, ws=ws, noise_std=5.0,
                   noise_size=6000)
    again = run_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [x, MEAN], 1, ws=ws, noise_std=50.0,
                   noise_size=6000)
    np.testing.assert_array_equal(first, again)  # cached in the workspace: temporal consistency
    noise = ws.fetch("__CAFFE2_STYLIZER_NOISE__")
    assert abs(noise.std() - 5.0) < 0.25 and abs(noise.mean()) < 0.25
    quiet = run_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [x, MEAN], 1, noise_std=0.0)
    np.testing.assert_array_equal(quiet, np.broadcast_to(-MEAN.reshape(1, 3, 1, 1), quiet.shape))
    minus_zero = run_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [x, MEAN], 1, noise_std=-0.0)   # as 0
    np.testing.assert_array_equal(minus_zero, quiet)
    with pytest.raises(ArgumentError, match="noise_std .* must be >= 0, got -1.0"):   # (fuzz seed 953 case 6294)
        run_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [x, MEAN], 1, noise_std=-1.0)


def clamp_to_byte(v):
    if v != v:  # NaN
        return 0
    return 255 if v >= 255 else 0 if v <= 0 else int(v)


@pytest.mark.parametrize("device", DEVICES)
def test_stylizer_deprocess(device):
    x = f32(2, 3, 4, 3, lo=-200, hi=200)
    x[0, 0, 0, :3] = [np.nan, 154.25 - 0.5, 104.5]  # NaN, exactly 255 after the mean, 255.25
    x[1, 2, 3, 0] = -150.75  # exactly 0 after the mean
    y = run_op("BRGNCHWCToPackedInt8BGRAStylizerDeprocess", [x, MEAN], 1, device=device)
    assert y.shape == (2, 4, 3, 4) and y.dtype == np.uint8
    for n, h, w in np.ndindex(2, 4, 3):
        for c in range(3):
            assert y[n, h, w, c] == clamp_to_byte(float(np.float32(x[n, c, h, w] + MEAN[c]))), (n, h, w, c)
        assert y[n, h, w, 3] == 255


@pytest.mark.parametrize("device", DEVICES)
def test_stylizer_round_trip_without_noise(device):
    x = rng.integers(0, 256, size=(1, 6, 5, 4), dtype=np.uint8)
    ws = stylizer_ws(device)
    mid = run_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [x, MEAN], 1, device=device, ws=ws,
                 noise_std=0.0)
    back = run_op("BRGNCHWCToPackedInt8BGRAStylizerDeprocess", [mid, MEAN], 1, device=device)
    np.testing.assert_array_equal(back[..., :3], x[..., :3])
    assert (back[..., 3] == 255).all()


@pytest.mark.skipif(not STYLE_NET.exists(), reason="the real style-transfer net is not on this machine")
def test_stylizer_ops_as_the_real_net_writes_them():
    net = caffe2_pb2.NetDef()
    net.ParseFromString(STYLE_NET.read_bytes())
    first = {}
    for o in net.op:
        first.setdefault(o.type, o)
    ws = Workspace(strict=True)  # any argument the op does not declare would raise
    ws.feed("data_int8_bgra", rng.integers(0, 256, size=(1, 48, 40, 4), dtype=np.uint8))
    ws.feed("mean", MEAN)
    ws.run_operator_once(first["PackedInt8BGRANHWCToNCHWCStylizerPreprocess"])  # noise_std=5 (f), seed 0
    assert ws.fetch("__CAFFE2_STYLIZER_NOISE__").shape == (491,)
    assert ws.fetch("b0").shape == (1, 3, 48, 40)
    b1 = f32(1, 3, 12, 11)  # what the 4x4 average pool makes of the 48x40 input (here: random)
    ws.feed("b1", b1)
    ws.run_operator_once(first["PadImage"])  # reflect, pad_t/l 10, pad_b/r 9: b1 -> b0
    np.testing.assert_array_equal(ws.fetch("b0"), pad_reference(b1, 10, 10, 9, 9, "reflect"))
    ws.run_operator_once(first["BRGNCHWCToPackedInt8BGRAStylizerDeprocess"])
    assert ws.fetch("styled_int8_bgra").shape == (1, 31, 30, 4)


# ----------------------------------------------------------------------------------------------- bad input
U8 = np.zeros((1, 2, 2, 4), np.uint8)
BAD = [  # (id, op, inputs, args, error, match)
    ("pad-reflect-too-wide", "PadImage", [f32(1, 1, 3, 3)], {"pad": 3, "mode": "reflect"}, ShapeError,
     "reflect"),
    ("pad-partial-sides", "PadImage", [f32(1, 1, 3, 3)], {"pad_t": 1}, ArgumentError, "pad_l, pad_b, pad_r"),
    ("pad-mode", "PadImage", [f32(1, 1, 3, 3)], {"mode": "wrap"}, ArgumentError, "mode"),
    ("pad-3d", "PadImage", [f32(1, 3, 3)], {"pad": 1}, ShapeError, "4-d"),
    ("pad-pads-len", "PadImage", [f32(1, 1, 3, 3)], {"pads": [1, 1]}, ArgumentError, "4 values"),
    ("pad-crop-all", "PadImage", [f32(1, 1, 3, 3)], {"pads": [-2, 0, -1, 0]}, ShapeError, "no output"),
    ("pad-int", "PadImage", [np.ones((1, 1, 2, 2), np.int32)], {"pad": 1}, DTypeError, "float"),
    ("resize-scale", "ResizeNearest", [f32(1, 1, 2, 2)], {"width_scale": 0.0}, ArgumentError, "> 0"),
    ("resize-scales-input", "ResizeNearest", [f32(1, 1, 2, 2), np.ones(3, np.float32)], {}, ShapeError,
     "height_scale, width_scale"),
    ("resize-order", "ResizeNearest", [f32(1, 1, 2, 2)], {"order": "HWC"}, ArgumentError, "order"),
    ("shuffle-group", "ChannelShuffle", [f32(1, 6, 2, 2)], {"group": 4}, ShapeError, "divide"),
    ("pre-float", "PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [f32(1, 2, 2, 4), MEAN], {}, DTypeError,
     "uint8"),
    ("pre-channels", "PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [np.zeros((1, 2, 2, 3), np.uint8), MEAN],
     {}, ShapeError, "BGRA"),
    ("pre-mean", "PackedInt8BGRANHWCToNCHWCStylizerPreprocess", [U8, np.zeros(4, np.float32)], {}, ShapeError,
     "mean"),
    ("post-uint8", "BRGNCHWCToPackedInt8BGRAStylizerDeprocess", [np.zeros((1, 3, 2, 2), np.uint8), MEAN], {},
     DTypeError, "float"),
    ("post-channels", "BRGNCHWCToPackedInt8BGRAStylizerDeprocess", [f32(1, 4, 2, 2), MEAN], {}, ShapeError,
     "3, H, W"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input(device, cid, op_type, inputs, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, 1, device=device, **args)


@pytest.mark.parametrize("cid,op_type,inputs,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_found_statically(cid, op_type, inputs, args, err, match):
    with pytest.raises(err, match=match):
        infer_alone(op_type, inputs, 1, **args)


@pytest.mark.parametrize("op_type", ["PadImage", "ResizeNearest", "ChannelShuffle"])
def test_in_place_refused_as_in_caffe2(op_type):
    with pytest.raises(ArgumentError, match="in place"):
        run_op(op_type, {"X": f32(1, 2, 3, 3)}, ["X"])


# ----------------------------------------------------------------------------------------------- the tester
def test_reference_checks_catch_broken_kernels(broken):
    test_pad_image("cpu", "NCHW", "reflect", 0.0, *PADS[0])
    test_channel_shuffle("cpu", "NCHW", 6, 2)

    def symmetric_pad(xp, x, **args):  # repeats the edge sample: numpy's "symmetric", not Caffe2's reflect
        t, left, b, r = args["pads"] or (args["pad"],) * 4
        return xp.pad(x, ((0, 0), (0, 0), (t, b), (left, r)), mode="symmetric")

    def transposed_shuffle(xp, x, **args):
        n, c = x.shape[:2]
        return xp.ascontiguousarray(x.reshape(n, c // args["group"], args["group"], -1).transpose(0, 2, 1, 3)
                                    ).reshape(x.shape)

    broken("PadImage", symmetric_pad)
    with pytest.raises(AssertionError):
        test_pad_image("cpu", "NCHW", "reflect", 0.0, *PADS[0])
    broken("ChannelShuffle", transposed_shuffle)
    with pytest.raises(AssertionError):
        test_channel_shuffle("cpu", "NCHW", 6, 2)


# ----------------------------------------------------------------------------------------------- planar YUV
def yuv_ref(x, mean, std):
    """(X[n, c, h, w] - mean[c]) / std[c] element by element in float64, mean and std read as their first C
    values (norm_planar_yuv_op.cc indexes M.data()[c])."""
    m, s = [float(v) for v in mean.reshape(-1)], [float(v) for v in std.reshape(-1)]
    out = np.empty(x.shape)
    for n, c, h, w in np.ndindex(*x.shape):
        out[n, c, h, w] = (float(x[n, c, h, w]) - m[c]) / s[c]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,stats", [((1, 3, 4, 5), (1, 3)), ((2, 2, 3, 1), (1, 2, 1, 1)), ((1, 3, 2, 2), (2, 3)),
                                         ((0, 3, 2, 2), (1, 3))])
def test_normalize_planar_yuv(device, shape, stats):
    x, mean, std = f32(*shape), f32(*stats), f32(*stats, lo=0.5, hi=2.0)
    got = run_op("NormalizePlanarYUV", [x, mean, std], device=device)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, yuv_ref(x, mean, std), rtol=2e-6, atol=1e-6)


def test_normalize_planar_yuv_hand_case_in_place_and_no_gradient():
    from stepnet.core.errors import GradientError
    from stepnet.passes.gradients import backward_ops
    from stepnet.testing import make_op

    x = np.array([[[[10.0, 20.0]], [[1.0, -1.0]]]], np.float32)          # (1, 2, 1, 2)
    stats = {"mean": np.array([[10.0, 1.0]], np.float32), "std": np.array([[5.0, 0.5]], np.float32)}
    assert run_op("NormalizePlanarYUV", {"X": x, **stats}, ["X"]).tolist() == [[[[0.0, 2.0]], [[0.0, -4.0]]]]
    with pytest.raises(GradientError, match="no gradient registered"):
        backward_ops([make_op("NormalizePlanarYUV", ["X", "mean", "std"], ["Y"])], ["Y"])


YUV = f32(1, 3, 2, 2)
YUV_BAD = [  # (id, inputs, error, match)
    ("3d", [f32(3, 2, 2), f32(1, 3), f32(1, 3)], ShapeError, r"X must be 4-D NCHW"),
    ("mean-1d", [YUV, f32(3), f32(1, 3)], ShapeError, r"mean must be \(1, C\) = \(1, 3\).*got shape \(3,\)"),
    ("std-channels", [YUV, f32(1, 3), f32(1, 4)], ShapeError, r"std must be \(1, C\)"),
    ("mean-empty", [YUV, f32(0, 3), f32(1, 3)], ShapeError, r"mean must be"),
    ("int", [YUV.astype(np.int32), np.ones((1, 3), np.int32), np.ones((1, 3), np.int32)], DTypeError, "float"),
    ("mixed", [YUV, f32(1, 3).astype(np.float64), f32(1, 3)], DTypeError, "one dtype"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,inputs,err,match", YUV_BAD, ids=[b[0] for b in YUV_BAD])
def test_normalize_planar_yuv_bad_input(device, cid, inputs, err, match):
    with pytest.raises(err, match="NormalizePlanarYUV.*" + match):
        run_op("NormalizePlanarYUV", inputs, device=device)
    with pytest.raises(err, match=match):
        infer_alone("NormalizePlanarYUV", inputs)


def test_normalize_planar_yuv_reference_catches_a_broken_kernel(broken):
    def per_last_axis(xp, x, mean, std):         # the statistics broadcast along W, not along the channels
        return (x - mean.reshape(-1)[: x.shape[3]]) / std.reshape(-1)[: x.shape[3]]

    broken("NormalizePlanarYUV", per_last_axis)
    with pytest.raises(AssertionError):
        test_normalize_planar_yuv("cpu", (1, 3, 2, 3), (1, 3))
