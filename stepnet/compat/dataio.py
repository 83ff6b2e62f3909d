"""Caffe2's dataio module: the Reader and Writer interfaces that datasets, text files and queues implement, and
the small readers and builders over them (CounterReader, ReaderBuilder, PipedReaderBuilder, Pipe, and the
readers that stop at a limit: ReaderWithLimit, ReaderWithTimeLimit, CountUntil).

A Reader adds ops to a net that read the next batch: read(net) returns (should_stop, blobs), should_stop a
boolean blob true once the data is exhausted; read_record wraps the blobs in the reader's schema, and
execution_step makes a step that runs the read net until should_stop. A Writer adds ops that append a batch
(write) and ops that say no more will come (commit)."""
from __future__ import annotations

import numpy as np

from . import core
from .schema import Field, Struct, from_blob_list


class Reader:
    """Reads batches of records of schema() through ops it adds to nets."""

    def __init__(self, schema=None):
        if schema is not None and not isinstance(schema, Field):
            raise TypeError(f"a reader's schema must be a schema.Field, got {type(schema).__name__}")
        self._schema = schema

    def schema(self) -> Field:
        if self._schema is None:
            raise AssertionError("Schema not provided for this reader.")
        return self._schema

    def _set_schema(self, schema) -> None:
        self._schema = schema

    def setup_ex(self, init_net, finish_net) -> None:
        """Ops run once when a task starts (init_net) and ends (finish_net); none by default."""

    def read_ex(self, local_init_net, local_finish_net):
        """([nets], should_stop, blobs): by default one new net holding read()'s ops."""
        read_net = core.Net("reader_body")
        return ([read_net],) + tuple(self.read(read_net))

    def read_record_ex(self, local_init_net, local_finish_net):
        nets, should_stop, fields = self.read_ex(local_init_net, local_finish_net)
        return nets, should_stop, self._as_record(fields)

    def read(self, read_net):
        """Add to read_net the ops that read one batch; (should_stop blob, tuple of field blobs)."""
        raise NotImplementedError("Readers must implement `read`.")

    def reset(self, net) -> None:
        """Add to net the ops that start the reading over (readers that can)."""
        raise NotImplementedError("This reader cannot be resetted.")

    def _as_record(self, fields):
        return from_blob_list(self._schema, fields) if self._schema else fields

    def read_record(self, read_net):
        """read(), with the blobs as a record of the schema."""
        should_stop, fields = self.read(read_net)
        return should_stop, self._as_record(fields)

    def execution_step(self, reader_net_name=None, external_should_stop=None):
        """(a step running a new read net until its should_stop, or external_should_stop, is true; the fields)."""
        reader_net = core.Net(reader_net_name or "reader")
        should_stop, fields = self.read_record(reader_net)
        if external_should_stop is not None:
            should_stop = reader_net.Or([external_should_stop, should_stop])
        step = core.execution_step(f"{reader_net_name}_step", reader_net, should_stop_blob=should_stop)
        return step, fields


class Writer:
    """Appends batches through ops it adds to nets; commit adds the ops that end the stream."""
    _schema = None

    def schema(self):
        return self._schema

    def write(self, writer_net, fields) -> None:
        raise NotImplementedError("Writers must implement write.")

    def write_record(self, writer_net, fields) -> None:
        """write(), taking a record (whose schema the writer keeps) or a list of blobs."""
        if isinstance(fields, Field):
            self._schema = fields
            fields = fields.field_blobs()
        self.write(writer_net, fields)

    def setup_ex(self, init_net, finish_net) -> None:
        self.commit(finish_net)

    def write_ex(self, fields, local_init_net, local_finish_net, stop_blob):
        write_net = core.Net("write_net")
        self.write(write_net, fields)
        return [write_net]

    def write_record_ex(self, fields, local_init_net, local_finish_net, stop_blob=None):
        if isinstance(fields, Field):
            self._schema = fields
            fields = fields.field_blobs()
        if stop_blob is None:
            stop_blob = local_init_net.NextName("dequeue_status")
        return self.write_ex(fields, local_init_net, local_finish_net, stop_blob), stop_blob

    def commit(self, finish_net) -> None:
        """Add the ops that signal the end of the data (none by default)."""


class ReaderBuilder:
    """Makes readers (one per consumer, for distributed reading)."""

    def schema(self):
        raise NotImplementedError

    def setup(self, **kwargs):
        raise NotImplementedError

    def new_reader(self, **kwargs):
        raise NotImplementedError


class PipedReaderBuilder(ReaderBuilder):
    """A builder whose readers are those of `builder` passed through piper(reader=..., **kwargs)."""

    def __init__(self, builder, piper):
        self._builder, self._piper = builder, piper

    def schema(self):
        return self._builder.schema()

    def setup(self, **kwargs):
        self._builder.setup(**kwargs)

    def new_reader(self, **kwargs):
        output = self._piper(reader=self._builder.new_reader(**kwargs), **kwargs)
        return output if isinstance(output, Reader) else output.reader()


class Pipe:
    """A channel with readers and writers (subclasses make them); counts both."""

    def __init__(self, schema=None, obj_key=None):
        self._num_writers = self._num_readers = 0
        self._schema, self._obj_key = schema, obj_key

    def schema(self):
        return self._schema

    def setup(self, global_init_net) -> None:
        pass

    def reader(self):
        raise NotImplementedError

    def writer(self):
        raise NotImplementedError

    def num_readers(self) -> int:
        return self._num_readers

    def num_writers(self) -> int:
        return self._num_writers

    def _new_writer(self, writer_schema, writer_init_net) -> None:
        if writer_schema is not None and self._schema is None:
            self._schema = writer_schema
        self._num_writers += 1
        if self._obj_key is not None:
            writer_init_net.add_attribute(self._obj_key, self)

    def _new_reader(self, reader_init_net) -> None:
        self._num_readers += 1
        if self._obj_key is not None:
            reader_init_net.add_attribute(self._obj_key, self)


class CounterReader(Reader):
    """Reads 0, 1, 2, ... (field `iter`, int64) forever: a counter made in the task's init net."""

    def __init__(self):
        super().__init__(schema=Struct(("iter", np.int64)))
        self.counter = self.should_stop = None

    def setup_ex(self, global_init_net, global_finish_net) -> None:
        if self.counter is None:
            self.counter = global_init_net.CreateCounter([], init_count=0)
            self.should_stop = global_init_net.ConstantFill([], shape=[], dtype=core.DataType.BOOL, value=False)

    def read_ex(self, local_init_net, local_finish_net):
        count_net = core.Net("limited_reader_counter")
        return [count_net], self.should_stop, [count_net.CountUp([self.counter], 1)]


class ReaderWithLimitBase(Reader):
    """A reader over `reader` that also stops when a condition of the subclass holds (check_limiter_condition,
    evaluated before each read). data_finished() is a bool blob: true once the underlying reader ran out, false
    when the limit stopped the reading first."""

    def __init__(self, reader):
        super().__init__(schema=reader._schema)
        self.reader = reader
        self.net = core.Net("reader_with_limit")
        self._data_finished = self.net.AddExternalInput(self.net.NextName("data_finished"))
        self.should_stop = None

    def setup_ex(self, global_init_net, global_finish_net) -> None:
        global_init_net.ConstantFill([], [self._data_finished], shape=[], value=False, dtype=core.DataType.BOOL)
        self.reader.setup_ex(global_init_net, global_finish_net)
        self.setup_limiter(global_init_net, global_finish_net)

    def read_ex(self, local_init_net, local_finish_net):
        """[condition net, the reader's nets, post net]: the condition net sets the stop blob when the limit is
        reached; the post net copies the reader's own stop into it and ORs it into data_finished."""
        condition_net = core.Net("limited_reader_condition")
        should_stop = self.check_limiter_condition(condition_net)
        nets, reader_stop, fields = self.reader.read_ex(local_init_net, local_finish_net)
        self._set_schema(self.reader._schema)
        post_net = core.Net("limited_reader_post")
        # the stop blob is checked after every net, so overwriting it here only adds the reader's own stop
        post_net.Copy(reader_stop, should_stop)
        post_net.Or([self._data_finished, reader_stop], [self._data_finished])
        return [condition_net] + list(nets) + [post_net], should_stop, fields

    def setup_limiter(self, global_init_net, global_finish_net) -> None:
        """Add the task-level ops the limit needs (subclasses)."""
        raise NotImplementedError("Subclass must implement `setup_limiter`")

    def check_limiter_condition(self, stop_condition_net):
        """Add to stop_condition_net the ops computing the limit's stop blob, and return it (subclasses)."""
        raise NotImplementedError("Subclass must implement `check_limiter_condition")

    def data_finished(self):
        """The bool blob saying whether the underlying reader was exhausted."""
        return self._data_finished


class ReaderWithLimit(ReaderWithLimitBase):
    """Stops after num_iter reads (all threads together); num_iter=None: no limit, only data_finished."""

    def __init__(self, reader, num_iter=1):
        super().__init__(reader)
        self.counter = None
        self.num_iter = num_iter
        if num_iter is not None:
            self.counter = self.net.AddExternalInput(self.net.NextName("counter"))

    def setup_limiter(self, global_init_net, global_finish_net) -> None:
        if self.counter:
            global_init_net.CreateCounter([], [self.counter], init_count=int(self.num_iter))

    def check_limiter_condition(self, stop_condition_net):
        if self.counter:
            return stop_condition_net.CountDown([self.counter], 1)
        return stop_condition_net.ConstantFill([], 1, shape=[], value=False, dtype=core.DataType.BOOL)


def CountUntil(num_iter):
    """A reader of 0, 1, ... num_iter - 1."""
    return ReaderWithLimit(CounterReader(), num_iter)


class ReaderWithTimeLimit(ReaderWithLimitBase):
    """Stops reading once `duration` seconds have passed since the task started; duration None or <= 0: no
    limit, only data_finished."""

    def __init__(self, reader, duration=0):
        super().__init__(reader)
        self.timer = None
        self.duration = duration
        self.duration_ns_blob = None

    def setup_limiter(self, global_init_net, global_finish_net) -> None:
        if self.duration is not None and self.duration > 0:
            self.timer = global_init_net.TimerBegin([], counter_name="epoch_timer")
            start_ns = global_init_net.TimerGet(self.timer)
            self.duration_ns_blob = global_init_net.ConstantFill([start_ns], value=int(self.duration * 10 ** 9))
            global_finish_net.TimerEnd([self.timer], [])

    def check_limiter_condition(self, stop_condition_net):
        if self.duration:
            elapsed_ns = stop_condition_net.TimerGet(self.timer)
            # (Caffe2 names this output str(self.should_stop), "None" for every reader: a fresh name here)
            return stop_condition_net.GE([elapsed_ns, self.duration_ns_blob])
        return stop_condition_net.ConstantFill([], 1, shape=[], value=False, dtype=core.DataType.BOOL)
