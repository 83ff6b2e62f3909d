"""LC, LC1D, LC2D, LC3D and their gradients (stepnet/ops/locally_connected.py) against a loop written here from
Caffe2's docs (a convolution with one filter per output position), NCHW with groups, strides, padding and
dilation, and NHWC; gradients against float64 finite differences and the ops the maker emits; bad inputs;
broken kernels caught."""
import itertools

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, ShapeError
from stepnet.io.proto import argument_value
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, check_gradient, infer_static, make_op, run_op

rng = np.random.default_rng(43)


def lc_ref(x, w, b=None, stride=1, pad=0, dilation=1, group=1):
    """NCHW, any number of spatial dims: Y[n, m, p] = b[p, m] + sum_{c in m's group, k} W[p, m, c, k] *
    X[n, c, p*stride - pad + k*dilation] (zero outside)."""
    n, c, *spatial = x.shape
    nd = len(spatial)
    out, (m, cg), kernel = w.shape[:nd], w.shape[nd:nd + 2], w.shape[nd + 2:]
    y = np.zeros((n, m, *out))
    for b_, mm, *p in itertools.product(range(n), range(m), *(range(o) for o in out)):
        g = mm // (m // group)
        total = 0.0 if b is None else float(b[(*p, mm)])
        for cc, *k in itertools.product(range(cg), *(range(s) for s in kernel)):
            pos = [pp * stride - pad + kk * dilation for pp, kk in zip(p, k, strict=True)]
            if all(0 <= v < s for v, s in zip(pos, spatial, strict=True)):
                total += float(w[(*p, mm, cc, *k)]) * float(x[(b_, g * cg + cc, *pos)])
        y[(b_, mm, *p)] = total
    return y


def make(n, c, spatial, m, kernel, stride=1, pad=0, dilation=1, group=1, bias=True, dtype=np.float32):
    out = [(s + 2 * pad - (dilation * (kernel - 1) + 1)) // stride + 1 for s in spatial]
    x = rng.standard_normal((n, c, *spatial)).astype(dtype)
    w = rng.standard_normal((*out, m, c // group, *[kernel] * len(spatial))).astype(dtype)
    b = rng.standard_normal((*out, m)).astype(dtype) if bias else None
    return x, w, b


CASES = [   # (op, n, c, spatial, m, kernel, extra args)
    ("LC1D", 2, 3, (5,), 2, 2, {}),
    ("LC2D", 2, 2, (4, 3), 3, 2, {}),
    ("LC2D", 1, 4, (5, 5), 4, 3, {"stride": 2, "pad": 1, "group": 2}),
    ("LC", 1, 2, (6, 5), 2, 2, {"dilation": 2}),
    ("LC3D", 1, 2, (3, 3, 3), 2, 2, {}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_nchw(case, bias, device):
    op_type, n, c, spatial, m, kernel, extra = case
    x, w, b = make(n, c, spatial, m, kernel, bias=bias, **extra)
    inputs = [x, w] + ([b] if bias else [])
    got = run_op(op_type, inputs, device=device, kernel=kernel, **extra) if op_type != "LC1D" else \
        run_op(op_type, inputs, device=device, kernels=[kernel], **extra)
    np.testing.assert_allclose(got, lc_ref(x, w, b, **extra), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_nhwc(device):
    x, w, b = make(2, 3, (4, 5), 2, 2)
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    w_nhwc = np.ascontiguousarray(np.moveaxis(w, 3, -1))          # YH, YW, M, kH, kW, C
    got = run_op("LC2D", [x_nhwc, w_nhwc, b], device=device, kernel=2, order="NHWC")
    np.testing.assert_allclose(got, lc_ref(x, w, b).transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_match_finite_differences(case, bias):
    op_type, n, c, spatial, m, kernel, extra = case
    x, w, b = make(n, c, spatial, m, kernel, bias=bias, dtype=np.float64, **extra)
    check_gradient(op_type, [x, w] + ([b] if bias else []), kernel=kernel, **extra)


def test_gradient_nhwc_and_without_input_gradient():
    x, w, b = make(1, 2, (3, 4), 2, 2, dtype=np.float64)
    check_gradient("LC2D", [x.transpose(0, 2, 3, 1), np.moveaxis(w, 3, -1), b], kernel=2, order="NHWC")
    check_gradient("LC2D", [x, w], wrt=[1], kernel=2, no_gradient_to_input=True)


def test_the_maker_emits_caffe2s_gradient_ops():
    def sig(inputs, **args):
        ops, _ = backward_ops([make_op("LC2D", inputs, ["y"], kernel=2, **args)], {"y": "y_grad"})
        (g,) = ops
        return g.type, list(g.input), list(g.output), argument_value([a for a in g.arg if a.name == "no_bias"][0]) \
            if any(a.name == "no_bias" for a in g.arg) else None
    assert sig(["x", "w", "b"]) == ("LC2DGradient", ["x", "w", "y_grad"], ["w_grad", "b_grad", "x_grad"], None)
    assert sig(["x", "w"]) == ("LC2DGradient", ["x", "w", "y_grad"], ["w_grad", "x_grad"], 1)
    assert sig(["x", "w"], no_gradient_to_input=1)[2] == ["w_grad"]


def test_bad_inputs_and_static_shapes():
    x, w, b = make(1, 2, (4, 4), 3, 2)
    with pytest.raises(ShapeError, match="one filter per output position"):
        run_op("LC2D", [x, w[:2], b], kernel=2)
    with pytest.raises(ShapeError, match="bias must have shape"):
        run_op("LC2D", [x, w, b[..., :2]], kernel=2)
    with pytest.raises(ShapeError, match="input has 1 channels"):
        run_op("LC2D", [x[:, :1], w, b], kernel=2)
    with pytest.raises(ShapeError, match="kernel arguments say"):
        run_op("LC2D", [x, w, b], kernel=3)
    with pytest.raises(ArgumentError, match="NHWC supports 2-D images without groups"):
        run_op("LC1D", [np.ones((1, 4, 2), np.float32), np.ones((3, 1, 2, 2), np.float32)], order="NHWC")
    assert infer_static("LC2D", [x, w, b], kernel=2)[0].shape == (1, 3, 3, 3)


def test_broken_kernels_are_caught(broken):
    x, w, b = make(1, 2, (3, 3), 2, 2, dtype=np.float64)
    broken("LC2DGradient", lambda ctx, xp, X, W, dY, **a: (W * 0, xp.zeros((2, 2, 2)), X * 0))
    with pytest.raises(AssertionError, match="LC2D: gradient of input"):
        check_gradient("LC2D", [x, w, b], kernel=2)
    broken("LC2D", lambda xp, X, W, B, **a: xp.zeros((1, 2, 2, 2)))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(run_op("LC2D", [x, w, b], kernel=2), lc_ref(x, w, b))
