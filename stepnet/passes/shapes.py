"""Static shape and dtype inference over a net, from each op record's shape function.

A shape function takes the input TensorSpecs and the op's parsed arguments (the same keywords as its kernel)
and returns the output TensorSpecs (a shorter list leaves the rest unknown). It is called only when every
input's shape is known, so it can compute freely; it raises ShapeError/ArgumentError for inputs that cannot
work together, and inference reports that error, with the op named, before anything runs.
"""
from __future__ import annotations

from ..core.errors import ShapeError, StepnetError
from ..ops.binding import check_arity, op_label, parse_args
from ..core.limits import check_specs
from ..core.spec import UNKNOWN, TensorSpec
from ..ops import REGISTRY

def infer_op(schema, opdef, specs: list[TensorSpec], args: dict, label: str, shape=None) -> list[TensorSpec]:
    """Output specs of one op (unknown where the record has no shape function or inputs are unknown); `shape`:
    a shape function to use instead of the record's."""
    shape = shape or schema.shape
    if shape is None or any(s.shape is None or None in s.shape for s in specs):
        return [UNKNOWN] * len(opdef.output)
    try:
        outs = list(shape(specs, **args))
    except StepnetError as e:
        raise e.located(label, _inputs_text(opdef, specs)) from None
    except Exception as e:  # noqa: BLE001 - a shape function meeting values it cannot handle: the inputs' fault
        raise ShapeError(f"static shape inference failed ({type(e).__name__}: {e}); the op's arguments "
                         f"or input shapes are out of range{_inputs_text(opdef, specs)}", at=label) from None
    outs = outs[:len(opdef.output)]
    return [o if isinstance(o, TensorSpec) else UNKNOWN for o in outs] + [UNKNOWN] * (len(opdef.output) - len(outs))


def _inputs_text(opdef, specs) -> str:
    shapes = ", ".join(f"{n} {s}" for n, s in zip(opdef.input, specs))
    return f" [inputs: {shapes}]"


def infer_net(netdef, known: dict[str, TensorSpec] | None = None, strict: bool = False,
              max_blob_bytes: int | None = None, shapes: dict | None = None) -> dict[str, TensorSpec]:
    """Specs of every blob of netdef, given specs of its inputs (by name). Raises on a static mismatch, and
    with max_blob_bytes on an output whose known shape and dtype would take more (ResourceError). `shapes`:
    shape functions by op type to use instead of the records' (another framework's answers, such as the size
    bounds Caffe2's InferShapesAndTypes gives where stepnet's answer depends on values)."""
    import warnings

    specs = dict(known or {})
    for index, opdef in enumerate(netdef.op):
        label = op_label(netdef.name, index, opdef)
        schema = REGISTRY.get(opdef.type, at=label)
        check_arity(schema, opdef, label)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = parse_args(schema, opdef, label, strict)
        if schema.random:
            args["rng"] = None
        ins = [specs.get(name, UNKNOWN) for name in opdef.input]
        outs = infer_op(schema, opdef, ins, args, label, (shapes or {}).get(opdef.type))
        if max_blob_bytes is not None:
            check_specs(max_blob_bytes, opdef.output, outs, label)
        for name, s in zip(opdef.output, outs):
            specs[name] = s
    return specs


def specs_of_workspace(ws, names) -> dict[str, TensorSpec]:
    """Specs of the named blobs that hold arrays in a workspace."""
    out = {}
    for name in names:
        blob = ws.find(name)
        if blob is not None and hasattr(blob.value, "shape"):
            out[name] = TensorSpec.of(blob.value)
    return out
