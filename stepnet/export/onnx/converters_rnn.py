"""RecurrentNetwork as an ONNX Scan, and the cell ops LSTMUnit / GRUUnit.

stepnet runs a step net once per timestep over views of (T + L) x N x D state tensors (passes/step_nets.py,
ops/recurrent.py). In the Scan each recurrent state is carried as its last L rows (L = the initial value's
rows); a link reading state rows [t + o, t + o + w) is a slice of that carry, the link the step writes (rows
[t + L, t + L + 1)) becomes the next carry and, stacked, the rows after the initial ones; links into other
tensors (the input sequence) become scan inputs; the timestep blob is a carried int32 counter. seq_lengths
masking is done by the cell converters exactly as the kernels do it, so a state past a row's length is carried
unchanged to `_last`. Aliases are then slices of initial rows + scanned rows (or of the final carry).
"""
from __future__ import annotations

import numpy as np

from ...core.errors import ArgumentError
from ...graph.view import Graph, nested_nets
from ...ops.recurrent import _links
from ...io.proto import argument_value
from ...core.spec import TensorSpec
from .convert import NetConverter, needs
from .emit import value_info
from .rnn_nodes import gru_op, lstm_op, outer_value, rows_wanted
from .table import converts


# --------------------------------------------------------------------------------------------- cells
def _valid_rows(c, t: str, lens: str, n: int) -> str:
    """1 x N x 1 bool: the batch rows with t < seq_lengths[row] (the kernels' validity rule)."""
    return c.e.reshape(c.e.node("Less", [t, c.e.reshape(lens, [-1])]), [1, n, 1])


def _masked(c, value: str, prev: str, valid: str | None, drop: bool, out: int) -> None:
    if valid is None:
        c.set(out, value)
        return
    other = c.e.const(np.zeros(1, c.dtype(0))) if drop else prev
    c.emit("Where", [valid, value, other], out=out)


@converts("LSTMUnit")
def lstm_unit(c):
    """i, f, o = σ(gates i, f + forget_bias, o), g = tanh(gates g); c = f·c_prev + i·g; h = o·tanh(c)."""
    a = c.args
    seq = bool(a["sequence_lengths"])
    h_prev, c_prev = c.x(0), c.x(1)
    _, n, d = c.shape(1)
    i, f, o, g = c.e.split(c.x(2), [d] * 4, 2)
    if a["forget_bias"]:
        f = c.e.node("Add", [f, c.e.scalar(a["forget_bias"], c.dtype(2))])
    i, f, o = (c.e.node("Sigmoid", [v]) for v in (i, f, o))
    cell = c.e.node("Add", [c.e.node("Mul", [f, c_prev]), c.e.node("Mul", [i, c.e.node("Tanh", [g])])])
    h = c.e.node("Mul", [o, c.e.node("Tanh", [cell])])
    valid = _valid_rows(c, c.x(4), c.x(3), n) if seq else None
    _masked(c, h, h_prev, valid, a["drop_states"], 0)
    _masked(c, cell, c_prev, valid, a["drop_states"], 1)


@converts("GRUUnit")
def gru_unit(c):
    """u = σ(gates update), o = tanh(gates output); h = o + u·(h_prev − o) (the reset gate is not read)."""
    a = c.args
    seq = bool(a["sequence_lengths"])
    h_prev = c.x(0)
    _, n, d = c.shape(0)
    _, u, o = c.e.split(c.x(1), [d] * 3, 2)
    u, o = c.e.node("Sigmoid", [u]), c.e.node("Tanh", [o])
    h = c.e.node("Add", [o, c.e.node("Mul", [u, c.e.node("Sub", [h_prev, o])])])
    valid = _valid_rows(c, c.x(3), c.x(2), n) if seq else None
    _masked(c, h, h_prev, valid, a["drop_states"], 0)


# --------------------------------------------------------------------------------------------- Scan
def _arg(opdef, name, default):
    for a in opdef.arg:
        if a.name == name:
            v = argument_value(a)
            try:
                return [x.decode() if isinstance(x, bytes) else x for x in v] if isinstance(v, list) else v
            except UnicodeDecodeError as e:
                raise ArgumentError(f"{opdef.type}: argument {name!r} holds bytes that are not UTF-8 text "
                                    f"({e.reason} at byte {e.start}); blob names must be UTF-8") from None
    return default


def _step_net(opdef):
    return next((n for name, n in nested_nets(opdef) if name == "step_net"), None)


def rnn_reads(opdef) -> list[str]:
    """What the step net reads from the outer net beyond the op's inputs (it sees the whole workspace)."""
    step = _step_net(opdef)
    if step is None:
        return []
    links, timestep = _arg(opdef, "link_internal", []), _arg(opdef, "timestep", "timestep")
    if not (isinstance(links, list) and all(isinstance(x, str) for x in links)):
        raise ArgumentError(f"argument 'link_internal' must be a list of blob names, got {links!r}")
    if not isinstance(timestep, str):
        raise ArgumentError(f"argument 'timestep' must be a blob name, got {timestep!r}")
    inner = set(links) | {timestep}
    return [n for n in Graph(step.op).read_before_written() if n not in inner and n not in opdef.input]


class _Recurrence:
    """The op's states, links and aliases, classified for the Scan (refusing what a Scan cannot carry)."""

    def __init__(self, c):
        a = c.args
        self.c, self.step = c, a["step_net"]
        self.graph = Graph(self.step.op, self.step.external_input)
        self.timestep = a["timestep"]
        x = c.shape(0)
        self.T, self.N = x[0], x[1]
        self.states = {}          # state -> (init input index, L, D, dtype)
        for s, r in zip(a["recurrent_states"], a["initial_recurrent_state_ids"]):
            shape = c.shape(r)
            if len(shape) not in (1, 2, 3):
                raise c.refuse(f"initial value of recurrent state {s!r} has rank {len(shape)}")
            self.states[s] = (r, shape[0] if len(shape) == 3 else 1, shape[-1], c.dtype(r))
        links = _links(a["link_internal"], a["link_external"], a["link_offset"], a["link_window"], "link")
        self.reads, self.writes, self.inputs = [], {}, []
        for link in links:
            written = self.graph.final.get(link.internal, 0) > 0
            if link.external not in self.states:
                if written:
                    raise c.refuse(f"the step net writes {link.internal!r}, a view of the input {link.external!r}")
                self.inputs.append(link)
                continue
            _, L, _, _ = self.states[link.external]
            if written:
                if link.window != 1 or link.offset != L or link.external in self.writes:
                    raise c.refuse(f"recurrent state {link.external!r} is written through {link.internal!r} at "
                                   f"offset {link.offset} (window {link.window}); a Scan carries one row per step "
                                   f"written at offset {L}")
                if (link.internal, 0) in self.graph.consumers:
                    raise c.refuse(f"the step net reads {link.internal!r} before writing it")
                self.writes[link.external] = link
            elif link.offset + link.window > L:
                raise c.refuse(f"link {link.internal!r} reads rows {link.offset}..{link.offset + link.window - 1} "
                               f"ahead of the {L} carried row(s) of {link.external!r}")
            else:
                self.reads.append(link)
        missing = [s for s in self.states if s not in self.writes]
        if missing:
            raise c.refuse(f"the step net never writes recurrent state {missing[0]!r}")
        inner = {lk.internal for lk in links} | {self.timestep}
        for name, v in self.graph.final.items():
            if v and name not in inner and (name, 0) in self.graph.consumers:
                raise c.refuse(f"the step net reads {name!r} before writing it (a value kept across steps)")


@converts("RecurrentNetwork", reads=rnn_reads)
def recurrent_network(c):
    from onnx import helper

    r = _Recurrence(c)
    e, specs, T, N = c.e, c.conv.state.specs, r.T, r.N
    body = e.sub()
    body_in, body_vals = [], {}

    def body_input(hint, shape, dtype):
        name = e.names.fresh(f"{c.op.output[0]}/{hint}")
        specs[name] = TensorSpec(tuple(shape), np.dtype(dtype))
        body_in.append(value_info(name, dtype, shape))
        return name

    carries0 = _initial_carries(c, r)
    fast = lstm_op(c, r, carries0) or gru_op(c, r, carries0)
    if fast is not None:
        _aliases(c, r, carries0, *fast)
        return
    carry = {s: body_input("carry", (L, N, D), dt) for s, (_, L, D, dt) in r.states.items()}
    t_in = body_input("t", (1,), np.int32)
    scan_ins = []
    for link in r.inputs:
        ext = outer_value(c, link.external)
        ext_spec = specs.get(ext) or TensorSpec.of(e.consts[ext])
        shape, dt = tuple(ext_spec.shape), ext_spec.dtype
        if shape[0] < link.offset + link.window - 1 + T:
            raise c.refuse(f"link {link.internal!r} reads rows past the end of {link.external!r} {tuple(shape)}")
        parts = [ext if link.offset + k == 0 and shape[0] == T else
                 e.slice(ext, [link.offset + k], [link.offset + k + T], [0]) for k in range(link.window)]
        if link.window == 1:
            scan_ins.append(parts[0])
            elem = body_input("in", shape[1:], dt)
            body_vals[(link.internal, 0)] = body.unsqueeze(elem, [0])
        else:
            scan_ins.append(e.concat([e.unsqueeze(p, [1]) for p in parts], 1))
            body_vals[(link.internal, 0)] = body_input("in", (link.window,) + tuple(shape[1:]), dt)
        specs[body_vals[(link.internal, 0)]] = TensorSpec((link.window,) + tuple(shape[1:]), np.dtype(dt))
    if not scan_ins:   # a step net reading no sequence still runs T times
        scan_ins.append(e.const(np.zeros((T, 1), np.float32)))
        body_input("steps", (1,), np.float32)
    for link in r.reads:
        _, L, D, dt = r.states[link.external]
        whole = link.offset == 0 and link.window == L
        v = carry[link.external] if whole else body.slice(carry[link.external], [link.offset],
                                                          [link.offset + link.window], [0])
        body_vals[(link.internal, 0)] = v
        specs[v] = TensorSpec((link.window, N, D), np.dtype(dt))
    body_vals[(r.timestep, 0)] = t_in
    targets = [(lk.internal, r.graph.final[lk.internal]) for lk in r.writes.values()]
    needed, wanted = needs(r.graph, targets)
    inner = NetConverter(c.conv.state, body, f"{c.label}, step net {r.step.name!r}", r.graph, body_vals, wanted,
                         outer=lambda name: outer_value(c, name))
    inner.run(sorted(needed))
    outs, kept = [], set()
    wants_rows = rows_wanted(c, r)

    def body_output(v, shape, dtype):
        if v in kept or v not in {o for node in body.nodes for o in node.output}:
            v = body.identity(v)   # an output must be made by the body, and only once
        kept.add(v)
        outs.append(value_info(v, dtype, shape))

    rows = {}
    for s, (_, L, D, dt) in r.states.items():
        new = inner.values[targets[list(r.writes).index(s)]]
        nxt = new if L == 1 else body.concat([body.slice(carry[s], [1], [L], [0]), new], 0)
        body_output(nxt, (L, N, D), dt)
    body_output(body.node("Add", [t_in, body.const(np.ones(1, np.int32))]), (1,), np.int32)
    for s, (_, _, D, dt) in r.states.items():
        if s in wants_rows:
            rows[s] = len(outs)
            body_output(body.squeeze(inner.values[targets[list(r.writes).index(s)]], [0]), (N, D), dt)
    graph = helper.make_graph(body.nodes, f"{c.op.output[0]}/step", body_in, outs)
    n_out = len(outs)
    results = e.node("Scan", carries0 + [e.const(np.zeros(1, np.int32))] + scan_ins, n=n_out, body=graph,
                     num_scan_inputs=len(scan_ins))
    _aliases(c, r, carries0, results, rows)


def _initial_carries(c, r) -> list[str]:
    """Each state's initial rows as L x N x D (a 1-D initial value broadcast over the batch, 2-D given a row)."""
    out = []
    for j, _, D, _ in r.states.values():
        x, rank = c.x(j), len(c.shape(j))
        init = c.e.reshape(x, [1, r.N, D]) if rank == 2 else x
        if rank == 1:
            init = c.e.node("Expand", [c.e.reshape(x, [1, 1, D]), c.e.ints([1, r.N, D])])
        out.append(init)
    return out


def _aliases(c, r, carries0, results, rows) -> None:
    a, T, N, e = c.args, r.T, r.N, c.e
    if isinstance(results, str):
        results = [results]
    for src, dst, offset in zip(a["alias_src"], a["alias_dst"], a["alias_offset"]):
        j = list(c.op.output).index(dst)
        if not c.wants(j):
            continue
        s_index = list(r.states).index(src)
        _, L, D, dt = r.states[src]
        start = offset if offset >= 0 else T + L + offset
        if not 0 <= start <= T + L:
            raise c.refuse(f"alias {dst!r}: offset {offset} is outside recurrent state {src!r} with {T + L} rows")
        final = results[s_index]
        if start >= T:
            v = final if start == T else e.slice(final, [start - T], [L], [0])
        elif start == L:
            v = results[rows[src]]
        else:
            v = e.slice(e.concat([carries0[s_index], results[rows[src]]], 0), [start], [T + L], [0])
        c.set(j, v, TensorSpec((T + L - start, N, D), np.dtype(dt)))
    if c.wants(len(c.op.output) - 1):
        raise c.refuse("its step_workspaces output is not a tensor and has no ONNX form")
