"""Helpers for testing operators: build an OperatorDef, run it once on a device, get numpy results."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import backend
from .proto import DeviceOption, OperatorDef, make_argument
from .shapes import TensorSpec, infer_net
from .workspace import Workspace

DEVICES = ("cpu", "emulated")  # the emulated device stands in for CUDA on machines without a GPU


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
    from .proto import NetDef

    net = NetDef(name=f"{opdef.type}_shapes")
    net.op.add().CopyFrom(opdef)
    inferred = infer_net(net, in_specs)
    for name in opdef.output:
        got = inferred.get(name)
        value = ws.get_blob(name).value
        if got is None or got.shape is None or not hasattr(value, "shape"):
            continue
        assert got.shape == tuple(value.shape), (
            f"{opdef.type}: shape function says {name} is {got.shape}, the kernel produced {tuple(value.shape)}")
        if got.dtype is not None:
            assert got.dtype == value.dtype, (
                f"{opdef.type}: shape function says {name} is {got.dtype}, the kernel produced {value.dtype}")


def run_op(op_type: str, inputs, outputs=1, device: str = "cpu", ws: Workspace | None = None, **args):
    """Run one op on numpy inputs and return its outputs as host numpy arrays.

    inputs: a list of arrays (named in0, in1, ...) or a dict name -> array; outputs: a count or a list of
    names. Returns one array for one output, else a list. On device "emulated" the inputs are fed to the
    emulated GPU and the op runs there, so any host/device mixing in the kernel fails.
    """
    if not isinstance(inputs, dict):
        inputs = {f"in{i}": v for i, v in enumerate(inputs)}
    names = [f"out{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    ws = ws or Workspace(gpu="emulate" if device == "emulated" else None)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in inputs.items():
        ws.feed(name, value, device_option=do)
    opdef = make_op(op_type, list(inputs), names, device=device, **args)
    in_specs = {n: TensorSpec.of(backend.to_host(ws.get_blob(n).value)) for n in inputs
                if hasattr(ws.get_blob(n).value, "shape")}
    ws.run_operator_once(opdef)
    check_inferred_shapes(opdef, in_specs, ws)
    results = []
    for n in names:
        blob = ws.get_blob(n)
        if device != "cpu" and isinstance(blob.value, np.ndarray):
            dev = backend.device_of(blob.value)
            assert dev is not None and not dev.is_cpu, f"{op_type} output {n} came back on the host"
        results.append(ws.fetch(n))
    return results[0] if len(results) == 1 else results
