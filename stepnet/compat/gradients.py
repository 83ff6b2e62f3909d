"""Caffe2's core.GradientRegistry over stepnet's backward pass (passes/gradients.py): the gradient ops of one
operator, or of a list of them, as Caffe2's Python tests and tools ask for them, and the gradient functions a
script registers in Python (`@GradientRegistry.RegisterGradient("MyOp")`).

A Python gradient function, fn(op, g_output) -> (gradient ops, gradient of each input), serves an op type that
has no gradient maker of stepnet's own (a type stepnet does not know, or one registered without a gradient), as
Caffe2 tries its C++ makers first and its Python registry after. They are kept here, in the compat layer (the
operator records are closed), and every backward pass started from compat consults them (GetGradientForOp,
GetBackwardPass, core.Net.AddGradientOperators).

Where Caffe2's API builds other gradient ops than stepnet's own pass, compat builds Caffe2's: the backward pass
runs in its `caffe2` mode (passes/gradients.py), a StopGradient whose output nothing reads is refused, as
Caffe2's IR refuses it, and Add and Sub without a `broadcast` argument have Caffe2's makers of that API (the
output gradient passed through, and a Negative for Sub's second input) instead of stepnet's Add/SubGradient,
which also reduce over numpy broadcasting: the vendored suite's Caffe2 requires equal shapes there.
"""
from __future__ import annotations


from ..core.errors import GradientError
from ..io.proto import OperatorDef
from ..ops import REGISTRY
from ..ops.base import GradientSlice
from ..ops.registry import GRADIENT_NOT_IMPLEMENTED, SHOULD_NOT_DO_GRADIENT
from ..passes.gradients import backward_ops, gradient_of_op
from .blob_reference import BlobReference
from .errors import caffe2_errors

_PYTHON_MAKERS: dict = {}   # op type -> fn(op, g_output), for this process


def _has_own_maker(op_type: str) -> bool:
    schema = REGISTRY.get(op_type) if op_type in REGISTRY else None
    return schema is not None and schema.gradient not in (None, SHOULD_NOT_DO_GRADIENT, GRADIENT_NOT_IMPLEMENTED)


def _name_of(g):
    """A gradient a Python function gave (str, BlobReference, GradientSlice, None) in the backward pass's terms."""
    if g is None:
        return None
    if isinstance(g, GradientSlice):
        return GradientSlice(str(g.indices), str(g.values))
    return g.decode() if isinstance(g, bytes) else str(g)


def _pass_through(op: OperatorDef, g_output: list):
    """Caffe2's makers of Add and Sub without `broadcast`: (ops, input gradients), or None (stepnet's maker)."""
    go = g_output[0] if g_output else None
    if op.type not in ("Add", "Sub") or any(a.name == "broadcast" for a in op.arg) or not isinstance(go, str) \
            or len(op.input) != 2 or len(op.output) != 1:
        return None
    if op.type == "Add":
        return [], [go, go]
    negative = OperatorDef(type="Negative", input=[go], output=[op.input[1] + "_grad"], is_gradient_op=True)
    if op.HasField("device_option"):
        negative.device_option.CopyFrom(op.device_option)
    if op.engine:
        negative.engine = op.engine
    return [negative], [go, negative.output[0]]


def python_makers(op: OperatorDef, g_output: list):
    """The backward pass's `extra`: (ops, input gradients) from a Python-registered function for an op type
    without a maker of stepnet's own, or from Caffe2's pass-through makers of Add and Sub; else None (the op's
    record decides)."""
    made = _pass_through(op, g_output)
    if made is not None:
        return made
    fn = _PYTHON_MAKERS.get(op.type)
    if fn is None or _has_own_maker(op.type):
        return None
    ops, g_input = fn(op, list(g_output))
    ops = [] if ops is None else [ops] if isinstance(ops, OperatorDef) else list(ops)
    g_input = list(g_input)
    if len(g_input) != len(op.input):
        raise GradientError(f"the Python gradient function of {op.type} gave {len(g_input)} input gradients for "
                            f"an op of {len(op.input)} inputs")
    return ops, [_name_of(g) for g in g_input]


def _plain(g):
    """A gradient given by a caller (str, BlobReference, GradientSlice or None) in stepnet's terms."""
    if g is None:
        return None
    if isinstance(g, GradientSlice):
        return GradientSlice(str(g.indices), str(g.values))
    return str(g)


def _reference(g):
    """A gradient of stepnet's in Caffe2's terms: a BlobReference, a GradientSlice of them, or None."""
    if g is None:
        return None
    if isinstance(g, GradientSlice):
        return GradientSlice(BlobReference(g.indices), BlobReference(g.values))
    return BlobReference(g)


def check_stop_gradients(ops) -> None:
    """Caffe2's IR refuses a StopGradient whose output no op reads (it stops nothing: the blob meant to be cut
    is read under its old name)."""
    read = {name for op in ops for name in op.input}
    for op in ops:
        if op.type == "StopGradient" and op.output and op.output[0] not in read:
            raise ValueError(f"StopGradient's output {op.output[0]!r} is read by no op, so it stops no gradient; "
                             f"give it the same blob as input and output (StopGradient({op.input[0]!r}, "
                             f"{op.input[0]!r}))")


def caffe2_backward(operators, ys) -> tuple[list, dict]:
    """(gradient ops, {blob: gradient name or GradientSlice}) as Caffe2's IR builds them (names as strings)."""
    operators = list(operators)
    check_stop_gradients(operators)
    return backward_ops(operators, ys, python_makers, caffe2=True)


def _as_created(ops) -> list:
    """The ops as Caffe2's CreateOperator makes them: `name` set (to "" when it has none), which protobuf
    equality tells from an unset one."""
    for op in ops:
        op.name = op.name
    return list(ops)


class GradientRegistry:
    """Caffe2's registry of gradient makers; stepnet's makers live on each operator's record, a script's Python
    ones here."""

    gradient_registry_ = _PYTHON_MAKERS

    @classmethod
    def RegisterGradient(cls, op_type):
        """A decorator: fn(op, g_output) -> (gradient ops, gradient of each input) becomes the gradient of
        op_type (used where stepnet has no maker of its own for it)."""
        def register(fn):
            _PYTHON_MAKERS[str(op_type)] = fn
            return fn
        return register

    @classmethod
    @caffe2_errors
    def GetGradientForOp(cls, op: OperatorDef, g_output) -> tuple[list, list]:
        """(gradient ops, gradient of each input or None) for op, given its outputs' gradients g_output."""
        ops, g_input = gradient_of_op(op, [_plain(g) for g in g_output], python_makers)
        return _as_created(ops), [_reference(g) for g in g_input]

    @classmethod
    @caffe2_errors
    def GetBackwardPass(cls, operators, ys, ys_generate_gradient: bool = False) -> tuple[list, dict]:
        """(gradient ops, {blob: its gradient}) of the operators for ys: a list (gradients seeded with ones) or
        {y: gradient blob, or None to seed it with ones}."""
        if isinstance(ys, dict):
            targets = {str(k): (None if v is None else str(v)) for k, v in ys.items()}
        else:
            targets = [str(y) for y in ([ys] if isinstance(ys, str) else ys)]
        ops, grads = caffe2_backward(operators, targets)
        return _as_created(ops), {name: _reference(g) for name, g in grads.items() if g is not None}
