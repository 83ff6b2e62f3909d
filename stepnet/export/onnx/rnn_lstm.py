"""A RecurrentNetwork that is exactly Caffe2's LSTM layer, exported as one ONNX `LSTM` node instead of a Scan.

The layout recognised is rnn_cell.LSTM's (spec §3.16): the op's sequence input is FC(X, i2h_w, i2h_b, axis=2),
read by nothing else, and the step net is FC(hidden_t_prev, gates_t_w, gates_t_b, axis=2), Sum(gates, input_t),
LSTMUnit (drop_states=0) with the usual links. ONNX's gate order is i, o, f, c (Caffe2's i, f, o, g), so the
weights are gathered in that order and forget_bias is added to the input bias of f. With seq_lengths, ONNX's Y
is 0 past a row's length where stepnet carries the last state: those rows of `_all` are taken from Y_h, which is
that last state. Anything else (cell state rows wanted, drop_states, more layers) goes through the Scan.
(onnxruntime refuses a sequence length of 0 at run time, where stepnet carries the initial state through.)
"""
from __future__ import annotations

import warnings

import numpy as np

from ...ops.binding import parse_args
from ...ops import REGISTRY
from .convert import version_before


def _args(op) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_args(REGISTRY.get(op.type), op, op.type, strict=False)


def _cell(r):
    """(fc, unit) of a step net that is exactly FC -> Sum(gates, input_t) -> LSTMUnit, else None."""
    ops = list(r.step.op)
    if [o.type for o in ops] != ["FC", "Sum", "LSTMUnit"] or len(r.states) != 2 or len(r.inputs) != 1:
        return None
    fc, add, unit = ops
    x_t = r.inputs[0].internal
    a = _args(unit)
    if (a["drop_states"] or _args(fc)["axis"] != 2 or _args(fc)["axis_w"] != 1 or len(unit.output) != 2
            or sorted(add.input) != sorted([fc.output[0], x_t]) or unit.input[2] != add.output[0]
            or fc.input[0] != unit.input[0] or unit.input[-1] != r.timestep or r.inputs[0].window != 1
            or r.inputs[0].offset != 0):
        return None
    writes = {lk.internal: s for s, lk in r.writes.items()}
    reads = {lk.internal: lk.external for lk in r.reads if lk.offset == 0 and lk.window == 1}
    h_state, c_state = writes.get(unit.output[0]), writes.get(unit.output[1])
    if (h_state is None or c_state is None or reads.get(unit.input[0]) != h_state
            or reads.get(unit.input[1]) != c_state or any(r.states[s][1] != 1 for s in r.states)):
        return None
    return fc, unit, h_state, c_state


def _folded_fc(c, name: str):
    """The outer FC(axis=2) making the op's sequence input when nothing else reads its output, else None."""
    g = c.conv.graph
    key = (name, version_before(g, name, c.index))
    i = g.writer.get(key)
    if i is None or key in c.conv.outputs or [k for k in g.consumers.get(key, ()) if k in c.conv.needed] != [c.index]:
        return None
    fc = g.ops[i]
    if fc.type != "FC" or _args(fc)["axis"] != 2 or _args(fc)["axis_w"] != 1:
        return None
    return [c.conv.value((n, v)) for n, v in zip(fc.input, g.in_versions[i])]


def lstm_op(c, r, carries0):
    """(results, rows) as the Scan path makes them (final states in state order, then `_all` rows), computed
    by one ONNX LSTM node; None when the op is not exactly an LSTM layer (the caller builds a Scan)."""
    if c.conv.state.options.get("rnn", "auto") != "auto":
        return None
    cell = _cell(r)
    if cell is None:
        return None
    fc, unit, h_state, c_state = cell
    if rows_wanted(c, r) - {h_state}:
        return None
    outer = _folded_fc(c, r.inputs[0].external)
    if outer is None:
        return None
    e, T, N = c.e, r.T, r.N
    x, wi, bi = outer
    wr, br = (outer_value(c, n) for n in fc.input[1:])
    H = c.conv.state.specs[wr].shape[1] if wr in c.conv.state.specs else e.consts[wr].shape[1]
    order = e.const(np.concatenate([np.arange(H) + k * H for k in (0, 2, 1, 3)]).astype(np.int64))

    def gathered(v):
        return e.node("Gather", [v, order], axis=0)

    w, rw = (e.unsqueeze(gathered(v), [0]) for v in (wi, wr))
    wb, rb = gathered(e.reshape(bi, [-1])), gathered(e.reshape(br, [-1]))
    fb = float(_args(unit)["forget_bias"])
    if fb:
        shift = np.zeros(4 * H, np.float32)
        shift[2 * H:3 * H] = fb
        wb = e.node("Add", [wb, e.const(shift)])
    x_rank = len(c.conv.state.specs[x].shape) if x in c.conv.state.specs else 3
    if x_rank != 3:
        x = e.reshape(x, [T, N, -1])
    seq = outer_value(c, unit.input[3]) if len(unit.input) == 5 else None
    lens = e.reshape(seq, [N]) if seq is not None else ""
    states = list(r.states)
    h0, c0 = carries0[states.index(h_state)], carries0[states.index(c_state)]
    y, y_h, y_c = e.node("LSTM", [x, w, rw, e.unsqueeze(e.concat([wb, rb], 0), [0]), lens, h0, c0], n=3,
                         hidden_size=H)
    rows_all = e.squeeze(y, [1])
    if seq is not None:   # past its length a row keeps its last state, which is Y_h
        steps = e.const(np.arange(T, dtype=np.int32).reshape(T, 1))
        valid = e.unsqueeze(e.node("Less", [steps, e.reshape(seq, [1, N])]), [2])
        rows_all = e.node("Where", [valid, rows_all, y_h])
    finals = {h_state: y_h, c_state: y_c}
    results = [finals[s] for s in states] + ["", rows_all]
    c.conv.state.notes.append(f"{c.label}: exported as one ONNX LSTM node")
    return results, {h_state: len(results) - 1}


def outer_value(c, name: str) -> str:
    """The ONNX value of an outer blob a step net reads: the op's input, or its version before the op."""
    if name in c.op.input:
        return c.x(list(c.op.input).index(name))
    return c.conv.value((name, version_before(c.conv.graph, name, c.index)))


def rows_wanted(c, r) -> set:
    """States some wanted alias needs the scanned rows of (not only the final carry)."""
    a, out = c.args, set()
    for src, dst, offset in zip(a["alias_src"], a["alias_dst"], a["alias_offset"]):
        j = list(c.op.output).index(dst)
        _, L, _, _ = r.states[src]
        start = offset if offset >= 0 else r.T + L + offset
        if c.wants(j) and start < r.T:
            out.add(src)
    return out
