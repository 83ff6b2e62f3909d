"""The GRU step as one compiled entry (stepnet/compiled/gru_step.py; numba's gru_gates and gru_concat passes,
only with the fused kernels on): taken for gru_cell's step net, forward-only and training, with and without
sequence lengths, in both layouts (reset first, linear_before_reset), at sizes whose products take the
kernel's GEMM or the blocked forms, every blob bit-identical to the same net run op by op with the same
kernels (the step workspaces' blobs too), inputs fed anew every run read afresh; not taken for one row (FC +
Sum pairs instead), for another arrangement of the ops or without the fused kernels; each broken pass
caught."""
import importlib.util
import types

import numpy as np
import pytest

from stepnet.builders.rnn import gru

from stepnet.ops.recurrent import StepWorkspaces

from .test_compiled import arrays, compilers, run_model
from .test_compiled_fusion import pairs

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba (the fast extra, in the test extra) is not installed")
F = np.float32
STEP = ("Split", "FC", "FC", "Sum", "Sigmoid", "Mul", "FC", "Sum", "Sum", "Concat", "GRUUnit")
LINEAR_FIRST = ("Split", "FC", "FC", "Sum", "Sigmoid", "FC", "Mul", "Sum", "Sum", "Concat", "GRUUnit")


def compare(build, feeds, runs=3):
    """build's net run compiled and op by op, both with the fused kernels: every blob the same bits, those of
    the step workspaces too (what RecurrentNetworkBlobFetcher returns: the split parts, the gates)."""
    ws_c, net_c = run_model(build, feeds, runs, compile_steps=True, fused_cells=True)
    ws_i, _ = run_model(build, feeds, runs, compile_steps=False, fused_cells=True)
    for got_ws, want_ws in [(ws_c, ws_i)] + [
            (a, b) for name in ws_i.blobs() if isinstance(ws_i.find(name).value, StepWorkspaces)
            for a, b in zip(ws_c.find(name).value.steps, ws_i.find(name).value.steps, strict=True)]:
        got, want = arrays(got_ws), arrays(want_ws)
        assert got.keys() == want.keys()
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    return net_c


def gru_case(train: bool, n: int, h: int, seq: bool = True, seed: int = 0, **kw):
    rng = np.random.default_rng(seed)
    t, d = 5, 7
    feeds = {"X": rng.uniform(-1, 1, (t, n, d)).astype(F), "h0": rng.uniform(-1, 1, (1, n, h)).astype(F)}
    if seq:
        feeds["seq"] = np.array([t] * (n - 1) + [2], np.int32)

    def build(m):
        out = gru(m, "X", "seq" if seq else None, ["h0"], d, h, forward_only=not train, **kw)
        if train:
            m.add_gradient_ops([m.net.AveragedLoss(out[0], "loss")])
    return build, feeds


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("n, h, seq", [(3, 6, True), (32, 64, True), (4, 128, False)])
@pytest.mark.parametrize("lbr", [False, True], ids=["reset first", "linear before reset"])
def test_the_gru_step_is_one_entry_with_the_ops_bits(train, n, h, seq, lbr):
    net = compare(*gru_case(train, n, h, seq, linear_before_reset=lbr))
    assert (LINEAR_FIRST if lbr else STEP) in pairs(net)


def test_drop_states_keeps_the_group():
    assert STEP in pairs(compare(*gru_case(False, 3, 6, drop_states=True, seed=1)))


@pytest.mark.parametrize("lbr", [False, True], ids=["reset first", "linear before reset"])
def test_one_row_keeps_one_entry_per_op(lbr):
    """One row: the step FCs are fc_row's one pass (bias inside), not a product + bias (they fuse with their
    Sums where they can)."""
    found = pairs(compare(*gru_case(True, 1, 6, seed=2, linear_before_reset=lbr)))
    assert found and all(len(p) <= 2 for p in found)


def test_another_arrangement_keeps_one_entry_per_op():
    """A step net with the GRU step's op types in its order but the Mul reading another blob than h_prev."""
    from stepnet.compiled.gru_step import layout

    build, feeds = gru_case(False, 3, 6, seed=8)
    _, net = run_model(build, feeds, 1, compile_steps=False, fused_cells=True)
    rnn = next(b for b in net.ops if b.opdef.type == "RecurrentNetwork")
    bound = rnn.call.args[0].state["forward"].loop.steps[0][1]     # (the first timestep's bound step net)
    i = next(k for k, o in enumerate(bound.ops) if o.opdef.type == "Split")
    assert layout(bound.ops, i) == (5, 6, False)
    mul = bound.ops[i + 5]
    inputs = mul.inputs
    mul.inputs = [inputs[0], inputs[0]]       # σ(r)·σ(r): not the step
    try:
        assert layout(bound.ops, i) is None
    finally:
        mul.inputs = inputs


def test_no_group_without_the_fused_kernels():
    build, feeds = gru_case(False, 3, 6, seed=3)
    _, net = run_model(build, feeds, 2, compile_steps=True, fused_cells=False)
    assert compilers(net)["RecurrentNetwork"].program is not None and not pairs(net)


def broken_kernels(monkeypatch, name, wrap):
    from stepnet.kernels import jit as fused

    real = fused.load()
    broken = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("_")})
    setattr(broken, name, wrap(getattr(real, name)))
    monkeypatch.setattr(fused, "load", lambda: broken)


@pytest.mark.parametrize("name, wrap", [
    ("gru_gates", lambda k: lambda x, pr, pu, br, bu, *rest: k(x, pu, pr, br, bu, *rest)),       # products swapped
    ("gru_gates", lambda k: lambda x, pr, pu, br, bu, h, xr, xu, *rest: k(x, pr, pu, br, bu, h, xu, xr, *rest)),
    ("gru_concat", lambda k: lambda po, bo, xo, r, u, *rest: k(po, bo, xo, u, r, *rest)),        # r, u swapped
    ("gru_concat", lambda k: lambda po, bo, *rest: k(po, bo + F(1e-3), *rest)),                   # a wrong bias
], ids=["products", "split outputs", "concat order", "output bias"])
def test_a_broken_pass_is_caught(monkeypatch, name, wrap):
    broken_kernels(monkeypatch, name, wrap)
    with pytest.raises(AssertionError):
        compare(*gru_case(True, 3, 6, seed=4))


@pytest.mark.parametrize("train", [False, True])
def test_new_inputs_every_run_are_read_afresh(train):
    """A sequence, lengths and initial state fed anew before every run (other arrays each time: the entry's
    bound call must read them, not the first run's): the op-by-op bits in every run."""
    build, feeds = gru_case(train, 4, 8, seed=6)
    rng = np.random.default_rng(7)

    def change(ws, r):
        ws.feed("X", rng.uniform(-1, 1, feeds["X"].shape).astype(F))
        ws.feed("seq", rng.integers(1, feeds["X"].shape[0] + 1, feeds["seq"].shape).astype(np.int32))
        ws.feed("h0", rng.uniform(-1, 1, feeds["h0"].shape).astype(F))

    runs = []
    for compiled in (True, False):
        rng = np.random.default_rng(7)
        runs.append(run_model(build, feeds, 4, change, compile_steps=compiled, fused_cells=True))
    (ws_c, net_c), (ws_i, _) = runs
    got, want = arrays(ws_c), arrays(ws_i)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert STEP in pairs(net_c)


def test_a_pass_ignoring_linear_before_reset_is_caught(monkeypatch):
    """The output pass's Mul σ(r)·o, left out (the reset-first sum o + xo instead), caught in that layout."""
    broken_kernels(monkeypatch, "gru_concat", lambda k: lambda *a: k(*a[:-1], False))
    with pytest.raises(AssertionError):
        compare(*gru_case(True, 3, 6, seed=9, linear_before_reset=True))


def test_an_op_whose_kernel_was_replaced_keeps_it(broken):
    """A step op whose record has another kernel than its type registered (a test hook here): the GRU step's
    entry, written for the registered kernels, is not taken, and the compiled net runs the replaced kernel."""
    broken("Sigmoid", lambda xp, X: xp.full_like(X, 0.25))
    net = compare(*gru_case(False, 3, 6, seed=10))
    assert STEP not in pairs(net)
