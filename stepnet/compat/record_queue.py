"""Caffe2's record_queue module: RecordQueue, a blobs queue of records of a schema between readers that fill it
(through an optional processing step) and a reader that takes records out of it.

The queue is created at once in the current workspace; build() returns the queue's reader, the step that
moves records from a reader into the queue (num_threads producers, run as concurrent substeps) and the step
that closes the queue."""
from __future__ import annotations

from . import core, workspace
from .dataio import Reader, Writer
from .schema import Field, Struct, from_column_list


class _QueueReader(Reader):
    """Takes one record out of the queue per read (SafeDequeueBlobs); should_stop is its status: true once the
    queue is closed and empty."""

    def __init__(self, blobs_queue, schema, name=None):
        super().__init__(schema)
        self.blobs_queue, self.name = blobs_queue, name

    def read(self, read_net):
        with core.NameScope(read_net.NextName(self.name)):
            status = read_net.NextName()
            fields = read_net.SafeDequeueBlobs(self.blobs_queue, self._schema.field_names() + [status])
            return fields[-1], fields[:-1]


class _QueueWriter(Writer):
    """Puts a record (checked against the schema) into the queue (SafeEnqueueBlobs)."""

    def __init__(self, blobs_queue, schema):
        self.blobs_queue, self.schema = blobs_queue, schema

    def write(self, writer_net, fields):
        if isinstance(fields, Field):
            fields = fields.field_blobs()
        writer_net.CheckDatasetConsistency(fields, [], fields=self.schema.field_names())
        status = writer_net.NextName()
        writer_net.SafeEnqueueBlobs([self.blobs_queue] + list(fields), list(fields) + [status])
        return status


class RecordQueue:
    """A queue of `capacity` records of schema `fields` (a schema.Struct or a list of field names), filled by
    num_threads producers."""

    def __init__(self, fields, name=None, capacity=1, enforce_unique_name=False, num_threads=1):
        if not isinstance(fields, (list, Struct)):
            raise TypeError("fields must be either a Struct or a list of raw field names.")
        if isinstance(fields, list):
            fields = from_column_list(fields)
        self.schema = fields
        self.name = name or "queue"
        self.num_threads = num_threads
        init_net = core.Net(self.name + "/init_net")
        self.blobs_queue = init_net.CreateBlobsQueue([], 1, capacity=capacity,
                                                     num_blobs=len(self.schema.field_names()),
                                                     enforce_unique_name=enforce_unique_name)
        workspace.RunNetOnce(init_net)
        self.writer = _QueueWriter(self.blobs_queue, self.schema)
        self.reader = _QueueReader(self.blobs_queue, self.schema, self.name + "_reader")
        exit_net = core.Net(self.name + "/exit_net")
        exit_net.CloseBlobsQueue(self.blobs_queue, 0)
        self.exit_step = core.execution_step(f"{exit_net}_close_step", exit_net)

    def build(self, reader, process=None):
        """(the queue's reader, the producer step, the step closing the queue, the schema). Each of the
        num_threads producers reads a record from `reader`, passes it through process(net, record) when given
        (which returns the record to enqueue) and enqueues it, until the reader's should_stop."""
        producer_steps = []
        for i in range(self.num_threads):
            read_net = core.Net(f"reader_{i}")
            should_stop, fields = reader.read_record(read_net)
            write_net = core.Net(f"queue_writer{i}")
            field_blobs = process(write_net, fields).field_blobs() if process else fields.field_blobs()
            self.writer.write(write_net, field_blobs)
            producer_steps.append(core.execution_step(
                f"producer_{i}", [core.execution_step(f"reader_{i}", read_net),
                                  core.execution_step(f"queue_writer{i}", write_net)],
                should_stop_blob=should_stop))
        producer_step = core.execution_step("producers", producer_steps, concurrent_substeps=True)
        return self.reader, producer_step, self.exit_step, self.schema
