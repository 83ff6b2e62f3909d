"""The one table of converters: Caffe2 op type -> the function that writes its ONNX nodes.

A converter is `fn(c)` with `c` a convert.OpCtx (the op, its parsed arguments, its inputs' ONNX names, specs and
constant values); it emits nodes and sets every output the export needs. `@converts(*types, opset=N)` registers
one for op types whose ONNX form needs opset N or newer. `REFUSALS` says what to do instead for ops that have
no ONNX counterpart. The converter modules register on import; `table()` imports them all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .emit import MIN_OPSET

MODULES = ("converters_math", "converters_nn", "converters_shape", "converters_rnn", "converters_loss",
           "converters_segments")


@dataclass(frozen=True)
class Converter:
    fn: Callable
    opset: int = MIN_OPSET        # the lowest opset its nodes need
    reads: Callable | None = None  # reads(opdef, args) -> blobs it reads beyond its inputs (step nets)


CONVERTERS: dict[str, Converter] = {}


def converts(*types: str, opset: int = MIN_OPSET, reads: Callable | None = None):
    """Register the decorated function as the converter of these op types."""
    def register(fn):
        for t in types:
            if t in CONVERTERS:
                raise ValueError(f"converter for {t} registered twice")
            CONVERTERS[t] = Converter(fn, opset, reads)
        return fn
    return register


def table() -> dict[str, Converter]:
    """Every converter, after importing the modules that register them."""
    import importlib

    for m in MODULES:
        importlib.import_module(f"{__package__}.{m}")
    return CONVERTERS


_PART = "export the part before it instead ({output_flags}), or run the net in stepnet"
# What to do about ops with no ONNX counterpart, by op type or by family (the op record's module).
REFUSALS = {
    "WeightedSample": "it draws random samples; export the probabilities it reads ({output_flags}) and "
                      "sample outside",
    "PackedInt8BGRANHWCToNCHWCStylizerPreprocess": "it adds random noise kept in the workspace; export from "
                                                   "its output (--input {first_output}=N,3,H,W)",
    "Print": "it only prints", "StringJoin": "ONNX has no string join",
    "family:random_fill": "random fills differ run to run; move the fill to the init net",
    "family:optim": "it updates parameters (training); export the forward part",
    "family:sparse_optim": "it updates parameters (training); export the forward part",
    "family:lr": "it belongs to training; export the forward part",
    "family:db": "it reads or writes files; export the net without it",
}


def what_to_do(opdef, family: str) -> str:
    """What to do about an op without a converter, naming its blobs."""
    text = REFUSALS.get(opdef.type) or REFUSALS.get(f"family:{family}") or _PART
    flags = " ".join(f"--output {name}" for name in opdef.input) or "--output NAME"
    return text.format(output_flags=flags, first_output=opdef.output[0] if opdef.output else "NAME")


def exportable_ops() -> list[str]:
    return sorted(table())


def markdown() -> str:
    """The README's list of ops that export (a test keeps it current)."""
    return ", ".join(f"`{t}`" for t in exportable_ops())
