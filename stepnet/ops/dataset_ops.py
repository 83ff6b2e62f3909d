"""Dataset cursors (Caffe2's dataset_ops): CreateTreeCursor, ResetCursor, ReadNextBatch, ComputeOffset,
SortAndShuffle, ReadRandomBatch; the fields' domains (Tree) the dataset ops share.

A dataset is one tensor per field, the fields named by the `fields` argument (names whose parts are joined by
':'). A field named "<prefix>:lengths" (int32, 1-D) defines the domain "<prefix>": one length per entry of its
own domain, the entries of the domain "<prefix>" they count laid end to end. Every other field belongs to the
domain of the lengths field with the longest matching prefix (the top level when none matches) and has one
entry per row of its dim 0; a lengths field comes before the fields of its domain. A cursor (TreeCursor, an
opaque blob value) holds one offset per domain: the next top-level entry, and where its data starts in each
domain. Lengths that run past their domain's fields, offsets out of range and cursors past the end are errors
naming the field."""
from __future__ import annotations

import threading

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, FileFormatError, OpError, ShapeError
from ..core.limits import check_blob
from ..io.blobs import register_blob_type
from ..io.proto import BlobProto, DataType, TensorProto
from .base import held_object
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op

CURSOR_TYPE = "std::unique_ptr<TreeCursor>"
FIELDS = {"fields": Arg("strs", [])}


class Tree:
    """The domains of a field list (Caffe2's TreeIterator): domain 0 is the top level, domain k + 1 the one the
    k-th lengths field defines. domain[i]: field i's domain; parent[k]: the domain lengths field k belongs to."""

    def __init__(self, names):
        if not names:
            raise ArgumentError("fields is empty: a dataset needs at least one field")
        self.names = [str(n) for n in names]
        parts = [n.split(":") for n in self.names]
        self.length_ids = [i for i, p in enumerate(parts) if p[-1] == "lengths"]
        self.domain = []
        for i, p in enumerate(parts):
            best, level = 0, 1
            for k, lid in enumerate(self.length_ids):
                prefix = parts[lid][:-1]
                if lid != i and len(parts[lid]) > level and p[:len(prefix)] == prefix:
                    best, level = k + 1, len(parts[lid])
            self.domain.append(best)
        for i, d in enumerate(self.domain):
            if d and self.length_ids[d - 1] > i:
                lid = self.length_ids[d - 1]
                raise ArgumentError(f"field {i} ({self.names[i]!r}) belongs to the domain of field {lid} "
                                    f"({self.names[lid]!r}), which comes after it: a lengths field must come "
                                    "before the fields of its domain")
        self.parent = [self.domain[lid] for lid in self.length_ids]

    @property
    def domains(self) -> int:
        return len(self.length_ids) + 1


class TreeCursor:
    """Caffe2's TreeCursor: a Tree and the offsets reached in each domain (empty: at the start), changed under
    a lock so concurrent readers share it."""
    __slots__ = ("tree", "offsets", "lock")

    def __init__(self, tree: Tree, offsets=()):
        self.tree, self.offsets, self.lock = tree, [int(o) for o in offsets], threading.Lock()

    def __repr__(self):
        return f"TreeCursor({len(self.tree.names)} fields, offsets {self.offsets})"


def _cursor(value, i: int = 0) -> TreeCursor:
    return held_object(value, TreeCursor, i, "a cursor", "CreateTreeCursor")


def _on_cursor(specs, **_):
    _cursor(specs[0])   # (a known spec is a tensor: an error before anything runs)
    return []


def field_tensors(tree: Tree, arrays, first: int) -> list:
    """The field tensors (inputs first, first + 1, ...) on the host, one per field, each at least 1-D."""
    if len(arrays) != len(tree.names):
        raise ArityError(f"the dataset has {len(tree.names)} fields, but the op gives {len(arrays)} field tensors "
                         f"(inputs {first} on)")
    out = []
    for i, x in enumerate(arrays):
        if not hasattr(x, "shape"):
            raise DTypeError(f"input {first + i} (field {tree.names[i]!r}) must be a tensor, got "
                             f"{'nothing (never written)' if x is None else type(x).__name__}")
        x = np.asarray(backend.to_host(x))
        if x.ndim < 1:
            raise ShapeError(f"input {first + i} (field {tree.names[i]!r}) is 0-d; a field holds its entries "
                             "along dim 0")
        out.append(x)
    return out


def domain_sizes(tree: Tree, fields: list, exact: bool = False) -> list:
    """Entries of each domain: the fewest rows among its fields (None for a domain without fields); exact: its
    fields must agree."""
    limits = [None] * tree.domains
    for i, x in enumerate(fields):
        d, n = tree.domain[i], int(x.shape[0])
        if exact and limits[d] is not None and limits[d] != n:
            raise ShapeError(f"field {i} ({tree.names[i]!r}) has {n} entries, but an earlier field of its domain "
                             f"has {limits[d]}: fields of one domain must have as many entries")
        limits[d] = n if limits[d] is None else min(limits[d], n)
    return limits


def lengths_of(tree: Tree, fields: list) -> list:
    """Each lengths field's values as int64 (an empty one of any dtype reads as no lengths)."""
    out = []
    for lid in tree.length_ids:
        x = fields[lid]
        if x.size and (x.dtype != np.int32 or x.ndim != 1):
            raise DTypeError(f"field {lid} ({tree.names[lid]!r}) is a lengths field: it must be a 1-D int32 "
                             f"tensor, got {x.shape} {x.dtype}")
        out.append(x.astype(np.int64) if x.size else np.zeros(0, np.int64))
    return out


def walk(tree: Tree, lengths: list, limits: list, start, tops) -> np.ndarray:
    """The offsets (len(tops) x domains, int64) once the top level is at tops[r] (ascending, from start[0]),
    starting from offsets `start`; an error if some lengths run past their domain's entries."""
    start = [int(s) for s in start]
    if limits[0] is not None and start[0] > limits[0]:
        raise OpError(f"the cursor is at top-level entry {start[0]}, past the dataset's {limits[0]} entries; "
                      "reset it (ResetCursor)")
    table = np.empty((len(tops), tree.domains), np.int64)
    table[:, 0] = tops
    for k, lid in enumerate(tree.length_ids):
        col = table[:, tree.parent[k]]
        lo, hi = int(col[0]), int(col[-1])
        part = lengths[k][lo:hi]
        if part.size < hi - lo or (part < 0).any():
            bad = "a negative length" if part.size == hi - lo else f"{lengths[k].size} lengths, not {hi}"
            raise ShapeError(f"field {lid} ({tree.names[lid]!r}) has {bad}: lengths must be >= 0, one per entry "
                             "of its own domain")
        cum = np.concatenate(([0], np.cumsum(part, dtype=np.int64)))
        table[:, k + 1] = start[k + 1] + cum[col - lo]
        end, limit = int(table[-1, k + 1]), limits[k + 1]
        if limit is not None and end > limit:
            raise ShapeError(f"inconsistent lengths: field {lid} ({tree.names[lid]!r}) reaches entry {end} of its "
                             f"domain, whose fields have {limit} entries")
    return table


def check_outputs(ctx, n: int) -> None:
    if len(ctx.outputs) != n:
        raise ArityError(f"the dataset has {n} fields, but the op has {len(ctx.outputs)} outputs: give one per field")


def check_sizes(ctx, outputs) -> None:
    """Refuse, before anything is allocated, an output over the workspace's blob limit; outputs: (index, shape,
    dtype) of each (for ops whose output count the record's alloc cannot know)."""
    for i, shape, dtype in outputs:
        check_blob(ctx.workspace.limits.max_blob_bytes, ctx.opdef.output[i], shape, dtype, ctx.label)


def _start(cursor: TreeCursor) -> list:
    n = cursor.tree.domains
    if cursor.offsets and len(cursor.offsets) != n:
        raise OpError(f"the cursor holds {len(cursor.offsets)} offset(s), not one per domain ({n}): it was last "
                      "used by ReadRandomBatch; reset it (ResetCursor) before reading in order")
    return list(cursor.offsets) or [0] * n


@op("CreateTreeCursor", inputs=0, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT, args=FIELDS)
def create_tree_cursor(xp, *, fields):
    """A new cursor over a dataset of the given fields (names as the module docstring describes), at the start."""
    return TreeCursor(Tree(fields))


@op("ResetCursor", inputs=1, outputs=0, gradient=SHOULD_NOT_DO_GRADIENT, shape=_on_cursor)
def reset_cursor(xp, cursor):
    """Put the cursor back at the start of the dataset."""
    cursor = _cursor(cursor)
    with cursor.lock:
        cursor.offsets = []


@op("ReadNextBatch", inputs=(1, None), outputs=(1, None), context="structure", gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_on_cursor, args={"batch_size": 1, "enforce_batch_size": False})
def read_next_batch(ctx, xp, cursor, *data, batch_size, enforce_batch_size):
    """Inputs: the cursor, then the dataset's fields; outputs: one per field, the next batch_size top-level
    entries (fewer at the end, none past it) with their data in every domain, and the cursor moves past them.
    enforce_batch_size: a last batch short of batch_size comes out empty."""
    cursor = _cursor(cursor)
    if batch_size < 0:
        raise ArgumentError(f"batch_size must be >= 0, got {batch_size}")
    tree = cursor.tree
    fields = field_tensors(tree, data, 1)
    check_outputs(ctx, len(fields))
    limits, lengths = domain_sizes(tree, fields), lengths_of(tree, fields)
    with cursor.lock:
        start = _start(cursor)
        table = walk(tree, lengths, limits, start, [start[0], min(limits[0], start[0] + batch_size)])
        cursor.offsets = table[1].tolist()
    sizes = table[1] - table[0]
    if enforce_batch_size and sizes[0] < batch_size:
        sizes[:] = 0
    return tuple(x[table[0, d]:table[0, d] + sizes[d]].copy() for x, d in zip(fields, tree.domain))


def _offsets_alloc(cursor, *data, **_):
    cursor = _cursor(cursor)
    limits = domain_sizes(cursor.tree, field_tensors(cursor.tree, data, 1))
    return [(0, (limits[0] + 1, cursor.tree.domains), np.int64)]


@op("ComputeOffset", inputs=(1, None), outputs=1, gradient=SHOULD_NOT_DO_GRADIENT, shape=_on_cursor,
    alloc=_offsets_alloc)
def compute_offset(xp, cursor, *data):
    """Inputs: the cursor, then the dataset's fields. Output (int64, (entries + 1) x domains): row r the
    offsets in every domain where top-level entry r starts (from the cursor's position; the last row is the
    end). The cursor is left at the start."""
    cursor = _cursor(cursor)
    tree = cursor.tree
    fields = field_tensors(tree, data, 1)
    limits, lengths = domain_sizes(tree, fields), lengths_of(tree, fields)
    with cursor.lock:
        start = _start(cursor)
        tops = np.minimum(start[0] + np.arange(limits[0] + 1, dtype=np.int64), limits[0])
        table = walk(tree, lengths, limits, start, tops)
        cursor.offsets = [0] * tree.domains
    return table


def _shuffle(values: list) -> None:
    """std::shuffle with a fresh std::default_random_engine (minstd_rand0, seed 1), as libstdc++ of Caffe2's time
    does it: for i = 1..n-1, swap values[i] with values[uniform(0, i)], the uniform draw scaling the engine's
    range down and rejecting the remainder."""
    state, low, span = 1, 1, 2**31 - 3
    for i in range(1, len(values)):
        scaling = span // (i + 1)
        past = (i + 1) * scaling
        while True:
            state = state * 16807 % (2**31 - 1)
            draw = state - low
            if draw < past:
                break
        j = draw // scaling
        values[i], values[j] = values[j], values[i]


def _sort_alloc(cursor, *data, sort_by_field_idx, **_):
    return [(0, (_sort_size(_cursor(cursor), data, sort_by_field_idx),), np.int64)]


def _sort_size(cursor: TreeCursor, data, index: int) -> int:
    tree = cursor.tree
    if len(data) != len(tree.names):
        raise ArityError(f"the dataset has {len(tree.names)} fields, but the op gives {len(data)} field tensors")
    if not -1 <= index < len(tree.names):
        raise ArgumentError(f"sort_by_field_idx={index} is out of range for {len(tree.names)} fields (-1: no sort)")
    x = data[max(index, 0)]
    if not hasattr(x, "shape") or len(x.shape) < 1:
        raise ShapeError(f"input {max(index, 0) + 1} must be a tensor of at least 1 dim, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    return int(x.shape[0])


@op("SortAndShuffle", inputs=(1, None), outputs=1, gradient=SHOULD_NOT_DO_GRADIENT, shape=_on_cursor,
    args={"sort_by_field_idx": 1, "batch_size": 1, "shuffle_size": 1}, alloc=_sort_alloc)
def sort_and_shuffle(xp, cursor, *data, sort_by_field_idx, batch_size, shuffle_size):
    """Inputs: the cursor, then the dataset's fields. Output: the indices (int64) of the top-level entries sorted
    by the int32 top-level field sort_by_field_idx (-1: not sorted; ties keep their order), shuffled within
    chunks of batch_size * shuffle_size entries (the last, whole or not, left as it is), then cut into batches
    of batch_size whose order is shuffled (a last short batch stays last). The shuffles are Caffe2's: a fixed
    engine, the same order on every run."""
    cursor = _cursor(cursor)
    size = _sort_size(cursor, data, sort_by_field_idx)
    if batch_size < 1 or shuffle_size < 1:
        raise ArgumentError(f"batch_size and shuffle_size must be >= 1, got {batch_size} and {shuffle_size}")
    if batch_size * shuffle_size > size:
        shuffle_size = size // batch_size
    order = list(range(size))
    if sort_by_field_idx != -1:
        if cursor.tree.domain[sort_by_field_idx]:
            raise ArgumentError(f"sort_by_field_idx={sort_by_field_idx} names field "
                                f"{cursor.tree.names[sort_by_field_idx]!r}, which is not a top-level field")
        keys = np.asarray(backend.to_host(data[sort_by_field_idx]))
        if keys.dtype != np.int32:
            raise DTypeError(f"the field to sort by must be int32, got {keys.dtype}")
        order = np.argsort(keys.reshape(-1)[:size], kind="stable").tolist()
    chunk = batch_size * shuffle_size
    if chunk > 1:
        for offset in range(0, size - chunk, chunk):
            part = order[offset:offset + chunk]
            _shuffle(part)
            order[offset:offset + chunk] = part
    batches = list(range(size // batch_size))
    _shuffle(batches)
    out = [i for b in batches for i in order[b * batch_size:(b + 1) * batch_size]]
    return np.asarray(out + order[len(batches) * batch_size:], np.int64)


def _random_plan(cursor, idx, offsets, data, batch_size, enforce_batch_size, loop_over):
    """(rows of the offsets matrix this read takes, the cursor's next position, the fields, their output slices)."""
    cursor = _cursor(cursor)
    tree = cursor.tree
    fields = field_tensors(tree, data, 3)
    for name, x, dims in (("idx", idx, "at least 1"), ("offsetsmat", offsets, "2")):
        if getattr(x, "dtype", None) != np.int64 or (x.ndim != 2 if dims == "2" else x.ndim < 1):
            raise DTypeError(f"{name} must be an int64 tensor of {dims} dims, got "
                             f"{getattr(x, 'shape', type(x).__name__)} {getattr(x, 'dtype', '')}")
    idx, offsets = np.asarray(backend.to_host(idx)).reshape(-1), np.asarray(backend.to_host(offsets))
    stored = (cursor.offsets or [0])[0]
    pos = len(idx) if enforce_batch_size and stored + batch_size > len(idx) else stored
    if loop_over and pos >= len(idx):
        stored = pos = 0
    rows = idx[pos:pos + batch_size] if pos < len(idx) else idx[:0]
    if rows.size and (rows.min() < 0 or rows.max() + 1 >= offsets.shape[0]):
        raise ShapeError(f"an index of idx ({int(rows.min())}..{int(rows.max())}) is out of range for an offsets "
                         f"matrix of {offsets.shape[0]} rows (entries 0..{offsets.shape[0] - 2})")
    slices = []
    for i, (x, d) in enumerate(zip(fields, tree.domain)):
        if d >= offsets.shape[1]:
            raise ShapeError(f"the offsets matrix has {offsets.shape[1]} columns, but field {tree.names[i]!r} is in "
                             f"domain {d}")
        begin, end = offsets[rows, d], offsets[rows + 1, d]
        if rows.size and (begin.min() < 0 or (end < begin).any() or end.max() > x.shape[0]):
            raise ShapeError(f"the offsets matrix gives field {tree.names[i]!r} entries outside its "
                             f"{x.shape[0]} rows (or ending before they start)")
        slices.append(list(zip(begin.tolist(), end.tolist())))
    return stored + batch_size, fields, slices


@op("ReadRandomBatch", inputs=(3, None), outputs=(1, None), context=True, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_on_cursor, args={"batch_size": 1, "enforce_batch_size": False, "loop_over": False})
def read_random_batch(ctx, xp, cursor, idx, offsets, *data, batch_size, enforce_batch_size, loop_over):
    """Inputs: the cursor, idx (int64: the order of the top-level entries, SortAndShuffle's), offsetsmat
    (ComputeOffset's), then the dataset's fields. Outputs: one per field, the data of the next batch_size entries
    of idx; the cursor counts positions in idx. enforce_batch_size: a last batch short of batch_size comes out
    empty; loop_over: past the end, start over."""
    if batch_size < 0:
        raise ArgumentError(f"batch_size must be >= 0, got {batch_size}")
    cursor = _cursor(cursor)
    with cursor.lock:
        after, fields, slices = _random_plan(cursor, idx, offsets, data, batch_size, enforce_batch_size, loop_over)
        check_outputs(ctx, len(fields))
        check_sizes(ctx, [(i, (sum(e - b for b, e in s), *x.shape[1:]), x.dtype)
                          for i, (x, s) in enumerate(zip(fields, slices))])
        cursor.offsets = [after]
    return tuple(np.concatenate([x[:0]] + [x[b:e] for b, e in s]) for x, s in zip(fields, slices))


# --------------------------------------------------------------------------------------------- Save / Load
def _cursor_proto(cursor: TreeCursor, name: str) -> BlobProto:
    proto = BlobProto(content=" ".join(cursor.tree.names).encode() + b" ")
    if cursor.offsets:
        proto.tensor.CopyFrom(TensorProto(name=name, data_type=DataType.INT64, dims=[len(cursor.offsets)],
                                          int64_data=cursor.offsets))
    return proto


def _cursor_from_proto(proto: BlobProto) -> TreeCursor:
    try:
        tree = Tree(proto.content.decode().split())
    except (UnicodeDecodeError, ArgumentError) as e:
        raise FileFormatError(f"a saved cursor's content must list its fields: {e}") from None
    offsets = list(proto.tensor.int64_data) if proto.HasField("tensor") else []
    if offsets and len(offsets) not in (1, tree.domains):
        raise FileFormatError(f"a saved cursor over {tree.domains} domain(s) holds {len(offsets)} offsets")
    return TreeCursor(tree, offsets)


register_blob_type(TreeCursor, CURSOR_TYPE, _cursor_proto, _cursor_from_proto, whole_proto=True)
