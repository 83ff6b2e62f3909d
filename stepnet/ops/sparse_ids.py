"""Sparse id features and their encodings, with Caffe2's semantics: MergeIdLists (merge_id_lists_op.h),
IndexHash (index_hash_ops.h), NGramFromCategorical (ngram_ops.h), FindDuplicateElements
(find_duplicate_elements_op.h), and the one-hot encodings BatchBucketOneHot and SegmentOneHot (one_hot_ops.cc).

Ids and lengths are read on the host, as Caffe2 does. None of these ops has a gradient: IndexHash and
FindDuplicateElements refuse one (SHOULD_NOT_DO_GRADIENT), the others declare none (NO_GRADIENT, or nothing
registered: BatchBucketOneHot).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import check_float, host_ints, known_ints, on_device, out_spec, value_dependent
from .index import NOT_IN_PLACE, check_vector, read_lengths, require_int
from .registry import NO_GRADIENT, REQUIRED, SHOULD_NOT_DO_GRADIENT, Arg, op


# --------------------------------------------------------------------------------------------- MergeIdLists
def _merge_checks(inputs, read):
    """The checks; every list's lengths (None where unknown)."""
    if len(inputs) % 2:
        raise ArgumentError(f"MergeIdLists takes (LENGTHS, VALUES) pairs, got {len(inputs)} inputs")
    n = inputs[0].shape[0] if len(inputs[0].shape) == 1 else None
    lens = []
    for p in range(0, len(inputs), 2):
        lengths, values = inputs[p:p + 2]
        got = read_lengths(lengths, f"LENGTHS (input {p})", read)
        check_vector(values, f"VALUES (input {p + 1})")
        require_int(values, f"MergeIdLists: VALUES (input {p + 1})")
        if values.dtype is not None and inputs[1].dtype is not None and values.dtype != inputs[1].dtype:
            raise DTypeError(f"MergeIdLists: VALUES (input {p + 1}) has dtype {values.dtype} but input 1 has "
                             f"{inputs[1].dtype}; the ids must share one type")
        if lengths.shape[0] != n:
            raise ShapeError(f"MergeIdLists: LENGTHS (input {p}) has {lengths.shape[0]} entries but input 0 has {n}; "
                             "every list needs one length per example")
        if got is not None and sum(got) != values.shape[0]:
            raise ShapeError(f"MergeIdLists: LENGTHS (input {p}) sum to {sum(got)} but VALUES (input {p + 1}) has "
                             f"{values.shape[0]} ids")
        lens.append(got)
    return lens


def _merge_shape(specs):
    _merge_checks(specs, known_ints)
    return [out_spec(specs[0].shape, np.int32), value_dependent((None,), specs[1].dtype)]


@op("MergeIdLists", inputs=(2, None), outputs=2, inplace=NOT_IN_PLACE, shape=_merge_shape, gradient=NO_GRADIENT)
def merge_id_lists(xp, *inputs):
    """LENGTHS_0, VALUES_0, LENGTHS_1, VALUES_1, ... (id lists of one batch) -> int32 merged lengths and the
    merged ids: for each example, the sorted distinct ids of all its lists."""
    lens = _merge_checks(inputs, host_ints)
    starts = [np.cumsum([0, *ls]) for ls in lens]
    ids = [host_ints(inputs[p + 1], "VALUES") for p in range(0, len(inputs), 2)]
    merged, counts = [], []
    for i in range(inputs[0].shape[0]):
        got = sorted({v for k, vs in enumerate(ids) for v in vs[starts[k][i]:starts[k][i + 1]]})
        merged += got
        counts.append(len(got))
    return on_device(xp, counts, np.int32), on_device(xp, merged, inputs[1].dtype)


# --------------------------------------------------------------------------------------------- IndexHash
def _hash_checks(indices, modulo: int | None):
    require_int(indices, "IndexHash: Indices")
    if indices.dtype is not None and indices.dtype not in (np.int32, np.int64):
        raise DTypeError(f"IndexHash: Indices must be int32 or int64, got {indices.dtype}")
    if modulo is not None:
        if modulo <= 0:
            raise ArgumentError(f"IndexHash: modulo = {modulo} must be > 0")
        if indices.dtype is not None and modulo > np.iinfo(indices.dtype).max:
            raise ArgumentError(f"IndexHash: modulo = {modulo} is larger than {indices.dtype} can hold")


@op("IndexHash", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"seed": 0, "modulo": 0},
    shape=lambda s, **_: (_hash_checks(s[0], None), [out_spec(s[0].shape, s[0].dtype)])[1],
    gradient=SHOULD_NOT_DO_GRADIENT)
def index_hash(xp, indices, *, seed, modulo):
    """Indices (int32/int64) -> each index hashed (seed * 0xDEADBEEF, then per byte, lowest first, h * 65537 +
    the signed byte, in the index type's wrapping arithmetic) and reduced into 0..modulo-1."""
    _hash_checks(indices, modulo)
    dtype = indices.dtype
    bits = dtype.itemsize * 8
    mask = (1 << bits) - 1
    values = np.asarray(host_ints(indices, "Indices"), dtype=dtype)
    raw = values.astype(f"<i{dtype.itemsize}").view(np.int8).reshape(-1, dtype.itemsize).astype(np.int64)
    h = np.full(values.shape, (seed * 0xDEADBEEF) & mask, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for byte in raw.T:
            h = (h * np.uint64(65537) + byte.astype(np.uint64)) & np.uint64(mask)
    signed = h.astype(np.uint64).astype(f"u{dtype.itemsize}").view(dtype).astype(np.int64)
    return on_device(xp, np.mod(signed, modulo).reshape(indices.shape), dtype)


# --------------------------------------------------------------------------------------------- NGram
def _ngram_maps(col_ids, categorical_limits, vals):
    """For each listed column, {value: its code times the column's base}; the largest column id."""
    if not col_ids:
        raise ArgumentError("NGramFromCategorical: col_ids must name at least one column")
    if len(col_ids) != len(categorical_limits):
        raise ArgumentError(f"NGramFromCategorical: {len(col_ids)} col_ids but {len(categorical_limits)} "
                            "categorical_limits; give one limit per column")
    if any(v <= 0 for v in categorical_limits) or any(j < 0 for j in col_ids):
        raise ArgumentError("NGramFromCategorical: categorical_limits must be > 0 and col_ids >= 0")
    if sum(categorical_limits) != len(vals):
        raise ArgumentError(f"NGramFromCategorical: {len(vals)} vals but the categorical_limits sum to "
                            f"{sum(categorical_limits)}")
    maps, base, at = [], 1, 0
    for limit in categorical_limits:
        maps.append({v: m * base for m, v in enumerate(vals[at:at + limit])})
        at += limit
        base *= limit
    return maps


def _ngram_checks(floats, col_ids):
    check_float("NGramFromCategorical", floats=floats)
    if floats.dtype is not None and floats.dtype != np.float32:
        raise DTypeError(f"NGramFromCategorical: floats must be float32, got {floats.dtype}")
    if len(floats.shape) < 1:
        raise ShapeError("NGramFromCategorical: floats must be at least 1-D (one row per example)")
    width = math.prod(floats.shape[1:])
    if col_ids and max(col_ids) >= width:
        raise ShapeError(f"NGramFromCategorical: col_ids go up to {max(col_ids)} but floats {tuple(floats.shape)} "
                         f"has {width} columns")


NGRAM_ARGS = {"col_ids": Arg("ints", REQUIRED), "categorical_limits": Arg("ints", REQUIRED),
              "vals": Arg("ints", REQUIRED)}


def _ngram_shape(specs, *, col_ids, categorical_limits, vals):
    _ngram_maps(col_ids, categorical_limits, vals)
    _ngram_checks(specs[0], col_ids)
    return [out_spec(specs[0].shape[:1], np.int64)]


@op("NGramFromCategorical", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args=NGRAM_ARGS, shape=_ngram_shape,
    gradient=NO_GRADIENT)
def ngram_from_categorical(xp, floats, *, col_ids, categorical_limits, vals):
    """floats (N, D) -> int64 the n-gram id of each row: over the columns col_ids[k], the sum of (the position
    of round(value) in that column's vals) times the product of the earlier categorical_limits; a value not in
    the vals adds 0."""
    maps = _ngram_maps(col_ids, categorical_limits, vals)
    _ngram_checks(floats, col_ids)
    rows = np.asarray(backend.to_host(floats), dtype=np.float64).reshape(floats.shape[0], math.prod(floats.shape[1:]))
    out = np.zeros(floats.shape[0], dtype=np.int64)
    for k, j in enumerate(col_ids):
        column = rows[:, j]
        rounded = (np.sign(column) * np.floor(np.abs(column) + 0.5)).astype(np.int64)   # C's round: half away
        out += np.array([maps[k].get(int(v), 0) for v in rounded], dtype=np.int64)
    return on_device(xp, out, np.int64)


# --------------------------------------------------------------------------------------------- duplicates
def _duplicate_checks(data):
    check_vector(data, "data")


@op("FindDuplicateElements", inputs=1, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=lambda s: (_duplicate_checks(s[0]), [value_dependent((None,), np.int64)])[1])
def find_duplicate_elements(xp, data):
    """data (a vector of numbers or strings) -> int64 the positions of the elements equal to an earlier one."""
    _duplicate_checks(data)
    seen, dup = set(), []
    for i, v in enumerate(np.asarray(backend.to_host(data)).tolist()):
        if v in seen:
            dup.append(i)
        seen.add(v)
    return on_device(xp, dup, np.int64)


# --------------------------------------------------------------------------------------------- one-hot
def _bucket_checks(x, lengths, boundaries, read):
    check_float("BatchBucketOneHot", data=x, boundaries=boundaries)
    if len(x.shape) < 1:
        raise ShapeError("BatchBucketOneHot: data must be at least 1-D (one row per example)")
    width = math.prod(x.shape[1:])
    lens = read_lengths(lengths, "lengths", read)
    if lengths.shape[0] != width:
        raise ShapeError(f"BatchBucketOneHot: lengths has {lengths.shape[0]} entries but data {tuple(x.shape)} has "
                         f"{width} columns; give one per column")
    if lens is not None:
        if any(v == 0 for v in lens):
            raise ShapeError("BatchBucketOneHot: every column needs at least one boundary (lengths > 0)")
        if sum(lens) != math.prod(boundaries.shape):
            raise ShapeError(f"BatchBucketOneHot: lengths sum to {sum(lens)} but there are "
                             f"{math.prod(boundaries.shape)} boundaries; they must be equal")
    return lens


def _bucket_shape(specs):
    lens = _bucket_checks(*specs, known_ints)
    return [value_dependent((specs[0].shape[0], None if lens is None else sum(lens) + len(lens)), np.float32)]


@op("BatchBucketOneHot", inputs=3, outputs=1, inplace=NOT_IN_PLACE, shape=_bucket_shape, grows="values")
def batch_bucket_one_hot(xp, x, lengths, boundaries):
    """data (N, D), lengths (D), boundaries (sum of lengths; each column's sorted) -> float32 (N, sum(lengths +
    1)): column j becomes lengths[j] + 1 indicator columns, of buckets (-inf, b1], (b1, b2], ..., (bn, inf)."""
    lens = _bucket_checks(x, lengths, boundaries, host_ints)
    n = x.shape[0]
    cols = xp.reshape(x, (n, len(lens)))
    out = xp.zeros((n, sum(lens) + len(lens)), dtype=np.float32)
    flat_bounds = xp.reshape(boundaries, (-1,))
    at, offset = 0, 0
    rows = on_device(xp, np.arange(n), np.int64)
    for j, length in enumerate(lens):
        bucket = xp.searchsorted(flat_bounds[at:at + length], cols[:, j], side="left")
        out[rows, offset + bucket] = 1.0
        at += length
        offset += length + 1
    return out


def _segment_one_hot_checks(lengths, indices, index_size, read):
    lens = read_lengths(lengths, "lengths", read)
    check_vector(indices, "indices")
    if indices.dtype is not None and indices.dtype != np.int64:
        raise DTypeError(f"SegmentOneHot: indices must be int64, got {indices.dtype}")
    if math.prod(index_size.shape) != 1:
        raise ShapeError(f"SegmentOneHot: index_size must hold one value, got shape {tuple(index_size.shape)}")
    size = read(index_size, "index_size")
    if size is not None and size[0] <= 0:
        raise ArgumentError(f"SegmentOneHot: index_size = {size[0]} must be > 0")
    if lens is not None and sum(lens) != indices.shape[0]:
        raise ShapeError(f"SegmentOneHot: lengths sum to {sum(lens)} but there are {indices.shape[0]} indices")
    return lens, None if size is None else size[0]


def _segment_one_hot_shape(specs):
    _, size = _segment_one_hot_checks(*specs, known_ints)
    return [value_dependent((specs[0].shape[0], size), np.float32)]


@op("SegmentOneHot", inputs=3, outputs=1, inplace=NOT_IN_PLACE, host_inputs=(2,), shape=_segment_one_hot_shape,
    grows="values", gradient=NO_GRADIENT)
def segment_one_hot(xp, lengths, indices, index_size):
    """lengths, indices (int64, in runs of lengths[i]), index_size -> float32 (len(lengths), index_size): row i
    has 1 at every index of run i, 0 elsewhere."""
    lens, size = _segment_one_hot_checks(lengths, indices, index_size, host_ints)
    ids = np.asarray(host_ints(indices, "indices"), dtype=np.int64)
    bad = (ids < 0) | (ids >= size)
    if bad.any():
        k = int(np.argmax(bad))
        raise ShapeError(f"SegmentOneHot: indices[{k}] = {ids[k]} is out of range 0..{size - 1} (index_size)")
    out = xp.zeros((len(lens), size), dtype=np.float32)
    run = np.repeat(np.arange(len(lens)), lens)
    out[on_device(xp, run, np.int64), on_device(xp, ids, np.int64)] = 1.0
    return out
