"""Conv (and its 1D/2D/3D aliases) and ConvTranspose against nested-loop references over output positions
and kernel taps, in float64, for many argument forms, both orders and both devices; plus the Glow conv net
pair and the errors a user can cause."""
import itertools
import math
import time
from pathlib import Path

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.io import proto
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, run_op

# Glow's predict_net.pbtxt / init_net.pbtxt, vendored byte-identical to shared/realmodels/glow/conv_*.pbtxt
GLOW = Path(__file__).resolve().parents[1] / "data" / "glow"


def data(seed, *shape):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


# --------------------------------------------------------------------------------------------- references
def ref_conv(X, W, b, stride, dil, pb, pe, group, out=None):
    """Direct convolution of NCHW-style X with W (M, C/group, *kernel): loops over batch, filter, output
    position, channel and kernel tap; taps outside the image read zero."""
    n_img, chans = X.shape[:2]
    spatial, kernel = X.shape[2:], W.shape[2:]
    M, cg = W.shape[:2]
    if out is None:
        out = [(spatial[i] + pb[i] + pe[i] - (dil[i] * (kernel[i] - 1) + 1)) // stride[i] + 1
               for i in range(len(spatial))]
    Y = np.zeros((n_img, M, *out))
    for n, m in itertools.product(range(n_img), range(M)):
        g = m // (M // group)
        for o in itertools.product(*(range(v) for v in out)):
            acc = 0.0 if b is None else float(b[m])
            for c in range(cg):
                for t in itertools.product(*(range(k) for k in kernel)):
                    pos = [o[i] * stride[i] - pb[i] + t[i] * dil[i] for i in range(len(o))]
                    if all(0 <= p < s for p, s in zip(pos, spatial, strict=True)):
                        acc += float(X[(n, g * cg + c, *pos)]) * float(W[(m, c, *t)])
            Y[(n, m, *o)] = acc
    return Y


def ref_conv_transpose(X, W, b, stride, pb, pe, adj, group):
    """Transposed convolution: every input pixel scatters W[m] (C/group x kernel) into the output at
    position*stride + tap - pad_begin; output size (in-1)*stride + kernel + adj - pads."""
    n_img, M = X.shape[:2]
    spatial, kernel = X.shape[2:], W.shape[2:]
    cg = W.shape[1]
    out = [(spatial[i] - 1) * stride[i] + kernel[i] + adj[i] - pb[i] - pe[i] for i in range(len(spatial))]
    Y = np.zeros((n_img, cg * group, *out))
    if b is not None:
        Y += np.asarray(b, dtype=np.float64).reshape((-1,) + (1,) * len(out))
    for n, m in itertools.product(range(n_img), range(M)):
        g = m // (M // group)
        for p in itertools.product(*(range(v) for v in spatial)):
            for c in range(cg):
                for t in itertools.product(*(range(k) for k in kernel)):
                    q = [p[i] * stride[i] + t[i] - pb[i] for i in range(len(p))]
                    if all(0 <= v < s for v, s in zip(q, out, strict=True)):
                        Y[(n, g * cg + c, *q)] += float(X[(n, m, *p)]) * float(W[(m, c, *t)])
    return Y


def to_nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


# --------------------------------------------------------------------------------------------- Conv table
# (id, X shape NCHW, M, kernel, group, op args, geometry: stride, dilation, pads begin/end and, where a
# legacy_pad rule sets them, the output size worked out by hand from conv_pool_op_base.h)
CONV_CASES = [
    ("kernel", (2, 3, 6, 5), 4, (3, 3), 1, dict(kernel=3), dict()),
    ("pad_stride", (2, 3, 7, 6), 4, (3, 3), 1, dict(kernel=3, pad=1, stride=2),
     dict(s=(2, 2), pb=(1, 1), pe=(1, 1))),
    ("hw_forms_asym_pads", (1, 2, 7, 6), 3, (3, 2), 1,
     dict(kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_t=1, pad_l=0, pad_b=2, pad_r=1),
     dict(s=(2, 1), pb=(1, 0), pe=(2, 1))),
    ("list_forms", (2, 2, 7, 8), 3, (2, 3), 1, dict(kernels=[2, 3], strides=[1, 2], pads=[0, 1, 1, 2],
                                                    dilations=[2, 1]),
     dict(s=(1, 2), d=(2, 1), pb=(0, 1), pe=(1, 2))),
    ("dilation", (1, 2, 8, 7), 2, (3, 3), 1, dict(kernel=3, dilation=2, pad=2),
     dict(d=(2, 2), pb=(2, 2), pe=(2, 2))),
    ("dilation_hw", (1, 2, 8, 7), 2, (2, 2), 1, dict(kernel=2, dilation_h=3, dilation_w=1), dict(d=(3, 1))),
    ("group2", (2, 4, 5, 6), 6, (3, 3), 2, dict(kernel=3, pad=1, group=2), dict(pb=(1, 1), pe=(1, 1))),
    ("depthwise", (1, 4, 5, 5), 8, (3, 3), 4, dict(kernel=3, pad=1, stride=2, group=4),
     dict(s=(2, 2), pb=(1, 1), pe=(1, 1))),
    ("group_dilation", (1, 4, 7, 7), 4, (2, 2), 2, dict(kernel=2, dilation=2, group=2), dict(d=(2, 2))),
    ("valid", (1, 2, 7, 6), 3, (3, 3), 1, dict(kernel=3, stride=2, legacy_pad=1), dict(s=(2, 2), out=(3, 2))),
    ("same", (1, 2, 7, 6), 3, (3, 3), 1, dict(kernel=3, stride=2, legacy_pad=2),
     dict(s=(2, 2), pb=(1, 0), pe=(1, 1), out=(4, 3))),
    ("same_negative_pad", (1, 2, 5, 7), 2, (1, 1), 1, dict(kernel=1, stride=3, legacy_pad=2),
     dict(s=(3, 3), pb=(0, 0), pe=(-1, 0), out=(2, 3))),
    ("one_by_one", (2, 5, 4, 3), 3, (1, 1), 1, dict(kernel=1), dict()),
    ("no_bias", (1, 3, 5, 5), 2, (3, 3), 1, dict(kernel=3, pad=1), dict(pb=(1, 1), pe=(1, 1), bias=False)),
    ("kernel_from_filter", (1, 2, 5, 6), 3, (2, 3), 1, dict(stride=1), dict()),
    ("conv1d", (2, 3, 9), 2, (3,), 1, dict(kernels=[3], strides=[2], pads=[1, 0]),
     dict(s=(2,), pb=(1,), pe=(0,))),
    ("conv1d_scalar", (1, 2, 8), 3, (3,), 1, dict(kernel=3, pad=1), dict(pb=(1,), pe=(1,))),
    ("conv3d", (1, 4, 4, 5, 3), 4, (2, 3, 2), 2,
     dict(kernels=[2, 3, 2], strides=[1, 2, 1], pads=[1, 0, 1, 0, 1, 1], group=2),
     dict(s=(1, 2, 1), pb=(1, 0, 1), pe=(0, 1, 1))),
]


def _conv_inputs(i, case):
    _, xshape, M, kernel, group, _, geo = case
    X = data(i, *xshape)
    W = data(100 + i, M, xshape[1] // group, *kernel)
    b = data(200 + i, M) if geo.get("bias", True) else None
    return X, W, b


_ref_cache = {}


def conv_expected(i):
    case = CONV_CASES[i]
    if i not in _ref_cache:
        X, W, b = _conv_inputs(i, case)
        nd, geo = X.ndim - 2, case[6]
        one, zero = (1,) * nd, (0,) * nd
        _ref_cache[i] = ref_conv(X, W, b, geo.get("s", one), geo.get("d", one), geo.get("pb", zero),
                                 geo.get("pe", zero), case[4], geo.get("out"))
    return _ref_cache[i]


def run_conv(i, order, device, op_type="Conv"):
    case = CONV_CASES[i]
    X, W, b = _conv_inputs(i, case)
    ins = [X, W] + ([b] if b is not None else [])
    if order == "NHWC":
        ins = [to_nhwc(X), to_nhwc(W)] + ins[2:]
    y = run_op(op_type, ins, device=device, order=order, **case[5])
    return np.moveaxis(y, -1, 1) if order == "NHWC" else y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("i", range(len(CONV_CASES)), ids=[c[0] for c in CONV_CASES])
def test_conv(i, order, device):
    y = run_conv(i, order, device)
    expected = conv_expected(i)
    assert y.dtype == np.float32
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alias, name", [("Conv1D", "conv1d"), ("Conv2D", "pad_stride"),
                                         ("Conv3D", "conv3d")])
def test_conv_aliases(alias, name):
    i = [c[0] for c in CONV_CASES].index(name)
    np.testing.assert_allclose(run_conv(i, "NCHW", "cpu", alias), conv_expected(i), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------- ConvTranspose
# (id, X shape NCHW, C/group, kernel, group, op args, stride, pads begin, pads end, adj)
Z2 = (0, 0)
CT_CASES = [
    ("kernel3", (2, 3, 4, 3), 2, (3, 3), 1, dict(kernel=3), (1, 1), Z2, Z2, Z2),
    ("stride2_pad1", (1, 2, 3, 4), 3, (3, 3), 1, dict(kernel=3, stride=2, pad=1), (2, 2), (1, 1), (1, 1), Z2),
    ("maskrcnn_k4", (1, 3, 3, 3), 2, (4, 4), 1, dict(kernel=4, stride=2, pad=1), (2, 2), (1, 1), (1, 1), Z2),
    ("maskrcnn_k2", (1, 2, 3, 2), 2, (2, 2), 1, dict(kernel=2, stride=2, pad=0), (2, 2), Z2, Z2, Z2),
    ("hw_forms_adj", (1, 2, 3, 3), 2, (3, 2), 1,
     dict(kernel_h=3, kernel_w=2, stride_h=2, stride_w=3, adj_h=1, adj_w=2, pads=[1, 0, 0, 1]),
     (2, 3), (1, 0), (0, 1), (1, 2)),
    ("adj_scalar", (2, 2, 2, 3), 1, (3, 3), 1, dict(kernel=3, stride=2, adj=1), (2, 2), Z2, Z2, (1, 1)),
    ("group2", (1, 4, 3, 3), 3, (2, 3), 2, dict(kernels=[2, 3], strides=[2, 1], pads=[1, 1, 0, 1], group=2),
     (2, 1), (1, 1), (0, 1), Z2),
    ("valid", (1, 2, 3, 3), 2, (3, 3), 1, dict(kernel=3, stride=2, legacy_pad=1), (2, 2), Z2, Z2, Z2),
    ("style_transfer", (1, 3, 4, 4), 2, (3, 3), 1,
     dict(kernel_h=3, kernel_w=3, stride_h=2, stride_w=2, pad=0, adj=0), (2, 2), Z2, Z2, Z2),
    ("one_d", (2, 2, 5), 3, (3,), 1, dict(kernels=[3], strides=[2], pads=[1, 0]), (2,), (1,), (0,), (0,)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CT_CASES, ids=[c[0] for c in CT_CASES])
def test_conv_transpose(case, order, device):
    name, xshape, cg, kernel, group, args, stride, pb, pe, adj = case
    seed = sum(map(ord, name))
    X, W, b = data(seed, *xshape), data(seed + 1, xshape[1], cg, *kernel), data(seed + 2, cg * group)
    expected = ref_conv_transpose(X, W, b, stride, pb, pe, adj, group)
    ins = [X, W, b] if order == "NCHW" else [to_nhwc(X), to_nhwc(W), b]
    y = run_op("ConvTranspose", ins, device=device, order=order, **args)
    y = np.moveaxis(y, -1, 1) if order == "NHWC" else y
    assert y.shape == expected.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("args, spatial, groups", [
    (dict(kernel=3, pad=1, stride=2), (7, 6), 1),
    (dict(kernels=[2, 3], dilations=[2, 1], pads=[0, 1, 2, 0]), (6, 7), 2),
    (dict(kernel=1, stride=3, legacy_pad=2), (5, 7), 1),
    (dict(kernels=[3], strides=[2]), (9,), 3)])
def test_col2im_is_the_adjoint_of_im2col(args, spatial, groups, device):
    """<im2col(x), c> == <x, col2im(c)> for random x and c: what the gradients will rely on (incl. dilation,
    groups and the negative tail pad of legacy SAME)."""
    from stepnet.core import backend
    from stepnet.ops.conv import col2im, geometry, im2col
    xp = backend.array_module(backend.Device(device))
    x = data(1, 2, 3 * groups, *spatial)
    g = geometry(args, spatial)
    cols = im2col(xp, backend.to_device(x, backend.Device(device)), g, groups)
    c = data(2, *cols.shape)
    back = col2im(xp, backend.to_device(c, backend.Device(device)), x.shape, g, groups)
    lhs = float(np.sum(backend.to_host(cols).astype(np.float64) * c))
    rhs = float(np.sum(x.astype(np.float64) * backend.to_host(back)))
    assert math.isclose(lhs, rhs, rel_tol=1e-5, abs_tol=1e-5)


# --------------------------------------------------------------------------------------------- real files
@pytest.mark.parametrize("device", DEVICES)
def test_glow_conv_net(device):
    """Glow's Caffe2 importer test net: kernel 2, pad 1, dilations [2, 2], weights all ones, bias 2."""
    if "GivenTensorFill" not in REGISTRY:
        pytest.skip("GivenTensorFill (fill family) not available")
    init, pred = proto.load(GLOW / "init_net.pbtxt"), proto.load(GLOW / "predict_net.pbtxt")
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    if device == "emulated":
        for net in (init, pred):
            net.device_option.device_type = 1
    ws.run_net_once(init)
    X = np.arange(2 * 1 * 4 * 5, dtype=np.float32).reshape(2, 1, 4, 5) / 7
    ws.feed("gpu_0/data_0", X, device_option=pred.device_option if device == "emulated" else None)
    ws.run_net_once(pred)
    expected = ref_conv(X, np.ones((1, 1, 2, 2)), [2.0], (1, 1), (2, 2), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(ws.fetch("conv_out"), expected, rtol=1e-6)
    # the 3x3 image 0..8 gives the hand-checked corners 0+4+2, edges 3+5+2, centre 0+2+6+8+2
    ws.feed("gpu_0/data_0", np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3),
            device_option=pred.device_option if device == "emulated" else None)
    ws.run_net_once(pred)
    np.testing.assert_allclose(ws.fetch("conv_out").ravel(), [6, 10, 6, 10, 18, 10, 6, 10, 6])


# --------------------------------------------------------------------------------------------- errors
X1 = data(1, 1, 3, 8, 8)
ERRORS = [
    ("Conv", [data(1, 1, 1, 3, 3), data(2, 1, 1, 5, 5)], dict(kernel=5), ShapeError,
     "larger than the padded input"),
    ("Conv", [data(1, 1, 1, 4, 4), data(2, 1, 1, 3, 3)], dict(kernel=3, dilation=2), ShapeError,
     "dilated kernel 5"),
    ("Conv", [data(1, 1, 3, 6, 6), data(2, 4, 1, 3, 3)], dict(kernel=3, group=2), ShapeError,
     "does not divide the 3 input channels"),
    ("Conv", [data(1, 1, 4, 6, 6), data(2, 3, 2, 3, 3)], dict(kernel=3, group=2), ShapeError,
     "does not divide the 3 filters"),
    ("Conv", [X1, data(2, 4, 2, 2, 3)], dict(kernel=2), ShapeError, "filter looks like NHWC.*order=\"NHWC\""),
    ("Conv", [to_nhwc(X1), data(2, 4, 3, 2, 2)], dict(kernel=2), ShapeError, "input looks like NHWC"),
    ("Conv", [to_nhwc(X1), data(2, 4, 3, 2, 2)], dict(kernel=2, order="NHWC"), ShapeError,
     "filter looks like NCHW"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, kernel_h=3, kernel_w=3), ArgumentError,
     "more than one form.*kernel and kernel_h/kernel_w"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, kernels=[3, 3]), ArgumentError, "more than one form"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, pad=1, pads=[1, 1, 1, 1]), ArgumentError,
     "pad and pads"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel_h=3), ArgumentError, "kernel_h given without kernel_w"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, pad_t=1, pad_b=1), ArgumentError,
     "without pad_l, pad_r"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, legacy_pad=2, pad=1), ArgumentError,
     "computes the padding itself"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, legacy_pad=7), ArgumentError, "legacy_pad must be"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernels=[3, 3, 3]), ShapeError, "2 spatial dims"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, pads=[1, 1]), ShapeError, "needs 4 values"),
    ("Conv", [X1, data(2, 4, 3, 2, 2)], dict(kernel=3), ShapeError, r"kernel arguments say \[3, 3\]"),
    ("Conv", [X1, data(2, 4, 3, 3, 3), data(3, 5)], dict(kernel=3), ShapeError,
     "vector of the 4 output channels"),
    ("Conv", [X1, data(2, 4, 3, 3)], dict(kernel=3), ShapeError, "rank 4"),
    ("Conv", [X1.astype(np.int32), data(2, 4, 3, 3, 3).astype(np.int32)], dict(kernel=3), DTypeError,
     "int32"),
    ("Conv", [X1, data(2, 4, 3, 3, 3).astype(np.float64)], dict(kernel=3), DTypeError, "one dtype"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, order="NWHC"), ArgumentError, "'NCHW' or 'NHWC'"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, stride=0), ArgumentError, "stride must be positive"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, pad=-1), ArgumentError, "pads must be non-negative"),
    ("Conv", [X1, data(2, 4, 3, 3, 3)], dict(kernel=3, legacy_pad=2, dilation=2), ArgumentError,
     "SAME.*dilation"),
    ("ConvTranspose", [X1, data(2, 4, 2, 3, 3)], dict(kernel=3), ShapeError, "3 input channels"),
    ("ConvTranspose", [to_nhwc(X1), data(2, 3, 3, 3, 2)], dict(kernel=3), ShapeError,
     "input looks like NHWC"),
    ("ConvTranspose", [X1, data(2, 3, 2, 3, 3)], dict(kernel=3, legacy_pad=3), ArgumentError,
     "CAFFE_LEGACY_POOLING"),
    ("ConvTranspose", [X1, data(2, 3, 2, 3, 3)], dict(kernel=3, stride=2, adj=3), ArgumentError,
     "adj must not exceed stride"),
    ("ConvTranspose", [X1, data(2, 3, 2, 3, 3)], dict(kernel=3, group=2), ShapeError,
     "does not divide the 3"),
    ("ConvTranspose", [X1, data(2, 3, 2, 3, 3), data(3, 3)], dict(kernel=3), ShapeError, "2 output channels"),
    ("ConvTranspose", [data(1, 1, 1, 2, 2), data(2, 1, 1, 2, 2)], dict(kernel=2, pad=2), ShapeError,
     "remove the whole output"),
]


@pytest.mark.parametrize("op_type, inputs, args, error, match", ERRORS,
                         ids=[f"{e[0]}-{e[4][:30]}" for e in ERRORS])
def test_errors(op_type, inputs, args, error, match):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, **args)


# --------------------------------------------------------------------------------------------- the tester
@pytest.mark.parametrize("op_type, breaks", [
    ("Conv", lambda k: lambda xp, X, W, b=None, **a: k(xp, X, W[:, :, ::-1], b, **a)),   # flipped filter
    ("Conv", lambda k: lambda xp, X, W, b=None, **a: k(xp, X, W, None, **a)),            # bias dropped
    ("ConvTranspose", lambda k: lambda xp, X, W, b=None, **a: k(xp, X, W[..., ::-1, ::-1], b, **a)),
    ("ConvTranspose", lambda k: lambda xp, X, W, b=None, **a: k(xp, X, W, b, **{**a, "pad": 0})),
])
def test_reference_catches_broken_kernels(op_type, breaks, broken):
    """A flipped filter, a dropped bias, a correlation instead of the adjoint, ignored pads: the same
    comparison the tables use must fail."""
    broken(op_type, breaks(REGISTRY.get(op_type).kernel))
    with pytest.raises(AssertionError):
        if op_type == "Conv":
            test_conv(1, "NCHW", "cpu")
        else:
            test_conv_transpose(CT_CASES[1], "NCHW", "cpu")


def test_timing_sanity(capsys):
    """Printed, not asserted: a 1x64x56x56 3x3 conv should take milliseconds."""
    X, W = data(5, 1, 64, 56, 56), data(6, 64, 64, 3, 3)
    run_op("Conv", [X, W], kernel=3, pad=1)
    start = time.perf_counter()
    y = run_op("Conv", [X, W], kernel=3, pad=1)
    took = time.perf_counter() - start
    # spot-check one output pixel against the definition
    n, m, i, j = 0, 7, 20, 33
    direct = sum(float(X[n, c, i - 1 + a, j - 1 + e]) * float(W[m, c, a, e])
                 for c in range(64) for a in range(3) for e in range(3))
    assert math.isclose(float(y[n, m, i, j]), direct, rel_tol=1e-4, abs_tol=1e-4)
    with capsys.disabled():
        print(f"\n[timing] Conv 1x64x56x56, 64 filters 3x3: {took * 1e3:.1f} ms (run_op incl. feed/fetch)")
