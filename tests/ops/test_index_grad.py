"""Gradients of the gathers: float64 finite differences on every device (sparse gradients densified), the ops
and GradientSlices Caffe2's makers give, a net where one embedding feeds two sparse consumers (a Gather and a
SparseLengthsSum), the gradient kernel against a loop reference, the refused cases and the no-gradient kinds,
and a broken gradient kernel caught. The lengths/segment operators' gradients are in test_segment_grad.py."""
import numpy as np
import pytest
from sparse_grad_data import f32, f64, i32

from stepnet.core import backend
from stepnet.core.errors import ShapeError
from stepnet.passes.gradients import GradientError, GradientSlice, backward_ops
from stepnet.ops import REGISTRY
from stepnet.ops.registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT
from stepnet.io.proto import DeviceOption, NetDef, argument_value
from stepnet.testing import DEVICES, check_gradient, make_op, run_op
from stepnet.runtime.workspace import Workspace


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


# ----------------------------------------------------------------------------------------- finite differences
CASES = [   # (op, inputs, args, wrt)
    ("Gather", [f64(5, 3), i32(0, 2, 2, 4)], {}, None),                           # sparse, repeated rows
    ("Gather", [f64(5, 3), np.array([[0, -1], [2, 2]], dtype=np.int64)], {}, None),  # 2-D, wrapped negative
    ("Gather", [f64(5, 3), i32(0, 2, 2, 4)], {"dense_gradient": 1}, None),
    ("Gather", [f64(3, 5, 2), i32(0, 4, 4)], {"axis": 1}, None),
    ("Gather", [f64(3, 5, 2), i32(0, 4, 4)], {"axis": 1, "dense_gradient": 1}, None),
    ("Gather", [f64(2, 3, 4), i32(3, 0)], {"axis": -1}, None),
    ("Gather", [f64(3, 5, 2), np.array([[0, 4], [1, 1], [3, 2]])], {"axis": 1, "match_outer": 1}, None),
    ("BatchGather", [f64(3, 5, 2), i32(0, 4, 4)], {}, None),
    ("BatchGather", [f64(2, 4), np.array([[1, 1], [3, 0]])], {}, None),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, wrt", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gradients_match_finite_differences(op_type, inputs, args, wrt, device):
    check_gradient(op_type, inputs, wrt=wrt, device=device, **args)


# ------------------------------------------------------------------------------------------- emitted ops
def test_gather_gives_a_gradient_slice_of_its_indices_and_dy_without_ops():
    ops, grads = backward_ops([make_op("Gather", ["w", "idx"], ["e"])], {"e": "e_grad"})
    assert ops == [] and grads["w"] == GradientSlice("idx", "e_grad") and "idx" not in grads


def test_gather_dense_gradient_emits_sparse_to_dense_with_gathers_arguments():
    ops, grads = backward_ops([make_op("Gather", ["w", "idx"], ["e"], dense_gradient=1)], {"e": "e_grad"})
    assert sig(ops) == [("SparseToDense", ["idx", "e_grad", "w"], ["w_grad"], {"dense_gradient": 1})]
    assert grads["w"] == "w_grad"


def test_gather_along_axis_one_emits_batch_gather_gradient():
    fwd = make_op("Gather", ["w", "idx"], ["e"], axis=1, match_outer=1)
    ops, grads = backward_ops([fwd], {"e": "e_grad"})
    assert sig(ops) == [("BatchGatherGradient", ["w", "idx", "e_grad"], ["w_grad"],
                         {"axis": 1, "match_outer": 1})]
    ops, _ = backward_ops([make_op("BatchGather", ["w", "idx"], ["e"])], {"e": "e_grad"})
    assert sig(ops) == [("BatchGatherGradient", ["w", "idx", "e_grad"], ["w_grad"], {})]


def test_gather_along_axis_one_refuses_an_explicit_sparse_gradient():
    with pytest.raises(GradientError, match="axis 1 has only a dense gradient.*dense_gradient=0"):
        backward_ops([make_op("Gather", ["w", "idx"], ["e"], axis=1, dense_gradient=0)], {"e": "e_grad"})


@pytest.mark.parametrize("kind, op_type", [
    (NO_GRADIENT, "OneHot"), (NO_GRADIENT, "BatchOneHot"), (SHOULD_NOT_DO_GRADIENT, "ArgMax"),
    (SHOULD_NOT_DO_GRADIENT, "ArgMin"), (None, "GatherRanges")])
def test_no_gradient_kinds_are_caffe2s(kind, op_type):
    assert REGISTRY.get(op_type).gradient == kind


def test_asking_for_the_gradient_of_gather_ranges_is_an_error():
    with pytest.raises(GradientError, match=r"\(GatherRanges\) has no gradient registered"):
        backward_ops([make_op("GatherRanges", ["d", "r"], ["y", "len"])], {"y": "y_grad"})


# ------------------------------------------------------------------- one embedding, two sparse consumers
def _run(net, feeds, device, fetch):
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in feeds.items():
        ws.feed(name, value, device_option=do)
    ws.run_net_once(net)
    return [np.asarray(backend.to_host(ws.get_blob(n).value)) for n in fetch]


@pytest.mark.parametrize("device", DEVICES)
def test_an_embedding_feeding_two_sparse_consumers_gets_concatenated_slices(device):
    """W is gathered twice (Gather and SparseLengthsSum); its two GradientSlices become two Concats, and the
    densified result matches central differences of sum(y * c) over the forward net."""
    w, i1, i2, lens = f64(6, 3), i32(5, 1, 1), i32(0, 5, 3, 3), i32(3, 1)
    c = f64(5, 3)
    fwd = [make_op("Gather", ["W", "I1"], ["e1"], device=device),
           make_op("SparseLengthsSum", ["W", "I2", "L"], ["e2"], device=device),
           make_op("Concat", ["e1", "e2"], ["y", "y_info"], axis=0, device=device)]
    ops, grads = backward_ops(fwd, {"y": "y_grad"})
    assert grads["W"] == GradientSlice("W_grad_indices_concat", "W_grad_values_concat")
    assert [(o.type, list(o.input)) for o in ops[-2:]] == [
        ("Concat", ["I2", "I1"]), ("Concat", ["W_grad_values", "e1_grad"])]
    net = NetDef(name="embedding")
    net.op.extend(fwd + ops)
    feeds = {"W": w, "I1": i1, "I2": i2, "L": lens, "y_grad": c}
    idx, vals = _run(net, feeds, device, ["W_grad_indices_concat", "W_grad_values_concat"])
    dense = np.zeros_like(w)
    for k, row in enumerate(idx):
        dense[row] += vals[k]
    forward = NetDef(name="forward")
    forward.op.extend(fwd)
    eps = 1e-5
    for r, col in np.ndindex(*w.shape):
        plus, minus = w.copy(), w.copy()
        plus[r, col] += eps
        minus[r, col] -= eps
        lp = (_run(forward, dict(feeds, W=plus), device, ["y"])[0] * c).sum()
        lm = (_run(forward, dict(feeds, W=minus), device, ["y"])[0] * c).sum()
        assert abs((lp - lm) / (2 * eps) - dense[r, col]) < 1e-6, (r, col)
    assert not dense[2].any() and not dense[4].any()   # rows no consumer picked get nothing


# --------------------------------------------------------------------------------------- gradient kernels
def ref_batch_gather_gradient(data, indices, grad, axis, match_outer):
    out = np.zeros_like(data)
    axis %= data.ndim
    outer = int(np.prod(data.shape[:axis]))
    d3 = out.reshape(outer, data.shape[axis], -1)
    ids = indices.reshape(outer, -1) if match_outer else np.tile(indices.reshape(1, -1), (outer, 1))
    g3 = grad.reshape(outer, ids.shape[1], -1)
    for o in range(outer):
        for n, j in enumerate(ids[o]):
            d3[o, j] += g3[o, n]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, indices, axis, match_outer", [
    ((3, 5, 2), i32(0, 4, 4, 1), 1, False), ((2, 3, 4), np.array([[3, 3], [0, 2]]), 2, False),
    ((3, 4), np.array([[1, 1], [0, 3], [2, 2]]), 1, True), ((4, 2), i32(3, 3, 0), 0, False)])
def test_batch_gather_gradient_kernel_against_a_loop(shape, indices, axis, match_outer, device):
    data = f32(*shape)
    y = run_op("Gather", [data, indices], axis=axis, match_outer=match_outer, device=device)
    grad = f32(*y.shape)
    got = run_op("BatchGatherGradient", [data, indices, grad], axis=axis, match_outer=match_outer,
                 device=device)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref_batch_gather_gradient(data, indices, grad, axis, match_outer),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op_type, inputs, args, message", [
    ("BatchGatherGradient", [np.zeros((2, 3)), i32(-1), np.zeros((2, 1))], {},
     r"INDICES\[0\] = -1 is out of bounds; valid indices: 0..2"),
    ("BatchGatherGradient", [np.zeros((2, 3)), i32(0, 1), np.zeros((2, 3))], {},
     "dY .* must hold 4 elements"),
    ("BatchGatherGradient", [np.zeros(3), i32(0), np.zeros(1)], {}, "at least 2-D"),
])
def test_gradient_kernels_reject_bad_inputs(op_type, inputs, args, message):
    with pytest.raises(ShapeError, match=message):
        run_op(op_type, inputs, **args)


# ------------------------------------------------------------------------------------------ test the tester
def test_check_gradient_catches_a_batch_gather_gradient_that_drops_repeats(broken):
    def last_wins(xp, data, indices, grad, axis, match_outer, **_):
        out = xp.zeros(data.shape, dtype=data.dtype)
        out[:, indices] = grad
        return out
    broken("BatchGatherGradient", last_wins)
    with pytest.raises(AssertionError, match="BatchGather: gradient of input 0"):
        check_gradient("BatchGather", [f64(3, 4), i32(1, 1, 2)])
