"""Momentum SGD with weight decay in one op, as FP16SgdOptimizer uses it: FP16MomentumSGDUpdate on float16
tensors and FP32MomentumSGDUpdate on float32 ones (caffe2/sgd/fp16_momentum_sgd_op, fp32_momentum_sgd_op;
CUDA-only kernels in Caffe2, on every device here).

(grad, moment, lr, param) -> (grad, moment, param), with g = grad + weight_decay·param:
  plain:    m' = lr·g + μ·m,  grad' = m',                 param' = param − grad'
  nesterov: m' = lr·g + μ·m,  grad' = (μ·m' + m') − μ·m,   param' = param − grad'
lr is a one-element float32 tensor, positive (FP16SgdOptimizer passes lr = base rate, not its negative).
Each step rounds once to the arithmetic's type, as the fused multiply-adds of Caffe2's kernels do: float16
for FP16MomentumSGDUpdate (the constants lr, μ and weight_decay rounded to float16 too) or, with fp32_update,
float32 arithmetic on the float16 values, rounded to float16 when stored; float32 for FP32MomentumSGDUpdate.
Caffe2's kernels work on pairs of elements; the odd last element of a tensor is updated here like the
others (Caffe2's FP32 kernel leaves it, and its nesterov FP16 kernel reads param[0] for it). No gradient is
registered for either op, as in Caffe2.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import DTypeError
from .base import like
from .optim import arrays, check_like, check_scalar
from .registry import op

ARGS = {"momentum": 0.0, "weight_decay": 0.0, "nesterov": False}


def fused_momentum_step(xp, grad, moment, param, lr: float, momentum: float, weight_decay: float, nesterov: bool,
                        dtype):
    """(grad', moment', param') in `dtype` arithmetic (np.float16 or np.float32), each multiply-add rounded
    once: the exact float64 result of a product of two such values plus a third, then rounded."""
    dt = np.dtype(dtype)

    def rounded(x):
        return x.astype(dt).astype(np.float64)

    lr_, mu, wd = (np.float64(dt.type(v)) for v in (lr, momentum, weight_decay))
    g, m, w = (x.astype(np.float64) for x in (grad, moment, param))
    with np.errstate(all="ignore"):                 # overflow to inf, as the device arithmetic does
        g = rounded(g + w * wd)
        mu_m = rounded(m * mu)
        m_new = rounded(g * lr_ + mu_m)
        g_new = rounded(rounded(m_new * mu + m_new) - mu_m) if nesterov else m_new
        w_new = rounded(w - g_new)
    return g_new, m_new, w_new


def _checker(op_type: str, dtype: str):
    def check(grad, moment, lr, param) -> None:
        for name, x in (("grad", grad), ("moment", moment), ("param", param)):
            if x.dtype is not None and x.dtype != np.dtype(dtype):
                raise DTypeError(f"{op_type}: {name} must be {dtype}, got {x.dtype}")
        check_like(op_type, "grad", grad, moment=moment, param=param)
        check_scalar(op_type, "lr", lr)
    return check


def _shape(check):
    def shape(specs, **_):
        check(*specs)
        return [like(specs[0]), like(specs[1]), like(specs[3])]
    return shape


def _lr_value(lr) -> float:
    return float(np.asarray(backend.to_host(lr)).reshape(-1)[0])


def _run(xp, grad, moment, lr, param, momentum, weight_decay, nesterov, arithmetic, stored):
    g, m, w = fused_momentum_step(xp, grad, moment.reshape(grad.shape), param.reshape(grad.shape), _lr_value(lr),
                                  momentum, weight_decay, nesterov, arithmetic)
    return arrays(xp, g.astype(stored), m.astype(stored).reshape(moment.shape), w.astype(stored).reshape(param.shape))


_check16 = _checker("FP16MomentumSGDUpdate", "float16")
_check32 = _checker("FP32MomentumSGDUpdate", "float32")


@op("FP16MomentumSGDUpdate", inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (3, 2)],
    args={**ARGS, "fp32_update": False}, shape=_shape(_check16))
def fp16_momentum_sgd_update(xp, grad, moment, lr, param, *, momentum, weight_decay, nesterov, fp32_update):
    """(grad, moment, lr, param) -> (grad, moment, param) on float16 tensors: momentum SGD with weight decay
    (module docstring) in float16 arithmetic, or float32 arithmetic with fp32_update."""
    _check16(grad, moment, lr, param)
    return _run(xp, grad, moment, lr, param, momentum, weight_decay, nesterov,
                np.float32 if fp32_update else np.float16, np.float16)


@op("FP32MomentumSGDUpdate", inputs=4, outputs=3, inplace=[(0, 0), (1, 1), (3, 2)], args=ARGS,
    shape=_shape(_check32))
def fp32_momentum_sgd_update(xp, grad, moment, lr, param, *, momentum, weight_decay, nesterov):
    """(grad, moment, lr, param) -> (grad, moment, param) on float32 tensors: momentum SGD with weight decay
    (module docstring) in float32 arithmetic."""
    _check32(grad, moment, lr, param)
    return _run(xp, grad, moment, lr, param, momentum, weight_decay, nesterov, np.float32, np.float32)
