"""Rebatching queues (Caffe2's caffe2/queue/rebatching_queue): CreateRebatchingQueue, EnqueueRebatchingQueue,
DequeueRebatchingQueue, CloseRebatchingQueue.

A queue is an opaque blob value (RebatchingQueue): up to `capacity` elements, each `num_blobs` tensors. An
enqueue puts one element (the input tensors, copied) or, with enqueue_batch, one per row of the inputs (split
along their first axis); a dequeue takes num_elements of them and stacks each component along a new first axis,
so batches of one size go in and batches of another come out. A closed queue takes no more elements and gives
what it still holds (a dequeue then may get fewer than asked; none left is a failure).

As in Caffe2, an enqueue puts what fits and waits for room for the rest, and a dequeue takes what there is and
waits for the rest (closing the queue wakes both: the enqueue then fails, the dequeue returns what it has), but
only while another thread of the run could still make progress (core.waits): when every thread waits, or the
op's thread runs alone, the wait is an error naming the queue."""
from __future__ import annotations

import collections

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, OpError, ShapeError
from ..core.waits import Group, Signal
from .base import held_object
from .registry import NO_GRADIENT, op


class RebatchingQueue:
    """Elements (tuples of num_blobs host arrays) in FIFO order, at most `capacity` of them, under `signal`'s
    lock."""

    def __init__(self, name: str, capacity: int, num_blobs: int):
        self.name, self.capacity, self.num_blobs = name, capacity, num_blobs
        self.elements: collections.deque = collections.deque()
        self.closed = False
        self.signal = Signal()

    def put(self, elements: list, group: Group | None = None, label=None) -> None:
        """Append the elements, waiting for room as they go in (without a group the thread runs alone)."""
        group, done = group or Group(), 0
        with self.signal:
            while done < len(elements):
                held = len(self.elements)
                self.signal.wait(lambda: self.closed or len(self.elements) < self.capacity, group, label,
                                 f"rebatching queue {self.name!r} is open and full ({held} of {self.capacity} "
                                 f"elements), with {len(elements) - done} more to enqueue", "dequeue from it",
                                 "dequeue first, put the consumer in a concurrent substep, or create the queue "
                                 "with a larger capacity")
                if self.closed:
                    more = f" ({done} of the {len(elements)} elements went in)" if done else ""
                    raise OpError(f"rebatching queue {self.name!r} is closed: nothing more can be enqueued{more}")
                room = self.capacity - len(self.elements)
                self.elements.extend(elements[done:done + room])
                done += room
                self.signal.notify()

    def take(self, count: int, group: Group | None = None, label=None) -> list:
        """count elements, waiting for them while the queue is open; fewer (at least one) when it closes. A wait
        that fails (a deadlock, a stopped run) puts the elements taken so far back in front."""
        group, rows = group or Group(), []
        with self.signal:
            while len(rows) < count:
                held = len(self.elements) + len(rows)
                try:
                    self.signal.wait(lambda: self.closed or self.elements, group, label,
                                     f"rebatching queue {self.name!r} is open and holds {held} element(s), fewer "
                                     f"than the {count} asked", "enqueue into it",
                                     "enqueue first, put the producer in a concurrent substep, or close the queue")
                except BaseException:
                    self.elements.extendleft(reversed(rows))
                    raise
                if not self.elements:
                    break
                while self.elements and len(rows) < count:
                    rows.append(self.elements.popleft())
                self.signal.notify()
        if not rows:
            raise OpError(f"rebatching queue {self.name!r} is closed and empty: nothing left to dequeue")
        return rows

    def close(self) -> None:
        with self.signal:
            self.closed = True
            self.signal.notify()

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return (f"RebatchingQueue({self.name!r}, {len(self.elements)}/{self.capacity} elements of "
                f"{self.num_blobs} blob(s), {state})")


def _queue(value) -> RebatchingQueue:
    return held_object(value, RebatchingQueue, 0, "a queue", "CreateRebatchingQueue")


def _waiter(ctx) -> tuple:
    """(the group of the thread running the op, the op's place): what a queue's wait needs."""
    return ctx.workspace.waits.group(), ctx.label


def _queue_shape(specs, **_):
    _queue(specs[0])   # (a known spec is a tensor: an error before anything runs)
    return []


@op("CreateRebatchingQueue", inputs=0, outputs=1, context="structure", gradient=NO_GRADIENT,
    args={"capacity": 1, "num_blobs": 1})
def create_rebatching_queue(ctx, xp, *, capacity, num_blobs):
    """An empty open queue of at most `capacity` elements of `num_blobs` tensors each."""
    if capacity < 1 or num_blobs < 1:
        raise ArgumentError(f"capacity and num_blobs must be >= 1, got capacity={capacity}, num_blobs={num_blobs}")
    return RebatchingQueue(ctx.opdef.output[0], capacity, num_blobs)


def _host(x, i: int) -> np.ndarray:
    if not hasattr(x, "dtype"):
        raise DTypeError(f"input {i} must be a tensor, got {'nothing' if x is None else type(x).__name__}")
    return np.array(backend.to_host(x), copy=True)


@op("EnqueueRebatchingQueue", inputs=(2, None), outputs=0, context=True, gradient=NO_GRADIENT,
    args={"enqueue_batch": False}, shape=_queue_shape)
def enqueue_rebatching_queue(ctx, xp, queue, *tensors, enqueue_batch):
    """Put the tensors (one per component) into the queue as one element, or with enqueue_batch one element per
    row: every tensor is split along its first axis, which must be the same size for all. Waits for room while
    the queue is full and open (core.waits); fails on a closed queue."""
    queue = _queue(queue)
    if len(tensors) != queue.num_blobs:
        raise ArityError(f"rebatching queue {queue.name!r} holds elements of {queue.num_blobs} tensor(s), but the "
                         f"op enqueues {len(tensors)}")
    arrays = [_host(x, i + 1) for i, x in enumerate(tensors)]
    if not enqueue_batch:
        queue.put([tuple(arrays)], *_waiter(ctx))
        return
    if any(a.ndim < 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
        raise ShapeError(f"enqueue_batch splits every tensor along its first axis, which must be the same size for "
                         f"all of them; got shapes {[a.shape for a in arrays]}")
    queue.put([tuple(a[r].copy() for a in arrays) for r in range(arrays[0].shape[0])], *_waiter(ctx))


@op("DequeueRebatchingQueue", inputs=1, outputs=(1, None), context=True, gradient=NO_GRADIENT,
    args={"num_elements": 1}, shape=_queue_shape)
def dequeue_rebatching_queue(ctx, xp, queue, *, num_elements):
    """Take num_elements elements, waiting for them while the queue is open (core.waits; fewer if it is closed
    and holds fewer; none is a failure), and stack
    each component's tensors along a new first axis: output j has shape [taken] + the component's shape. The
    taken elements' components must agree in shape and dtype."""
    queue = _queue(queue)
    if num_elements < 1:
        raise ArgumentError(f"num_elements must be >= 1, got {num_elements}")
    if len(ctx.opdef.output) != queue.num_blobs:
        raise ArityError(f"rebatching queue {queue.name!r} holds elements of {queue.num_blobs} tensor(s), but the "
                         f"op has {len(ctx.opdef.output)} outputs")
    rows = queue.take(num_elements, *_waiter(ctx))
    outs = []
    for j in range(queue.num_blobs):
        parts = [row[j] for row in rows]
        first = parts[0]
        bad = next((p for p in parts if p.shape != first.shape or p.dtype != first.dtype), None)
        if bad is not None:
            raise ShapeError(f"rebatching queue {queue.name!r}, component {j}: elements of {first.shape} "
                             f"{first.dtype} and {bad.shape} {bad.dtype} cannot be stacked into one batch")
        outs.append(np.stack(parts))
    return tuple(outs)


@op("CloseRebatchingQueue", inputs=1, outputs=0, gradient=NO_GRADIENT, shape=_queue_shape)
def close_rebatching_queue(xp, queue):
    """Close the queue: enqueues fail from now on; dequeues take what it still holds."""
    _queue(queue).close()
