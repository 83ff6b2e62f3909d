"""Sums, weighted sums, scaling, ElementwiseLinear and Cast (Caffe2's utility_ops, scale_op,
elementwise_linear_op and cast_op), with their gradient makers; the gradient kernels are in math_grad.py."""
from __future__ import annotations

import functools

import numpy as np

from ..core.errors import ArgumentError, ArityError, DTypeError, GradientError, ShapeError
from ..io.proto import NUMPY_OF, DataType
from .base import check_float, fold, like, out_spec, size_of
from .math import view2d, view2d_shape
from .registry import Arg, op

_SUM_DTYPES = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64))
_INT_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


# --------------------------------------------------------------------------------------------- sums
def _check_sum(op_type, inputs, allowed) -> None:
    """Sum's checks on arrays or TensorSpecs: one dtype from `allowed`, one shape."""
    X0 = inputs[0]
    if X0.dtype is not None and X0.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise DTypeError(f"{op_type} supports {names}, but input 0 is {X0.dtype}")
    for i, x in enumerate(inputs[1:], 1):
        if x.dtype is not None and X0.dtype is not None and x.dtype != X0.dtype:
            raise DTypeError(f"{op_type} needs inputs of one dtype: input 0 is {X0.dtype} but input {i} is "
                             f"{x.dtype}; Cast them to the same type")
        if tuple(x.shape) != tuple(X0.shape):
            raise ShapeError(f"{op_type} does not broadcast: input {i} has shape {tuple(x.shape)} but "
                             f"input 0 has {tuple(X0.shape)}; give every input the same shape (or use Add "
                             "with broadcast=1)")


def _sum(xp, op_type, inputs, allowed):
    _check_sum(op_type, inputs, allowed)
    out = inputs[0].copy()
    for x in inputs[1:]:
        out += x
    return out


def writable_alone(x0, rest) -> bool:
    """Whether input 0 may be updated in place: writeable and not also one of the other inputs."""
    if not getattr(getattr(x0, "flags", None), "writeable", True):
        return False
    return not any(r is x0 or (getattr(r, "base", None) is not None and r.base is getattr(x0, "base", x0))
                   for r in rest)


def _sum_into(op_type, allowed):
    def kernel(xp, *inputs):
        """Sum written into input 0 (the op's output is input 0, as Caffe2's in-place Sum does)."""
        if not writable_alone(inputs[0], inputs[1:]):
            return _sum(xp, op_type, inputs, allowed)
        _check_sum(op_type, inputs, allowed)
        out = inputs[0]
        for x in inputs[1:]:
            out += x
        return out
    return kernel


def _sum_shape(op_type, allowed):
    def shape(specs):
        _check_sum(op_type, specs, allowed)
        value = fold(lambda xp, *xs: _sum(xp, op_type, xs, allowed), specs)
        return [out_spec(specs[0].shape, specs[0].dtype, value)]
    return shape


def _sum_gradient(g):
    """Every input's gradient is the output's, passed through with no op (GetSumGradient)."""
    for i in range(g.n_inputs):
        g.set_dense(i, g.GO(0))


@op("Sum", inputs=(1, None), inplace=[(0, 0)], shape=_sum_shape("Sum", _SUM_DTYPES), gradient=_sum_gradient,
    inplace_kernel=_sum_into("Sum", _SUM_DTYPES))
def sum_(xp, *inputs):
    """Elementwise sum of any number of same-shape, same-dtype tensors (one input: a copy)."""
    return _sum(xp, "Sum", inputs, _SUM_DTYPES)


@op("SumInt", inputs=(1, None), inplace=[(0, 0)], shape=_sum_shape("SumInt", _INT_DTYPES), shapes_from_inputs=True)
def sum_int(xp, *inputs):
    """Sum for integer tensors."""
    return _sum(xp, "SumInt", inputs, _INT_DTYPES)


def _check_weighted_sum(inputs) -> None:
    """WeightedSum's checks on arrays or TensorSpecs."""
    if len(inputs) % 2:
        raise ArityError(f"WeightedSum takes pairs (X0, w0, X1, w1, ...), got {len(inputs)} inputs")
    X0 = inputs[0]
    check_float("WeightedSum", X0=X0)
    for k in range(0, len(inputs), 2):
        x, w = inputs[k], inputs[k + 1]
        if size_of(w) != 1:
            raise ShapeError(f"WeightedSum: weight w{k // 2} (input {k + 1}) must hold 1 element, got "
                             f"{tuple(w.shape)}")
        if size_of(x) != size_of(X0):
            raise ShapeError(f"WeightedSum: X{k // 2} {tuple(x.shape)} must have as many elements as X0 "
                             f"{tuple(X0.shape)}")
        if x.dtype is not None and X0.dtype is not None and x.dtype != X0.dtype:
            raise DTypeError(f"WeightedSum: X{k // 2} is {x.dtype} but X0 is {X0.dtype}; Cast them to one "
                             "type")


def _weighted_sum_shape(specs, grad_on_w=False):
    _check_weighted_sum(specs)
    return [like(specs[0])]


def _weighted_sum_gradient(g):
    """WeightedSumGradient(dY, X0, w0, X1, w1, ...) -> (dX0, dX1, ..., then dw0, dw1, ... with grad_on_w)."""
    pairs = range(0, g.n_inputs, 2)
    outputs = [g.GI(i) for i in pairs]
    if g.arg("grad_on_w", 0):
        outputs += [g.GI(i + 1) for i in pairs]
    g.op("WeightedSumGradient", [g.GO(0), *g.def_.input], outputs)


def _weighted_sum_into(xp, *inputs, grad_on_w=False):
    """WeightedSum written into X0 (output 0 is input 0, e.g. the SGD update param += lr·grad)."""
    X0 = inputs[0]
    if not writable_alone(X0, inputs[2::2]) or X0.ndim == 0:
        return weighted_sum(xp, *inputs, grad_on_w=grad_on_w)
    _check_weighted_sum(inputs)
    return weighted_sum_in_place(xp, X0, inputs)


def weighted_sum_in_place(xp, X0, inputs, scratch=None):
    """X0 ← w0·X0 + Σ w_i·X_i over inputs (X0, w0, X1, w1, ...), in X0 (w0 = 1 leaves X0 as it is first):
    WeightedSum's arithmetic written into X0, its compiled form's too. scratch: an array of X0's shape and
    dtype for the products (new ones when None); the same roundings either way."""
    w0 = inputs[1].reshape(()).astype(X0.dtype)
    if float(w0) != 1.0:
        X0 *= w0
    for k in range(2, len(inputs), 2):
        w = xp.asarray(inputs[k + 1]).reshape(()).astype(X0.dtype)
        if scratch is None:
            X0 += inputs[k].reshape(X0.shape) * w
        else:
            xp.multiply(inputs[k].reshape(X0.shape), w, out=scratch)
            X0 += scratch
    return X0


@op("WeightedSum", inputs=(2, None), args={"grad_on_w": False}, inplace=[(0, 0)], shape=_weighted_sum_shape,
    gradient=_weighted_sum_gradient, inplace_kernel=_weighted_sum_into, shapes_from_inputs=True)
def weighted_sum(xp, *inputs, grad_on_w=False):
    """Y = Σ w_i·X_i over pairs X0, w0, X1, w1, ...; each w_i holds one number, each X_i as many elements as
    X0 (Caffe2 compares sizes, not shapes). grad_on_w only tells the gradient to also produce dw_i."""
    _check_weighted_sum(inputs)
    X0 = inputs[0]
    out = None
    for k in range(0, len(inputs), 2):
        x, w = inputs[k], inputs[k + 1]
        term = x.reshape(X0.shape) * xp.asarray(w).reshape(()).astype(X0.dtype)
        out = term if out is None else out + term
    return xp.asarray(out)  # numpy gives a scalar for 0-D inputs


def _scale_shape(specs, scale=1.0):
    check_float("Scale", X=specs[0])
    return [like(specs[0])]


def _scale_gradient(g):
    """Scale(dY) -> dX with the forward `scale` copied."""
    g.op("Scale", [g.GO(0)], [g.GI(0)])


@op("Scale", args={"scale": 1.0}, inplace=[(0, 0)], shape=_scale_shape, gradient=_scale_gradient,
    shapes_from_inputs=True)
def scale(xp, X, scale=1.0):
    """Y = scale · X."""
    check_float("Scale", X=X)
    return xp.asarray(X * X.dtype.type(scale))  # numpy gives a scalar for 0-D inputs


def _check_elementwise_linear(X, a, b, axis) -> None:
    """ElementwiseLinear's checks on arrays or TensorSpecs."""
    check_float("ElementwiseLinear", X=X, a=a, b=b)
    _, D, _ = view2d_shape(tuple(X.shape), axis)
    for name, v in (("a", a), ("b", b)):
        if len(v.shape) != 1 or v.shape[0] != D:
            raise ShapeError(f"ElementwiseLinear: X {tuple(X.shape)} at axis={axis} has D = {D} columns, so "
                             f"{name} must be 1-D of length {D}, got {name} {tuple(v.shape)}")


def _elementwise_linear_shape(specs, axis=1):
    _check_elementwise_linear(*specs, axis)
    return [like(specs[0])]


def _elementwise_linear_gradient(g):
    g.op("ElementwiseLinearGradient", [g.GO(0), g.I(0), g.I(1)], [g.GI(0), g.GI(1), g.GI(2)])


@op("ElementwiseLinear", inputs=3, args={"axis": 1}, inplace=(), shape=_elementwise_linear_shape,
    gradient=_elementwise_linear_gradient, shapes_from_inputs=True)
def elementwise_linear(xp, X, a, b, axis=1):
    """Y = X ⊙ a + b on X's 2-D view N x D at axis, with a and b 1-D of length D (per-column scale and
    shift)."""
    _check_elementwise_linear(X, a, b, axis)
    X2, _ = view2d(X, axis)
    return (X2 * a + b).reshape(X.shape)


# --------------------------------------------------------------------------------------------- Cast
_NO_CAST = {DataType.UNDEFINED: "UNDEFINED is not a type", DataType.BYTE: "BYTE is deprecated (use UINT8)",
            DataType.STRING: "casts to and from strings are not supported"}


def cast_dtype(value, name: str = "to") -> np.dtype:
    """The numpy dtype of a Cast type argument: a TensorProto.DataType number or its name in any case."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ArgumentError(f"Cast: argument {name!r} must be a DataType number or name, got {value!r}")
    return _cast_dtype(value, name)


@functools.cache
def _cast_dtype(value, name):
    if isinstance(value, str):
        try:
            code = DataType.Value(value.upper())
        except ValueError:
            valid = ", ".join(n for n, v in DataType.items() if v in NUMPY_OF and v not in _NO_CAST)
            raise ArgumentError(f"Cast: unknown {name}={value!r}; use one of {valid} (any case)") from None
    else:
        code = value
    if code in _NO_CAST:
        raise ArgumentError(f"Cast: {name}={value!r}: {_NO_CAST[code]}")
    if code not in NUMPY_OF:
        raise ArgumentError(f"Cast: {name}={value!r} is not a castable TensorProto.DataType")
    return np.dtype(NUMPY_OF[code])


def _cast_check(X, to, from_type) -> np.dtype:
    """Cast's checks on an array or a TensorSpec; the output dtype."""
    dtype = cast_dtype(to, "to")
    if from_type is not None:
        cast_dtype(from_type, "from_type")
    if X.dtype is not None and X.dtype.kind not in "biuf":
        raise DTypeError(f"Cast: cannot cast from {X.dtype}; casting from strings is not supported")
    return dtype


def _cast_shape(specs, to, from_type=None):
    dtype = _cast_check(specs[0], to, from_type)
    return [out_spec(specs[0].shape, dtype, fold(cast, specs, to=to))]


def cast_code(value, name: str = "to") -> int:
    """The TensorProto.DataType number of a valid Cast type argument (a number, or a name in any case)."""
    cast_dtype(value, name)
    return value if isinstance(value, int) else DataType.Value(value.upper())


def _cast_gradient(g):
    """Cast(dY) -> dX casting back: `to` and `from_type` swapped, as DataType numbers, no other args. Like
    Caffe2, this needs the forward op's from_type."""
    from_type = g.arg("from_type")
    if from_type is None or isinstance(from_type, list):
        raise GradientError("the gradient of Cast needs the argument 'from_type' (the input's "
                            "DataType, number or name) on the forward op, as in Caffe2; add it to the Cast", at=g.label)
    to = cast_code(g.arg("to"), "to")
    g.op("Cast", [g.GO(0)], [g.GI(0)], copy_args=False, to=cast_code(from_type, "from_type"), from_type=to)


@op("Cast", args={"to": Arg("any"), "from_type": Arg("any", None)}, inplace=(), shape=_cast_shape,
    gradient=_cast_gradient, shapes_from_inputs=True)
def cast(xp, X, to, from_type=None):
    """Elementwise static_cast to the type `to` (number, or name such as "float", "INT64"); a cast to bool is
    x != 0. `from_type` names the source type for the gradient only (it is checked, not used)."""
    return X.astype(_cast_check(X, to, from_type))
