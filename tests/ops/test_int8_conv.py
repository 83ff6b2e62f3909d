"""Int8Conv, Int8ConvRelu, Int8ConvTranspose and Int8FC: against float64 loop references written here (within
one quantization step), on every device, and exactly against the outputs Caffe2's own tests record (int8_test.cc,
TFLite test vectors run through Caffe2/QNNPACK; its ConvTranspose case is checked there against the float op,
whose values are whole numbers, so exactly here too)."""
import numpy as np
import pytest
from int8_reference import F32, bias_for, check_close, check_exact, random_int8, real

from stepnet import Int8Tensor
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, infer_alone, run_op

rng = np.random.default_rng(3)


def conv_ref(x, w, b, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), group=1):
    """NHWC convolution in float64: x N x H x W x C, w M x KH x KW x C/group, pads (top, left, bottom, right)."""
    n, h, wd, c = x.shape
    m, kh, kw, cg = w.shape
    pt, pl, pb, pr = pads
    oh = (h + pt + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, oh, ow, m)) + b
    mg = m // group
    for i, j, p, q in np.ndindex(oh, ow, kh, kw):
        r, s = i * stride[0] - pt + p * dilation[0], j * stride[1] - pl + q * dilation[1]
        if 0 <= r < h and 0 <= s < wd:
            for g in range(group):
                y[:, i, j, g * mg:(g + 1) * mg] += x[:, r, s, g * cg:(g + 1) * cg] @ w[g * mg:(g + 1) * mg, p, q].T
    return y


def output_params(y):
    """A Y_scale / Y_zero_point that spans most of y (a little saturates)."""
    lo, hi = min(float(y.min()), 0.0), max(float(y.max()), 0.0)
    scale = (hi - lo) / 230 or 1.0
    return scale, int(np.clip(round(-lo / scale) + 10, 0, 255))


CONVS = [  # (id, X shape NHWC, filter shape M x KH x KW x C/group, args, reference keywords)
    ("3x3", (2, 5, 6, 3), (4, 3, 3, 3), {"pad": 1}, {"pads": (1, 1, 1, 1)}),
    ("stride_pads", (1, 7, 6, 2), (3, 2, 3, 2), {"stride_h": 2, "stride_w": 1, "pad_t": 1, "pad_l": 0,
                                                 "pad_b": 2, "pad_r": 1},
     {"stride": (2, 1), "pads": (1, 0, 2, 1)}),
    ("dilation", (1, 7, 7, 2), (2, 3, 3, 2), {"dilation": 2, "pads": [1, 2, 1, 2]},
     {"dilation": (2, 2), "pads": (1, 2, 1, 2)}),
    ("group", (2, 4, 4, 4), (6, 2, 2, 2), {"group": 2, "stride": 2}, {"group": 2, "stride": (2, 2)}),
    ("depthwise", (1, 5, 5, 3), (3, 3, 3, 1), {"group": 3, "pad": 1}, {"group": 3, "pads": (1, 1, 1, 1)}),
    ("1x1", (2, 3, 3, 5), (4, 1, 1, 5), {"kernel": 1}, {}),
    ("same", (1, 5, 4, 2), (2, 3, 2, 2), {"legacy_pad": 2}, {"pads": (1, 0, 1, 1)})]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", ["Int8Conv", "Int8ConvRelu"])
@pytest.mark.parametrize("cid, x_shape, w_shape, args, ref", CONVS, ids=[c[0] for c in CONVS])
def test_conv(device, op_type, cid, x_shape, w_shape, args, ref):
    x = random_int8(rng, x_shape, 0.04, 120)
    w = random_int8(rng, w_shape, 0.01, 130)
    b = bias_for(rng, w_shape[0], x.scale, w.scale)
    want = conv_ref(real(x), real(w), real(b), **ref)
    scale, zp = output_params(want)
    got = run_op(op_type, [x, w, b], device=device, order="NHWC", Y_scale=scale, Y_zero_point=zp, **args)
    check_close(got, np.maximum(want, 0) if op_type == "Int8ConvRelu" else want, scale, zp, f"{op_type} {cid}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", ["Int8Conv", "Int8ConvRelu"])
def test_conv_with_zero_weight_zero_point_and_saturation(device, op_type):
    x = random_int8(rng, (1, 4, 4, 3), 0.1, 0)
    w = random_int8(rng, (2, 2, 2, 3), 0.05, 0, hi=40)
    b = bias_for(rng, 2, 0.1, 0.05, spread=2000)
    want = conv_ref(real(x), real(w), real(b))
    scale = float(np.abs(want).max()) / 60          # most outputs saturate at 0 or 255
    got = run_op(op_type, [x, w, b], device=device, order="NHWC", kernel=2, Y_scale=scale, Y_zero_point=100)
    check_close(got, np.maximum(want, 0) if op_type == "Int8ConvRelu" else want, scale, 100)


def conv_transpose_ref(x, w, b, stride=(1, 1), pads=(0, 0, 0, 0), adj=(0, 0)):
    """NHWC transposed convolution in float64: x N x H x W x C, w C x KH x KW x M, pads (top, left, bottom,
    right); every input pixel (i, j) adds x[i, j] @ w[:, p, q] at output (i*stride - top + p, j*stride - left + q),
    the output being (in - 1) * stride + kernel + adj - pads."""
    n, h, wd, _ = x.shape
    _, kh, kw, m = w.shape
    pt, pl, pb, pr = pads
    oh, ow = (h - 1) * stride[0] + kh + adj[0] - pt - pb, (wd - 1) * stride[1] + kw + adj[1] - pl - pr
    y = np.zeros((n, oh, ow, m)) + b
    for i, j, p, q in np.ndindex(h, wd, kh, kw):
        r, s = i * stride[0] - pt + p, j * stride[1] - pl + q
        if 0 <= r < oh and 0 <= s < ow:
            y[:, r, s] += x[:, i, j] @ w[:, p, q]
    return y


DECONVS = [  # (id, X shape NHWC, filter shape C x KH x KW x M, args, reference keywords)
    ("k2s2", (2, 3, 4, 5), (5, 2, 2, 3), {"kernel": 2, "stride": 2}, {"stride": (2, 2)}),
    ("k4s2p1", (1, 4, 3, 3), (3, 4, 4, 2), {"kernel": 4, "stride": 2, "pad": 1}, {"stride": (2, 2),
                                                                               "pads": (1, 1, 1, 1)}),
    ("pads_adj", (1, 3, 3, 2), (2, 3, 2, 4), {"stride_h": 2, "stride_w": 3, "pads": [0, 1, 2, 0], "adj_h": 1,
                                              "adj_w": 2}, {"stride": (2, 3), "pads": (0, 1, 2, 0), "adj": (1, 2)}),
    ("1x1", (2, 2, 3, 6), (6, 1, 1, 4), {}, {})]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid, x_shape, w_shape, args, ref", DECONVS, ids=[c[0] for c in DECONVS])
def test_conv_transpose(device, cid, x_shape, w_shape, args, ref):
    x = random_int8(rng, x_shape, 0.04, 120)
    w = random_int8(rng, w_shape, 0.01, 130)
    b = bias_for(rng, w_shape[3], x.scale, w.scale)
    want = conv_transpose_ref(real(x), real(w), real(b), **ref)
    scale, zp = output_params(want)
    got = run_op("Int8ConvTranspose", [x, w, b], device=device, order="NHWC", Y_scale=scale, Y_zero_point=zp,
                 **args)
    check_close(got, want, scale, zp, f"Int8ConvTranspose {cid}")
    assert infer_alone("Int8ConvTranspose", [x, w, b], order="NHWC", Y_scale=scale, Y_zero_point=zp,
                       **args)["out0"].shape == want.shape


FCS = [("2d", (4, 10), 6), ("flattened", (3, 2, 2, 5), 7), ("vector_rows", (5, 1), 3)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid, x_shape, n", FCS, ids=[f[0] for f in FCS])
def test_fc(device, cid, x_shape, n):
    x = random_int8(rng, x_shape, 0.03, 90)
    k = int(np.prod(x_shape[1:]))
    w = random_int8(rng, (n, k), 0.02, 110)
    b = bias_for(rng, n, x.scale, w.scale)
    want = real(x).reshape(x_shape[0], k) @ real(w).T + real(b)
    scale, zp = output_params(want)
    check_close(run_op("Int8FC", [x, w, b], device=device, Y_scale=scale, Y_zero_point=zp), want, scale, zp)


# ----------------------------------------------------------------------------------------------- Caffe2's vectors
def setq(values, shape, scale=0.5, zero_point=127):
    """int8_test.cc's setq: round(zero_point + v / scale) clamped to uint8."""
    q = np.clip(np.rint(zero_point + np.array(values, F32) / F32(scale)), 0, 255)
    return Int8Tensor(q.astype(np.uint8).reshape(shape), scale, zero_point)


def biasq(values, scale=0.25):
    return Int8Tensor(np.rint(np.array(values, F32) / F32(scale)).astype(np.int32), scale, 0)


CAFFE2_VECTORS = [  # (id, op, X, W, bias, args, the uint8 codes Caffe2 produced)
    ("Conv", "Int8Conv", setq([1, 1, 1, 1, 2, 2, 2, 2, 1, 2, 3, 4, 1, 2, 3, 4], (2, 2, 4, 1)),
     setq([1, 2, 3, 4, -1, 1, -1, 1, -1, -1, 1, 1], (3, 2, 2, 1)), biasq([1, 2, 3]), {"kernel": 2, "stride": 2},
     [145, 129, 132, 145, 129, 132, 144, 131, 130, 164, 131, 130]),
    ("Conv2", "Int8Conv", setq([3, 2, 1, -1, -2, -3, 4, 3, 2, -2, -3, -4, 5, 4, 3, -3, -4, -5], (1, 3, 6, 1)),
     setq([1, 2, 3, 4], (1, 2, 2, 1)), biasq([-1]), {"kernel": 2, "stride_w": 3, "stride_h": 1}, [157, 103, 167, 93]),
    ("FC", "Int8FC", setq([1, 2, 3, 4, 5, 6, 7, 8, -9, -10, 1, 2, 3, 4, 5, 6, 7, -8, 9, -10], (2, 10)),
     setq(list(range(1, 11)) * 3, (3, 10)), biasq([1, 2, 3]), {}, [151, 152, 153, 185, 186, 187])]
# int8_test.cc's ConvTranspose: X 1 x 3 x 6 x 1 and filter 1 x 2 x 2 x 1 as in Conv2, kernel 2, strides 2 x 1,
# bias -1, Y_scale 1: every real output is a whole number, so the codes are those numbers + 127.
DECONV_X = [[3, 2, 1, -1, -2, -3], [4, 3, 2, -2, -3, -4], [5, 4, 3, -3, -4, -5]]


def _caffe2_conv_transpose_by_hand():
    """y[2i + p][j + q] += x[i][j] * w[p][q] with w = [[1, 2], [3, 4]], on a 6 x 7 output starting at -1."""
    y = [[-1.0] * 7 for _ in range(6)]
    for i, row in enumerate(DECONV_X):
        for j, v in enumerate(row):
            for p, q, wv in ((0, 0, 1), (0, 1, 2), (1, 0, 3), (1, 1, 4)):
                y[2 * i + p][j + q] += v * wv
    return y


@pytest.mark.parametrize("device", DEVICES)
def test_caffe2s_conv_transpose_case(device):
    x, w = setq(sum(DECONV_X, []), (1, 3, 6, 1)), setq([1, 2, 3, 4], (1, 2, 2, 1))
    got = run_op("Int8ConvTranspose", [x, w, biasq([-1])], device=device, order="NHWC", kernel=2, stride_h=2,
                 stride_w=1, Y_scale=1.0, Y_zero_point=127)
    want = np.clip(np.array(_caffe2_conv_transpose_by_hand()) + 127, 0, 255).astype(np.uint8)
    check_exact(got, want.reshape(1, 6, 7, 1), 1.0, 127)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid, op_type, x, w, b, args, want", CAFFE2_VECTORS, ids=[v[0] for v in CAFFE2_VECTORS])
def test_caffe2s_recorded_outputs(device, cid, op_type, x, w, b, args, want):
    if op_type == "Int8Conv":
        args = {**args, "order": "NHWC"}
    got = run_op(op_type, [x, w, b], device=device, Y_scale=1.0, Y_zero_point=127, **args)
    check_exact(got, np.array(want, np.uint8).reshape(got.shape), 1.0, 127)


# ----------------------------------------------------------------------------------------------- bad inputs
def X(*shape, scale=0.5, zp=0):  # noqa: N802 - reads like the blob
    return Int8Tensor(np.zeros(shape, np.uint8), scale, zp)


def B(n, dtype=np.int32):  # noqa: N802
    return Int8Tensor(np.zeros(n, dtype), 0.25)


NHWC = {"order": "NHWC"}
BAD = [
    ("Int8Conv", [X(1, 3, 3, 2), X(4, 1, 1, 2), B(4)], {}, ArgumentError, "NHWC.*the default"),
    ("Int8Conv", [X(1, 3, 3, 2), X(4, 1, 1, 2)], NHWC, ArityError, "bias as input 2"),
    ("Int8Conv", [X(1, 3, 3, 2), X(4, 1, 1, 2), B(4, np.uint8)], NHWC, DTypeError, "int32 codes, got uint8"),
    ("Int8Conv", [X(1, 3, 3, 2), X(4, 1, 1, 2), B(3)], NHWC, ShapeError, "vector of the 4 output channels"),
    ("Int8Conv", [np.zeros((1, 3, 3, 2), F32), X(4, 1, 1, 2), B(4)], NHWC, DTypeError, "X as an Int8 tensor"),
    ("Int8Conv", [X(1, 3, 3, 2), X(4, 1, 1, 2, scale=4.0), B(4)], NHWC, ArgumentError,
     "requantization scale .* = 2 must be below 1"),
    ("Int8Conv", [X(1, 3, 3, 3), X(4, 1, 1, 2), B(4)], NHWC, ShapeError, "3 channels .* expects 2"),
    ("Int8Conv", [X(1, 3, 3, 2), X(4, 2, 2, 2), B(4)], {**NHWC, "kernel": 3}, ShapeError, "kernel arguments say"),
    ("Int8Conv", [X(3, 3, 2), X(4, 1, 2), B(4)], NHWC, ShapeError, "4-D NHWC"),
    ("Int8Conv", [X(0, 3, 3, 2), X(4, 1, 1, 2), B(4)], NHWC, ShapeError, "no empty dim"),
    ("Int8Conv", [X(1, 3, 3, 0), X(4, 1, 1, 0), B(4)], NHWC, ShapeError, "no empty dim"),
    ("Int8Conv", [X(1, 3, 3, 2), X(0, 1, 1, 2), B(0)], NHWC, ShapeError, "no empty dim"),
    ("Int8ConvRelu", [X(1, 0, 3, 2), X(4, 1, 1, 2), B(4)], {**NHWC, "pad": 1}, ShapeError, "no empty dim"),
    ("Int8ConvRelu", [X(1, 3, 3, 4), X(3, 1, 1, 2), B(3)], {**NHWC, "group": 2}, ShapeError, "group=2"),
    ("Int8Conv", [X(1, 3, 3, 2), X(4, 1, 1, 2), B(4)], {**NHWC, "Y_zero_point": 300}, ArgumentError, "0..255"),
    ("Int8FC", [X(2, 2, 3), X(4, 3), B(4)], {}, ShapeError, "no axis argument.* N x K = \\? x 6"),
    ("Int8FC", [X(2, 6), X(4, 6), B(5)], {}, ShapeError, "vector of the 4"),
    ("Int8FC", [X(2, 6), Int8Tensor(np.zeros((4, 6), np.int32)), B(4)], {}, DTypeError, "W as an Int8 tensor of uint8"),
    ("Int8FC", [X(2, 6), X(4, 6), np.zeros(4, np.int32)], {}, DTypeError, "bias as an Int8 tensor"),
    ("Int8FC", [X(2, 6, scale=1.0), X(4, 6, scale=1.0), B(4)], {}, ArgumentError, "= 1 must be below 1"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(2, 2, 2, 4), B(4)], {}, ArgumentError, "NHWC.*the default"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(2, 2, 2, 4)], NHWC, ArityError, "bias as input 2"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(3, 2, 2, 4), B(4)], NHWC, ShapeError, "C = X's 2 channels"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(2, 2, 2, 4), B(2)], NHWC, ShapeError, "vector of the 4 output"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(2, 2, 2, 4), B(4)], {**NHWC, "kernel": 3}, ShapeError,
     "kernel arguments say"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(2, 2, 2, 4, scale=2.0), B(4)], NHWC, ArgumentError, "must be below 1"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(2, 2, 2, 4), B(4)], {**NHWC, "stride": 2, "adj": 3}, ArgumentError,
     "adj must not exceed stride"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(2, 2, 2, 4), B(4)], {**NHWC, "pad": 2}, ShapeError,
     "remove the whole output"),
    ("Int8ConvTranspose", [X(3, 3, 2), X(2, 2, 2, 4), B(4)], NHWC, ShapeError, "4-D NHWC"),
    ("Int8ConvTranspose", [X(1, 0, 3, 2), X(2, 2, 2, 4), B(4)], NHWC, ShapeError, "no empty dim"),
    ("Int8ConvTranspose", [X(1, 3, 3, 2), X(2, 0, 2, 4), B(4)], NHWC, ShapeError, "no empty dim")]


@pytest.mark.parametrize("op_type, inputs, args, error, words", BAD)
def test_bad_inputs_are_named(op_type, inputs, args, error, words):
    with pytest.raises(error, match=words):
        run_op(op_type, inputs, **args)
    with pytest.raises(error, match=words):
        infer_alone(op_type, inputs, **args)


# ----------------------------------------------------------------------------------------------- the checkers
def _ignore_filter_zero_point(k):
    return lambda xp, x, w, *b, **a: k(xp, x, Int8Tensor(w.data, w.scale, 0), *b, **a)


def _plus_two(k):
    def kernel(xp, *xs, **a):
        y = k(xp, *xs, **a)
        return Int8Tensor(xp.minimum(y.data, 253) + 2, y.scale, y.zero_point)
    return kernel


@pytest.mark.parametrize("op_type, wrong, check", [
    ("Int8Conv", _ignore_filter_zero_point, lambda: test_conv("cpu", "Int8Conv", *CONVS[0])),
    ("Int8ConvRelu", _plus_two, lambda: test_conv("cpu", "Int8ConvRelu", *CONVS[3])),
    ("Int8FC", _ignore_filter_zero_point, lambda: test_fc("cpu", *FCS[1])),
    ("Int8Conv", _plus_two, lambda: test_caffe2s_recorded_outputs("cpu", *CAFFE2_VECTORS[0])),
    ("Int8FC", _plus_two, lambda: test_caffe2s_recorded_outputs("cpu", *CAFFE2_VECTORS[2])),
    ("Int8ConvTranspose", _ignore_filter_zero_point, lambda: test_conv_transpose("cpu", *DECONVS[1])),
    ("Int8ConvTranspose", _plus_two, lambda: test_caffe2s_conv_transpose_case("cpu"))])
def test_broken_kernels_are_caught(op_type, wrong, check, broken):
    check()
    broken(op_type, wrong(REGISTRY.get(op_type).kernel))
    with pytest.raises(AssertionError):
        check()
