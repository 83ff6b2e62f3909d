"""ONNX's LSTM, GRU and RNN nodes as Caffe2 RecurrentNetwork ops, built with rnn_cell / gru_cell as Caffe2's
backend built them: ONNX's packed weights and biases are sliced (and their gates reordered: ONNX's LSTM
i o f c -> Caffe2's i f o c, GRU z r h -> r z h) into the parameter blobs of a cell named by dummy_name(), the
input and recurrence biases kept apart. The outputs have ONNX's layout: Y [T, num_directions, N, H], Y_h and Y_c
[num_directions, N, H]. A reverse direction runs the cell over the input reversed in time (ReversePackedSegs).

What converts: directions forward, reverse and bidirectional; the default activations (RNN: Tanh or Relu);
missing B and initial states (zeros); linear_before_reset; sequence_lens, as Caffe2's backend took it: the cells
read the lengths (their states held past each sequence's end, so Y_h and Y_c are each sequence's last valid
step), a reverse direction reverses only each sequence's valid steps, and Y is zero past each end
(VariableLengthSequencePadding), as ONNX defines it. What does not (Unsupported): peepholes, clip, input_forget,
layout 1, other activations.
"""
from __future__ import annotations

from .. import core, gru_cell, rnn_cell
from ..model_helper import ModelHelper
from ._onnx_nodes import Caffe2Ops, OnnxNode, _text
from .error import Unsupported
from .helper import dummy_name

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}


def _check_attrs(n: OnnxNode) -> tuple[int, str, str, int]:
    attrs = dict(n.attrs)
    hidden = int(attrs.pop("hidden_size"))
    direction = _text(attrs.pop("direction", b"forward"))
    lbr = int(attrs.pop("linear_before_reset", 0))
    activations = [_text(a).lower() for a in attrs.pop("activations", [])]
    if attrs.pop("layout", 0):
        raise Unsupported(f"{n.op_type} with layout=1 (batch first): Caffe2's RecurrentNetwork is time first")
    if attrs.pop("input_forget", 0):
        raise Unsupported("LSTM with input_forget=1 has no Caffe2 counterpart")
    if attrs:
        raise Unsupported(f"unsupported {n.op_type} attributes: {sorted(attrs)}")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise Unsupported(f"{n.op_type} with direction {direction}")
    per_dir = activations[:len(activations) // (2 if direction == "bidirectional" else 1)] or None
    activation = "tanh"
    if n.op_type == "RNN":
        if per_dir and (per_dir[0] not in ("tanh", "relu") or len(set(activations)) > 1):
            raise Unsupported(f"RNN with activations {activations}: Caffe2's BasicRNN is Tanh or Relu")
        activation = per_dir[0] if per_dir else "tanh"
    elif per_dir and per_dir != DEFAULT_ACTIVATIONS[n.op_type]:
        raise Unsupported(f"{n.op_type} with activations {activations}: Caffe2's cells have the default ones")
    return hidden, direction, activation, lbr


def create_rnn(n: OnnxNode, opset_version: int, consts: dict, shapes: dict) -> Caffe2Ops:
    """The Caffe2Ops of an LSTM, GRU or RNN node (shapes: the known shapes of the graph's values)."""
    hidden, direction, activation, lbr = _check_attrs(n)
    gates = GATES[n.op_type]
    inputs = list(n.inputs) + [""] * (8 - len(n.inputs))
    x, w, r, b, seq_lens, initial_h, initial_c, peepholes = inputs[:8]
    if peepholes:
        raise Unsupported("LSTM with peepholes has no Caffe2 counterpart")
    input_size = _input_size(x, w, consts, shapes)
    init_net, pred = core.Net("init-net"), ModelHelper()
    dirs = [1] if direction == "reverse" else [0, 1] if direction == "bidirectional" else [0]
    if not b:
        b = dummy_name()
        init_net.ConstantFill([], b, shape=[len(dirs), 2 * gates * hidden], value=0.0)
    zeros = _zero_state(pred, x, hidden) if not initial_h or (n.op_type == "LSTM" and not initial_c) else None
    lengths = seq_lens or (_full_lengths(pred, x) if 1 in dirs else None)
    seq_lengths = seq_lens or None
    results = []
    for index, d in enumerate(dirs):
        name = dummy_name()
        _slice_params(init_net, n.op_type, name, w, r, b, index, gates, hidden)
        states = [_state(init_net, initial_h, zeros, name + "/initial_h", index)]
        if n.op_type == "LSTM":
            states.append(_state(init_net, initial_c, zeros, name + "/initial_c", index))
        seq = pred.net.ReversePackedSegs([x, lengths], name + "/input-reversed") if d else x
        kwargs = dict(drop_states=False, forward_only=True)
        if n.op_type == "LSTM":
            out = rnn_cell.LSTM(pred, seq, seq_lengths, states, input_size, hidden, name, **kwargs)
            h_all, h_last, c_last = out[0], out[1], out[3]
        elif n.op_type == "GRU":
            h_all, h_last = gru_cell.GRU(pred, seq, seq_lengths, states, input_size, hidden, name,
                                         linear_before_reset=bool(lbr), **kwargs)[:2]
            c_last = None
        else:
            h_all, h_last = rnn_cell.BasicRNN(pred, seq, seq_lengths, states, input_size, hidden, name,
                                              activation=activation, **kwargs)[:2]
            c_last = None
        if d:
            h_all = pred.net.ReversePackedSegs([h_all, lengths], name + "/output-reversed")
        if seq_lengths:
            h_all = pred.net.VariableLengthSequencePadding([h_all, seq_lengths], name + "/padded")
        results.append((pred.net.ExpandDims(h_all, name + "/y", dims=[1]), h_last, c_last))
    outputs = n.outputs + [""] * (3 - len(n.outputs))
    for k, out in enumerate(outputs[:3 if n.op_type == "LSTM" else 2]):
        if out:
            pred.net.Concat([res[k] for res in results], [out, dummy_name()], axis=1 if k == 0 else 0)
    net = pred.Proto()
    return Caffe2Ops(list(net.op), list(init_net.Proto().op), list(net.external_input))


def _input_size(x: str, w: str, consts: dict, shapes: dict) -> int:
    if w in consts:
        return int(consts[w].shape[2])
    for name in (w, x):
        shape = shapes.get(name)
        if shape is not None and len(shape) == 3 and shape[2]:
            return int(shape[2])
    raise RuntimeError("best-effort shape inference for RNN input failed")


def _slice_params(init_net, op_type: str, name: str, w: str, r: str, b: str, d: int, gates: int, hidden: int):
    """Direction d's weights and biases as the cell's parameter blobs."""
    def rows(src, dst, start, count, matrix):
        """src[d, start:start + count] (all columns of a matrix) as blob dst."""
        starts, ends = ([start, 0], [start + count, -1]) if matrix else ([start], [start + count])
        part = init_net.Slice(src, dst + "_3d", starts=[d, *starts], ends=[d + 1, *ends])
        return init_net.Squeeze(part, dst, dims=[0])

    g = hidden
    if op_type == "RNN":
        rows(w, f"{name}/i2h_w", 0, g, True)
        rows(r, f"{name}/gates_t_w", 0, g, True)
        rows(b, f"{name}/i2h_b", 0, g, False)
        rows(b, f"{name}/gates_t_b", g, g, False)
        return None
    if op_type == "LSTM":      # ONNX i o f c -> Caffe2 i f o c
        order = [0, 2, 1, 3]
        for src, dst, offset, matrix in ((w, "i2h_w", 0, True), (r, "gates_t_w", 0, True),
                                         (b, "i2h_b", 0, False), (b, "gates_t_b", 4 * g, False)):
            parts = [rows(src, f"{name}/{dst}_{k}", offset + k * g, g, matrix) for k in order]
            init_net.Concat(parts, [f"{name}/{dst}", dummy_name()], axis=0)
        return None
    # GRU: ONNX z r h -> Caffe2's projected input r z h, and one recurrent FC per gate
    for src, dst, offset, matrix in ((w, "i2h_w", 0, True), (b, "i2h_b", 0, False)):
        parts = [rows(src, f"{name}/{dst}_{k}", offset + k * g, g, matrix) for k in (1, 0, 2)]
        init_net.Concat(parts, [f"{name}/{dst}", dummy_name()], axis=0)
    for k, gate in enumerate(("update", "reset", "output")):
        rows(r, f"{name}/{gate}_gate_t_w", k * g, g, True)
        rows(b, f"{name}/{gate}_gate_t_b", 3 * g + k * g, g, False)
    return None


def _state(init_net, given: str, zeros, dst: str, d: int):
    if not given:
        return zeros
    return init_net.Slice(given, dst, starts=[d, 0, 0], ends=[d + 1, -1, -1])


def _zero_state(pred, x: str, hidden: int):
    """Zeros of shape [1, N, hidden], N the batch of x (made at run time)."""
    name = dummy_name()
    first = pred.net.Slice(x, name + "/x0", starts=[0, 0, 0], ends=[1, -1, 1])
    zero = pred.net.ConstantFill(first, name + "/zero", value=0.0)
    return pred.net.Tile(zero, name, tiles=hidden, axis=2)


def _full_lengths(pred, x: str):
    """Every sequence's length, T, for each of x's N sequences (int32, made at run time)."""
    name = dummy_name()
    column = pred.net.Slice(x, name + "/x_col", starts=[0, 0, 0], ends=[-1, -1, 1])
    ones = pred.net.ConstantFill(column, name + "/ones", value=1.0)
    total = pred.net.ReduceSum(ones, name + "/sum", axes=[0, 2], keepdims=0)
    return pred.net.Cast(total, name, to=core.DataType.INT32)
