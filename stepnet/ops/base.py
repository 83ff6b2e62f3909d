"""The vocabulary every op family shares: static-spec helpers, dtype groups and checks, and what a gradient
maker sees (GradientContext, GradientSlice) with a declarative maker for the common one-op case.

Nothing here registers an op, and this module imports no family, so any family (and its gradient makers)
can import it.
"""
from __future__ import annotations

import math
import re
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..core.errors import ArgumentError, DTypeError, GradientError
from ..io.proto import OperatorDef, argument_value, make_argument
from ..core.spec import SMALL_VALUE, TensorSpec


# --------------------------------------------------------------------------------------------- static specs
def check_int_dtype(dtype, what: str) -> None:
    if dtype is not None and np.dtype(dtype).kind not in "iu":
        raise DTypeError(f"{what} must hold integers (int32/int64), got {dtype}")


def host_ints(x, what: str) -> list[int]:
    """The values of a small integer tensor (on any device) as Python ints: shapes, sizes, starts/ends."""
    check_int_dtype(x.dtype, what)
    return [int(v) for v in x.reshape(-1).tolist()]


def known_ints(s, what: str) -> list[int] | None:
    """host_ints for a TensorSpec: the values it carries, or None when they are not known statically."""
    check_int_dtype(s.dtype, what)
    return None if s.value is None else [int(v) for v in np.asarray(s.value).reshape(-1).tolist()]


def canonical_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """axis in [0, ndim), counting negative values from the end as Caffe2's canonical_axis_index does."""
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"{what}={axis} is out of range for a {ndim}-D tensor "
                            f"(valid: {-ndim}..{ndim - 1})")
    return axis + ndim if axis < 0 else axis


def on_device(xp, values, dtype):
    """A small host-computed array (sizes, shapes) moved to the op's device."""
    return xp.asarray(np.asarray(values, dtype=dtype))


def held_object(value, cls: type, i: int, noun: str, maker: str):
    """value when it is a `cls` (a blob holding an object, not a tensor, that `maker` makes), else a DTypeError
    saying what input i holds instead."""
    if not isinstance(value, cls):
        what = "nothing (never written)" if value is None else (
            f"a tensor {value}" if isinstance(value, TensorSpec) else type(value).__name__)
        raise DTypeError(f"input {i} must be {noun} made by {maker}, got {what}")
    return value


def out_spec(shape, dtype, value=None) -> TensorSpec:
    """An output TensorSpec: None dims stand for sizes that depend on unknown input values, dtype may be
    unknown (None); a value is kept only for small integer tensors, as TensorSpec.of does."""
    dt = None if dtype is None else np.dtype(dtype)
    if value is not None:
        value = np.asarray(value, dtype=dt)
        if dt is None or dt.kind not in "iub" or value.size > SMALL_VALUE:
            value = None
    return TensorSpec(tuple(None if d is None else int(d) for d in shape), dt, value)


def like(s: TensorSpec, dtype=False) -> TensorSpec:
    """s's shape and dtype (or the given dtype), without its value: for ops that keep the shape only."""
    return out_spec(s.shape, s.dtype if dtype is False else dtype)


def result_dtype(*dtypes):
    """numpy's promotion of the known dtypes (None if one is unknown)."""
    return None if any(d is None for d in dtypes) else np.result_type(*dtypes)


class Meta:
    """A shape-only stand-in for an array (shape, dtype, ndim, size) so the kernels' check helpers, written
    for arrays, run on TensorSpecs too."""
    __slots__ = ("shape", "dtype")

    def __init__(self, s):
        self.shape, self.dtype = tuple(s.shape), s.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def _small_int(s) -> bool:
    return (s is not None and s.shape is not None and None not in s.shape and s.dtype is not None
            and s.dtype.kind in "iub" and math.prod(s.shape) <= SMALL_VALUE)


def folding(shape_fn, kernel):
    """shape_fn plus constant folding: when every input carries its value, small integer outputs get theirs
    by running the kernel on the host (so Shape -> Slice/Gather -> Concat -> Reshape chains resolve before
    anything runs). `kernel` is a zero-argument callable returning the kernel (it is defined after the
    decorator that names this function)."""
    def shape(specs, **args):
        outs = list(shape_fn(specs, **args))
        if not specs or any(s.value is None for s in specs) or not any(map(_small_int, outs)):
            return outs
        got = kernel()(np, *(np.asarray(s.value) for s in specs), **args)
        got = got if isinstance(got, tuple) else (got,)
        return [out_spec(o.shape, o.dtype, g) if _small_int(o) and g is not None else o
                for o, g in zip(outs, got, strict=False)]
    return shape


def value_dependent(dims, dtype) -> TensorSpec:
    """The spec of an output whose dims (None entries) depend on input values that are not known statically.

    Downstream inference treats a partly known shape as unknown, and run_op's cross-check compares whole
    shapes, so the shape is given as unknown and only the dtype is kept.
    """
    if all(d is not None for d in dims):
        return out_spec(dims, dtype)
    return TensorSpec(None, None if dtype is None else np.dtype(dtype))


def fold(fn, specs, **args):
    """The value of a small integer/bool result, fn(np, *values, **args), when every input's value is known
    (as the values of shape tensors are), so that shape arithmetic can be followed; else None."""
    values = [s.value for s in specs]
    if any(v is None for v in values):
        return None
    with np.errstate(all="ignore"):
        out = np.asarray(fn(np, *values, **args))
    return out if out.size <= SMALL_VALUE and out.dtype.kind in "iub" else None


def size_of(x) -> int:
    """Number of elements of an array or a TensorSpec."""
    if type(x) is np.ndarray:          # the kernels' checks at every run: no np.prod call (several µs)
        return x.size
    return int(np.prod(x.shape, dtype=np.int64))


# --------------------------------------------------------------------------------------------- dtype checks

NUMERIC = ("int32", "int64", "float16", "float32", "float64")
COMPARABLE = ("bool",) + NUMERIC
BOOL = ("bool",)
FLOAT = ("float16", "float32", "float64")


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """dtype.name, remembered per dtype (numpy computes the name in Python, several µs; kernels check their
    inputs' dtypes by name at every call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = dtype.name
        if len(_DTYPE_NAMES) < 256:
            _DTYPE_NAMES[dtype] = name
    return name


def check_dtypes(arrays, allowed, what: str = "inputs") -> None:
    """DTypeError unless all arrays (or TensorSpecs; unknown dtypes are skipped) share one dtype from
    `allowed`."""
    known = [(i, x.dtype) for i, x in enumerate(arrays) if x.dtype is not None]
    if not known:
        return
    i0, first = known[0]
    for i, dtype in known:
        if dtype_name(dtype) not in allowed:
            raise DTypeError(f"input {i} has dtype {dtype.name}; {what} must be one of {', '.join(allowed)} "
                             "(use Cast to convert)")
        if dtype != first:
            raise DTypeError(f"input {i} has dtype {dtype.name} but input {i0} has {first.name}; {what} must "
                             f"share one type (Cast input {i} to {first.name})")


def check_float(op_type: str = "", /, *, kinds: str = "f", **named) -> None:
    """DTypeError unless every named array or TensorSpec is a float tensor (or of the numpy dtype `kinds`,
    e.g. "fiu" for any number) and all share one dtype; None and unknown dtypes pass. The message names the
    op (when given), the input and its dtype: check_float("FC", X=X, W=W, b=b)."""
    known = {name: x.dtype for name, x in named.items() if x is not None and x.dtype is not None}
    float_only = kinds == "f"
    for name, dtype in known.items():
        if dtype.kind not in kinds:
            needs = f"{op_type} needs {'floating-point' if float_only else 'numeric'} inputs: " if op_type else ""
            raise DTypeError(f"{needs}{name} must be a {'float' if float_only else 'numeric'} tensor, got "
                             f"{dtype}; Cast it to float first (Cast to=1: float32)")
    if len(set(known.values())) > 1:
        listed = ", ".join(f"{name} {dtype}" for name, dtype in known.items())
        raise DTypeError(f"{op_type or 'this op'} needs one dtype for all inputs, got {listed}; Cast them to the "
                         "same float type")


# --------------------------------------------------------------------------------------------- gradients
class GradientSlice(NamedTuple):
    """A sparse gradient: rows `indices` of the parameter get `values`."""
    indices: str
    values: str


def forward_label(index: int, op: OperatorDef) -> str:
    """'op #<index> (<type>)': how gradient errors name a forward op."""
    return f"op #{index} ({op.type})"


class GradientContext:
    """What a gradient maker sees: the forward op, the gradients of its outputs, and helpers that name
    gradients and create gradient ops the way Caffe2's GradientMakerBase does."""

    def __init__(self, op: OperatorDef, g_output: list, index: int = 0, backward=None):
        self.backward = backward   # the backward pass (ops, seeds) -> (ops, gradients), for makers of nested nets
        self.def_ = op
        self.g_output = g_output
        self.g_input: list = [None] * len(op.input)
        self.ops: list[OperatorDef] = []
        self.copy_arguments = True
        self.label = forward_label(index, op)

    # forward names
    def I(self, i: int) -> str:  # noqa: E743 - Caffe2's names
        return self.def_.input[i]

    def O(self, i: int) -> str:  # noqa: E743
        return self.def_.output[i]

    @property
    def n_inputs(self) -> int:
        return len(self.def_.input)

    @property
    def n_outputs(self) -> int:
        return len(self.def_.output)

    def arg(self, name: str, default=None):
        for a in self.def_.arg:
            if a.name == name:
                return argument_value(a)
        return default

    # gradients of outputs
    def has_grad(self, i: int) -> bool:
        return i < len(self.g_output) and self.g_output[i] is not None

    def GO(self, i: int) -> str:
        g = self.g_output[i]
        if g is None or isinstance(g, GradientSlice):
            what = "no gradient" if g is None else "a sparse gradient"
            raise GradientError(f"the gradient maker needs a dense gradient of output {i} "
                                f"({self.O(i)!r}) but it has {what}", at=self.label)
        return g

    def GO_sparse(self, i: int) -> GradientSlice:
        g = self.g_output[i]
        if not isinstance(g, GradientSlice):
            raise GradientError(f"the gradient maker needs a sparse gradient of output {i}", at=self.label)
        return g

    # gradients of inputs
    def GI(self, i: int) -> str:
        """The dense gradient name of input i (input + '_grad'), recorded as that input's gradient."""
        name = self.I(i) + "_grad"
        self.g_input[i] = name
        return name

    def GI_sparse(self, i: int) -> GradientSlice:
        g = GradientSlice(self.I(i) + "_grad_indices", self.I(i) + "_grad_values")
        self.g_input[i] = g
        return g

    def set_dense(self, i: int, name: str) -> None:
        """Input i's gradient is `name`, with no op (a pass-through, e.g. Sum, Alias)."""
        self.g_input[i] = name

    def set_sparse(self, i: int, indices: str, values: str) -> None:
        self.g_input[i] = GradientSlice(indices, values)

    def op(self, type_: str, inputs, outputs, copy_args: bool | None = None, **args) -> OperatorDef:
        """A gradient op: device_option and engine copied; forward args copied unless told not to."""
        g = OperatorDef(type=type_, input=list(inputs), output=list(outputs), is_gradient_op=True)
        if self.def_.HasField("device_option"):
            g.device_option.CopyFrom(self.def_.device_option)
        if self.def_.engine:
            g.engine = self.def_.engine
        if self.copy_arguments if copy_args is None else copy_args:
            g.arg.extend(a for a in self.def_.arg if a.name not in args)
        for name, value in args.items():
            g.arg.append(make_argument(name, value))
        self.ops.append(g)
        return g


Maker = Callable[[GradientContext], None]


def not_in_place(g: GradientContext, inputs: Sequence[int] = (0,)) -> None:
    """GradientError when output 0 overwrote one of these forward inputs, whose values the gradient reads."""
    hit = [g.I(i) for i in inputs if g.I(i) == g.O(0)]
    if hit:
        raise GradientError(f"cannot compute the gradient of {g.def_.type} run in place "
                            f"({hit[0]!r} is both input and output, and the gradient needs the input); "
                            "give the output another name", at=g.label)


_REF = re.compile(r"(GI|GO|I|O)(\d+)")


def _refs(names: Sequence[str]) -> list[tuple[str, int]]:
    refs = []
    for name in names:
        m = _REF.fullmatch(name)
        if m is None:
            raise ValueError(f"{name!r} is not a gradient maker reference (I<n>, O<n>, GO<n> or GI<n>)")
        refs.append((m[1], int(m[2])))
    return refs


def single_gradient(type_: str, inputs: Sequence[str], outputs: Sequence[str] = ("GI0",), *,
                    reads_inputs: bool = False) -> Maker:
    """A maker emitting one `type_` op with the forward's arguments (Caffe2's SingleGradientDef). Inputs and
    outputs are named as in GradientContext: "I0" forward input 0, "O0" forward output 0, "GO0" the gradient
    of output 0, "GI0" the gradient of input 0 (recorded as that input's gradient). reads_inputs: refuse a
    forward op run in place (output 0 over an input named in `inputs`), whose input values are lost."""
    ins, outs = _refs(inputs), _refs(outputs)
    read = [i for kind, i in ins if kind == "I"]

    def maker(g: GradientContext) -> None:
        if reads_inputs:
            not_in_place(g, read)
        g.op(type_, [getattr(g, kind)(i) for kind, i in ins], [getattr(g, kind)(i) for kind, i in outs])
    maker.__name__ = maker.__qualname__ = f"{type_}_maker"
    maker.__doc__ = f"{type_}({', '.join(inputs)}) -> {', '.join(outputs)}."
    return maker


MAX_ELEMENTS = np.iinfo(np.intp).max // 16   # numpy also refuses dims whose product times the item size overflows


def check_dims(dims, where: str) -> tuple[int, ...]:
    """dims as a tuple if an array can have them: an ArgumentError for a negative dim, or for nonzero dims whose
    product no array can hold (numpy refuses such a shape even with a 0 in it)."""
    if any(d < 0 for d in dims):
        raise ArgumentError(f"{where} {list(dims)} has a negative dimension; every dim must be >= 0")
    if math.prod(d for d in dims if d) > MAX_ELEMENTS:
        raise ArgumentError(f"{where} {list(dims)}: its nonzero dims multiply to more than {MAX_ELEMENTS}, more "
                            "elements than an array can have, even with a dim of 0")
    return tuple(dims)
