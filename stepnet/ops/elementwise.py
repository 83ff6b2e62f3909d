"""Elementwise binary arithmetic, comparisons, logic, Pow, Max/Min and SumReduceLike.

Caffe2 has two broadcasting conventions, both kept here:
- legacy (`broadcast=1`): B is a scalar, or B's shape with leading/trailing size-1 dims removed equals a
  contiguous block of A's dims starting at `axis` (default -1 = align to A's end; `axis_str` names the axis
  by its letter in `order`). The result has A's shape.
- numpy (`broadcast` absent or 0, the pytorch/pytorch era): multidirectional numpy broadcasting.

The broadcast helpers below (`legacy_axis`, `broadcast_b_shape`, `broadcast_result_shape`,
`broadcast_operands`, `sum_to_shape`) are public: gradients reuse them, since a broadcast forward is a
sum-reduction backward.

Gradient makers follow the later Caffe2 (pytorch/pytorch elementwise_*_gradient_op.cc, pow_op.cc): Add, Sub,
Mul and Div emit one <Op>Gradient([dC, A, B]) -> [dA, dB] (DivGradient also reads C; kernels in
elementwise_grad.py), Pow builds its gradient out of other ops, Max/Min emit <Op>Gradient(Y, dY, X0, ...).
The comparisons, logical ops and Not are SHOULD_NOT_DO_GRADIENT (elementwise_ops_schema.cc); SumReduceLike
has no gradient registered.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, GradientError, ShapeError
from .base import BOOL, COMPARABLE, FLOAT, NUMERIC, check_dtypes, fold, like, not_in_place, out_spec, single_gradient
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op

Shape = tuple[int, ...]

# --------------------------------------------------------------------------------------------- broadcasting


def legacy_axis(axis: int = -1, axis_str: str = "", order: str = "NCHW") -> int:
    """The legacy broadcast axis: explicit `axis`, or the position of `axis_str` in `order`, or -1
    (suffix)."""
    if axis != -1:
        if axis_str:
            raise ArgumentError(f"arguments axis ({axis}) and axis_str ({axis_str!r}) cannot be used "
                                "together; give only one")
        return axis
    if not axis_str:
        return -1
    if len(axis_str) != 1 or axis_str not in order:
        raise ArgumentError(f"axis_str {axis_str!r} must be one letter of order {order!r} "
                            f"(e.g. 'C' for the channel axis)")
    return order.index(axis_str)


def _legacy_view(a_shape: Shape, b_shape: Shape, axis: int) -> Shape:
    """B's shape padded with 1s to A's rank so that numpy broadcasting applies Caffe2's legacy rule."""
    if int(np.prod(b_shape, dtype=np.int64)) == 1:
        return (1,) * len(a_shape)
    if len(b_shape) > len(a_shape):
        raise ShapeError(f"cannot broadcast B {b_shape} onto A {a_shape} (broadcast=1, axis={axis}): B has "
                         "more dims than A; with broadcast=1 B must be a scalar or a block of A's dims")
    start = len(a_shape) - len(b_shape) if axis == -1 else axis
    if not 0 <= start <= len(a_shape) - len(b_shape):
        raise ShapeError(f"cannot broadcast B {b_shape} onto A {a_shape}: axis {axis} is out of range "
                         f"[0, {len(a_shape) - len(b_shape)}] (A's rank minus B's rank)")
    first = 0
    while first < len(b_shape) and b_shape[first] == 1:
        first += 1
    last = len(b_shape) - 1
    while last >= first and b_shape[last] == 1:
        last -= 1
    view = [1] * len(a_shape)
    for j in range(first, last + 1):
        if a_shape[start + j] != b_shape[j]:
            block = tuple(a_shape[start + first:start + last + 1])
            raise ShapeError(f"cannot broadcast B {b_shape} onto A {a_shape} at axis {start} (broadcast=1): "
                             f"B's dims {tuple(b_shape[first:last + 1])} must equal A's dims {block} "
                             f"starting at axis {start + first}; set axis to where B's dims begin in A")
        view[start + j] = b_shape[j]
    return tuple(view)


def broadcast_result_shape(a_shape: Shape, b_shape: Shape, broadcast: bool = False, axis: int = -1,
                           axis_str: str = "", order: str = "NCHW") -> Shape:
    """The output shape of a binary elementwise op (A's shape under the legacy rule); ShapeError if none."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if broadcast:
        _legacy_view(a_shape, b_shape, legacy_axis(axis, axis_str, order))
        return a_shape
    ndim = max(len(a_shape), len(b_shape))
    pa, pb = (1,) * (ndim - len(a_shape)) + a_shape, (1,) * (ndim - len(b_shape)) + b_shape
    out = []
    for k, (da, db) in enumerate(zip(pa, pb, strict=True)):
        if da != db and da != 1 and db != 1:
            raise ShapeError(f"shapes A {a_shape} and B {b_shape} do not broadcast (numpy rule, "
                             f"broadcast=0): axis {k - ndim} has {da} vs {db}; for Caffe2's legacy alignment "
                             "pass broadcast=1 (with axis), or reshape B")
        out.append(0 if 0 in (da, db) else max(da, db))
    return tuple(out)


def broadcast_b_shape(a_shape: Shape, b_shape: Shape, broadcast: bool = False, axis: int = -1,
                      axis_str: str = "", order: str = "NCHW") -> Shape:
    """The shape to reshape B to so that plain numpy broadcasting of (A, B.reshape(it)) is Caffe2's rule.

    Legacy mode gives B's dims placed at `axis` among 1s (rank of A); numpy mode gives B's own shape.
    Raises ShapeError (naming both shapes and the axis) when the shapes do not fit.
    """
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if broadcast:
        return _legacy_view(a_shape, b_shape, legacy_axis(axis, axis_str, order))
    broadcast_result_shape(a_shape, b_shape)
    return b_shape


def broadcast_operands(a, b, broadcast: bool = False, axis: int = -1, axis_str: str = "",
                       order: str = "NCHW"):
    """(A, B viewed so that numpy broadcasting between them follows Caffe2's rule)."""
    view = broadcast_b_shape(a.shape, b.shape, broadcast, axis, axis_str, order)
    return a, (b if view == b.shape else b.reshape(view))


def sum_to_shape_axes(grad_shape: Shape, shape: Shape, broadcast: bool = False, axis: int = -1,
                      axis_str: str = "", order: str = "NCHW") -> tuple[int, ...] | None:
    """The axes of grad_shape that sum_to_shape sums over (None when the shapes are equal); ShapeError when
    `shape` cannot be a broadcast source of grad_shape. Shared by the kernel and static shape inference."""
    shape, grad_shape = tuple(shape), tuple(grad_shape)
    if shape == grad_shape:
        return None
    view = broadcast_b_shape(grad_shape, shape, broadcast, axis, axis_str, order) if broadcast else shape
    lead = len(grad_shape) - len(view)
    if lead < 0:
        raise ShapeError(f"cannot sum-reduce {grad_shape} to {shape}: the target has more dims")
    for i, d in enumerate(view):
        if d != 1 and grad_shape[lead + i] != d:
            raise ShapeError(f"cannot sum-reduce {grad_shape} to {shape}: axis {lead + i} has "
                             f"{grad_shape[lead + i]} vs {d}")
    return tuple(range(lead)) + tuple(lead + i for i, d in enumerate(view)
                                      if d == 1 and grad_shape[lead + i] != 1)


def sum_to_shape(xp, grad, shape: Shape, broadcast: bool = False, axis: int = -1, axis_str: str = "",
                 order: str = "NCHW"):
    """Sum a broadcast result `grad` back down to an input's `shape` (a fresh array of grad's dtype).

    With broadcast=1 the legacy placement of `shape` inside grad's shape (axis/axis_str/order) decides which
    dims are summed, as Caffe2's SumReduceLike does; otherwise numpy's alignment from the end.
    """
    axes = sum_to_shape_axes(grad.shape, shape, broadcast, axis, axis_str, order)
    if axes is None:
        return grad.copy()
    out = xp.sum(grad, axis=axes, dtype=grad.dtype, keepdims=True) if axes else grad.copy()
    return out.reshape(tuple(shape))


# --------------------------------------------------------------------------------------------- binary ops
BROADCAST_ARGS = {"broadcast": False, "axis": -1, "axis_str": "", "order": "NCHW"}
_ARITH_DOC = ("A, B -> C. broadcast=1: legacy rule (B scalar or a block of A's dims at axis; C has A's "
              "shape); otherwise numpy broadcasting.")


def _ufunc(name):
    """fn(xp, a, b) calling the array module's ufunc `name`."""
    def fn(xp, a, b):
        return getattr(xp, name)(a, b)
    return fn


def _register_binary(type_, fn, allowed, inplace, doc, gradient, what="A and B", out_dtype=None):
    def kernel(xp, a, b, broadcast=False, axis=-1, axis_str="", order="NCHW"):
        check_dtypes((a, b), allowed, what)
        a, b = broadcast_operands(a, b, broadcast, axis, axis_str, order)
        return fn(xp, a, b)

    def shape(specs, **args):
        a, b = specs
        check_dtypes(specs, allowed, what)
        dims = broadcast_result_shape(a.shape, b.shape, **args)
        return [out_spec(dims, out_dtype or a.dtype, fold(kernel, specs, **args))]

    kernel.__name__ = kernel.__qualname__ = type_.lower()
    op(type_, inputs=2, outputs=1, args=dict(BROADCAST_ARGS), inplace=inplace, shape=shape, gradient=gradient,
       doc=doc, shapes_from_inputs=True, grows="shapes")(kernel)


def _divide(xp, a, b):
    """Float division, or C++ integer division (truncation toward zero) for int dtypes."""
    if a.dtype.kind == "f":
        with np.errstate(divide="ignore", invalid="ignore"):
            return xp.true_divide(a, b)
    with np.errstate(divide="ignore"):
        q = xp.floor_divide(a, b)
        r = xp.remainder(a, b)
    fix = (r != 0) & ((a < 0) != (b < 0))
    return (q + fix.astype(q.dtype)).astype(a.dtype)


# <Op>Gradient([dC, A, B]) -> [dA, dB]. Add and Sub read A and B only for their shapes, which in-place use keeps
# (so does DivGradient for A); MulGradient reads their values.
_AB = (["GO0", "I0", "I1"], ["GI0", "GI1"])
_ARITH = {"Add": (_ufunc("add"), [(0, 0), (1, 0)], single_gradient("AddGradient", *_AB)),
          "Sub": (_ufunc("subtract"), [(0, 0), (1, 0)], single_gradient("SubGradient", *_AB)),
          "Mul": (_ufunc("multiply"), [(0, 0), (1, 0)], single_gradient("MulGradient", *_AB, reads_inputs=True)),
          "Div": (_divide, [(0, 0)], single_gradient("DivGradient", ["GO0", "I0", "I1", "O0"], ["GI0", "GI1"]))}
for _name, (_fn, _inplace, _maker) in _ARITH.items():
    _register_binary(_name, _fn, NUMERIC, _inplace, f"Elementwise {_name}. {_ARITH_DOC}", _maker)

_COMPARE = {"EQ": "equal", "NE": "not_equal", "LT": "less", "LE": "less_equal", "GT": "greater",
            "GE": "greater_equal"}
for _name, _uname in _COMPARE.items():
    _register_binary(_name, _ufunc(_uname), COMPARABLE, (),
                     f"Elementwise comparison {_name} with bool output. {_ARITH_DOC}", SHOULD_NOT_DO_GRADIENT,
                     out_dtype=np.bool_)

_LOGIC = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}
for _name, _uname in _LOGIC.items():
    _register_binary(_name, _ufunc(_uname), BOOL, [(0, 0)],
                     f"Elementwise logical {_name} of two bool tensors. {_ARITH_DOC}", SHOULD_NOT_DO_GRADIENT,
                     what="And/Or/Xor inputs")


def _not_shape(specs):
    check_dtypes(specs, BOOL, "the input of Not")
    return [out_spec(specs[0].shape, np.bool_, fold(not_, specs))]


@op("Not", inputs=1, outputs=1, inplace=(), shape=_not_shape, gradient=SHOULD_NOT_DO_GRADIENT, shapes_from_inputs=True)
def not_(xp, x):
    """Elementwise logical negation of a bool tensor."""
    check_dtypes((x,), BOOL, "the input of Not")
    return xp.logical_not(x)


# --------------------------------------------------------------------------------------------- Pow, Max, Min
def _check_pow(x, e, exponent) -> None:
    if e is None:
        check_dtypes((x,), FLOAT, "the input of Pow")
        if exponent is None:
            raise ArgumentError("Pow with one input needs the 'exponent' argument (or give the exponent as a "
                                "second input)")
    else:
        check_dtypes((x, e), FLOAT, "X and exponent")


def _pow_shape(specs, exponent=None, **args):
    x = specs[0]
    _check_pow(x, specs[1] if len(specs) > 1 else None, exponent)
    if len(specs) == 1:
        return [like(x)]
    return [out_spec(broadcast_result_shape(x.shape, specs[1].shape, **args), x.dtype)]


def _pow_gradient(g):
    """Caffe2's GetPowGradient (pow_op.cc): built from Pow, Mul, Scale (and ConstantFill, Sub, Log,
    SumReduceLike for a tensor exponent), forward arguments not copied. Intermediate values get their own blob
    names, and only the last op writes each input gradient, so gradient accumulation may rename it safely."""
    exponent = g.arg("exponent")
    if exponent is not None:
        e = float(exponent)
        if g.I(0) != g.O(0):
            power = e - 1.0
        elif abs(e) > 1e-12:
            power = (e - 1.0) / e  # in place: only Y = X**e is left, and Y**((e-1)/e) = X**(e-1)
        else:
            raise GradientError(f"in-place Pow with exponent {e} cannot be differentiated (X is "
                                "lost); give the output another name", at=g.label)
        pre = g.I(0) + "_grad_autogen_pre"
        g.op("Pow", [g.I(0)], [pre], copy_args=False, exponent=power)
        g.op("Mul", [pre, g.GO(0)], [pre], copy_args=False)
        g.op("Scale", [pre], [g.GI(0)], copy_args=False, scale=e)
        return
    if g.O(0) in (g.I(0), g.I(1)):
        raise GradientError(f"Pow with a tensor exponent cannot be differentiated in place "
                            f"(output {g.O(0)!r} overwrites an input); give the output another name", at=g.label)
    bargs = {}
    if g.arg("broadcast") is not None:
        bargs = {"broadcast": g.arg("broadcast"), "axis": g.arg("axis", -1),
                 "axis_str": g.arg("axis_str", ""), "order": g.arg("order", "NCHW")}
    x, e, y, dy = g.I(0), g.I(1), g.O(0), g.GO(0)
    e_minus_1, de_pre = e + "_grad_autogen_e_minus_1", e + "_grad_autogen_pre_red"
    dx_pre = x + "_grad_autogen_pre"
    g.op("ConstantFill", [e], [e_minus_1], copy_args=False, value=1.0)
    g.op("Sub", [e, e_minus_1], [e_minus_1], copy_args=False)
    g.op("Pow", [x, e_minus_1], [dx_pre], copy_args=False, **bargs)   # dY/dX = e * X**(e-1)
    g.op("Mul", [dx_pre, dy], [dx_pre], copy_args=False)
    g.op("Mul", [dx_pre, e], [g.GI(0)], copy_args=False, **bargs)
    g.op("Log", [x], [de_pre], copy_args=False)                      # dY/de = Y * log(X)
    g.op("Mul", [de_pre, y], [de_pre], copy_args=False)
    if bargs:
        g.op("Mul", [de_pre, dy], [de_pre], copy_args=False)
        g.op("SumReduceLike", [de_pre, e], [g.GI(1)], copy_args=False,
             **{k: v for k, v in bargs.items() if k != "broadcast"})
    else:
        g.op("Mul", [de_pre, dy], [g.GI(1)], copy_args=False)


@op("Pow", inputs=(1, 2), outputs=1, inplace=[(0, 0), (1, 0)],
    args={"exponent": Arg("float", None), **BROADCAST_ARGS}, shape=_pow_shape, gradient=_pow_gradient, grows="shapes")
def pow_(xp, x, e=None, exponent=None, broadcast=False, axis=-1, axis_str="", order="NCHW"):
    """X ** exponent, with the exponent from the `exponent` argument (one input) or a second input
    (broadcast like Add)."""
    _check_pow(x, e, exponent)
    if e is None:
        with np.errstate(divide="ignore", invalid="ignore"):
            return xp.power(x, x.dtype.type(exponent))
    x, e = broadcast_operands(x, e, broadcast, axis, axis_str, order)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return xp.power(x, e)


def _select(type_, ufunc):
    def check(xs):
        check_dtypes(xs, NUMERIC, f"the inputs of {type_}")
        for i, x in enumerate(xs[1:], 1):
            if tuple(x.shape) != tuple(xs[0].shape):
                raise ShapeError(f"input {i} has shape {tuple(x.shape)} but input 0 has "
                                 f"{tuple(xs[0].shape)}; {type_} needs all inputs of one shape")

    def kernel(xp, *xs):
        check(xs)
        out = xs[0].copy()
        for x in xs[1:]:
            out = getattr(xp, ufunc)(out, x)
        return out

    def shape(specs):
        check(specs)
        return [out_spec(specs[0].shape, specs[0].dtype, fold(kernel, specs))]

    def maker(g):
        not_in_place(g, range(g.n_inputs))
        g.op(f"{type_}Gradient", [g.O(0), g.GO(0), *(g.I(i) for i in range(g.n_inputs))],
             [g.GI(i) for i in range(g.n_inputs)])

    kernel.__name__ = kernel.__qualname__ = type_.lower()
    op(type_, inputs=(1, None), outputs=1, inplace=[(0, 0)], shape=shape, gradient=maker,
       doc=f"Elementwise {type_.lower()} over any number of same-shaped inputs (NaN propagates).")(kernel)


_select("Max", "maximum")
_select("Min", "minimum")


# --------------------------------------------------------------------------------------------- SumReduceLike


def _sum_reduce_like_shape(specs, broadcast=False, **args):
    a, b = specs
    check_dtypes((a,), FLOAT, "A")
    sum_to_shape_axes(a.shape, b.shape, True, **args)
    return [out_spec(b.shape, a.dtype)]


# `broadcast` is accepted and ignored: the 2017-18 gradient of a broadcast Add copied all of Add's arguments
# onto its SumReduceLike, and Caffe2 ignores arguments an op does not read.
@op("SumReduceLike", inputs=2, outputs=1, inplace=(),
    args={"axis": -1, "axis_str": "", "order": "NCHW", "broadcast": False}, shape=_sum_reduce_like_shape,
    shapes_from_inputs=True)
def sum_reduce_like(xp, a, b, axis=-1, axis_str="", order="NCHW", broadcast=False):
    """A, B -> A summed down to B's shape, B placed in A by the legacy broadcast rule (the legacy gradient
    helper of broadcast Add/Sub/Mul)."""
    check_dtypes((a,), FLOAT, "A")
    return sum_to_shape(xp, a, b.shape, True, axis, axis_str, order)
