"""Sigmoid with the fused pass (stepnet/kernels/jitted.py sigmoid, numba, the `fast` extra; Workspace.fused_cells):
against the float64 definition over the whole float32 range and into the subnormals, NaN, ±inf and ±0 as numpy's
kernel gives them, any shape, layout or in place, other dtypes left to numpy, the compiled form giving the
interpreted kernel's bits, and a broken kernel caught."""
import importlib.util

import numpy as np
import pytest

from stepnet import NetDef
from stepnet.runtime.workspace import Workspace
from stepnet.testing import make_op, run_op

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba (the fast extra, in the test extra) is not installed")
F = np.float32
TINY = np.finfo(F).tiny     # the smallest normal float32


def fused(x):
    return run_op("Sigmoid", [x], ws=Workspace(fused_cells=True))


def plain(x):
    return run_op("Sigmoid", [x], ws=Workspace(fused_cells=False))


def definition(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x.astype(np.float64)))


def test_against_the_definition_over_the_whole_range():
    """Relative error at most 4e-7 wherever the result is a normal float (the exp polynomial's 3e-7 and the
    division's rounding; numpy's own kernel is within 2.6e-7), and within a subnormal step below that."""
    x = np.concatenate([np.linspace(-110, 110, 400_001), np.random.default_rng(0).standard_normal(100_000) * 8])
    x = x.astype(F)
    got, want = fused(x).astype(np.float64), definition(x)
    normal = want >= TINY
    assert (np.abs(got - want) / want)[normal].max() <= 4e-7
    assert (np.abs(got - want) <= 4e-7 * want + 2.0 ** -149)[~normal].all()
    np.testing.assert_allclose(got, plain(x), rtol=6e-7, atol=2.0 ** -149)


@pytest.mark.parametrize("value, want", [(np.nan, np.nan), (np.inf, 1.0), (-np.inf, 0.0), (0.0, 0.5), (-0.0, 0.5),
                                         (3e38, 1.0), (-3e38, 0.0), (-104.0, 0.0), (104.0, 1.0)])
def test_special_values_as_numpy_gives_them(value, want):
    x = np.array([value, 1.5, -2.0], F)
    got, ref = fused(x), plain(x)
    np.testing.assert_array_equal(got[:1], [want])
    np.testing.assert_array_equal(got[:1], ref[:1])


@pytest.mark.parametrize("make", [lambda: np.array(-3.25, F), lambda: np.zeros((0, 4), F),
                                  lambda: np.arange(-12, 12, dtype=F).reshape(4, 6).T,       # a transposed view
                                  lambda: np.linspace(-9, 9, 2 * 3 * 41, dtype=F).reshape(2, 3, 41)])
def test_any_shape_and_layout(make):
    x = make()
    got = fused(x)
    assert got.shape == x.shape and got.dtype == F
    np.testing.assert_allclose(got, definition(x), rtol=4e-7, atol=0)


def test_float64_and_float16_take_the_numpy_kernel():
    rng = np.random.default_rng(2)
    for x in (rng.standard_normal((6, 9)), rng.standard_normal((6, 9)).astype(np.float16)):
        np.testing.assert_array_equal(fused(x), plain(x))


@pytest.mark.parametrize("in_place", [False, True])
def test_compiled_runs_give_the_interpreted_bits(in_place):
    """A net of Sigmoid (also in place) run several times compiled and op by op, fused both ways: the same bits."""
    out = "x" if in_place else "y"
    net = NetDef(name="sig", op=[make_op("Scale", ["a"], ["x"], scale=1.0), make_op("Sigmoid", ["x"], [out])])
    a = (np.random.default_rng(3).standard_normal((32, 128)) * 6).astype(F)
    got = []
    for compiled in (True, False):
        ws = Workspace(fused_cells=True, compile_steps=compiled)
        ws.feed("a", a)
        bound = ws.create_net(net)
        for _ in range(4):
            bound.run()
        got.append(ws.fetch(out))
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[0], definition(a), rtol=4e-7, atol=0)


def test_a_broken_kernel_is_caught(monkeypatch):
    from stepnet.kernels import jit as fused_module

    real = fused_module.load()

    def sigmoid(x, out, y, bits):                                    # sigmoid of 2x: a wrong kernel
        real.sigmoid(2 * x, out, y, bits)
    monkeypatch.setattr(fused_module, "load", lambda: type("Broken", (), {"sigmoid": staticmethod(sigmoid)}))
    x = np.random.default_rng(4).standard_normal(50).astype(F)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(fused(x), definition(x), rtol=4e-7, atol=0)
