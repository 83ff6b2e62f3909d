"""Sampling from weights and joining strings: what a generation net needs to turn softmax rows into text."""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import DTypeError, ShapeError
from ..core.spec import spec
from .registry import NO_GRADIENT, op


def _sample_shape(specs, **_):
    w = specs[0]
    if len(w.shape) != 2:
        raise ShapeError(f"sampling_weights must be 2-D (batch x weights), got {w.shape}")
    rows = w.shape[0] if w.shape[1] else 0      # Caffe2 gives empty outputs when there is nothing to sample
    return [spec((rows,), np.int32), spec((rows,), np.float32)]


@op("WeightedSample", inputs=(1, 2), outputs=(1, 2), inplace=(), random=True, shape=_sample_shape,
    gradient=NO_GRADIENT)
def weighted_sample(xp, weights, values=None, *, rng):
    """One index per row, drawn with probability proportional to the row's (non-negative) weights; with a
    second input, also the value at that index. Random numbers come from the host generator."""
    _sample_shape([spec(weights.shape)])
    if weights.dtype.kind != "f":
        raise DTypeError(f"sampling_weights must be float, got {weights.dtype}")
    w = np.asarray(backend.to_host(weights), dtype=np.float64)
    if (w < 0).any():
        raise ShapeError("sampling weights must be non-negative")
    if values is not None and values.shape != weights.shape:
        raise ShapeError(f"sampling_values {tuple(values.shape)} must match the weights {tuple(weights.shape)}")
    if w.shape[1] == 0:     # no weights to sample from: empty outputs, as Caffe2 gives them
        return xp.zeros((0,), dtype=np.int32), (None if values is None else xp.zeros((0,), dtype=np.float32))
    cum = np.cumsum(w, axis=1)
    r = rng.uniform(0.0, 1.0, size=w.shape[0]) * cum[:, -1]
    idx = np.array([min(int(np.searchsorted(c, x, side="left")), w.shape[1] - 1) for c, x in zip(cum, r)],
                   dtype=np.int32)
    out_values = None
    if values is not None:
        out_values = np.asarray(backend.to_host(values))[np.arange(len(idx)), idx].astype(np.float32)
    return xp.asarray(idx), (None if out_values is None else xp.asarray(out_values))


def _join_shape(specs, *, delimiter, axis):
    x = specs[0]
    if len(x.shape) not in (1, 2) or axis not in (0, 1) or (axis == 1 and len(x.shape) < 2):
        raise ShapeError(f"StringJoin takes a 1-D or 2-D tensor and axis 0 or 1, got {x.shape} and axis {axis}")
    return [spec((x.shape[axis],), object)]


@op("StringJoin", inputs=1, outputs=1, inplace=(), args={"delimiter": ",", "axis": 0}, shape=_join_shape,
    gradient=NO_GRADIENT)
def string_join(xp, x, *, delimiter, axis):
    """Join the elements of each row (axis 0) or column (axis 1) into one string; numbers are formatted."""
    _join_shape([spec(x.shape, object)], delimiter=delimiter, axis=axis)
    host = np.asarray(backend.to_host(x))
    if host.ndim == 1:
        host = host[:, None]
    if axis == 1:
        host = host.T
    text = lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)  # noqa: E731
    sep = delimiter if isinstance(delimiter, bytes) else delimiter.encode()   # (a file's bytes: joined as given)
    out = np.empty(host.shape[0], dtype=object)
    out[:] = [sep.join(text(v).encode() for v in row) for row in host]
    return out
