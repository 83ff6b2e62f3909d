"""ConvRelu and RMSNorm (+ RMSNormGradient) (stepnet/ops/composite.py) against loop references written here on
every device (Caffe2's rms_norm_op test reference computes each row the same way), RMSNorm's gradient against
float64 finite differences and derivative loops, what the makers emit, bad inputs, broken kernels caught."""
import math

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import argument_value
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

rng = np.random.default_rng(59)


def ref_conv_relu(x, w, b, pad=0, stride=1, dil=1, group=1):
    """NCHW: y[n, m, i, j] = max(0, b[m] + sum over the group's channels and the window of x * w)."""
    N, C, H, W = x.shape
    M, Cg, kh, kw = w.shape
    Ho = (H + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    Wo = (W + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    y = np.zeros((N, M, Ho, Wo))
    for n, m, i, j in np.ndindex(N, M, Ho, Wo):
        g = m // (M // group)
        acc = [0.0 if b is None else float(b[m])]
        for c, p, q in np.ndindex(Cg, kh, kw):
            r, t = i * stride - pad + p * dil, j * stride - pad + q * dil
            if 0 <= r < H and 0 <= t < W:
                acc.append(float(x[n, g * Cg + c, r, t]) * float(w[m, c, p, q]))
        y[n, m, i, j] = max(0.0, math.fsum(acc))
    return y.astype(x.dtype)


def ref_rms(x, gamma, beta, axis=1, eps=0.0):
    """Rows of x flattened at `axis`: rrms = 1 / sqrt(mean(row^2) + eps); y = row * rrms * gamma + beta."""
    axis %= x.ndim
    rows = x.reshape(math.prod(x.shape[:axis]), -1).astype(np.float64)
    g, b = gamma.ravel().astype(np.float64), beta.ravel().astype(np.float64)
    y, r = np.zeros(rows.shape), np.zeros(len(rows))
    for i, row in enumerate(rows):
        r[i] = 1 / math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
        y[i] = [row[k] * r[i] * g[k] + b[k] for k in range(len(row))]
    return [y.reshape(x.shape).astype(x.dtype), r.reshape(x.shape[:axis]).astype(x.dtype)]


def ref_rms_grad(dy, x, gamma, rrms, axis=1):
    """By the chain rule per row: dx_k = r g_k dy_k - (r^3 / N) x_k sum_j dy_j x_j g_j; dgamma, dbeta summed."""
    axis %= x.ndim
    rows = math.prod(x.shape[:axis])
    d2, x2 = dy.reshape(rows, -1).astype(float), x.reshape(rows, -1).astype(float)
    g, r = gamma.ravel().astype(float), rrms.ravel().astype(float)
    n = x2.shape[1]
    dx = np.zeros(x2.shape)
    for i in range(rows):
        s = math.fsum(d2[i, j] * x2[i, j] * g[j] for j in range(n))
        dx[i] = [r[i] * g[k] * d2[i, k] - r[i] ** 3 / n * x2[i, k] * s for k in range(n)]
    dgamma = [math.fsum(d2[i, k] * x2[i, k] * r[i] for i in range(rows)) for k in range(n)]
    dbeta = [math.fsum(d2[i, k] for i in range(rows)) for k in range(n)]
    return [dx.reshape(x.shape).astype(dy.dtype), np.array(dgamma, gamma.dtype).reshape(gamma.shape),
            np.array(dbeta, gamma.dtype).reshape(gamma.shape)]


X = rng.uniform(-3, 3, (2, 4, 5, 5)).astype(np.float32)
W = rng.uniform(-1, 1, (6, 2, 3, 3)).astype(np.float32)
B = rng.uniform(-1, 1, 6).astype(np.float32)
R = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
R3 = rng.uniform(-2, 2, (2, 3, 4))
G, BETA = rng.uniform(0.5, 2, 4).astype(np.float32), rng.uniform(-1, 1, 4).astype(np.float32)
G12, B12 = rng.uniform(0.5, 2, (3, 4)), rng.uniform(-1, 1, (3, 4))
DY = rng.standard_normal((3, 4)).astype(np.float32)

CASES = [   # (id, op, inputs, args, expected outputs, tolerance)
    ("conv_relu", "ConvRelu", [X, W, B], {"kernel": 3, "pad": 1, "group": 2}, [ref_conv_relu(X, W, B, 1, group=2)],
     1e-5),
    ("conv_relu_stride_dilation", "ConvRelu", [X, W[:, :2].repeat(2, 1)[:, :4], B],
     {"kernel": 3, "stride": 2, "dilation": 2, "pad": 2},
     [ref_conv_relu(X, W[:, :2].repeat(2, 1)[:, :4], B, 2, 2, 2)], 1e-5),
    ("conv_relu_no_bias", "ConvRelu", [X[:, :2], W], {"kernel": 3}, [ref_conv_relu(X[:, :2], W, None)], 1e-5),
    ("rms", "RMSNorm", [R, G, BETA], {"eps": 0.5}, ref_rms(R, G, BETA, eps=0.5), 1e-5),
    ("rms_axis2_double", "RMSNorm", [R3, G12.ravel(), B12.ravel()], {"axis": 1},
     ref_rms(R3, G12, B12), 1e-12),
    ("rms_last_axis", "RMSNorm", [R3, G.astype(np.float64), BETA.astype(np.float64)], {"axis": -1, "eps": 1e-3},
     ref_rms(R3, G.astype(np.float64), BETA.astype(np.float64), -1, float(np.float32(1e-3))), 1e-12),  # a float arg
    ("rms_grad", "RMSNormGradient", [DY, R, G, ref_rms(R, G, BETA)[1]], {},
     ref_rms_grad(DY, R, G, ref_rms(R, G, BETA)[1]), 1e-5),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want, tol = case
    check(op_type, inputs, args, want, device, tol)


def test_rms_norm_matches_glows_numbers():
    """Glow's rmsNorm test ("results are based on Caffe2 implementation"): x 1..12 as 3 x 4, gamma = beta =
    1..4, eps 1."""
    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    g = np.arange(1, 5, dtype=np.float32)
    y, _ = run_op("RMSNorm", [x, g, g], 2, eps=1.0)
    np.testing.assert_allclose(y, [[1.3429972, 3.3719888, 6.0869746, 9.487955],
                                   [1.7495317, 3.798876, 6.148033, 8.797003],
                                   [1.8485281, 3.8856182, 6.11127, 8.525484]], atol=1e-5)


# --------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x, gamma, beta, args", [
    (rng.uniform(-2, 2, (3, 4)), rng.uniform(0.5, 2, 4), rng.uniform(-1, 1, 4), {"eps": 0.1}),
    (rng.uniform(-2, 2, (2, 3, 2)), rng.uniform(0.5, 2, (3, 2)), rng.uniform(-1, 1, (3, 2)), {"axis": 1}),
    (rng.uniform(-2, 2, (2, 3, 2)), rng.uniform(0.5, 2, 2), rng.uniform(-1, 1, 2), {"axis": 2, "eps": 1.0}),
])
def test_rms_norm_gradient_matches_finite_differences(x, gamma, beta, args, device):
    eps = args.pop("eps", 0.0)
    check_gradient("RMSNorm", [x, gamma, beta], 2, outputs_with_grads=[0], device=device, op_args={"eps": eps},
                   **args)


def test_makers():
    ops, grads = backward_ops([make_op("RMSNorm", ["x", "g", "b"], ["y", "r"], eps=0.5)], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops] == \
        [("RMSNormGradient", ["y_grad", "x", "g", "r"], ["x_grad", "g_grad", "b_grad"], {"eps": 0.5})]
    assert REGISTRY.get("ConvRelu").gradient is None          # Caffe2 registers none
    assert set(REGISTRY.get("ConvRelu").args) == set(REGISTRY.get("Conv").args)


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("ConvRelu", [X, np.zeros((6, 3, 3, 3), np.float32), B], {"kernel": 3, "group": 2}, ShapeError,
     "the input has 4 channels"),
    ("ConvRelu", [X.astype(np.int32), W, B], {"kernel": 3, "group": 2}, DTypeError, "floating-point"),
    ("ConvRelu", [X, W, B], {"kernel": 3, "group": 2, "order": "NCWH"}, ArgumentError, "order"),
    ("RMSNorm", [R[0], G, BETA], {}, ShapeError, "at least 2 dimensions"),
    ("RMSNorm", [R, G[:3], BETA], {}, ShapeError, r"gamma has shape \(3,\) .* 4 values per row"),
    ("RMSNorm", [R, G, BETA[:2]], {}, ShapeError, r"beta has shape \(2,\)"),
    ("RMSNorm", [R, G.astype(np.float64), BETA], {}, DTypeError, "one dtype"),
    ("RMSNorm", [R, G, BETA], {"axis": 2}, ArgumentError, "axis=2 is out of range"),
    ("RMSNormGradient", [DY[:2], R, G, ref_rms(R, G, BETA)[1]], {}, ShapeError, r"dY \(2, 4\) must match X"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, match, device):
    outputs = {"ConvRelu": 1, "RMSNorm": 2, "RMSNormGradient": 3}[op_type]
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, outputs, device=device, **args)


@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, args, error, match):
    outputs = {"ConvRelu": 1, "RMSNorm": 2, "RMSNormGradient": 3}[op_type]
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs, outputs, **args)


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id, wrong", [   # wrong(good kernel, xp, *inputs, **args)
    ("conv_relu", lambda good, xp, *ins, **a: REGISTRY.get("Conv").kernel(xp, *ins, **a)),     # no Relu
    ("rms", lambda good, xp, x, g, b, **a: good(xp, x, g, b, **{**a, "eps": 0.0})),            # eps dropped
    ("rms_grad", lambda good, xp, *ins, **a: tuple(t * 1.01 for t in good(xp, *ins, **a))),
])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want, tol = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu", tol)
    good = REGISTRY.get(op_type).kernel
    broken(op_type, lambda *a, **kw: wrong(good, *a, **kw))
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu", tol)


def test_check_gradient_catches_a_broken_rms_norm_gradient(broken):
    inputs = [rng.uniform(-2, 2, (3, 4)), rng.uniform(0.5, 2, 4), rng.uniform(-1, 1, 4)]
    check_gradient("RMSNorm", inputs, 2, outputs_with_grads=[0])
    good = REGISTRY.get("RMSNormGradient").kernel
    broken("RMSNormGradient",                                         # dX without the term through rrms
           lambda xp, dy, x, g, r, **a: (dy * g * r.reshape(-1, 1),) + good(xp, dy, x, g, r, **a)[1:])
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("RMSNorm", inputs, 2, outputs_with_grads=[0])
