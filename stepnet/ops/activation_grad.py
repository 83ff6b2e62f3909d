"""Gradient ops of the unary math and activation ops, as Caffe2 registers them (pytorch/pytorch
caffe2/operators/<op>_op.cc, the latest input order): <Op>Gradient reading the forward output Y (Relu,
Sigmoid, Tanh, Elu, ...) or the input X (Softsign, Abs, Sin, Cos, Logit) with dY, and PReluGradient. The
makers that emit them are in activation.py, next to the forward ops.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from .activation import SELU_ALPHA, SELU_SCALE, _sigmoid, prelu_view
from ..graph.view import Graph
from .base import FLOAT, check_dtypes, like
from .registry import Arg, op



# Gradient ops whose Caffe2 kernel checks only that the inputs have one size (and shapes dX like input 0), so
# that dX may be written in place over a dY of another shape.
SIZE_ONLY = {"SeluGradient"}


def _check_same(type_, names, specs) -> None:
    """One float dtype and one shape for all inputs (arrays or TensorSpecs); one size for SIZE_ONLY ops."""
    check_dtypes(specs, FLOAT, f"the inputs of {type_}")
    for name, s in zip(names[1:], specs[1:], strict=True):
        if type_ in SIZE_ONLY and math.prod(s.shape) == math.prod(specs[0].shape):
            continue
        if tuple(s.shape) != tuple(specs[0].shape):
            raise ShapeError(f"{type_}: {name} has shape {tuple(s.shape)} but {names[0]} has "
                             f"{tuple(specs[0].shape)}; they must match (both come from one forward op)")


def _register(type_, names, fn, args=None, inplace=((1, 0),), doc=""):
    """A gradient op computing fn(xp, <inputs by name>, **args) -> dX, inputs of one shape and float dtype."""
    def shape(specs, **_):
        _check_same(type_, names, specs)
        return [like(specs[0 if type_ in SIZE_ONLY else names.index("dY")])]

    def kernel(xp, *ins, **kw):
        _check_same(type_, names, ins)
        if type_ in SIZE_ONLY:
            ins = [x.reshape(ins[0].shape) for x in ins]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return fn(xp, *ins, **kw)

    kernel.__name__ = kernel.__qualname__ = type_.lower()
    op(type_, inputs=len(names), outputs=1, args=args, inplace=inplace, shape=shape, shapes_from_inputs=True,
       doc=f"{', '.join(names)} -> dX: {doc}")(kernel)


def _clip_bounds(dtype, lo, hi):
    info = np.finfo(dtype)
    with np.errstate(over="ignore"):
        return dtype.type(info.min if lo is None else lo), dtype.type(info.max if hi is None else hi)


def _clip_grad(xp, Y, dY, min=None, max=None):
    lo, hi = _clip_bounds(Y.dtype, min, max)
    return xp.where((Y > lo) & (Y < hi), dY, dY.dtype.type(0))


def _logit_grad(xp, X, dY, eps=1e-6):
    t = X.dtype.type
    outside = (X < t(eps)) | (X > t(1.0 - eps))
    return xp.where(outside, t(0), dY / ((1 - X) * X))


def _abs_grad(xp, X, dY):
    return xp.where(X == 0, dY.dtype.type(0), xp.where(X > 0, dY, -dY))


YD, XD = ("Y", "dY"), ("X", "dY")
# type: (input names, dX = fn(xp, *inputs, **args), args, in-place pairs, what dX is)
_GRADIENTS = {
    "ReluGradient": (YD, lambda xp, Y, dY: xp.where(Y > 0, dY, dY.dtype.type(0)), None, [(1, 0)],
                     "dY where Y > 0, else 0."),
    "TanhGradient": (YD, lambda xp, Y, dY: dY * (1 - Y * Y), None, [(1, 0)], "dY * (1 - Y^2)."),
    "SoftplusGradient": (YD, lambda xp, Y, dY: dY * -xp.expm1(-Y), None, [(1, 0)], "dY * (1 - exp(-Y))."),
    "EluGradient": (YD, lambda xp, Y, dY, alpha=1.0: xp.where(Y < 0, dY * (Y + Y.dtype.type(alpha)), dY),
                    {"alpha": 1.0}, [(1, 0)], "dY * (Y + alpha) where Y < 0, else dY."),
    "LeakyReluGradient": (YD, lambda xp, Y, dY, alpha=0.01: xp.where(Y >= 0, dY, dY * Y.dtype.type(alpha)),
                          {"alpha": 0.01}, [(1, 0)], "dY where Y >= 0, else alpha * dY."),
    "SeluGradient": (YD, lambda xp, Y, dY, alpha=SELU_ALPHA, scale=SELU_SCALE: xp.where(
        Y > 0, dY * Y.dtype.type(scale), dY * (Y + Y.dtype.type(scale * alpha))),
        {"alpha": SELU_ALPHA, "scale": SELU_SCALE}, [(1, 0)],
        "scale * dY where Y > 0, else dY * (Y + scale * alpha)."),
    "HardSigmoidGradient": (YD, lambda xp, Y, dY, alpha=0.2, beta=0.5: xp.where(
        (Y > 0) & (Y < 1), dY * Y.dtype.type(alpha), dY.dtype.type(0)),
        {"alpha": 0.2, "beta": 0.5}, [(1, 0)], "alpha * dY where 0 < Y < 1, else 0 (beta is not used)."),
    "ClipGradient": (YD, _clip_grad, {"min": Arg("float", None), "max": Arg("float", None)}, [(1, 0)],
                     "dY where min < Y < max (strictly), else 0."),
    "ReciprocalGradient": (YD, lambda xp, Y, dY: dY * -(Y * Y), None, [(1, 0)], "-dY * Y^2."),
    "RsqrtGradient": (("dY", "Y"), lambda xp, dY, Y: dY * (Y * Y * Y) * Y.dtype.type(-0.5), None, [(0, 0)],
                      "-0.5 * dY * Y^3."),
    "CbrtGradient": (("dY", "Y"), lambda xp, dY, Y: dY / (Y * Y) / Y.dtype.type(3), None, [(0, 0)],
                     "dY / (3 * Y^2)."),
    "SoftsignGradient": (XD, lambda xp, X, dY: dY / ((1 + xp.abs(X)) * (1 + xp.abs(X))), None, [(1, 0)],
                         "dY / (1 + |X|)^2."),
    "AbsGradient": (XD, _abs_grad, None, (), "dY where X > 0, -dY where X < 0, 0 at 0."),
    "SinGradient": (XD, lambda xp, X, dY: dY * xp.cos(X), None, (), "dY * cos(X)."),
    "CosGradient": (XD, lambda xp, X, dY: -dY * xp.sin(X), None, (), "-dY * sin(X)."),
    "LogitGradient": (XD, _logit_grad, {"eps": 1e-6}, (), "dY / (X (1 - X)) inside [eps, 1 - eps], else 0."),
    "ThresholdedReluGradient": (YD, lambda xp, Y, dY, alpha=1.0: dY * xp.sign(Y), {"alpha": 1.0}, [(1, 0)],
                                "dY * sign(Y), as Caffe2 computes it (so for a negative alpha, inputs in "
                                "(alpha, 0) pass -dY)."),
    "SwishGradient": (("X", "Y", "dY"), lambda xp, X, Y, dY: dY * (Y + _sigmoid(xp, X) * (1 - Y)), None,
                      [(2, 0)], "dY * (Y + sigmoid(X) * (1 - Y))."),
}
for _type, (_names, _fn, _args, _inplace, _doc) in _GRADIENTS.items():
    _register(_type, list(_names), _fn, _args, _inplace, _doc)


# --------------------------------------------------------------------------------------------- PRelu
def _prelu_grad_check(Y, dY, X, W, order):
    _check_same("PReluGradient", ["Y", "dY", "X"], [Y, dY, X])
    return prelu_view(X.shape, X.dtype, W.shape, W.dtype, order)


def _prelu_grad_shape(specs, order="NCHW"):
    _prelu_grad_check(*specs, order)
    return [like(specs[2]), like(specs[3])]


@op("PReluGradient", inputs=4, outputs=2, inplace=(), args={"order": "NCHW"}, shape=_prelu_grad_shape)
def prelu_gradient(xp, Y, dY, X, W, order="NCHW"):
    """Y, dY, X, Slope -> dX (dY where X > 0, else slope * dY) and dSlope (the sum of dY * X over X <= 0, per
    channel or over everything for a shared slope)."""
    view = _prelu_grad_check(Y, dY, X, W, order)
    w = W.reshape(()) if view is None else W.reshape(view)
    positive = X > 0
    dX = xp.where(positive, dY, dY * w)
    contrib = xp.where(positive, dY.dtype.type(0), dY * X)
    axes = tuple(range(X.ndim)) if view is None else tuple(i for i, d in enumerate(view) if d == 1)
    return dX, xp.sum(contrib, axis=axes, dtype=contrib.dtype, keepdims=True).reshape(W.shape)


# --------------------------------------------------------------------------------------------- SigmoidGradient
# Caffe2's SigmoidGradient read (Y, dY) from 2015 on (maker {O(0), GO(0)}, dX in place over dY = input 1). The
# sigmoid_op.cc of the mid-2018 rewrite onto elementwise functors (pytorch/pytorch, SigmoidGradientFunctor::
# Forward(dY_dims, Y_dims, dY, Y, dX)) swapped them: maker {GO(0), O(0)}, in place over input 0; training
# files written then hold SigmoidGradient(dY, Y). Later Caffe2 went back to (Y, dY). Both are 2-input ops of
# one shape, so the order is read from the net: the input written by a Sigmoid op is Y; else an input that
# dX overwrites is dY; else the input named <other>_grad... (or the only one with "_grad" in its name) is dY;
# else today's (Y, dY).
def sigmoid_gradient_order(net, index: int) -> tuple[int, int]:
    """(position of Y, position of dY) among the inputs of SigmoidGradient op #index of `net`."""
    op_ = net.op[index]
    a, b = op_.input[0], op_.input[1]
    graph = Graph.of(net)
    from_sigmoid = [j for j in (0, 1) if (w := graph.producer(index, j)) is not None
                    and net.op[w].type == "Sigmoid" and net.op[w].output[0] == op_.input[j]]
    if len(from_sigmoid) == 1:
        return (from_sigmoid[0], 1 - from_sigmoid[0])
    over = [j for j in (0, 1) if op_.output and op_.output[0] == op_.input[j]]
    if len(over) == 1:
        return (1 - over[0], over[0])
    if a.startswith(b + "_grad") != b.startswith(a + "_grad"):
        return (1, 0) if a.startswith(b + "_grad") else (0, 1)
    if ("_grad" in a) != ("_grad" in b):
        return (1, 0) if "_grad" in a else (0, 1)
    return (0, 1)


def _sigmoid_grad_shape(specs):
    _check_same("SigmoidGradient", ["input 0", "input 1"], specs)
    return [like(specs[0])]


@op("SigmoidGradient", inputs=2, outputs=1, inplace=[(0, 0), (1, 0)], context="structure", shape=_sigmoid_grad_shape,
    shapes_from_inputs=True)
def sigmoid_gradient(ctx, xp, first, second):
    """Y, dY (or the mid-2018 dY, Y: sigmoid_gradient_order tells them apart by the net) -> dY * Y * (1 - Y)."""
    _check_same("SigmoidGradient", ["input 0", "input 1"], [first, second])
    order = ctx.state.get("order")
    if order is None:
        order = ctx.state["order"] = sigmoid_gradient_order(ctx.net.netdef, ctx.index)
    Y, dY = (first, second) if order == (0, 1) else (second, first)
    return dY * Y * (1 - Y)
