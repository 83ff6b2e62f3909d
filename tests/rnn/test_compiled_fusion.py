"""The fused FC bias + Sum pair of compiled step nets (stepnet/compiled/products.py `_with_sum`, numba's
bias_sum kernels; only with the fused kernels on): taken in the LSTM step nets (a Sum in place over the FC's
output), in the GRU step nets of one row (each Sum a few ops after its FC) and in a hand-written
step net (a Sum into another blob, the FC's output second, both read later), every blob bit-identical to the
same net run op by op; refused where an op between touches the Sum; the pair form in every product order
against the two ops' own kernels; overlapping arrays refused; a broken fused pass caught; no pair with
fused_cells=False."""
import functools
import importlib.util
import types

import numpy as np
import pytest

from stepnet.builders.builder import BlobRef, NetBuilder
from stepnet.builders.rnn import gru, lstm, recurrent_net
from stepnet.testing import run_op

from .test_compiled import arrays, compilers, loss_of, run_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba (the fast extra, in the test extra) is not installed")
F = np.float32


def pairs(net) -> list:
    """The op types of every fused pair in the compiled programs of a net's RecurrentNetwork ops."""
    found = []
    for c in compilers(net).values():
        if c.program is not None and c.routines:
            step_net = next(iter(c.routines.values()))[0]
            found += [tuple(step_net.ops[k].opdef.type for k in at) for _, _, at in c.program.ops if len(at) > 1]
    return found


def compare(build, feeds, runs=3):
    """build's net run compiled and op by op, both with the fused kernels: every blob the same bits."""
    ws_c, net_c = run_model(build, feeds, runs, compile_steps=True, fused_cells=True)
    ws_i, _ = run_model(build, feeds, runs, compile_steps=False, fused_cells=True)
    got, want = arrays(ws_c), arrays(ws_i)
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    return net_c


def lstm_case(train: bool, n: int, h: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t, d = 5, 7
    feeds = {"X": rng.uniform(-1, 1, (t, n, d)).astype(F), "seq": np.array([t] * (n - 1) + [2], np.int32),
             "h0": rng.uniform(-1, 1, (1, n, h)).astype(F), "c0": rng.uniform(-1, 1, (1, n, h)).astype(F)}

    def build(m):
        out = lstm(m, "X", "seq", ["h0", "c0"], d, h, forward_only=not train)
        if train:
            m.add_gradient_ops([m.net.AveragedLoss(out[0], "loss")])
    return build, feeds


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("n, h", [(3, 6), (32, 64)])     # W·Xᵀ only; products large enough for X·Wᵀ forms
def test_lstm_step_nets_fuse_their_gates_bias_and_sum(train, n, h):
    net = compare(*lstm_case(train, n, h))
    assert ("FC", "Sum") in pairs(net)


def cell_step(name, gates_of):
    """A hand-written LSTM step: gates_of(step) -> the gates blob from input_t, h_prev and U/ub, then LSTMUnit."""
    step = NetBuilder(name)
    step.add_external_inputs("input_t", "h_prev", "c_prev", "U", "ub", "seq", "timestep")
    h, c = step.LSTMUnit(["h_prev", "c_prev", gates_of(step), "seq", "timestep"], ["h", "c"])
    step.add_external_outputs(h, c)
    return step


def cell_case(step, seed: int, train: bool):
    """(build, feeds) of a layer running `step` over Wx (T=4, N=3, H=5), with its gradient ops when train."""
    rng = np.random.default_rng(seed)
    t, n, h = 4, 3, 5

    def build(m):
        recurrent_net(m.net, step, [(BlobRef("input_t"), BlobRef("Wx"))],
                      [(BlobRef("h_prev"), BlobRef("h0")), (BlobRef("c_prev"), BlobRef("c0"))],
                      {BlobRef("h_prev"): BlobRef("h"), BlobRef("c_prev"): BlobRef("c")}, scope=step.name,
                      timestep="timestep", outputs_with_grads=(0,))
        if train:
            m.add_gradient_ops([loss_of(m, BlobRef("h_all"))])
    feeds = {"Wx": rng.uniform(-1, 1, (t, n, 4 * h)).astype(F), "seq": np.array([t, 2, 1], np.int32),
             "h0": rng.uniform(-1, 1, (1, n, h)).astype(F), "c0": rng.uniform(-1, 1, (1, n, h)).astype(F),
             "U": rng.uniform(-1, 1, (4 * h, h)).astype(F), "ub": rng.uniform(-1, 1, 4 * h).astype(F)}
    return build, feeds


def mixing_gates(step):
    """A Sum writing a new blob from (input_t, the FC's output), and a next op reading both."""
    uh = step.FC(["h_prev", "U", "ub"], "uh", axis=2)
    return step.Mul([uh, step.Sum(["input_t", uh], "g")], "mix")


def test_a_sum_into_another_blob_keeps_both_outputs():
    net = compare(*cell_case(cell_step("mixing", mixing_gates), 1, train=True))
    assert ("FC", "Sum") in pairs(net)


@pytest.mark.parametrize("train", [False, True])
def test_gru_step_nets_fuse_each_fc_with_its_later_sum(train):
    """The GRU step of one row (more rows: one entry of its own, test_compiled_gru_step) sums each gate's FC
    output two to six ops later (other ops between touch neither sum): each FC takes its Sum into its entry
    (fc_row_sum), the values unchanged."""
    rng = np.random.default_rng(5)
    t, n, d, h = 4, 1, 5, 6
    feeds = {"X": rng.uniform(-1, 1, (t, n, d)).astype(F), "seq": np.array([t - 1], np.int32),
             "h0": rng.uniform(-1, 1, (1, n, h)).astype(F)}

    def build(m):
        out = gru(m, "X", "seq", ["h0"], d, h, forward_only=not train)
        if train:
            m.add_gradient_ops([m.net.AveragedLoss(out[0], "loss")])
    assert pairs(compare(build, feeds)).count(("FC", "Sum")) == 3


def blocked_gates(step):
    """An op between the FC and its Sum rewrites the Sum's other input: the Sum must stay after it."""
    z = step.Copy(["input_t"], "z")
    uh = step.FC(["h_prev", "U", "ub"], "uh", axis=2)
    step.Scale([z], z, scale=2.0)
    return step.Sum([uh, z], "g")


def test_an_op_between_that_touches_the_sum_keeps_them_apart():
    net = compare(*cell_case(cell_step("blocked", blocked_gates), 6, train=False))
    assert compilers(net)["RecurrentNetwork"].program is not None and pairs(net) == []


@pytest.mark.parametrize("parts", ["kernel", "w first", 1, 4])
@pytest.mark.parametrize("how", ["in place", "y first", "y second"])
def test_the_pair_form_gives_the_two_kernels_bits(parts, how):
    """The pair's one pass gives the bits of its FC form followed by the Sum kernel, for every product form (and
    with the kernel's own product, the bits of the FC kernel and the Sum kernel)."""
    from stepnet.compiled.products import fc

    rng = np.random.default_rng(2)
    m, k, n = 32, 64, 256
    x, w, b, z = (rng.standard_normal(s).astype(F) for s in ((m, k), (n, k), (n,), (m, n)))
    y, s = np.empty((m, n), F), np.empty((m, n), F)
    y_blob, z_blob, s_blob = (types.SimpleNamespace(value=v) for v in (y, z, s))
    fc_bop = fc_op(y_blob)
    sum_ins = [z_blob, y_blob] if how == "y second" else [y_blob, z_blob]
    sum_bop = types.SimpleNamespace(inputs=sum_ins, outputs=[y_blob if how == "in place" else s_blob])
    fast = fc(fc_bop, [x, w, b], [y], parts=parts)
    if fast.begin is not None:
        fast.begin[1](w)
    want_y = np.empty((m, n), F)
    fast.fn([x, w, b], [want_y])                      # the FC form alone
    if parts == "kernel":
        np.testing.assert_array_equal(want_y, run_op("FC", [x, w, b]))
    want_s = run_op("Sum", [want_y, z] if how != "y second" else [z, want_y])
    values = [y if blob is y_blob else z for blob in sum_ins]
    pair = fast.fuse(sum_bop, [x, w, b, *values], [y if how == "in place" else s])
    assert pair is not None
    pair.fn([x, w, b, *values], [y, y] if how == "in place" else [y, s])
    if how == "in place":
        np.testing.assert_array_equal(y, want_s)
    else:
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(s, want_s)


def fc_op(y_blob):
    """A stand-in bound FC op (axis 1) writing y_blob, for the compiled forms."""
    return types.SimpleNamespace(plain=functools.partial(print, axis=1, axis_w=1, float16_compute=False),
                                 outputs=[y_blob])


def test_overlapping_arrays_are_not_fused():
    """A Sum input overlapping the FC's output in part: one pass would read sums the two ops never see."""
    from stepnet.compiled.products import fc

    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype(F) for s in ((4, 8), (16, 8), (16,)))
    rows = np.empty((5, 16), F)
    y_blob, z_blob = types.SimpleNamespace(value=rows[:4]), types.SimpleNamespace(value=rows[1:])
    fast = fc(fc_op(y_blob), [x, w, b], [rows[:4]], parts="kernel")
    sum_bop = types.SimpleNamespace(inputs=[y_blob, z_blob], outputs=[types.SimpleNamespace()])
    assert fast.fuse(sum_bop, [x, w, b, rows[:4], rows[1:]], [np.empty((4, 16), F)]) is None


def test_a_broken_fused_pass_is_caught(monkeypatch):
    from stepnet.kernels import jit as fused

    real = fused.load()
    broken = types.SimpleNamespace(**{name: getattr(real, name) for name in dir(real) if not name.startswith("_")})
    broken.bias_sum_into = lambda p, b, z, y: real.bias_sum_into(p, b + 1e-3, z, y)   # a wrong bias
    monkeypatch.setattr(fused, "load", lambda: broken)
    with pytest.raises(AssertionError):
        compare(*lstm_case(False, 3, 6, seed=3))


def test_no_pair_without_the_fused_kernels():
    build, feeds = lstm_case(True, 3, 6, seed=4)
    _, net = run_model(build, feeds, 2, compile_steps=True, fused_cells=False)
    assert compilers(net)["RecurrentNetwork"].program is not None and not pairs(net)
