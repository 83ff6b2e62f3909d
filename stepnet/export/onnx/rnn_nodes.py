"""A RecurrentNetwork that is exactly Caffe2's LSTM or GRU layer, exported as one ONNX `LSTM` or `GRU` node
instead of a Scan.

The LSTM layout recognised is rnn_cell.LSTM's (spec §3.16): the op's sequence input is FC(X, i2h_w, i2h_b,
axis=2), read by nothing else, and the step net is FC(hidden_t_prev, gates_t_w, gates_t_b, axis=2), Sum(gates,
input_t), LSTMUnit (drop_states=0) with the usual links. ONNX's gate order is i, o, f, c (Caffe2's i, f, o, g), so
the weights are gathered in that order and forget_bias is added to the input bias of f.

The GRU layout is gru_cell.GRU's: the same outer FC to 3H, and a step net that splits input_t into its reset,
update and output parts, adds FC(hidden_t_prev) for reset and update, takes the sigmoid of reset, and makes the
output part from FC(reset · hidden_t_prev) (or, with linear_before_reset, reset · FC(hidden_t_prev)) plus its
input part, then Concat and GRUUnit (drop_states=0). ONNX's GRU computes the same thing with z = update, r = reset,
h = output and its linear_before_reset set alike; its weights are gathered in the order z, r, h.

With seq_lengths, ONNX's Y is 0 past a row's length where stepnet carries the last state: those rows of `_all`
are taken from Y_h, which is that last state. Anything else (cell state rows wanted, drop_states, more layers,
another arrangement of the step ops) goes through the Scan. (onnxruntime refuses a sequence length of 0 at run
time, where stepnet carries the initial state through.)
"""
from __future__ import annotations

import warnings

import numpy as np

from ...core.errors import ArgumentError
from ...ops.binding import parse_args
from ...ops import REGISTRY
from .convert import version_before


def _args(op) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_args(REGISTRY.get(op.type), op, op.type, strict=False)


def _layer_fc(op) -> bool:
    """Whether op is an FC over a layer's sequence or step rows: FC(X, W, b) with axis=2, axis_w=1."""
    if op.type != "FC" or len(op.input) != 3:
        return False
    a = _args(op)
    return a["axis"] == 2 and a["axis_w"] == 1


def _cell(r):
    """(fc, unit) of a step net that is exactly FC -> Sum(gates, input_t) -> LSTMUnit, else None."""
    ops = list(r.step.op)
    if [o.type for o in ops] != ["FC", "Sum", "LSTMUnit"] or len(r.states) != 2 or len(r.inputs) != 1:
        return None
    fc, add, unit = ops
    x_t = r.inputs[0].internal
    a = _args(unit)
    if (a["drop_states"] or not _layer_fc(fc) or len(unit.output) != 2
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


_GRU_OPS = sorted(["Split", "FC", "FC", "FC", "Sum", "Sum", "Sum", "Sigmoid", "Mul", "Concat", "GRUUnit"])


def _gru_cell(r):
    """(GRUUnit, hidden state, the input_t block of each of reset/update/output, their step FCs in that order,
    linear_before_reset) of a step net that is exactly gru_cell's (the module doc), else None. Matched by what
    each op reads: every one of the eleven ops once."""
    ops = list(r.step.op)
    if (sorted(o.type for o in ops) != _GRU_OPS or len(r.states) != 1 or len(r.inputs) != 1 or len(r.writes) != 1
            or r.inputs[0].window != 1 or r.inputs[0].offset != 0 or any(r.states[s][1] != 1 for s in r.states)):
        return None
    made, src = {}, {}           # name -> the op that last wrote it; (op, input index) -> the op it reads
    for o in ops:
        for k, n in enumerate(o.input):
            src[id(o), k] = made.get(n)
        made.update((n, o) for n in o.output)
    unit, x_t = ops[-1], r.inputs[0].internal
    if unit.type != "GRUUnit" or len(unit.output) != 1 or len(unit.input) not in (3, 4):
        return None
    a = _args(unit)
    writes = {lk.internal: s for s, lk in r.writes.items()}
    reads = {lk.internal: lk.external for lk in r.reads if lk.offset == 0 and lk.window == 1}
    h_prev, h_state = unit.input[0], writes.get(unit.output[0])
    if (a["drop_states"] or len(unit.input) != 3 + bool(a["sequence_lengths"]) or unit.input[-1] != r.timestep
            or h_state is None or reads.get(h_prev) != h_state):
        return None

    def of(o, k, kind):
        """The op of type `kind` whose output input k of o reads, else None."""
        p = src.get((id(o), k))
        return p if p is not None and p.type == kind else None

    def is_h(o, k):
        return o.input[k] == h_prev and src[id(o), k] is None

    def fc_of(o, k, reads_ok):
        fc = of(o, k, "FC")
        if fc is None or not _layer_fc(fc):
            return None
        return fc if reads_ok(fc) and src[id(fc), 1] is None and src[id(fc), 2] is None else None

    def h_fc(o, k):
        return fc_of(o, k, lambda fc: is_h(fc, 0))

    def sum_of(o, k, product):
        """(Sum, product op(s), Split, block): input k of o is Sum(product, one output of a Split)."""
        add = of(o, k, "Sum")
        for j in (0, 1) if add is not None and len(add.input) == 2 else ():
            prod, split = product(add, j), of(add, 1 - j, "Split")
            if prod is not None and split is not None:
                return add, prod, split, list(split.output).index(add.input[1 - j])
        return None

    def gated(o, k, other_ok):
        """(Mul, Sigmoid): input k of o is Mul(σ(x), y) in either order, other_ok(mul, y's index)."""
        mul = of(o, k, "Mul")
        for m in (0, 1) if mul is not None and len(mul.input) == 2 else ():
            sig = of(mul, m, "Sigmoid")
            if sig is not None and other_ok(mul, 1 - m):
                return mul, sig
        return None

    def output_product(add, j):
        """((FC, Mul, Sigmoid), linear_before_reset): FC(σ(reset)·h_prev), or σ(reset)·FC(h_prev)."""
        fc = fc_of(add, j, lambda fc: gated(fc, 0, is_h) is not None)
        if fc is not None:
            return (fc, *gated(fc, 0, is_h)), False
        found = gated(add, j, lambda mul, k: h_fc(mul, k) is not None)
        if found is None:
            return None
        mul = found[0]
        return (h_fc(mul, 0) or h_fc(mul, 1), *found), True

    concat = of(unit, 1, "Concat")
    if concat is None or len(concat.input) != 3 or _args(concat)["axis"] != 2 or _args(concat)["add_axis"]:
        return None
    reset, update = (sum_of(concat, k, h_fc) for k in (0, 1))
    output = sum_of(concat, 2, output_product)
    if None in (reset, update, output):
        return None
    (out_fc, mul, sig), before_reset = output[1]
    split, sa = reset[2], _args(reset[2])
    if (src[id(sig), 0] is not reset[0] or update[2] is not split or output[2] is not split
            or split.input[0] != x_t or src[id(split), 0] is not None or len(split.input) != 1
            or len(split.output) != 3 or sa["axis"] != 2 or sa["add_axis"]
            or (sa["split"] and len(set(sa["split"])) != 1)
            or sorted(g[3] for g in (reset, update, output)) != [0, 1, 2]):
        return None
    matched = (unit, concat, reset[0], update[0], output[0], reset[1], update[1], out_fc, mul, sig, split)
    if len({id(o) for o in matched}) != len(ops):
        return None
    return unit, h_state, (reset[3], update[3], output[3]), (reset[1], update[1], out_fc), before_reset


def _folded_fc(c, name: str):
    """The outer FC(axis=2) making the op's sequence input when nothing else reads its output, else None."""
    g = c.conv.graph
    key = (name, version_before(g, name, c.index))
    i = g.writer.get(key)
    if i is None or key in c.conv.outputs or [k for k in g.consumers.get(key, ()) if k in c.conv.needed] != [c.index]:
        return None
    fc = g.ops[i]
    if not _layer_fc(fc):
        return None      # (an FC whose arguments do not read was refused by its own converter, run before)
    values = [c.conv.value((n, v)) for n, v in zip(fc.input, g.in_versions[i])]
    return values if len(_shape(c, values[1])) == 2 else None


def lstm_op(c, r, carries0):
    """(results, rows) as the Scan path makes them (final states in state order, then `_all` rows), computed
    by one ONNX LSTM node; None when the op is not exactly an LSTM layer (the caller builds a Scan)."""
    cell = _matched(_cell, c, r)
    if cell is None:
        return None
    fc, unit, h_state, c_state = cell
    outer = _layer_input(c, r, h_state)
    if outer is None:
        return None
    e = c.e
    x, wi, bi = outer
    wr, br = (outer_value(c, n) for n in fc.input[1:])
    if len(_shape(c, wr)) != 2:
        return None
    H = _rows(c, wr) // 4
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
    seq = outer_value(c, unit.input[3]) if len(unit.input) == 5 else None
    states = list(r.states)
    h0, c0 = carries0[states.index(h_state)], carries0[states.index(c_state)]
    y, y_h, y_c = e.node("LSTM", [_sequence(c, r, x), w, rw, e.unsqueeze(e.concat([wb, rb], 0), [0]),
                                  _lengths(c, r, seq), h0, c0], n=3, hidden_size=H)
    return _layer_results(c, r, "LSTM", seq, y, {h_state: y_h, c_state: y_c}, h_state)


def gru_op(c, r, carries0):
    """lstm_op's results computed by one ONNX GRU node; None when the op is not exactly a GRU layer."""
    cell = _matched(_gru_cell, c, r)
    if cell is None:
        return None
    unit, h_state, parts, fcs, before_reset = cell
    outer = _layer_input(c, r, h_state)
    if outer is None:
        return None
    e = c.e
    x, wi, bi = outer
    H = _rows(c, wi) // 3
    if any(_shape(c, outer_value(c, fc.input[1])) != (H, H) for fc in fcs):
        return None
    # ONNX's z, r, h are GRUUnit's update and output parts and the reset part, at these blocks of input_t
    order = e.const(np.concatenate([np.arange(H) + parts[k] * H for k in (1, 0, 2)]).astype(np.int64))
    w = e.unsqueeze(e.node("Gather", [wi, order], axis=0), [0])
    wb = e.node("Gather", [e.reshape(bi, [-1]), order], axis=0)
    z, rs, h = (fcs[k] for k in (1, 0, 2))
    rw = e.unsqueeze(e.concat([outer_value(c, fc.input[1]) for fc in (z, rs, h)], 0), [0])
    rb = e.concat([e.reshape(outer_value(c, fc.input[2]), [-1]) for fc in (z, rs, h)], 0)
    seq = outer_value(c, unit.input[2]) if _args(unit)["sequence_lengths"] else None
    h0 = carries0[list(r.states).index(h_state)]
    y, y_h = e.node("GRU", [_sequence(c, r, x), w, rw, e.unsqueeze(e.concat([wb, rb], 0), [0]),
                            _lengths(c, r, seq), h0], n=2, hidden_size=H, linear_before_reset=int(before_reset))
    return _layer_results(c, r, "GRU", seq, y, {h_state: y_h}, h_state)


def _matched(match, c, r):
    """match(r) unless --rnn scan; None where an op's arguments do not read (the Scan's converters then say
    which, with the op's place)."""
    if c.conv.state.options.get("rnn", "auto") != "auto":
        return None
    try:
        return match(r)
    except ArgumentError:
        return None


def _layer_input(c, r, h_state):
    """The outer FC's ONNX inputs (X, W, b) when only the hidden state's rows are wanted, else None."""
    if rows_wanted(c, r) - {h_state}:
        return None
    return _folded_fc(c, r.inputs[0].external)


def _shape(c, v: str) -> tuple:
    """The shape of an ONNX value (a weight: a graph input or a constant)."""
    specs = c.conv.state.specs
    return tuple(specs[v].shape if v in specs else c.e.consts[v].shape)


def _rows(c, v: str) -> int:
    return _shape(c, v)[0]


def _sequence(c, r, x: str) -> str:
    """X as the (T, N, D) sequence an ONNX RNN node reads."""
    specs = c.conv.state.specs
    return x if (len(specs[x].shape) if x in specs else 3) == 3 else c.e.reshape(x, [r.T, r.N, -1])


def _lengths(c, r, seq) -> str:
    return c.e.reshape(seq, [r.N]) if seq is not None else ""


def _layer_results(c, r, kind: str, seq, y: str, finals: dict, h_state):
    """(results, rows) from an ONNX RNN node's Y and final states; past its length a row keeps its last state,
    which is Y_h."""
    e, T, N = c.e, r.T, r.N
    rows_all = e.squeeze(y, [1])
    if seq is not None:
        steps = e.const(np.arange(T, dtype=np.int32).reshape(T, 1))
        valid = e.unsqueeze(e.node("Less", [steps, e.reshape(seq, [1, N])]), [2])
        rows_all = e.node("Where", [valid, rows_all, finals[h_state]])
    results = [finals[s] for s in r.states] + ["", rows_all]
    c.conv.state.notes.append(f"{c.label}: exported as one ONNX {kind} node")
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
