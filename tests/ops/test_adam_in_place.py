"""Adam written into its inputs (the op's outputs are param, moment_1 and moment_2 themselves, as Caffe2's optimizer
builders make it: the record's inplace_kernel) and Adam by numba's one pass (kernels/jitted.py adam, the `fast`
extra; Workspace.fused_cells): every way gives the same bits, those of the op's float32 operations one rounding
each in the order written out below with numpy (Caffe2's adam_compute rounds the same operations, but multiplies
lr·correction into the numerator first), special values included; in place means no new arrays; inputs that share
memory, are read-only or are laid out otherwise take copies; and a kernel with another rounding is caught. (Against
the float64 definition over several steps: test_optim.py.)"""
import importlib.util

import numpy as np
import pytest

from stepnet import NetDef
from stepnet.ops.optim import adam_correction
from stepnet.runtime.workspace import Workspace
from stepnet.testing import make_op

F = np.float32
NEEDS_NUMBA = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="numba (the fast extra, in the test extra) is not installed")
B1, B2, EPS, LR = 0.9, 0.999, 1e-5, -2e-3
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|overflow) encountered:RuntimeWarning")  # the specials


def in_order(w, m1, m2, g, lr, it):
    """The float32 operations, one rounding each: nm = m1·β1 + g·(1−β1), nv = v·β2 + g²·(1−β2),
    eg = (nm/(√nv + ε))·c with c = √(1−β2^t)/(1−β1^t) in double, then float; w + eg·lr."""
    b1, b2, one = F(B1), F(B2), F(1)
    nm = m1 * b1 + g * (one - b1)
    nv = m2 * b2 + (g * g) * (one - b2)
    with np.errstate(invalid="ignore"):
        eg = (nm / (np.sqrt(nv) + F(EPS))) * F(adam_correction(B1, B2, it))
    return w + eg * F(lr), nm, nv, eg


def state(n=4099, seed=0):
    """param, moment_1, moment_2, grad: random values of several magnitudes, with NaN, ±inf, ±0, subnormals and
    a negative second moment (√ of it is NaN) among them."""
    rng = np.random.default_rng(seed)
    w, m1, m2, g = (rng.standard_normal(n).astype(F) * F(10.0) ** rng.integers(-6, 6, n).astype(F)
                    for _ in range(4))
    m2 = np.abs(m2)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3e-39, 3e38], F)
    for k, a in enumerate((w, m1, m2, g)):
        a[10 * k:10 * k + len(special)] = special
    m2[50] = -1.0
    return w, m1, m2, g


def train_net(outputs):
    net = NetDef(name="adam")
    net.op.append(make_op("Adam", ["w", "m1", "m2", "g", "lr", "it"], outputs, beta1=B1, beta2=B2, epsilon=EPS))
    return net


def run(fused, outputs=("w", "m1", "m2"), steps=3, shapes=((4099,),) * 4, feeds=None):
    """Adam over `steps` iterations in a created net (fed once, then run in place as a training net runs);
    (the values after each step, whether each state blob kept its array)."""
    ws = Workspace(fused_cells=fused)
    arrays = [a.reshape(s) for a, s in zip(state(), shapes)]
    for name, value in zip(("w", "m1", "m2", "g"), arrays):
        ws.feed(name, value)
    ws.feed("lr", np.array([LR], F))
    for name, value in (feeds or {}).items():
        ws.feed(name, value)
    ws.feed("it", np.array([0], np.int64))
    held = {name: ws.get_blob(name).value for name in ("w", "m1", "m2")}
    net = ws.create_net(train_net(list(outputs)))
    values = []
    for it in range(steps):
        ws.feed("it", np.array([it], np.int64))
        net.run()
        values.append([ws.get_blob(name).value.copy() for name in outputs])
    return values, {name: ws.get_blob(name).value is array for name, array in held.items()}


def expected(outputs=("w", "m1", "m2"), steps=3):
    w, m1, m2, g = state()
    values = []
    for it in range(steps):
        nw, nm, nv, eg = in_order(w, m1, m2, g, LR, it)
        named = {"w": nw, "m1": nm, "m2": nv, "w2": nw, "m1b": nm, "m2b": nv, "eg": eg}
        values.append([named[name] for name in outputs])
        if outputs[0] == "w":
            w, m1, m2 = nw, nm, nv
    return values


def assert_bits(got, want):
    """Bit for bit (±0 told apart), NaN where NaN."""
    for step, (g_step, w_step) in enumerate(zip(got, want)):
        for k, (a, b) in enumerate(zip(g_step, w_step)):
            a, b = a.reshape(-1), b.reshape(-1)
            nan = np.isnan(b)
            same = (a.view(np.int32) == b.view(np.int32)) | (nan & np.isnan(a))
            assert a.dtype == F and same.all(), f"step {step}, output {k}: {np.count_nonzero(~same)} elements differ"


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=NEEDS_NUMBA)])
def test_in_place_gives_the_same_bits_into_the_same_arrays(fused):
    got, kept = run(fused)
    assert_bits(got, expected())
    assert kept == {"w": True, "m1": True, "m2": True}      # no new arrays: the op wrote into its inputs


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=NEEDS_NUMBA)])
def test_into_other_blobs_and_the_effective_gradient(fused):
    # outputs that are other blobs (inputs unchanged), and a fourth output: the kernel that makes new arrays
    outputs = ("w2", "m1b", "m2b", "eg")
    got, kept = run(fused, outputs, steps=1)
    assert_bits(got, expected(outputs, steps=1))
    got_in_place, _ = run(fused, ("w", "m1", "m2", "eg"), steps=2)
    assert_bits(got_in_place, expected(("w", "m1", "m2", "eg"), steps=2))


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=NEEDS_NUMBA)])
def test_inputs_that_share_memory_or_are_laid_out_otherwise_take_copies(fused):
    w, m1, m2, g = state()
    # the gradient an Alias of the parameter (one array): every value read before any is written, as Caffe2's loop
    ws = Workspace(fused_cells=fused)
    for name, value in (("w", w), ("m1", m1), ("m2", m2), ("lr", np.array([LR], F)), ("it", np.array([0]))):
        ws.feed(name, value)
    net = train_net(["w", "m1", "m2"])
    net.op.insert(0, make_op("Alias", ["w"], ["g"]))
    ws.run_net_once(net)
    assert_bits([[ws.get_blob(n).value for n in ("w", "m1", "m2")]], [in_order(w, m1, m2, w, LR, 0)[:3]])
    # a transposed (not C-contiguous) parameter and a read-only moment: new arrays, the same bits
    ws = Workspace(fused_cells=fused)
    wt = w[:4096].reshape(64, 64).T
    for name, value in (("w", wt), ("m1", m1[:4096]), ("m2", m2[:4096]), ("g", g[:4096]),
                        ("lr", np.array([LR], F)), ("it", np.array([0]))):
        ws.feed(name, value)
    ws.get_blob("m1").value.flags.writeable = False
    ws.run_net_once(train_net(["w", "m1", "m2"]))
    want = in_order(wt.reshape(-1), m1[:4096], m2[:4096], g[:4096], LR, 0)[:3]
    got = [ws.get_blob(n).value for n in ("w", "m1", "m2")]
    assert got[0].shape == (64, 64)
    assert_bits([got], [want])


@NEEDS_NUMBA
def test_other_dtypes_are_left_to_numpy():
    # float64 (and anything but float32 host arrays) takes numpy's operations, in place as well
    w, m1, m2, g = (a.astype(np.float64) for a in state())
    ws = Workspace(fused_cells=True)
    for name, value in (("w", w), ("m1", m1), ("m2", m2), ("g", g), ("lr", np.array([LR])), ("it", np.array([4]))):
        ws.feed(name, value)
    held = ws.get_blob("w").value
    ws.run_net_once(train_net(["w", "m1", "m2"]))
    b1, b2, eps = (np.float64(F(v)) for v in (B1, B2, EPS))      # (the arguments a NetDef carries: float32)
    nm = m1 * b1 + g * (1 - b1)
    nv = m2 * b2 + (g * g) * (1 - b2)
    with np.errstate(invalid="ignore"):
        want = w + (nm / (np.sqrt(nv) + eps)) * adam_correction(B1, B2, 4) * LR
    np.testing.assert_array_equal(ws.get_blob("w").value, want)
    assert ws.get_blob("w").value is held


@NEEDS_NUMBA
def test_a_kernel_with_another_rounding_is_caught(monkeypatch):
    # the fused pass with its second moment's sum reassociated (one rounding less) must fail the bits test
    from stepnet.kernels import jit
    from numba import float32, njit

    @njit
    def reassociated(w, g, m1, m2, lr, corr, b1, b2, eps, eg, keep):
        c1, c2 = float32(1) - b1, float32(1) - b2
        for i in range(w.size):
            gi = g[i]
            a = m1[i] * b1 + gi * c1
            b = gi * (gi * c2) + m2[i] * b2
            s = (a / (np.sqrt(b) + eps)) * corr
            if keep:
                eg[i] = s
            m1[i], m2[i], w[i] = a, b, w[i] + s * lr

    class Broken:
        adam = staticmethod(reassociated)

    monkeypatch.setattr(jit, "load", lambda: Broken)
    with pytest.raises(AssertionError, match="elements differ"):
        test_in_place_gives_the_same_bits_into_the_same_arrays(True)
