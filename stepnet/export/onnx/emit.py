"""The ONNX side of a conversion: unique value names, nodes, constants, and the node patterns converters share.

One `Names` and one constant pool serve the main graph and every Scan body (a body reads the main graph's
constants as outer-scope values), so every value name in a model is unique. Helpers emit the form of an
operator that the chosen opset defines (axes as inputs from opset 13, Reduce* axes as inputs from 18).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

MIN_OPSET = 13     # the lowest opset the exporter writes: Squeeze/Unsqueeze/Split/ReduceSum take axes as inputs
SMALL = 64         # constants up to this many elements are shared between the nodes that need them


def onnx_type(dtype) -> int:
    """The ONNX element type of a numpy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def value_info(name: str, dtype, shape):
    """A typed ValueInfoProto (shape None: unknown rank)."""
    dims = None if shape is None else [d if d is not None else None for d in shape]
    return helper.make_tensor_value_info(name, onnx_type(dtype), dims)


class Names:
    """Value names of one model: each given out once."""

    def __init__(self):
        self.used: set[str] = set()
        self.counts: dict[str, int] = {}

    def reserve(self, name: str) -> str:
        self.used.add(name)
        return name

    def fresh(self, hint: str) -> str:
        name, k = hint, self.counts.get(hint, 0)
        while name in self.used:
            k += 1
            name = f"{hint}_{k}"
        self.counts[hint] = k
        self.used.add(name)
        return name


class Emitter:
    """Nodes of one graph (the main graph or a Scan body), with the model's names and constants."""

    def __init__(self, opset: int, names: Names | None = None, consts: dict | None = None, shared=None):
        self.opset = opset
        self.names = names or Names()
        self.consts: dict[str, np.ndarray] = {} if consts is None else consts   # name -> value (initializers)
        self._shared: dict = {} if shared is None else shared                  # small constants by content
        self.nodes: list = []
        self.prefix = "v"

    def sub(self) -> "Emitter":
        """An emitter for a subgraph: its own nodes, this model's names and constants."""
        e = Emitter(self.opset, self.names, self.consts, self._shared)
        e.prefix = self.prefix
        return e

    def fresh(self, what: str) -> str:
        return self.names.fresh(f"{self.prefix}/{what}")

    # ------------------------------------------------------------------------------------------- nodes
    def node(self, op_type: str, inputs, n: int = 1, out=None, **attrs):
        """Add a node; returns its output name (one output) or names. `out`: the output names to use."""
        outs = list(out) if out is not None else [self.fresh(op_type) for _ in range(n)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def const(self, value, dtype=None, name: str | None = None) -> str:
        """A constant (an initializer of the main graph)."""
        arr = np.asarray(value, dtype=dtype)
        key = None
        if arr.size <= SMALL and arr.dtype != object:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            if key in self._shared and name is None:
                return self._shared[key]
        name = self.names.reserve(name) if name else self.fresh("const")
        self.consts[name] = arr
        if key is not None:
            self._shared.setdefault(key, name)
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64).reshape(-1))

    def scalar(self, value, dtype) -> str:
        return self.const(np.asarray(value, dtype=dtype).reshape(()))

    # ------------------------------------------------------------------------------------------- patterns
    def identity(self, x: str, out=None) -> str:
        return self.node("Identity", [x], out=out)

    def reshape(self, x: str, shape, out=None) -> str:
        return self.node("Reshape", [x, self.ints(shape)], out=out)

    def transpose(self, x: str, perm, out=None) -> str:
        if not len(perm):          # a scalar: ONNX cannot write an empty perm attribute, and nothing moves
            return self.node("Identity", [x], out=out)
        return self.node("Transpose", [x], out=out, perm=list(perm))

    def squeeze(self, x: str, axes, out=None) -> str:
        return self.node("Squeeze", [x, self.ints(axes)], out=out)

    def unsqueeze(self, x: str, axes, out=None) -> str:
        return self.node("Unsqueeze", [x, self.ints(axes)], out=out)

    def cast(self, x: str, dtype, out=None) -> str:
        return self.node("Cast", [x], out=out, to=onnx_type(dtype))

    def slice(self, x: str, starts, ends, axes, out=None) -> str:
        return self.node("Slice", [x, self.ints(starts), self.ints(ends), self.ints(axes)], out=out)

    def split(self, x: str, sizes, axis: int, out=None) -> list[str]:
        outs = self.node("Split", [x, self.ints(sizes)], n=len(sizes), out=out, axis=axis)
        return [outs] if isinstance(outs, str) else outs

    def concat(self, xs, axis: int, out=None) -> str:
        return self.node("Concat", list(xs), out=out, axis=axis)

    def reduce(self, op_type: str, x: str, axes, keepdims: bool, out=None) -> str:
        """Reduce<op> over axes (all of them when axes is empty, as every Caffe2 reduction means)."""
        axes = list(axes)
        if op_type == "ReduceSum" or self.opset >= 18:
            ins = [x, self.ints(axes)] if axes else [x]
            return self.node(op_type, ins, out=out, keepdims=int(bool(keepdims)))
        return self.node(op_type, [x], out=out, keepdims=int(bool(keepdims)), axes=axes or None)


def to_tensor(name: str, value: np.ndarray) -> TensorProto:
    """An initializer from a numpy array (strings as ONNX STRING tensors)."""
    arr = np.asarray(value)
    if arr.dtype == object:
        t = helper.make_tensor(name, TensorProto.STRING, arr.shape,
                               [v if isinstance(v, bytes) else str(v).encode() for v in arr.reshape(-1)])
        return t
    return numpy_helper.from_array(np.require(arr, requirements='C'), name)
