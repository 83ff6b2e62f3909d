"""Softmax and SoftmaxGradient with the fused row kernels (stepnet/kernels/jitted.py, numba, the `fast`
extra; Workspace.fused_cells): against float64 definitions at row lengths that do and do not fill vectors, NaN and
±inf as numpy's kernel gives them, results in the subnormals, other dtypes left to numpy, a broken kernel caught."""
import importlib.util

import numpy as np
import pytest

from stepnet.testing import run_op
from stepnet.runtime.workspace import Workspace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba (the fast extra, in the test extra) is not installed")
F = np.float32


def fused(op_type, inputs, **args):
    return run_op(op_type, inputs, ws=Workspace(fused_cells=True), **args)


def plain(op_type, inputs, **args):
    return run_op(op_type, inputs, ws=Workspace(fused_cells=False), **args)


def ref_softmax(x2):
    """Softmax of each row by its definition, in float64."""
    x = x2.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("shape, axis", [((1, 65), 1), ((800, 65), 1), ((25, 32, 65), 2), ((3, 4, 5), 1),
                                         ((7, 1), 1), ((2, 17), 1), ((4, 256), -1)])
def test_softmax_against_the_definition(shape, axis):
    x = (np.random.default_rng(len(shape) * 31 + shape[-1]).standard_normal(shape) * 4).astype(F)
    got = fused("Softmax", [x], axis=axis)
    m = int(np.prod(shape[:axis % len(shape)]))
    want = ref_softmax(x.reshape(m, -1)).reshape(shape)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)
    np.testing.assert_allclose(got, plain("Softmax", [x], axis=axis), rtol=3e-6, atol=0)


def test_exp_over_its_whole_range_and_into_the_subnormals():
    z = np.linspace(-110, 0, 200_001).astype(F)
    x = np.stack([np.zeros_like(z), z], axis=1)          # row [0, z]: softmax = [1, e^z] / (1 + e^z)
    got = fused("Softmax", [x])[:, 1].astype(np.float64)
    want = ref_softmax(x)[:, 1]
    normal = want > np.finfo(F).tiny
    assert (np.abs(got - want) / want)[normal].max() <= 4e-7
    bound = 4e-7 * want + 2.0 ** -149                                # plus a subnormal step below 2^-126
    assert (np.abs(got - want) <= bound)[~normal].all()


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, -0.0, 3e38])
def test_special_values_as_numpy_gives_them(value):
    x = (np.random.default_rng(1).standard_normal((3, 33)) * 2).astype(F)
    x[1, 7] = value
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(fused("Softmax", [x]), plain("Softmax", [x]), rtol=3e-6, atol=0)


def test_rows_of_minus_infinity_and_of_spread_beyond_the_float_range():
    x = np.array([[-np.inf] * 5, [3e38, -3e38, 0, -3e38, 1]], F)
    with np.errstate(all="ignore"):
        got, want = fused("Softmax", [x]), plain("Softmax", [x])
    assert np.isnan(got[0]).all() and np.isnan(want[0]).all()
    np.testing.assert_array_equal(got[1], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(want[1], [1, 0, 0, 0, 0])


@pytest.mark.parametrize("op_type, n", [("Softmax", 1), ("SoftmaxGradient", 2)])
def test_float64_and_empty_inputs_take_the_numpy_kernel(op_type, n):
    rng = np.random.default_rng(2)
    x = [rng.standard_normal((6, 9)) for _ in range(n)]
    np.testing.assert_array_equal(fused(op_type, x), plain(op_type, x))
    empty = [np.zeros((0, 9), F)] * n
    assert fused(op_type, empty).shape == (0, 9)


@pytest.mark.parametrize("shape", [(1, 65), (800, 65), (5, 3, 19)])
def test_softmax_gradient_against_the_definition(shape):
    rng = np.random.default_rng(shape[-1])
    y = ref_softmax(rng.standard_normal((int(np.prod(shape[:-1])), shape[-1]))).reshape(shape).astype(F)
    dy = rng.standard_normal(shape).astype(F)
    got = fused("SoftmaxGradient", [y, dy], axis=len(shape) - 1)
    y64, dy64 = y.astype(np.float64), dy.astype(np.float64)
    want = y64 * (dy64 - (dy64 * y64).sum(axis=-1, keepdims=True))   # the Jacobian-vector product, row by row
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_broken_kernel_is_caught(monkeypatch):
    from stepnet.kernels import jit as fused_module

    real = fused_module.load()

    def softmax_rows(x, out):                                        # rows shifted by one: a wrong kernel
        real.softmax_rows(np.roll(x, 1, axis=1), out)
    monkeypatch.setattr(fused_module, "load", lambda: type("Broken", (), {"softmax_rows": staticmethod(
        softmax_rows)}))
    x = np.random.default_rng(3).standard_normal((4, 10)).astype(F)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(fused("Softmax", [x]), ref_softmax(x), rtol=2e-6, atol=0)


def test_the_specialization_belongs_to_the_fused_kernel(patched):
    """Softmax's fused kernel carries its own once-per-signature specialization; a fused kernel put in its place
    (without one) is called as it is, not bypassed by the old specialization."""
    x = np.random.default_rng(4).standard_normal((6, 11)).astype(F)
    ws = Workspace(fused_cells=True)
    np.testing.assert_allclose(run_op("Softmax", [x], ws=ws), ref_softmax(x), rtol=2e-6, atol=0)
    patched("Softmax", fused_kernel=lambda xp, X, axis=1: np.zeros_like(X))
    np.testing.assert_array_equal(run_op("Softmax", [x], ws=Workspace(fused_cells=True)), np.zeros_like(x))
