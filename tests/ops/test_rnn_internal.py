"""The internal ops of RecurrentNetwork's step nets (stepnet/ops/rnn_internal.py) against their definitions:
link views of rows, gradient accumulation into a row, and the deferred FC gradient pair against FCGradient
summed over the steps."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.io.proto import DeviceOption
from stepnet.testing import DEVICES, GPU_MODE, make_op, run_op


def _apply_link(ws, offset, window, t):
    ws.feed("timestep", np.array([t], np.int32))
    ws.run_operator_once(make_op("rnn_internal_apply_link", ["timestep", "states"], ["view", "states"],
                                 offset=offset, window=window))


def test_apply_link_op_points_its_output_at_rows_of_the_external_tensor():
    """The registered rnn_internal_apply_link op (RecurrentNetwork sets these views itself): a view of rows
    [t + offset, t + offset + window), so what is written into it lands in the external tensor."""
    ws = Workspace()
    states = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    ws.feed("states", states)
    _apply_link(ws, 1, 2, 1)
    view = ws.get_blob("view")
    np.testing.assert_array_equal(view.value, states[2:4])
    view.set(np.full((2, 3, 2), -1, np.float32))
    np.testing.assert_array_equal(ws.fetch("states")[2:4], -1)
    np.testing.assert_array_equal(ws.fetch("states")[:2], states[:2])


@pytest.mark.parametrize("offset, window, t, error, message", [
    (1, 2, 2, ShapeError, r"link 'view' -> 'states': at timestep 2 the window rows \[3, 5\) \(offset 1, window 2\) "
     r"run past the end of its 4 rows \(4, 3, 2\)"),
    (-1, 1, 0, ArgumentError, r"link offset \(-1\) and window \(1\) must be >= 0"),
])
def test_apply_link_op_bad_windows(offset, window, t, error, message):
    ws = Workspace()
    ws.feed("states", np.zeros((4, 3, 2), np.float32))
    with pytest.raises(error, match=message):
        _apply_link(ws, offset, window, t)


def test_apply_link_op_refuses_an_empty_tensor():
    ws = Workspace()
    ws.feed("states", np.zeros((0, 3), np.float32))
    with pytest.raises(ShapeError, match="linked tensor 'states' is empty; a link needs a tensor with rows"):
        _apply_link(ws, 0, 1, 0)


def links_ws(t: int, device="cpu") -> Workspace:
    ws = Workspace(gpu=GPU_MODE[device])
    do = DeviceOption(device_type=1) if device != "cpu" else None
    ws.feed("timestep", np.array([t], np.int32))
    ws.feed("states", np.arange(24, dtype=np.float32).reshape(4, 3, 2), device_option=do)
    ws.feed("x", np.arange(12, dtype=np.float32).reshape(6, 2), device_option=do)
    return ws


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t", [0, 1, 2])
def test_apply_links_views_every_links_rows(t, device):
    """rnn_internal_apply_links: internal j is rows [t + offsets[j], t + offsets[j] + windows[j]) of external j,
    and a write into it lands in the external tensor."""
    ws = links_ws(t, device)
    states, x = ws.fetch("states"), ws.fetch("x")
    ws.run_operator_once(make_op("rnn_internal_apply_links", ["timestep", "states", "states", "x"],
                                 ["prev", "next", "x_t"], offsets=[0, 1, t], windows=[1, 1, 2]))
    for name, expected in (("prev", states[t:t + 1]), ("next", states[t + 1:t + 2]), ("x_t", x[2 * t:2 * t + 2])):
        np.testing.assert_array_equal(ws.fetch(name), expected)
    blob = ws.get_blob("next")
    blob.set(blob.value * 0 - 5)
    np.testing.assert_array_equal(ws.fetch("states")[t + 1], -5)
    np.testing.assert_array_equal(np.delete(ws.fetch("states"), t + 1, axis=0), np.delete(states, t + 1, axis=0))


@pytest.mark.parametrize("args, error, message", [
    (dict(offsets=[0, 3], windows=[1, 2]), ShapeError,
     r"link 'b' -> 'x': at timestep 2 the window rows \[5, 7\) \(offset 3, window 2\) run past the end of its 6 "
     r"rows \(6, 2\)"),
    (dict(offsets=[0], windows=[1, 1]), ArgumentError, "2 linked tensors, 2 link blobs, 1 offsets, 2 windows"),
    (dict(offsets=[0, 0], windows=[1, 1], keep=[1]), ArgumentError, "2 windows and 1 / 0 / 0 keep / cyclic"),
    (dict(offsets=[0, -1], windows=[1, 1]), ArgumentError, r"link offset \(-1\) and window \(1\) must be >= 0"),
])
def test_apply_links_bad_windows(args, error, message):
    ws = links_ws(2)
    with pytest.raises(error, match=message):
        ws.run_operator_once(make_op("rnn_internal_apply_links", ["timestep", "states", "x"], ["a", "b"], **args))


@pytest.mark.parametrize("device", DEVICES)
def test_accumulate_gradient_input_adds_row_t_into_row_t_plus_offset(device):
    rng = np.random.default_rng(0)
    og, g = rng.standard_normal((3, 2, 4)).astype(np.float32), rng.standard_normal((4, 2, 4)).astype(np.float32)
    for t in range(3):
        expected = g.copy()
        for n in range(2):
            for d in range(4):
                expected[t + 1, n, d] = g[t + 1, n, d] + og[t, n, d]
        ws = Workspace(gpu=GPU_MODE[device])
        do = DeviceOption(device_type=1) if device != "cpu" else None
        ws.feed("timestep", np.array([t], np.int32))
        ws.feed("og", og, device_option=do)
        ws.feed("g", g, device_option=do)
        ws.run_operator_once(make_op("rnn_internal_accumulate_gradient_input", ["timestep", "og", "g"], ["g"],
                                     device=device, offset=1))
        np.testing.assert_array_equal(ws.fetch("g"), expected)


def deferred_net(T: int, device: str) -> tuple[NetDef, NetDef]:
    step = NetDef(name="step", op=[make_op("rnn_internal_fc_gradient_deferred",
                                           ["timestep", "seq", "X", "W", "dY", "xs", "dys"], ["dX", "xs", "dys"],
                                           device=device)])
    after = NetDef(name="after", op=[make_op("rnn_internal_fc_weight_gradient", ["xs", "dys", "dW", "db"],
                                             ["dW", "db"], device=device)])
    return step, after


@pytest.mark.parametrize("device", DEVICES)
def test_deferred_fc_gradient_equals_fc_gradient_summed_over_the_steps(device):
    """Per step dX = dY·W; after T steps (visited T-1 .. 0) dW and db grow by Σ_t dY_tᵀ·X_t and Σ_t Σ_rows dY_t,
    computed here with loops over rows; a second run with a shorter sequence reuses nothing stale."""
    rng = np.random.default_rng(1)
    M, K, N = 3, 4, 5
    W = rng.standard_normal((N, K))
    do = DeviceOption(device_type=1) if device != "cpu" else None
    ws = Workspace(gpu=GPU_MODE[device])
    step, after = deferred_net(0, device)
    for T in (4, 2):
        X, dY = rng.standard_normal((T, M, K)), rng.standard_normal((T, M, N))
        dW0, db0 = rng.standard_normal((N, K)), rng.standard_normal(N)
        for name, value in (("seq", np.zeros((T, 1), np.float32)), ("W", W), ("dW", dW0), ("db", db0)):
            ws.feed(name, np.asarray(value, np.float32), device_option=do)
        ws.create_blob("xs"), ws.create_blob("dys")
        for t in reversed(range(T)):
            ws.feed("timestep", np.array([t], np.int32))
            ws.feed("X", X[t].astype(np.float32), device_option=do)
            ws.feed("dY", dY[t].astype(np.float32), device_option=do)
            ws.bind(step).run()
            np.testing.assert_allclose(ws.fetch("dX"), dY[t] @ W, rtol=1e-5, atol=1e-5)
        ws.bind(after).run()
        dW, db = dW0.copy(), db0.copy()
        for t in range(T):
            for m in range(M):
                dW += np.outer(dY[t, m], X[t, m])
                db += dY[t, m]
        np.testing.assert_allclose(ws.fetch("dW"), dW, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ws.fetch("db"), db, rtol=1e-5, atol=1e-5)


def test_deferred_fc_gradient_checks_shapes_and_the_timestep():
    ws = Workspace()
    for name, shape in (("seq", (2, 1)), ("X", (3, 4)), ("W", (5, 4)), ("dY", (3, 6))):
        ws.feed(name, np.zeros(shape, np.float32))
    ws.feed("timestep", np.array([0], np.int32))
    ws.create_blob("xs"), ws.create_blob("dys")
    step, _ = deferred_net(2, "cpu")
    with pytest.raises(ShapeError, match=r"dY \(3, 6\) must hold M x N = 3 x 5 = 15 elements"):
        ws.bind(step).run()
    ws.feed("dY", np.zeros((3, 5), np.float32))
    ws.feed("timestep", np.array([2], np.int32))
    with pytest.raises(ShapeError, match=r"timestep 2 is outside the 2 steps of the sequence \(2, 1\)"):
        ws.bind(step).run()
    ws.feed("seq", np.float32(2))
    with pytest.raises(ShapeError, match=r"the sequence input must be T x \.\.\., got a scalar"):
        ws.bind(step).run()


@pytest.mark.parametrize("inputs, args, error, match", [
    ((np.zeros((3, 4), np.int64), np.zeros((5, 4), np.float32), np.zeros((3, 5), np.float32)), {}, DTypeError,
     "X must be a float tensor, got int64"),
    ((np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32), np.zeros((3, 5), np.float32)), {"axis_w": 16},
     ArgumentError, r"axis_w=16 is out of range for a 2-D input"),
])
def test_fc_input_gradient_takes_fc_gradients_checks(inputs, args, error, match):
    """rnn_internal_fc_input_gradient (FCGradient's dX in a backward step net) checks what FCGradient checks:
    float tensors, axes in range (a campaign case: axis_w=16 on empty tensors divided by zero)."""
    with pytest.raises(error, match=match):
        run_op("rnn_internal_fc_input_gradient", list(inputs), **args)


@pytest.mark.parametrize("device", DEVICES)
def test_linked_fc_weight_gradient_sums_the_rows_of_the_linked_tensors(device):
    """dX = dY·W per step (rnn_internal_fc_input_gradient); after the loop dW and db grow by Σ_t dY_tᵀ·X_t and
    Σ_t Σ_rows dY_t over rows [offset, offset + T) of X's and dY's linked tensors (loops over rows here)."""
    rng = np.random.default_rng(2)
    T, M, K, N = 4, 3, 4, 5
    X, dY = rng.standard_normal((T + 1, 1, M, K)), rng.standard_normal((T, 1, M, N))
    W, dW0, db0 = rng.standard_normal((N, K)), rng.standard_normal((N, K)), rng.standard_normal(N)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    ws = Workspace(gpu=GPU_MODE[device])
    for name, value in (("seq", np.zeros((T, 1))), ("X_states", X), ("dY_states", dY), ("W", W), ("dW", dW0),
                        ("db", db0), ("X", X[2]), ("dY", dY[1])):
        ws.feed(name, np.asarray(value, np.float32), device_option=do)
    ws.run_operator_once(make_op("rnn_internal_fc_input_gradient", ["X", "W", "dY"], ["dX"], device=device, axis=2))
    np.testing.assert_allclose(ws.fetch("dX"), (dY[1, 0] @ W).reshape(1, M, K), rtol=1e-5, atol=1e-5)
    ws.run_operator_once(make_op("rnn_internal_fc_weight_gradient_linked",
                                 ["seq", "X_states", "dY_states", "dW", "db"], ["dW", "db"], device=device,
                                 x_offset=1, dy_offset=0))
    dW, db = dW0.copy(), db0.copy()
    for t in range(T):
        for m in range(M):
            dW += np.outer(dY[t, 0, m], X[t + 1, 0, m])
            db += dY[t, 0, m]
    np.testing.assert_allclose(ws.fetch("dW"), dW, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ws.fetch("db"), db, rtol=1e-5, atol=1e-5)


def test_linked_fc_weight_gradient_checks_the_rows():
    ws = Workspace()
    for name, shape in (("seq", (4, 1)), ("X_states", (4, 3, 4)), ("dY_states", (4, 3, 5)), ("dW", (5, 4)),
                        ("db", (5,))):
        ws.feed(name, np.zeros(shape, np.float32))
    op = make_op("rnn_internal_fc_weight_gradient_linked", ["seq", "X_states", "dY_states", "dW", "db"],
                 ["dW", "db"], x_offset=1, dy_offset=0)
    with pytest.raises(ShapeError, match=r"the X rows \[1, 5\) run past the linked tensor \(4, 3, 4\) \(4 steps\)"):
        ws.run_operator_once(op)
    ws.feed("X_states", np.zeros((5, 3, 3), np.float32))
    with pytest.raises(ShapeError, match=r"X rows \(4, 3, 3\) and dY rows \(4, 3, 5\) do not fit dW \(5, 4\)"):
        ws.run_operator_once(op)
    ws.feed("seq", np.float32(4))
    with pytest.raises(ShapeError, match=r"the sequence input must be T x \.\.\., got a scalar"):
        ws.run_operator_once(op)


def test_the_references_catch_wrong_link_and_deferred_kernels(broken):
    from stepnet.ops import REGISTRY
    links, deferred = (REGISTRY.get(t).kernel for t in ("rnn_internal_apply_links", "rnn_internal_fc_weight_gradient"))

    def shifted(ctx, xp, timestep, *externals, offsets, windows, **flags):
        return links(ctx, xp, timestep, *externals, offsets=[o + (o == 1) for o in offsets], windows=windows,
                     **flags)
    broken("rnn_internal_apply_links", shifted)
    with pytest.raises(AssertionError):
        test_apply_links_views_every_links_rows(0, "cpu")
    broken("rnn_internal_fc_weight_gradient", lambda xp, xs, dys, dw, db: deferred(xp, xs[::-1], dys, dw, db))
    with pytest.raises(AssertionError):
        test_deferred_fc_gradient_equals_fc_gradient_summed_over_the_steps("cpu")
    linked = REGISTRY.get("rnn_internal_fc_weight_gradient_linked").kernel
    broken("rnn_internal_fc_weight_gradient_linked",
           lambda xp, seq, xs, dys, dw, db, x_offset, dy_offset: linked(xp, seq, xs, dys, dw, db, x_offset=x_offset - 1,
                                                                       dy_offset=dy_offset))
    with pytest.raises(AssertionError):
        test_linked_fc_weight_gradient_sums_the_rows_of_the_linked_tensors("cpu")
    broken("rnn_internal_fc_input_gradient", lambda xp, x, w, dy, axis, axis_w: xp.zeros_like(x))
    with pytest.raises(AssertionError):
        test_linked_fc_weight_gradient_sums_the_rows_of_the_linked_tensors("cpu")
