"""What binding an OperatorDef to its record checks (arity, in-place rules, arguments), for the executor, static
inference and the builders alike, and what a kernel's failure becomes: an error naming the op, with its inputs
described."""
from __future__ import annotations

import warnings

import numpy as np

from ..core import backend
from ..core.errors import (
    NO_VALUE, OpAt, ArgumentError, ArityError, DTypeError, MissingBlobError, OpError, ResourceError, StepnetError,
    StepnetWarning, did_you_mean)
from ..core.int8 import Int8Tensor
from ..core.limits import over_limit
from .registry import ANY_INPLACE, KNOWN_HINTS, REQUIRED, read_arg


def describe(value) -> str:
    """'(2, 3) float32' for arrays, a short type name otherwise."""
    if value is None:
        return "<empty>"
    if isinstance(value, Int8Tensor):
        return f"{value.shape} {value.dtype} Int8 (scale {value.scale:g}, zero point {value.zero_point})"
    shape = getattr(value, "shape", None)
    if shape is not None:
        dev = backend.device_of(value)
        where = "" if dev is None or dev.is_cpu else f" on {dev}"
        return f"{tuple(shape)} {value.dtype}{where}"
    return type(value).__name__


def op_label(net_name: str, index: int, opdef) -> OpAt:
    """Where op `index` of a net is (what errors about it carry, and print first)."""
    return OpAt(net_name, index, opdef.type, opdef.name)


def device_option(opdef, netdef):
    """The DeviceOption an op runs with: its own, else its net's, else None (the CPU). Nothing is copied into
    the OperatorDef: binding a net never changes the message the caller holds."""
    if opdef.HasField("device_option"):
        return opdef.device_option
    return netdef.device_option if netdef.HasField("device_option") else None


def parse_args(schema, opdef, label: str, strict: bool, level: int = 0) -> dict:
    """Declared arguments with defaults filled; undeclared ones warn (error when strict) unless known hints.
    `level`: the nesting level of the op's net (nets given as text in arguments are nested below it)."""
    values = {}
    seen = set()
    for argument in opdef.arg:
        name = argument.name
        if name in seen:
            raise ArgumentError(f"argument {name!r} is given twice", at=label)
        seen.add(name)
        spec = schema.args.get(name)
        if spec is not None:
            values[name] = read_arg(spec.kind, argument, label, level)
        elif name not in KNOWN_HINTS:
            declared = ", ".join(sorted(schema.args)) or "none"
            msg = (f"argument {name!r} is not used by {opdef.type} and is ignored"
                   f"{did_you_mean(name, schema.args)} (its arguments: {declared})")
            if strict:
                raise ArgumentError(msg, at=label)
            warnings.warn(f"{label}: {msg}", StepnetWarning, stacklevel=4)
    for name, spec in schema.args.items():
        if name not in values:
            if spec.default is REQUIRED:
                raise ArgumentError(f"required argument {name!r} is missing", at=label)
            values[name] = spec.default
    return values


def check_arity(schema, opdef, label: str) -> None:
    for which, got in (("inputs", len(opdef.input)), ("outputs", len(opdef.output))):
        lo, hi = getattr(schema, which)
        if not lo <= got <= hi:
            raise ArityError(f"{opdef.type} takes {schema.arity_text(which)} {which}, got {got} "
                             f"({', '.join(getattr(opdef, which[:-1])) or 'none'})", at=label)


def check_inplace(schema, opdef, label: str) -> None:
    ins, outs = list(opdef.input), list(opdef.output)
    for i, o in schema.enforce_inplace:
        if i < len(ins) and o < len(outs) and ins[i] != outs[o]:
            raise ArgumentError(f"{opdef.type} must write input {i} ({ins[i]!r}) in place, "
                                f"but output {o} is {outs[o]!r}", at=label)
    if schema.allow_inplace == ANY_INPLACE:
        return
    allowed = schema.allow_inplace | schema.enforce_inplace
    for o, out in enumerate(outs):
        for i, inp in enumerate(ins):
            if inp == out and (i, o) not in allowed:
                raise ArgumentError(f"{opdef.type} cannot write output {o} in place over input {i} "
                                    f"({out!r}); give the output another name", at=label)


def writes_over_inputs(schema, opdef) -> bool:
    """Whether every output of the op is an input its record lets it be written over (its in-place pairs): the
    op then takes its record's inplace_kernel, which may update those arrays in place."""
    pairs, ins = schema.allow_inplace, opdef.input
    return bool(opdef.output) and pairs != ANY_INPLACE and all(
        any(o == k and i < len(ins) and ins[i] == name for i, o in pairs) for k, name in enumerate(opdef.output))


def store_results(bop, values, result, limit: int) -> None:
    """A kernel's result (not None) into the op's output blobs, as every runner stores it: one value for one
    output, else a tuple or list of values (None: an output the kernel left as it was)."""
    outs = bop.outputs
    if len(outs) == 1 and type(result) is not tuple and type(result) is not list:
        store(outs[0], result, limit, bop.label)
        return
    if type(result) is not tuple and type(result) is not list:   # rows would be spread over outputs
        raise failure(bop, values, TypeError(
            f"the kernel returned one {type(result).__name__} for {len(outs)} outputs"))
    for blob, value in zip(outs, result):
        if value is not None:
            store(blob, value, limit, bop.label)


def store(blob, value, limit: int, label) -> None:
    """An op's result into its output blob: plain arrays as they are, write-through for views (Blob.set); an
    array over the blob limit is refused, whatever op made it (the backstop of the checks before kernels);
    numpy/Python scalars become 0-d arrays."""
    if type(value) is not np.ndarray and isinstance(value, (np.generic, int, float, bool)):
        value = np.asarray(value)
    nbytes = getattr(value, "nbytes", 0)
    if type(nbytes) is int and nbytes > limit:
        raise over_limit(blob.name, value.shape, value.dtype, nbytes, limit, label)
    if blob.view:
        blob.set(value)
    else:
        blob.value = value


def failure(bop, values, e: Exception) -> StepnetError:
    """The error to raise for a kernel's exception: named after the op, with its inputs described."""
    if isinstance(e, StepnetError):
        return e.located(bop.label, _inputs_text(bop, values))   # (an error that knows its place keeps it)
    return _kernel_failure(bop, values, e)


def _inputs_text(bop, values) -> str:
    if not values:
        return ""
    parts = [f"{name} {describe(v)}" for name, v in zip(bop.opdef.input, values)]
    int8 = [repr(name) for name, v in zip(bop.opdef.input, values) if isinstance(v, Int8Tensor)]
    hint = "" if not int8 or bop.schema.family.startswith("int8") else (
        f"; {', '.join(int8)} {'is an Int8 tensor' if len(int8) == 1 else 'are Int8 tensors'}: dequantize first "
        "(Int8Dequantize)")
    return f" [inputs: {', '.join(parts)}]{hint}"


def _kernel_failure(bop, values, e) -> StepnetError:
    for name, v in zip(bop.opdef.input, values):
        if v is None:
            return MissingBlobError(f"input {name!r} {NO_VALUE}", at=bop.label)
        if isinstance(e, AttributeError) and getattr(e, "obj", None) is v and not hasattr(v, "shape"):
            return DTypeError(f"input {name!r} is a {type(v).__name__}, not a tensor, and "
                              f"{bop.opdef.type} reads a tensor there{_inputs_text(bop, values)}", at=bop.label)
    if isinstance(e, MemoryError) or (isinstance(e, ValueError) and "array is too big" in str(e)):
        return ResourceError(f"an array of impossible size was asked for ({type(e).__name__}: "
                             f"{e}); check the op's size arguments{_inputs_text(bop, values)}", at=bop.label)
    return OpError(f"failed: {type(e).__name__}: {e}{_inputs_text(bop, values)}", at=bop.label, sep=" ")
