"""Im2Col and Col2Im (stepnet/ops/im2col.py) against loops written here from Caffe2's docs, NCHW and NHWC, on
every device; each is the other's gradient (finite differences, and the ops the makers emit); bad inputs;
broken kernels caught."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, check_gradient, infer_static, make_op, run_op

rng = np.random.default_rng(41)


def im2col_ref(x, kh, kw, stride=(1, 1), dilation=(1, 1), pad=0):
    """NCHW columns: out[n, (c*kh + i)*kw + j, oh, ow] = x[n, c, oh*sh - pad + i*dh, ow*sw - pad + j*dw]."""
    n, c, h, w = x.shape
    oh = (h + 2 * pad - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * pad - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    out = np.zeros((n, c * kh * kw, oh, ow), x.dtype)
    for b, ch, i, j, p, q in np.ndindex(n, c, kh, kw, oh, ow):
        y, xx = p * stride[0] - pad + i * dilation[0], q * stride[1] - pad + j * dilation[1]
        if 0 <= y < h and 0 <= xx < w:
            out[b, (ch * kh + i) * kw + j, p, q] = x[b, ch, y, xx]
    return out


def col2im_ref(cols, shape, kh, kw, stride=(1, 1), dilation=(1, 1), pad=0):
    n, c, h, w = shape
    out = np.zeros(shape)
    _, _, oh, ow = cols.shape
    for b, ch, i, j, p, q in np.ndindex(n, c, kh, kw, oh, ow):
        y, xx = p * stride[0] - pad + i * dilation[0], q * stride[1] - pad + j * dilation[1]
        if 0 <= y < h and 0 <= xx < w:
            out[b, ch, y, xx] += cols[b, (ch * kh + i) * kw + j, p, q]
    return out


def nhwc_cols(cols_nchw, c, kh, kw):
    """The NHWC column layout of NCHW columns: (N, oh, ow, kh*kw*C), channel fastest."""
    n, _, oh, ow = cols_nchw.shape
    return cols_nchw.reshape(n, c, kh, kw, oh, ow).transpose(0, 4, 5, 2, 3, 1).reshape(n, oh, ow, kh * kw * c)


GEOMS = [   # (shape NCHW, args, (kh, kw, stride, dilation, pad))
    ((2, 3, 5, 6), {"kernel": 2}, (2, 2, (1, 1), (1, 1), 0)),
    ((1, 2, 7, 7), {"kernel": 3, "stride": 2, "pad": 1}, (3, 3, (2, 2), (1, 1), 1)),
    ((1, 2, 6, 8), {"kernel_h": 2, "kernel_w": 3, "dilation_h": 2, "stride_w": 2, "pad": 2},
     (2, 3, (1, 2), (2, 1), 2)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, args, geom", GEOMS)
def test_im2col_and_col2im_nchw_and_nhwc(shape, args, geom, device):
    kh, kw, stride, dilation, pad = geom
    x = rng.standard_normal(shape).astype(np.float32)
    cols = im2col_ref(x, kh, kw, stride, dilation, pad)
    np.testing.assert_array_equal(run_op("Im2Col", [x], device=device, **args), cols)
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    got = run_op("Im2Col", [x_nhwc], device=device, order="NHWC", **args)
    np.testing.assert_array_equal(got, nhwc_cols(cols, shape[1], kh, kw))
    back = col2im_ref(cols, shape, kh, kw, stride, dilation, pad)
    np.testing.assert_allclose(run_op("Col2Im", [cols, x], device=device, **args), back, rtol=1e-5, atol=1e-6)
    got = run_op("Col2Im", [nhwc_cols(cols, shape[1], kh, kw), x_nhwc], device=device, order="NHWC", **args)
    np.testing.assert_allclose(got, back.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, args, geom", GEOMS[:2])
def test_each_is_the_others_gradient(shape, args, geom):
    x = rng.standard_normal(shape)
    check_gradient("Im2Col", [x], **args)
    cols = run_op("Im2Col", [x], **args)
    check_gradient("Col2Im", [cols, x], wrt=[0], **args)
    ops, _ = backward_ops([make_op("Im2Col", ["x"], ["y"], kernel=2)], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("Col2Im", ["y_grad", "x"], ["x_grad"])]
    ops, _ = backward_ops([make_op("Col2Im", ["c", "z"], ["y"], kernel=2)], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("Im2Col", ["y_grad"], ["c_grad"])]


def test_bad_inputs_and_static_shapes():
    x = np.ones((1, 2, 4, 4), np.float32)
    with pytest.raises(ArgumentError, match="kernel must be positive"):
        run_op("Im2Col", [x])
    with pytest.raises(ShapeError, match="smaller than the dilated kernel"):
        run_op("Im2Col", [x], kernel=3, dilation=2, pad=3)
    with pytest.raises(ShapeError, match="4-D image"):
        run_op("Im2Col", [np.ones((2, 4, 4), np.float32)], kernel=2)
    with pytest.raises(ShapeError, match="do not fit the image"):
        run_op("Col2Im", [np.ones((1, 8, 2, 2), np.float32), x], kernel=2)
    assert infer_static("Im2Col", [np.ones((1, 4, 4, 2), np.float32)], kernel=3, pad=1, order="NHWC")[0].shape == (
        1, 4, 4, 18)


def test_the_reference_catches_a_broken_kernel(broken):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    broken("Im2Col", lambda xp, X, **a: xp.zeros((1, 8, 3, 3), np.float32))
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(run_op("Im2Col", [x], kernel=2), im2col_ref(x, 2, 2))
