"""Gradient ops of the elementwise family: Add/Sub/Mul/DivGradient and Max/MinGradient (their makers, and
Pow's, are in elementwise.py next to the forward ops).

Add/Sub/Mul/Div follow the later Caffe2 (pytorch/pytorch elementwise_*_gradient_op.cc): one gradient op
<Op>Gradient([dC, A, B]) -> [dA, dB] (DivGradient also reads C) that carries the forward's broadcast arguments
and sum-reduces each gradient to its input's shape, under either broadcasting convention. The 2017-18 makers
(SumReduceLike, Negative, Mul, DivGradient([B, C, dC])) emitted ops that all run here too, so old training
nets work unchanged.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ShapeError
from .base import NUMERIC, check_dtypes, out_spec
from .elementwise import BROADCAST_ARGS, broadcast_operands, broadcast_result_shape, sum_to_shape
from .registry import op



# ------------------------------------------------------------------------------------------ Add/Sub/Mul/Div
def _check_dc(type_, dc_shape, a_shape, b_shape, args) -> None:
    want = broadcast_result_shape(a_shape, b_shape, **args)
    if tuple(dc_shape) != tuple(want):
        raise ShapeError(f"{type_}: dC has shape {tuple(dc_shape)} but A {tuple(a_shape)} and B "
                         f"{tuple(b_shape)} give C the shape {tuple(want)}; pass the gradient of this op's "
                         "output and the same broadcast arguments as the forward op")


def _binary_backward(xp, type_, dc, a, b, c, args):
    """(dA, dB) of C = A op B: the elementwise derivative, summed back to each input's shape."""
    check_dtypes((dc, a, b) if c is None else (dc, a, b, c), NUMERIC, f"the inputs of {type_}")
    _check_dc(type_, dc.shape, a.shape, b.shape, args)
    _, bv = broadcast_operands(a, b, **args)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if type_ == "AddGradient":
            ga, gb = dc, dc
        elif type_ == "SubGradient":
            ga, gb = dc, xp.negative(dc)
        elif type_ == "MulGradient":
            ga, gb = dc * bv, dc * a
        else:
            ga, gb = dc / bv, xp.negative(dc) * c / bv
    return sum_to_shape(xp, ga, a.shape), sum_to_shape(xp, gb, b.shape, **args)


def _arith_grad_shape(type_):
    def shape(specs, **args):
        dc, a, b = specs
        check_dtypes(specs, NUMERIC, f"the inputs of {type_}")
        _check_dc(type_, dc.shape, a.shape, b.shape, args)
        return [out_spec(a.shape, dc.dtype), out_spec(b.shape, dc.dtype)]
    return shape


def _register_arith_gradient(type_):
    def kernel(xp, dc, a, b, broadcast=False, axis=-1, axis_str="", order="NCHW"):
        args = dict(broadcast=broadcast, axis=axis, axis_str=axis_str, order=order)
        return _binary_backward(xp, type_, dc, a, b, None, args)

    kernel.__name__ = kernel.__qualname__ = type_.lower()
    op(type_, inputs=3, outputs=2, args=dict(BROADCAST_ARGS), inplace=[(0, 0), (0, 1)],
       shape=_arith_grad_shape(type_), shapes_from_inputs=True,
       doc=f"dC, A, B -> dA, dB for {type_[:-8]}: the derivatives summed back to A's and B's shapes "
           "(legacy broadcast=1/axis or numpy broadcasting, as the forward op).")(kernel)


for _name in ("AddGradient", "SubGradient", "MulGradient"):
    _register_arith_gradient(_name)


def _div_operands(ins):
    """(dC, A-or-None, B, C, A's shape) from DivGradient's [dC, A, B, C] or the 2017 [B, C, dC]."""
    if len(ins) == 3:
        b, c, dc = ins
        return dc, None, b, c, tuple(c.shape)
    dc, a, b, c = ins
    return dc, a, b, c, tuple(a.shape)


def _div_grad_shape(specs, **args):
    dc, _, b, c, a_shape = _div_operands(specs)
    check_dtypes((dc, b, c), NUMERIC, "the inputs of DivGradient")
    _check_dc("DivGradient", dc.shape, a_shape, b.shape, args)
    if tuple(c.shape) != tuple(dc.shape):
        raise ShapeError(f"DivGradient: C has shape {tuple(c.shape)} but dC has {tuple(dc.shape)}; they must "
                         "match (C is the forward output)")
    return [out_spec(a_shape, dc.dtype), out_spec(b.shape, dc.dtype)]


@op("DivGradient", inputs=(3, 4), outputs=2, args=dict(BROADCAST_ARGS), inplace=[(0, 0)],
    shape=_div_grad_shape)
def div_gradient(xp, *ins, broadcast=False, axis=-1, axis_str="", order="NCHW"):
    """dC, A, B, C -> dA = dC / B, dB = -dC * C / B, each summed to its input's shape. The 2017 form
    B, C, dC (no A) is accepted too; dA then takes C's shape."""
    args = dict(broadcast=broadcast, axis=axis, axis_str=axis_str, order=order)
    _div_grad_shape([*ins], **args)
    dc, a, b, c, _ = _div_operands(ins)
    return _binary_backward(xp, "DivGradient", dc, c if a is None else a, b, c, args)


# --------------------------------------------------------------------------------------------- Max, Min
def _select_grad_shape(type_):
    def shape(specs):
        y, dy, *xs = specs
        check_dtypes(specs, NUMERIC, f"the inputs of {type_}")
        for name, s in (("dY", dy), *((f"X{i}", x) for i, x in enumerate(xs))):
            if tuple(s.shape) != tuple(y.shape):
                raise ShapeError(f"{type_}: {name} has shape {tuple(s.shape)} but Y has {tuple(y.shape)}; "
                                 "Max and Min take inputs of one shape")
        return [out_spec(x.shape, dy.dtype) for x in xs]
    return shape


def _register_select_gradient(type_, forward):
    check = _select_grad_shape(type_)

    def kernel(xp, y, dy, *xs):
        check([y, dy, *xs])
        return tuple(xp.where(x == y, dy, dy.dtype.type(0)) for x in xs)

    kernel.__name__ = kernel.__qualname__ = type_.lower()
    op(type_, inputs=(3, None), outputs=(1, None), inplace=(), shape=check,
       doc=f"Y, dY, X0, X1, ... -> dX0, dX1, ...: dY where Xi equals the {forward} Y, else 0 (every input "
           "tied with the result gets the full gradient, as in Caffe2).")(kernel)


_register_select_gradient("MaxGradient", "Max")
_register_select_gradient("MinGradient", "Min")
