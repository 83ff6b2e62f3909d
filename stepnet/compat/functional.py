"""Caffe2's functional: any operator called eagerly on numpy arrays.

    from caffe2.python.functional import Functional
    y = Functional.Relu(x)                     # y[0], y["output_0"], y.output_0
    out, split_info = Functional.Concat(a, b, axis=1)
    parts = Functional.Split(x, split=[2, 3], axis=0, num_output=2)

Each call runs one op in a workspace of its own: the inputs are fed as `input_0`, `input_1`, ..., the keyword
arguments are the op's arguments, and the result is a named tuple of the outputs `output_0`, `output_1`, ...
(indexable by position or by name). The number of outputs is `num_output` when given, else what the op's schema
fixes (its only count), else its largest count; an op with no upper bound needs
`num_output`. Counts outside the schema's ranges are a ValueError, as in Caffe2 (more inputs than the op takes
too, where Caffe2 fails with an IndexError).
"""
from __future__ import annotations

from collections import namedtuple

from ..ops import REGISTRY
from . import core
from .c_api import Workspace

INF = float("inf")


def namedtupledict(typename, field_names, *args, **kwargs):
    """A namedtuple class whose items are also found by field name (t["output_0"]); names that are not Python
    identifiers are renamed for attribute access, as namedtuple(rename=True) does."""
    index = {name: i for i, name in enumerate(field_names)}
    kwargs.setdefault("rename", True)
    cls = namedtuple(typename, field_names, *args, **kwargs)

    def getitem(self, key):
        return tuple.__getitem__(self, index[key] if isinstance(key, str) else key)

    cls.__getitem__ = getitem
    return cls


def _calculated_outputs(schema) -> int:
    """Caffe2's OpSchema::CalculateOutput: the fixed output count, or -1 (the one Caffe2 op with an output
    calculator, Free, is not in stepnet)."""
    lo, hi = schema.outputs
    return int(lo) if lo == hi else -1


def _names(prefix: str, count, most) -> list:
    return [f"{prefix}{i}" for i in range(int(min(count, most)))]


def _run(op_type: str, inputs: tuple, args: dict):
    schema = REGISTRY.get(op_type)
    min_in, max_in = schema.inputs
    min_out, max_out = schema.outputs
    num_input = len(inputs)   # (Caffe2 cuts the names at max_input and then fails indexing them: an IndexError)
    input_names = _names("input_", num_input, max_in)
    if not min_in <= num_input <= max_in:
        raise ValueError(f"Functional C2: Number of inputs not in range: {min_in} - {max_in} or not allowed.")
    output_names = []
    if "num_output" in args:
        num_output = args.pop("num_output")
        if not min_out <= num_output <= max_out:
            raise ValueError(f"Functional C2: Number of output not in range: {min_out} - {max_out} or not allowed")
        output_names = _names("output_", num_output, max_out)
    if not output_names:
        calculated = _calculated_outputs(schema)
        if calculated != -1:
            output_names = _names("output_", calculated, max_out)
    if not output_names:
        if max_out == INF:
            raise ValueError("For operators with max_output == inf, user should pass num_output explicity.")
        output_names = _names("output_", max_out, max_out)
    ws = Workspace()
    for name, value in zip(input_names, inputs):
        ws.create_blob(name).feed(value)
    op = core.CreateOperator(op_type, input_names, output_names, **args)
    ws._run_operator(op.SerializeToString())
    values = [ws.fetch_blob(name) for name in output_names]
    return namedtupledict("output", output_names)(*values)


class _Functional:
    """`Functional.<OpType>(*inputs, **args)`: see the module's docstring."""

    def __getattribute__(self, op_type):
        def op_func(*inputs, **args):
            return _run(op_type, inputs, args)
        op_func.__name__ = op_type
        return op_func


Functional = _Functional()
