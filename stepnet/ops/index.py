"""Indexing operators: gathers, one-hot encodings and arg-max/min, plus the index helpers the segment
reductions (segments.py) share. Semantics follow Caffe2's gather_op.h, batch_gather_ops.h, one_hot_ops.cc,
arg_ops.h and utility_ops.h. Small index tensors (ranges, sizes) are read on the host, as Caffe2 does. Shape
functions share the kernels' checks; sizes that depend on index values are None unless the input's value is
known statically. Gradient makers and no-gradient kinds are declared with the ops (what they emit is
described in index_grad.py, with the gradient kernels)."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, GradientError, ShapeError
from .base import canonical_axis, folding, host_ints, known_ints, on_device, out_spec, single_gradient
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op

NOT_IN_PLACE = ()


# --------------------------------------------------------------------------------------------- helpers
def require_int(x, what: str) -> None:
    if x.dtype is not None and x.dtype.kind not in "iu":
        raise DTypeError(f"{what} must be int32 or int64, got {x.dtype}")


def check_vector(x, what: str) -> None:
    if len(x.shape) != 1:
        raise ShapeError(f"{what} must be a 1-D vector, got shape {tuple(x.shape)}")


def read_lengths(x, what: str = "LENGTHS", read=host_ints) -> list[int] | None:
    """Segment lengths as host ints (None if a spec's value is unknown), checked to be a non-negative
    vector."""
    check_vector(x, what)
    values = read(x, what)
    for i, v in enumerate(values or ()):
        if v < 0:
            raise ShapeError(f"{what}[{i}] = {v}: lengths must be non-negative")
    return values


def known_lengths(x, what: str = "LENGTHS"):
    """read_lengths for a TensorSpec."""
    return read_lengths(x, what, known_ints)


def total(values):
    return None if values is None else sum(values)


def check_bounds(xp, idx, n: int, what: str, extra: str = "", wrap: bool = False) -> None:
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


def spec_value(s):
    """A spec's value as a host array (None if unknown), for the bounds checks of shape functions."""
    return None if s.value is None else np.asarray(s.value)


def float_data(data, what: str = "DATA") -> None:
    if data.dtype is not None and data.dtype.kind != "f":
        raise DTypeError(f"{what} must be a float tensor, got {data.dtype}")
    if len(data.shape) < 1:
        raise ShapeError(f"{what} must be at least 1-D, got a 0-D tensor")


# --------------------------------------------------------------------------------------------- gathers
def _gather_geometry(data, indices, axis: int, match_outer: bool) -> tuple[int, tuple]:
    """(axis, output shape) of a gather, after the kernel's type and shape checks (not the index bounds)."""
    require_int(indices, "INDICES")
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
    check_bounds(xp, indices, dim, "INDICES", f" along axis {ax} of DATA {tuple(data.shape)}", wrap)
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
        check_bounds(np, spec_value(indices), data.shape[ax], "INDICES",
                      f" along axis {ax} of DATA {tuple(data.shape)}", wrap)
    return [out_spec(shape, data.dtype)]


def _gather_shape(specs, *, axis, wrap_indices, match_outer, dense_gradient, output_first_dim):
    wrap = (axis == 0) if wrap_indices is None else wrap_indices
    return _gather_spec(specs[0], specs[1], axis, wrap, match_outer)


def _gather_gradient(g):
    """Axis 0: the sparse slice (INDICES, dY), or SparseToDense with dense_gradient=1; another axis:
    BatchGatherGradient with that axis."""
    axis = g.arg("axis", 0)
    dense = g.arg("dense_gradient")   # None when the argument is absent
    if axis == 0:
        if dense:
            g.op("SparseToDense", [g.I(1), g.GO(0), g.I(0)], [g.GI(0)])
        else:
            g.set_sparse(0, g.I(1), g.GO(0))
        return
    if dense is not None and not dense:
        raise GradientError(f"a Gather along axis {axis} has only a dense gradient, but the op "
                            "says dense_gradient=0; drop the argument or set it to 1", at=g.label)
    g.op("BatchGatherGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0)], axis=axis)


# `output_first_dim` is accepted and ignored: SparseToDense's gradient is a Gather that carries its arguments.
@op("Gather", inputs=2, outputs=1, inplace=NOT_IN_PLACE,
    args={"axis": 0, "wrap_indices": Arg("bool", None), "match_outer": False, "dense_gradient": False,
          "output_first_dim": Arg("int", None)},
    shape=folding(_gather_shape, lambda: gather), gradient=_gather_gradient, grows="shapes")
def gather(xp, data, indices, axis, wrap_indices, match_outer, dense_gradient, output_first_dim):
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


@op("BatchGather", inputs=2, outputs=1, inplace=NOT_IN_PLACE, shape=_batch_gather_shape, grows="shapes",
    gradient=single_gradient("BatchGatherGradient", ["I0", "I1", "GO0"]))
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


def _ranges_used(pairs, size: int):
    """The (start, length) pairs of RANGES (N, M, 2) that select something, in order, after checking each fits."""
    used = []
    for n, m in np.argwhere(pairs[:, :, 1] != 0):
        start, length = (int(v) for v in pairs[n, m])
        if length < 0 or start < 0 or start + length > size:
            raise ShapeError(f"RANGES[{n}, {m}] = (start {start}, length {length}) does not fit in DATA of "
                             f"size {size}")
        used.append((start, length))
    return used


def _range_picks(pairs, size: int):
    """The DATA positions that RANGES (N, M, 2) select, in order, after checking each range fits."""
    picks = [np.arange(start, start + length) for start, length in _ranges_used(pairs, size)]
    return np.concatenate(picks) if picks else np.zeros(0, np.int64)


def _gather_ranges_shape(specs):
    data, ranges = specs
    _ranges_checks(data, ranges)
    values = known_ints(ranges, "RANGES")
    total = None          # (summed, not gathered: the output may be far larger than RANGES)
    if values is not None:
        total = sum(n for _, n in _ranges_used(np.asarray(values, dtype=np.int64).reshape(ranges.shape),
                                               data.shape[0]))
    return [out_spec((total,), data.dtype), out_spec(ranges.shape[:1], np.int32)]


@op("GatherRanges", inputs=2, outputs=2, inplace=NOT_IN_PLACE, shape=_gather_ranges_shape, grows="values")
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
    check_vector(indices, "indices")
    require_int(indices, "indices")
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
        check_bounds(np, spec_value(indices), n, "indices", f" for index_size {n}")
    return [out_spec((indices.shape[0], n), np.float32)]


@op("OneHot", inputs=2, outputs=1, inplace=NOT_IN_PLACE, host_inputs=(1,), gradient=NO_GRADIENT,
    shape=_one_hot_shape, grows="values")
def one_hot(xp, indices, index_size):
    """float32 (N, index_size) rows with a 1 at each index (index_size: a 1-element int64 tensor)."""
    n = _one_hot_size(indices, index_size, host_ints)
    check_bounds(xp, indices, n, "indices", f" for index_size {n}")
    return (indices[:, None] == xp.arange(n)[None, :]).astype(np.float32)


def _batch_one_hot_checks(data, lengths, values, read) -> tuple[int, int]:
    """BatchOneHot's checks; (N, columns of the output)."""
    require_int(data, "data")
    require_int(values, "values")
    if len(data.shape) < 1:
        raise ShapeError("data must be at least 1-D, got a 0-D tensor")
    d = math.prod(data.shape[1:])
    lens = read_lengths(lengths, "lengths", read)
    if lengths.shape[0] != d:
        raise ShapeError(f"lengths has {lengths.shape[0]} entries but data has {d} columns "
                         f"(shape {tuple(data.shape)})")
    size = math.prod(values.shape)
    if lens is not None and size != sum(lens):
        raise ShapeError(f"values has {size} entries but lengths sum to {sum(lens)}")
    return data.shape[0], size   # the columns are sum(lengths), which the check makes the size of `values`


@op("BatchOneHot", inputs=3, outputs=1, inplace=NOT_IN_PLACE, gradient=NO_GRADIENT, grows="shapes",
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
    shape=_arg_shape, gradient=SHOULD_NOT_DO_GRADIENT)
def arg_max(xp, x, axis, keepdims):
    """int64 index of the first maximum along `axis` (kept as size 1 when keepdims)."""
    return _arg(xp, x, axis, keepdims, xp.argmax)


@op("ArgMin", inputs=1, outputs=1, inplace=NOT_IN_PLACE, args={"axis": -1, "keepdims": True},
    shape=_arg_shape, gradient=SHOULD_NOT_DO_GRADIENT)
def arg_min(xp, x, axis, keepdims):
    """int64 index of the first minimum along `axis` (kept as size 1 when keepdims)."""
    return _arg(xp, x, axis, keepdims, xp.argmin)
