"""Indexing operators: gathers, one-hot encodings, arg-max/min, lengths/segment bookkeeping and the
lengths-based (sparse) segment reductions. Semantics follow Caffe2's gather_op.h, batch_gather_ops.h,
one_hot_ops.cc, arg_ops.h, utility_ops.h, segment_reduction_op.h, lengths_reducer_ops.h, lengths_tile_op.cc
and sparse_to_dense_op.h. Small index tensors (lengths, ranges, sizes) are read on the host, as Caffe2
does. Shape functions share the kernels' checks; sizes that depend on index values (a sum of lengths, the
last segment id) are None unless the input's value is known statically."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op
from .shape import canonical_axis, folding, host_ints, known_ints, on_device, out_spec

NOT_IN_PLACE = ()


# --------------------------------------------------------------------------------------------- helpers
def _require_int(x, what: str) -> None:
    if x.dtype is not None and x.dtype.kind not in "iu":
        raise DTypeError(f"{what} must be int32 or int64, got {x.dtype}")


def _vector(x, what: str) -> None:
    if len(x.shape) != 1:
        raise ShapeError(f"{what} must be a 1-D vector, got shape {tuple(x.shape)}")


def _lengths(x, what: str = "LENGTHS", read=host_ints) -> list[int] | None:
    """Segment lengths as host ints (None if a spec's value is unknown), checked to be a non-negative
    vector."""
    _vector(x, what)
    values = read(x, what)
    for i, v in enumerate(values or ()):
        if v < 0:
            raise ShapeError(f"{what}[{i}] = {v}: lengths must be non-negative")
    return values


def _known(x, what: str = "LENGTHS"):
    """_lengths for a TensorSpec."""
    return _lengths(x, what, known_ints)


def _sum(values):
    return None if values is None else sum(values)


def _check_bounds(xp, idx, n: int, what: str, extra: str = "", wrap: bool = False) -> None:
    """Every index in [0, n) (or [-n, n) when negatives wrap); the first one outside is named, with its
    position. A TensorSpec of unknown value passes."""
    if idx is None or idx.size == 0:
        return
    bad = (idx < (-n if wrap else 0)) | (idx >= n)
    if bool(bad.any()):
        pos = int(xp.argmax(bad.reshape(-1)))
        value = int(idx.reshape(-1)[pos])
        valid = f"{-n if wrap else 0}..{n - 1}" if n else "none (the indexed dimension is empty)"
        raise ShapeError(f"{what}[{pos}] = {value} is out of bounds; valid indices: {valid}{extra}")


def _value(s):
    """A spec's value as a host array (None if unknown), for the bounds checks of shape functions."""
    return None if s.value is None else np.asarray(s.value)


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
    if data.dtype is not None and data.dtype.kind != "f":
        raise DTypeError(f"{what} must be a float tensor, got {data.dtype}")
    if len(data.shape) < 1:
        raise ShapeError(f"{what} must be at least 1-D, got a 0-D tensor")


# --------------------------------------------------------------------------------------------- gathers
def _gather_geometry(data, indices, axis: int, match_outer: bool) -> tuple[int, tuple]:
    """(axis, output shape) of a gather, after the kernel's type and shape checks (not the index bounds)."""
    _require_int(indices, "INDICES")
    ds, ids = tuple(data.shape), tuple(indices.shape)
    if len(ds) < 1:
        raise ShapeError("DATA must be at least 1-D, got a 0-D tensor")
    ax = canonical_axis(axis, len(ds))
    if ds[ax] == 0:   # Caffe2: gathering from an empty dimension returns DATA's (empty) shape
        return ax, ds
    if match_outer and (ax < 1 or ids[:ax] != ds[:ax]):
        raise ShapeError(f"match_outer needs axis >= 1 and INDICES {ids} to share DATA's "
                         f"dimensions before axis {ax} {ds[:ax]}")
    return ax, ds[:ax] + (ids[ax:] if match_outer else ids) + ds[ax + 1:]


def _gather(xp, data, indices, axis: int, wrap: bool, match_outer: bool):
    ax, shape = _gather_geometry(data, indices, axis, match_outer)
    dim = data.shape[ax]
    if dim == 0:
        return xp.copy(data)
    _check_bounds(xp, indices, dim, "INDICES", f" along axis {ax} of DATA {tuple(data.shape)}", wrap)
    if wrap:
        indices = xp.where(indices < 0, indices + dim, indices)
    if not match_outer:
        return xp.take(data, indices, axis=ax)
    outer, inner = math.prod(data.shape[:ax]), math.prod(data.shape[ax + 1:])
    cube = xp.reshape(data, (outer, dim, inner))
    picked = cube[xp.arange(outer)[:, None], xp.reshape(indices, (outer, math.prod(indices.shape[ax:])))]
    return xp.reshape(picked, shape)


def _gather_spec(data, indices, axis, wrap, match_outer):
    ax, shape = _gather_geometry(data, indices, axis, match_outer)
    if data.shape[ax]:
        _check_bounds(np, _value(indices), data.shape[ax], "INDICES",
                      f" along axis {ax} of DATA {tuple(data.shape)}", wrap)
    return [out_spec(shape, data.dtype)]


def _gather_shape(specs, *, axis, wrap_indices, match_outer, dense_gradient):
    wrap = (axis == 0) if wrap_indices is None else wrap_indices
    return _gather_spec(specs[0], specs[1], axis, wrap, match_outer)


@op("Gather", inputs=2, outputs=1, inplace=NOT_IN_PLACE,
    args={"axis": 0, "wrap_indices": Arg("bool", None), "match_outer": False, "dense_gradient": False},
    shape=folding(_gather_shape, lambda: gather))
def gather(xp, data, indices, axis, wrap_indices, match_outer, dense_gradient):
    """DATA[INDICES] along `axis`: shape data[:axis] + indices.shape + data[axis+1:]. Negative indices count
    from the end when wrap_indices (default: only for axis 0, as in later Caffe2)."""
    wrap = (axis == 0) if wrap_indices is None else wrap_indices
    return _gather(xp, data, indices, axis, wrap, match_outer)


def _batch_data(data) -> None:
    if len(data.shape) < 2:
        raise ShapeError(f"DATA must be at least 2-D, got shape {tuple(data.shape)}")


def _batch_gather_shape(specs):
    _batch_data(specs[0])
    return _gather_spec(specs[0], specs[1], 1, False, False)


@op("BatchGather", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_batch_gather_shape)
def batch_gather(xp, data, indices):
    """DATA[:, INDICES]: the same gather for every row of the batch (DATA at least 2-D)."""
    _batch_data(data)
    return _gather(xp, data, indices, 1, False, False)


def _ranges_checks(data, ranges) -> None:
    if len(data.shape) != 1:
        raise ShapeError(f"DATA must be 1-D, got shape {tuple(data.shape)}")
    rs = tuple(ranges.shape)
    if len(rs) != 3 or rs[1] < 1 or rs[2] != 2:
        raise ShapeError(f"RANGES must have shape (N, M>=1, 2) of (start, length) pairs, got {rs}")


def _range_picks(pairs, size: int):
    """The DATA positions that RANGES (N, M, 2) select, in order, after checking each range fits."""
    picks = []
    for n, m in np.argwhere(pairs[:, :, 1] != 0):
        start, length = pairs[n, m]
        if length < 0 or start < 0 or start + length > size:
            raise ShapeError(f"RANGES[{n}, {m}] = (start {start}, length {length}) does not fit in DATA of "
                             f"size {size}")
        picks.append(np.arange(start, start + length))
    return np.concatenate(picks) if picks else np.zeros(0, np.int64)


def _gather_ranges_shape(specs):
    data, ranges = specs
    _ranges_checks(data, ranges)
    values = known_ints(ranges, "RANGES")
    total = None
    if values is not None:
        total = _range_picks(np.asarray(values, dtype=np.int64).reshape(ranges.shape), data.shape[0]).size
    return [out_spec((total,), data.dtype), out_spec(ranges.shape[:1], np.int32)]


@op("GatherRanges", inputs=2, outputs=2, inplace=NOT_IN_PLACE, shape=_gather_ranges_shape)
def gather_ranges(xp, data, ranges):
    """Concatenate DATA[start:start+length] for every (start, length) in RANGES (N, M, 2); also the int32
    gathered length of each of the N examples."""
    _ranges_checks(data, ranges)
    pairs = np.asarray(host_ints(ranges, "RANGES"), dtype=np.int64).reshape(ranges.shape)
    index = _range_picks(pairs, data.size)
    return xp.take(data, xp.asarray(index)), on_device(xp, pairs[:, :, 1].sum(axis=1), np.int32)


# --------------------------------------------------------------------------------------------- one-hot, arg
def _one_hot_size(indices, index_size, read) -> int | None:
    """OneHot's checks; the number of classes (None when index_size's value is unknown)."""
    _vector(indices, "indices")
    _require_int(indices, "indices")
    if math.prod(index_size.shape) != 1:
        raise ShapeError(f"index_size must hold one value, got shape {tuple(index_size.shape)}")
    values = read(index_size, "index_size")
    if values is not None and values[0] < 0:
        raise ArgumentError(f"index_size = {values[0]} must be >= 0")
    return None if values is None else values[0]


def _one_hot_shape(specs):
    indices, index_size = specs
    n = _one_hot_size(indices, index_size, known_ints)
    if n is not None:
        _check_bounds(np, _value(indices), n, "indices", f" for index_size {n}")
    return [out_spec((indices.shape[0], n), np.float32)]


@op("OneHot", inputs=2, outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1,), gradient=NO_GRADIENT,
    shape=_one_hot_shape)
def one_hot(xp, indices, index_size):
    """float32 (N, index_size) rows with a 1 at each index (index_size: a 1-element int64 tensor)."""
    n = _one_hot_size(indices, index_size, host_ints)
    _check_bounds(xp, indices, n, "indices", f" for index_size {n}")
    return (indices[:, None] == xp.arange(n)[None, :]).astype(np.float32)


def _batch_one_hot_checks(data, lengths, values, read) -> tuple[int, int]:
    """BatchOneHot's checks; (N, columns of the output)."""
    _require_int(data, "data")
    _require_int(values, "values")
    if len(data.shape) < 1:
        raise ShapeError("data must be at least 1-D, got a 0-D tensor")
    d = math.prod(data.shape[1:])
    lens = _lengths(lengths, "lengths", read)
    if lengths.shape[0] != d:
        raise ShapeError(f"lengths has {lengths.shape[0]} entries but data has {d} columns "
                         f"(shape {tuple(data.shape)})")
    size = math.prod(values.shape)
    if lens is not None and size != sum(lens):
        raise ShapeError(f"values has {size} entries but lengths sum to {sum(lens)}")
    return data.shape[0], size   # the columns are sum(lengths), which the check makes the size of `values`


@op("BatchOneHot", inputs=3, outputs=1, inplace=NOT_IN_PLACE, gradient=NO_GRADIENT,
    shape=lambda s: [out_spec(_batch_one_hot_checks(*s, known_ints), s[0].dtype)])
def batch_one_hot(xp, data, lengths, values):
    """Encode column j of DATA (N, D) against its own dictionary: the next lengths[j] entries of `values`;
    output (N, sum(lengths)) of DATA's type, 1 where the entry equals the dictionary value."""
    n, _ = _batch_one_hot_checks(data, lengths, values, host_ints)
    d = math.prod(data.shape[1:])
    column = on_device(xp, np.repeat(np.arange(d), host_ints(lengths, "lengths")), np.int64)
    table = xp.take(xp.reshape(data, (n, d)), column, axis=1)
    return (table == xp.reshape(values, (1, -1))).astype(data.dtype)


def _arg_geometry(x, axis: int, keepdims: bool) -> tuple[int, tuple]:
    """(axis, output shape) of ArgMax/ArgMin after the kernel's checks."""
    if x.dtype is not None and x.dtype.kind not in "iuf":
        raise DTypeError(f"X must be int32, int64, float or double, got {x.dtype}")
    shape = tuple(x.shape)
    if len(shape) < 1:
        raise ShapeError("X must be at least 1-D, got a 0-D tensor")
    ax = canonical_axis(axis, len(shape))
    if shape[ax] == 0:
        raise ShapeError(f"cannot take an arg-max/min over the empty axis {ax} of X {shape}")
    return ax, shape[:ax] + ((1,) if keepdims else ()) + shape[ax + 1:]


def _arg(xp, x, axis, keepdims, fn):
    ax, shape = _arg_geometry(x, axis, keepdims)
    return xp.reshape(fn(x, axis=ax).astype(np.int64), shape)


def _arg_shape(specs, *, axis, keepdims):
    return [out_spec(_arg_geometry(specs[0], axis, keepdims)[1], np.int64)]


@op("ArgMax", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axis": -1, "keepdims": True},
    shape=_arg_shape)
def arg_max(xp, x, axis, keepdims):
    """int64 index of the first maximum along `axis` (kept as size 1 when keepdims)."""
    return _arg(xp, x, axis, keepdims, xp.argmax)


@op("ArgMin", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axis": -1, "keepdims": True},
    shape=_arg_shape)
def arg_min(xp, x, axis, keepdims):
    """int64 index of the first minimum along `axis` (kept as size 1 when keepdims)."""
    return _arg(xp, x, axis, keepdims, xp.argmin)


# ------------------------------------------------------------------------------------- lengths / segments
@op("LengthsToSegmentIds", inputs=1, outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=lambda s: [out_spec((_sum(_known(s[0], "lengths")),), np.int32)])
def lengths_to_segment_ids(xp, lengths):
    """[1, 3, 0, 2] -> int32 [0, 1, 1, 1, 3, 3]."""
    lens = _lengths(lengths, "lengths")
    return on_device(xp, np.repeat(np.arange(len(lens)), lens), np.int32)


def _ranges_shape(specs):
    _known(specs[0], "lengths")
    return [out_spec((specs[0].shape[0], 2), np.int32)]


@op("LengthsToRanges", inputs=1, outputs=1, inplace=NOT_IN_PLACE, shape=_ranges_shape)
def lengths_to_ranges(xp, lengths):
    """[1, 3, 0, 2] -> int32 (offset, length) rows [[0, 1], [1, 3], [4, 0], [4, 2]]."""
    lens = _lengths(lengths, "lengths")
    offsets = np.cumsum([0, *lens])[:-1]
    pairs = np.stack([offsets, np.asarray(lens, dtype=np.int64)], axis=1).reshape(-1, 2)
    return on_device(xp, pairs, np.int32)


def _segment_count(segment_ids, data, read) -> int | None:
    """The number of segments: the second input's first dimension when given, else last id + 1 (None when
    that needs ids of unknown value); the ids are checked to be sorted and within it."""
    ss = tuple(segment_ids.shape)
    if not (len(ss) == 1 or (len(ss) == 2 and 1 in ss)):
        raise ShapeError(f"segment_ids must be a vector, got shape {ss}")
    ids = read(segment_ids, "segment_ids")
    prev = 0
    for i, v in enumerate(ids or ()):
        if v < prev:
            raise ShapeError(f"segment_ids must be sorted and non-negative: segment_ids[{i}] = {v} "
                             f"follows {prev}")
        prev = v
    count = None if ids is None else ids[-1] + 1 if ids else 0
    if data:
        if len(data[0].shape) < 1:
            raise ShapeError("the second input must be at least 1-D (its first dimension is the segment "
                             "count)")
        if count is not None and count > data[0].shape[0]:
            raise ShapeError(f"segment ids go up to {count - 1} but the second input has only "
                             f"{data[0].shape[0]} rows")
        count = data[0].shape[0]
    return count


@op("SegmentIdsToLengths", inputs=(1, 2), outputs=1, inplace=NOT_IN_PLACE, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=lambda s: [out_spec((_segment_count(s[0], s[1:], known_ints),), np.int32)])
def segment_ids_to_lengths(xp, segment_ids, *data):
    """Sorted segment ids -> int32 length of every segment; the number of segments is the second input's first
    dimension when given, else last id + 1."""
    count = _segment_count(segment_ids, data, host_ints)
    ids = np.asarray(host_ints(segment_ids, "segment_ids"), dtype=np.int64)
    return on_device(xp, np.bincount(ids, minlength=count), np.int32)


def _tile_rows(data, lengths, read) -> int | None:
    """LengthsTile's checks; the output's row count (None when the lengths are unknown)."""
    lens = _lengths(lengths, "LENGTHS", read)
    if len(data.shape) < 1 or data.shape[0] != lengths.shape[0]:
        raise ShapeError(f"LENGTHS has {lengths.shape[0]} entries but DATA has shape {tuple(data.shape)}; "
                         "they must match in the first dimension")
    return _sum(lens)


@op("LengthsTile", inputs=2, outputs=1, inplace=NOT_IN_PLACE,
    shape=lambda s: [out_spec((_tile_rows(*s, known_ints), *s[0].shape[1:]), s[0].dtype)])
def lengths_tile(xp, data, lengths):
    """Repeat row i of DATA lengths[i] times."""
    _tile_rows(data, lengths, host_ints)
    return xp.repeat(data, host_ints(lengths, "LENGTHS"), axis=0)


def _segments_of(data, lengths, read) -> list[int] | None:
    """The checks of the dense lengths reductions; the lengths (None if unknown)."""
    _float_data(data)
    lens = _lengths(lengths, "LENGTHS", read)
    if lens is not None and sum(lens) != data.shape[0]:
        raise ShapeError(f"LENGTHS sum to {sum(lens)} but DATA has {data.shape[0]} rows (shape "
                         f"{tuple(data.shape)}); they must be equal")
    return lens


def _lengths_reduce(xp, data, lengths, kind):
    lens = _segments_of(data, lengths, host_ints)
    rows, mask = _segment_layout(xp, lens)
    return _reduce(xp, data, rows, mask, kind, data.dtype)


def _lengths_reduce_shape(specs):
    data, lengths = specs
    _segments_of(data, lengths, known_ints)
    return [out_spec((lengths.shape[0], *data.shape[1:]), data.dtype)]


def _sparse_checks(data, indices, lengths, weights, read):
    """The checks of the sparse lengths reductions (bounds aside); the lengths (None if unknown) and the
    output dtype (half embeddings reduce to float)."""
    _float_data(data)
    _vector(indices, "INDICES")
    _require_int(indices, "INDICES")
    lens = _lengths(lengths, "LENGTHS", read)
    count = math.prod(indices.shape)
    if lens is not None and sum(lens) != count:
        raise ShapeError(f"LENGTHS sum to {sum(lens)} but there are {count} INDICES; they must be equal")
    if weights is not None:
        _vector(weights, "WEIGHTS")
        if math.prod(weights.shape) != count:
            raise ShapeError(f"WEIGHTS has {math.prod(weights.shape)} entries but INDICES has {count}")
    return lens, (np.dtype(np.float32) if data.dtype == np.float16 else data.dtype)


def _sparse_reduce(xp, data, indices, lengths, kind, weights=None):
    lens, out_dtype = _sparse_checks(data, indices, lengths, weights, host_ints)
    _check_bounds(xp, indices, data.shape[0], "INDICES", f" for DATA of shape {tuple(data.shape)}")
    pos, mask = _segment_layout(xp, lens)
    w = None if weights is None else xp.take(weights, pos, axis=0)
    return _reduce(xp, data, xp.take(indices, pos, axis=0), mask, kind, out_dtype, w)


def _sparse_shape(specs):
    data, *weights, indices, lengths = specs
    _, dtype = _sparse_checks(data, indices, lengths, weights[0] if weights else None, known_ints)
    _check_bounds(np, _value(indices), data.shape[0], "INDICES", f" for DATA of shape {tuple(data.shape)}")
    return [out_spec((lengths.shape[0], *data.shape[1:]), dtype)]


@op("LengthsSum", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_lengths_reduce_shape)
def lengths_sum(xp, data, lengths):
    """Sum of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "sum")


@op("LengthsMean", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_lengths_reduce_shape)
def lengths_mean(xp, data, lengths):
    """Mean of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "mean")


@op("LengthsMax", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_lengths_reduce_shape)
def lengths_max(xp, data, lengths):
    """Elementwise max of each run of lengths[i] consecutive DATA rows (an empty run gives 0)."""
    return _lengths_reduce(xp, data, lengths, "max")


@op("SparseLengthsSum", inputs=3, outputs=1, inplace=NOT_IN_PLACE, shape=_sparse_shape)
def sparse_lengths_sum(xp, data, indices, lengths):
    """Sum of DATA[INDICES[k]] over each run of lengths[i] consecutive indices (embedding bags)."""
    return _sparse_reduce(xp, data, indices, lengths, "sum")


@op("SparseLengthsMean", inputs=3, outputs=1, inplace=NOT_IN_PLACE, shape=_sparse_shape)
def sparse_lengths_mean(xp, data, indices, lengths):
    """Mean of DATA[INDICES[k]] over each run of lengths[i] consecutive indices."""
    return _sparse_reduce(xp, data, indices, lengths, "mean")


@op("SparseLengthsWeightedSum", inputs=4, outputs=1, inplace=NOT_IN_PLACE, args={"grad_on_weights": 0},
    shape=lambda s, *, grad_on_weights: _sparse_shape(s))
def sparse_lengths_weighted_sum(xp, data, weights, indices, lengths, grad_on_weights):
    """Sum of WEIGHTS[k] * DATA[INDICES[k]] over each run of lengths[i] consecutive indices."""
    return _sparse_reduce(xp, data, indices, lengths, "sum", weights)


def _dense_rows(indices, values, extra, output_first_dim, read) -> int | None:
    """SparseToDense's checks; the output's first dimension (None when it is max(INDICES) + 1 of unknown
    indices)."""
    _vector(indices, "INDICES")
    _require_int(indices, "INDICES")
    count = math.prod(indices.shape)
    if len(values.shape) < 1 or values.shape[0] != count:
        raise ShapeError(f"VALUES {tuple(values.shape)} must have one row per index ({count} INDICES)")
    ids = read(indices, "INDICES")
    if output_first_dim > 0:
        if extra:
            raise ArgumentError("give either output_first_dim or the data_to_infer_dim input, not both")
        return output_first_dim
    if extra:
        if len(extra[0].shape) < 1:
            raise ShapeError("data_to_infer_dim must be at least 1-D (its first dimension sizes the output)")
        return extra[0].shape[0]
    return None if ids is None else max(ids) + 1 if ids else 0


def _sparse_to_dense_shape(specs, *, output_first_dim):
    indices, values, *extra = specs
    rows = _dense_rows(indices, values, extra, output_first_dim, known_ints)
    if rows is not None:
        _check_bounds(np, _value(indices), rows, "INDICES", f" for an output with {rows} rows")
    return [out_spec((rows, *values.shape[1:]), values.dtype)]


@op("SparseToDense", inputs=(2, 3), outputs=1, inplace=NOT_IN_PLACE, args={"output_first_dim": 0},
    shape=_sparse_to_dense_shape)
def sparse_to_dense(xp, indices, values, *data_to_infer_dim, output_first_dim):
    """Dense tensor with VALUES[k] added into row INDICES[k] (duplicates sum); its first dimension is
    output_first_dim, else the third input's first dimension, else max(INDICES) + 1."""
    rows = _dense_rows(indices, values, data_to_infer_dim, output_first_dim, host_ints)
    ids = np.asarray(host_ints(indices, "INDICES"), dtype=np.int64)
    _check_bounds(xp, indices, rows, "INDICES", f" for an output with {rows} rows")
    order = np.argsort(ids, kind="stable")
    targets, counts = np.unique(ids, return_counts=True)
    pos, mask = _segment_layout(xp, counts.tolist())
    rows_of = xp.take(on_device(xp, order, np.int64), pos, axis=0)
    sums = _reduce(xp, values, rows_of, mask, "sum", values.dtype)
    out = xp.zeros((rows, *values.shape[1:]), dtype=values.dtype)
    out[on_device(xp, targets, np.int64)] = sums
    return out
