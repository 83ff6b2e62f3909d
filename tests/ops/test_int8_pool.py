"""Int8MaxPool(Relu), Int8AveragePool(Relu) and Int8ResizeNearest against window loops written here: max pooling
and resizing exactly, average pooling within one quantization step of the float64 mean (padding counted as
zero, every window divided by the kernel size, as QNNPACK does), on every device."""
import numpy as np
import pytest
from int8_reference import F32, check_close, check_exact, codes, random_int8, real

from stepnet import Int8Tensor
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, infer_alone, run_op

rng = np.random.default_rng(4)


def windows(x, k, s, pads):
    """(i, j, the pixels of window (i, j) inside the image, as an array (pixels, N, C)) for an NHWC x."""
    _, h, w, _ = x.shape
    pt, pl, pb, pr = pads
    oh, ow = (h + pt + pb - k[0]) // s[0] + 1, (w + pl + pr - k[1]) // s[1] + 1
    for i, j in np.ndindex(oh, ow):
        rows = [r for r in range(i * s[0] - pt, i * s[0] - pt + k[0]) if 0 <= r < h]
        cols = [c for c in range(j * s[1] - pl, j * s[1] - pl + k[1]) if 0 <= c < w]
        yield i, j, oh, ow, np.stack([x[:, r, c, :] for r in rows for c in cols])


def pool_ref(x, k, s=(1, 1), pads=(0, 0, 0, 0), how="max"):
    out = None
    for i, j, oh, ow, pixels in windows(x, k, s, pads):
        if out is None:
            out = np.zeros((x.shape[0], oh, ow, x.shape[3]), np.float64 if how == "mean" else x.dtype)
        out[:, i, j] = pixels.max(axis=0) if how == "max" else pixels.sum(axis=0) / (k[0] * k[1])
    return out


POOLS = [  # (id, X shape NHWC, args, kernel, stride, pads)
    ("k2s2", (2, 6, 6, 3), {"kernel": 2, "stride": 2}, (2, 2), (2, 2), (0, 0, 0, 0)),
    ("k3pad1", (1, 5, 4, 2), {"kernel": 3, "pad": 1}, (3, 3), (1, 1), (1, 1, 1, 1)),
    ("rect", (1, 7, 6, 4), {"kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 1, "pads": [0, 1, 2, 0]},
     (3, 2), (2, 1), (0, 1, 2, 0)),
    ("global", (2, 4, 5, 3), {"global_pooling": 1}, (4, 5), (1, 1), (0, 0, 0, 0)),
    ("whole_image", (1, 3, 3, 2), {"kernel": 3}, (3, 3), (1, 1), (0, 0, 0, 0))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", ["Int8MaxPool", "Int8MaxPoolRelu"])
@pytest.mark.parametrize("cid, shape, args, k, s, pads", POOLS, ids=[p[0] for p in POOLS])
def test_max_pool_is_exact(device, op_type, cid, shape, args, k, s, pads):
    x = random_int8(rng, shape, 0.1, 140)
    got = run_op(op_type, [x], device=device, order="NHWC", Y_scale=0.1, Y_zero_point=140, **args)
    want = pool_ref(codes(x), k, s, pads)
    relu = op_type == "Int8MaxPoolRelu"
    check_exact(got, np.maximum(want, 140) if relu else want, 0.1, 140)
    want_real = pool_ref(real(x), k, s, pads)
    check_close(got, np.maximum(want_real, 0) if relu else want_real, 0.1, 140)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type", ["Int8AveragePool", "Int8AveragePoolRelu"])
@pytest.mark.parametrize("cid, shape, args, k, s, pads", POOLS, ids=[p[0] for p in POOLS])
@pytest.mark.parametrize("x_quant, y_quant", [((0.1, 140), (0.1, 140)), ((0.02, 3), (0.05, 200))])
def test_average_pool(device, op_type, cid, shape, args, k, s, pads, x_quant, y_quant):
    x = random_int8(rng, shape, *x_quant)
    got = run_op(op_type, [x], device=device, order="NHWC", Y_scale=y_quant[0], Y_zero_point=y_quant[1], **args)
    want = pool_ref(real(x), k, s, pads, how="mean")
    check_close(got, np.maximum(want, 0) if op_type == "Int8AveragePoolRelu" else want, *y_quant)


def resize_ref(x, hs, ws):
    """NHWC nearest resize by loops: out size floor(in * scale), index min(floor(i / scale), in - 1), float32."""
    n, h, w, c = x.shape
    oh, ow = int(F32(h) * F32(hs)), int(F32(w) * F32(ws))
    y = np.zeros((n, oh, ow, c), x.dtype)
    for i, j in np.ndindex(oh, ow):
        y[:, i, j] = x[:, min(int(F32(i) / F32(hs)), h - 1), min(int(F32(j) / F32(ws)), w - 1)]
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hs, ws", [(2.0, 2.0), (0.5, 1.5), (1.7, 0.9), (1.0, 1.0)])
def test_resize_nearest_is_exact(device, hs, ws):
    x = random_int8(rng, (2, 5, 6, 3), 0.3, 30)
    got = run_op("Int8ResizeNearest", [x], device=device, height_scale=hs, width_scale=ws, Y_scale=0.3,
                 Y_zero_point=30)
    check_exact(got, resize_ref(codes(x), hs, ws), 0.3, 30)
    check_close(got, resize_ref(real(x), hs, ws), 0.3, 30)


def X(*shape, scale=1.0, zp=0):  # noqa: N802 - reads like the blob
    return Int8Tensor(np.zeros(shape, np.uint8), scale, zp)


NHWC = {"order": "NHWC"}
BAD = [
    ("Int8MaxPool", [X(1, 4, 4, 2)], {"kernel": 2}, ArgumentError, "NHWC.*the default"),
    ("Int8MaxPool", [X(1, 4, 4, 2, scale=0.5)], {**NHWC, "kernel": 2}, ArgumentError, "scale 0.5 and zero point 0"),
    ("Int8MaxPool", [X(1, 4, 4, 2)], {**NHWC, "kernel": 1}, ArgumentError, "1x1 pooling"),
    ("Int8MaxPool", [X(4, 4, 2)], {**NHWC, "kernel": 2}, ShapeError, "4-D NHWC"),
    ("Int8MaxPool", [X(1, 4, 4, 2)], {**NHWC, "kernel": 2, "dilation": 2}, ArgumentError, "dilation"),
    ("Int8MaxPoolRelu", [np.zeros((1, 4, 4, 2), np.uint8)], {**NHWC, "kernel": 2}, DTypeError, "Int8 tensor"),
    ("Int8AveragePool", [X(1, 4, 4, 2)], {**NHWC, "kernel": 2, "Y_scale": 1000.0}, ArgumentError,
     "\\[2\\^-8, 2\\^8\\)"),
    ("Int8AveragePool", [X(1, 4, 4, 2)], {**NHWC, "kernel": 1, "stride": 2}, ArgumentError, "1x1 pooling"),
    ("Int8AveragePoolRelu", [X(1, 4, 4, 2)], {**NHWC, "kernel": 5}, ShapeError, "larger than the padded input"),
    ("Int8ResizeNearest", [X(1, 4, 4, 2)], {"width_scale": 0.0}, ArgumentError, "> 0"),
    ("Int8ResizeNearest", [X(1, 4, 4, 2, zp=3)], {}, ArgumentError, "zero point 3"),
    ("Int8ResizeNearest", [X(4, 4, 2)], {}, ShapeError, "4-D NHWC")]


@pytest.mark.parametrize("op_type, inputs, args, error, words", BAD)
def test_bad_inputs_are_named(op_type, inputs, args, error, words):
    with pytest.raises(error, match=words):
        run_op(op_type, inputs, **args)
    with pytest.raises(error, match=words):
        infer_alone(op_type, inputs, **args)


def test_a_whole_image_window_is_global_pooling_even_when_1x1():
    x = random_int8(rng, (2, 1, 1, 3), 0.1, 5)
    check_exact(run_op("Int8AveragePool", [x], order="NHWC", kernel=1, Y_scale=0.1, Y_zero_point=5),
                codes(x), 0.1, 5)


# ----------------------------------------------------------------------------------------------- the checkers
def _flipped_rows(k):
    return lambda xp, x, **a: k(xp, Int8Tensor(x.data[:, ::-1], x.scale, x.zero_point), **a)


def _plus_two(k):
    def kernel(xp, x, **a):
        y = k(xp, x, **a)
        return Int8Tensor(xp.minimum(y.data, 253) + 2, y.scale, y.zero_point)
    return kernel


@pytest.mark.parametrize("op_type, wrong, check", [
    ("Int8MaxPool", _flipped_rows, lambda: test_max_pool_is_exact("cpu", "Int8MaxPool", *POOLS[2])),
    ("Int8AveragePool", _plus_two,
     lambda: test_average_pool("cpu", "Int8AveragePool", *POOLS[1], (0.02, 3), (0.05, 200))),
    ("Int8AveragePoolRelu", _flipped_rows,
     lambda: test_average_pool("cpu", "Int8AveragePoolRelu", *POOLS[2], (0.1, 140), (0.1, 140))),
    ("Int8ResizeNearest", _flipped_rows, lambda: test_resize_nearest_is_exact("cpu", 1.7, 0.9))])
def test_broken_kernels_are_caught(op_type, wrong, check, broken):
    check()
    broken(op_type, wrong(REGISTRY.get(op_type).kernel))
    with pytest.raises(AssertionError):
        check()
