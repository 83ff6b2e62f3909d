"""The last N rows seen (Caffe2's last_n_window_collector.cc): LastNWindowCollector.

The op keeps a ring buffer of up to num_to_collect rows across runs: the buffer (input and output 0), the ring
position to write next (input and output 1, an int32 0-d tensor) and optionally the number of rows seen so far
(input 4 and output 2, int64). An empty buffer starts the ring afresh (position and count from 0)."""
from __future__ import annotations

import contextlib

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, ShapeError
from .registry import SHOULD_NOT_DO_GRADIENT, op
from .util import Mutex


def _host(x, what: str):
    if not hasattr(x, "shape"):
        raise DTypeError(f"{what} must be a tensor, got {'nothing (never written)' if x is None else type(x).__name__}")
    return np.asarray(backend.to_host(x))


def _visited(value, started: bool, rows: int):
    """The count output: the count given (int64, one element) plus rows, or rows when the ring starts afresh."""
    count = _host(value, "the count of rows seen (NUM_VISITED)")
    if count.size != 1 or count.dtype != np.int64:
        raise DTypeError(f"the count of rows seen must be one int64, got {count.shape} {count.dtype}")
    seen = int(count.reshape(-1)[0]) if started else 0
    if seen < 0:
        raise ShapeError(f"the count of rows seen is negative ({seen})")
    return np.full(count.shape, seen + rows, np.int64)


@op("LastNWindowCollector", inputs=(3, 5), outputs=(2, 3), enforce_inplace=[(0, 0), (1, 1), (4, 2)], context=True,
    gradient=SHOULD_NOT_DO_GRADIENT, args={"num_to_collect": -1})
def last_n_window_collector(ctx, xp, buffer, cursor, data, *extra, num_to_collect):
    """Inputs: the buffer (empty at first), the next position (int32, 0-d; 0 at first), DATA (rows along dim
    0), optionally a mutex (made by CreateMutex) held while collecting, and the count of rows seen. Outputs: the
    buffer holding the last num_to_collect rows seen over all runs (in ring order: row k is the last seen at
    position k), the next position and, with a third output, the count of rows seen."""
    if num_to_collect <= 0:
        raise ArgumentError(f"num_to_collect must be > 0, got {num_to_collect}")
    lock = contextlib.nullcontext()
    if extra:
        if not isinstance(extra[0], Mutex):
            raise DTypeError(f"input 3 must be a mutex made by CreateMutex, got {type(extra[0]).__name__}")
        lock = extra[0]
    with lock:
        return _collect(ctx, buffer, cursor, _host(data, "DATA"), extra[1:], num_to_collect)


def _collect(ctx, buffer, cursor, data, visited, limit: int) -> tuple:
    if data.ndim < 1:
        raise ShapeError("DATA is 0-d; it must have at least 1 dim (its rows)")
    started = buffer is not None and getattr(buffer, "size", 1) > 0
    if started:
        buffer = _host(buffer, "the buffer (input 0)")
        if buffer.ndim != data.ndim or buffer.shape[1:] != data.shape[1:] or buffer.dtype != data.dtype:
            raise ShapeError(f"the buffer holds rows {buffer.shape[1:]} {buffer.dtype}, DATA rows {data.shape[1:]} "
                             f"{data.dtype}: they must match")
        if buffer.shape[0] > limit:
            raise ShapeError(f"the buffer holds {buffer.shape[0]} rows, more than num_to_collect={limit}")
    elif buffer is not None and not hasattr(buffer, "shape"):
        raise DTypeError(f"the buffer (input 0) must be a tensor, got {type(buffer).__name__}")
    rows = data.shape[0]
    count = ()
    if len(ctx.outputs) > 2:
        count = (_visited(visited[0] if visited else ctx.outputs[2].value, started, rows),)
    if rows == 0:
        return (None if started else data.copy(), None) + count
    take = min(rows, limit)
    have = buffer.shape[0] if started else 0
    out = np.empty((min(limit, have + take), *data.shape[1:]), data.dtype)
    out[:have] = buffer if started else out[:0]
    position = _position(cursor, started, out.shape[0])
    if rows > limit:
        out[:] = data[rows - limit:]
        position = 0
    else:
        first = min(take + position, limit) - position
        out[position:position + first] = data[:first]
        out[:take - first] = data[first:take]
        position = (position + take) % limit
    return (out, np.asarray(position, np.int32)) + count


def _position(cursor, started: bool, rows: int) -> int:
    """The ring position to write next: the cursor's value (an int32 0-d tensor), or 0 when starting afresh."""
    if not started:
        if cursor is not None and getattr(cursor, "ndim", 0) != 0:
            raise ShapeError(f"the next position (input 1) must be 0-d, got {cursor.shape}")
        return 0
    cursor = _host(cursor, "the next position (input 1)")
    if cursor.ndim != 0 or cursor.dtype != np.int32:
        raise DTypeError(f"the next position (input 1) must be an int32 0-d tensor, got {cursor.shape} {cursor.dtype}")
    position = int(cursor)
    if not 0 <= position < rows:
        raise ShapeError(f"the next position {position} is out of range for a buffer of {rows} rows")
    return position
