"""Blob queues (Caffe2's caffe2/queue): CreateBlobsQueue, EnqueueBlobs, DequeueBlobs, CloseBlobsQueue,
SafeEnqueueBlobs, SafeDequeueBlobs, WeightedSampleDequeueBlobs; CreateBlobsQueueDB (a DB reader over a queue).

A queue is an opaque blob value (BlobsQueue): `capacity` records of `num_blobs` blobs each, created in the
workspace as `<queue>_<record>_<column>` as Caffe2 creates them. Writing and reading swap the contents of the
op's blobs with a record's, as Caffe2's BlobsQueue does, so an enqueued blob is left holding what the record
held (nothing, the first time round). A closed queue still takes writes while it has room and gives its
remaining records; past that, writes and reads fail, and the Safe ops set their status output (the last one)
to true instead, the end-of-data signal a plan's should_stop_blob reads.

A write to a full open queue waits for a reader, a read from an empty open one for a writer (closing the queue
wakes them), as in Caffe2, but only while another thread of the run could still make progress (core.waits):
when every thread waits, or the op's thread runs alone, the wait is an error naming the queue."""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, OpError, ShapeError
from ..core.waits import Group, Signal
from ..io.dbreader import DBReader
from .base import on_device
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op

MAX_BLOBS = 1024  # the in-place pairs declared for Enqueue ops (input i + 1 is output i)
IN_PLACE = [(i + 1, i) for i in range(MAX_BLOBS)]
READ_HINT = ("enqueue first, put the producer in a concurrent substep, or close the queue (CloseBlobsQueue) to end "
             "the data")
WRITE_HINT = "dequeue first, put the consumer in a concurrent substep, or create the queue with a larger capacity"


class BlobsQueue:
    """A ring of `capacity` records, each a list of `num_blobs` workspace Blobs; `reader` and `writer` count
    the records read and written so far (Caffe2's reader_/writer_), under `signal`'s lock."""

    def __init__(self, name: str, records: list, num_blobs: int, field_names=()):
        self.name, self.records, self.num_blobs = name, records, num_blobs
        self.field_names = list(field_names)
        self.reader = self.writer = 0
        self.closing = False
        self.signal = Signal()

    @property
    def capacity(self) -> int:
        return len(self.records)

    def __len__(self) -> int:
        return self.writer - self.reader

    def check_blobs(self, count: int, what: str) -> None:
        if count != self.num_blobs:
            raise ArityError(f"queue {self.name!r} holds records of {self.num_blobs} blob(s), but the op {what} "
                             f"{count}")

    def write(self, blobs, group: Group | None = None, label=None) -> bool:
        """Swap blobs into the next free record, waiting for room while the queue is full and open; False when
        it is closed and full. Without a group the op's thread is taken to run alone."""
        with self.signal:
            self.signal.wait(lambda: self.closing or len(self) < self.capacity, group or Group(), label,
                             f"queue {self.name!r} is full ({self.capacity} records) and open", "read from it",
                             WRITE_HINT)
            if len(self) == self.capacity:
                return False
            _swap(blobs, self.records[self.writer % self.capacity], copy_views=True)
            self.writer += 1
            self.signal.notify()
            return True

    def read(self, blobs, group: Group | None = None, label=None, timeout: float = 0.0) -> bool:
        """Swap the oldest record into blobs, waiting for one while the queue is empty and open (up to timeout
        seconds when > 0: then an error); False when it is closed and empty."""
        with self.signal:
            if not self.signal.wait(lambda: self.closing or len(self) > 0, group or Group(), label,
                                    f"queue {self.name!r} is empty and open", "write to it", READ_HINT,
                                    timeout=timeout if timeout > 0 else None):
                raise OpError(f"queue {self.name!r}: no record came within timeout_secs={timeout:g}")
            if not len(self):
                return False
            _swap(blobs, self.records[self.reader % self.capacity])
            self.reader += 1
            self.signal.notify()
            return True

    def close(self) -> None:
        """No more records: waiting writers and readers wake (a closed queue still drains)."""
        with self.signal:
            self.closing = True
            self.signal.notify()

    def __repr__(self):
        state = "closed" if self.closing else "open"
        return f"BlobsQueue({self.name!r}, {len(self)}/{self.capacity} records of {self.num_blobs} blob(s), {state})"


def _swap(blobs, record, copy_views: bool = False) -> None:
    """Exchange the values of blobs[j] and record[j]. A view (a window into a larger tensor) enters the queue
    as a copy, so later writes into that tensor cannot change a queued record."""
    for blob, slot in zip(blobs, record):
        value = blob.value
        if copy_views and blob.view and value is not None:
            value = value.copy()
        blob.value, slot.value = slot.value, value
        blob.view = slot.view = False


def _waiter(ctx) -> tuple:
    """(the group of the thread running the op, the op's place): what a queue's wait needs."""
    return ctx.workspace.waits.group(), ctx.label


def _queue(value, i: int = 0) -> BlobsQueue:
    if not isinstance(value, BlobsQueue):
        what = "nothing (never written)" if value is None else type(value).__name__
        raise DTypeError(f"input {i} must be a queue made by CreateBlobsQueue, got {what}")
    return value


def _status(xp, failed: bool):
    """Caffe2's status output: a 0-d bool tensor, true when the op could not move a record."""
    return on_device(xp, failed, np.bool_)


def _queue_alloc(*_, capacity, num_blobs, **__):
    """What CreateBlobsQueue allocates, counted as a capacity x num_blobs array of blob pointers."""
    return [(0, (max(int(capacity), 0), max(int(num_blobs), 0)), np.object_)]


@op("CreateBlobsQueue", inputs=0, outputs=1, context=True, devices="any", gradient=NO_GRADIENT,
    args={"capacity": 1, "num_blobs": 1, "enforce_unique_name": False, "field_names": Arg("strs", [])},
    alloc=_queue_alloc, writes_unnamed=True)
def create_blobs_queue(ctx, xp, *, capacity, num_blobs, enforce_unique_name, field_names):
    """A queue of `capacity` records of `num_blobs` blobs, named after its output blob; its record blobs
    `<queue>_<i>_<j>` are created in the workspace (enforce_unique_name: none of them may exist yet). field_names
    (optional) names the columns."""
    if capacity < 1 or num_blobs < 1:
        raise ArgumentError(f"capacity and num_blobs must be >= 1, got capacity={capacity}, num_blobs={num_blobs}")
    if field_names and len(field_names) != num_blobs:
        raise ArgumentError(f"field_names has {len(field_names)} names for num_blobs={num_blobs}")
    name = ctx.opdef.output[0]
    ws = ctx.workspace
    names = [[f"{name}_{i}_{j}" for j in range(num_blobs)] for i in range(capacity)]
    if enforce_unique_name:
        taken = [n for row in names for n in row if ws.has(n)]
        if taken:
            raise ArgumentError(f"queue internal blob {taken[0]!r} already exists (enforce_unique_name)")
    return BlobsQueue(name, [[ws.create_blob(n) for n in row] for row in names], num_blobs, field_names)


@op("EnqueueBlobs", inputs=(2, None), outputs=(1, None), enforce_inplace=IN_PLACE, context=True, devices="any",
    gradient=NO_GRADIENT, writes_unnamed=True)
def enqueue_blobs(ctx, xp, queue, *_):
    """Put the data blobs (inputs 1..n, written in place as outputs 0..n-1) into the queue as one record; they are
    left holding the record's old contents. Waits for room while the queue is full and open (core.waits); fails
    on a closed full queue."""
    queue = _queue(queue)
    _check_counts(ctx, len(ctx.outputs), "enqueues")
    queue.check_blobs(len(ctx.outputs), "enqueues")
    if not queue.write(ctx.outputs, *_waiter(ctx)):
        raise OpError(f"queue {queue.name!r} is closed and full: the record cannot be enqueued")


@op("DequeueBlobs", inputs=1, outputs=(1, None), context=True, devices="any", gradient=NO_GRADIENT,
    args={"timeout_secs": 0.0}, writes_unnamed=True)
def dequeue_blobs(ctx, xp, queue, *, timeout_secs):
    """Take the oldest record into the outputs, waiting for one while the queue is empty and open (core.waits; at
    most timeout_secs when > 0, then it fails). Fails on a closed empty queue."""
    queue = _queue(queue)
    queue.check_blobs(len(ctx.outputs), "dequeues")
    if not queue.read(ctx.outputs, *_waiter(ctx), timeout=timeout_secs):
        raise OpError(f"queue {queue.name!r} is closed and empty: no record left to dequeue")


@op("CloseBlobsQueue", inputs=1, outputs=0, context=True, devices="any", gradient=NO_GRADIENT)
def close_blobs_queue(ctx, xp, queue):
    """Close the queue: it still takes writes while it has room and gives its remaining records; then enqueues
    and dequeues fail (the Safe ops report it in their status)."""
    _queue(queue).close()


@op("SafeEnqueueBlobs", inputs=(2, None), outputs=(2, None), enforce_inplace=IN_PLACE, context=True,
    devices="any", gradient=NO_GRADIENT, writes_unnamed=True)
def safe_enqueue_blobs(ctx, xp, queue, *_):
    """EnqueueBlobs with a status output (the last output): true when the queue was closed and full, so nothing
    was enqueued. Waits for room as EnqueueBlobs does."""
    queue = _queue(queue)
    n = len(ctx.outputs) - 1
    _check_counts(ctx, n, "enqueues", status=True)
    queue.check_blobs(n, "enqueues")
    ok = queue.write(ctx.outputs[:n], *_waiter(ctx))
    return (None,) * n + (_status(xp, not ok),)


@op("SafeDequeueBlobs", inputs=1, outputs=(2, None), context=True, devices="any", gradient=NO_GRADIENT,
    args={"num_records": 1}, writes_unnamed=True)
def safe_dequeue_blobs(ctx, xp, queue, *, num_records):
    """DequeueBlobs with a status output (the last output): true when the queue was closed and empty (it waits
    for a record as DequeueBlobs does, with no timeout). With
    num_records > 1 up to that many records are read and each column's tensors are concatenated along their
    first axis (every record's tensors must be at least 1-D); the status is false if at least one was read."""
    queue = _queue(queue)
    if num_records < 1:
        raise ArgumentError(f"num_records must be >= 1, got {num_records}")
    n = len(ctx.outputs) - 1
    queue.check_blobs(n, "dequeues")
    if num_records == 1:
        ok = queue.read(ctx.outputs[:n], *_waiter(ctx))
        return (None,) * n + (_status(xp, not ok),)
    scratch = [type(b)(b.name + "#scratch") for b in ctx.outputs[:n]]   # per call: concurrent instances share ops
    columns = [[] for _ in range(n)]
    for _ in range(num_records):
        if not queue.read(scratch, *_waiter(ctx)):
            break
        for j, blob in enumerate(scratch):
            if getattr(blob.value, "ndim", 0) < 1:
                raise ShapeError(f"queue {queue.name!r}, column {j}: dequeuing several records concatenates "
                                 f"tensors along their first axis, but this one is {_describe(blob.value)}")
            columns[j].append(blob.value)
    if not columns[0]:
        return (None,) * n + (_status(xp, True),)
    outs = tuple(_concatenate(queue, j, parts) for j, parts in enumerate(columns))
    return outs + (_status(xp, False),)


@op("WeightedSampleDequeueBlobs", inputs=(1, None), outputs=(2, None), context=True, devices="any", random=True,
    gradient=NO_GRADIENT, args={"weights": Arg("floats", []), "table_idx_blob": -1}, writes_unnamed=True)
def weighted_sample_dequeue_blobs(ctx, xp, *queues, weights, table_idx_blob, rng):
    """Pick one input queue at random with probability proportional to `weights` (default: equal) and dequeue
    one record from it into the outputs (all but the last, the status: true when that queue was closed and
    empty). table_idx_blob >= 0: that output then holds the picked queue's index (int32, shape [1])."""
    n = len(ctx.outputs) - 1
    if table_idx_blob >= n:
        raise ArgumentError(f"table_idx_blob must be below {n} (an output other than the status), got "
                            f"{table_idx_blob}")
    weights = list(weights) or [1.0] * len(queues)
    if len(weights) != len(queues):
        raise ArgumentError(f"weights has {len(weights)} entries for {len(queues)} queues")
    if any(w < 0 for w in weights) or not sum(weights) > 0:
        raise ArgumentError(f"weights must be >= 0 with a positive sum, got {weights}")
    cumulative = np.cumsum(np.asarray(weights, np.float32) / np.float32(sum(weights)))
    cumulative[-1] = np.float32(1.0001)  # as Caffe2 does, against rounding
    index = int(np.searchsorted(cumulative, np.float32(rng.random()), side="left"))
    queue = _queue(queues[index], index)
    queue.check_blobs(n, "dequeues")
    ok = queue.read(ctx.outputs[:n], *_waiter(ctx))
    outs = [None] * n
    if table_idx_blob >= 0:
        outs[table_idx_blob] = on_device(xp, [index], np.int32)
    return tuple(outs) + (_status(xp, not ok),)


def _check_counts(ctx, data: int, what: str, status: bool = False) -> None:
    """The Enqueue ops' arity rule: one data input per data output, after the queue."""
    if len(ctx.inputs) - 1 != data:
        extra = " plus the status" if status else ""
        raise ArityError(f"{ctx.opdef.type} takes the queue and n data inputs, and the same n data blobs as "
                         f"outputs{extra}; got {len(ctx.inputs)} inputs and {len(ctx.outputs)} outputs")


def _concatenate(queue: BlobsQueue, column: int, parts: list):
    first = parts[0]
    for p in parts[1:]:
        if p.shape[1:] != first.shape[1:] or p.dtype != first.dtype:
            raise ShapeError(f"queue {queue.name!r}, column {column}: records of {_describe(first)} and "
                             f"{_describe(p)} cannot be concatenated (inner dims and dtypes must agree)")
    mod = backend.array_module(backend.device_of(first))
    return mod.concatenate(parts, axis=0)


def _describe(value) -> str:
    if value is None:
        return "empty"
    shape = getattr(value, "shape", None)
    return f"{tuple(shape)} {value.dtype}" if shape is not None else type(value).__name__


# --------------------------------------------------------------------------------------------- queue as a DB
class BlobsQueueDBReader(DBReader):
    """A DB reader (what TensorProtosDBInput reads) whose records come from a BlobsQueue: each read dequeues one
    record and takes its value (and key, if key_blob_index >= 0) from the record's blobs, each a string or a
    string tensor (its first element). The queue never wraps around as a file does: reading an empty queue is
    an error (the reader is not told which run's threads could fill it, so it waits for none)."""

    def __init__(self, queue: BlobsQueue, key_blob_index: int, value_blob_index: int):
        self.queue, self.key_blob_index, self.value_blob_index = queue, key_blob_index, value_blob_index
        self.source, self.db_type, self.num_shards, self.shard_id = f"queue {queue.name!r}", "BlobsQueueDB", 1, 0
        self.pos = 0
        self._scratch = [type(b)(f"{queue.name}#db{j}") for j, b in enumerate(queue.records[0])]

    def open(self, limits, where: str) -> "BlobsQueueDBReader":
        return self

    def seek_to_first(self) -> None:
        self.pos = 0

    def read(self) -> tuple[str, bytes, str]:
        where = f"{self.source}, record {self.pos}"
        if not self.queue.read(self._scratch):
            raise OpError(f"queue {self.queue.name!r} is closed and empty: the DB reader has no record left")
        self.pos += 1
        try:
            key = self._string(self.key_blob_index, where).decode("utf-8", "replace") \
                if self.key_blob_index >= 0 else ""
            return key, self._string(self.value_blob_index, where), where
        finally:
            for blob in self._scratch:
                blob.value = None

    def rest(self):
        while len(self.queue):
            yield self.read()

    def where(self, i: int) -> str:
        return f"{self.source}, record {i}"

    def _string(self, j: int, where: str) -> bytes:
        value = self._scratch[j].value
        if isinstance(value, np.ndarray) and value.dtype == object and value.size:
            value = value.reshape(-1)[0]
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, bytes):
            return value
        raise DTypeError(f"{where}: blob {j} must be a string or a string tensor, got {_describe(value)}")

    def __repr__(self):
        return f"BlobsQueueDBReader({self.queue!r}, record {self.pos})"


@op("CreateBlobsQueueDB", inputs=1, outputs=1, gradient=SHOULD_NOT_DO_GRADIENT,
    args={"key_blob_index": -1, "value_blob_index": 0, "timeout_secs": 0.0})
def create_blobs_queue_db(xp, queue, *, key_blob_index, value_blob_index, timeout_secs):
    """A DB reader over the queue: each record read dequeues one queue record, the value (a serialized
    TensorProtos, for TensorProtosDBInput) from blob value_blob_index and the key from key_blob_index (-1:
    none). timeout_secs is accepted; the reader does not wait: an empty queue fails at once."""
    queue = _queue(queue)
    for name, index, low in (("value_blob_index", value_blob_index, 0), ("key_blob_index", key_blob_index, -1)):
        if not low <= index < queue.num_blobs:
            raise ArgumentError(f"{name} must be in [{low}, {queue.num_blobs}) for a queue of {queue.num_blobs} "
                                f"blob(s), got {index}")
    return BlobsQueueDBReader(queue, key_blob_index, value_blob_index)
