"""Helpers for testing operators: build an OperatorDef, run it once on a device, get numpy results."""
from __future__ import annotations

import contextlib
import tracemalloc
from typing import Iterator, Sequence

import numpy as np

from .core import backend
from .core.int8 import Int8Tensor
from .io.proto import DeviceOption, NetDef, OperatorDef, make_argument, to_text
from .core.spec import TensorSpec
from .ops import REGISTRY
from .passes.shapes import infer_net
from .runtime.workspace import Workspace

# The emulated device stands in for CUDA on machines without a GPU; with CuPy and a GPU, "cuda" runs too.
DEVICES = ("cpu", "emulated") + (("cuda",) if backend.cupy_module() is not None else ())
GPU_MODE = {"cpu": None, "emulated": "emulate", "cuda": "cuda"}


@contextlib.contextmanager
def allocates_under(limit: int = 1 << 20) -> Iterator[None]:
    """Assert that the block's Python allocations (tracemalloc) peak under `limit` bytes: a file whose sizes lie
    is refused before anything of those sizes is allocated."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit, f"the block allocated up to {peak} bytes (limit {limit})"


def make_op(op_type: str, inputs: Sequence[str], outputs: Sequence[str], device: str = "cpu", **args) -> OperatorDef:
    """An OperatorDef with args converted the way Caffe2's Python front end converts them."""
    opdef = OperatorDef(type=op_type, input=list(inputs), output=list(outputs))
    for name, value in args.items():
        opdef.arg.append(make_argument(name, value))
    if device != "cpu":
        opdef.device_option.CopyFrom(DeviceOption(device_type=1, device_id=0))
    return opdef


def check_inferred_shapes(opdef, in_specs, ws) -> None:
    """The op's shape function (if any) must agree with the outputs it really produced."""
    from .io.proto import NetDef

    net = NetDef(name=f"{opdef.type}_shapes")
    net.op.add().CopyFrom(opdef)
    inferred = infer_net(net, in_specs)
    for name in opdef.output:
        got = inferred.get(name)
        value = ws.get_blob(name).value
        if got is None or got.shape is None or not hasattr(value, "shape"):
            continue
        real = tuple(value.shape)
        agree = len(got.shape) == len(real) and all(g is None or g == r for g, r in zip(got.shape, real))
        assert agree, f"{opdef.type}: shape function says {name} is {got.shape}, the kernel produced {real}"
        if got.dtype is not None:
            assert got.dtype == value.dtype, (
                f"{opdef.type}: shape function says {name} is {got.dtype}, the kernel produced {value.dtype}")
        real_quant = (value.scale, value.zero_point) if isinstance(value, Int8Tensor) else None
        if got.quant is not None or real_quant is not None:
            assert got.quant == real_quant, (f"{opdef.type}: shape function says {name} has quantization "
                                             f"{got.quant}, the kernel produced {real_quant}")


def nested_nets(levels: int, op_type: str, leaf: NetDef, text_at: int | None = None) -> NetDef:
    """Nets n{levels-1} ... n0, each an op_type op whose `net` argument holds the next (three message levels a
    wrapper: op, arg, net), around a copy of `leaf`; wrapper n{text_at} holds its net as text. Built in place,
    top down: protobuf's copies refuse more than 100 levels. For the nesting limit's tests."""
    top = nd = NetDef()
    for i in reversed(range(levels)):
        nd.name = f"n{i}"
        arg = nd.op.add(type=op_type).arg.add(name="net")
        if i == text_at:
            arg.s = to_text(nested_nets(text_at, op_type, leaf)).encode()
            return top
        nd = arg.n
    nd.CopyFrom(leaf)
    return top


def run_op(op_type: str, inputs, outputs=1, device: str = "cpu", ws: Workspace | None = None, **args):
    """Run one op on numpy inputs and return its outputs as host numpy arrays.

    inputs: a list of arrays (named in0, in1, ...) or a dict name -> array; outputs: a count or a list of
    names. Returns one array for one output, else a list. On device "emulated" the inputs are fed to the
    emulated GPU and the op runs there, so any host/device mixing in the kernel fails.
    """
    if not isinstance(inputs, dict):
        inputs = {f"in{i}": v for i, v in enumerate(inputs)}
    names = [f"out{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    ws = ws or Workspace(gpu=GPU_MODE[device])
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in inputs.items():
        ws.feed(name, value, device_option=do)
    opdef = make_op(op_type, list(inputs), names, device=device, **args)
    in_specs = {n: TensorSpec.of(backend.to_host(ws.get_blob(n).value)) for n in inputs
                if hasattr(ws.get_blob(n).value, "shape")}
    before = {n: _host_value(ws, n).copy() for n in inputs if n not in names and hasattr(ws.get_blob(n).value, "shape")}
    ws.run_operator_once(opdef)
    check_inferred_shapes(opdef, in_specs, ws)
    for n, value in before.items():   # kernels are pure: only an op's in-place outputs may change an input
        after = _host_value(ws, n)
        same = after.shape == value.shape and (np.array_equal(after, value, equal_nan=value.dtype.kind in "fc")
                                               if value.dtype != object else after.tolist() == value.tolist())
        assert same, f"{op_type} changed its input {n!r}, which is not one of its outputs"
    results, host = [], REGISTRY.get(op_type).host_outputs
    for i, n in enumerate(names):
        blob = ws.get_blob(n)
        value = blob.value.data if isinstance(blob.value, Int8Tensor) else blob.value
        if i in host:
            assert backend.device_of(value) in (None, backend.CPU_DEVICE), f"{op_type} output {n} is not on the host"
        elif device != "cpu" and isinstance(value, np.ndarray):
            dev = backend.device_of(value)
            assert dev is not None and not dev.is_cpu, f"{op_type} output {n} came back on the host"
        results.append(ws.fetch(n))
    return results[0] if len(results) == 1 else results


def _fresh(device: str, seed: int) -> Workspace:
    return Workspace(seed=seed, gpu=GPU_MODE[device])


def _host_value(ws: Workspace, name: str):
    value = ws.get_blob(name).value
    return np.asarray(backend.to_host(value.data if isinstance(value, Int8Tensor) else value))


def check_gradient(op_type: str, inputs, outputs=1, wrt=None, outputs_with_grads=None, device: str = "cpu",
                   float64: bool = True, eps: float = 1e-4, rtol: float = 1e-3, atol: float = 1e-5,
                   directions: int = 4, seed: int = 0, op_args: dict | None = None, **args) -> dict:
    """Check an op's registered gradient against float64 central differences; return the analytic gradients.

    The loss is L = sum_o sum(y_o * c_o) over outputs_with_grads with fixed random c_o (fed as the output
    gradients). Each checked input (wrt: indices, default every floating input) is compared element by element
    when it has at most 16 elements, otherwise along `directions` random unit directions. Raises AssertionError
    naming the op, input and the worst mismatch. op_args passes op arguments whose names clash with this
    function's own (e.g. Logit's eps).
    """
    from .passes.gradients import GradientSlice, backward_ops

    args = {**args, **(op_args or {})}
    if not isinstance(inputs, dict):
        inputs = {f"in{i}": v for i, v in enumerate(inputs)}
    inputs = {k: np.array(v, dtype=np.float64 if float64 and np.asarray(v).dtype.kind == "f" else None)
              for k, v in inputs.items()}
    names = list(inputs)
    out_names = [f"out{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    outputs_with_grads = list(range(len(out_names))) if outputs_with_grads is None else list(outputs_with_grads)
    opdef = make_op(op_type, names, out_names, device=device, **args)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    rng = np.random.default_rng(seed + 1)

    def forward(values: dict) -> Workspace:
        ws = _fresh(device, seed)
        for k, v in values.items():
            ws.feed(k, v, device_option=do)
        ws.run_operator_once(opdef)
        return ws

    ws = forward(inputs)
    cs = {}
    for o in outputs_with_grads:
        y = _host_value(ws, out_names[o])
        cs[out_names[o]] = rng.standard_normal(y.shape).astype(y.dtype)

    def loss(values: dict) -> float:
        w = forward(values)
        return float(sum((_host_value(w, n).astype(np.float64) * c).sum() for n, c in cs.items()))

    grad_ops, grad_map = backward_ops([opdef], {n: n + "_grad" for n in cs})
    for n, c in cs.items():
        ws.feed(n + "_grad", c, device_option=do)
    from .io.proto import NetDef
    gnet = NetDef(name=f"{op_type}_gradient")
    gnet.op.extend(grad_ops)
    ws.run_net_once(gnet)

    wrt = [i for i, n in enumerate(names) if inputs[n].dtype.kind == "f"] if wrt is None else list(wrt)
    analytic = {}
    for i in wrt:
        name = names[i]
        x = inputs[name]
        g = grad_map.get(name)
        assert g is not None, f"{op_type}: no gradient was produced for input {i} ({name})"
        if isinstance(g, GradientSlice):
            dense = np.zeros_like(x)
            np.add.at(dense, _host_value(ws, g.indices), _host_value(ws, g.values))
            ga = dense
        else:
            ga = _host_value(ws, g)
        assert ga.shape == x.shape, f"{op_type}: gradient of input {i} has shape {ga.shape}, input is {x.shape}"
        analytic[name] = ga
        if x.size <= 16:
            dirs = [np.eye(x.size, dtype=x.dtype)[k].reshape(x.shape) for k in range(x.size)]
        else:
            dirs = [d / np.linalg.norm(d) for d in (rng.standard_normal(x.shape) for _ in range(directions))]
        for k, d in enumerate(dirs):
            plus = dict(inputs, **{name: x + eps * d})
            minus = dict(inputs, **{name: x - eps * d})
            numeric = (loss(plus) - loss(minus)) / (2 * eps)
            exact = float((ga.astype(np.float64) * d).sum())
            if abs(numeric - exact) > atol + rtol * max(abs(numeric), abs(exact)):
                where = f"element {np.unravel_index(k, x.shape)}" if x.size <= 16 else f"random direction {k}"
                raise AssertionError(f"{op_type}: gradient of input {i} ({name}) is wrong at {where}: analytic "
                                     f"{exact:.6g}, finite differences {numeric:.6g}")
    return analytic


def infer_alone(op_type: str, inputs, outputs=1, **args) -> dict:
    """Specs of every blob after static inference of one op from its inputs' specs (nothing runs). inputs
    and outputs as in run_op."""
    inputs = inputs if isinstance(inputs, dict) else {f"in{i}": v for i, v in enumerate(inputs)}
    outputs = [f"out{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    from .io.proto import NetDef
    net = NetDef(name="static")
    net.op.append(make_op(op_type, list(inputs), outputs, **args))
    return infer_net(net, {n: TensorSpec.of(v) for n, v in inputs.items()})


def infer_static(op_type: str, inputs, n_out: int = 1, **args) -> list:
    """The output specs of one op from its shape function alone (nothing runs)."""
    specs = infer_alone(op_type, inputs, n_out, **args)
    return [specs[f"out{i}"] for i in range(n_out)]
