"""YellowFin against a float64 transcription of Caffe2's yellowfin_op (momentum step with the previous rate and
momentum, then the moving averages, the curvature window and, from iteration 2 on, the tuned rate and
momentum), over several in-place steps as YellowFinOptimizer runs it; and the op's checks."""
import math

import numpy as np
import pytest
from optim_steps import assert_close, counter, f32, run_steps

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.passes.gradients import GradientError, backward_ops
from stepnet.testing import DEVICES, make_op, run_op

RNG = np.random.default_rng(3)
WIDTH = 4
NAMES = ["w", "m", "lr", "mu", "curv", "g_avg", "g2_avg", "mem"]


class Ref:
    """The op's state in float64 and one step of it."""

    def __init__(self, w, lr, mu, beta, eps, zero_debias, nesterov):
        self.w, self.m = w.astype(np.float64).ravel(), np.zeros(w.size)
        self.lr, self.mu, self.curv, self.mem = lr, mu, [0.0] * WIDTH, [0.0] * 5
        self.g_avg, self.g2_avg = np.zeros(w.size), np.zeros(w.size)
        self.beta, self.eps, self.zero_debias, self.nesterov = beta, eps, zero_debias, nesterov

    def step(self, g, t):
        b, eps = self.beta, self.eps
        g = g.astype(np.float64).ravel()
        deb = 1 / (1 - b ** t) if self.zero_debias else 1.0
        m_new = self.mu * self.m + self.lr * g
        self.w = self.w - ((1 + self.mu) * m_new - self.mu * self.m if self.nesterov else m_new)
        self.m = m_new
        self.g_avg = b * self.g_avg + (1 - b) * g
        self.g2_avg = b * self.g2_avg + (1 - b) * g * g
        norm2 = max(float(g @ g), eps)
        mem = self.mem
        mem[0] = b * mem[0] + (1 - b) * math.sqrt(norm2)
        mem[1] = b * mem[1] + (1 - b) * norm2
        self.curv[(t - 1) % WIDTH] = math.log(norm2)
        window = self.curv[:min(WIDTH, t)]
        mem[2] = b * mem[2] + (1 - b) * min(window)
        mem[3] = b * mem[3] + (1 - b) * max(window)
        h_min, h_max = max(math.exp(mem[2] * deb), eps), max(math.exp(mem[3] * deb), eps)
        g_deb = self.g_avg * deb
        variance = max(mem[1] * deb - float(g_deb @ g_deb), eps)
        mem[4] = b * mem[4] + (1 - b) * mem[0] / mem[1]
        if t > 1:
            p = (mem[4] * deb * h_min) ** 2 / (2 * variance)
            w3 = (-math.sqrt(p * p + 4 / 27 * p ** 3) - p) / 2
            w = math.copysign(abs(w3) ** (1 / 3), w3 if w3 > 0 else -1.0)
            root = w - p / 3 / w + 1
            ratio = math.sqrt(h_max / h_min)
            mu = max(root * root, ((ratio - 1) / (ratio + 1)) ** 2)
            lr = (1 - math.sqrt(mu)) ** 2 / h_min
            self.mu = b * self.mu + (1 - b) * mu
            self.lr = b * self.lr + (1 - b) * lr


def run(device, steps=6, shape=(2, 3), beta=0.9, epsilon=1e-6, zero_debias=True, nesterov=False, scale=1.0):
    w0 = f32(RNG, *shape)
    grads = [f32(RNG, *shape, scale=scale * (k + 1)) for k in range(steps)]
    zeros = np.zeros(shape, np.float32)
    state = {"w": w0, "m": zeros, "lr": np.array([0.1], np.float32), "mu": np.array([0.0], np.float32),
             "curv": np.zeros(WIDTH, np.float32), "g_avg": zeros, "g2_avg": zeros, "mem": np.zeros(5, np.float32)}
    out = run_steps("YellowFin", NAMES + ["g", "iter"], NAMES, state,
                    [{"g": g, "iter": counter(k + 1)} for k, g in enumerate(grads)], device, host=("iter",),
                    beta=beta, epsilon=epsilon, curv_win_width=WIDTH, zero_debias=zero_debias, nesterov=nesterov)
    ref = Ref(w0, 0.1, 0.0, beta, epsilon, zero_debias, nesterov)
    return out, ref, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zero_debias,nesterov", [(True, False), (False, False), (True, True)])
def test_yellowfin_steps(device, zero_debias, nesterov):
    out, ref, grads = run(device, zero_debias=zero_debias, nesterov=nesterov)
    for k, g in enumerate(grads):
        ref.step(g, k + 1)
        got = out[k]
        assert_close(got["w"], ref.w.reshape(got["w"].shape), rtol=1e-4, atol=1e-5, what=f"param, step {k}")
        assert_close(got["m"], ref.m.reshape(got["m"].shape), rtol=1e-4, atol=1e-5, what=f"moment, step {k}")
        assert_close(got["lr"], [ref.lr], rtol=1e-3, what=f"lr, step {k}")
        assert_close(got["mu"], [ref.mu], rtol=1e-3, atol=1e-6, what=f"mu, step {k}")
        assert_close(got["mem"], ref.mem, rtol=1e-4, what=f"scalars, step {k}")
        assert_close(got["curv"], ref.curv, rtol=1e-5, atol=1e-6, what=f"curvature window, step {k}")
        assert_close(got["g_avg"], ref.g_avg.reshape(got["w"].shape), rtol=1e-5, atol=1e-7)


def test_first_iteration_keeps_rate_and_momentum():
    out, _, _ = run("cpu", steps=1)
    assert out[0]["lr"].tolist() == [np.float32(0.1)] and out[0]["mu"].tolist() == [0.0]
    assert out[0]["curv"][1:].tolist() == [0.0] * (WIDTH - 1)


def test_bad_inputs():
    w, z1 = f32(RNG, 2, 3), np.zeros(1, np.float32)
    good = [w, w, z1, z1, np.zeros(WIDTH, np.float32), w, w, np.zeros(5, np.float32), w, counter(1)]

    def call(index=None, value=None, **args):
        inputs = list(good)
        if index is not None:
            inputs[index] = value
        return run_op("YellowFin", inputs, 8, **{"curv_win_width": WIDTH, **args})

    with pytest.raises(ShapeError, match="grad \\(6,\\) must have param's shape"):
        call(8, w.ravel())
    with pytest.raises(ShapeError, match="lr_avg .* exactly 1"):
        call(2, np.zeros(2, np.float32))
    with pytest.raises(ShapeError, match="curv_win .* at least 4"):
        call(4, np.zeros(3, np.float32))
    with pytest.raises(ShapeError, match="scalars_memory .* at least 5"):
        call(7, np.zeros(4, np.float32))
    with pytest.raises(ArgumentError, match="iteration counter must be >= 1"):
        call(9, counter(0))
    with pytest.raises(ArgumentError, match="curv_win_width must be >= 1"):
        call(curv_win_width=0)
    with pytest.raises(DTypeError, match="int64"):
        call(9, np.array([1], np.int32))
    with pytest.raises(DTypeError):
        call(8, w.astype(np.float64))


def test_not_differentiable():
    assert REGISTRY.get("YellowFin").gradient == "should_not_do_gradient"
    with pytest.raises(GradientError, match="not differentiable"):
        backward_ops([make_op("YellowFin", [f"i{k}" for k in range(10)], [f"o{k}" for k in range(8)])], ["o0"])


def test_reference_catches_a_broken_kernel(broken):
    kernel = REGISTRY.get("YellowFin").kernel

    def wrong(xp, *inputs, **args):       # updates the weights with the new rate instead of the previous one
        out = list(kernel(xp, *inputs, **args))
        out[0] = inputs[0] - (inputs[1] * out[3] + inputs[8] * out[2])
        return tuple(out)

    test_yellowfin_steps("cpu", True, False)
    broken("YellowFin", wrong)
    with pytest.raises(AssertionError):
        test_yellowfin_steps("cpu", True, False)
