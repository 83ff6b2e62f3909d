"""Indexing operators: gathers, one-hot encodings, arg-max/min, lengths/segment bookkeeping and the
lengths-based (sparse) segment reductions. Semantics follow Caffe2's gather_op.h, batch_gather_ops.h,
one_hot_ops.cc, arg_ops.h, utility_ops.h, segment_reduction_op.h, lengths_reducer_ops.h, lengths_tile_op.cc
and sparse_to_dense_op.h. Small index tensors (lengths, ranges, sizes) are read on the host, as Caffe2
does."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op
from .shape import canonical_axis, host_ints, on_device

NOT_IN_PLACE = ()


# --------------------------------------------------------------------------------------------- helpers
def _require_int(x, what: str) -> None:
    if x.dtype.kind not in "iu":
        raise DTypeError(f"{what} must be int32 or int64, got {x.dtype}")


def _vector(x, what: str) -> None:
    if x.ndim != 1:
        raise ShapeError(f"{what} must be a 1-D vector, got shape {tuple(x.shape)}")


def _lengths(x, what: str = "LENGTHS") -> list[int]:
    """Segment lengths as host ints, checked to be a non-negative vector."""
    _vector(x, what)
    values = host_ints(x, what)
    for i, v in enumerate(values):
        if v < 0:
            raise ShapeError(f"{what}[{i}] = {v}: lengths must be non-negative")
    return values


def _check_bounds(xp, idx, n: int, what: str, extra: str = "", wrap: bool = False) -> None:
    """Every index in [0, n) (or [-n, n) when negatives wrap); the first one outside is named, with its
    position."""
    if idx.size == 0:
        return
    bad = (idx < (-n if wrap else 0)) | (idx >= n)
    if bool(bad.any()):
        pos = int(xp.argmax(bad.reshape(-1)))
        value = int(idx.reshape(-1)[pos])
        valid = f"{-n if wrap else 0}..{n - 1}" if n else "none (the indexed dimension is empty)"
        raise ShapeError(f"{what}[{pos}] = {value} is out of bounds; valid indices: {valid}{extra}")


def _segment_layout(xp, lengths: list[int]):
    """For consecutive segments of the given lengths: an (M, L) matrix of positions (L = longest segment) and
    the mask of the real ones, so a segment reduction is one gather and one masked reduction."""
    width = max(lengths, default=0)
    starts = np.cumsum([0, *lengths])[:-1]
    pos = np.arange(width)
    mask = pos[None, :] < np.asarray(lengths, dtype=np.int64).reshape(-1, 1)
    rows = np.where(mask, starts.reshape(-1, 1) + pos[None, :], 0)
    return xp.asarray(rows.astype(np.int64)), xp.asarray(mask)


def _reduce(xp, data, rows, mask, kind: str, out_dtype, weights=None):
    """Reduce the rows of DATA picked by `rows` (M, L) under `mask` into M blocks shaped like DATA[0];
    `weights` (M, L) scale the picked rows first."""
    block = tuple(data.shape[1:])
    flat = xp.reshape(data, (data.shape[0], math.prod(block)))
    picked = xp.take(flat, rows, axis=0).astype(out_dtype)          # (M, L, D)
    keep = mask[:, :, None]
    if weights is not None:
        picked = picked * weights.astype(out_dtype)[:, :, None]
    counts = mask.sum(axis=1)
    if kind == "max":
        if rows.shape[1] == 0:
            out = xp.zeros((rows.shape[0], flat.shape[1]), dtype=out_dtype)
        else:
            out = xp.where(keep, picked, -np.inf).max(axis=1)
            out = xp.where(counts[:, None] > 0, out, 0).astype(out_dtype)   # an empty segment gives 0
    else:
        out = xp.where(keep, picked, 0).sum(axis=1).astype(out_dtype)
        if kind == "mean":
            out = out / xp.maximum(counts, 1).astype(out_dtype)[:, None]
    return xp.reshape(out, (rows.shape[0], *block))


def _float_data(data, what: str = "DATA") -> None:
    if data.dtype.kind != "f":
        raise DTypeError(f"{what} must be a float tensor, got {data.dtype}")
    if data.ndim < 1:
        raise ShapeError(f"{what} must be at least 1-D, got a 0-D tensor")


# --------------------------------------------------------------------------------------------- gathers
def _gather(xp, data, indices, axis: int, wrap: bool, match_outer: bool):
    _require_int(indices, "INDICES")
    if data.ndim < 1:
        raise ShapeError("DATA must be at least 1-D, got a 0-D tensor")
    ax = canonical_axis(axis, data.ndim)
    dim = data.shape[ax]
    if dim == 0:   # Caffe2: gathering from an empty dimension returns DATA's (empty) shape
        return xp.copy(data)
    _check_bounds(xp, indices, dim, "INDICES", f" along axis {ax} of DATA {tuple(data.shape)}", wrap)
    if wrap:
        indices = xp.where(indices < 0, indices + dim, indices)
    if not match_outer:
        return xp.take(data, indices, axis=ax)
    if ax < 1 or tuple(indices.shape[:ax]) != tuple(data.shape[:ax]):
        raise ShapeError(f"match_outer needs axis >= 1 and INDICES {tuple(indices.shape)} to share DATA's "
                         f"dimensions before axis {ax} {tuple(data.shape[:ax])}")
    outer, inner = math.prod(data.shape[:ax]), math.prod(data.shape[ax + 1:])
    per = math.prod(indices.shape[ax:])
    cube = xp.reshape(data, (outer, dim, inner))
    picked = cube[xp.arange(outer)[:, None], xp.reshape(indices, (outer, per))]
    return xp.reshape(picked, (*data.shape[:ax], *indices.shape[ax:], *data.shape[ax + 1:]))


@op("Gather", inputs=2, outputs=1, inplace=NOT_IN_PLACE,
    args={"axis": 0, "wrap_indices": Arg("bool", None), "match_outer": False, "dense_gradient": False})
def gather(xp, data, indices, axis, wrap_indices, match_outer, dense_gradient):
    """DATA[INDICES] along `axis`: shape data[:axis] + indices.shape + data[axis+1:]. Negative indices count
    from the end when wrap_indices (default: only for axis 0, as in later Caffe2)."""
    wrap = (axis == 0) if wrap_indices is None else wrap_indices
    return _gather(xp, data, indices, axis, wrap, match_outer)


@op("BatchGather", inputs=2, outputs=1, inplace=NOT_IN_PLACE)
def batch_gather(xp, data, indices):
    """DATA[:, INDICES]: the same gather for every row of the batch (DATA at least 2-D)."""
    if data.ndim < 2:
        raise ShapeError(f"DATA must be at least 2-D, got shape {tuple(data.shape)}")
    return _gather(xp, data, indices, 1, False, False)


@op("GatherRanges", inputs=2, outputs=2, inplace=NOT_IN_PLACE)
def gather_ranges(xp, data, ranges):
    """Concatenate DATA[start:start+length] for every (start, length) in RANGES (N, M, 2); also the int32
    gathered length of each of the N examples."""
    if data.ndim != 1:
        raise ShapeError(f"DATA must be 1-D, got shape {tuple(data.shape)}")
    if ranges.ndim != 3 or ranges.shape[1] < 1 or ranges.shape[2] != 2:
        raise ShapeError("RANGES must have shape (N, M>=1, 2) of (start, length) pairs, "
                         f"got {tuple(ranges.shape)}")
    pairs = np.asarray(host_ints(ranges, "RANGES"), dtype=np.int64).reshape(ranges.shape)
    picks = []
    for n, m in np.argwhere(pairs[:, :, 1] != 0):
        start, length = pairs[n, m]
        if length < 0 or start < 0 or start + length > data.size:
            raise ShapeError(f"RANGES[{n}, {m}] = (start {start}, length {length}) does not fit in DATA of "
                             f"size {data.size}")
        picks.append(np.arange(start, start + length))
    index = np.concatenate(picks) if picks else np.zeros(0, np.int64)
    return xp.take(data, xp.asarray(index)), on_device(xp, pairs[:, :, 1].sum(axis=1), np.int32)


# --------------------------------------------------------------------------------------------- one-hot, arg
@op("OneHot", inputs=2, outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1,), gradient=NO_GRADIENT)
def one_hot(xp, indices, index_size):
    """float32 (N, index_size) rows with a 1 at each index (index_size: a 1-element int64 tensor)."""
    _vector(indices, "indices")
    _require_int(indices, "indices")
    if index_size.size != 1:
        raise ShapeError(f"index_size must hold one value, got shape {tuple(index_size.shape)}")
    n = host_ints(index_size, "index_size")[0]
    if n < 0:
        raise ArgumentError(f"index_size = {n} must be >= 0")
    _check_bounds(xp, indices, n, "indices", f" for index_size {n}")
    return (indices[:, None] == xp.arange(n)[None, :]).astype(np.float32)


@op("BatchOneHot", inputs=3, outputs=1, inplace=NOT_IN_PLACE, gradient=NO_GRADIENT)
def batch_one_hot(xp, data, lengths, values):
    """Encode column j of DATA (N, D) against its own dictionary: the next lengths[j] entries of `values`;
    output (N, sum(lengths)) of DATA's type, 1 where the entry equals the dictionary value."""
    _require_int(data, "data")
    _require_int(values, "values")
    if data.ndim < 1:
        raise ShapeError("data must be at least 1-D, got a 0-D tensor")
    n, d = data.shape[0], math.prod(data.shape[1:])
    lens = _lengths(lengths, "lengths")
    if len(lens) != d:
        raise ShapeError(f"lengths has {len(lens)} entries but data has {d} columns "
                         f"(shape {tuple(data.shape)})")
    if values.size != sum(lens):
        raise ShapeError(f"values has {values.size} entries but lengths sum to {sum(lens)}")
    column = on_device(xp, np.repeat(np.arange(d), lens), np.int64)
    table = xp.take(xp.reshape(data, (n, d)), column, axis=1)
    return (table == xp.reshape(values, (1, -1))).astype(data.dtype)


def _arg(xp, x, axis, keepdims, fn):
    if x.dtype.kind not in "iuf":
        raise DTypeError(f"X must be int32, int64, float or double, got {x.dtype}")
    if x.ndim < 1:
        raise ShapeError("X must be at least 1-D, got a 0-D tensor")
    ax = canonical_axis(axis, x.ndim)
    if x.shape[ax] == 0:
        raise ShapeError(f"cannot take an arg-max/min over the empty axis {ax} of X {tuple(x.shape)}")
    out = fn(x, axis=ax).astype(np.int64)
    return xp.expand_dims(out, ax) if keepdims else out


@op("ArgMax", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axis": -1, "keepdims": True})
def arg_max(xp, x, axis, keepdims):
    """int64 index of the first maximum along `axis` (kept as size 1 when keepdims)."""
    return _arg(xp, x, axis, keepdims, xp.argmax)


@op("ArgMin", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axis": -1, "keepdims": True})
def arg_min(xp, x, axis, keepdims):
    """int64 index of the first minimum along `axis` (kept as size 1 when keepdims)."""
    return _arg(xp, x, axis, keepdims, xp.argmin)


# ------------------------------------------------------------------------------------- lengths / segments
@op("LengthsToSegmentIds", inputs=1, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT)
def lengths_to_segment_ids(xp, lengths):
    """[1, 3, 0, 2] -> int32 [0, 1, 1, 1, 3, 3]."""
    lens = _lengths(lengths, "lengths")
    return on_device(xp, np.repeat(np.arange(len(lens)), lens), np.int32)


@op("LengthsToRanges", inputs=1, outputs=1, inplace=NOT_IN_PLACE)
def lengths_to_ranges(xp, lengths):
    """[1, 3, 0, 2] -> int32 (offset, length) rows [[0, 1], [1, 3], [4, 0], [4, 2]]."""
    lens = _lengths(lengths, "lengths")
    offsets = np.cumsum([0, *lens])[:-1]
    pairs = np.stack([offsets, np.asarray(lens, dtype=np.int64)], axis=1).reshape(-1, 2)
    return on_device(xp, pairs, np.int32)


@op("SegmentIdsToLengths", inputs=(1, 2), outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT)
def segment_ids_to_lengths(xp, segment_ids, *data):
    """Sorted segment ids -> int32 length of every segment; the number of segments is the second input's first
    dimension when given, else last id + 1."""
    if not (segment_ids.ndim == 1 or (segment_ids.ndim == 2 and 1 in segment_ids.shape)):
        raise ShapeError(f"segment_ids must be a vector, got shape {tuple(segment_ids.shape)}")
    ids = host_ints(segment_ids, "segment_ids")
    prev = 0
    for i, v in enumerate(ids):
        if v < prev:
            raise ShapeError(f"segment_ids must be sorted and non-negative: segment_ids[{i}] = {v} "
                             f"follows {prev}")
        prev = v
    count = ids[-1] + 1 if ids else 0
    if data:
        if data[0].ndim < 1:
            raise ShapeError("the second input must be at least 1-D (its first dimension is the segment "
                             "count)")
        if count > data[0].shape[0]:
            raise ShapeError(f"segment ids go up to {count - 1} but the second input has only "
                             f"{data[0].shape[0]} rows")
        count = data[0].shape[0]
    return on_device(xp, np.bincount(np.asarray(ids, dtype=np.int64), minlength=count), np.int32)


@op("LengthsTile", inputs=2, outputs=1, inplace=NOT_IN_PLACE)
def lengths_tile(xp, data, lengths):
    """Repeat row i of DATA lengths[i] times."""
    lens = _lengths(lengths)
    if data.ndim < 1 or data.shape[0] != len(lens):
        raise ShapeError(f"LENGTHS has {len(lens)} entries but DATA has shape {tuple(data.shape)}; "
                         "they must match in the first dimension")
    return xp.repeat(data, lens, axis=0)


def _lengths_reduce(xp, data, lengths, kind):
    _float_data(data)
    lens = _lengths(lengths)
    if sum(lens) != data.shape[0]:
        raise ShapeError(f"LENGTHS sum to {sum(lens)} but DATA has {data.shape[0]} rows (shape "
                         f"{tuple(data.shape)}); they must be equal")
    rows, mask = _segment_layout(xp, lens)
    return _reduce(xp, data, rows, mask, kind, data.dtype)


def _sparse_reduce(xp, data, indices, lengths, kind, weights=None):
    _float_data(data)
    _vector(indices, "INDICES")
    _require_int(indices, "INDICES")
    lens = _lengths(lengths)
    if sum(lens) != indices.size:
        raise ShapeError(f"LENGTHS sum to {sum(lens)} but there are {indices.size} INDICES; "
                         "they must be equal")
    if weights is not None:
        _vector(weights, "WEIGHTS")
        if weights.size != indices.size:
            raise ShapeError(f"WEIGHTS has {weights.size} entries but INDICES has {indices.size}")
    _check_bounds(xp, indices, data.shape[0], "INDICES", f" for DATA of shape {tuple(data.shape)}")
    pos, mask = _segment_layout(xp, lens)
    out_dtype = np.float32 if data.dtype == np.float16 else data.dtype   # half embeddings reduce to float
    w = None if weights is None else xp.take(weights, pos, axis=0)
    return _reduce(xp, data, xp.take(indices, pos, axis=0), mask, kind, out_dtype, w)


@op("LengthsSum", inputs=2, outputs=1, inplace=NOT_IN_PLACE)
def lengths_sum(xp, data, lengths):
    """Sum of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "sum")


@op("LengthsMean", inputs=2, outputs=1, inplace=NOT_IN_PLACE)
def lengths_mean(xp, data, lengths):
    """Mean of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "mean")


@op("LengthsMax", inputs=2, outputs=1, inplace=NOT_IN_PLACE)
def lengths_max(xp, data, lengths):
    """Elementwise max of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "max")


@op("SparseLengthsSum", inputs=3, outputs=1, inplace=NOT_IN_PLACE)
def sparse_lengths_sum(xp, data, indices, lengths):
    """Sum of DATA[INDICES[k]] over each run of lengths[i] consecutive indices (embedding bags)."""
    return _sparse_reduce(xp, data, indices, lengths, "sum")


@op("SparseLengthsMean", inputs=3, outputs=1, inplace=NOT_IN_PLACE)
def sparse_lengths_mean(xp, data, indices, lengths):
    """Mean of DATA[INDICES[k]] over each run of lengths[i] consecutive indices."""
    return _sparse_reduce(xp, data, indices, lengths, "mean")


@op("SparseLengthsWeightedSum", inputs=4, outputs=1, inplace=NOT_IN_PLACE, args={"grad_on_weights": 0})
def sparse_lengths_weighted_sum(xp, data, weights, indices, lengths, grad_on_weights):
    """Sum of WEIGHTS[k] * DATA[INDICES[k]] over each run of lengths[i] consecutive indices."""
    return _sparse_reduce(xp, data, indices, lengths, "sum", weights)


@op("SparseToDense", inputs=(2, 3), outputs=1, inplace=NOT_IN_PLACE, args={"output_first_dim": 0})
def sparse_to_dense(xp, indices, values, *data_to_infer_dim, output_first_dim):
    """Dense tensor with VALUES[k] added into row INDICES[k] (duplicates sum); its first dimension is
    output_first_dim, else the third input's first dimension, else max(INDICES) + 1."""
    _vector(indices, "INDICES")
    _require_int(indices, "INDICES")
    if values.ndim < 1 or values.shape[0] != indices.size:
        raise ShapeError(f"VALUES {tuple(values.shape)} must have one row per index ({indices.size} INDICES)")
    ids = host_ints(indices, "INDICES")
    if output_first_dim > 0:
        if data_to_infer_dim:
            raise ArgumentError("give either output_first_dim or the data_to_infer_dim input, not both")
        rows = output_first_dim
    elif data_to_infer_dim:
        if data_to_infer_dim[0].ndim < 1:
            raise ShapeError("data_to_infer_dim must be at least 1-D (its first dimension sizes the output)")
        rows = data_to_infer_dim[0].shape[0]
    else:
        rows = max(ids) + 1 if ids else 0
    _check_bounds(xp, indices, rows, "INDICES", f" for an output with {rows} rows")
    order = np.argsort(np.asarray(ids, dtype=np.int64), kind="stable")
    targets, counts = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
    pos, mask = _segment_layout(xp, counts.tolist())
    rows_of = xp.take(on_device(xp, order, np.int64), pos, axis=0)
    sums = _reduce(xp, values, rows_of, mask, "sum", values.dtype)
    out = xp.zeros((rows, *values.shape[1:]), dtype=values.dtype)
    out[on_device(xp, targets, np.int64)] = sums
    return out
