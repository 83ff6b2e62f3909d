"""Caffe2's pipeline module: pipe(), which makes a Task moving records from a reader (or queue, or anything with
a reader()) into a writer (or a new Queue), each record passed through an optional processor on the way.

The task's body reads, processes and writes until the reader's (or processor's) stop blob is true. With
num_runtime_threads=N it is one Task of N instances, each in a workspace of its own (per-instance state: the
task_instance_init/exit blocks); with num_threads=N (deprecated in Caffe2) it holds N copies of the body, built
in Python and run as concurrent substeps in one workspace. A processor takes the record read and returns a
record (or an Output, or (nets, record, stop), or nets), building its ops with net_builder.ops or in nets of its
own.
"""
from __future__ import annotations

from . import core, queue_util
from .dataio import Reader, Writer
from .net_builder import NetBuilder, ops
from .schema import Field, as_record
from .task import Node, Task, TaskGroup

DEFAULT_QUEUE_CAPACITY = 100


class Output:
    """What a processor gives back: the nets to run (by default those it built through `ops`), the record it
    made and an optional stop blob."""

    def __init__(self, nets=None, record=None, should_stop=None):
        built = NetBuilder.current().get()
        if nets is not None and built:
            raise AssertionError("Cannot both use `ops` syntax and return a list of nets.")
        if nets is None:
            nets = built
        if isinstance(nets, core.Net):
            nets = [nets]
        self.nets = [] if nets is None else list(nets)
        self.record = None if record is None else as_record(record)
        self.should_stop = should_stop


def _init_output(output, capacity, global_init_net, global_exit_net):
    """(the queue made or given, or None; the writer to write to), the writer set up on the task's nets."""
    if output is None:
        out_queue = queue_util.Queue(capacity=DEFAULT_QUEUE_CAPACITY if capacity is None else capacity)
        writer = out_queue.writer()
    elif isinstance(output, Writer):
        if capacity is not None:
            raise AssertionError("capacity would not be used.")
        out_queue, writer = None, output
    elif hasattr(output, "writer"):
        if capacity is not None:
            raise AssertionError("capacity would not be used.")
        out_queue, writer = output, output.writer()
    else:
        raise ValueError("output must be a reader, queue or stream.")
    writer.setup_ex(global_init_net, global_exit_net)
    return out_queue, writer


def make_processor(processor):
    """The processor as a callable: identity for None, a NetProcessor for a core.Net."""
    if processor is None:
        return lambda rec: rec
    if isinstance(processor, core.Net):
        return NetProcessor(processor)
    return processor


def normalize_processor_output(output) -> Output:
    """A processor's result as an Output: an Output, a record, (record, stop blob), (nets, record[, stop]) or
    nets alone."""
    if isinstance(output, Output):
        return output
    if isinstance(output, Field):
        return Output(record=output)
    if isinstance(output, tuple):
        if len(output) == 2 and isinstance(output[0], Field) and isinstance(output[1], core.BlobReference):
            return Output(None, *output)
        return Output(*output)
    return Output(output)


def processor_name(processor) -> str:
    """The name a pipe's task takes from its processor, writer or reader."""
    if hasattr(processor, "name"):
        return processor.name
    func_name = getattr(processor, "__name__", None) if callable(processor) else None
    if func_name is not None and not isinstance(processor, type):
        if func_name == "<lambda>":
            return processor.__module__
        owner = getattr(processor, "__self__", None)
        if owner is not None and not isinstance(owner, type(core)):
            return f"{type(owner).__name__}.{func_name}"
        return func_name
    return type(processor).__name__


def pipe(input, output=None, num_threads=1, processor=None, name=None, capacity=None, group=None,  # noqa: A002
         num_runtime_threads=1):
    """Add to the current TaskGroup (or `group`) a Task piping `input` (a Reader, or a queue/stream with
    reader()) through `processor` into `output` (a Writer, or a queue/stream with writer(); a new Queue of
    `capacity` records when None). Returns the output queue (None when writing to a Writer or when the
    processor makes no record); with num_threads=0 or num_runtime_threads=0, no task: the processing reader."""
    result, _ = _pipe_step(input, output, num_threads, processor, name, capacity, group, num_runtime_threads)
    return result


def pipe_and_output(input, output=None, num_threads=1, processor=None, name=None, capacity=None,  # noqa: A002
                    group=None, num_runtime_threads=1, final_outputs=None):
    """pipe(), also returning the task's outputs for final_outputs (a TaskOutput, or a list of them), fetchable
    once the session has run it: (output queue, outputs)."""
    if num_threads <= 0:
        raise AssertionError("num_threads must be > 0")
    result, task = _pipe_step(input, output, num_threads, processor, name, capacity, group, num_runtime_threads,
                              final_outputs)
    outputs = None
    if final_outputs is not None:
        outputs = task.outputs()
        if type(final_outputs) not in (list, tuple):
            outputs = outputs[0]
    return result, outputs


def _profiler_name(name, reader, output) -> str:
    return "/".join([str(Node.current()), "pipe", str(name), processor_name(reader) if reader else "NoInput",
                     processor_name(output) if output else "NoOutput"])


def _body(reader, init_net, exit_net, writer_maker, profiler_name):
    """(the nets of one thread's loop body as a step, the out queue): read, process, write, timed."""
    read_nets, status, rec = reader.read_record_ex(init_net, exit_net)
    init_net.ConstantFill([], [status], shape=[], value=False, dtype=core.DataType.BOOL)
    out_queue, write_nets = None, []
    if rec is not None:
        out_queue, writer = writer_maker()
        write_nets, _ = writer.write_record_ex(rec, init_net, exit_net, status)
    timer_start_net = core.Net("timer_start")
    timer = timer_start_net.TimerBegin([], counter_name=profiler_name)
    timer_end_net = core.Net("timer_end")
    timer_end_net.TimerEnd(timer, [])
    body = core.execution_step("body", [timer_start_net] + list(read_nets) + list(write_nets) + [timer_end_net],
                               should_stop_blob=status)
    return body, timer_end_net, out_queue


def _runtime_threads_task(name, group, final_outputs, reader, num_threads, output, capacity):
    """One Task of num_threads instances, each running the body in its own workspace."""
    profiler_name = _profiler_name(name, reader, output)
    with Task(name=name, group=group, outputs=final_outputs, num_instances=num_threads) as task:
        global_exit_net = core.Net("pipe:exit")
        global_init_net = core.Net("pipe:init")
        reader.setup_ex(global_init_net, global_exit_net)
        init_net = core.Net("pipe:instance:init")
        exit_net = core.Net("pipe:instance:exit")
        body, timer_end_net, out_queue = _body(
            reader, init_net, exit_net, lambda: _init_output(output, capacity, global_init_net, global_exit_net),
            profiler_name)
        with ops.task_init():
            ops.net(global_init_net)
        with ops.task_instance_init():
            ops.net(init_net)
        ops.net(body)
        ops.net(timer_end_net)
        with ops.task_instance_exit():
            ops.net(exit_net)
        with ops.task_exit():
            ops.net(global_exit_net)
    return out_queue, task


def _static_threads_task(name, group, final_outputs, reader, num_threads, output, capacity):
    """One Task holding num_threads copies of the body (built one by one) run as concurrent substeps."""
    profiler_name = _profiler_name(name, reader, output)
    with Task(name=name, group=group, outputs=final_outputs) as task:
        global_exit_net = core.Net("exit")
        global_init_net = core.Net("init")
        reader.setup_ex(global_init_net, global_exit_net)
        made = {}

        def writer_maker():
            if "writer" not in made:   # one output for all threads, its blobs named after the task
                with NetBuilder(_fullname=task.name):
                    made["queue"], made["writer"] = _init_output(output, capacity, global_init_net,
                                                                 global_exit_net)
            return made["queue"], made["writer"]

        steps = []
        out_queue = None
        for thread_id in range(num_threads):
            with NetBuilder(name=f"t:{thread_id}") as nb:
                init_net = core.Net("init")
                exit_net = core.Net("exit")
                body, timer_end_net, queue = _body(reader, init_net, exit_net, writer_maker, profiler_name)
                out_queue = queue if queue is not None else out_queue
                ops.net(init_net)
                ops.net(body)
                ops.net(timer_end_net)
                ops.net(exit_net)
            steps.append(core.to_execution_step(nb))
        ops.net(global_init_net)
        ops.net(core.execution_step("body", steps, concurrent_substeps=True))
        ops.net(global_exit_net)
    return out_queue, task


def _pipe_step(input, output=None, num_threads=1, processor=None, name=None, capacity=None,  # noqa: A002
               group=None, num_runtime_threads=None, final_outputs=None):
    if num_threads > 1 and num_runtime_threads > 1:
        raise AssertionError("Only one of num_threads or num_runtime_threads must be set.")
    if isinstance(input, Reader):
        reader = input
    elif hasattr(input, "reader"):
        reader = input.reader()
    else:
        raise ValueError("in must be a reader, queue or stream.")
    if processor is not None:
        reader = ProcessingReader(reader, processor)
    if num_threads == 0 or num_runtime_threads == 0:
        if output is not None:
            raise AssertionError("no task is made with 0 threads: output must be None")
        return reader, None
    if name is None and processor is not None:
        name = processor_name(processor)
    if name is None and output is not None:
        name = f"pipe_into:{processor_name(output)}"
    if name is None:
        name = f"pipe_from:{processor_name(input)}"
    if num_threads > 1:
        return _static_threads_task(name, group, final_outputs, reader, num_threads, output, capacity)
    return _runtime_threads_task(name, group, final_outputs, reader, num_runtime_threads, output, capacity)


class ProcessingReader(Reader):
    """Reads from `reader` and returns what `processor` makes of each record (its schema, once read)."""

    def __init__(self, reader, processor):
        Reader.__init__(self)
        self.reader = reader
        self.processor = make_processor(processor)

    def setup_ex(self, init_net, finish_net) -> None:
        self.reader.setup_ex(init_net, finish_net)

    def read_ex(self, init_net, exit_net):
        read_nets, status, rec = self.reader.read_record_ex(init_net, exit_net)
        with NetBuilder() as nb:   # the processor may build with ops; Output takes the builder's children
            result = normalize_processor_output(self.processor(rec))
        read_nets = list(read_nets) + result.nets
        # a stop from the processor (returned, or through ops.stop_if) is ORed into the reader's status
        if result.should_stop or nb._stop_blob:
            stop_net = core.Net("stop_net")
            if result.should_stop:
                stop_net.Or([status, result.should_stop], [status])
            if nb._stop_blob:
                stop_net.Or([status, nb._stop_blob], [status])
            read_nets.append(stop_net)
        if hasattr(self.processor, "setup"):
            init_net.add_attribute(TaskGroup.LOCAL_SETUP, self.processor)
        self._set_schema(result.record)
        fields = result.record.field_blobs() if result.record else None
        return read_nets, status, fields


class NetProcessor:
    """A processor that runs a copy of `net` per call (per thread): the net's input record bound to the record
    read, its blobs prefixed with the builder's name; its output record is the result. thread_init_nets are
    copied the same way and run once per node before the group (setup)."""

    def __init__(self, net, stop_signal=None, thread_init_nets=None, name=None):
        if not isinstance(net, core.Net):
            raise AssertionError("NetProcessor needs a core.Net")
        if stop_signal is not None and not isinstance(stop_signal, core.BlobReference):
            raise AssertionError("stop_signal must be a BlobReference")
        self.name = name or str(net)
        self.thread_init_nets = thread_init_nets or []
        self.net = net
        self._stop_signal = stop_signal
        self._blob_maps: list = []
        self._frozen = False
        self._cloned_init_nets: list = []

    def setup(self, init_net):
        self._frozen = True
        cloned, self._cloned_init_nets = self._cloned_init_nets, []
        return cloned

    def __call__(self, rec):
        if self._frozen:
            raise AssertionError("NetProcessor was already set up: it cannot be called again")
        bind = core.clone_and_bind_net
        prefix = NetBuilder.current().name + "/"
        blob_remap: dict = {}
        for net in self.thread_init_nets:
            new_net, _ = bind(net, str(net) + prefix, prefix, blob_remap)
            self._cloned_init_nets.append(new_net)
        new_net, remappings = bind(self.net, str(self.net) + prefix, prefix, blob_remap, rec)
        stop_signal = self._stop_signal
        if stop_signal is not None and str(stop_signal) in remappings:
            stop_signal = core.BlobReference(remappings[str(stop_signal)], net=new_net)
        self._blob_maps.append(remappings)
        return Output([new_net], new_net.output_record(), stop_signal)

    def blob_maps(self) -> list:
        self._frozen = True
        return self._blob_maps
