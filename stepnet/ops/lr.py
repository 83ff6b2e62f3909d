"""LearningRate: lr = base_lr · f(iter) for Caffe2's learning-rate policies.

The iteration counter is an int64 tensor Caffe2 keeps on the CPU (AtomicIter/Iter increment it before
LearningRate runs, so training starts at iter 1). The output is a 0-D float32 tensor on the op's device.
Optimizer builders pass base_lr = −learning_rate for ops that add lr·update (see optim.py).

Policies and their arguments (defaults as in Caffe2's LearningRateOp):
  fixed             1
  step              gamma^floor(iter / stepsize)
  multistep         gamma^(number of `stepsizes` entries <= iter)  [see below]
  exp               gamma^iter
  inv               (1 + gamma·iter)^(−power)
  poly              (1 − iter/max_iter)^power
  linearWarmup      start_multiplier + (1 − start_multiplier)·iter/num_iter before num_iter, then 1
  constantWarmup    multiplier before num_iter, then 1
  alter             1 during active_period, 0 during inactive_period (or the reverse if not active_first)
  hill              linearWarmup for num_iter iterations, then max(end_multiplier, inv(iter − num_iter))
  composite         sub-policy k (args sub_policy_<k>_<arg>, incl. sub_policy_<k>_lr_scale) runs for
                    sub_policy_num_iters[k] iterations, the first starting at iter 1; it sees the global
                    iter and its value is multiplied by its lr_scale; the last one continues forever.

`multistep` is not in the 2018 Caffe2 (facebookarchive/caffe2#1860 reports "Unknown learning rate policy:
multistep"); stepnet offers it with Caffe1's meaning, its steps in the int list `stepsizes`. The later
pytorch-era policies gate, cyclic, cosine, constantThenLinearWarmup, compositeCyclical and compositeCosine
are not supported (an unknown policy is an ArgumentError naming the known ones).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError, did_you_mean
from ..core.spec import spec
from .registry import NO_GRADIENT, Arg, op

MAX_SUB_POLICIES = 8  # composite sub-policies whose arguments are declared (sub_policy_0_ .. sub_policy_7_)

POLICY_ARGS = {
    "stepsize": Arg("int", 0), "stepsizes": Arg("ints", []), "gamma": Arg("float", 0.0),
    "power": Arg("float", 0.0), "max_iter": Arg("int", -1), "start_multiplier": Arg("float", 0.0),
    "num_iter": Arg("int", 0), "multiplier": Arg("float", 0.5), "active_first": Arg("bool", True),
    "active_period": Arg("int", -1), "inactive_period": Arg("int", -1), "end_multiplier": Arg("float", 0.0),
}
SUB_POLICY_ARGS = {f"sub_policy_{k}_{name}": spec_ for k in range(MAX_SUB_POLICIES)
                   for name, spec_ in {**POLICY_ARGS, "policy": Arg("str", ""),
                                       "lr_scale": Arg("float", 1.0)}.items()}
LR_ARGS = {"base_lr": Arg("float"), "policy": Arg("str"), **POLICY_ARGS,
           "sub_policy_num_iters": Arg("ints", []), **SUB_POLICY_ARGS}


def iteration_value(it, op_type: str, static: bool = False) -> int | None:
    """The iteration counter's value: an int64 tensor with at least one element (its first is read). With
    static=True only the checks run (it may be a TensorSpec)."""
    if it.dtype is not None and it.dtype != np.int64:
        raise DTypeError(f"{op_type}: the iteration counter must be an int64 tensor, got {it.dtype}; create "
                         "it with ConstantFill(..., dtype=INT64 (10)) or Cast(to=10)")
    if math.prod(it.shape) < 1:
        raise ShapeError(f"{op_type}: the iteration counter is empty (shape {tuple(it.shape)}); it must hold "
                         "one int64 element")
    if static:
        return None
    return int(np.asarray(backend.to_host(it)).reshape(-1)[0])


def _pow(base: float, exponent: float) -> float:
    """C's pow: NaN (not a complex number) for a negative base with a fractional exponent."""
    with np.errstate(all="ignore"):
        return float(np.power(np.float64(base), np.float64(exponent)))


def _linear_warmup(start: float, n: int) -> Callable[[int], float]:
    return lambda it: 1.0 if it >= n else start + (1.0 - start) * it / n


def _inv(gamma: float, power: float) -> Callable[[int], float]:
    return lambda it: _pow(1.0 + gamma * it, -power)


def _policy(policy: str, a: dict, prefix: str = "") -> Callable[[int], float]:
    """The multiplier f(iter) of one (non-composite) policy, reading arguments `prefix + name` from a."""
    def get(name):
        return a[prefix + name]

    where = f"{prefix}policy {policy!r}" if prefix else f"policy {policy!r}"
    if policy == "fixed":
        return lambda it: 1.0
    if policy == "step":
        stepsize, gamma = get("stepsize"), get("gamma")
        if stepsize <= 0:
            raise ArgumentError(f"LearningRate {where} needs {prefix}stepsize > 0, got {stepsize}")
        return lambda it: _pow(gamma, int(it / stepsize))  # C++ integer division truncates toward zero
    if policy == "multistep":
        steps, gamma = list(get("stepsizes")), get("gamma")
        if not steps:
            raise ArgumentError(f"LearningRate {where} needs a non-empty {prefix}stepsizes list")
        return lambda it: _pow(gamma, sum(1 for s in steps if it >= s))
    if policy == "exp":
        gamma = get("gamma")
        return lambda it: _pow(gamma, it)
    if policy == "inv":
        return _inv(get("gamma"), get("power"))
    if policy == "poly":
        power, max_iter = get("power"), get("max_iter")
        if max_iter == 0:
            raise ArgumentError(f"LearningRate {where} needs {prefix}max_iter != 0")
        return lambda it: _pow(1.0 - it / max_iter, power)
    if policy == "linearWarmup":
        return _linear_warmup(get("start_multiplier"), get("num_iter"))
    if policy == "constantWarmup":
        multiplier, n = get("multiplier"), get("num_iter")
        return lambda it: 1.0 if it >= n else multiplier
    if policy == "alter":
        on, off, first = get("active_period"), get("inactive_period"), get("active_first")
        if on < 0 or off < 0 or on + off == 0:
            raise ArgumentError(f"LearningRate {where} needs {prefix}active_period >= 0 and "
                                f"{prefix}inactive_period >= 0, not both 0 (got {on}, {off})")
        lead = on if first else off
        return lambda it: (1.0 if first else 0.0) if it % (on + off) < lead else (0.0 if first else 1.0)
    if policy == "hill":
        n, end = get("num_iter"), get("end_multiplier")
        warm, inv = _linear_warmup(get("start_multiplier"), n), _inv(get("gamma"), get("power"))
        return lambda it: warm(it) if it < n else max(end, inv(it - n))
    if policy == "composite":
        raise ArgumentError(f"LearningRate {where}: a composite policy cannot be a sub-policy of a composite "
                            "policy")
    names = list(POLICIES)
    raise ArgumentError(f"LearningRate: unknown {where}{did_you_mean(policy, names)}; known policies: "
                        f"{', '.join(names)}")


def _composite(a: dict) -> Callable[[int], float]:
    lengths = list(a["sub_policy_num_iters"])
    if not lengths:
        raise ArgumentError("LearningRate policy 'composite' needs sub_policy_num_iters (one positive length "
                            "per sub-policy)")
    if len(lengths) > MAX_SUB_POLICIES:
        raise ArgumentError(f"LearningRate policy 'composite': stepnet supports at most {MAX_SUB_POLICIES} "
                            f"sub-policies, got {len(lengths)}")
    parts, start = [], 1
    for k, n in enumerate(lengths):
        if n <= 0:
            raise ArgumentError(f"LearningRate policy 'composite': sub_policy_num_iters[{k}] must be "
                                f"positive, got {n}")
        prefix = f"sub_policy_{k}_"
        sub = a[prefix + "policy"]
        if not sub:
            raise ArgumentError(f"LearningRate policy 'composite': argument {prefix}policy is missing")
        parts.append((start, _policy(sub, a, prefix), a[prefix + "lr_scale"]))
        start += n

    def f(it):
        chosen = parts[0]
        for part in parts:
            if it >= part[0]:
                chosen = part
        return chosen[1](it) * chosen[2]
    return f


POLICIES = ("fixed", "step", "multistep", "exp", "inv", "poly", "linearWarmup", "constantWarmup", "alter",
            "hill", "composite")


def schedule(args: dict) -> Callable[[int], float]:
    """f(iter) for LearningRate's parsed arguments (ArgumentError for a bad policy or arguments)."""
    policy = args["policy"]
    if not policy:
        raise ArgumentError(f"LearningRate: argument 'policy' is empty; give one of {', '.join(POLICIES)}")
    return _composite(args) if policy == "composite" else _policy(policy, args)


def _lr_shape(specs, **args):
    iteration_value(specs[0], "LearningRate", static=True)
    schedule(args)
    return [spec((), np.float32)]


@op("LearningRate", inputs=1, outputs=1, inplace=(), host_inputs=[0], args=LR_ARGS, gradient=NO_GRADIENT,
    shape=_lr_shape, shapes_from_inputs=True)
def learning_rate(xp, iteration, **args):
    """lr = base_lr · f(iter) as a 0-D float32 tensor; see the module docstring for the policies."""
    return xp.asarray(rate(schedule(args), args["base_lr"], iteration))


def rate(f: Callable[[int], float], base_lr: float, iteration) -> np.float32:
    """base_lr · f(iter) as float32 for the iteration counter's value: LearningRate's arithmetic, its compiled
    form's too."""
    return np.float32(base_lr * f(iteration_value(iteration, "LearningRate")))
