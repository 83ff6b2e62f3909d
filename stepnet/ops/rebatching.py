"""Rebatching queues (Caffe2's caffe2/queue/rebatching_queue): CreateRebatchingQueue, EnqueueRebatchingQueue,
DequeueRebatchingQueue, CloseRebatchingQueue.

A queue is an opaque blob value (RebatchingQueue): up to `capacity` elements, each `num_blobs` tensors. An
enqueue puts one element (the input tensors, copied) or, with enqueue_batch, one per row of the inputs (split
along their first axis); a dequeue takes num_elements of them and stacks each component along a new first axis,
so batches of one size go in and batches of another come out. A closed queue takes no more elements and gives
what it still holds (a dequeue then may get fewer than asked; none left is a failure).

stepnet runs one op at a time, so an operation Caffe2 would block on (an enqueue into a full open queue, a
dequeue of more elements than an open queue holds) could never go on: it is an error naming the queue."""
from __future__ import annotations

import collections
import threading

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ArityError, DTypeError, OpError, ShapeError
from ..core.spec import TensorSpec
from .registry import NO_GRADIENT, op


class RebatchingQueue:
    """Elements (tuples of num_blobs host arrays) in FIFO order, at most `capacity` of them."""

    def __init__(self, name: str, capacity: int, num_blobs: int):
        self.name, self.capacity, self.num_blobs = name, capacity, num_blobs
        self.elements: collections.deque = collections.deque()
        self.closed = False
        self._lock = threading.Lock()

    def put(self, elements: list) -> None:
        with self._lock:
            if self.closed:
                raise OpError(f"rebatching queue {self.name!r} is closed: nothing more can be enqueued")
            if len(self.elements) + len(elements) > self.capacity:
                raise OpError(f"rebatching queue {self.name!r} holds {len(self.elements)} of {self.capacity} "
                              f"elements, no room for {len(elements)} more: Caffe2 would wait for a reader, but "
                              "stepnet runs one op at a time, so none can come; dequeue first, or create the "
                              "queue with a larger capacity")
            self.elements.extend(elements)

    def take(self, count: int) -> list:
        with self._lock:
            if len(self.elements) < count and not self.closed:
                raise OpError(f"rebatching queue {self.name!r} holds {len(self.elements)} element(s), fewer than "
                              f"the {count} asked, and is open: Caffe2 would wait for a writer, but stepnet runs "
                              "one op at a time, so none can come; enqueue first, or close the queue")
            if not self.elements:
                raise OpError(f"rebatching queue {self.name!r} is closed and empty: nothing left to dequeue")
            return [self.elements.popleft() for _ in range(min(count, len(self.elements)))]

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return (f"RebatchingQueue({self.name!r}, {len(self.elements)}/{self.capacity} elements of "
                f"{self.num_blobs} blob(s), {state})")


def _queue(value) -> RebatchingQueue:
    if not isinstance(value, RebatchingQueue):
        what = "nothing (never written)" if value is None else (
            f"a tensor {value}" if isinstance(value, TensorSpec) else type(value).__name__)
        raise DTypeError(f"input 0 must be a queue made by CreateRebatchingQueue, got {what}")
    return value


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


@op("EnqueueRebatchingQueue", inputs=(2, None), outputs=0, gradient=NO_GRADIENT, args={"enqueue_batch": False},
    shape=_queue_shape)
def enqueue_rebatching_queue(xp, queue, *tensors, enqueue_batch):
    """Put the tensors (one per component) into the queue as one element, or with enqueue_batch one element per
    row: every tensor is split along its first axis, which must be the same size for all. Fails on a closed
    queue."""
    queue = _queue(queue)
    if len(tensors) != queue.num_blobs:
        raise ArityError(f"rebatching queue {queue.name!r} holds elements of {queue.num_blobs} tensor(s), but the "
                         f"op enqueues {len(tensors)}")
    arrays = [_host(x, i + 1) for i, x in enumerate(tensors)]
    if not enqueue_batch:
        queue.put([tuple(arrays)])
        return
    if any(a.ndim < 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
        raise ShapeError(f"enqueue_batch splits every tensor along its first axis, which must be the same size for "
                         f"all of them; got shapes {[a.shape for a in arrays]}")
    queue.put([tuple(a[r].copy() for a in arrays) for r in range(arrays[0].shape[0])])


@op("DequeueRebatchingQueue", inputs=1, outputs=(1, None), context="structure", gradient=NO_GRADIENT,
    args={"num_elements": 1}, shape=_queue_shape)
def dequeue_rebatching_queue(ctx, xp, queue, *, num_elements):
    """Take num_elements elements (fewer if the queue is closed and holds fewer; none is a failure) and stack
    each component's tensors along a new first axis: output j has shape [taken] + the component's shape. The
    taken elements' components must agree in shape and dtype."""
    queue = _queue(queue)
    if num_elements < 1:
        raise ArgumentError(f"num_elements must be >= 1, got {num_elements}")
    if len(ctx.opdef.output) != queue.num_blobs:
        raise ArityError(f"rebatching queue {queue.name!r} holds elements of {queue.num_blobs} tensor(s), but the "
                         f"op has {len(ctx.opdef.output)} outputs")
    rows = queue.take(num_elements)
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
