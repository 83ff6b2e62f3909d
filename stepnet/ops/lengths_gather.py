"""Gathers over lengths and ranges: LengthsGather (utility_ops.h), LengthsTopK with LengthsTopKGradient
(lengths_top_k_op.cc), GatherRangesToDense (gather_ranges_to_dense_op.h) and RemoveDataBlocks
(remove_data_blocks_op.h), with Caffe2's semantics.

Lengths, indices and ranges are read on the host, as Caffe2 does, so output sizes that follow from their values
are unknown statically unless the values are known. LengthsTopK's gradient is LengthsTopKGradient([LENGTHS,
TopKIndices, dTopKValues]) -> dDATA (each kept value's gradient at its position, 0 elsewhere);
GatherRangesToDense has none (NO_GRADIENT); LengthsGather and RemoveDataBlocks refuse one
(SHOULD_NOT_DO_GRADIENT).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import check_float, host_ints, known_ints, on_device, out_spec, single_gradient, value_dependent
from .index import NOT_IN_PLACE, check_vector, read_lengths, require_int
from .registry import NO_GRADIENT, REQUIRED, SHOULD_NOT_DO_GRADIENT, Arg, op
from .segments import segment_layout


# --------------------------------------------------------------------------------------------- LengthsGather
def _lengths_gather_checks(items, lengths, indices, read):
    """The checks; (lengths, indices) as host ints (None when unknown)."""
    if len(items.shape) < 1:
        raise ShapeError("LengthsGather: ITEMS must be at least 1-D, got a 0-D tensor")
    lens = read_lengths(lengths, "LENGTHS", read)
    check_vector(indices, "INDICES")
    require_int(indices, "INDICES")
    picks = read(indices, "INDICES")
    if lens is not None and sum(lens) != items.shape[0]:
        raise ShapeError(f"LengthsGather: LENGTHS sum to {sum(lens)} but ITEMS {tuple(items.shape)} has "
                         f"{items.shape[0]} rows; they must be equal")
    for k, i in enumerate(picks or ()):
        if not 0 <= i < lengths.shape[0]:
            raise ShapeError(f"LengthsGather: INDICES[{k}] = {i} is out of range 0..{lengths.shape[0] - 1} (one "
                             "index per LENGTHS entry)")
    return lens, picks


def _lengths_gather_shape(specs):
    items = specs[0]
    lens, picks = _lengths_gather_checks(*specs, known_ints)
    rows = None if lens is None or picks is None else sum(lens[i] for i in picks)
    return [value_dependent((rows, *items.shape[1:]), items.dtype)]


@op("LengthsGather", inputs=3, outputs=1, inplace=NOT_IN_PLACE, shape=_lengths_gather_shape, grows="values",
    gradient=SHOULD_NOT_DO_GRADIENT)
def lengths_gather(xp, items, lengths, indices):
    """ITEMS (rows in runs of LENGTHS[i]), LENGTHS, INDICES -> the runs INDICES name, concatenated in that
    order."""
    lens, picks = _lengths_gather_checks(items, lengths, indices, host_ints)
    starts = np.cumsum([0, *lens])
    rows = [np.arange(starts[i], starts[i] + lens[i]) for i in picks]
    at = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return xp.take(items, on_device(xp, at, np.int64), axis=0)


# --------------------------------------------------------------------------------------------- LengthsTopK
def _k(k: int) -> int:
    if k < 1:
        raise ArgumentError(f"k = {k}: LengthsTopK needs k >= 1")
    return k


def _top_k_checks(data, lengths, read):
    check_float("LengthsTopK", DATA=data)
    check_vector(data, "DATA")
    lens = read_lengths(lengths, "LENGTHS", read)
    if lens is not None and sum(lens) != data.shape[0]:
        raise ShapeError(f"LengthsTopK: LENGTHS sum to {sum(lens)} but DATA has {data.shape[0]} values; they must "
                         "be equal")
    return lens


def _top_k_shape(specs, *, k):
    data, lengths = specs
    _top_k_checks(data, lengths, known_ints)
    n = lengths.shape[0]
    return [out_spec((n, _k(k)), data.dtype), out_spec((n, _k(k)), np.int32)]


@op("LengthsTopK", inputs=2, outputs=2, inplace=NOT_IN_PLACE, args={"k": -1}, shape=_top_k_shape,
    grows="shapes", gradient=single_gradient("LengthsTopKGradient", ["I1", "O1", "GO0"]))
def lengths_top_k(xp, data, lengths, *, k):
    """DATA (a vector in runs of LENGTHS[i]), LENGTHS -> the k largest values of every run, largest first (ties
    by position), and int32 their positions within the run; a run shorter than k pads with 0 and -1."""
    k = _k(k)
    lens = _top_k_checks(data, lengths, host_ints)
    pos, mask = segment_layout(xp, lens)                                  # (N, L)
    n, width = pos.shape
    values = xp.where(mask, xp.take(data, pos), data.dtype.type(0)) if width else xp.zeros((n, 0), data.dtype)
    key = xp.where(mask, -values.astype(np.float64), np.inf)             # padding after every real value
    order = xp.argsort(key, axis=1, kind="stable")[:, :k]
    kept = min(k, width)
    top = xp.zeros((n, k), dtype=data.dtype)
    where = xp.full((n, k), -1, dtype=np.int32)
    top[:, :kept] = xp.take_along_axis(values, order, axis=1)
    real = xp.take_along_axis(mask, order, axis=1)
    where[:, :kept] = xp.where(real, order, -1).astype(np.int32)
    top[:, :kept] = xp.where(real, top[:, :kept], data.dtype.type(0))
    return top, where


def _top_k_grad_checks(lengths, indices, dvalues, k, read):
    lens = read_lengths(lengths, "LENGTHS", read)
    check_float("LengthsTopKGradient", dTopKValues=dvalues)
    require_int(indices, "LengthsTopKGradient: TopKIndices")
    n = lengths.shape[0]
    for what, t in (("TopKIndices", indices), ("dTopKValues", dvalues)):
        if math.prod(t.shape) != n * k:
            raise ShapeError(f"LengthsTopKGradient: {what} {tuple(t.shape)} must hold {n} x k={k} values (one row "
                             "per LENGTHS entry)")
    return lens


def _top_k_grad_shape(specs, *, k):
    lens = _top_k_grad_checks(*specs, _k(k), known_ints)
    return [value_dependent((None if lens is None else sum(lens),), specs[2].dtype)]


@op("LengthsTopKGradient", inputs=3, outputs=1, inplace=NOT_IN_PLACE, args={"k": -1}, shape=_top_k_grad_shape,
    grows="values")
def lengths_top_k_gradient(xp, lengths, indices, dvalues, *, k):
    """LENGTHS, TopKIndices, dTopKValues -> dDATA: each kept value's gradient at its position, 0 elsewhere."""
    k = _k(k)
    lens = _top_k_grad_checks(lengths, indices, dvalues, k, host_ints)
    n = len(lens)
    picks = np.asarray(host_ints(indices, "TopKIndices"), dtype=np.int64).reshape(n, k)
    lens_col = np.asarray(lens, dtype=np.int64).reshape(n, 1)
    used = np.arange(k)[None, :] < np.minimum(lens_col, k)               # (Caffe2's j < min(length, k))
    if ((picks < 0) | (picks >= lens_col))[used].any():
        row, col = np.argwhere(used & ((picks < 0) | (picks >= lens_col)))[0]
        raise ShapeError(f"LengthsTopKGradient: TopKIndices[{row}, {col}] = {picks[row, col]} is not a position of "
                         f"run {row} (length {lens[row]})")
    at = (np.cumsum([0, *lens])[:-1].reshape(n, 1) + picks)[used]
    out = xp.zeros(sum(lens), dtype=dvalues.dtype)
    out[on_device(xp, at, np.int64)] = xp.reshape(dvalues, (n, k))[on_device(xp, used, bool)]
    return out


# --------------------------------------------------------------------------------------------- ranges to dense
def _dense_checks(data, ranges, key, lengths, n_outputs):
    if not lengths or any(v <= 0 for v in lengths):
        raise ArgumentError(f"GatherRangesToDense: lengths {list(lengths)} must be a non-empty list of positive "
                            "sizes (one per output)")
    check_vector(data, "DATA")
    require_int(ranges, "GatherRangesToDense: RANGES")
    if len(ranges.shape) != 3 or ranges.shape[2] != 2:
        raise ShapeError(f"GatherRangesToDense: RANGES must be (N, M, 2) (start, length) pairs, got shape "
                         f"{tuple(ranges.shape)}")
    if not ranges.shape[1] == len(lengths) == n_outputs:
        raise ShapeError(f"GatherRangesToDense: RANGES has {ranges.shape[1]} ranges per example, with "
                         f"{len(lengths)} lengths and {n_outputs} outputs; the three must be equal")
    if key is not None:
        check_vector(key, "KEY")
        if key.dtype is not None and key.dtype != np.int64:
            raise DTypeError(f"GatherRangesToDense: KEY must be int64, got {key.dtype}")
        if key.shape[0] < data.shape[0]:
            raise ShapeError(f"GatherRangesToDense: KEY has {key.shape[0]} entries but DATA has {data.shape[0]}; "
                             "give one key per value")


DENSE_ARGS = {"lengths": Arg("ints", REQUIRED)}


def _dense_shape(specs, *, lengths):
    data, ranges, *key = specs
    _dense_checks(data, ranges, key[0] if key else None, lengths, len(lengths))
    return [out_spec((ranges.shape[0], n), data.dtype) for n in lengths]


@op("GatherRangesToDense", inputs=(2, 3), outputs=(1, None), inplace=NOT_IN_PLACE, args=DENSE_ARGS,
    context="structure",
    shape=_dense_shape, grows="shapes", gradient=NO_GRADIENT)
def gather_ranges_to_dense(ctx, xp, data, ranges, *key, lengths):
    """DATA, RANGES (N, M, 2), (KEY) -> output j (N, lengths[j]): row i is DATA[start:start + length] of range
    (i, j), sorted by KEY when given (stable), or zeros for an empty range; a non-empty range must have length
    lengths[j]."""
    _dense_checks(data, ranges, key[0] if key else None, lengths, len(ctx.outputs))
    pairs = np.asarray(host_ints(ranges, "RANGES"), dtype=np.int64).reshape(ranges.shape)
    keys = np.asarray(host_ints(key[0], "KEY")) if key else None
    outs = []
    for j, width in enumerate(lengths):
        rows = np.full((pairs.shape[0], width), data.shape[0], dtype=np.int64)   # data.shape[0]: the zero row
        for i, (start, length) in enumerate(pairs[:, j].tolist()):
            if length == 0:
                continue
            if length != width or start < 0 or start + length > data.shape[0]:
                raise ShapeError(f"GatherRangesToDense: range ({i}, {j}) = (start {start}, length {length}) must "
                                 f"have length {width} (lengths[{j}]) and fit in DATA of size {data.shape[0]}")
            at = np.arange(start, start + length)
            rows[i] = at if keys is None else at[np.argsort(keys[at], kind="stable")]
        source = xp.concatenate([data, xp.zeros(1, dtype=data.dtype)])
        outs.append(xp.take(source, on_device(xp, rows, np.int64)))
    return tuple(outs)


# --------------------------------------------------------------------------------------------- RemoveDataBlocks
def _remove_checks(data, indices, read):
    if len(data.shape) < 1:
        raise ShapeError("RemoveDataBlocks: DATA must be at least 1-D, got a 0-D tensor")
    check_vector(indices, "INDICES")
    if indices.shape[0] == 0:                       # (Caffe2 copies DATA before looking at the indices' type)
        return []
    require_int(indices, "RemoveDataBlocks: INDICES")
    picks = read(indices, "INDICES")
    for k, i in enumerate(picks or ()):
        if not 0 <= i < data.shape[0]:
            raise ShapeError(f"RemoveDataBlocks: INDICES[{k}] = {i} is out of range 0..{data.shape[0] - 1} (the "
                             "rows of DATA)")
    return None if picks is None else sorted(set(picks))


def _remove_shape(specs):
    drop = _remove_checks(*specs, known_ints)
    data = specs[0]
    rows = None if drop is None else data.shape[0] - len(drop)
    return [value_dependent((rows, *data.shape[1:]), data.dtype)]


@op("RemoveDataBlocks", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_remove_shape,
    gradient=SHOULD_NOT_DO_GRADIENT)
def remove_data_blocks(xp, data, indices):
    """DATA without the rows INDICES names (repeats count once)."""
    drop = _remove_checks(data, indices, host_ints)
    keep = np.setdiff1d(np.arange(data.shape[0]), np.asarray(drop, dtype=np.int64))
    return xp.take(data, on_device(xp, keep, np.int64), axis=0)

