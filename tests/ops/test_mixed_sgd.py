"""FP16MomentumSGDUpdate and FP32MomentumSGDUpdate against momentum SGD with weight decay written out element by
element (float64, then each multiply-add rounded once to the arithmetic's type, as Caffe2's fused kernels do),
against the float64 formula within the type's precision, and the ops' checks."""
import numpy as np
import pytest
from optim_steps import lr_blob, run_steps

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.testing import DEVICES, make_op, run_op

RNG = np.random.default_rng(9)


def ref(g, m, w, lr, mu, wd, nesterov, dt):
    """(grad', moment', param') element by element; `dt` is the arithmetic's type (rounding after each fused
    multiply-add, the constants rounded to it first)."""
    r = lambda x: float(dt(x))                 # noqa: E731 - one rounding
    lr, mu, wd = r(lr), r(mu), r(wd)
    out = np.empty((3, g.size))
    for i, (gi, mi, wi) in enumerate(zip(g.ravel().tolist(), m.ravel().tolist(), w.ravel().tolist())):
        gi = r(gi + wd * wi)
        mu_m = r(mu * mi)
        m_new = r(lr * gi + mu_m)
        g_new = r(r(mu * m_new + m_new) - mu_m) if nesterov else m_new
        out[:, i] = g_new, m_new, r(wi - g_new)
    return out


def inputs(dtype, n=7):                        # an odd size: Caffe2's kernels work on pairs
    return [(RNG.standard_normal(n) * s).astype(dtype) for s in (1.0, 0.5, 2.0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("op_type,dtype,args", [
    ("FP16MomentumSGDUpdate", np.float16, {}),
    ("FP16MomentumSGDUpdate", np.float16, {"fp32_update": 1}),
    ("FP32MomentumSGDUpdate", np.float32, {}),
])
def test_steps(device, nesterov, op_type, dtype, args):
    g0, m0, w0 = inputs(dtype)
    grads = [g0, inputs(dtype)[0], inputs(dtype)[0]]
    lr, mu, wd = 0.05, 0.9, 0.01
    out = run_steps(op_type, ["g", "m", "lr", "w"], ["g", "m", "w"], {"m": m0, "w": w0, "lr": lr_blob(lr)},
                    [{"g": g} for g in grads], device, momentum=mu, weight_decay=wd, nesterov=int(nesterov), **args)
    arithmetic = np.float32 if args or dtype == np.float32 else np.float16
    m, w = m0, w0
    for k, g in enumerate(grads):
        want = ref(g, m, w, lr, mu, wd, nesterov, arithmetic).astype(dtype)
        for j, name in enumerate("gmw"):
            got = out[k][name]
            assert got.dtype == dtype, f"{name}: {got.dtype}"
            np.testing.assert_array_equal(got, want[j], err_msg=f"{name}, step {k}")
        m, w = want[1], want[2]


@pytest.mark.parametrize("nesterov", [False, True])
def test_close_to_the_exact_formula(nesterov):
    g, m, w = inputs(np.float16, 64)
    lr, mu, wd = 0.1, 0.5, 0.001
    got = run_op("FP16MomentumSGDUpdate", [g, m, lr_blob(lr), w], 3, momentum=mu, weight_decay=wd,
                 nesterov=int(nesterov))
    G, M, W = (x.astype(np.float64) for x in (g, m, w))
    G = G + wd * W
    m_new = lr * G + mu * M
    g_new = (1 + mu) * m_new - mu * M if nesterov else m_new
    for have, want in zip(got, (g_new, m_new, W - g_new)):
        np.testing.assert_allclose(have.astype(np.float64), want, rtol=5e-3, atol=5e-3)


def test_bad_inputs():
    g, m, w = inputs(np.float32)
    with pytest.raises(DTypeError, match="FP16MomentumSGDUpdate: grad must be float16, got float32"):
        run_op("FP16MomentumSGDUpdate", [g, m, lr_blob(0.1), w], 3)
    with pytest.raises(DTypeError, match="param must be float32, got float16"):
        run_op("FP32MomentumSGDUpdate", [g, m, lr_blob(0.1), w.astype(np.float16)], 3)
    with pytest.raises(ShapeError, match="moment .* as many elements as grad"):
        run_op("FP32MomentumSGDUpdate", [g, m[:3], lr_blob(0.1), w], 3)
    with pytest.raises(ShapeError, match="lr must hold exactly one element"):
        run_op("FP32MomentumSGDUpdate", [g, m, np.ones(2, np.float32), w], 3)


def test_no_gradient_registered():
    for op_type in ("FP16MomentumSGDUpdate", "FP32MomentumSGDUpdate"):
        assert REGISTRY.get(op_type).gradient is None
        with pytest.raises(GradientError, match="no gradient registered"):
            backward_ops([make_op(op_type, ["g", "m", "lr", "w"], ["o0", "o1", "o2"])], ["o2"])


def test_reference_catches_a_broken_kernel(broken):
    def wrong(xp, grad, moment, lr, param, *, momentum, weight_decay, nesterov):   # ignores the weight decay
        m_new = lr.reshape(()) * grad + momentum * moment
        return m_new, m_new, param - m_new

    test_steps("cpu", False, "FP32MomentumSGDUpdate", np.float32, {})
    broken("FP32MomentumSGDUpdate", wrong)
    with pytest.raises(AssertionError):
        test_steps("cpu", False, "FP32MomentumSGDUpdate", np.float32, {})
