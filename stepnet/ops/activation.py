"""Unary elementwise math and activations (Relu, Sigmoid, Tanh, Elu, PRelu, Clip, StumpFunc, ...).

Float in, same float dtype out (float32 stays float32). Sigmoid, Softplus, Swish, Elu and Selu use forms that
neither overflow nor lose precision for large |x|. NaN/inf results of Log, Sqrt, Reciprocal, ... follow IEEE
arithmetic silently, as in Caffe2 (the executor's NaN check catches them when asked).

Gradient makers emit what Caffe2's emit (pytorch/pytorch caffe2/operators/<op>_op.cc): most ops get an
<Op>Gradient op (kernels in activation_grad.py) reading the output Y (Relu, Sigmoid, Tanh, Elu, ...) or the
input X (Softsign, Abs, Sin, Cos, Logit) with dY; Exp -> Mul(Y, dY); Log -> Div(dY, X); Sqrt -> Scale(0.5)
and Div by Y; Sqr -> Scale(2) and Mul by X; Negative -> Negative(dY). Sign has none (SHOULD_NOT_DO_GRADIENT).
ThresholdedRelu -> ThresholdedReluGradient(Y, dY); Glu has no gradient in Caffe2 (none registered).
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..kernels import jit
from ..kernels.activations import sigmoid
from .base import check_float, fold, like, not_in_place, out_spec, single_gradient
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op

FLOAT_KINDS = "f"
NUMERIC_KINDS = "fiu"


def _sigmoid(xp, x):
    """1 / (1 + exp(-x)), stable for any x (kernels.activations.sigmoid, the one formula)."""
    return sigmoid(xp, x)


def _fused_sigmoid(regular):
    """Sigmoid's fused_kernel (Workspace.fused_cells): numba's one pass (kernels/jitted.py sigmoid, within 4e-7
    relative of the exact value) for float32 host arrays, the regular kernel for anything else."""
    def kernel(xp, x):
        compiled = jit.load() if type(x) is np.ndarray and x.dtype == jit.F32 else None
        if compiled is None:
            return regular(xp, x)
        n, out = x.size, np.empty(x.shape, jit.F32)
        compiled.sigmoid(np.ascontiguousarray(x).reshape(-1), out.reshape(-1), np.empty(n, jit.F32),
                         np.empty(n, np.int32))
        return out
    kernel.__doc__ = "Sigmoid in one fused float32 pass (Workspace.fused_cells)."
    return kernel


# --------------------------------------------------------------------------------------------- gradients
def _sqrt_gradient(g):
    """Scale(dY, 0.5) then Div by Y, as Caffe2 (which writes both into dX; the scaled value gets its own name
    here so that gradient accumulation can rename dX safely)."""
    pre = g.I(0) + "_grad_autogen_pre"
    g.op("Scale", [g.GO(0)], [pre], scale=0.5)
    g.op("Div", [pre, g.O(0)], [g.GI(0)])


def _sqr_gradient(g):
    """Scale(dY, 2) then Mul by X. Caffe2 scales dY in place, which corrupts dY when another op shares that
    gradient blob (a pass-through from Sum or a legacy Add); the scaled value gets its own name here."""
    not_in_place(g)
    pre = g.I(0) + "_grad_autogen_pre"
    g.op("Scale", [g.GO(0)], [pre], scale=2.0)
    g.op("Mul", [pre, g.I(0)], [g.GI(0)])


def _prelu_gradient(g):
    not_in_place(g)
    g.op("PReluGradient", [g.O(0), g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1)])


_READ_Y = ("Relu", "Sigmoid", "Tanh", "Softplus", "Elu", "LeakyRelu", "Selu", "HardSigmoid", "Clip",
           "Reciprocal")
_GRADIENTS = {
    **{fwd: single_gradient(f"{fwd}Gradient", ["O0", "GO0"]) for fwd in _READ_Y},
    **{fwd: single_gradient(f"{fwd}Gradient", ["I0", "GO0"], reads_inputs=True)
       for fwd in ("Softsign", "Abs", "Sin", "Cos", "Logit")},
    "Rsqrt": single_gradient("RsqrtGradient", ["GO0", "O0"]),
    "Cbrt": single_gradient("CbrtGradient", ["GO0", "O0"]),
    "Swish": single_gradient("SwishGradient", ["I0", "O0", "GO0"], reads_inputs=True),
    "PRelu": _prelu_gradient,
    "Exp": single_gradient("Mul", ["O0", "GO0"]),
    "Log": single_gradient("Div", ["GO0", "I0"], reads_inputs=True),
    "Sqrt": _sqrt_gradient,
    "Sqr": _sqr_gradient,
    "Negative": single_gradient("Negative", ["GO0"]),
    "Sign": SHOULD_NOT_DO_GRADIENT,
}


# --------------------------------------------------------------------------------------------- unary
def _unary(type_, fn, inplace=((0, 0),), kinds=FLOAT_KINDS, doc="", fused=None):
    def kernel(xp, x):
        check_float(type_, kinds=kinds, X=x)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return fn(xp, x)

    def shape(specs):  # integer inputs (Sqr, Abs, Negative, Sign) carry their value through
        check_float(type_, kinds=kinds, X=specs[0])
        return [out_spec(specs[0].shape, specs[0].dtype, fold(kernel, specs))]

    kernel.__name__ = kernel.__qualname__ = type_.lower()
    op(type_, inputs=1, outputs=1, inplace=inplace, shape=shape, gradient=_GRADIENTS[type_], doc=doc,
       shapes_from_inputs=True, fused=fused,
       aliases=_ALIASES.get(type_, ()))(kernel)


_ALIASES = {"Rsqrt": ("RSqrt",)}   # other spellings files use


_NONE = ()
_UNARY = {
    "Relu": (lambda xp, x: xp.maximum(x, 0), (0, 0), FLOAT_KINDS, "max(x, 0)."),
    "Sigmoid": (_sigmoid, (0, 0), FLOAT_KINDS, "1 / (1 + exp(-x)), stable for large |x|."),
    "Tanh": (lambda xp, x: xp.tanh(x), (0, 0), FLOAT_KINDS, "tanh(x)."),
    "Softsign": (lambda xp, x: x / (1 + xp.abs(x)), (0, 0), FLOAT_KINDS, "x / (1 + |x|)."),
    "Softplus": (lambda xp, x: xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x))), (0, 0), FLOAT_KINDS,
                 "log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|)) so large x gives x, not inf."),
    "Exp": (lambda xp, x: xp.exp(x), (0, 0), FLOAT_KINDS, "exp(x)."),
    "Log": (lambda xp, x: xp.log(x), (0, 0), FLOAT_KINDS, "Natural log; -inf at 0, NaN below."),
    "Sqrt": (lambda xp, x: xp.sqrt(x), (0, 0), FLOAT_KINDS, "Square root; NaN below 0."),
    "Rsqrt": (lambda xp, x: 1 / xp.sqrt(x), (0, 0), FLOAT_KINDS, "1 / sqrt(x)."),
    "Reciprocal": (lambda xp, x: 1 / x, (0, 0), FLOAT_KINDS, "1 / x."),
    "Cbrt": (lambda xp, x: xp.cbrt(x), (0, 0), FLOAT_KINDS, "Cube root (negative for negative x)."),
    "Sin": (lambda xp, x: xp.sin(x), _NONE, FLOAT_KINDS, "sin(x)."),
    "Cos": (lambda xp, x: xp.cos(x), _NONE, FLOAT_KINDS, "cos(x)."),
    "Swish": (lambda xp, x: x * _sigmoid(xp, x), _NONE, FLOAT_KINDS, "x * sigmoid(x)."),
    "Sqr": (lambda xp, x: x * x, (0, 0), NUMERIC_KINDS, "x * x."),
    "Abs": (lambda xp, x: xp.abs(x), _NONE, NUMERIC_KINDS, "|x|."),
    "Negative": (lambda xp, x: xp.negative(x), (0, 0), NUMERIC_KINDS, "-x."),
    "Sign": (lambda xp, x: xp.sign(x), _NONE, NUMERIC_KINDS, "-1, 0 or 1 by the sign of x, in x's dtype."),
}
_FUSED = {"Sigmoid": _fused_sigmoid}     # numba's variant a workspace may choose (Workspace.fused_cells)
for _name, (_fn, _pair, _kinds, _doc) in _UNARY.items():
    _unary(_name, _fn, [_pair] if _pair else (), _kinds, f"Elementwise {_name}: {_doc}", _FUSED.get(_name))


# --------------------------------------------------------------------------------------------- with arguments
def _check_selu(scale) -> None:
    if not scale > 1.0:
        raise ArgumentError(f"Selu argument scale must be greater than 1, got {scale}")


def _check_logit(eps) -> None:
    if not 0.0 < eps < 0.5:
        raise ArgumentError(f"Logit argument eps must be in (0, 0.5), got {eps}")


def _float_shape(type_, check_args=None):
    """Shape function of a float-only op that keeps its input's shape and dtype (check_args(**args) runs the
    kernel's argument checks)."""
    def shape(specs, **args):
        check_float(type_, X=specs[0])
        if check_args is not None:
            check_args(**args)
        return [like(specs[0])]
    return shape


@op("Elu", inputs=1, outputs=1, inplace=[(0, 0)], args={"alpha": 1.0}, shape=_float_shape("Elu"),
    gradient=_GRADIENTS["Elu"])
def elu(xp, x, alpha=1.0):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""
    check_float("Elu", X=x)
    return xp.where(x > 0, x, x.dtype.type(alpha) * xp.expm1(xp.minimum(x, 0)))


@op("LeakyRelu", inputs=1, outputs=1, inplace=[(0, 0)], args={"alpha": 0.01}, shape=_float_shape("LeakyRelu"),
    gradient=_GRADIENTS["LeakyRelu"])
def leaky_relu(xp, x, alpha=0.01):
    """x for x > 0, alpha * x otherwise."""
    check_float("LeakyRelu", X=x)
    return xp.where(x > 0, x, x * x.dtype.type(alpha))


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


@op("Selu", inputs=1, outputs=1, inplace=[(0, 0)], args={"alpha": SELU_ALPHA, "scale": SELU_SCALE},
    shape=_float_shape("Selu", lambda scale, **_: _check_selu(scale)), gradient=_GRADIENTS["Selu"])
def selu(xp, x, alpha=SELU_ALPHA, scale=SELU_SCALE):
    """scale * (x for x > 0, alpha * (exp(x) - 1) otherwise); Caffe2 requires scale > 1."""
    check_float("Selu", X=x)
    _check_selu(scale)
    t = x.dtype.type
    return t(scale) * xp.where(x > 0, x, t(alpha) * xp.expm1(xp.minimum(x, 0)))


@op("HardSigmoid", inputs=1, outputs=1, inplace=[(0, 0)], args={"alpha": 0.2, "beta": 0.5},
    shape=_float_shape("HardSigmoid"), gradient=_GRADIENTS["HardSigmoid"])
def hard_sigmoid(xp, x, alpha=0.2, beta=0.5):
    """max(0, min(1, alpha * x + beta))."""
    check_float("HardSigmoid", X=x)
    t = x.dtype.type
    return xp.minimum(xp.maximum(x * t(alpha) + t(beta), t(0)), t(1))


@op("Logit", inputs=1, outputs=1, inplace=[(0, 0)], args={"eps": 1e-6},
    shape=_float_shape("Logit", lambda eps: _check_logit(eps)), gradient=_GRADIENTS["Logit"])
def logit(xp, x, eps=1e-6):
    """log(p / (1 - p)) with p = x clamped to [eps, 1 - eps]; eps must lie in (0, 0.5)."""
    check_float("Logit", X=x)
    _check_logit(eps)
    t = x.dtype.type
    p = xp.maximum(xp.minimum(x, t(1.0 - eps)), t(eps))
    return xp.log(p / (1 - p))


@op("Clip", inputs=1, outputs=1, inplace=[(0, 0)],
    args={"min": Arg("float", None), "max": Arg("float", None)}, shape=_float_shape("Clip"),
    gradient=_GRADIENTS["Clip"])
def clip(xp, x, min=None, max=None):
    """min(max(x, min), max); an absent bound is the dtype's full range. NaN stays NaN."""
    check_float("Clip", X=x)
    info = np.finfo(x.dtype)
    with np.errstate(over="ignore"):
        lo = x.dtype.type(info.min if min is None else min)
        hi = x.dtype.type(info.max if max is None else max)
    return xp.minimum(xp.maximum(x, lo), hi)


@op("StumpFunc", inputs=1, outputs=1, inplace=[(0, 0)],
    args={"threshold": Arg("float", 0.0), "low_value": Arg("float", 0.0), "high_value": Arg("float", 0.0)},
    shape=_float_shape("StumpFunc"), gradient=NO_GRADIENT)
def stump_func(xp, x, threshold=0.0, low_value=0.0, high_value=0.0):
    """low_value where x <= threshold, high_value elsewhere (a step function; stump_func_op.cc)."""
    check_float("StumpFunc", X=x)
    t = x.dtype.type
    return xp.where(x <= t(threshold), t(low_value), t(high_value)).astype(x.dtype, copy=False)


def prelu_view(x_shape, x_dtype, slope_shape, slope_dtype, order) -> tuple | None:
    """PRelu's checks; the shape to view the slope as against X (None: one shared value). Arrays and specs."""
    if x_dtype is not None and slope_dtype is not None and slope_dtype != x_dtype:
        raise DTypeError(f"PRelu slope has dtype {slope_dtype.name} but X has {x_dtype.name}; Cast the slope")
    if order not in ("NCHW", "NHWC"):
        raise ArgumentError(f"PRelu argument order must be 'NCHW' or 'NHWC', got {order!r}")
    n = int(np.prod(slope_shape, dtype=np.int64))
    if n == 1:
        return None
    ndim = len(x_shape)
    c_axis = 1 if order == "NCHW" else ndim - 1
    if ndim < (2 if order == "NCHW" else 1) or x_shape[c_axis] != n:
        have = x_shape[c_axis] if 0 <= c_axis < ndim else "none"
        raise ShapeError(f"PRelu slope {tuple(slope_shape)} has {n} values but X {tuple(x_shape)} "
                         f"has {have} channels on axis {c_axis} (order {order}); give one slope per channel "
                         "or a single shared slope")
    view = [1] * ndim
    view[c_axis] = n
    return tuple(view)


def _prelu_shape(specs, order="NCHW"):
    x, slope = specs
    check_float("PRelu", X=x)
    prelu_view(x.shape, x.dtype, slope.shape, slope.dtype, order)
    return [like(x)]


@op("PRelu", inputs=2, outputs=1, inplace=[(0, 0)], args={"order": "NCHW"}, shape=_prelu_shape,
    gradient=_GRADIENTS["PRelu"])
def prelu(xp, x, slope, order="NCHW"):
    """x for x > 0, slope * x otherwise; slope has one value (shared) or one per channel, the channel axis
    being 1 for order NCHW and the last axis for NHWC."""
    check_float("PRelu", X=x)
    view = prelu_view(x.shape, x.dtype, slope.shape, slope.dtype, order)
    w = slope.reshape(()) if view is None else slope.reshape(view)
    return xp.where(x > 0, x, x * w)


# --------------------------------------------------------------------------------------------- ThresholdedRelu, Glu
@op("ThresholdedRelu", inputs=1, outputs=1, inplace=[(0, 0)], args={"alpha": 1.0},
    shape=_float_shape("ThresholdedRelu"), shapes_from_inputs=True,
    gradient=single_gradient("ThresholdedReluGradient", ["O0", "GO0"]))
def thresholded_relu(xp, x, alpha=1.0):
    """x where x > alpha, else 0 (caffe2/operators/thresholded_relu_op.cc)."""
    check_float("ThresholdedRelu", X=x)
    return xp.where(x > x.dtype.type(alpha), x, x.dtype.type(0))


def _glu_axis(shape, dim: int) -> int:
    """The split axis of Glu (dim -1 is the last; other values are taken as given), checked."""
    axis = len(shape) - 1 if dim == -1 else dim
    if not 0 <= axis < len(shape):
        raise ArgumentError(f"Glu argument dim={dim} is out of range for a {len(shape)}-D input "
                            f"(valid: 0..{len(shape) - 1}, or -1 for the last)")
    if shape[axis] % 2:
        raise ShapeError(f"Glu splits dim {axis} of X {tuple(shape)} in two halves, but its size {shape[axis]} "
                         "is odd")
    return axis


def _glu_shape(specs, *, dim):
    check_float("Glu", X=specs[0])
    shape = list(specs[0].shape)
    axis = _glu_axis(shape, dim)
    shape[axis] //= 2
    return [out_spec(shape, specs[0].dtype)]


@op("Glu", inputs=1, outputs=1, inplace=(), args={"dim": -1}, shape=_glu_shape, shapes_from_inputs=True)
def glu(xp, x, *, dim):
    """Gated linear unit: X split in two halves A, B along `dim` (default -1, the last) gives A * sigmoid(B),
    half as large along that dim (caffe2/operators/glu_op.cc)."""
    check_float("Glu", X=x)
    axis = _glu_axis(x.shape, dim)
    a, b = xp.split(x, 2, axis=axis)
    return a * _sigmoid(xp, b)
