"""CosineEmbeddingCriterion, MarginRankingCriterion and BernoulliJSD (stepnet/ops/criterion.py) against
per-element references written here from Caffe2's docs (Python's math module), on every device; gradients
against float64 finite differences (away from the kinks) and the gradient ops against hand-derived
derivatives; bad inputs; broken kernels caught."""
import math

import numpy as np
import pytest

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.testing import DEVICES, check_gradient, run_op

rng = np.random.default_rng(23)


def per_element(fn, *arrays):
    return np.array([fn(*vals) for vals in zip(*(a.ravel().tolist() for a in arrays), strict=True)]).reshape(
        arrays[0].shape)


def entropy(p):
    return 0.0 if p < 1e-20 or 1 - p < 1e-20 else -p * math.log(p) - (1 - p) * math.log(1 - p)


def jsd(p, q):
    return entropy((p + q) / 2) - (entropy(p) + entropy(q)) / 2


def d_jsd(p, q):
    """d/dp of jsd(p, q): (logit(p) - logit((p + q) / 2)) / 2."""
    logit = lambda v: math.log(v / (1 - v))  # noqa: E731
    return (logit(p) - logit((p + q) / 2)) / 2


S = np.array([-0.9, -0.2, 0.05, 0.3, 0.8, 0.45], np.float32)
LABEL = np.array([1, -1, -1, 1, -1, -1], np.int32)
X1 = rng.standard_normal(6).astype(np.float32)
X2 = rng.standard_normal(6).astype(np.float32)
P, Q = rng.uniform(0.05, 0.95, (2, 3)), rng.uniform(0.05, 0.95, (2, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_forward_against_references(device):
    got = run_op("CosineEmbeddingCriterion", [S, LABEL], device=device, margin=0.1)
    want = per_element(lambda s, y: 1 - s if y == 1 else max(0.0, s - 0.1), S, LABEL)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    got = run_op("MarginRankingCriterion", [X1, X2, LABEL], device=device)
    want = per_element(lambda a, b, y: max(0.0, -y * (a - b) + 1.0), X1, X2, LABEL)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    got = run_op("BernoulliJSD", [P, Q], device=device)
    np.testing.assert_allclose(got, per_element(jsd, P, Q), rtol=1e-12)
    edge = np.array([0.0, 1.0, 0.5, 1e-30])
    np.testing.assert_allclose(run_op("BernoulliJSD", [edge, edge[::-1].copy()]),
                               per_element(jsd, edge, edge[::-1].copy()), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_ops_against_derivatives(device):
    d = rng.standard_normal(6).astype(np.float32)
    got = run_op("CosineEmbeddingCriterionGradient", [S, LABEL, d], device=device, margin=0.1)
    np.testing.assert_allclose(got, per_element(lambda s, y, g: -g if y == 1 else (g if s >= 0.1 else 0.0),
                                                S, LABEL, d), rtol=1e-6)
    dx1, dx2 = run_op("MarginRankingCriterionGradient", [X1, X2, LABEL, d], 2, device=device, margin=0.5)
    active = per_element(lambda a, b, y: float(-y * (a - b) + 0.5 >= 0), X1, X2, LABEL)
    np.testing.assert_allclose(dx1, -LABEL * d * active, rtol=1e-6)
    np.testing.assert_allclose(dx2, LABEL * d * active, rtol=1e-6)
    g = rng.standard_normal((2, 3))
    np.testing.assert_allclose(run_op("BernoulliJSDGradient", [g, P, Q], device=device),
                               g * per_element(d_jsd, P, Q), rtol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_finite_differences(device):
    check_gradient("CosineEmbeddingCriterion", [S, LABEL], device=device, margin=0.1)
    check_gradient("MarginRankingCriterion", [X1, X2, LABEL], device=device, margin=0.3)
    check_gradient("BernoulliJSD", [P, Q], wrt=[0], device=device)


def test_bad_inputs():
    with pytest.raises(DTypeError, match="label must be int32"):
        run_op("CosineEmbeddingCriterion", [S, LABEL.astype(np.float32)])
    with pytest.raises(ShapeError, match="as many elements"):
        run_op("MarginRankingCriterion", [X1, X2[:4], LABEL])
    with pytest.raises(ShapeError, match="as many elements"):
        run_op("BernoulliJSD", [P, Q[:1]])


def test_check_gradient_catches_broken_gradient_kernels(broken):
    broken("MarginRankingCriterionGradient", lambda xp, a, b, y, d, **k: (d * 0, d * 0))
    with pytest.raises(AssertionError, match="MarginRankingCriterion: gradient of input"):
        check_gradient("MarginRankingCriterion", [X1, X2, LABEL], margin=0.3)
    broken("BernoulliJSD", lambda xp, x, t: x * 0)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(run_op("BernoulliJSD", [P, Q]), per_element(jsd, P, Q), rtol=1e-12)
