"""Helpers for testing operators: build an OperatorDef, run it once on a device, get numpy results."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import backend
from .proto import DeviceOption, OperatorDef, make_argument
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
    ws.run_operator_once(make_op(op_type, list(inputs), names, device=device, **args))
    results = []
    for n in names:
        blob = ws.get_blob(n)
        if device != "cpu" and isinstance(blob.value, np.ndarray):
            dev = backend.device_of(blob.value)
            assert dev is not None and not dev.is_cpu, f"{op_type} output {n} came back on the host"
        results.append(ws.fetch(n))
    return results[0] if len(results) == 1 else results
