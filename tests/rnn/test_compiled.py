"""Compiled step nets (stepnet.compiled) against the op-by-op path: every cell type, forward and backward, with
and without seq_lengths, run several times (the first timestep of a new input signature runs op by op, every
later one compiled): every blob of the workspace bit-identical with the numpy cell forms, within float32
rounding with the fused (numba) ones, and the compiled path really taken; a step net with an op lacking a
compiled form runs op by op."""
import importlib.util

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.builder import BlobRef, NetBuilder
from stepnet.builders.model import ModelBuilder
from stepnet.builders.rnn import basic_rnn, gru, lstm, recurrent_net

F = np.float32
T, N, D, H = 4, 3, 5, 6
# the cell forms: numpy (bit-identical to op by op) and fused (numba, the `fast` extra, in the test extra)
CELLS = [pytest.param(False, id="numpy"),
         pytest.param(True, id="fused", marks=pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                                                 reason="numba (the fast extra) not installed"))]


def compilers(net):
    """{op type: its StepCompiler} of the RecurrentNetwork ops of a bound net."""
    found = {}
    for bop in net.ops:
        if bop.opdef.type.startswith("RecurrentNetwork"):
            state = bop.call.args[0].state
            for key in ("forward", "backward"):
                if key in state:
                    found[bop.opdef.type] = state[key].loop.compiler
    return found


def loss_of(m, out):
    return m.net.AveragedLoss(m.net.Tanh(out, BlobRef("squashed")), BlobRef("loss"))


def run_model(build, feeds, runs=3, change=None, seed=3, **settings):
    """The nets build(m) adds to a ModelBuilder, in a Workspace(seed, **settings): init net run, feeds fed, the
    main net run `runs` times (change(ws, run): feed new values before a run); (ws, bound net)."""
    m = ModelBuilder("m")
    build(m)
    ws = Workspace(seed=seed, **settings)
    ws.run_net_once(m.init_net.proto())
    for name, value in feeds.items():
        ws.feed(name, value)
    net = ws.create_net(m.net.proto())
    for r in range(runs):
        if change is not None:
            change(ws, r)
        net.run()
    return ws, net


def arrays(ws) -> dict:
    """Every numpy blob of a workspace, fetched."""
    return {b: ws.fetch(b) for b in ws.blobs() if isinstance(ws.find(b).value, np.ndarray)}


def run_both(build, feeds, runs=3, change=None, fused=False):
    """The net built by build(m) run `runs` times in a compiled (cell forms: numpy, or fused) and an op-by-op
    workspace; (compiled ws and net). change(ws, run): feed new values before a run."""
    out = [run_model(build, feeds, runs, change, compile_steps=compiled, fused_cells=fused and compiled)
           for compiled in (True, False)]
    (ws_c, net_c), (ws_i, _) = out
    for name in ws_i.blobs():
        a, b = ws_i.find(name).value, ws_c.find(name).value
        if isinstance(a, np.ndarray) and fused and a.dtype.kind == "f":
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=2e-6, err_msg=name)
        elif isinstance(a, np.ndarray):
            np.testing.assert_array_equal(b, a, err_msg=name)
    if fused:
        assert fused_types(net_c), "no cell op ran fused"
    return ws_c, net_c


JITTED_FORMS = ("stepnet.kernels.lstm", "stepnet.kernels.gru", "stepnet.compiled.jit_forms",   # modules of their fns
                "stepnet.compiled.gru_step")


def fused_types(net) -> set:
    """The op types the compiled programs of a net's RecurrentNetwork ops run with fused forms."""
    found = set()
    for c in compilers(net).values():
        if c.program is not None and c.routines:
            step_net = next(iter(c.routines.values()))[0]
            found |= {step_net.ops[at[0]].opdef.type for fast, _, at in c.program.ops
                      if fast.fn.__module__ in JITTED_FORMS}
    return found


def sequence(rng, d=D, t=T):
    return {"X": rng.uniform(-1, 1, (t, N, d)).astype(F), "seq": np.array([t, 1, t - 1], np.int32)}


def assert_compiled(net, *types):
    found = compilers(net)
    for op_type in types:
        assert found[op_type].program is not None, f"{op_type} ran op by op"


@pytest.mark.parametrize("seq", [True, False])
@pytest.mark.parametrize("forget_bias, drop_states", [(0.0, False), (1.0, True)])
@pytest.mark.parametrize("fused", CELLS)
def test_lstm(seq, forget_bias, drop_states, fused):
    rng = np.random.default_rng(1)
    feeds = {**sequence(rng), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F),
             "c0": rng.uniform(-1, 1, (1, N, H)).astype(F)}

    def build(m):
        h = lstm(m, "X", "seq" if seq else None, ["h0", "c0"], D, H, forget_bias=forget_bias,
                 drop_states=drop_states)
        m.add_gradient_ops([loss_of(m, h[0])])
    _, net = run_both(build, feeds, fused=fused)
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")


@pytest.mark.parametrize("fused", CELLS)
def test_lstm_forward_only_and_a_new_sequence_length(fused):
    rng = np.random.default_rng(2)
    feeds = {**sequence(rng), "h0": np.zeros((1, N, H), F), "c0": np.zeros((1, N, H), F)}
    longer = sequence(np.random.default_rng(5), t=T + 3)

    def change(ws, r):   # the second run has a longer sequence: a new signature, compiled again
        if r == 1:
            ws.feed("X", longer["X"])
            ws.feed("seq", np.array([T + 3, 2, 1], np.int32))

    _, net = run_both(lambda m: lstm(m, "X", "seq", ["h0", "c0"], D, H, forward_only=True), feeds, change=change,
                      fused=fused)
    assert_compiled(net, "RecurrentNetwork")


@pytest.mark.parametrize("seq, lbr", [(True, False), (False, True)])
@pytest.mark.parametrize("fused", CELLS)
def test_gru(seq, lbr, fused):
    rng = np.random.default_rng(3)
    feeds = {**sequence(rng), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F)}

    def build(m):
        h = gru(m, "X", "seq" if seq else None, ["h0"], D, H, linear_before_reset=lbr)
        m.add_gradient_ops([loss_of(m, h[0])])
    _, net = run_both(build, feeds, fused=fused)
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")


def test_basic_rnn_with_gradients():
    rng = np.random.default_rng(4)
    feeds = {**sequence(rng), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F)}

    def build(m):
        h = basic_rnn(m, "X", None, ["h0"], D, H)
        m.add_gradient_ops([loss_of(m, h[0])])
    _, net = run_both(build, feeds)
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")


@pytest.mark.parametrize("drop_states", [False, True])
def test_basic_rnn_forward_only_with_seq_lengths(drop_states):
    rng = np.random.default_rng(5)
    feeds = {**sequence(rng), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F)}
    _, net = run_both(lambda m: basic_rnn(m, "X", "seq", ["h0"], D, H, forward_only=True,
                                          drop_states=drop_states), feeds)
    assert_compiled(net, "RecurrentNetwork")


def milstm_step(extra_op=None):
    """A multiplicative-integration LSTM step written by hand: gates = α·Wx·Uh + β1·Wx + β2·Uh + b, then
    LSTMUnit (Mul / Add / FC / Sum ops)."""
    step = NetBuilder("milstm_step")
    step.add_external_inputs("input_t", "h_prev", "c_prev", "U", "ub", "alpha", "beta1", "beta2", "seq", "timestep")
    uh = step.FC(["h_prev", "U", "ub"], "uh", axis=2)     # Uh + ub
    mi = step.Mul([step.Mul(["input_t", uh], "wu"), "alpha"], "mi", broadcast=1)
    b1 = step.Mul(["input_t", "beta1"], "b1", broadcast=1)
    b2 = step.Mul([uh, "beta2"], "b2", broadcast=1)
    gates = step.Sum([mi, b1, b2], "gates")
    if extra_op is not None:
        gates = extra_op(step, gates)
    h, c = step.LSTMUnit(["h_prev", "c_prev", gates, "seq", "timestep"], ["h", "c"], forget_bias=0.5)
    step.add_external_outputs(h, c)
    return step


def build_milstm(m, extra_op=None):
    net = m.net
    recurrent_net(net, milstm_step(extra_op), [(BlobRef("input_t"), BlobRef("Wx"))],
                  [(BlobRef("h_prev"), BlobRef("h0")), (BlobRef("c_prev"), BlobRef("c0"))],
                  {BlobRef("h_prev"): BlobRef("h"), BlobRef("c_prev"): BlobRef("c")}, scope="milstm",
                  timestep="timestep", outputs_with_grads=(0,))
    m.add_gradient_ops([loss_of(m, BlobRef("h_all"))])


def milstm_feeds(rng):
    u = rng.uniform(-1, 1, (4 * H, H)).astype(F)
    return {"Wx": rng.uniform(-1, 1, (T, N, 4 * H)).astype(F), "seq": np.array([T, 2, 1], np.int32),
            "h0": rng.uniform(-1, 1, (1, N, H)).astype(F), "c0": rng.uniform(-1, 1, (1, N, H)).astype(F),
            "U": u, "ub": rng.uniform(-1, 1, 4 * H).astype(F), "alpha": rng.uniform(-1, 1, 4 * H).astype(F),
            "beta1": rng.uniform(-1, 1, 4 * H).astype(F), "beta2": rng.uniform(-1, 1, 4 * H).astype(F)}


def test_hand_written_milstm_step_net():
    _, net = run_both(build_milstm, milstm_feeds(np.random.default_rng(6)))
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")


def test_an_op_without_a_compiled_form_runs_op_by_op():
    """EnsureDense has no compiled form: the forward step net runs op by op, with the same results."""
    def extra(step, gates):
        return step.EnsureDense([gates], "dense_gates")
    _, net = run_both(lambda m: build_milstm(m, extra), milstm_feeds(np.random.default_rng(7)))
    found = compilers(net)
    assert found["RecurrentNetwork"].program is None


def test_op_by_op_when_asked():
    rng = np.random.default_rng(8)
    feeds = {**sequence(rng), "h0": np.zeros((1, N, H), F), "c0": np.zeros((1, N, H), F)}
    _, net = run_model(lambda m: lstm(m, "X", "seq", ["h0", "c0"], D, H, forward_only=True), feeds, runs=2,
                       seed=None, compile_steps=False)
    assert compilers(net)["RecurrentNetwork"].program is None


@pytest.mark.parametrize("fused", CELLS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_new_sequence_lengths_of_the_same_shape_run_compiled(cell, fused):
    """New seq_lengths values of the same shape keep the compiled program (the cells take the run's shortest
    length once per run) and still match the op-by-op path: a length shorter than the last run's shortest
    must be seen."""
    rng = np.random.default_rng(9)
    feeds = {**sequence(rng), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F),
             "c0": rng.uniform(-1, 1, (1, N, H)).astype(F)}
    lengths = [np.array([T, 1, T - 1], np.int32), np.array([1, 1, 1], np.int32), np.array([2, T, 0], np.int32)]

    def build(m):
        h = (lstm(m, "X", "seq", ["h0", "c0"], D, H) if cell == "lstm" else gru(m, "X", "seq", ["h0"], D, H))
        m.add_gradient_ops([loss_of(m, h[0])])
    _, net = run_both(build, feeds, change=lambda ws, r: ws.feed("seq", lengths[r]), fused=fused)
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")


@pytest.mark.parametrize("fused", CELLS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("drop_states", [False, True])
def test_a_batch_of_one_with_seq_lengths(cell, drop_states, fused):
    """N = 1 (sampling's shape; the cells test its one length without temporaries): the sequence ended before,
    at and after the last timestep across runs, forward and backward, bit-identical to the op-by-op path."""
    rng = np.random.default_rng(11)
    feeds = {"X": rng.uniform(-1, 1, (T, 1, D)).astype(F), "seq": np.array([T], np.int32),
             "h0": rng.uniform(-1, 1, (1, 1, H)).astype(F), "c0": rng.uniform(-1, 1, (1, 1, H)).astype(F)}
    lengths = [np.array([T], np.int32), np.array([2], np.int32), np.array([0], np.int32), np.array([T + 2], np.int32)]

    def build(m):
        if cell == "lstm":
            h = lstm(m, "X", "seq", ["h0", "c0"], D, H, drop_states=drop_states)
        else:
            h = gru(m, "X", "seq", ["h0"], D, H, drop_states=drop_states)
        m.add_gradient_ops([loss_of(m, h[0])])
    _, net = run_both(build, feeds, runs=4, change=lambda ws, r: ws.feed("seq", lengths[r]), fused=fused)
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")


def test_gru_backward_ops_run_their_own_compiled_forms():
    """The GRU backward step's MulGradient, SigmoidGradient and sizes-input Split have compiled forms (not the
    generic kernel call), bit-identical to op by op (run_both)."""
    rng = np.random.default_rng(12)
    feeds = {**sequence(rng), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F)}

    def build(m):
        m.add_gradient_ops([loss_of(m, gru(m, "X", "seq", ["h0"], D, H)[0])])
    _, net = run_both(build, feeds)
    c = compilers(net)["RecurrentNetworkGradient"]
    step_net = next(iter(c.routines.values()))[0]
    forms = {step_net.ops[at[0]].opdef.type: fast.fn.__qualname__.split(".")[0] for fast, _, at in c.program.ops}
    assert forms["MulGradient"] == "mul_gradient" and forms["SigmoidGradient"] == "sigmoid_gradient"
    assert forms["Split"] == "split"


def test_a_split_whose_sizes_change_within_a_run_is_refused():
    import functools
    import types

    from stepnet.compiled.forms import split
    from stepnet.core.errors import ShapeError

    bop = types.SimpleNamespace(plain=functools.partial(print, split=None, axis=2, order=None, add_axis=0))
    x, sizes = np.arange(12, dtype=F).reshape(1, 2, 6), np.array([2, 4], np.int32)
    outs = [np.empty((1, 2, 2), F), np.empty((1, 2, 4), F)]
    fast = split(bop, [x, sizes], outs)
    fast.fn([x, sizes], outs)
    np.testing.assert_array_equal(outs[1], x[..., 2:])
    with pytest.raises(ShapeError, match=r"split sizes \[3, 3\] differ from \[2, 4\]"):
        fast.fn([x, np.array([3, 3], np.int32)], outs)


def test_without_numba_the_default_is_the_numpy_arithmetic(monkeypatch):
    """fused_cells=None (the default) with numba not installed: every cell op runs the numpy kernels, the bits of
    fused_cells=False (what `pip install .` without the fast extra gets)."""
    from stepnet.kernels import jit as fused

    fused.load()                      # loaded (or None) before: only the workspace's choice may change
    monkeypatch.setattr(fused, "installed", lambda: False)
    rng = np.random.default_rng(13)
    feeds = {**sequence(rng), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F),
             "c0": rng.uniform(-1, 1, (1, N, H)).astype(F)}
    blobs = []
    for setting in (None, False):
        _, net = run_model(lambda m: m.add_gradient_ops([loss_of(m, lstm(m, "X", "seq", ["h0", "c0"], D, H)[0])]),
                           feeds, runs=2, fused_cells=setting)
        assert not fused_types(net)
        blobs.append(arrays(net.workspace))
    for name, value in blobs[1].items():
        np.testing.assert_array_equal(blobs[0][name], value, err_msg=name)


@pytest.mark.parametrize("fused", CELLS[1:])
def test_interpreted_and_compiled_fused_paths_agree_bit_for_bit(fused):
    """A workspace's cell arithmetic holds for interpreted and compiled timesteps alike: an LSTM layer run op by
    op and compiled, both fused, give the same bits (so a net's results do not depend on which timesteps
    compiled)."""
    rng = np.random.default_rng(5)
    T_, N_, D_, H_ = 6, 4, 5, 40
    feeds = {"X": rng.uniform(-1, 1, (T_, N_, D_)).astype(F), "seq": np.array([T_, 3, T_, 1], np.int32),
             "h0": rng.uniform(-1, 1, (1, N_, H_)).astype(F), "c0": rng.uniform(-1, 1, (1, N_, H_)).astype(F)}

    def build(m):
        h = lstm(m, "X", "seq", ["h0", "c0"], D_, H_)
        m.add_gradient_ops([m.net.AveragedLoss(h[0], "loss")])
    results = [arrays(run_model(build, feeds, seed=1, compile_steps=compiled, fused_cells=fused)[0])
               for compiled in (True, False)]
    for name, value in results[1].items():
        np.testing.assert_array_equal(results[0][name], value, err_msg=name)


@pytest.mark.parametrize("fused", CELLS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_small_matrix_blocks_give_the_op_by_op_bits(cell, fused, monkeypatch):
    """With the FC products in blocks for OpenBLAS's small-matrix kernel (stepnet.kernels.fc; forced here, so
    that every CPU takes them), a training step compiled gives the op-by-op bits: the step FC, its input
    gradient (interpreted kernels, deferred op, compiled forms) and the main net's FC all block the same way,
    and the blocks really ran (a batch of 4; LSTM H = 256: the step FC 4×256 by 256×1024 in blocks of 256 rows of
    W, its input gradient in blocks of 128 rows of dXᵀ; GRU H = 512: its three 512×512 FCs and their input
    gradients in blocks of 256 rows)."""
    import stepnet.kernels.fc as fc

    calls = []
    monkeypatch.setattr(fc, "small_matrix_kernels", lambda: True)
    real = fc._rows_product
    monkeypatch.setattr(fc, "_rows_product", lambda *a: calls.append(a[2]) or real(*a))
    n, h, d = 4, 256 if cell == "lstm" else 512, 8
    rng = np.random.default_rng(12)
    feeds = {"X": rng.uniform(-1, 1, (T, n, d)).astype(F), "seq": np.array([T, 1, T - 1, 2], np.int32),
             "h0": rng.uniform(-1, 1, (1, n, h)).astype(F), "c0": rng.uniform(-1, 1, (1, n, h)).astype(F)}

    def build(m):
        out = (lstm(m, "X", "seq", ["h0", "c0"], d, h) if cell == "lstm" else gru(m, "X", "seq", ["h0"], d, h))
        m.add_gradient_ops([loss_of(m, out[0])])
    _, net = run_both(build, feeds, fused=fused)
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")
    assert set(calls) == ({256, 128} if cell == "lstm" else {256}), set(calls)


@pytest.mark.parametrize("fused", CELLS)
def test_products_left_whole_for_the_direct_kernel_give_the_op_by_op_bits(fused, monkeypatch):
    """Where the block rule leaves a step FC whole for OpenBLAS's direct SGEMM (8 rows, H = 128: 8×128 by
    128×512, with the small-matrix kernel forced on), a training step compiled gives the op-by-op bits whichever
    form the compiled FC takes (the Wᵀ copy's where its sums are W·Xᵀ's, as on AVX-512 cores), and no product
    runs in the small kernel's blocks: the interpreted X·Wᵀ is W·Xᵀ in one block of all 512 rows, the input
    gradient one GEMM."""
    import stepnet.kernels.fc as fc

    calls = []
    monkeypatch.setattr(fc, "small_matrix_kernels", lambda: True)
    real = fc._rows_product
    monkeypatch.setattr(fc, "_rows_product", lambda *a: calls.append(a[2]) or real(*a))
    n, h, d = 8, 128, 8
    rng = np.random.default_rng(13)
    feeds = {"X": rng.uniform(-1, 1, (T, n, d)).astype(F), "seq": np.array([T, 1, T - 1, 2, T, T, 3, T], np.int32),
             "h0": rng.uniform(-1, 1, (1, n, h)).astype(F), "c0": rng.uniform(-1, 1, (1, n, h)).astype(F)}

    def build(m):
        out = lstm(m, "X", "seq", ["h0", "c0"], d, h)
        m.add_gradient_ops([loss_of(m, out[0])])
    _, net = run_both(build, feeds, fused=fused)
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")
    assert set(calls) == {4 * h}, set(calls)


def test_the_input_gradient_from_a_transposed_w_gives_the_op_by_op_bits(monkeypatch):
    """The step FC's input gradient taken as Wᵀ·dYᵀ from the per-run Wᵀ copy (kernels.fc_forms, forced here
    where this machine's check accepts its sums for these sizes: batch 32, H = 256): a training step compiled
    gives the op-by-op bits, and the copy is made at the start of each run of the gradient op. Where the check
    does not accept it, the kernel's computation is what runs."""
    import stepnet.compiled.products as products
    import stepnet.kernels.fc_forms as fc_forms

    n, h, d = 32, 256, 8
    sizes = (n, h, 4 * h)
    accepted = "w transposed" in fc_forms.gradient_same_sums(*sizes, F, fc_forms.gradient_forms(*sizes, F))
    begun, real = [], fc_forms.gradient_wt_form

    def recorded(*args):
        form = real(*args)
        return form._replace(begin=lambda w: begun.append(w.shape) or form.begin(w))
    monkeypatch.setattr(fc_forms, "gradient_wt_form", recorded)
    monkeypatch.setattr(products, "gradient_fastest", lambda m, k, nn, dtype, candidates, steps: (
        "w transposed" if accepted and (m, k, nn) == sizes else "kernel"))
    rng = np.random.default_rng(14)
    feeds = {"X": rng.uniform(-1, 1, (T, n, d)).astype(F), "seq": np.full(n, T, np.int32),
             "h0": rng.uniform(-1, 1, (1, n, h)).astype(F), "c0": rng.uniform(-1, 1, (1, n, h)).astype(F)}

    def build(m):
        out = lstm(m, "X", "seq", ["h0", "c0"], d, h)
        m.add_gradient_ops([loss_of(m, out[0])])
    _, net = run_both(build, feeds, runs=3)
    assert_compiled(net, "RecurrentNetwork", "RecurrentNetworkGradient")
    assert begun == ([(4 * h, h)] * 3 if accepted else []), begun


def test_the_forms_per_run_setup_is_spread_over_the_runs_timesteps(monkeypatch):
    """The step FC's and its input gradient's forms are timed with their per-run setup (a Wᵀ copy) spread over
    the calls of one run: a step net's T timesteps (T = 4 here, forward and backward), one call for an FC in a
    plain net's program."""
    import stepnet.compiled.products as products

    seen = []
    real_fc, real_grad = products.fastest, products.gradient_fastest
    monkeypatch.setattr(products, "fastest", lambda *a: seen.append(("fc", a[-1])) or real_fc(*a))
    monkeypatch.setattr(products, "gradient_fastest", lambda *a: seen.append(("dx", a[-1])) or real_grad(*a))
    feeds = {**sequence(np.random.default_rng(5)), "h0": np.zeros((1, N, H), F), "c0": np.zeros((1, N, H), F)}

    def build(m):
        out = lstm(m, "X", "seq", ["h0", "c0"], D, H)
        m.add_gradient_ops([loss_of(m, out[0])])
    run_model(build, feeds, runs=2)
    assert set(seen) == {("fc", T), ("dx", T), ("fc", 1)}, seen    # (the main net's FC: one call a run)
    seen.clear()
    m = ModelBuilder("plain")
    m.fc(BlobRef("x"), "y", D, H)
    ws = Workspace(seed=1)
    ws.run_net_once(m.init_net.proto())
    ws.feed("x", np.ones((N, D), F))
    net = ws.create_net(m.net.proto())
    for _ in range(3):
        net.run()
    assert net.compiler.program is not None and seen == [("fc", 1)], seen
