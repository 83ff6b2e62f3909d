"""Python and PythonGradient: operators that call a Python function of this process (Caffe2's python op).

The function never travels with the model. Caffe2's Python API (stepnet.compat: core.CreatePythonOperator,
net.Python) registers it here, in the process, under a token (`<function name>`, then `<name>:1`, ...) and the
op carries only the token in its `token` argument; a net whose token this process has not registered fails with
an error saying so, so a model file can name a function but never bring code. Caffe2's other way, a pickled
builder in the op (`pickled_builder`), would unpickle code from the file: stepnet refuses it. A builder
registered in the process (net.Python with a (func, args, kwargs) tuple) is called once per op instance, as
Caffe2 calls an unpickled one, to make that instance's function.

The function is called f(inputs, outputs) (or f(inputs, outputs, workspace) for pass_workspace), each a list of
PythonTensor objects, as Caffe2 gives TensorCPU objects: `.data` (an array the function may write), `.shape`,
`.reshape(dims)`, `.feed(array)`, `.fetch()`, `.init(dims, data_type)`. An output left untouched keeps its
blob's value. Inputs are the op's values as the function sees them: what it writes into an input's `.data` is
its own copy and never changes the blob (stepnet's rule: an op leaves its inputs alone), except for a blob that
is also an output, which is one tensor for both, as in Caffe2. The gradient op calls the gradient function with
the forward inputs, outputs and output gradients (or those grad_output_indices names) and the input gradients
(or those of grad_input_indices) as outputs.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core import backend
from ..core.errors import NO_VALUE, ArgumentError, DTypeError, MissingBlobError, ShapeError
from ..io.proto import numpy_dtype
from .base import GradientContext
from .registry import Arg, op

_LOCK = threading.Lock()


@dataclass(frozen=True)
class PythonFunction:
    """A registered function; for a builder, func() makes the function, once per op instance."""
    func: Callable
    pass_workspace: bool = False
    builder: bool = False


FUNCTIONS: dict[str, PythonFunction] = {}   # token -> function, for this process (never cleared, as in Caffe2)


def register_function(func: Callable, pass_workspace: bool = False, name: str = "", builder: bool = False) -> str:
    """Register func for Python ops and return its token: `[name:]<func.__name__>`, with `:<k>` added to make it
    new. builder: func() returns the function (called per op instance)."""
    if func is None or not callable(func):
        raise TypeError(f"a Python op needs a callable, got {type(func).__name__}")
    base = (name + ":" if name else "") + getattr(func, "__name__", type(func).__name__)
    with _LOCK:
        token, k = base, 1
        while token in FUNCTIONS:
            token, k = f"{base}:{k}", k + 1
        FUNCTIONS[token] = PythonFunction(func, bool(pass_workspace), builder)
    return token


def register_gradient_function(token: str, func: Callable, builder: bool = False, pass_workspace: bool = False):
    """Register the gradient function of the function registered under token (as `<token>_gradient`)."""
    if func is None or not callable(func):
        raise TypeError(f"a Python op's gradient needs a callable, got {type(func).__name__}")
    with _LOCK:
        if token not in FUNCTIONS:
            raise KeyError(f"no Python function is registered under token {token!r}")
        FUNCTIONS[token + "_gradient"] = PythonFunction(func, bool(pass_workspace), builder)


# --------------------------------------------------------------------------------------------- tensors
class PythonTensor:
    """One blob as a Python op's function sees it (Caffe2's TensorCPU). `.data` is an array of its own that
    the function may write (the blob's value is copied the first time, never changed in place); reshape keeps
    the values when the size is unchanged and gives zeros otherwise."""

    def __init__(self, name: str, value, what: str):
        self.name, self._what = name, what
        self._value = value          # a host array, or None (an output not written yet)
        self._own = False            # whether _value is this object's own copy
        self.changed = False

    @property
    def data(self) -> np.ndarray:
        if self._value is None:
            raise ShapeError(f"{self._what} {self.name!r} has no value yet: reshape(dims), init or feed it first")
        if not self._own:
            self._value, self._own = np.array(self._value, copy=True), True
        self.changed = True
        return self._value

    @property
    def shape(self) -> tuple:
        return () if self._value is None else tuple(self._value.shape)

    @property
    def _shape(self) -> list:
        return list(self.shape)

    def reshape(self, dims) -> None:
        dims = [int(d) for d in ([dims] if np.isscalar(dims) else dims)]
        if any(d < 0 for d in dims):
            raise ShapeError(f"{self._what} {self.name!r}: reshape to {dims}, a negative dimension")
        old = self._value
        if old is not None and old.size == int(np.prod(dims, dtype=np.int64)):
            self._value = old.reshape(dims)         # same size: the values stay (a view until written)
        else:
            self._value = np.zeros(dims, dtype=np.float32 if old is None else old.dtype)
            self._own = True
        self.changed = True

    _reshape = reshape

    def feed(self, value) -> None:
        if not isinstance(value, np.ndarray):
            raise DTypeError(f"{self._what} {self.name!r}: feed takes a numpy array, got {type(value).__name__}")
        self._value = value.astype(object) if value.dtype.kind in "SU" else np.array(value, copy=True)
        self._own = self.changed = True

    def fetch(self) -> np.ndarray:
        if self._value is None:
            raise MissingBlobError(f"{self._what} {self.name!r} has no value to fetch")
        return np.array(self._value, copy=True)

    def init(self, dims, data_type) -> None:
        """A zero-filled tensor of dims and a TensorProto data type."""
        self._value = np.zeros([int(d) for d in dims], dtype=numpy_dtype(data_type))
        self._own = self.changed = True

    def __repr__(self):
        return f"PythonTensor({self.name!r}, shape={self.shape})"


def _host_tensor(name: str, value, i: int, what: str):
    if value is None:
        raise MissingBlobError(f"{what} {i} ({name!r}) {NO_VALUE}")
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not hasattr(value, "dtype") or not hasattr(value, "shape") or type(value).__name__ == "Int8Tensor":
        raise DTypeError(f"{what} {i} ({name!r}) holds a {type(value).__name__}, not a tensor; a Python op's "
                         "function gets tensors")
    return np.asarray(backend.to_host(value))


def _tensors(ctx, values):
    """(input tensors, output tensors, the distinct tensors of the outputs); a blob that is both an input and an
    output is one tensor."""
    by_name: dict[str, PythonTensor] = {}
    inputs = []
    for i, (name, value) in enumerate(zip(ctx.opdef.input, values)):
        if name not in by_name:
            by_name[name] = PythonTensor(name, _host_tensor(name, value, i, "input"), "input")
        inputs.append(by_name[name])
    outputs = []
    for blob, name in zip(ctx.outputs, ctx.opdef.output):
        if name not in by_name:
            value = blob.value
            start = np.asarray(backend.to_host(value)) if hasattr(value, "dtype") and hasattr(value, "shape") \
                and type(value).__name__ != "Int8Tensor" else None
            by_name[name] = PythonTensor(name, start, "output")
        outputs.append(by_name[name])
    return inputs, outputs


def _function(ctx, token: str, pickled: str, pass_workspace: bool, gradient: bool):
    """The function this op instance calls, and whether it takes the workspace."""
    if pickled:
        arg = "pickled_grad_builder" if gradient else "pickled_builder"
        raise ArgumentError(f"{ctx.opdef.type}: a pickled builder in the op ({arg}) would run code from the model; "
                            "stepnet refuses it. Register the function in this process (core.CreatePythonOperator "
                            "or net.Python) and name it by its token")
    if not token:
        raise ArgumentError(f"{ctx.opdef.type} needs a token argument naming a function registered in this process")
    key = token + "_gradient" if gradient else token
    found = FUNCTIONS.get(key)
    if found is None:
        what = (f"no gradient function (grad_f) for the Python op of token {token!r}" if gradient and token in FUNCTIONS
                else f"no Python function under token {key!r}")
        raise ArgumentError(f"{ctx.opdef.type}: this process registered {what}: a Python op runs only a function "
                            "registered (core.CreatePythonOperator, net.Python) in the process that runs the net, "
                            "never code from a model file")
    if not found.builder:
        return found.func, found.pass_workspace and not gradient
    if "built" not in ctx.state:
        ctx.state["built"] = found.func()
    return ctx.state["built"], pass_workspace


def _run(ctx, xp, values, token, pickled, pass_workspace, gradient: bool):
    func, with_workspace = _function(ctx, token, pickled, pass_workspace, gradient)
    inputs, outputs = _tensors(ctx, values)
    if with_workspace:
        func(inputs, outputs, ctx.workspace)
    else:
        func(inputs, outputs)
    results = []
    for tensor in outputs:
        if not tensor.changed or tensor._value is None:
            results.append(None)
        else:
            value = tensor._value if tensor._own else np.array(tensor._value, copy=True)  # (never another's array)
            results.append(value if ctx.device.is_cpu else backend.to_device(value, ctx.device))
            tensor.changed = False    # (an output named twice is stored once)
    return tuple(results)


_ARGS = {"token": Arg("str", "", "the token of the function registered in this process"),
         "pickled_builder": Arg("str", "", "refused: stepnet never unpickles code from a model"),
         "pickled_grad_builder": Arg("str", "", "refused, as pickled_builder"),
         "pass_workspace": Arg("bool", False, "call f(inputs, outputs, workspace)"),
         "grad_output_indices": Arg("ints", [], "the outputs whose gradients the gradient function reads"),
         "grad_input_indices": Arg("ints", [], "the inputs whose gradients the gradient function writes"),
         "forced_cpu_outputs": Arg("ints", [], "outputs kept on the CPU (all are: the function works on host arrays)")}


def python_gradient_maker(g: GradientContext) -> None:
    """PythonGradient(inputs, outputs, output gradients) -> input gradients, each list narrowed to
    grad_output_indices / grad_input_indices where given (Caffe2's GetPythonGradient)."""
    go = g.arg("grad_output_indices") or list(range(g.n_outputs))
    gi = g.arg("grad_input_indices") or list(range(g.n_inputs))
    for which, indices, n in (("grad_output_indices", go, g.n_outputs), ("grad_input_indices", gi, g.n_inputs)):
        bad = [i for i in indices if not 0 <= i < n]
        if bad:
            raise ArgumentError(f"{which} {list(indices)} names index {bad[0]}, but the op has {n}", at=g.label)
    inputs = [g.I(i) for i in range(g.n_inputs)] + [g.O(i) for i in range(g.n_outputs)] + [g.GO(i) for i in go]
    g.op("PythonGradient", inputs, [g.GI(i) for i in gi])


@op("Python", inputs=(0, None), outputs=(0, None), context=True, devices="any", args=_ARGS,
    gradient=python_gradient_maker)
def python(ctx, xp, *values, token, pickled_builder, pickled_grad_builder, pass_workspace, grad_output_indices,
           grad_input_indices, forced_cpu_outputs):
    """Call the Python function registered under `token` in this process: f(inputs, outputs) with tensor
    objects (.data, .shape, .reshape, .feed), f(inputs, outputs, workspace) for pass_workspace. Any input may
    be written in place."""
    return _run(ctx, xp, values, token, pickled_builder, pass_workspace, gradient=False)


@op("PythonGradient", inputs=(0, None), outputs=(0, None), context=True, devices="any", args=_ARGS)
def python_gradient(ctx, xp, *values, token, pickled_builder, pickled_grad_builder, pass_workspace,
                    grad_output_indices, grad_input_indices, forced_cpu_outputs):
    """Call the gradient function registered with the Python op's function (grad_f, under `<token>_gradient`)
    with the forward inputs, outputs and output gradients as inputs and the input gradients as outputs."""
    return _run(ctx, xp, values, token, pickled_grad_builder, pass_workspace, gradient=True)


__all__ = ["FUNCTIONS", "PythonFunction", "PythonTensor", "register_function", "register_gradient_function"]
