"""GRUUnit and its gradient (stepnet/ops/gru.py) against the per-element references of rnn_cell_reference.py,
finite-difference gradient checks, errors, and a test that a broken kernel is caught. LSTMUnit is tested in
test_lstm.py."""
import numpy as np
import pytest
from rnn_cell_reference import (CASES, GRAD_CASES, check, check_gradient_maker, f32, g12, h3, i32, ref_gru,
                                ref_gru_grad, seq3, seq_args, t1)

from stepnet.core.errors import ArityError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, check_gradient, run_op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gru_unit_forward_and_gradient_formulas(case, device):
    _, n, d, seq, t, _fb, drop, scale = case
    h_prev, gates = f32(1, n, d), f32(1, n, 3 * d, scale=scale)
    steps = ([i32(*seq)] if seq is not None else []) + [i32(t)]
    h = run_op("GRUUnit", [h_prev, gates, *steps], 1, device=device, **seq_args(seq, None, drop))
    check(h, ref_gru(h_prev, gates, seq, t, drop))
    dh = f32(1, n, d)
    got = run_op("GRUUnitGradient", [h_prev, gates, *steps, h, dh], 2, device=device,
                 **seq_args(seq, None, drop))
    for g, w in zip(got, ref_gru_grad(h_prev, gates, seq, t, dh, drop), strict=True):
        check(g, w, tol=1e-5)


# ------------------------------------------------------------------------------------- finite differences
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seq,t,_fb,drop", GRAD_CASES)
def test_gru_unit_check_gradient(seq, t, _fb, drop, device):
    steps = ([i32(*seq)] if seq is not None else []) + [i32(t)]
    check_gradient("GRUUnit", [f32(1, 3, 2), f32(1, 3, 6), *steps], outputs=1, wrt=[0, 1], device=device,
                   directions=8, **seq_args(seq, None, drop))


@pytest.mark.parametrize("op_type,grad_type,n_grad_in,n_grad_out", [
    ("GRUUnit", "GRUUnitGradient", 6, 2)])
@pytest.mark.parametrize("with_seq", [True, False])
def test_gradient_maker_emits_caffe2_op(op_type, grad_type, n_grad_in, n_grad_out, with_seq):
    check_gradient_maker(op_type, grad_type, n_grad_in, n_grad_out, with_seq)


# --------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,args,error,match", [
    ("GRUUnit", [h3, g12, seq3, t1], {}, ShapeError, "1×N×3D"),
    ("GRUUnit", [h3, f32(1, 3, 12), seq3.astype(np.float32), t1], {}, DTypeError, "int32"),
    ("GRUUnit", [h3, f32(1, 3, 12), seq3], {}, ArityError, "timestep"),
])
def test_bad_inputs(op_type, inputs, args, error, match, device):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, REGISTRY.get(op_type).outputs[0], device=device, **args)


# ---------------------------------------------------------------------------------------- test the tester

def _gru_wrong_dh_prev(xp, h_prev, gates, *rest, **args):
    dh_prev, dg = KERNELS["GRUUnitGradient"](xp, h_prev, gates, *rest, **args)
    return dh_prev * dh_prev.dtype.type(0.5), dg


KERNELS = {name: REGISTRY.get(name).kernel for name in ("GRUUnitGradient",)}


def test_check_gradient_catches_a_wrong_gru_gradient(broken):
    broken("GRUUnitGradient", _gru_wrong_dh_prev)
    with pytest.raises(AssertionError, match="input 0"):
        check_gradient("GRUUnit", [f32(1, 3, 2), f32(1, 3, 6), i32(3, 3, 3), i32(0)], outputs=1, wrt=[0, 1])


def test_gru_unit_accepts_and_ignores_forget_bias():
    """Caffe2's gru_cell.py sets forget_bias on GRUUnit, whose kernel never reads it."""
    import warnings
    rng = np.random.default_rng(0)
    h = rng.standard_normal((1, 2, 3)).astype(np.float32)
    g = rng.standard_normal((1, 2, 9)).astype(np.float32)
    t = np.array([0], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with_bias = run_op("GRUUnit", [h, g, t], sequence_lengths=0, forget_bias=2.5)
    np.testing.assert_array_equal(with_bias, run_op("GRUUnit", [h, g, t], sequence_lengths=0))
