"""MaxPool, AveragePool, LpPool (and the 1D/2D/3D aliases) and LRN against nested-loop references, for many
argument forms (incl. Caffe's legacy pooling sizes and global pooling), both orders and both devices; plus the
pooling ops of the real SqueezeNet file and Glow's pool nets, and the errors a user can cause."""
import itertools
from pathlib import Path

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.io import proto
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, run_op

LOWEST = float(np.finfo(np.float32).min)
DATA = Path(__file__).resolve().parents[1] / "data"


def data(seed, *shape, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32)


def to_nhwc(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, -1))


# --------------------------------------------------------------------------------------------- references
def ref_pool(X, kind, kernel, stride, pb, out, include_pad=False, p=2.0):
    """Pool NCHW-style X: for each output position collect the window pixels inside the image (start =
    position*stride - pad_begin) and reduce them; averages divide by that count (or the kernel size)."""
    n_img, chans, spatial = X.shape[0], X.shape[1], X.shape[2:]
    Y = np.zeros((n_img, chans, *out))
    for n, c in itertools.product(range(n_img), range(chans)):
        for o in itertools.product(*(range(v) for v in out)):
            vals = []
            for t in itertools.product(*(range(k) for k in kernel)):
                pos = [o[i] * stride[i] - pb[i] + t[i] for i in range(len(o))]
                if all(0 <= q < s for q, s in zip(pos, spatial, strict=True)):
                    vals.append(float(X[(n, c, *pos)]))
            if kind == "max":
                Y[(n, c, *o)] = max(vals, default=LOWEST)
            elif kind == "avg":
                Y[(n, c, *o)] = sum(vals) / (np.prod(kernel) if include_pad else max(len(vals), 1))
            else:
                Y[(n, c, *o)] = sum(abs(v) ** p for v in vals) ** (1.0 / p)
    return Y


def ref_lrn(X, size, alpha, beta, bias, axis=1):
    """scale_c = bias + alpha/size * sum of x^2 over channels c-(size-1)//2 .. that+size-1 inside [0, C)."""
    Xm = np.moveaxis(X.astype(np.float64), axis, -1)
    C = Xm.shape[-1]
    scale = np.zeros_like(Xm)
    for idx in itertools.product(*(range(v) for v in Xm.shape[:-1])):
        for c in range(C):
            first = c - (size - 1) // 2
            acc = sum(Xm[idx + (j,)] ** 2 for j in range(first, first + size) if 0 <= j < C)
            scale[idx + (c,)] = bias + alpha / size * acc
    Y = Xm * scale ** -beta
    return np.moveaxis(Y, -1, axis), np.moveaxis(scale, -1, axis)


# --------------------------------------------------------------------------------------------- pooling table
# (id, X shape NCHW, op args, kernel, stride, pads begin, output size worked out by hand from
# conv_pool_op_base.h, extra reference options)
POOL_CASES = [
    ("kernel2", (2, 3, 5, 4), dict(kernel=2), (2, 2), (1, 1), (0, 0), (4, 3), {}),
    ("k3_s2_p1", (1, 2, 7, 6), dict(kernel=3, stride=2, pad=1), (3, 3), (2, 2), (1, 1), (4, 3), {}),
    ("hw_forms_asym", (1, 2, 6, 7), dict(kernel_h=3, kernel_w=2, stride_h=1, stride_w=2, pad_t=0, pad_l=1,
                                         pad_b=2, pad_r=1), (3, 2), (1, 2), (0, 1), (6, 4), {}),
    ("list_forms", (2, 2, 6, 5), dict(kernels=[2, 3], strides=[2, 1], pads=[1, 0, 1, 2]), (2, 3), (2, 1),
     (1, 0), (4, 5), {}),
    ("inception_avg", (1, 2, 7, 7), dict(kernel=7, stride=1, pad_t=0, pad_l=0, pad_b=1, pad_r=1), (7, 7),
     (1, 1), (0, 0), (2, 2), {}),
    ("valid", (1, 2, 7, 6), dict(kernel=3, stride=2, legacy_pad=1), (3, 3), (2, 2), (0, 0), (3, 2), {}),
    ("same", (1, 2, 7, 6), dict(kernel=3, stride=2, legacy_pad=2), (3, 3), (2, 2), (1, 0), (4, 3), {}),
    # Caffe's ceil rule: 54 -> 27 (Caffe2's own rule gives 26), the last window reads 2 real columns
    ("legacy_squeeze_v10", (1, 2, 54, 54), dict(kernel=3, stride=2, pad=0, legacy_pad=3), (3, 3), (2, 2),
     (0, 0), (27, 27), {}),
    ("legacy_squeeze_v11", (1, 2, 27, 27), dict(kernel=3, stride=2, pad=0, legacy_pad=3), (3, 3), (2, 2),
     (0, 0), (13, 13), {}),
    ("legacy_pad1", (1, 2, 6, 5), dict(kernel=3, stride=2, pad=1, legacy_pad=3), (3, 3), (2, 2), (1, 1),
     (4, 3), {}),  # W: ceil(4/2+1)=3; last window starts at 3 < 5+1, kept
    ("legacy_clip", (1, 1, 5, 5), dict(kernel=2, stride=2, pad=1, legacy_pad=3), (2, 2), (2, 2), (1, 1),
     (3, 3), {}),  # ceil(5/2+1)=4, but a window starting at 6-1=5 would lie in the padding: clipped to 3
    ("legacy_tiny", (1, 2, 2, 2), dict(kernel=3, stride=2, legacy_pad=3), (3, 3), (2, 2), (0, 0), (1, 1), {}),
    ("global", (2, 3, 5, 4), dict(global_pooling=1), (5, 4), (1, 1), (0, 0), (1, 1), {}),
    ("global_squeeze", (2, 3, 4, 4), dict(global_pooling=1, kernel=0, legacy_pad=3, pad=0, stride=1), (4, 4),
     (1, 1), (0, 0), (1, 1), {}),
    ("include_pad", (1, 2, 5, 6), dict(kernel=3, stride=2, pad=1, count_include_pad=1), (3, 3), (2, 2),
     (1, 1), (3, 3), dict(include_pad=True)),
    ("pool1d", (2, 3, 9), dict(kernels=[3], strides=[2], pads=[1, 1]), (3,), (2,), (1,), (5,), {}),
    ("pool1d_scalar", (1, 2, 7), dict(kernel=2, stride=2), (2,), (2,), (0,), (3,), {}),
    ("pool3d", (1, 2, 4, 5, 3), dict(kernels=[2, 3, 2], strides=[2, 1, 1], pads=[1, 0, 1, 0, 1, 0]),
     (2, 3, 2), (2, 1, 1), (1, 0, 1), (2, 4, 3), {}),
]
KINDS = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}


def _case_args(op_type, case):
    args = dict(case[2])
    if op_type != "AveragePool":
        args.pop("count_include_pad", None)
    if op_type == "LpPool":
        args["p"] = 3.0
    return args


# count_include_pad is an AveragePool argument only
POOL_PARAMS = [(c, t) for c in POOL_CASES for t in KINDS if t == "AveragePool" or "include_pad" not in c[7]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case, op_type", POOL_PARAMS, ids=[f"{c[0]}-{t}" for c, t in POOL_PARAMS])
def test_pool(case, op_type, order, device):
    name, xshape, _, kernel, stride, pb, out, extra = case
    X = data(sum(map(ord, name)), *xshape)
    expected = ref_pool(X, KINDS[op_type], kernel, stride, pb, out, p=3.0, **extra)
    y = run_op(op_type, [X if order == "NCHW" else to_nhwc(X)], device=device, order=order,
               **_case_args(op_type, case))
    y = np.moveaxis(y, -1, 1) if order == "NHWC" else y
    assert y.shape == expected.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_max_pool_padding_never_wins(device):
    X = data(3, 1, 2, 4, 4, lo=-3.0, hi=-1.0)  # all negative: a zero from the padding would be wrong
    y = run_op("MaxPool", [X], device=device, kernel=2, stride=2, pad=1)
    np.testing.assert_array_equal(y, ref_pool(X, "max", (2, 2), (2, 2), (1, 1), (3, 3)))
    assert (y < 0).all()


@pytest.mark.parametrize("alias, kind, name", [
    ("MaxPool1D", "max", "pool1d"), ("MaxPool2D", "max", "k3_s2_p1"), ("MaxPool3D", "max", "pool3d"),
    ("AveragePool1D", "avg", "pool1d"), ("AveragePool2D", "avg", "legacy_squeeze_v10"),
    ("AveragePool3D", "avg", "pool3d")])
def test_pool_aliases(alias, kind, name):
    _, xshape, args, kernel, stride, pb, out, _ = _case(name)
    X = data(len(alias), *xshape)
    np.testing.assert_allclose(run_op(alias, [X], **args), ref_pool(X, kind, kernel, stride, pb, out),
                               rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------- LRN
LRN_CASES = [
    ("alexnet", (2, 7, 3, 2), dict(size=5, alpha=1e-4, beta=0.75, bias=1.0)),
    ("strong", (1, 6, 2, 3), dict(size=3, alpha=0.5, beta=0.5, bias=2.0)),
    ("size1", (1, 4, 2, 2), dict(size=1, alpha=1.0, beta=1.0)),
    ("even_size", (1, 5, 2, 2), dict(size=4, alpha=0.8, beta=0.6, bias=1.5)),
    ("wide", (2, 3, 3, 1), dict(size=7, alpha=2.0, beta=0.75)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", LRN_CASES, ids=[c[0] for c in LRN_CASES])
def test_lrn(case, order, device):
    name, xshape, args = case
    X = data(sum(map(ord, name)), *xshape, lo=-2.0, hi=2.0)
    Y_ref, S_ref = ref_lrn(X, args["size"], args["alpha"], args["beta"], args.get("bias", 1.0))
    Xin = X if order == "NCHW" else to_nhwc(X)
    Y, S = run_op("LRN", [Xin], outputs=2, device=device, order=order, **args)
    if order == "NHWC":
        Y, S = np.moveaxis(Y, -1, 1), np.moveaxis(S, -1, 1)
    assert Y.dtype == S.dtype == np.float32
    np.testing.assert_allclose(Y, Y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(S, S_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run_op("LRN", [Xin], device=device, order=order, **args),
                               Y if order == "NCHW" else to_nhwc(Y), rtol=1e-6)  # one-output form


# --------------------------------------------------------------------------------------------- real files
def test_squeezenet_pool_ops():
    """The MaxPool (legacy_pad=3) and global AveragePool of the real SqueezeNet v1.1 predict net, on the
    net's own image sizes (111 -> 55 -> 27 -> 13) and on SqueezeNet v1.0's 54 (Caffe's ceil rule bites)."""
    net = proto.load(DATA / "caffe2" / "squeeze_predict_net.pb")
    pools = [op for op in net.op if op.type in ("MaxPool", "AveragePool")]
    assert [op.type for op in pools] == ["MaxPool"] * 3 + ["AveragePool"]
    sizes = {111: 55, 55: 27, 27: 13, 54: 27}
    for op in pools[:3]:
        for size, out in sizes.items():
            ws = Workspace()
            X = data(size, 1, 2, size, size)
            ws.feed(op.input[0], X)
            ws.run_operator_once(op)
            expected = ref_pool(X, "max", (3, 3), (2, 2), (0, 0), (out, out))
            np.testing.assert_array_equal(ws.fetch(op.output[0]), expected)
    ws = Workspace()
    X = data(13, 2, 3, 13, 13)
    ws.feed(pools[3].input[0], X)
    ws.run_operator_once(pools[3])
    expected = X.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(ws.fetch(pools[3].output[0]), expected, rtol=1e-5)


@pytest.mark.parametrize("net_file, kind, nhwc", [
    ("maxpool_legacy_padding_predict_net", "max", False), ("maxpool_predict_net", "max", False),
    ("maxpool_nhwc_predict_net", "max", True), ("avgpool_predict_net", "avg", False),
    ("avgpool_nhwc_predict_net", "avg", True)])
def test_glow_pool_nets(net_file, kind, nhwc):
    """Glow's pool nets: kernel 2, stride 1, pad 1 (with legacy_pad 0 / 3, NHWC, count_include_pad=0)."""
    net = proto.load(DATA / "glow" / f"{net_file}.pbtxt")
    X = data(7, 2, 3, 4, 5)
    ws = Workspace()
    ws.feed("inputs", to_nhwc(X) if nhwc else X)
    ws.run_net_once(net)
    y = ws.fetch("output")
    y = np.moveaxis(y, -1, 1) if nhwc else y
    np.testing.assert_allclose(y, ref_pool(X, kind, (2, 2), (1, 1), (1, 1), (5, 6)), rtol=1e-6)


# --------------------------------------------------------------------------------------------- errors
X1 = data(1, 1, 2, 5, 5)
ERRORS = [
    ("MaxPool", [data(1, 1, 1, 3, 3)], dict(kernel=5), ShapeError,
     "kernel 5 is larger than the padded input 3"),
    ("MaxPool", [data(1, 1, 1, 2, 2)], dict(kernel=5, stride=2, legacy_pad=3), ShapeError,
     "larger than the input"),
    ("MaxPool", [X1], dict(kernel=2, dilation=2), ArgumentError, "does not support dilation"),
    ("AveragePool", [X1], dict(kernel=2, pad=2), ArgumentError, "pad must be smaller than the kernel"),
    ("MaxPool", [X1], dict(global_pooling=1, stride=2), ArgumentError, "global_pooling"),
    ("MaxPool", [X1], dict(stride=2), ArgumentError, "kernel size is required"),
    ("MaxPool", [X1], dict(kernel=2, kernel_h=2, kernel_w=2), ArgumentError, "more than one form"),
    ("MaxPool", [X1], dict(kernel=2, strides=[1, 1], stride_h=1, stride_w=1), ArgumentError,
     "stride_h/stride_w and strides"),
    ("MaxPool", [X1], dict(kernel=2, legacy_pad=1, pads=[0, 0, 0, 0]), ArgumentError,
     "remove the explicit pad"),
    ("MaxPool", [X1], dict(kernels=[2, 2, 2]), ShapeError, "2 spatial dims"),
    ("AveragePool", [X1.astype(np.int64)], dict(kernel=2), DTypeError, "floating-point"),
    ("MaxPool", [data(1, 3, 5)[0]], dict(kernel=2), ShapeError, "at least one spatial dim"),
    ("MaxPool", [X1], dict(kernel=2, order="CHWN"), ArgumentError, "'NCHW' or 'NHWC'"),
    ("LRN", [X1], dict(size=0, alpha=1.0, beta=0.5), ArgumentError, "positive"),
    ("LRN", [X1.astype(np.int32)], dict(size=3, alpha=1.0, beta=0.5), DTypeError, "int32"),
]


@pytest.mark.parametrize("op_type, inputs, args, error, match", ERRORS,
                         ids=[f"{e[0]}-{e[4][:30]}" for e in ERRORS])
def test_errors(op_type, inputs, args, error, match):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, **args)


# --------------------------------------------------------------------------------------------- the tester
def _case(name):
    return next(c for c in POOL_CASES if c[0] == name)


def _avg_by_kernel(k):
    return lambda xp, X, count_include_pad=False, **a: k(xp, X, count_include_pad=True, **a)


def _lrn_alpha_undivided(k):
    return lambda xp, X, **a: k(xp, X, **{**a, "alpha": a["alpha"] * a["size"]})


def _max_without_padding_rule(k):
    def wrong(xp, X, **a):  # pad with zeros instead of "never wins": an average-style zero-pad max
        from stepnet.ops.conv import geometry, window_view
        g = geometry({n: v for n, v in a.items() if n != "order"}, X.shape[2:], pool=True)
        return window_view(xp, X, g, fill=0).max(axis=(4, 5))
    return wrong


@pytest.mark.parametrize("op_type, breaks, check", [
    ("MaxPool", _max_without_padding_rule, lambda: test_max_pool_padding_never_wins("cpu")),
    ("AveragePool", _avg_by_kernel, lambda: test_pool(_case("k3_s2_p1"), "AveragePool", "NCHW", "cpu")),
    ("AveragePool", _avg_by_kernel,
     lambda: test_pool(_case("legacy_squeeze_v10"), "AveragePool", "NCHW", "cpu")),
    ("LRN", _lrn_alpha_undivided, lambda: test_lrn(LRN_CASES[1], "NCHW", "cpu")),
])
def test_reference_catches_broken_kernels(op_type, breaks, check, broken):
    """Zero padding winning a max, averages over the full kernel at the border (also at the legacy tail),
    LRN's alpha not divided by size: the comparisons the tables use must fail."""
    broken(op_type, breaks(REGISTRY.get(op_type).kernel))
    with pytest.raises(AssertionError):
        check()
