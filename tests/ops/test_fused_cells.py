"""The fused cell arithmetic (stepnet/kernels/lstm.py and gru.py jit_step, numba, the `fast` extra): its tanh against
float64 tanh; every fused cell op against the per-element float64 references (rnn_cell_reference.py) and against the
numpy kernels at sizes whose loops vectorize, ended rows and drop_states included; arrays that are not C-contiguous;
NaN propagation; a broken fused kernel caught; fused_cells=True without numba refused (tests/rnn/test_compiled.py:
interpreted and compiled fused timesteps give the same bits). The numpy path stays the reference (fused_cells=False)."""
import importlib.util

import numpy as np
import pytest
from rnn_cell_reference import check, ref_lstm, ref_lstm_grad

from stepnet.testing import run_op
from stepnet.runtime.workspace import Workspace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba (the fast extra, in the test extra) is not installed")
F = np.float32
SIZES = [(1, 7), (5, 37), (32, 128)]   # N, D: a batch of one, a remainder loop, whole vectors


def fused_ws() -> Workspace:
    return Workspace(fused_cells=True)


def numpy_ws() -> Workspace:
    return Workspace(fused_cells=False)


def lstm_inputs(rng, n, d, seq=None, t=1, scale=3.0):
    ins = [rng.uniform(-1, 1, (1, n, d)).astype(F), rng.uniform(-1, 1, (1, n, d)).astype(F),
           (rng.standard_normal((1, n, 4 * d)) * scale).astype(F)]
    return ins + ([np.array(seq, np.int32)] if seq is not None else []) + [np.array([t], np.int32)]


def seq_args(seq, fb=0.0, drop=False):
    return {"sequence_lengths": seq is not None, "forget_bias": fb, "drop_states": drop}


def test_tanh_against_float64():
    from stepnet.kernels import jitted as k

    x = np.concatenate([np.linspace(-20, 20, 400_001), [0.0, -0.0, 1e-30, -1e-30, 7.9, -7.9, 8.0]]).astype(F)
    out = np.empty_like(x)
    k.tanh_into(x, out)
    err = np.abs(out.astype(np.float64) - np.tanh(x.astype(np.float64)))
    assert err.max() <= 3e-7, err.max()
    special = np.array([np.nan, np.inf, -np.inf], F)
    k.tanh_into(special, out[:3])
    assert np.isnan(out[0]) and abs(out[1] - 1) <= 3e-7 and abs(out[2] + 1) <= 3e-7


@pytest.mark.parametrize("n, d", SIZES)
@pytest.mark.parametrize("fb, drop", [(0.0, False), (1.0, True)])
def test_lstm_unit_against_the_reference_and_numpy(n, d, fb, drop):
    rng = np.random.default_rng(n * 100 + d)
    seq = [1 + (i % 3) for i in range(n)]     # some rows ended at t=1 (length 1), others not
    ins = lstm_inputs(rng, n, d, seq, t=1)
    args = seq_args(seq, fb, drop)
    got = run_op("LSTMUnit", ins, 2, ws=fused_ws(), **args)
    want = ref_lstm(ins[0], ins[1], ins[2], seq, 1, fb, drop)
    for g, w in zip(got, want):
        check(g, w)
    for g, w in zip(got, run_op("LSTMUnit", ins, 2, ws=numpy_ws(), **args)):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("n, d", SIZES)
@pytest.mark.parametrize("saved", [False, True])
def test_lstm_gradients_against_the_reference(n, d, saved):
    rng = np.random.default_rng(n + d)
    seq = [2 + (i % 2) for i in range(n)]   # t=2: rows of length 2 ended
    ins = lstm_inputs(rng, n, d, seq, t=2)
    args = seq_args(seq, 0.5, False)
    h, c, acts = run_op("rnn_internal_lstm_unit", ins, 3, ws=fused_ws(), **args)
    dh, dc = rng.uniform(-1, 1, (1, n, d)).astype(F), rng.uniform(-1, 1, (1, n, d)).astype(F)
    op = "rnn_internal_lstm_unit_gradient" if saved else "LSTMUnitGradient"
    grad_ins = [ins[0], ins[1], acts if saved else ins[2], *ins[3:], h, c, dh, dc]
    got = run_op(op, grad_ins, 3, ws=fused_ws(), **args)
    want = ref_lstm_grad(ins[1], ins[2], seq, 2, c, dh, dc, 0.5, False)
    for g, w in zip(got, want, strict=True):
        check(g, w, tol=1e-5)


@pytest.mark.parametrize("n, d", SIZES)
def test_gru_ops_against_numpy_in_float64(n, d):
    """GRUUnit and its gradient, fused float32, against the numpy kernels run in float64 on the same values."""
    rng = np.random.default_rng(7 * n + d)
    seq = [1 + (i % 2) for i in range(n)]
    h_prev = rng.uniform(-1, 1, (1, n, d)).astype(F)
    gates = (rng.standard_normal((1, n, 3 * d)) * 3).astype(F)
    steps = [np.array(seq, np.int32), np.array([1], np.int32)]
    args = {"drop_states": True, "sequence_lengths": True}
    h = run_op("GRUUnit", [h_prev, gates, *steps], 1, ws=fused_ws(), **args)
    want = run_op("GRUUnit", [h_prev.astype(np.float64), gates.astype(np.float64), *steps], 1, ws=numpy_ws(), **args)
    np.testing.assert_allclose(h, want, rtol=1e-6, atol=1e-6)
    dh = rng.uniform(-1, 1, (1, n, d)).astype(F)
    got = run_op("GRUUnitGradient", [h_prev, gates, *steps, h, dh], 2, ws=fused_ws(), **args)
    f64 = [x.astype(np.float64) for x in (h_prev, gates)]
    want = run_op("GRUUnitGradient", [*f64, *steps, want, dh.astype(np.float64)], 2, ws=numpy_ws(), **args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


def test_arrays_that_are_not_contiguous_give_the_same_bits():
    """Inputs that are strided views are read through contiguous copies; outputs that are not C-contiguous are
    written through scratch: the same bits as contiguous arrays."""
    from stepnet.kernels import jit as fused
    from stepnet.kernels import lstm as lstm_cell

    rng = np.random.default_rng(3)
    n, d = 4, 16
    ins = lstm_inputs(rng, n, d, [2, 1, 2, 2], t=1)
    strided = [np.repeat(x, 2, axis=-1)[..., ::2] if x.ndim == 3 else x for x in ins]
    assert not strided[2].flags.c_contiguous and np.array_equal(strided[2], ins[2])
    run, _, _ = lstm_cell.jit_step(fused.load(), True, 1.0, False, True, n, d)
    plain = [np.empty((1, n, d), F), np.empty((1, n, d), F), np.empty((4, n, d), F)]
    run(ins, plain)
    wide = [np.empty((1, n, 2 * d), F)[..., ::2], np.empty((1, n, 2 * d), F)[..., ::2], np.empty((4, n, d), F)]
    run(strided, wide)
    for a, b in zip(plain, wide):
        np.testing.assert_array_equal(a, b)


def test_nan_in_the_gates_reaches_the_outputs():
    rng = np.random.default_rng(4)
    ins = lstm_inputs(rng, 2, 16, None)
    ins[2][0, 1, 3] = np.nan             # row 1, the input gate of unit 3
    h, c = run_op("LSTMUnit", ins, 2, ws=fused_ws(), sequence_lengths=False)
    assert np.isnan(h[0, 1, 3]) and np.isnan(c[0, 1, 3])
    assert np.isfinite(np.delete(h.reshape(-1), 16 + 3)).all()


def test_a_broken_fused_kernel_is_caught(monkeypatch):
    from stepnet.kernels import jit as fused

    k = fused.load()
    real = k.lstm_forward

    def swapped(gates, c_prev, fbh, h, c, acts, save, n, d):   # forget and output gate blocks exchanged
        g = gates.reshape(n, 4, d)[:, [0, 2, 1, 3]].reshape(-1).copy()
        real(g, c_prev, fbh, h, c, acts, save, n, d)
    monkeypatch.setattr(k, "lstm_forward", swapped)
    rng = np.random.default_rng(6)
    ins = lstm_inputs(rng, 3, 8, None)
    h, c = run_op("LSTMUnit", ins, 2, ws=fused_ws(), sequence_lengths=False)
    want_h, want_c = ref_lstm(ins[0], ins[1], ins[2], None, 1, 0.0, False)
    with pytest.raises(AssertionError):
        check(h, want_h)
        check(c, want_c)


def test_fused_cells_without_numba_is_refused(monkeypatch, capsys):
    from stepnet.cli.run import main
    from stepnet.kernels import jit as fused

    monkeypatch.setattr(fused, "installed", lambda: False)
    with pytest.raises(ValueError, match=r"fused_cells=True needs numba: pip install 'numba>=0.60' \(stepnet's"):
        Workspace(fused_cells=True)
    assert Workspace(fused_cells=None).fused_cells is None   # auto: the numpy arithmetic then
    with pytest.raises(SystemExit):
        main(["run", "model.pbtxt", "--fused-cells", "on"])
    assert "--fused-cells on needs numba: pip install 'numba>=0.60' (stepnet's `fast` extra)" in \
        capsys.readouterr().err


def test_run_fused_cells_option(tmp_path, monkeypatch):
    """stepnet run --fused-cells on|off: the same LSTM net, within float32 rounding; an unknown value is refused."""
    from stepnet import save
    from stepnet.cli.run import main
    from stepnet.builders.model import ModelBuilder
    from stepnet.builders.rnn import lstm

    monkeypatch.chdir(tmp_path)
    m = ModelBuilder("m")
    lstm(m, "X", None, ["h0", "c0"], 3, 24, forward_only=True)
    save(m.init_net.proto(), tmp_path / "init.pbtxt")
    save(m.net.proto(), tmp_path / "predict.pbtxt")
    rng = np.random.default_rng(8)
    np.save(tmp_path / "x.npy", rng.uniform(-1, 1, (5, 2, 3)).astype(F))
    np.save(tmp_path / "h.npy", np.zeros((1, 2, 24), F))
    out = {}
    for mode in ("on", "off"):
        assert main(["run", "init.pbtxt", "predict.pbtxt", "--feed", "X=x.npy", "--feed", "h0=h.npy", "--feed",
                     "c0=h.npy", "--fetch", "LSTM/hidden_state_all", "--save", f"{mode}.npz", "-q",
                     "--fused-cells", mode]) == 0
        out[mode] = np.load(tmp_path / f"{mode}.npz")["LSTM/hidden_state_all"]
    np.testing.assert_allclose(out["on"], out["off"], rtol=1e-5, atol=1e-6)
    assert not np.array_equal(out["on"], out["off"])   # two arithmetics really ran
    with pytest.raises(SystemExit):
        main(["run", "init.pbtxt", "predict.pbtxt", "--fused-cells", "maybe"])
