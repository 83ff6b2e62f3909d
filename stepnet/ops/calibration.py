"""Calibration maps: Percentile and PiecewiseLinearTransform (Caffe2's percentile_op.cc and
piecewise_linear_transform_op.h), float32 as Caffe2 registers them.

Percentile maps column j of a 2-D float32 tensor through distribution j of VALUE_TO_PCT, rows (value,
percentile) sorted by value, the distributions one after another with `lengths` (int32, one per column) rows
each. A value found in its distribution takes its percentile; one above all its values 1, one below all 0;
otherwise it is interpolated linearly between the neighbouring samples. NO_GRADIENT.

PiecewiseLinearTransform maps each column j of a 2-D float32 tensor through group j of piecewise linear
functions: bounds b_0 <= ... <= b_n, slopes and intercepts s_k, c_k; x in (b_k, b_{k+1}] gives s_k * x + c_k,
and x outside [b_0, b_n] is first clamped to it. The groups come one after another in `bounds` (n + 1 per
group), `slopes` and `intercepts` (n per group), given all three as arguments or as inputs 1-3; the number of
groups is len(bounds) - len(slopes). With binary=1 there is one group, X is N, N x 1 or N x 2, and for N x 2
column 1 is transformed and column 0 becomes 1 - that. SHOULD_NOT_DO_GRADIENT.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from .base import like, on_device
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op


def _float32(op_type: str, **named) -> None:
    for name, t in named.items():
        if t.dtype is not None and t.dtype != np.float32:
            raise DTypeError(f"{op_type}: {name} must be float32, got {t.dtype}")


def _host(x) -> np.ndarray:
    return np.asarray(backend.to_host(x))


# --------------------------------------------------------------------------------------------- Percentile
def _percentile_checks(x, pairs, lengths, sizes) -> None:
    _float32("Percentile", original_values=x, value_to_pct=pairs)
    if lengths.dtype is not None and lengths.dtype != np.int32:
        raise DTypeError(f"Percentile: lengths must be int32, got {lengths.dtype}")
    if len(x.shape) != 2:
        raise ShapeError(f"Percentile: original_values must be 2-D (examples x features), got shape "
                         f"{tuple(x.shape)}")
    if len(pairs.shape) != 2 or pairs.shape[1] != 2:
        raise ShapeError(f"Percentile: value_to_pct must be 2-D with 2 columns (value, percentile), got shape "
                         f"{tuple(pairs.shape)}")
    if len(lengths.shape) != 1 or lengths.shape[0] != x.shape[1]:
        raise ShapeError(f"Percentile: lengths {tuple(lengths.shape)} must be a vector with one length per "
                         f"feature (column) of original_values {tuple(x.shape)}")
    if sizes is not None:
        if (sizes < 0).any():
            raise ShapeError(f"Percentile: lengths must be >= 0, got {int(sizes.min())}")
        if int(sizes.sum()) != pairs.shape[0]:
            raise ShapeError(f"Percentile: the lengths sum to {int(sizes.sum())} but value_to_pct has "
                             f"{pairs.shape[0]} rows; they must be equal")


def _percentile_shape(specs):
    x, pairs, lengths = specs
    _percentile_checks(x, pairs, lengths, None if lengths.value is None else np.asarray(lengths.value))
    return [like(x)]


@op("Percentile", inputs=3, outputs=1, inplace=(), shape=_percentile_shape, gradient=NO_GRADIENT)
def percentile(xp, x, pairs, lengths):
    """percentile_values (float32, X's shape): each value's percentile in its column's distribution."""
    sizes = _host(lengths).astype(np.int64)
    _percentile_checks(x, pairs, lengths, sizes)
    host, table = _host(x), _host(pairs)
    out = np.empty_like(host)
    start = 0
    for j, n in enumerate(sizes.tolist()):
        values, pcts, col = table[start:start + n, 0], table[start:start + n, 1], host[:, j]
        start += n
        at = np.searchsorted(values, col, side="left")                 # the first sample >= the value
        hi = np.minimum(at, max(n - 1, 0))
        lo = np.maximum(at - 1, 0)
        if n == 0:
            out[:, j] = 1.0
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            share = (col - values[lo]) / (values[hi] - values[lo])
            inside = pcts[lo] + share * (pcts[hi] - pcts[lo])
        out[:, j] = np.where(at == n, np.float32(1), np.where(col == values[hi], pcts[hi],
                                                             np.where(at == 0, np.float32(0), inside)))
    return on_device(xp, out, np.float32)


# --------------------------------------------------------------------------------------------- piecewise linear
def _groups(nb: int, ns: int, ni: int, binary: bool) -> tuple[int, int]:
    """(groups, pieces per group) from the numbers of bounds, slopes and intercepts."""
    if ns != ni:
        raise ArgumentError(f"PiecewiseLinearTransform: {ns} slopes but {ni} intercepts; they must be equal")
    groups = nb - ns
    if groups <= 0:
        raise ArgumentError(f"PiecewiseLinearTransform: {nb} bounds for {ns} slopes; each group needs one bound "
                            "more than it has slopes")
    if binary and groups != 1:
        raise ArgumentError(f"PiecewiseLinearTransform: binary=1 needs one group of functions, got {groups}")
    if ns % groups or ns == 0:
        raise ArgumentError(f"PiecewiseLinearTransform: {ns} slopes do not split into {groups} groups of at least "
                            "one piece each")
    return groups, ns // groups


def _params(params, bounds, slopes, intercepts, binary: bool, read):
    """([bounds, slopes, intercepts] as float32 host vectors, groups, pieces); `params` are inputs 1-3, read
    by `read` (a TensorSpec's values may be unknown: then the vectors from inputs are None)."""
    given = sum(bool(v) for v in (bounds, slopes, intercepts))
    if given not in (0, 3):
        raise ArgumentError("PiecewiseLinearTransform: give all of bounds, slopes and intercepts as arguments, "
                            "or none of them (then as inputs 1-3)")
    if given and params:
        raise ArityError("PiecewiseLinearTransform: the functions are given as arguments, so it takes X alone")
    if not given and len(params) != 3:
        raise ArityError(f"PiecewiseLinearTransform: without bounds, slopes and intercepts arguments it takes X, "
                         f"bounds, slopes and intercepts, got {1 + len(params)} inputs")
    if given:
        vectors = [np.asarray(v, dtype=np.float32) for v in (bounds, slopes, intercepts)]
        sizes = [v.size for v in vectors]
    else:
        _float32("PiecewiseLinearTransform", bounds=params[0], slopes=params[1], intercepts=params[2])
        vectors = [read(p) for p in params]
        sizes = [int(np.prod(p.shape)) for p in params]
    groups, pieces = _groups(*sizes, binary)
    if vectors[0] is not None and (np.diff(vectors[0].reshape(groups, pieces + 1), axis=1) < 0).any():
        raise ArgumentError("PiecewiseLinearTransform: the bounds of each group must be sorted (ascending)")
    return vectors, groups, pieces


def _plt_checks(x, binary: bool, groups: int) -> None:
    _float32("PiecewiseLinearTransform", X=x)
    if binary:
        if len(x.shape) not in (1, 2) or (len(x.shape) == 2 and x.shape[1] not in (1, 2)):
            raise ShapeError(f"PiecewiseLinearTransform with binary=1: X must be N, N x 1 or N x 2, got shape "
                             f"{tuple(x.shape)}")
    elif len(x.shape) != 2 or x.shape[1] != groups:
        raise ShapeError(f"PiecewiseLinearTransform: X must be 2-D with one column per group of functions "
                         f"({groups}), got shape {tuple(x.shape)}")


def _plt_shape(specs, *, bounds, slopes, intercepts, binary):
    _, groups, _ = _params(specs[1:], bounds, slopes, intercepts, binary, lambda p: None)
    _plt_checks(specs[0], binary, groups)
    return [like(specs[0])]


def _transform(col, b, s, c):
    """One group's function on one column (float32): clamp to [b_0, b_n], then the piece (b_k, b_{k+1}]."""
    x = np.minimum(np.maximum(col, b[0]), b[-1])
    k = np.clip(np.searchsorted(b, x, side="left") - 1, 0, s.size - 1)
    k = np.where(x >= b[-1], s.size - 1, k)          # the last piece from b_n on, even when bounds repeat there
    return s[k] * x + c[k]


@op("PiecewiseLinearTransform", inputs=(1, 4), outputs=1, inplace=(), shape=_plt_shape,
    gradient=SHOULD_NOT_DO_GRADIENT,
    args={"bounds": Arg("floats", []), "slopes": Arg("floats", []), "intercepts": Arg("floats", []),
          "binary": False})
def piecewise_linear_transform(xp, x, *params, bounds, slopes, intercepts, binary):
    """Y (X's shape): each column through its group's piecewise linear function (see the module doc)."""
    (b, s, c), groups, n = _params(params, bounds, slopes, intercepts, binary,
                                   lambda p: _host(p).reshape(-1).astype(np.float32))
    _plt_checks(x, binary, groups)
    host = _host(x)
    if binary:
        flat = host.reshape(host.shape[0], -1)
        y = _transform(flat[:, -1], b, s, c)
        out = np.stack([np.float32(1) - y, y], axis=1) if flat.shape[1] == 2 else y.reshape(host.shape)
        return on_device(xp, out.reshape(host.shape), np.float32)
    b, s, c = b.reshape(groups, n + 1), s.reshape(groups, n), c.reshape(groups, n)
    out = np.stack([_transform(host[:, j], b[j], s[j], c[j]) for j in range(groups)], axis=1)
    return on_device(xp, out.reshape(host.shape), np.float32)
