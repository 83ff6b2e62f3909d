"""Packing variable-length sequences into padded tensors and back: PackSegments / UnpackSegments (batch major,
caffe2/operators/pack_segments.cc), PackRNNSequence / UnpackRNNSequence (time major,
pack_rnn_sequence_op.cc), ReversePackedSegs (reverse_packed_segs_op.cc) and VariableLengthSequencePadding
(variable_length_sequence_padding.cc: zeros past each sequence's end).

Lengths are read on the host, as Caffe2 does, so the packed sizes depend on their values. Every op here is one
gather with host-computed row indices (a padding row appended where the output pads). Each op's gradient is
its inverse applied to dY, as Caffe2's makers emit: PackSegments <-> UnpackSegments([LENGTHS, dY]) -> dDATA,
PackRNNSequence <-> UnpackRNNSequence([dY, LENGTHS]) -> dVALUES, ReversePackedSegs([dY, LENGTHS]) -> dDATA.
Caffe2 leaves the padding of an all-empty PackSegments uninitialised; here it is the padding value.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from .base import check_float, host_ints, known_ints, on_device, out_spec, single_gradient, value_dependent
from .index import require_int
from .registry import op


def read_lengths(lengths, read, op_type, what="LENGTHS"):
    """A non-negative integer vector's values (None when a spec's value is unknown)."""
    require_int(lengths, f"{op_type}: {what}")
    if len(lengths.shape) != 1:
        raise ShapeError(f"{op_type}: {what} must be a 1-D vector, got shape {tuple(lengths.shape)}")
    values = read(lengths, what)
    for i, v in enumerate(values or ()):
        if v < 0:
            raise ShapeError(f"{op_type}: {what}[{i}] = {v}; lengths must be non-negative")
    return values


def _lengths_per_sequence(data, lengths, read, op_type: str, data_name: str, lengths_name: str):
    """read_lengths of a time-major (T, batch, ...) DATA's lengths, one per sequence of its batch."""
    lens = read_lengths(lengths, read, op_type, lengths_name)
    if lengths.shape[0] != data.shape[1]:
        raise ShapeError(f"{op_type}: {lengths_name} has {lengths.shape[0]} entries but {data_name} "
                         f"{tuple(data.shape)} has a batch of {data.shape[1]}; they must match")
    return lens


def gather_rows(xp, data, rows, pad_value=None):
    """DATA's rows at host indices `rows` (an int array of any shape); an index equal to len(DATA) picks a
    row of pad_value (0 / False by default)."""
    rows = np.asarray(rows, dtype=np.int64)
    source = data
    if rows.size and rows.max() >= data.shape[0]:
        pad = xp.zeros((1, *data.shape[1:]), dtype=data.dtype)
        if pad_value is not None:
            pad = pad + data.dtype.type(pad_value)
        source = xp.concatenate([data, pad])
    out = xp.take(source, on_device(xp, rows.reshape(-1), np.int64), axis=0)
    return out.reshape(rows.shape + tuple(data.shape[1:]))


# --------------------------------------------------------------------------------------------- PackSegments
def _pack_checks(lengths, data, max_length, read):
    """(lengths or None, the packed length T or None)."""
    lens = read_lengths(lengths, read, "PackSegments")
    if len(data.shape) < 1:
        raise ShapeError("PackSegments: DATA must be at least 1-D")
    if lens is None:
        return None, (None if max_length == -1 else max_length)
    if sum(lens) != data.shape[0]:
        raise ShapeError(f"PackSegments: LENGTHS sum to {sum(lens)} but DATA {tuple(data.shape)} has "
                         f"{data.shape[0]} rows; they must be equal")
    return lens, (max(lens, default=0) if max_length == -1 else max_length)


def _pack_shape(specs, *, max_length, pad_minf, return_presence_mask):
    lengths, data = specs
    _, t = _pack_checks(lengths, data, max_length, known_ints)
    outs = [value_dependent((lengths.shape[0], t, *data.shape[1:]), data.dtype)]
    return outs + ([value_dependent((lengths.shape[0], t), np.bool_)] if return_presence_mask else [])


@op("PackSegments", inputs=2, outputs=(1, 2), inplace=(), shape=_pack_shape, grows="values",
    args={"max_length": -1, "pad_minf": False, "return_presence_mask": False},
    gradient=single_gradient("UnpackSegments", ["I0", "GO0"], ["GI1"]))
def pack_segments(xp, lengths, data, *, max_length, pad_minf, return_presence_mask):
    """LENGTHS (B), DATA (sum(LENGTHS), ...) -> (B, T, ...): segment b's rows, then padding (0, or -inf for
    float data with pad_minf). T is max(LENGTHS), or max_length (longer segments are cut). With
    return_presence_mask, also a (B, T) bool mask of the real rows."""
    lens, t = _pack_checks(lengths, data, max_length, host_ints)
    starts = np.cumsum([0, *lens])[:-1]
    pos = np.arange(t)
    present = pos[None, :] < np.asarray(lens, dtype=np.int64).reshape(-1, 1)
    rows = np.where(present, starts.reshape(-1, 1) + pos[None, :], data.shape[0])
    pad = -np.inf if pad_minf and data.dtype.kind == "f" else None
    packed = gather_rows(xp, data, rows, pad)
    return (packed, on_device(xp, present, np.bool_)) if return_presence_mask else packed


def _unpack_checks(lengths, data, max_length, read):
    """The number of rows out (None when unknown)."""
    lens = read_lengths(lengths, read, "UnpackSegments")
    if len(data.shape) < 2:
        raise ShapeError(f"UnpackSegments: DATA must be at least 2-D (B x T x ...), got shape {tuple(data.shape)}")
    if data.shape[0] != lengths.shape[0]:
        raise ShapeError(f"UnpackSegments: LENGTHS has {lengths.shape[0]} entries but DATA {tuple(data.shape)} has "
                         f"{data.shape[0]} segments; they must match")
    if max_length != -1 and max_length != data.shape[1]:
        raise ShapeError(f"UnpackSegments: max_length={max_length} but DATA {tuple(data.shape)} is packed to "
                         f"{data.shape[1]}; they must be equal")
    if lens is None:
        return None
    if max_length == -1 and max(lens, default=0) > data.shape[1]:
        raise ShapeError(f"UnpackSegments: a length of {max(lens)} exceeds DATA's packed length {data.shape[1]} "
                         f"(DATA {tuple(data.shape)}); give max_length to cut")
    return sum(min(v, data.shape[1]) for v in lens)


def _unpack_shape(specs, *, max_length, **_):
    lengths, data = specs
    rows = _unpack_checks(lengths, data, max_length, known_ints)
    return [value_dependent((rows, *data.shape[2:]), data.dtype)]


@op("UnpackSegments", inputs=2, outputs=1, inplace=(), shape=_unpack_shape,
    args={"max_length": -1, "pad_minf": False, "return_presence_mask": False},
    gradient=single_gradient("PackSegments", ["I0", "GO0"], ["GI1"]))
def unpack_segments(xp, lengths, data, *, max_length, pad_minf, return_presence_mask):
    """LENGTHS (B), DATA (B, T, ...) -> (sum(LENGTHS), ...): the first LENGTHS[b] rows of each segment
    (at most max_length when given). pad_minf and return_presence_mask arrive with the gradient maker's
    copied arguments and are not read."""
    _unpack_checks(lengths, data, max_length, host_ints)
    width = data.shape[1]
    rows = [b * width + r for b, n in enumerate(host_ints(lengths, "LENGTHS")) for r in range(min(n, width))]
    flat = data.reshape(data.shape[0] * width, *data.shape[2:])
    return gather_rows(xp, flat, np.asarray(rows, dtype=np.int64))


# --------------------------------------------------------------------------------------------- RNN packing
def _rnn_checks(values, lengths, forward: bool, read):
    """(lengths or None, rows of the output or None)."""
    op_type = "PackRNNSequence" if forward else "UnpackRNNSequence"
    need = 2 if forward else 3
    if len(values.shape) < need:
        raise ShapeError(f"{op_type}: VALUES must be at least {need}-D, got shape {tuple(values.shape)}")
    lens = read_lengths(lengths, read, op_type)
    if lens is None:
        return None, None
    longest = max(lens, default=0)
    if forward and sum(lens) != values.shape[0]:
        raise ShapeError(f"PackRNNSequence: LENGTHS sum to {sum(lens)} but VALUES {tuple(values.shape)} has "
                         f"{values.shape[0]} rows; they must be equal")
    if not forward and (values.shape[1] != len(lens) or values.shape[0] < longest):
        raise ShapeError(f"UnpackRNNSequence: VALUES {tuple(values.shape)} must be T x {len(lens)} x ... with T at "
                         f"least the longest length ({longest}) for {len(lens)} LENGTHS")
    return lens, (longest if forward else sum(lens))


def _rnn_shape(forward: bool):
    def shape(specs):
        values, lengths = specs
        _, rows = _rnn_checks(values, lengths, forward, known_ints)
        if forward:
            return [value_dependent((rows, lengths.shape[0], *values.shape[1:]), values.dtype)]
        return [value_dependent((rows, *values.shape[2:]), values.dtype)]
    return shape


@op("PackRNNSequence", inputs=2, outputs=1, inplace=(), shape=_rnn_shape(True), grows="values",
    gradient=single_gradient("UnpackRNNSequence", ["GO0", "I1"]))
def pack_rnn_sequence(xp, values, lengths):
    """VALUES (sum(LENGTHS), ...), LENGTHS (N) -> (T, N, ...), T = max(LENGTHS): column c holds sequence c's
    rows in time order, zeros after its end."""
    lens, longest = _rnn_checks(values, lengths, True, host_ints)
    starts = np.cumsum([0, *lens])[:-1]
    r = np.arange(longest).reshape(-1, 1)
    rows = np.where(r < np.asarray(lens, dtype=np.int64).reshape(1, -1), starts.reshape(1, -1) + r,
                    values.shape[0])
    return gather_rows(xp, values, rows)


@op("UnpackRNNSequence", inputs=2, outputs=1, inplace=(), shape=_rnn_shape(False),
    gradient=single_gradient("PackRNNSequence", ["GO0", "I1"]))
def unpack_rnn_sequence(xp, values, lengths):
    """VALUES (T, N, ...), LENGTHS (N) -> (sum(LENGTHS), ...): sequence c's first LENGTHS[c] time steps, the
    sequences one after another."""
    lens, _ = _rnn_checks(values, lengths, False, host_ints)
    n = values.shape[1]
    rows = [r * n + c for c, length in enumerate(lens) for r in range(length)]
    flat = values.reshape(values.shape[0] * n, *values.shape[2:])
    return gather_rows(xp, flat, np.asarray(rows, dtype=np.int64))


# --------------------------------------------------------------------------------------------- reversing
def _reverse_checks(data, lengths, read):
    if len(data.shape) != 3:
        raise ShapeError(f"ReversePackedSegs: DATA must be a 3-D (T, batch, D) tensor, got shape {tuple(data.shape)}")
    lens = _lengths_per_sequence(data, lengths, read, "ReversePackedSegs", "DATA", "LENGTHS")
    too_long = [v for v in lens or () if v > data.shape[0]]
    if too_long:
        raise ShapeError(f"ReversePackedSegs: a length of {too_long[0]} exceeds DATA's {data.shape[0]} time steps")
    return lens


def _reverse_shape(specs):
    _reverse_checks(*specs, known_ints)
    return [out_spec(specs[0].shape, specs[0].dtype)]


@op("ReversePackedSegs", inputs=2, outputs=1, inplace=(), shape=_reverse_shape,
    gradient=single_gradient("ReversePackedSegs", ["GO0", "I1"]))
def reverse_packed_segs(xp, data, lengths):
    """DATA (T, batch, D), LENGTHS (batch) -> the first LENGTHS[b] steps of each sequence b reversed in time,
    the steps after them (padding) unchanged."""
    lens = _reverse_checks(data, lengths, host_ints)
    t_len, batch = data.shape[0], data.shape[1]
    t = np.arange(t_len).reshape(-1, 1)
    n = np.asarray(lens, dtype=np.int64).reshape(1, -1)
    src_t = np.where(t < n, n - 1 - t, t)
    rows = src_t * batch + np.arange(batch).reshape(1, -1)
    flat = data.reshape(t_len * batch, *data.shape[2:])
    return gather_rows(xp, flat, rows) if math.prod(data.shape) else data.copy()


# --------------------------------------------------------------------------------------------- padding
def _padding_checks(data, lengths, read):
    if len(data.shape) < 2:
        raise ShapeError(f"VariableLengthSequencePadding: INPUT must be (T, batch, ...), got shape "
                         f"{tuple(data.shape)}")
    check_float("VariableLengthSequencePadding", INPUT=data)
    return _lengths_per_sequence(data, lengths, read, "VariableLengthSequencePadding", "INPUT", "SEQ_LENGTHS")


def _padding_shape(specs):
    _padding_checks(*specs, known_ints)
    return [out_spec(specs[0].shape, specs[0].dtype)]


@op("VariableLengthSequencePadding", inputs=2, outputs=1, inplace=[(0, 0)], shape=_padding_shape,
    shapes_from_inputs=True)
def variable_length_sequence_padding(xp, data, lengths):
    """INPUT (T, batch, ...), SEQ_LENGTHS (batch) -> INPUT with every step t >= SEQ_LENGTHS[b] of sequence b
    set to 0, what pytorch's pad_packed_sequence leaves there (Caffe2's ONNX backend pads an RNN's output with
    it); a length past T pads nothing. Caffe2 registers it for float and runs it in place (its kernel writes the
    output without copying the input first); out of place here it gives the same values. No gradient (Caffe2
    registers none)."""
    lens = _padding_checks(data, lengths, host_ints)
    kept = np.arange(data.shape[0]).reshape(-1, 1) < np.asarray(lens, dtype=np.int64).reshape(1, -1)
    mask = on_device(xp, kept.reshape(kept.shape + (1,) * (len(data.shape) - 2)), bool)
    return xp.where(mask, data, xp.zeros((), data.dtype))
