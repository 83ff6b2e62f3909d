"""Helpers of the optimizer tests: run one op as a created net over several iterations, in place, the way
Caffe2's training nets do (state blobs fed once, per-iteration inputs fed before each run)."""
from __future__ import annotations

import numpy as np

from stepnet import NetDef, Workspace
from stepnet.io.proto import DeviceOption
from stepnet.testing import make_op

GPU = DeviceOption(device_type=1)
CPU = DeviceOption(device_type=0)
INT64 = 10


def workspace(device: str) -> Workspace:
    return Workspace(gpu="emulate" if device != "cpu" else None)


def feed(ws, name, value, device, host=False) -> None:
    """Feed on the op's device, or on the CPU for host inputs (iteration counters), as Caffe2 keeps them."""
    ws.feed(name, value, device_option=GPU if device != "cpu" and not host else None)


def one_op_net(op_type, inputs, outputs, device, **args) -> NetDef:
    net = NetDef(name=f"{op_type}_steps")
    net.op.append(make_op(op_type, inputs, outputs, device=device, **args))
    return net


def run_steps(op_type, inputs, outputs, state: dict, steps: list[dict], device: str, host=(), **args):
    """Create a net with one op over blobs `inputs` -> `outputs`, feed `state` once, then for each dict of
    `steps` feed it and run the net; returns, per step, {output name: host array}."""
    ws = workspace(device)
    for name, value in state.items():
        feed(ws, name, value, device, name in host)
    for name, value in steps[0].items():
        feed(ws, name, value, device, name in host)
    net = ws.create_net(one_op_net(op_type, inputs, outputs, device, **args))
    results = []
    for step in steps:
        for name, value in step.items():
            feed(ws, name, value, device, name in host)
        net.run()
        results.append({name: ws.fetch(name) for name in outputs})
    return results


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def lr_blob(value):
    return np.array([value], np.float32)


def counter(value):
    return np.array([value], np.int64)


def assert_close(got, want, rtol=2e-5, atol=2e-6, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}, expected float32"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
