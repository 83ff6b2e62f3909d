"""Caffe2's queue_util module: blob queues as dataio pipes (QueueWrapper over an existing queue blob, Queue that
makes its own), and the net helpers enqueue, dequeue and close_queue.

A queue's reader takes records out with SafeDequeueBlobs (its status blob, true once the queue is closed and
empty, is the reader's should_stop); its writer puts them in with SafeEnqueueBlobs. Both close the queue in the
task's exit net. A Queue is a setup object of the TaskGroup (TaskGroup.LOCAL_SETUP): its CreateBlobsQueue runs
once on each node before the group's tasks, once a writer has given it a schema.
"""
from __future__ import annotations

import logging

from . import core, dataio
from .task import TaskGroup

logger = logging.getLogger(__name__)


class _QueueReader(dataio.Reader):
    """Dequeues num_dequeue_records records a read."""

    def __init__(self, wrapper, num_dequeue_records=1):
        if wrapper.schema is None:
            raise AssertionError("Queue needs a schema in order to be read from.")
        super().__init__(wrapper.schema())
        self._wrapper = wrapper
        self._num_dequeue_records = num_dequeue_records

    def setup_ex(self, init_net, exit_net) -> None:
        exit_net.CloseBlobsQueue([self._wrapper.queue()], 0)

    def read_ex(self, local_init_net, local_finish_net):
        self._wrapper._new_reader(local_init_net)
        dequeue_net = core.Net("dequeue")
        names = self.schema().field_names()
        fields, status = dequeue(dequeue_net, self._wrapper.queue(), len(names), field_names=names,
                                 num_records=self._num_dequeue_records)
        return [dequeue_net], status, fields

    def read(self, net):
        nets, _, fields = self.read_ex(net, None)
        return nets, fields


class _QueueWriter(dataio.Writer):
    """Enqueues each record written."""

    def __init__(self, wrapper):
        self._wrapper = wrapper

    def setup_ex(self, init_net, exit_net) -> None:
        exit_net.CloseBlobsQueue([self._wrapper.queue()], 0)

    def write_ex(self, fields, local_init_net, local_finish_net, status):
        self._wrapper._new_writer(self.schema(), local_init_net)
        enqueue_net = core.Net("enqueue")
        enqueue(enqueue_net, self._wrapper.queue(), fields, status)
        return [enqueue_net]


class QueueWrapper(dataio.Pipe):
    """A pipe over the blob queue `handler` (a blob made elsewhere)."""

    def __init__(self, handler, schema=None, num_dequeue_records=1):
        dataio.Pipe.__init__(self, schema, TaskGroup.LOCAL_SETUP)
        self._queue = handler
        self._num_dequeue_records = num_dequeue_records

    def reader(self):
        return _QueueReader(self, num_dequeue_records=self._num_dequeue_records)

    def writer(self):
        return _QueueWriter(self)

    def queue(self):
        return self._queue


class Queue(QueueWrapper):
    """A pipe over a new blob queue of `capacity` records, named '<name>/handler' (made unique), created by
    setup() in the task group's node init."""

    def __init__(self, capacity, schema=None, name="queue", num_dequeue_records=1):
        net = core.Net(name)   # for a unique blob name
        queue_blob = net.AddExternalInput(net.NextName("handler"))
        QueueWrapper.__init__(self, queue_blob, schema, num_dequeue_records=num_dequeue_records)
        self.capacity = capacity
        self._setup_done = False

    def setup(self, global_init_net) -> None:
        if not self._schema:
            raise AssertionError("This queue does not have a schema.")
        self._setup_done = True
        names = self._schema.field_names()
        global_init_net.CreateBlobsQueue([], [self._queue], capacity=self.capacity, num_blobs=len(names),
                                         field_names=names)


def enqueue(net, queue, data_blobs, status=None):
    """Add a SafeEnqueueBlobs of data_blobs to net (a blob given twice is copied first: enqueueing moves the
    data); returns its status blob."""
    if status is None:
        status = net.NextName("status")
    queue_blobs = []
    for blob in data_blobs:
        if blob in queue_blobs:
            logger.warning("Need to copy blob %s to enqueue", blob)
            blob = net.Copy(blob)
        queue_blobs.append(blob)
    results = net.SafeEnqueueBlobs([queue] + queue_blobs, queue_blobs + [status])
    return results[-1]


def dequeue(net, queue, num_blobs, status=None, field_names=None, num_records=1):
    """Add a SafeDequeueBlobs of num_records records to net; returns ([data blobs], status blob)."""
    if field_names is not None:
        if len(field_names) != num_blobs:
            raise AssertionError(f"{len(field_names)} field names for {num_blobs} blobs")
        data_names = [net.NextName(name) for name in field_names]
    else:
        data_names = [net.NextName("data", i) for i in range(num_blobs)]
    if status is None:
        status = net.NextName("status")
    results = list(net.SafeDequeueBlobs(queue, data_names + [status], num_records=num_records))
    status_blob = results.pop(-1)
    return results, status_blob


def close_queue(step, *queues):
    """A step running `step`, then a net closing the queues."""
    close_net = core.Net("close_queue_net")
    for queue in queues:
        close_net.CloseBlobsQueue([queue], 0)
    close_step = core.execution_step(f"{close_net}_step", close_net)
    return core.execution_step(f"{close_net}_wraper_step", [step, close_step])
