"""Im2Col and Col2Im as operators (caffe2/operators/im2col_op.{h,cc}): the patches of a 4-D image laid out as
columns, and their adjoint, which sums columns back onto an image.

Arguments follow Caffe2's op, not the conv family: one `pad` for all four sides, kernel / kernel_h+kernel_w,
stride / stride_h+stride_w, dilation / dilation_h+dilation_w, order NCHW or NHWC. Caffe2 requires the image
to be at least as large as the dilated kernel before padding. NCHW columns are N x (C kH kW) x outH x outW
(channel-major), NHWC columns N x outH x outW x (kH kW C) (channel-minor).

Each is the other's gradient: Im2Col -> Col2Im(dY, X) (Caffe2 1.0 passed the forward output Y where dY
belongs, which equals dY only under its checker's squared loss; dY is the derivative), Col2Im -> Im2Col(dY)
for the columns (the image-shape input gets none).
"""
from __future__ import annotations

from ..core.errors import ArgumentError, ShapeError
from .base import check_float, like, out_spec, single_gradient
from .registry import Arg, op
from .window import Geometry, channels_first, check_order, from_channels_first, scatter_windows, window_view

IM2COL_ARGS = {"pad": 0, "kernel": 0, "kernel_h": Arg("int", None), "kernel_w": Arg("int", None),
               "dilation": 1, "dilation_h": Arg("int", None), "dilation_w": Arg("int", None),
               "stride": 1, "stride_h": Arg("int", None), "stride_w": Arg("int", None), "order": "NCHW"}


def _pair(args, name) -> tuple[int, int]:
    h, w = args[name + "_h"], args[name + "_w"]
    return (args[name] if h is None else h, args[name] if w is None else w)


def im2col_geometry(op_type: str, image_shape, args) -> tuple[str, tuple, Geometry]:
    """(order, (N, C, H, W), geometry) of a 4-D image shape, with Caffe2's checks."""
    order = check_order(args["order"])
    kernel, stride, dilation, pad = _pair(args, "kernel"), _pair(args, "stride"), _pair(args, "dilation"), args["pad"]
    for name, vals in (("kernel", kernel), ("stride", stride), ("dilation", dilation)):
        if min(vals) < 1:
            raise ArgumentError(f"{op_type}: {name} must be positive, got {list(vals)} (kernel is required)")
    if pad < 0:
        raise ArgumentError(f"{op_type}: pad must be >= 0, got {pad}")
    if len(image_shape) != 4:
        raise ShapeError(f"{op_type} needs a 4-D image ({order}), got shape {tuple(image_shape)}")
    s = tuple(int(d) for d in image_shape)
    n, c, h, w = s if order == "NCHW" else (s[0], s[3], s[1], s[2])
    dk = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True))
    if h < dk[0] or w < dk[1]:
        raise ShapeError(f"{op_type}: the image {h} x {w} is smaller than the dilated kernel {dk[0]} x {dk[1]}")
    out = tuple((size + 2 * pad - d) // st + 1 for size, d, st in zip((h, w), dk, stride, strict=True))
    return order, (n, c, h, w), Geometry(kernel, stride, dilation, (pad, pad), (pad, pad), out)


def _columns_shape(order, nchw, g) -> tuple:
    n, c = nchw[:2]
    taps = g.kernel[0] * g.kernel[1] * c
    return (n, taps, *g.out) if order == "NCHW" else (n, *g.out, taps)


def _im2col_shape(specs, **args):
    check_float("Im2Col", X=specs[0])
    order, nchw, g = im2col_geometry("Im2Col", specs[0].shape, args)
    return [out_spec(_columns_shape(order, nchw, g), specs[0].dtype)]


@op("Im2Col", inputs=1, outputs=1, inplace=(), args=IM2COL_ARGS, shape=_im2col_shape, shapes_from_inputs=True,
    grows="shapes", gradient=single_gradient("Col2Im", ["GO0", "I0"], reads_inputs=True))
def im2col_op(xp, X, **args):
    """X (N x C x H x W, or N x H x W x C) -> the kernel-sized patch at each output position, as columns:
    N x (C kH kW) x outH x outW for NCHW, N x outH x outW x (kH kW C) for NHWC; padding reads zeros."""
    check_float("Im2Col", X=X)
    order, nchw, g = im2col_geometry("Im2Col", X.shape, args)
    v = window_view(xp, channels_first(xp, X, order), g)               # N, C, oh, ow, kh, kw
    if order == "NCHW":
        return xp.ascontiguousarray(v.transpose(0, 1, 4, 5, 2, 3)).reshape(_columns_shape(order, nchw, g))
    return xp.ascontiguousarray(v.transpose(0, 2, 3, 4, 5, 1)).reshape(_columns_shape(order, nchw, g))


def _col2im_checks(X, Z, args):
    check_float("Col2Im", X=X)
    order, nchw, g = im2col_geometry("Col2Im", Z.shape, args)
    want = _columns_shape(order, nchw, g)
    if tuple(X.shape) != want:
        raise ShapeError(f"Col2Im: the columns {tuple(X.shape)} do not fit the image {tuple(Z.shape)} ({order}): "
                         f"expected {want}")
    return order, nchw, g


def _col2im_shape(specs, **args):
    _col2im_checks(*specs, args)
    return [like(specs[1], specs[0].dtype)]


@op("Col2Im", inputs=2, outputs=1, inplace=(), args=IM2COL_ARGS, shape=_col2im_shape, shapes_from_inputs=True,
    gradient=single_gradient("Im2Col", ["GO0"]))
def col2im_op(xp, X, Z, **args):
    """Columns X (Im2Col's layout) and an image Z giving the shape -> the image whose every pixel is the sum
    of the column entries that read it (the adjoint of Im2Col); Z's values are not read."""
    order, (n, c, h, w), g = _col2im_checks(X, Z, args)
    kh, kw = g.kernel
    if order == "NCHW":
        v = X.reshape(n, c, kh, kw, *g.out)
    else:
        v = X.reshape(n, *g.out, kh, kw, c).transpose(0, 5, 3, 4, 1, 2)
    y = scatter_windows(xp, lambda tap: v[:, :, tap[0], tap[1]], (n, c, h, w), g, X.dtype)
    return from_channels_first(xp, y, order)
