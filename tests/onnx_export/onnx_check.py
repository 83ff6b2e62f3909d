"""Run a net in stepnet and its ONNX export in onnxruntime, and compare every exported output."""
from __future__ import annotations

import numpy as np

from stepnet import NetDef, Workspace
from stepnet.testing import make_op

RTOL, ATOL = 1e-4, 1e-6


def ort_run(result, feeds: dict) -> dict:
    """The exported model's outputs by blob name, run in onnxruntime on the CPU."""
    import onnxruntime as ort

    session = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = list(result.outputs)
    got = session.run([result.outputs[b] for b in names], {k: np.asarray(v) for k, v in feeds.items()})
    return dict(zip(names, got))


def stepnet_run(net, init=None, feeds=(), params=(), names=()) -> dict:
    ws = Workspace(seed=0)
    if init is not None:
        ws.run_net_once(init)
    for k, v in {**dict(params), **dict(feeds)}.items():
        ws.feed(k, v)
    ws.create_net(net).run()
    return {n: np.asarray(ws.fetch(n)) for n in names}


def compare(net, init=None, feeds=None, params=None, outputs=None, rtol=RTOL, atol=ATOL, scaled=(), **options):
    """Export, run both, assert every output agrees; returns (ExportResult, largest absolute difference).
    Outputs named in `scaled` (pre-softmax logits, where float32 sums of many terms cancel) are compared
    with atol = rtol x their largest magnitude."""
    from stepnet.export.onnx import export_onnx

    feeds, params = dict(feeds or {}), dict(params or {})
    result = export_onnx(net, init, inputs=feeds, params=params, outputs=outputs, **options)
    got = ort_run(result, feeds)
    want = stepnet_run(net, init, feeds, params, list(result.outputs))
    worst = 0.0
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, g.dtype, w.shape, w.dtype)
        tol = max(atol, rtol * float(np.abs(w).max())) if name in scaled and w.size else atol
        np.testing.assert_allclose(g, w, rtol=rtol, atol=tol, err_msg=name)
        if w.size and w.dtype.kind in "fiu":
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
    return result, worst


def one_op(op_type: str, inputs: dict, outputs=1, consts=(), **args) -> NetDef:
    """A net of one op reading `inputs` (by name) and writing out0, out1, ... (its external outputs)."""
    names = [f"out{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    net = NetDef(name=f"{op_type}_net", external_input=list(inputs), external_output=names)
    net.op.append(make_op(op_type, list(inputs), names, **args))
    return net


def check_op(op_type: str, inputs: dict, outputs=1, consts=(), opset=None, **args) -> float:
    """One op exported and compared; inputs named in consts are initializers, the others graph inputs."""
    net = one_op(op_type, inputs, outputs, **args)
    feeds = {k: v for k, v in inputs.items() if k not in consts}
    params = {k: v for k, v in inputs.items() if k in consts}
    return compare(net, feeds=feeds, params=params, opset=opset)[1]
