"""Shared by test_lstm.py and test_gru.py: per-element references of LSTMUnit / GRUUnit and their gradients
written with Python's math module (Caffe2's lstm_unit_op.h / gru_unit_op.h formulas), the case tables, the
data builders, the check of the gradient op Caffe2's makers emit, and the inputs of the error tables."""
import math

import numpy as np

from stepnet.passes.gradients import backward_ops
from stepnet.testing import make_op

rng = np.random.default_rng(7)


def f32(*shape, scale=1.5):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def i32(*values):
    return np.array(values, dtype=np.int32)


def sig(v):
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))


def check(got, want, tol=2e-6):
    assert got.dtype == np.float32, f"dtype {got.dtype}, want float32"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=10 * tol, atol=tol)


# --------------------------------------------------------------------------------------------- references

def cells(shape, seq, t):
    """(n, d, valid) for every element of a 1×N×D state; valid: row n still runs at timestep t (seq None: every
    row runs)."""
    _, n_rows, dim = shape
    for n in range(n_rows):
        valid = seq is None or t < seq[n]
        for d in range(dim):
            yield n, d, valid


def lstm_gates(gates, n, d, forget_bias):
    """σ(i), σ(f + forget_bias), σ(o), tanh(g) of element (n, d) of 1×N×4D gates."""
    dim = gates.shape[2] // 4
    x = [float(gates[0, n, k * dim + d]) for k in range(4)]
    return sig(x[0]), sig(x[1] + forget_bias), sig(x[2]), math.tanh(x[3])


def gru_gates(gates, n, d):
    """σ(update), tanh(output) of element (n, d) of 1×N×3D gates (GRUUnit does not read the reset part)."""
    dim = gates.shape[2] // 3
    return sig(float(gates[0, n, dim + d])), math.tanh(float(gates[0, n, 2 * dim + d]))


def ref_lstm(h_prev, c_prev, gates, seq, t, forget_bias=0.0, drop_states=False):
    """hidden_t, cell_t element by element (seq None: every row valid)."""
    h, c = np.zeros(c_prev.shape), np.zeros(c_prev.shape)
    for n, d, valid in cells(c_prev.shape, seq, t):
        if not valid:
            keep = not drop_states
            h[0, n, d] = float(h_prev[0, n, d]) if keep else 0.0
            c[0, n, d] = float(c_prev[0, n, d]) if keep else 0.0
            continue
        i, f, o, g = lstm_gates(gates, n, d, forget_bias)
        c[0, n, d] = f * float(c_prev[0, n, d]) + i * g
        h[0, n, d] = o * math.tanh(c[0, n, d])
    return h.astype(np.float32), c.astype(np.float32)


def ref_lstm_grad(c_prev, gates, seq, t, c, dh, dc, forget_bias=0.0, drop_states=False):
    """(dh_prev, dc_prev, dgates) with Caffe2's formulas, element by element."""
    dim = c_prev.shape[2]
    dh_prev, dc_prev, dg = np.zeros(c_prev.shape), np.zeros(c_prev.shape), np.zeros(gates.shape)
    for n, d, valid in cells(c_prev.shape, seq, t):
        dh_nd, dc_nd = float(dh[0, n, d]), float(dc[0, n, d])
        if not valid:
            dh_prev[0, n, d] = 0.0 if drop_states else dh_nd
            dc_prev[0, n, d] = 0.0 if drop_states else dc_nd
            continue
        i, f, o, g = lstm_gates(gates, n, d, forget_bias)
        tc = math.tanh(float(c[0, n, d]))
        dct = dc_nd + dh_nd * o * (1 - tc * tc)
        dc_prev[0, n, d] = dct * f
        dg[0, n, d] = dct * g * i * (1 - i)
        dg[0, n, dim + d] = dct * float(c_prev[0, n, d]) * f * (1 - f)
        dg[0, n, 2 * dim + d] = dh_nd * tc * o * (1 - o)
        dg[0, n, 3 * dim + d] = dct * i * (1 - g * g)
    return dh_prev.astype(np.float32), dc_prev.astype(np.float32), dg.astype(np.float32)


def ref_gru(h_prev, gates, seq, t, drop_states=False):
    h = np.zeros(h_prev.shape)
    for n, d, valid in cells(h_prev.shape, seq, t):
        hp = float(h_prev[0, n, d])
        if not valid:
            h[0, n, d] = 0.0 if drop_states else hp
            continue
        u, o = gru_gates(gates, n, d)
        h[0, n, d] = hp * u + o * (1 - u)
    return h.astype(np.float32)


def ref_gru_grad(h_prev, gates, seq, t, dh, drop_states=False):
    dim = h_prev.shape[2]
    dh_prev, dg = np.zeros(h_prev.shape), np.zeros(gates.shape)
    for n, d, valid in cells(h_prev.shape, seq, t):
        g_nd = float(dh[0, n, d])
        if not valid:
            dh_prev[0, n, d] = 0.0 if drop_states else g_nd
            continue
        u, o = gru_gates(gates, n, d)
        dh_prev[0, n, d] = g_nd * u
        dg[0, n, dim + d] = (g_nd * float(h_prev[0, n, d]) - g_nd * o) * u * (1 - u)
        dg[0, n, 2 * dim + d] = g_nd * (1 - u) * (1 - o * o)
    return dh_prev.astype(np.float32), dg.astype(np.float32)


# --------------------------------------------------------------------------------------------- cases
# (name, N, D, seq_lengths or None for sequence_lengths=0, timestep, forget_bias, drop_states, gate scale)
CASES = [
    ("all_valid", 4, 5, [3, 4, 5, 6], 2, 0.0, False, 1.5),
    ("some_ended_carry", 5, 3, [3, 1, 2, 0, 5], 1, 1.0, False, 1.5),
    ("some_ended_drop", 5, 3, [3, 1, 2, 0, 5], 1, 1.0, True, 1.5),
    ("all_ended", 2, 3, [1, 2], 2, 0.5, False, 1.5),
    ("no_seq_lengths", 3, 4, None, 7, -0.75, True, 1.5),
    ("large_gates", 3, 4, [2, 1, 2], 1, 2.0, False, 60.0),   # saturation: no overflow, no NaN
]


def seq_args(seq, forget_bias=None, drop_states=False):
    args = {"drop_states": int(drop_states)}
    if seq is None:
        args["sequence_lengths"] = 0
    if forget_bias is not None:
        args["forget_bias"] = float(forget_bias)
    return args


# ------------------------------------------------------------------------------------- finite differences
GRAD_CASES = [  # (seq_lengths or None, timestep, forget_bias, drop_states); rows 1 and 2 end at t=1 below
    ([3, 1, 1], 1, 1.5, False),
    ([3, 1, 1], 1, 1.5, True),
    ([2, 2, 2], 1, 0.0, False),
    (None, 4, -0.5, False),
]


# ----------------------------------------------------------------------------------------- gradient makers
def check_gradient_maker(op_type, grad_type, n_grad_in, n_grad_out, with_seq):
    """The gradient op Caffe2's maker emits for LSTMUnit / GRUUnit (with or without seq_lengths): its type, its
    inputs (forward inputs, outputs, output gradients), its outputs (the float inputs' gradients), its args, and
    no gradient for seq_lengths or the timestep."""
    lstm = op_type == "LSTMUnit"
    names = ["h_prev", "c_prev", "gates", "seq", "t"] if lstm else ["h_prev", "gates", "seq", "t"]
    outs = ["h", "c"] if lstm else ["h"]
    if not with_seq:
        names.remove("seq")
    args = {"drop_states": 1, "sequence_lengths": int(with_seq)}
    fwd = make_op(op_type, names, outs, **args)
    ops, grads = backward_ops([fwd], {o: o + "_grad" for o in outs})
    (gop,) = ops
    assert gop.type == grad_type
    assert list(gop.input) == names + outs + [o + "_grad" for o in outs]
    assert len(gop.input) == n_grad_in - (0 if with_seq else 1)
    float_inputs = names[:n_grad_out]
    assert list(gop.output) == [x + "_grad" for x in float_inputs]
    assert {a.name: a.i for a in gop.arg} == args
    assert all(grads.get(x) is None for x in ("seq", "t"))


# --------------------------------------------------------------------------------------------- errors
h3, c3, g12, seq3, t1 = f32(1, 3, 4), f32(1, 3, 4), f32(1, 3, 16), i32(1, 2, 3), i32(1)
