"""Padding around ranges of rows and masking of sequences: AddPadding, RemovePadding, GatherPadding and
PadEmptySamples (caffe2/operators/sequence_ops.cc) and SequenceMask (boolean_mask_ops.cc).

AddPadding puts padding_width rows before and end_padding_width rows after each range of LENGTHS rows (the
whole of DATA when no LENGTHS), copies of the given padding rows or zeros; RemovePadding cuts them off again;
both can return the new lengths (int32; without LENGTHS, the one range's). GatherPadding sums the padding rows
of a padded tensor: the gradient of the padding inputs. PadEmptySamples gives every empty sample of a batch one
zero row in each feature, and those samples length 1. The makers emit Caffe2's: AddPadding ->
RemovePadding([dY(, lengths_out)]) -> dDATA and, with padding inputs, GatherPadding([dY(, lengths_out)]) ->
dSTART(, dEND); RemovePadding -> AddPadding([dY(, lengths_out)]) -> dDATA (a forward with LENGTHS must name its
lengths output, as Caffe2 requires). Caffe2 checks only that the lengths sum to at most the rows; here they must
add up exactly (more rows would be left uninitialised by Caffe2). GatherPadding with both widths 0 gives zeros of
the padding's shape.

SequenceMask fills masked elements of a float tensor with fill_val (-inf; 0 with grad=1) in one of the modes
'sequence' (column >= length of the row), 'window' (column outside center +- radius), 'upper' (column > row),
'lower' (column < row), 'upperdiag' (column >= row) and 'lowerdiag' (column <= row) -- the conditions as Caffe2's
functors compute them -- on the tensor viewed as rows x columns at `axis`, optionally per batch (`batch`) or
repeated over trailing dims (`repeat_from_axis`). Its gradient is SequenceMask(dY(, lengths)) with grad=1.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from ..core.spec import TensorSpec
from .base import canonical_axis, check_float, host_ints, known_ints, on_device, out_spec
from .packing import gather_rows, read_lengths
from .registry import REQUIRED, Arg, op

PAD_ARGS = {"padding_width": 1, "end_padding_width": -1}


def _widths(padding_width, end_padding_width, op_type):
    if padding_width < 0:
        raise ArgumentError(f"{op_type}: padding_width must be >= 0, got {padding_width}")
    return padding_width, (padding_width if end_padding_width < 0 else end_padding_width)


def _ranges(data, lengths, read, op_type):
    """The range lengths (the whole of DATA when none are given); None when unknown."""
    if len(data.shape) < 1:
        raise ShapeError(f"{op_type}: DATA must be at least 1-D")
    if lengths is None:
        return [data.shape[0]]
    lens = read_lengths(lengths, read, op_type)
    if lens is not None and sum(lens) != data.shape[0]:
        raise ShapeError(f"{op_type}: LENGTHS sum to {sum(lens)} but DATA {tuple(data.shape)} has {data.shape[0]} "
                         "rows; they must be equal")
    return lens


def _count(lengths):
    return 1 if lengths is None else lengths.shape[0]


# --------------------------------------------------------------------------------------------- AddPadding
def _add_checks(data, rest, read):
    lengths = rest[0] if rest else None
    lens = _ranges(data, lengths, read, "AddPadding")
    block = math.prod(data.shape[1:])
    for name, pad in zip(("start_padding", "end_padding"), rest[1:]):
        if pad.dtype is not None and data.dtype is not None and pad.dtype != data.dtype:
            raise DTypeError(f"AddPadding: {name} has dtype {pad.dtype} but DATA has {data.dtype}")
        if math.prod(pad.shape) != block:
            raise ShapeError(f"AddPadding: {name} {tuple(pad.shape)} must hold one row of DATA {tuple(data.shape)} "
                             f"({block} values)")
    return lens


def _add_shape(specs, *, padding_width, end_padding_width):
    data, *rest = specs
    start, end = _widths(padding_width, end_padding_width, "AddPadding")
    lens = _add_checks(data, rest, known_ints)
    rows = data.shape[0] + (start + end) * _count(rest[0] if rest else None)
    new = None if lens is None else [n + start + end for n in lens]
    count = _count(rest[0] if rest else None)
    return [out_spec((rows, *data.shape[1:]), data.dtype), out_spec((count,), np.int32, new)]


def _padding_gradient(inverse):
    def maker(g):
        inputs = [g.GO(0)]
        if g.n_inputs > 1:
            if g.n_outputs < 2:
                raise GradientError(f"{g.def_.type} with LENGTHS needs its lengths output (output 1) for "
                                    "its gradient, as in Caffe2; name a second output", at=g.label)
            inputs.append(g.O(1))
        g.op(inverse, inputs, [g.GI(0)])
        if inverse == "RemovePadding" and g.n_inputs >= 3:
            g.op("GatherPadding", inputs, [g.GI(2)] + ([g.GI(3)] if g.n_inputs == 4 else []))
    maker.__name__ = f"{inverse.lower()}_gradient"
    return maker


@op("AddPadding", inputs=(1, 4), outputs=(1, 2), inplace=(), args=PAD_ARGS, shape=_add_shape, grows="shapes",
    gradient=_padding_gradient("RemovePadding"))
def add_padding(xp, data, *rest, padding_width, end_padding_width):
    """DATA (N, ...), (LENGTHS, (START_PADDING, (END_PADDING))) -> DATA with padding_width rows of
    START_PADDING (zeros if absent) before and end_padding_width rows of END_PADDING (else START_PADDING) after
    each range; and int32 LENGTHS + both widths (without LENGTHS: [N + both widths], the one range's)."""
    start, end = _widths(padding_width, end_padding_width, "AddPadding")
    lens = _add_checks(data, rest, host_ints)
    n = data.shape[0]
    pads = [p.reshape(1, *data.shape[1:]) for p in rest[1:]]
    pads = pads + pads[-1:] if len(pads) == 1 else pads
    source = xp.concatenate([data, *pads]) if pads else data
    first, last = (n, n + 1) if pads else (n, n)                  # rows of the padding (or the zero row)
    rows, at = [], 0
    for length in lens:
        rows += [first] * start + list(range(at, at + length)) + [last] * end
        at += length
    out = gather_rows(xp, source, np.asarray(rows, dtype=np.int64))
    return out, on_device(xp, [v + start + end for v in lens], np.int32)    # (a one-output op keeps the first)


# --------------------------------------------------------------------------------------------- RemovePadding
def _remove_checks(data, rest, read, start, end, op_type):
    lens = _ranges(data, rest[0] if rest else None, read, op_type)
    short = [v for v in lens or () if v < start + end]
    if short:
        raise ShapeError(f"{op_type}: a range of {short[0]} rows is shorter than its padding ({start} + {end})")
    return lens


def _remove_shape(specs, *, padding_width, end_padding_width):
    data, *rest = specs
    start, end = _widths(padding_width, end_padding_width, "RemovePadding")
    lens = _remove_checks(data, rest, known_ints, start, end, "RemovePadding")
    rows = data.shape[0] - (start + end) * _count(rest[0] if rest else None)
    if rows < 0:
        raise ShapeError(f"RemovePadding: DATA {tuple(data.shape)} has fewer rows than the padding of its ranges")
    new = None if lens is None else [v - start - end for v in lens]
    count = _count(rest[0] if rest else None)
    return [out_spec((rows, *data.shape[1:]), data.dtype), out_spec((count,), np.int32, new)]


@op("RemovePadding", inputs=(1, 2), outputs=(1, 2), inplace=(), args=PAD_ARGS, shape=_remove_shape,
    gradient=_padding_gradient("AddPadding"))
def remove_padding(xp, data, *rest, padding_width, end_padding_width):
    """DATA, (LENGTHS) -> each range without its first padding_width and last end_padding_width rows; and
    int32 LENGTHS minus both widths (without LENGTHS: [N - both widths], the one range's)."""
    start, end = _widths(padding_width, end_padding_width, "RemovePadding")
    lens = _remove_checks(data, rest, host_ints, start, end, "RemovePadding")
    rows, at = [], 0
    for length in lens:
        rows += list(range(at + start, at + length - end))
        at += length
    out = gather_rows(xp, data, np.asarray(rows, dtype=np.int64))
    return out, on_device(xp, [v - start - end for v in lens], np.int32)    # (a one-output op keeps the first)


# --------------------------------------------------------------------------------------------- GatherPadding
def _gather_checks(data, lengths, read, start, end):
    if data.dtype is not None and data.dtype.kind == "b":
        raise DTypeError("GatherPadding cannot sum a bool tensor")
    return _remove_checks(data, [lengths], read, start, end, "GatherPadding")


def _gather_shape(specs, *, padding_width, end_padding_width):
    start, end = _widths(padding_width, end_padding_width, "GatherPadding")
    _gather_checks(*specs, known_ints, start, end)
    return [out_spec(specs[0].shape[1:], specs[0].dtype)] * 2


@op("GatherPadding", inputs=2, outputs=(1, 2), inplace=(), args=PAD_ARGS, shape=_gather_shape, context=True)
def gather_padding(ctx, xp, data, lengths, *, padding_width, end_padding_width):
    """DATA (padded), LENGTHS (padded lengths) -> the sum of every range's start-padding rows and the sum of
    its end-padding rows (as the second output; with one output both sums go into it)."""
    start, end = _widths(padding_width, end_padding_width, "GatherPadding")
    lens = _gather_checks(data, lengths, host_ints, start, end)
    heads, tails, at = [], [], 0
    for length in lens:
        heads += range(at, at + start)
        tails += range(at + length - end, at + length)
        at += length
    block = data.shape[1:]
    head = gather_rows(xp, data, np.asarray(heads, dtype=np.int64)).sum(axis=0).reshape(block)
    tail = gather_rows(xp, data, np.asarray(tails, dtype=np.int64)).sum(axis=0).reshape(block)
    if len(ctx.outputs) == 2:
        return head.astype(data.dtype), tail.astype(data.dtype)
    return ((head + tail).astype(data.dtype),)


# --------------------------------------------------------------------------------------------- SequenceMask
MASK_MODES = ("sequence", "window", "upper", "lower", "upperdiag", "lowerdiag")


def _mask_geometry(x, rest, mode, axis, batch, repeat_from_axis, read):
    """(batches, rows, columns, repeats, per-row values or None) of the masked view of X."""
    check_float("SequenceMask", input=x)
    if mode not in MASK_MODES:
        raise ArgumentError(f"SequenceMask: unsupported mode {mode!r}; use one of {', '.join(MASK_MODES)}")
    needs = mode in ("sequence", "window")
    if needs and not rest:
        raise ArgumentError(f"SequenceMask mode {mode!r} needs input 1 ("
                            f"{'sequence lengths' if mode == 'sequence' else 'window centers'})")
    dims = tuple(x.shape)
    ax = canonical_axis(axis, len(dims))
    cols, reps = math.prod(dims[ax:]), 1
    if batch is not None:
        b = canonical_axis(batch, len(dims), "batch")
        if b >= ax:
            raise ArgumentError(f"SequenceMask: batch ({batch}) must be an axis before axis ({axis})")
        batches, rows = math.prod(dims[:b + 1]), math.prod(dims[b + 1:ax])
    else:
        batches, rows = 1, math.prod(dims[:ax])
    if repeat_from_axis is not None:
        if mode != "sequence" or batch is not None:
            raise ArgumentError("SequenceMask: repeat_from_axis needs mode 'sequence' and no batch argument")
        r = canonical_axis(repeat_from_axis, len(dims), "repeat_from_axis")
        if r < ax:
            raise ArgumentError(f"SequenceMask: repeat_from_axis ({repeat_from_axis}) must not come before axis "
                                f"({axis})")
        cols, reps = math.prod(dims[ax:r]), math.prod(dims[r:])
    values = None
    if needs:
        what = "sequence_lengths" if mode == "sequence" else "window centers"
        values = read_lengths(rest[0], lambda t, w: read(t, w), "SequenceMask", what) if mode == "sequence" \
            else _centers(rest[0], read)
        count = rest[0].shape[0] if len(rest[0].shape) == 1 else 0
        if rows and count < rows:
            raise ShapeError(f"SequenceMask: {what} has {count} entries but the input {dims} has {rows} rows "
                             f"before axis {ax}; give one per row")
    return batches, rows, cols, reps, values


def _centers(t, read):
    if t.dtype is not None and t.dtype.kind not in "iu":
        raise DTypeError(f"SequenceMask: window centers must be int32, got {t.dtype}")
    if len(t.shape) != 1:
        raise ShapeError(f"SequenceMask: window centers must be a 1-D vector, got shape {tuple(t.shape)}")
    return read(t, "window centers")


MASK_ARGS = {"mode": Arg("str", REQUIRED), "axis": 1, "radius": 10, "grad": False,
             "fill_val": Arg("float", -math.inf), "batch": Arg("int", None), "repeat_from_axis": Arg("int", None)}


def _mask_shape(specs, *, mode, axis, radius, grad, fill_val, batch, repeat_from_axis):
    _mask_geometry(specs[0], specs[1:], mode, axis, batch, repeat_from_axis, known_ints)
    return [out_spec(specs[0].shape, specs[0].dtype)]


def _sequence_mask_gradient(g):
    """SequenceMask([dY(, lengths)]) with the forward's arguments and grad=1 (masked elements get 0)."""
    g.op("SequenceMask", [g.GO(0)] + ([g.I(1)] if g.n_inputs == 2 else []), [g.GI(0)], grad=True)


@op("SequenceMask", inputs=(1, 2), outputs=1, inplace=(), args=MASK_ARGS, shape=_mask_shape,
    gradient=_sequence_mask_gradient)
def sequence_mask(xp, x, *rest, mode, axis, radius, grad, fill_val, batch, repeat_from_axis):
    """X with the masked elements (row i, column j of the view at `axis`) set to fill_val, or to 0 with
    grad=1: 'sequence' j >= lengths[i], 'window' |j - centers[i]| > radius, 'upper' j > i, 'lower' j < i,
    'upperdiag' j >= i, 'lowerdiag' j <= i."""
    batches, rows, cols, reps, values = _mask_geometry(x, rest, mode, axis, batch, repeat_from_axis, host_ints)
    i = on_device(xp, np.arange(rows).reshape(-1, 1), np.int64)
    j = on_device(xp, np.arange(cols).reshape(1, -1), np.int64)
    if values is not None:
        per_row = on_device(xp, np.asarray(values[:rows], dtype=np.int64).reshape(-1, 1), np.int64)
    masked = {"sequence": lambda: j >= per_row, "window": lambda: (j > per_row + radius) | (j < per_row - radius),
              "upper": lambda: j > i, "lower": lambda: j < i, "upperdiag": lambda: j >= i,
              "lowerdiag": lambda: j <= i}[mode]()
    fill = x.dtype.type(0 if grad else fill_val)
    view = x.reshape(batches, rows, cols, reps)
    return xp.where(masked.reshape(1, rows, cols, 1), fill, view).reshape(x.shape)


# --------------------------------------------------------------------------------------------- PadEmptySamples
def _pad_empty_checks(lengths, features, read, n_out=None):
    lens = read_lengths(lengths, read, "PadEmptySamples", "lengths")
    if n_out is not None and n_out != 1 + len(features):
        raise ShapeError(f"PadEmptySamples: {n_out} outputs for {1 + len(features)} inputs; give one output per "
                         "input (the lengths, then each feature)")
    for k, f in enumerate(features, 1):
        if len(f.shape) < 1:
            raise ShapeError(f"PadEmptySamples: input {k} must be at least 1-D, got a 0-D tensor")
        if lens is not None and f.shape[0] != sum(lens):
            raise ShapeError(f"PadEmptySamples: input {k} {tuple(f.shape)} has {f.shape[0]} rows but lengths sum to "
                             f"{sum(lens)}; they must be equal")
    return lens


def _pad_empty_shape(specs):
    lens = _pad_empty_checks(specs[0], specs[1:], known_ints)
    empty = None if lens is None else sum(v == 0 for v in lens)
    return [out_spec(specs[0].shape, np.int32, None if lens is None else [max(v, 1) for v in lens])] + [
        out_spec((f.shape[0] + empty, *f.shape[1:]), f.dtype) if empty is not None else TensorSpec(None, f.dtype)
        for f in specs[1:]]


@op("PadEmptySamples", inputs=(1, None), outputs=(1, None), inplace=(), context="structure", shape=_pad_empty_shape,
    grows="values")
def pad_empty_samples(ctx, xp, lengths, *features):
    """lengths, FEATURE_1 .. (rows in runs of lengths[i]) -> int32 lengths with every 0 made 1, and each feature
    with one zero row put in at the place of each empty run (no gradient is registered, as in Caffe2)."""
    lens = _pad_empty_checks(lengths, features, host_ints, len(ctx.outputs))
    rows, at = [], 0
    for v in lens:
        rows += list(range(at, at + v)) if v else [-1]
        at += v
    outs = [on_device(xp, [max(v, 1) for v in lens], np.int32)]
    for f in features:
        picks = np.asarray(rows, dtype=np.int64)
        outs.append(gather_rows(xp, f, np.where(picks < 0, f.shape[0], picks)))
    return tuple(outs)
