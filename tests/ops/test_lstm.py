"""LSTMUnit, rnn_internal_lstm_unit and their gradients (stepnet/ops/lstm.py) against the per-element references
of rnn_cell_reference.py, finite-difference gradient checks, errors, and tests that a broken kernel is caught.
GRUUnit is tested in test_gru.py."""
import numpy as np
import pytest
from rnn_cell_reference import (CASES, GRAD_CASES, c3, check, check_gradient_maker, f32, g12, h3, i32, ref_lstm,
                                ref_lstm_grad, seq3, seq_args, sig, t1)

from stepnet.core.backend import DeviceArray
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.io.proto import DeviceOption
from stepnet.testing import DEVICES, check_gradient, make_op, run_op
from stepnet.runtime.workspace import Workspace


def lstm_inputs(n, d, seq, t, scale):
    h, c, g = f32(1, n, d), f32(1, n, d), f32(1, n, 4 * d, scale=scale)
    steps = [i32(*seq)] if seq is not None else []
    return [h, c, g, *steps, i32(t)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lstm_unit_forward(case, device):
    _, n, d, seq, t, fb, drop, scale = case
    ins = lstm_inputs(n, d, seq, t, scale)
    h, c = run_op("LSTMUnit", ins, 2, device=device, **seq_args(seq, fb, drop))
    want_h, want_c = ref_lstm(ins[0], ins[1], ins[2], seq, t, fb, drop)
    check(h, want_h)
    check(c, want_c)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lstm_unit_gradient_formulas(case, device):
    _, n, d, seq, t, fb, drop, scale = case
    ins = lstm_inputs(n, d, seq, t, scale)
    h, c = ref_lstm(ins[0], ins[1], ins[2], seq, t, fb, drop)
    dh, dc = f32(1, n, d), f32(1, n, d)
    got = run_op("LSTMUnitGradient", [*ins, h, c, dh, dc], 3, device=device, **seq_args(seq, fb, drop))
    want = ref_lstm_grad(ins[1], ins[2], seq, t, c, dh, dc, fb, drop)
    for g, w in zip(got, want, strict=True):
        check(g, w, tol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_saved_activation_forms(case, device):
    """rnn_internal_lstm_unit: LSTMUnit's outputs plus [σ(i), σ(f + forget_bias), σ(o), tanh(g)] (4×N×D);
    rnn_internal_lstm_unit_gradient from those (and tanh of the cell state): LSTMUnitGradient's results."""
    _, n, d, seq, t, fb, drop, scale = case
    ins = lstm_inputs(n, d, seq, t, scale)
    h, c, acts = run_op("rnn_internal_lstm_unit", ins, 3, device=device, **seq_args(seq, fb, drop))
    want_h, want_c = ref_lstm(ins[0], ins[1], ins[2], seq, t, fb, drop)
    check(h, want_h)
    check(c, want_c)
    gates = ins[2].astype(np.float64)
    want = [np.vectorize(sig)(gates[..., k * d:(k + 1) * d] + (fb if k == 1 else 0)) for k in range(3)]
    want += [np.tanh(gates[..., 3 * d:])]
    check(acts, np.concatenate(want, axis=0).astype(np.float32), tol=1e-5)
    dh, dc = f32(1, n, d), f32(1, n, d)
    got = run_op("rnn_internal_lstm_unit_gradient", [*ins[:2], acts, *ins[3:], h, c, dh, dc], 3, device=device,
                 **seq_args(seq, fb, drop))
    for g, w in zip(got, ref_lstm_grad(ins[1], ins[2], seq, t, c, dh, dc, fb, drop), strict=True):
        check(g, w, tol=1e-5)


# ------------------------------------------------------------------------------------- finite differences
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seq,t,fb,drop", GRAD_CASES)
def test_lstm_unit_check_gradient(seq, t, fb, drop, device):
    ins = lstm_inputs(3, 2, seq, t, 1.5)
    check_gradient("LSTMUnit", ins, outputs=2, wrt=[0, 1, 2], device=device, directions=8,
                   **seq_args(seq, fb, drop))


@pytest.mark.parametrize("op_type,grad_type,n_grad_in,n_grad_out", [
    ("LSTMUnit", "LSTMUnitGradient", 9, 3)])
@pytest.mark.parametrize("with_seq", [True, False])
def test_gradient_maker_emits_caffe2_op(op_type, grad_type, n_grad_in, n_grad_out, with_seq):
    check_gradient_maker(op_type, grad_type, n_grad_in, n_grad_out, with_seq)


# --------------------------------------------------------------------------------------------- devices

def test_host_seq_lengths_and_timestep_with_a_device_op():
    """Caffe2 keeps the timestep (and here seq_lengths) on the CPU while the op runs on the GPU."""
    seq, t = [2, 0, 1], 1
    h, c, g = f32(1, 3, 2), f32(1, 3, 2), f32(1, 3, 8)
    ws = Workspace(gpu="emulate")
    for name, value in (("h", h), ("c", c), ("g", g)):
        ws.feed(name, value, device_option=DeviceOption(device_type=1))
    ws.feed("seq", i32(*seq))
    ws.feed("t", i32(t))
    ws.run_operator_once(make_op("LSTMUnit", ["h", "c", "g", "seq", "t"], ["ho", "co"], device="emulated",
                                 forget_bias=0.25))
    assert isinstance(ws.get_blob("ho").value, DeviceArray)
    want_h, want_c = ref_lstm(h, c, g, seq, t, 0.25)
    check(ws.fetch("ho"), want_h)
    check(ws.fetch("co"), want_c)
    dh, dc = f32(1, 3, 2), f32(1, 3, 2)
    ws.feed("dh", dh, device_option=DeviceOption(device_type=1))
    ws.feed("dc", dc, device_option=DeviceOption(device_type=1))
    ws.run_operator_once(make_op("LSTMUnitGradient", ["h", "c", "g", "seq", "t", "ho", "co", "dh", "dc"],
                                 ["dh_prev", "dc_prev", "dg"], device="emulated", forget_bias=0.25))
    want = ref_lstm_grad(c, g, seq, t, want_c, dh, dc, 0.25)
    for name, w in zip(("dh_prev", "dc_prev", "dg"), want, strict=True):
        check(ws.fetch(name), w, tol=1e-5)


# --------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,args,error,match", [
    ("LSTMUnit", [h3, c3, f32(1, 3, 12), seq3, t1], {}, ShapeError, r"1×N×4D.*\(1, 3, 12\)"),
    ("LSTMUnit", [h3, c3, g12, seq3.astype(np.int64), t1], {}, DTypeError, "seq_lengths must be int32"),
    ("LSTMUnit", [h3, c3, g12, seq3, t1.astype(np.int64)], {}, DTypeError, "timestep must be int32"),
    ("LSTMUnit", [h3, c3, g12, seq3], {}, ArityError, "takes 5 inputs.*timestep.*sequence_lengths=0"),
    ("LSTMUnit", [h3, c3, g12, seq3, t1], {"sequence_lengths": 0}, ArityError, "set sequence_lengths=1"),
    ("LSTMUnit", [h3, c3, g12, i32(1, 2), t1], {}, ShapeError, "seq_lengths has 2 entries.*N"),
    ("LSTMUnit", [f32(1, 3, 5), c3, g12, seq3, t1], {}, ShapeError, "hidden_t_prev has shape"),
    ("LSTMUnit", [h3, f32(3, 4), g12, seq3, t1], {}, ShapeError, "cell_t_prev must be 1×N×D"),
    ("LSTMUnit", [h3.astype(np.float64), c3, g12, seq3, t1], {}, DTypeError, "LSTMUnit needs one dtype for all inputs"),
    ("LSTMUnit", [h3, c3, g12, seq3, i32(1, 2)], {}, ShapeError, "timestep has 2 entries"),
    ("LSTMUnitGradient", [h3, c3, g12, seq3, t1, h3, c3, h3], {}, ArityError, "takes 9 inputs"),
    ("rnn_internal_lstm_unit_gradient", [h3, c3, g12, seq3, t1, h3, c3, h3, c3], {}, ShapeError, r"4×N×D = \(4, 3"),
])
def test_bad_inputs(op_type, inputs, args, error, match, device):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, REGISTRY.get(op_type).outputs[0], device=device, **args)


def test_forget_bias_must_be_a_float_argument():
    with pytest.raises(ArgumentError, match="forget_bias.*float"):
        run_op("LSTMUnit", [h3, c3, g12, seq3, t1], 2, forget_bias=1)


# ---------------------------------------------------------------------------------------- test the tester

def _swap_forget_and_output(xp, h_prev, c_prev, gates, *rest, **args):
    d = c_prev.shape[2]
    i, f, o, g = (gates[..., k * d:(k + 1) * d] for k in range(4))
    swapped = xp.concatenate([i, o, f, g], axis=2)
    return KERNELS["LSTMUnit"](xp, h_prev, c_prev, swapped, *rest, **args)


def _no_pass_through(xp, *inputs, **args):
    dh_prev, dc_prev, dg = KERNELS["LSTMUnitGradient"](xp, *inputs, **args)
    return xp.zeros_like(dh_prev), dc_prev, dg


KERNELS = {name: REGISTRY.get(name).kernel for name in ("LSTMUnit", "LSTMUnitGradient")}


def test_reference_catches_a_gate_order_bug(broken):
    broken("LSTMUnit", _swap_forget_and_output)
    ins = lstm_inputs(3, 4, [3, 3, 3], 0, 1.5)
    h, c = run_op("LSTMUnit", ins, 2)
    want_h, want_c = ref_lstm(*ins[:3], [3, 3, 3], 0)
    with pytest.raises(AssertionError):
        check(h, want_h)
        check(c, want_c)


def test_check_gradient_catches_a_missing_pass_through(broken):
    broken("LSTMUnitGradient", _no_pass_through)
    with pytest.raises(AssertionError, match="input 0"):
        check_gradient("LSTMUnit", lstm_inputs(3, 2, [3, 1, 1], 1, 1.5), outputs=2, wrt=[0, 1, 2])
