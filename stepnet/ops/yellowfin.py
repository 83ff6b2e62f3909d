"""YellowFin (arXiv:1706.03471, caffe2/sgd/yellowfin_op): momentum SGD whose learning rate and momentum are
tuned per parameter from moving averages of the gradient's statistics.

Inputs 0-7 are the state, updated in place by YellowFinOptimizer (outputs 0-7 are the same blobs): param,
moment, lr_avg (1 value), mu_avg (1 value), curv_win (the last curv_win_width values of log ‖g‖²), g_avg and
g2_avg (moving averages of g and g², the parameter's shape), scalars_memory (5 moving averages: ‖g‖, ‖g‖²,
min and max of the curvature window, distance); input 8 is the gradient, input 9 the int64 iteration counter
(on the CPU; AtomicIter makes it 1 at the first run). One run, with t the counter, β the argument `beta`,
ε `epsilon`, avg(x) ← β·avg + (1 − β)·x and deb(x) = avg(x)/(1 − β^t) (avg(x) with zero_debias off):

  1. the momentum step with the previous rate and momentum: m' = μ·m + lr·g, param' = param − m'
     (nesterov: param' = param − (1 + μ)·m' + μ·m);
  2. the statistics: ‖g‖² (at least ε) and ‖g‖; log ‖g‖² written at slot (t − 1) mod width of curv_win, whose
     first min(width, t) slots give h_min and h_max (their averages exponentiated, at least ε); variance =
     max(ε, deb(‖g‖²) − ‖deb(g)‖²); distance = avg(‖g‖)/avg(‖g‖²);
  3. from t = 2 on, the tuned values: p = (deb(distance)·h_min)²/(2·variance), the real root of the cubic
     y = w − p/(3w) with w = cbrt((−√(p² + 4p³/27) − p)/2), μ = max((y + 1)², ((√(h_max/h_min) − 1)/
     (√(h_max/h_min) + 1))²), lr = (1 − √μ)²/h_min; lr_avg and mu_avg take their moving averages.

Arithmetic is in the parameter's float dtype; the scalars are computed on the host. Not differentiable.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ShapeError
from .base import check_float, like, size_of
from .lr import iteration_value
from .registry import SHOULD_NOT_DO_GRADIENT, op

SCALARS = 5          # scalars_memory: avg ‖g‖, avg ‖g‖², avg min log ‖g‖², avg max log ‖g‖², avg distance
NAMES = ("param", "moment", "lr_avg", "mu_avg", "curv_win", "g_avg", "g2_avg", "scalars_memory", "grad")
YF_ARGS = {"beta": 0.999, "curv_win_width": 20, "epsilon": 1e-6, "nesterov": False, "zero_debias": True}


def _check(inputs, curv_win_width: int) -> None:
    state = dict(zip(NAMES, inputs))
    param = state["param"]
    check_float("YellowFin", **state)
    if curv_win_width < 1:
        raise ArgumentError(f"YellowFin argument curv_win_width must be >= 1, got {curv_win_width}")
    for name in ("moment", "g_avg", "g2_avg", "grad"):
        if tuple(state[name].shape) != tuple(param.shape):
            raise ShapeError(f"YellowFin: {name} {tuple(state[name].shape)} must have param's shape "
                             f"{tuple(param.shape)}")
    for name, least in (("lr_avg", 1), ("mu_avg", 1), ("curv_win", curv_win_width), ("scalars_memory", SCALARS)):
        if (size_of(state[name]) != 1) if least == 1 else (size_of(state[name]) < least):
            want = "exactly 1" if least == 1 else f"at least {least}"
            raise ShapeError(f"YellowFin: {name} {tuple(state[name].shape)} must hold {want} element(s)")
    iteration_value(inputs[9], "YellowFin", static=True)


def _shape(specs, *, curv_win_width, **_):
    _check(specs, curv_win_width)
    return [like(s) for s in specs[:8]]


def _tuned(dt, distance, h_min, h_max, variance):
    """(lr, mu) from the debiased statistics (step 3 of the module docstring), in dtype dt."""
    one, two, three = dt.type(1), dt.type(2), dt.type(3)
    with np.errstate(all="ignore"):                     # degenerate statistics give NaN / inf, as in C++
        ratio = np.sqrt(h_max / h_min)
        mu_limit = (ratio - one) / (ratio + one)
        pre_p = distance * h_min
        p = pre_p * pre_p / (two * variance)
        w3 = (-np.sqrt(p * p + dt.type(4.0 / 27.0) * p * p * p) - p) / two
        w = (one if w3 > 0 else -one) * np.power(np.abs(w3), dt.type(1.0 / 3.0))
        root = w - p / three / w + one
        mu = max(root * root, mu_limit * mu_limit)
        lr = dt.type(float(one - np.sqrt(mu)) ** 2 / float(h_min))   # C++ squares in double
    return lr, dt.type(mu)


@op("YellowFin", inputs=10, outputs=8, inplace=[(i, i) for i in range(8)], host_inputs=[9], args=YF_ARGS,
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_shape)
def yellowfin(xp, param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars_memory, grad, iteration, *,
              beta, curv_win_width, epsilon, nesterov, zero_debias):
    """(param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars_memory, grad, iter) -> the first
    eight, updated: a momentum SGD step with the current rate and momentum, then YellowFin's statistics and,
    from iter 2 on, its tuned rate and momentum (see the module docstring)."""
    inputs = (param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars_memory, grad, iteration)
    _check(inputs, curv_win_width)
    t = iteration_value(iteration, "YellowFin")
    if t < 1:
        raise ArgumentError(f"YellowFin: the iteration counter must be >= 1 (AtomicIter runs first), got {t}")
    dt = param.dtype
    b, eps = dt.type(beta), dt.type(epsilon)
    one_minus_b = dt.type(1) - b
    with np.errstate(all="ignore"):
        debias = dt.type(1.0 / (1.0 - float(b) ** t)) if zero_debias else dt.type(1)

    def average(value, old):
        new = b * old + one_minus_b * value
        return new, new * debias

    host = {name: np.asarray(backend.to_host(x)).reshape(-1).astype(dt) for name, x in
            (("lr", lr_avg), ("mu", mu_avg), ("curv", curv_win), ("mem", scalars_memory))}
    lr, mu = host["lr"][0], host["mu"][0]
    # 1. the momentum step
    m_new = moment * mu + grad * lr
    p_new = param - m_new if not nesterov else param - (dt.type(1) + mu) * m_new + mu * moment
    # 2. the statistics
    g_avg_new, g_deb = average(grad, g_avg)
    g2_avg_new, _ = average(grad * grad, g2_avg)
    flat = grad.reshape(-1)
    mem, old = host["mem"].copy(), host["mem"]
    with np.errstate(all="ignore"):
        norm2 = max(dt.type(backend.to_host(xp.dot(flat, flat))), eps)
        mem[1], norm2_deb = average(norm2, old[1])
        mem[0], _ = average(np.sqrt(norm2), old[0])
        curv = host["curv"].copy()
        curv[(t - 1) % curv_win_width] = np.log(norm2)
        window = curv[:min(curv_win_width, t)]
        mem[2], h_min = average(window.min(), old[2])
        mem[3], h_max = average(window.max(), old[3])
        h_min, h_max = max(np.exp(h_min), eps), max(np.exp(h_max), eps)
        g_deb_flat = g_deb.reshape(-1)
        variance = max(norm2_deb - dt.type(backend.to_host(xp.dot(g_deb_flat, g_deb_flat))), eps)
        mem[4], distance = average(mem[0] / mem[1], old[4])
    lr_out, mu_out = host["lr"].copy(), host["mu"].copy()
    if t > 1:        # 3. the tuned rate and momentum
        lr_t, mu_t = _tuned(dt, distance, h_min, h_max, variance)
        mu_out[0], _ = average(mu_t, mu_out[0])
        lr_out[0], _ = average(lr_t, lr_out[0])

    def device(values, like_):
        return xp.asarray(values.reshape(like_.shape))

    return (xp.asarray(p_new), xp.asarray(m_new), device(lr_out, lr_avg), device(mu_out, mu_avg),
            device(curv, curv_win), xp.asarray(g_avg_new), xp.asarray(g2_avg_new), device(mem, scalars_memory))
