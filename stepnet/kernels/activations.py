"""The sigmoid, once for each of its two uses. `sigmoid`: the Sigmoid op's 1 / (1 + exp(-x)), without overflow
and correctly rounded (one division, no select). `sigmoid_tanh_`: the recurrent cells' gates, 0.5·tanh(x/2) +
0.5, which costs one transcendental pass instead of two (their jitted kernels use the same identity)."""
from __future__ import annotations


def sigmoid(xp, x, out=None, e=None, d=None):
    """1 / (1 + exp(-x)) into out (a new array when None; e, d: scratch of x's shape). The numerator is
    exp(min(x, 0)), exactly 1 for x ≥ 0 and exactly exp(-|x|) for x < 0, over 1 + exp(-|x|): never an
    overflow, and the correctly rounded quotient of either branch of the textbook stable form."""
    e = xp.empty_like(x) if e is None else e        # (arrays even for 0-d x: a ufunc would return a scalar)
    d = xp.empty_like(x) if d is None else d
    out = xp.empty_like(x) if out is None else out
    xp.abs(x, out=e)
    xp.negative(e, out=e)
    xp.exp(e, out=e)
    xp.add(1, e, out=d)
    xp.minimum(x, 0, out=e)
    xp.exp(e, out=e)
    xp.divide(e, d, out=out)
    return out


def sigmoid_tanh_(xp, s):
    """s := sigmoid(2·s) in place, as 0.5·tanh(s) + 0.5 (the cells multiply their gates by 0.5 first)."""
    half = s.dtype.type(0.5)
    xp.tanh(s, out=s)
    s *= half
    s += half
    return s
