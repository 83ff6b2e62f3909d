"""Device copy operators (CopyCPUToGPU, CopyGPUToCPU, CopyFromCPUInput, EnsureCPUOutput, CopyOnDeviceLike):
values, specs and where each copy lands, on every device; their gradients (the copy back, dense and sparse,
and a net whose gradients cross devices, against central differences); Caffe2's no-gradient kinds; and
broken kernels caught."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core import backend
from stepnet.passes.gradients import GradientError, GradientSlice, add_gradient_ops, backward_ops
from stepnet.ops import REGISTRY
from stepnet.ops.registry import NO_GRADIENT
from stepnet.io.proto import DeviceOption, argument_value
from stepnet.core.spec import TensorSpec
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, GPU_MODE, make_op, run_op

rng = np.random.default_rng(3)
GPU = DeviceOption(device_type=1)
ACCELERATED = [d for d in DEVICES if d != "cpu"]


def f32(*shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def net(name, *ops):
    nd = NetDef(name=name)
    nd.op.extend(ops)
    return nd


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


def workspace(device):
    return Workspace(gpu="emulate" if device != "cpu" else None)


# --------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("op_type", ["CopyCPUToGPU", "CopyGPUToCPU", "CopyFromCPUInput", "EnsureCPUOutput"])
def test_copies_keep_spec_and_value(op_type):
    x = np.array([[1, 2], [3, 4]], np.int64)
    out = infer_net(net("copy", make_op(op_type, ["x"], ["y"])), {"x": TensorSpec.of(x)})["y"]
    assert out.shape == (2, 2) and out.dtype == np.int64 and out.value.tolist() == x.tolist()
    ws = Workspace(gpu="emulate")
    ws.feed("x", x)
    ws.run_operator_once(make_op(op_type, ["x"], ["y"], device="emulated"))
    assert ws.fetch("y").tolist() == x.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_copy_on_device_like_cross_checked(device):
    x = f32(3, 2)
    got = run_op("CopyOnDeviceLike", [x, np.zeros(1, np.float32)], device=device)
    assert got.tolist() == x.tolist()


def check_copy(op_type, device, x_on, want_on, like_on=None):
    """Run one copy op (its DeviceOption on `device`) on x placed on the host or that device; the output must
    hold x's values and dtype, be a new array, and live on the host or that device as `want_on` says."""
    ws = Workspace(gpu=GPU_MODE[device])
    x = np.array([[1.5, -2.0], [3.0, 0.25]], np.float32)
    ws.feed("x", x, device_option=GPU if x_on == "device" else None)
    inputs = ["x"]
    if like_on is not None:
        ws.feed("like", np.zeros(1, np.float32), device_option=GPU if like_on == "device" else None)
        inputs.append("like")
    ws.run_operator_once(make_op(op_type, inputs, ["y"], device=device))
    y, x_in = ws.get_blob("y").value, ws.get_blob("x").value
    where = backend.device_of(y)
    assert where is not None, f"{op_type}: output is not an array"
    assert where.is_cpu == (want_on == "host"), f"{op_type}: output on {where}, expected the {want_on}"
    assert y is not x_in, f"{op_type}: output is its input, not a copy"
    host = backend.to_host(y)
    assert host.dtype == x.dtype and host.tolist() == x.tolist(), f"{op_type}: values {host.tolist()}"


@pytest.mark.parametrize("device", ACCELERATED)
@pytest.mark.parametrize("op_type, x_on, want_on, like_on", [
    ("CopyCPUToGPU", "host", "device", None), ("CopyFromCPUInput", "host", "device", None),
    ("CopyGPUToCPU", "device", "host", None), ("EnsureCPUOutput", "device", "host", None),
    ("EnsureCPUOutput", "host", "host", None),
    ("CopyOnDeviceLike", "host", "device", "device"), ("CopyOnDeviceLike", "device", "host", "host"),
])
def test_copies_land_where_caffe2_puts_them(op_type, x_on, want_on, like_on, device):
    check_copy(op_type, device, x_on, want_on, like_on)


@pytest.mark.parametrize("device", ACCELERATED)
@pytest.mark.parametrize("op_type, wrong, x_on, want_on", [
    ("CopyCPUToGPU", lambda ctx, xp, x: x, "host", "device"),                     # no copy at all
    ("CopyGPUToCPU", lambda ctx, xp, x: x.copy(), "device", "host"),              # copied, but on the device
    ("EnsureCPUOutput", lambda ctx, xp, x: backend.to_host(x)[::-1].copy(), "device", "host"),  # rows swapped
])
def test_the_placement_check_catches_broken_copies(op_type, wrong, x_on, want_on, device, broken):
    check_copy(op_type, device, x_on, want_on)      # the real kernel passes ...
    broken(op_type, wrong)
    with pytest.raises(AssertionError):             # ... the wrong one does not
        check_copy(op_type, device, x_on, want_on)


# --------------------------------------------------------------------------------------------- gradients
def test_device_copies_emit_the_copy_back_dense_and_sparse():
    for fwd_type, back_type in (("CopyGPUToCPU", "CopyCPUToGPU"), ("CopyCPUToGPU", "CopyGPUToCPU")):
        fwd = make_op(fwd_type, ["x"], ["y"], device="emulated")
        ops, grads = backward_ops([fwd], {"y": "g"})
        assert sig(ops) == [(back_type, ["g"], ["x_grad"], {})]
        assert ops[0].device_option == fwd.device_option and grads["x"] == "x_grad"
        ops, grads = backward_ops([fwd], {"y": GradientSlice("gi", "gv")})
        assert sig(ops) == [(back_type, ["gi"], ["x_grad_indices"], {}),
                            (back_type, ["gv"], ["x_grad_values"], {})]
        assert grads["x"] == GradientSlice("x_grad_indices", "x_grad_values")


def test_ensure_cpu_output_stops_the_gradient_and_the_others_have_none():
    ops, grads = backward_ops([make_op("EnsureCPUOutput", ["x"], ["y"])], {"y": "g"})
    assert ops == [] and "x" not in grads
    for op_type, ins in (("CopyFromCPUInput", ["x"]), ("CopyOnDeviceLike", ["x", "like"])):
        with pytest.raises(GradientError, match="no gradient registered"):
            backward_ops([make_op(op_type, ins, ["y"])], {"y": "g"})


def crossing_net():
    """x (host) -> CopyCPUToGPU -> FC on the device -> CopyGPUToCPU -> SumElements on the host -> loss."""
    return [make_op("CopyCPUToGPU", ["x"], ["x_dev"], device="emulated"),
            make_op("FC", ["x_dev", "W", "b"], ["y_dev"], device="emulated"),
            make_op("CopyGPUToCPU", ["y_dev"], ["y"], device="emulated"),
            make_op("Scale", ["y"], ["y2"], scale=0.5),
            make_op("SumElements", ["y2"], ["loss"])]


def run_crossing(x, W, b, losses=None):
    ws = workspace("emulated")
    ws.feed("x", x)
    for name, v in (("W", W), ("b", b)):
        ws.feed(name, v, device_option=GPU)
    net = NetDef(name="crossing")
    net.op.extend(crossing_net())
    grads = add_gradient_ops(net, losses) if losses else {}
    ws.run_net_once(net)
    return ws, grads


def test_gradients_cross_devices_back_through_the_copies():
    x, W, b = rng.standard_normal((3, 4)), rng.standard_normal((2, 4)), rng.standard_normal(2)
    ws, grads = run_crossing(x, W, b, ["loss"])
    gx = ws.get_blob(grads["x"]).value
    assert backend.device_of(gx).is_cpu                                  # back on the host, like x
    assert not backend.device_of(ws.get_blob(grads["x_dev"]).value).is_cpu
    assert not backend.device_of(ws.get_blob(grads["W"]).value).is_cpu   # with W on the device
    eps, numeric = 1e-6, np.zeros_like(x)
    for k in range(x.size):
        d = np.zeros(x.size)
        d[k] = eps
        plus = run_crossing(x + d.reshape(x.shape), W, b)[0].fetch("loss")
        minus = run_crossing(x - d.reshape(x.shape), W, b)[0].fetch("loss")
        numeric.reshape(-1)[k] = (float(plus) - float(minus)) / (2 * eps)
    np.testing.assert_allclose(np.asarray(gx), numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind, op_type", [(NO_GRADIENT, "EnsureCPUOutput"), (None, "CopyFromCPUInput"),
                                           (None, "CopyOnDeviceLike")])
def test_no_gradient_kinds_are_caffe2s(kind, op_type):
    assert REGISTRY.get(op_type).gradient == kind


# ------------------------------------------------------------------------------------------------- the tester
def test_the_crossing_check_catches_a_copy_back_that_drops_values(broken):
    kernel = REGISTRY.get("CopyGPUToCPU").kernel

    def wrong(ctx, xp, x):
        y = kernel(ctx, xp, x)
        if ctx.opdef.is_gradient_op:
            y[0] = 0
        return y
    broken("CopyGPUToCPU", wrong)
    with pytest.raises(AssertionError):
        test_gradients_cross_devices_back_through_the_copies()
