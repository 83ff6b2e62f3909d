"""Elementwise ops of the later Caffe2 that the older families lack: Mod, Log1p, Gelu (exact and fast_gelu),
ReplaceNaN, EnforceFinite, Bucketize, BatchBoxCox, Mean, Ceil and Floor.

Semantics from pytorch/pytorch caffe2/operators/{mod,log1p,gelu,replace_nan,enforce_finite,bucketize,
batch_box_cox,mean}_op.cc. Gradient makers are declared with the ops: Log1p -> Log1pGradient(X, dY), Gelu ->
GeluGradient(dY, X) (fast_gelu copied), Mean -> MeanGradient(dY) -> one dX per input; the kernels are in
pointwise_grad.py. Mod, ReplaceNaN and EnforceFinite are SHOULD_NOT_DO_GRADIENT, Bucketize NO_GRADIENT and
BatchBoxCox, Ceil and Floor GRADIENT_NOT_IMPLEMENTED, as Caffe2 registers them.

numpy has no erf, so the exact Gelu's normal CDF is computed here from a series (|z| < 2.5) and a continued
fraction for erfc (beyond), in float64: relative error below 1e-11 everywhere, tails included.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, OpError, ShapeError
from .base import check_dtypes, check_float, fold, like, on_device, out_spec, single_gradient
from .registry import GRADIENT_NOT_IMPLEMENTED, NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op


def _float_shape(op_type: str):
    def shape(specs, **_):
        check_float(op_type, X=specs[0])
        return [like(specs[0])]
    return shape


# --------------------------------------------------------------------------------------------- Mod
def _check_mod(x, divisor) -> None:
    if x.dtype is not None and x.dtype.name not in ("int32", "int64"):
        raise DTypeError(f"Mod takes an int32 or int64 tensor, got {x.dtype}; Cast it first")
    if divisor == 0:
        raise ArgumentError("Mod argument divisor must not be 0 (it is required)")


def _mod_shape(specs, **args):
    _check_mod(specs[0], args["divisor"])
    return [out_spec(specs[0].shape, specs[0].dtype, fold(mod, specs, **args))]


@op("Mod", inputs=1, outputs=1, inplace=[(0, 0)], args={"divisor": 0, "sign_follow_divisor": False},
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_mod_shape)
def mod(xp, x, *, divisor, sign_follow_divisor):
    """X % divisor elementwise, as C++ computes it (the sign follows X); with sign_follow_divisor the sign
    follows the divisor instead (Python's %)."""
    _check_mod(x, divisor)
    d = np.int64(divisor)
    r = xp.fmod(x.astype(np.int64), d)
    if sign_follow_divisor:
        r = xp.where((r != 0) & ((r > 0) != (d > 0)), r + d, r)
    return r.astype(x.dtype)


# --------------------------------------------------------------------------------------------- Log1p, Gelu
@op("Log1p", inputs=1, outputs=1, inplace=(), shape=_float_shape("Log1p"),
    gradient=single_gradient("Log1pGradient", ["I0", "GO0"], reads_inputs=True))
def log1p(xp, x):
    """log(1 + x), accurate for small x; -inf at -1, NaN below."""
    check_float("Log1p", X=x)
    with np.errstate(divide="ignore", invalid="ignore"):
        return xp.log1p(x)


SWITCH, TERMS = 2.5, 50
SQRT_PI = math.sqrt(math.pi)
FAST_ALPHA = math.sqrt(2.0 / math.pi)   # sqrt(2/pi), in the tanh form
FAST_COEFF = 0.044715


def normal_upper_tail(xp, a):
    """0.5 * erfc(a) = P(Z > a * sqrt(2)) for float64 a >= 0: the series erf(s) = 2/sqrt(pi) exp(-s^2)
    sum_n 2^n s^(2n+1) / (2n+1)!! (positive terms) below SWITCH, the continued fraction erfc(c) =
    exp(-c^2) / sqrt(pi) / (c + (1/2) / (c + 1 / (c + (3/2) / (c + ...)))) from SWITCH on."""
    s = xp.minimum(a, SWITCH)
    two_s2, term, total = 2 * s * s, s, s
    for n in range(1, TERMS):
        term = term * two_s2 / (2 * n + 1)
        total = total + term
    erf_s = 2 / SQRT_PI * xp.exp(-s * s) * total
    c = xp.maximum(a, SWITCH)
    t = c
    for k in range(TERMS, 0, -1):
        t = c + (k / 2) / t
    return 0.5 * xp.where(a < SWITCH, 1 - erf_s, xp.exp(-c * c) / SQRT_PI / t)


def normal_cdf(xp, x):
    """P(Z <= x) for a standard normal Z, elementwise, in float64."""
    z = x.astype(np.float64) / math.sqrt(2.0)
    tail = normal_upper_tail(xp, xp.abs(z))
    return xp.where(z >= 0, 1 - tail, tail)


@op("Gelu", inputs=1, outputs=1, inplace=(), args={"fast_gelu": False}, shape=_float_shape("Gelu"),
    gradient=single_gradient("GeluGradient", ["GO0", "I0"], reads_inputs=True))
def gelu(xp, x, *, fast_gelu):
    """x * P(Z <= x), Z ~ N(0, 1); with fast_gelu, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    check_float("Gelu", X=x)
    if fast_gelu:
        t = x.dtype.type
        inner = (x + x * x * x * t(FAST_COEFF)) * t(FAST_ALPHA)
        return x * (xp.tanh(inner) + t(1)) * t(0.5)
    return (x.astype(np.float64) * normal_cdf(xp, x)).astype(x.dtype)


# --------------------------------------------------------------------------------------------- NaN / Inf
def _check_float_or_double(op_type, x) -> None:
    if x.dtype is not None and x.dtype.name not in ("float32", "float64"):
        raise DTypeError(f"{op_type} takes a float32 or float64 tensor, got {x.dtype}")


def _replace_nan_shape(specs, **_):
    _check_float_or_double("ReplaceNaN", specs[0])
    return [like(specs[0])]


def _enforce_finite_shape(specs):
    _check_float_or_double("EnforceFinite", specs[0])
    return []


@op("ReplaceNaN", inputs=1, outputs=1, inplace=[(0, 0)], args={"value": 0.0}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_replace_nan_shape)
def replace_nan(xp, x, *, value):
    """X with every NaN replaced by `value` (default 0); infinities stay."""
    _check_float_or_double("ReplaceNaN", x)
    return xp.where(xp.isnan(x), x.dtype.type(value), x)


@op("EnforceFinite", inputs=1, outputs=0, gradient=SHOULD_NOT_DO_GRADIENT, shape=_enforce_finite_shape)
def enforce_finite(xp, x):
    """Fails, naming the first offending element, unless every element of X is finite (no NaN, no Inf)."""
    _check_float_or_double("EnforceFinite", x)
    finite = xp.isfinite(x)
    if not bool(finite.all()):
        first = int(xp.argmin(finite.reshape(-1).astype(np.int8)))
        value = float(x.reshape(-1)[first])
        raise OpError(f"EnforceFinite: element {first} (flat index) of the input is not finite: {value}")
    return None


# --------------------------------------------------------------------------------------------- Bucketize
def _check_bucketize(x, boundaries) -> None:
    if x.dtype is not None and x.dtype.kind != "f":
        raise DTypeError(f"Bucketize takes a float tensor, got {x.dtype}; Cast it to float first")
    if len(x.shape) < 1:
        raise ShapeError("Bucketize needs an input of at least 1 dimension, got a 0-D tensor")
    bad = [i for i in range(1, len(boundaries)) if boundaries[i] < boundaries[i - 1]]
    if bad:
        raise ArgumentError(f"Bucketize argument boundaries must be monotonically increasing: boundaries[{bad[0]}]"
                            f" = {boundaries[bad[0]]} is below boundaries[{bad[0] - 1}] = {boundaries[bad[0] - 1]}")


def _bucketize_shape(specs, *, boundaries):
    _check_bucketize(specs[0], boundaries)
    return [like(specs[0], np.int32)]


@op("Bucketize", inputs=1, outputs=1, inplace=(), args={"boundaries": Arg("floats", [])}, gradient=NO_GRADIENT,
    shape=_bucketize_shape)
def bucketize(xp, x, *, boundaries):
    """int32 index i with boundaries[i-1] < x <= boundaries[i] (0 below the first, len(boundaries) above the
    last): the lower bound of x in the (float32) boundaries."""
    _check_bucketize(x, boundaries)
    edges = on_device(xp, np.asarray(boundaries, dtype=np.float32).astype(x.dtype), x.dtype)
    flat = x.reshape(-1)
    found = xp.searchsorted(edges, flat, side="left")
    return xp.where(xp.isnan(flat), 0, found).astype(np.int32).reshape(x.shape)  # lower_bound puts NaN first


# --------------------------------------------------------------------------------------------- BatchBoxCox
BOX_COX_EPS = 1e-6


def _box_cox_checks(data, lambda1, lambda2) -> int:
    """The checks; D, the number of columns (the size of dims 1.. of DATA)."""
    check_dtypes([data, lambda1, lambda2], ("float32", "float64"), "the inputs of BatchBoxCox (DATA, lambda1, "
                 "lambda2)")
    if len(data.shape) < 1:
        raise ShapeError("BatchBoxCox: DATA must be at least 1-D (N x D), got a 0-D tensor")
    cols = math.prod(data.shape[1:])
    if math.prod(data.shape) > 0:
        for name, lam in (("lambda1", lambda1), ("lambda2", lambda2)):
            if math.prod(lam.shape) != cols:
                raise ShapeError(f"BatchBoxCox: {name} has shape {tuple(lam.shape)} ({math.prod(lam.shape)} "
                                 f"values) but DATA {tuple(data.shape)} has {cols} columns; give one per column")
    return cols


def _box_cox_shape(specs, **_):
    _box_cox_checks(*specs)
    return [like(specs[0])]


@op("BatchBoxCox", inputs=3, outputs=1, inplace=[(0, 0)], args={"min_block_size": 256},
    gradient=GRADIENT_NOT_IMPLEMENTED, shape=_box_cox_shape)
def batch_box_cox(xp, data, lambda1, lambda2, *, min_block_size):
    """Box-Cox per column j of DATA (N x D): with t = max(x + lambda2[j], 1e-6), log(t) where lambda1[j] is 0,
    else (t^lambda1[j] - 1) / lambda1[j]. min_block_size is a CPU batching hint of Caffe2's (no effect)."""
    cols = _box_cox_checks(data, lambda1, lambda2)
    if data.size == 0:
        return data.copy()
    x = data.reshape(data.shape[0], cols)
    l1, l2 = lambda1.reshape(1, cols), lambda2.reshape(1, cols)
    t = xp.maximum(x + l2, data.dtype.type(BOX_COX_EPS))
    zero = l1 == 0
    safe = xp.where(zero, data.dtype.type(1), l1)
    with np.errstate(all="ignore"):
        out = xp.where(zero, xp.log(t), (t ** safe - 1) / safe)
    return out.astype(data.dtype).reshape(data.shape)


# --------------------------------------------------------------------------------------------- Mean
def _check_mean(inputs) -> None:
    check_dtypes(inputs, ("float32", "float64"), "the inputs of Mean")
    for i, x in enumerate(inputs[1:], 1):
        if tuple(x.shape) != tuple(inputs[0].shape):
            raise ShapeError(f"Mean does not broadcast: input {i} has shape {tuple(x.shape)} but input 0 has "
                             f"{tuple(inputs[0].shape)}")


def _mean_gradient(g):
    """MeanGradient([dY]) -> the gradient of every input (each dY / n)."""
    g.op("MeanGradient", [g.GO(0)], [g.GI(i) for i in range(g.n_inputs)])


def _mean_shape(specs):
    _check_mean(specs)
    return [like(specs[0])]


def mean_scale(n: int, dtype):
    """1/n as Caffe2's Mean and MeanGradient apply it: a float32 (so a float64 mean is scaled by float32(1/3))."""
    return np.dtype(dtype).type(np.float32(1.0 / n))


@op("Mean", inputs=(1, None), outputs=1, inplace=[(0, 0)], gradient=_mean_gradient, shape=_mean_shape)
def mean(xp, *inputs):
    """Elementwise mean of any number of float32/float64 tensors of one shape: their sum times float32(1/n)."""
    _check_mean(inputs)
    out = inputs[0].copy()
    for x in inputs[1:]:
        out = out + x
    return out * mean_scale(len(inputs), out.dtype)



# --------------------------------------------------------------------------------------------- Ceil, Floor
def _rounding(type_: str, fn, what: str) -> None:
    """Register Ceil or Floor: a float tensor rounded elementwise, in place allowed (caffe2/operators/
    {ceil,floor}_op.cc; Caffe2 registers them for float only, and no gradient)."""
    def kernel(xp, x):
        check_float(type_, X=x)
        return fn(xp, x)

    kernel.__name__ = kernel.__qualname__ = type_.lower()
    op(type_, inputs=1, outputs=1, inplace=[(0, 0)], gradient=GRADIENT_NOT_IMPLEMENTED, shape=_float_shape(type_),
       shapes_from_inputs=True, doc=f"{what}, elementwise; NaN and infinities stay.")(kernel)


_rounding("Ceil", lambda xp, x: xp.ceil(x), "The smallest integer not below x")
_rounding("Floor", lambda xp, x: xp.floor(x), "The largest integer not above x")
