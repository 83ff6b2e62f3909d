"""Helpers of the control-flow tests: nets from ops, workspaces fed on a device, and a whole-net gradient check
against float64 central differences of the net's loss."""
from __future__ import annotations

import numpy as np

from stepnet.core import backend
from stepnet.passes.gradients import backward_ops
from stepnet.io.proto import DeviceOption, NetDef
from stepnet.testing import GPU_MODE, make_op
from stepnet.runtime.workspace import Workspace


def net(name: str, *ops, external_input=(), external_output=()) -> NetDef:
    n = NetDef(name=name)
    n.op.extend(ops)
    n.external_input.extend(external_input)
    n.external_output.extend(external_output)
    return n


def op_on(device: str):
    """make_op for ops that run on `device`."""
    return lambda op_type, inputs, outputs, **args: make_op(op_type, inputs, outputs, device=device, **args)


def workspace(device: str = "cpu", **feeds) -> Workspace:
    ws = Workspace(seed=0, gpu=GPU_MODE[device])
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in feeds.items():
        ws.feed(name, value, device_option=do)
    return ws


def host(ws: Workspace, name: str) -> np.ndarray:
    return np.asarray(backend.to_host(ws.get_blob(name).value))


def run(netdef: NetDef, device: str = "cpu", **feeds) -> Workspace:
    ws = workspace(device, **feeds)
    ws.run_net_once(netdef)
    return ws


def net_gradients(forward: NetDef, feeds: dict, device: str = "cpu", loss: str = "loss", runs: int = 1):
    """Run forward + its backward ops (the loss gradient fed as ones) `runs` times in one workspace, as a training
    loop does; return (workspace, {blob: gradient name}, backward NetDef)."""
    ops, grads = backward_ops(forward.op, {loss: loss + "_grad"})
    backward = net(forward.name + "_backward", *ops)
    ws = workspace(device, **feeds)
    fwd = ws.create_net(forward)
    bwd = None
    for _ in range(runs):
        fwd.run()
        ws.feed(loss + "_grad", np.ones_like(host(ws, loss)), device_option=_device_option(device))
        bwd = bwd or ws.create_net(backward)
        bwd.run()
    return ws, grads, backward


def _device_option(device):
    return DeviceOption(device_type=1) if device != "cpu" else None


def check_net_gradient(forward: NetDef, feeds: dict, wrt, device: str = "cpu", eps: float = 1e-6,
                       rtol: float = 1e-6, atol: float = 1e-7, runs: int = 1) -> dict:
    """The gradients the backward pass builds for `wrt` against float64 central differences of the whole net's
    scalar `loss`, element by element; AssertionError naming the blob and element where they differ."""
    feeds = {k: np.asarray(v) for k, v in feeds.items()}
    ws, grads, _ = net_gradients(forward, feeds, device, runs=runs)

    def loss(values):
        return float(host(run(forward, device, **values), "loss").sum())

    out = {}
    for name in wrt:
        assert name in grads, f"no gradient was made for {name!r}"
        analytic = host(ws, grads[name])
        x = feeds[name]
        assert analytic.shape == x.shape, f"gradient of {name!r} has shape {analytic.shape}, the blob {x.shape}"
        for k in range(x.size):
            d = np.zeros(x.size)
            d[k] = eps
            d = d.reshape(x.shape)
            numeric = (loss(dict(feeds, **{name: x + d})) - loss(dict(feeds, **{name: x - d}))) / (2 * eps)
            exact = float(analytic.reshape(-1)[k])
            if abs(numeric - exact) > atol + rtol * max(abs(numeric), abs(exact)):
                raise AssertionError(f"gradient of {name!r} is wrong at element {k}: analytic {exact:.9g}, "
                                     f"finite differences {numeric:.9g}")
        out[name] = analytic
    return out
