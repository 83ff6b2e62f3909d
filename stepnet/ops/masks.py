"""Selection by boolean masks and by condition: BooleanMask (+ BooleanMaskGradient), BooleanMaskLengths,
BooleanUnmask, Where and IsMemberOf (Caffe2's boolean_mask_ops.cc, boolean_unmask_ops.cc and
elementwise_logical_ops.h).

BooleanMask keeps the rows (first-dimension slices) of DATA where the 1-D bool MASK is true, with their int64
positions as an optional second output. Its gradient is PyTorch-era Caffe2's BooleanMaskGradient(MASK, dY):
dY's rows written back at the true positions of the mask, zero rows elsewhere (Caffe2's kernel sizes dX by
the mask, so it handles 1-D data only; rows of any shape are handled here, which agrees on 1-D data).
BooleanUnmask interleaves (mask, values) pairs back into one vector: at each position the first mask that is
true there takes its next value, and every values tensor must be used up. Where picks X where C is true and Y
elsewhere (with broadcast_on_rows, C picks whole rows). IsMemberOf tests each element against the `value`
list. The masks are read on the host, as Caffe2 does.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from ..io.proto import DataType
from .base import like, on_device, out_spec, single_gradient, value_dependent
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op


def _bool_vector(mask, what: str) -> None:
    if mask.dtype is not None and mask.dtype != np.bool_:
        raise DTypeError(f"{what} must be a bool tensor, got {mask.dtype}; compare or Cast it to bool first")
    if len(mask.shape) != 1:
        raise ShapeError(f"{what} must be a 1-D vector, got shape {tuple(mask.shape)}")


def _host_mask(mask) -> np.ndarray:
    return np.asarray(backend.to_host(mask), dtype=bool).reshape(-1)


def _known_mask(s) -> np.ndarray | None:
    return None if s.value is None else np.asarray(s.value, dtype=bool).reshape(-1)


# --------------------------------------------------------------------------------------------- BooleanMask
def _mask_checks(data, mask) -> None:
    _bool_vector(mask, "BooleanMask: MASK")
    if len(data.shape) < 1:
        raise ShapeError("BooleanMask: DATA must be at least 1-D (the mask picks its rows), got a 0-D tensor")
    if data.shape[0] != mask.shape[0]:
        raise ShapeError(f"BooleanMask: MASK has {mask.shape[0]} entries but DATA {tuple(data.shape)} has "
                         f"{data.shape[0]} rows; they must be equal")


def _mask_shape(specs):
    data, mask = specs
    _mask_checks(data, mask)
    flags = _known_mask(mask)
    kept = None if flags is None else int(flags.sum())
    picked = None if flags is None else np.flatnonzero(flags)
    return [value_dependent((kept, *data.shape[1:]), data.dtype),
            out_spec((kept,), np.int64, picked) if kept is not None else value_dependent((None,), np.int64)]


@op("BooleanMask", inputs=2, outputs=(1, 2), inplace=(), shape=_mask_shape,
    gradient=single_gradient("BooleanMaskGradient", ["I1", "GO0"]))
def boolean_mask(xp, data, mask):
    """masked_data: the rows of DATA where MASK is true, in order; masked_indices: their int64 positions."""
    _mask_checks(data, mask)
    picked = np.flatnonzero(_host_mask(mask))
    rows = on_device(xp, picked, np.int64)
    return xp.take(data, rows, axis=0), rows


def _mask_grad_checks(mask, dy, flags) -> None:
    _bool_vector(mask, "BooleanMaskGradient: MASK")
    if len(dy.shape) < 1:
        raise ShapeError("BooleanMaskGradient: dY must be at least 1-D, got a 0-D tensor")
    if flags is not None and int(flags.sum()) != dy.shape[0]:
        raise ShapeError(f"BooleanMaskGradient: MASK has {int(flags.sum())} true entries but dY "
                         f"{tuple(dy.shape)} has {dy.shape[0]} rows; they must be equal")


def _mask_grad_shape(specs):
    mask, dy = specs
    _mask_grad_checks(mask, dy, _known_mask(mask))
    return [out_spec((mask.shape[0], *dy.shape[1:]), dy.dtype)]


@op("BooleanMaskGradient", inputs=2, outputs=1, inplace=(), shape=_mask_grad_shape)
def boolean_mask_gradient(xp, mask, dy):
    """MASK, dY -> dX: dY's rows at the positions where MASK is true, zero rows at the others."""
    flags = _host_mask(mask) if len(mask.shape) == 1 else None
    _mask_grad_checks(mask, dy, flags)
    dx = xp.zeros((mask.shape[0], *dy.shape[1:]), dtype=dy.dtype)
    dx[on_device(xp, np.flatnonzero(flags), np.int64)] = dy
    return dx


def _lengths_checks(lengths, mask, values) -> None:
    if lengths.dtype is not None and lengths.dtype.name not in ("int32", "int64"):
        raise DTypeError(f"BooleanMaskLengths: lengths must be int32 or int64, got {lengths.dtype}")
    if len(lengths.shape) != 1:
        raise ShapeError(f"BooleanMaskLengths: lengths must be a 1-D vector, got shape {tuple(lengths.shape)}")
    _bool_vector(mask, "BooleanMaskLengths: mask")
    if values is not None:
        if (values < 0).any():
            raise ShapeError(f"BooleanMaskLengths: lengths must be >= 0, got {int(values.min())}")
        if int(values.sum()) != mask.shape[0]:
            raise ShapeError(f"BooleanMaskLengths: the lengths sum to {int(values.sum())} but the mask has "
                             f"{mask.shape[0]} entries; they must be equal")


def _lengths_shape(specs):
    lengths, mask = specs
    _lengths_checks(lengths, mask, None if lengths.value is None else np.asarray(lengths.value))
    return [like(lengths)]


@op("BooleanMaskLengths", inputs=2, outputs=1, inplace=(), shape=_lengths_shape, gradient=NO_GRADIENT)
def boolean_mask_lengths(xp, lengths, mask):
    """The segment lengths after BooleanMask: for each segment of `lengths`, how many of its mask entries
    are true (lengths' dtype)."""
    host = np.asarray(backend.to_host(lengths)).astype(np.int64)
    _lengths_checks(lengths, mask, host)
    segment = np.repeat(np.arange(host.size), host)
    counts = np.bincount(segment[_host_mask(mask)], minlength=host.size)
    return on_device(xp, counts, lengths.dtype)


# --------------------------------------------------------------------------------------------- BooleanUnmask
def _unmask_checks(pairs) -> None:
    if len(pairs) % 2:
        raise ArityError(f"BooleanUnmask takes (mask, values) pairs, got {len(pairs)} inputs (an odd number)")
    n, dtype = pairs[0].shape[0] if len(pairs[0].shape) == 1 else None, pairs[1].dtype
    for k in range(0, len(pairs), 2):
        mask, values = pairs[k], pairs[k + 1]
        _bool_vector(mask, f"BooleanUnmask: input {k} (a mask)")
        if mask.shape[0] != n:
            raise ShapeError(f"BooleanUnmask: mask input {k} has {mask.shape[0]} entries but input 0 has {n}; "
                             "every mask must have the same length")
        if len(values.shape) != 1:
            raise ShapeError(f"BooleanUnmask: values input {k + 1} must be a 1-D vector, got shape "
                             f"{tuple(values.shape)}")
        if values.dtype is not None and dtype is not None and values.dtype != dtype:
            raise DTypeError(f"BooleanUnmask: values input {k + 1} is {values.dtype} but input 1 is {dtype}; "
                             "all values must share one type")


def _unmask_picks(masks, counts) -> list:
    """Where each pair's values go (a bool vector per pair): the positions where its mask is the first true
    one; the number of those must be its values' count, and every position must be covered."""
    taken = np.zeros(masks[0].size, dtype=bool)
    picks = []
    for k, (mask, count) in enumerate(zip(masks, counts)):
        pick = mask & ~taken
        taken |= mask
        if int(pick.sum()) != count:
            raise ShapeError(f"BooleanUnmask: mask input {2 * k} is the first true mask at {int(pick.sum())} "
                             f"positions but values input {2 * k + 1} has {count} elements; they must be equal")
        picks.append(pick)
    if not taken.all():
        raise ShapeError(f"BooleanUnmask: every mask is false at position {int(np.argmin(taken))}; each position "
                         "needs a true mask")
    return picks


def _unmask_shape(specs):
    _unmask_checks(specs)
    masks = [_known_mask(s) for s in specs[0::2]]
    if all(m is not None for m in masks):
        _unmask_picks(masks, [s.shape[0] for s in specs[1::2]])
    return [out_spec(specs[0].shape, specs[1].dtype)]


@op("BooleanUnmask", inputs=(2, None), outputs=1, inplace=(), shape=_unmask_shape, gradient=NO_GRADIENT)
def boolean_unmask(xp, *pairs):
    """The vector rebuilt from (mask, values) pairs: position i takes the next value of the first mask that
    is true at i; a position no mask covers, or values left over or missing, are errors."""
    _unmask_checks(pairs)
    picks = _unmask_picks([_host_mask(m) for m in pairs[0::2]], [v.shape[0] for v in pairs[1::2]])
    strings = pairs[1].dtype.kind == "O"
    mod = np if strings else xp
    n = pairs[0].shape[0]
    out = np.empty(n, dtype=object) if strings else xp.zeros(n, dtype=pairs[1].dtype)
    for pick, values in zip(picks, pairs[1::2]):
        out[on_device(mod, np.flatnonzero(pick), np.int64)] = values
    return out


# --------------------------------------------------------------------------------------------- Where
def _where_checks(c, x, y, rows: bool) -> None:
    if c.dtype is not None and c.dtype != np.bool_:
        raise DTypeError(f"Where: C must be a bool tensor, got {c.dtype}")
    if x.dtype is not None and y.dtype is not None and x.dtype != y.dtype:
        raise DTypeError(f"Where: X is {x.dtype} but Y is {y.dtype}; they must share one type")
    if tuple(x.shape) != tuple(y.shape):
        raise ShapeError(f"Where: X {tuple(x.shape)} and Y {tuple(y.shape)} must have the same shape")
    if rows:
        if len(c.shape) != 1 or len(y.shape) < 1 or c.shape[0] != y.shape[0]:
            raise ShapeError(f"Where with broadcast_on_rows: C {tuple(c.shape)} must be a vector with one entry "
                             f"per row of X and Y {tuple(y.shape)}")
    elif tuple(c.shape) != tuple(x.shape):
        raise ShapeError(f"Where: C {tuple(c.shape)} must have the shape of X and Y {tuple(x.shape)} (or set "
                         "broadcast_on_rows=1 with one C entry per row)")


def _where_shape(specs, *, broadcast_on_rows):
    _where_checks(*specs, broadcast_on_rows)
    return [like(specs[1])]


@op("Where", inputs=3, outputs=1, inplace=(), args={"broadcast_on_rows": False}, shape=_where_shape,
    gradient=SHOULD_NOT_DO_GRADIENT)
def where(xp, c, x, y, *, broadcast_on_rows):
    """Z = C ? X : Y elementwise; with broadcast_on_rows, C (one entry per row) picks whole rows."""
    _where_checks(c, x, y, broadcast_on_rows)
    mod = np if x.dtype == object else xp
    cond = c.reshape(c.shape + (1,) * (x.ndim - 1)) if broadcast_on_rows else c
    return mod.where(cond, x, y)


# --------------------------------------------------------------------------------------------- IsMemberOf
_MEMBER_TYPES = {"int32": DataType.INT32, "int64": DataType.INT64, "bool": DataType.BOOL, "object": DataType.STRING}


def _member_values(value, dtype, x_dtype) -> list:
    """The `value` list as keys comparable with X's elements, after Caffe2's typed argument read."""
    if not isinstance(value, (list, tuple)):
        raise ArgumentError(f"IsMemberOf: 'value' must be a list of values, got {value!r}")
    dt = _MEMBER_TYPES.get(x_dtype.name) if dtype is None else dtype
    if dtype is not None and dtype not in _MEMBER_TYPES.values():
        raise ArgumentError(f"IsMemberOf: 'dtype' {dtype} is not one of INT32, INT64, BOOL or STRING")
    if dt == DataType.STRING:
        if any(not isinstance(v, (str, bytes)) for v in value):
            raise ArgumentError("IsMemberOf: 'value' must hold strings for a string tensor")
        return [v.encode() if isinstance(v, str) else v for v in value]
    if any(isinstance(v, (str, bytes, float)) for v in value):
        raise ArgumentError(f"IsMemberOf: 'value' must hold integers for a {x_dtype} tensor, got {value!r}")
    return [int(v) for v in value]


def _member_checks(x, dtype) -> None:
    if x.dtype is not None and x.dtype.name not in _MEMBER_TYPES:
        raise DTypeError(f"IsMemberOf: X must be int32, int64, bool or string, got {x.dtype}")
    if dtype is not None and x.dtype is not None and _MEMBER_TYPES[x.dtype.name] != dtype:
        raise DTypeError(f"IsMemberOf: 'dtype' is {DataType.Name(dtype)} but X is {x.dtype}")


def _member_shape(specs, *, value, dtype):
    _member_checks(specs[0], dtype)
    if specs[0].dtype is not None:
        _member_values(value, dtype, specs[0].dtype)
    return [like(specs[0], np.bool_)]


@op("IsMemberOf", inputs=1, outputs=1, inplace=(), shape=_member_shape, gradient=SHOULD_NOT_DO_GRADIENT,
    args={"value": Arg("any", [], "the values to test against"),
          "dtype": Arg("int", None, "TensorProto.DataType of the values (X's type if absent)")})
def is_member_of(xp, x, *, value, dtype):
    """Y[i] = X[i] in `value` (bool, X's shape)."""
    _member_checks(x, dtype)
    keys = _member_values(value, dtype, x.dtype)
    host = np.asarray(backend.to_host(x))
    if x.dtype == object:
        wanted = set(keys)
        found = np.array([(v.encode() if isinstance(v, str) else v) in wanted for v in host.reshape(-1)], dtype=bool)
        return found.reshape(host.shape)
    return on_device(xp, np.isin(host.astype(np.int64), np.asarray(keys, dtype=np.int64)), np.bool_)
