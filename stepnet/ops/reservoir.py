"""Reservoir sampling (Caffe2's reservoir_sampling op): ReservoirSampling.

The op keeps, in a reservoir tensor, a uniform sample of at most num_to_collect of the rows (entries along
dim 0) of every DATA batch it has seen, counting the rows in NUM_VISITED (Algorithm R: the k-th row seen, k
from 0, is appended while k < num_to_collect, else it replaces the row at a position drawn uniformly from
[0, k] when that position is below num_to_collect). With OBJECT_ID (int64, one per row) an object is held at
most once: OBJECT_TO_POS_MAP (a CreateMap map, int64 keys to int32 values) maps each held object to its row
and POS_TO_OBJECT (int64) each row to its object; a row whose object is already held, or already seen in the
batch, is skipped and not counted. Every state blob is updated in place while the MUTEX is held.

The random positions come from the op's host generator (its device option's random_seed, else the
workspace's), not Caffe2's engine, so a given seed keeps other rows than Caffe2 would; the distribution is the
same. Where Caffe2 would read uninitialized memory (a state whose blobs are out of step) this op refuses the
state instead, and a slot filled by appending held no object, so nothing is erased from the map for it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from .base import held_object
from .dataset_ops import check_sizes
from .maps import MAP_TYPES, KeyValueMap
from .registry import SHOULD_NOT_DO_GRADIENT, op
from .util import Mutex

INT32_MAX = 2**31 - 1
ID_MAP = MAP_TYPES[(np.dtype(np.int64), np.dtype(np.int32))]   # Caffe2's MapType64To32
STRINGS = "OUS"


@dataclass
class Reservoir:
    """The op's state: the reservoir rows (None: none yet), the rows visited, and for deduplication the map
    from object ids to rows and the object id of each row."""
    rows: np.ndarray | None
    visited: int
    table: KeyValueMap | None = None
    objects: np.ndarray | None = None


def _tensor(value, what: str) -> np.ndarray:
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        got = "nothing (never written)" if value is None else type(value).__name__
        raise DTypeError(f"{what} must be a tensor, got {got}")
    return np.asarray(backend.to_host(value))


def _same_type(a: np.dtype, b: np.dtype) -> bool:
    return a == b or (a.kind in STRINGS and b.kind in STRINGS)


def _joined_dtype(a: np.dtype, b: np.dtype) -> np.dtype:
    """The dtype holding rows of both (strings of other widths or kinds: the wider, or objects)."""
    if a == b:
        return a
    return np.promote_types(a, b) if a.kind == b.kind and a.kind in "US" else np.dtype(object)


def _holds_rows(reservoir) -> bool:
    """Caffe2's 'initialized': the reservoir holds elements (or rows of zero width)."""
    return reservoir is not None and (reservoir.size > 0 or (reservoir.ndim >= 1 and reservoir.shape[0] > 0))


def read_state(reservoir, num_visited, data: np.ndarray, num_to_collect: int, table=None, objects=None,
               dedup: bool = False) -> Reservoir:
    """The state blobs checked against each other and against data; an empty reservoir starts afresh (its
    count read as 0, as Caffe2 resets it)."""
    visited = _tensor(num_visited, "input 1 (num_visited)")
    if visited.dtype != np.int64 or visited.size != 1:
        raise DTypeError(f"input 1 (num_visited) must be an int64 scalar (one element), got {visited.shape} "
                         f"{visited.dtype}")
    rows = None if reservoir is None else _tensor(reservoir, "input 0 (reservoir)")
    if dedup:
        if not isinstance(table, KeyValueMap) or type(table) is not ID_MAP:
            got = "nothing (never written)" if table is None else (
                f"a map of {table.key_dtype} keys and {table.value_dtype} values" if isinstance(table, KeyValueMap)
                else type(table).__name__)
            raise DTypeError(f"input 5 (object_to_pos_map) must be a map of int64 keys and int32 values made by "
                             f"CreateMap, got {got}")
        objects = np.zeros(0, np.int64) if objects is None else _tensor(objects, "pos_to_object")
        if objects.dtype != np.int64 or objects.ndim != 1:
            raise DTypeError(f"pos_to_object must be a 1-D int64 tensor, got {objects.shape} {objects.dtype}")
    if not _holds_rows(rows):
        if dedup and len(table):
            raise ShapeError(f"the reservoir is empty but object_to_pos_map holds {len(table)} objects: reset "
                             "the map with the reservoir and num_visited")
        return Reservoir(None, 0, table, objects[:0] if dedup else None)
    count = int(visited.reshape(-1)[0])
    if count < 0:
        raise ShapeError(f"num_visited must be >= 0, got {count}")
    if rows.ndim != data.ndim or rows.shape[1:] != data.shape[1:]:
        raise ShapeError(f"the reservoir's rows {rows.shape[1:]} (of {rows.shape}) do not match the data's rows "
                         f"{data.shape[1:]} (of {data.shape})")
    if not _same_type(rows.dtype, data.dtype):
        raise DTypeError(f"cannot collect {data.dtype} data into a {rows.dtype} reservoir")
    held = len(rows)
    if (held != count) if count < num_to_collect else (held < num_to_collect):
        raise ShapeError(f"the reservoir holds {held} rows, but num_visited {count} with num_to_collect "
                         f"{num_to_collect} says it holds {min(count, num_to_collect)}: reset the reservoir and "
                         "num_visited together")
    if dedup and (objects.size != held or len(table) != held):
        raise ShapeError(f"the reservoir holds {held} rows, but pos_to_object {objects.size} and "
                         f"object_to_pos_map {len(table)} objects: they must hold one per row")
    return Reservoir(rows, count, table, objects)


def visits(data_rows: int, object_id: np.ndarray | None, table: KeyValueMap | None) -> np.ndarray:
    """The data rows that count as visits, in order: all of them, or with object ids the first row of each
    object the map does not hold."""
    if object_id is None:
        return np.arange(data_rows)
    ids, first = np.unique(object_id, return_index=True)
    new = np.fromiter((k not in table for k in ids.tolist()), bool, len(ids))
    return np.sort(first[new])


def positions(visited: int, count: int, num_to_collect: int, rng) -> np.ndarray:
    """The row each of `count` visits goes to (-1: dropped): visit k (counted over all runs) is appended at k
    while k < num_to_collect, else goes to a position drawn uniformly from [0, k], dropped when that is not
    below num_to_collect."""
    k = visited + np.arange(count, dtype=np.int64)
    pos = k.copy()
    full = k >= num_to_collect
    if full.any():
        drawn = rng.integers(0, k[full] + 1)
        pos[full] = np.where(drawn < num_to_collect, drawn, -1)
    return pos


def grown_rows(state: Reservoir, new: int, num_to_collect: int) -> int:
    """The reservoir's rows after `new` visits (it grows up to num_to_collect; one already larger is kept)."""
    held = 0 if state.rows is None else len(state.rows)
    return held if held >= num_to_collect else min(num_to_collect, held + new)


def sample(state: Reservoir, data: np.ndarray, taken: np.ndarray, object_id, num_to_collect: int, rng) -> Reservoir:
    """The state after visiting data's rows `taken` (visits' answer; the inputs are not changed)."""
    dedup = state.table is not None and object_id is not None
    pos = positions(state.visited, len(taken), num_to_collect, rng)
    n = grown_rows(state, len(taken), num_to_collect)
    dtype = data.dtype if state.rows is None else _joined_dtype(state.rows.dtype, data.dtype)
    rows = np.zeros((n, *data.shape[1:]), dtype)
    if state.rows is not None:
        rows[:min(n, len(state.rows))] = state.rows[:n]
    kept = pos >= 0
    src, dst = taken[kept], pos[kept]
    if dst.size:    # a slot written twice keeps the later row
        last = len(dst) - 1 - np.unique(dst[::-1], return_index=True)[1]
        rows[dst[last]] = data[src[last]]
    table, objects = state.table, state.objects
    if dedup:
        table = type(table)(table)
        objects = np.concatenate([objects[:n], np.zeros(max(0, n - len(objects)), np.int64)])
        replacing = (state.visited + np.flatnonzero(kept)) >= num_to_collect
        for i, slot, replace in zip(src.tolist(), dst.tolist(), replacing.tolist()):
            if replace:
                table.pop(int(objects[slot]), None)
            new_id = int(object_id[i])
            objects[slot] = new_id
            table[new_id] = slot
    return Reservoir(rows, state.visited + len(taken), table, objects)


def _check_call(inputs: tuple, outputs: int, num_to_collect: int) -> None:
    if not 0 < num_to_collect <= INT32_MAX:
        raise ArgumentError(f"num_to_collect must be between 1 and {INT32_MAX}, got {num_to_collect}")
    if len(inputs) == 5:
        raise ArityError("object_id (input 4) needs object_to_pos_map (input 5) and pos_to_object (input 6) too: "
                         "give 4 or 7 inputs")
    if len(inputs) // 3 != outputs // 2:
        raise ArityError(f"with {len(inputs)} inputs ReservoirSampling has {2 if len(inputs) < 6 else 4} outputs "
                         f"(reservoir, num_visited{'' if len(inputs) < 6 else ', the map, pos_to_object'}), got "
                         f"{outputs}")


def _reservoir_shape(specs, **_):
    held_object(specs[3], Mutex, 3, "a mutex", "CreateMutex")   # (a known spec is a tensor: refused statically)
    return []


@op("ReservoirSampling", inputs=(4, 7), outputs=(2, 4), enforce_inplace=[(0, 0), (1, 1), (5, 2), (6, 3)],
    context=True, random=True, devices="any", gradient=SHOULD_NOT_DO_GRADIENT, shape=_reservoir_shape,
    args={"num_to_collect": -1})
def reservoir_sampling(ctx, xp, reservoir, num_visited, data, mutex, *extra, num_to_collect, rng):
    """In place, holding the mutex: reservoir-sample the rows of DATA (input 2, at least 1-D) into RESERVOIR
    (input 0, output 0; starts empty, then holds up to num_to_collect rows of DATA's dtype and row shape),
    counting them in NUM_VISITED (input 1, output 1, an int64 scalar). With OBJECT_ID (input 4, int64, one per
    row), OBJECT_TO_POS_MAP (input 5, output 2; CreateMap int64 -> int32) and POS_TO_OBJECT (input 6, output 3;
    int64) a row whose object the reservoir holds, or that the batch already had, is skipped. An empty DATA
    leaves the state as it is (an empty reservoir takes its dtype and shape)."""
    _check_call((reservoir, num_visited, data, mutex, *extra), len(ctx.outputs), num_to_collect)
    held_object(mutex, Mutex, 3, "a mutex", "CreateMutex")
    data = _tensor(data, "input 2 (data)")
    if data.ndim < 1:
        raise ShapeError(f"input 2 (data) must have at least 1 dim (its rows), got {data.shape}")
    object_id = None
    if extra:
        object_id = _tensor(extra[0], "input 4 (object_id)")
        if object_id.dtype != np.int64:
            raise DTypeError(f"input 4 (object_id) must be int64, got {object_id.dtype}")
        if object_id.shape != (len(data),):
            raise ShapeError(f"input 4 (object_id) must have one id per data row, shape ({len(data)},), got "
                             f"{object_id.shape}")
    with mutex:    # the state as it is now (another thread may have sampled since the inputs were read)
        current = [ctx.inputs[i].value for i in (0, 1)]
        dedup = len(ctx.inputs) > 5
        table = ctx.inputs[5].value if dedup else None
        objects = (ctx.inputs[6] if len(ctx.inputs) > 6 else ctx.outputs[3]).value if dedup else None
        state = read_state(*current, data, num_to_collect, table, objects, dedup)
        if len(data) == 0:
            if state.rows is None:
                ctx.outputs[0].set(data.copy())
            return (None,) * len(ctx.outputs)
        taken = visits(len(data), object_id if dedup else None, table)
        n = grown_rows(state, len(taken), num_to_collect)
        check_sizes(ctx, [(0, (n, *data.shape[1:]), data.dtype)] + ([(3, (n,), np.int64)] if dedup else []))
        after = sample(state, data, taken, object_id, num_to_collect, rng)
        ctx.outputs[0].set(after.rows)
        ctx.outputs[1].set(np.full_like(_tensor(current[1], "num_visited"), after.visited))
        if dedup:
            ctx.outputs[2].set(after.table)
            ctx.outputs[3].set(after.objects)
    return (None,) * len(ctx.outputs)
