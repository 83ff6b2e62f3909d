"""compat.pipeline, queue_util, cached_reader and dataio's limited readers: records moved between in-memory
datasets through pipe() (runtime threads, static threads, queues), checked against lists written out by hand:
every record arrives once, processors change them as their definition says, limits stop where they should."""
import logging

import numpy as np
import pytest

from stepnet.compat import core, workspace
from stepnet.compat.cached_reader import CachedReader
from stepnet.compat.dataio import CountUntil, ReaderWithLimit
from stepnet.compat.dataset import Dataset
from stepnet.compat.net_builder import ops
from stepnet.compat.pipeline import Output, pipe, pipe_and_output, processor_name
from stepnet.compat.queue_util import Queue, dequeue, enqueue
from stepnet.compat.schema import FeedRecord, NewRecord, Struct
from stepnet.compat.session import LocalSession
from stepnet.compat.task import TaskGroup, WorkspaceType


def source(ws, values, name="src"):
    """A dataset of one int64 field `v` holding values, fed into ws."""
    init = core.Net(f"{name}_init")
    with core.NameScope(name):
        values_rec = Struct(("v", np.array(values, dtype=np.int64)))
        blobs = NewRecord(init, values_rec)
        FeedRecord(blobs, values_rec, ws)
    ws.run(init)
    return Dataset(blobs)


def sink(ws, schema, name="dst"):
    init = core.Net(f"{name}_init")
    with core.NameScope(name):
        ds = Dataset(schema.clone_schema())
        ds.init_empty(init)
    ws.run(init)
    return ds


def fetch_v(ws, ds):
    return ws.blobs[str(ds.content().v())].fetch().tolist()


@pytest.fixture
def ws():
    return workspace.C.Workspace()


def test_runtime_threads_through_a_queue(ws):
    src = source(ws, range(40))
    dst = sink(ws, src.content())
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        q = pipe(src.reader(), output=Queue(capacity=3), num_runtime_threads=3)
        pipe(q, dst.writer(), num_runtime_threads=2)
    LocalSession(ws).run(tg)
    assert sorted(fetch_v(ws, dst)) == list(range(40))


def test_static_threads_lose_no_record(ws):
    """16 threads appending to one dataset at once (AtomicAppend under its mutex), several runs."""
    for run in range(4):
        src = source(ws, range(150), name=f"src{run}")
        dst = sink(ws, src.content(), name=f"dst{run}")
        with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
            pipe(src.reader(), dst.writer(), num_threads=16)
        LocalSession(ws).run(tg)
        assert sorted(fetch_v(ws, dst)) == list(range(150))


def test_processor_with_ops_and_its_stop(ws):
    """A processor tripling each value with ops and returning (record, stop blob): the stop, true for the
    value 4, is checked right after the processor's nets, so the pipe ends before writing that record."""
    src = source(ws, [3, 1, 4, 1, 5, 9, 2, 6])
    dst = sink(ws, src.content())

    def triple(rec):
        out = NewRecord(ops, rec)
        twice = ops.Add([rec.v(), rec.v()])
        ops.Add([twice, rec.v()], [out.v()])
        four = ops.ConstantFill([], shape=[1], value=4, dtype=core.DataType.INT64)
        return out, ops.EQ([rec.v(), four])

    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(src.reader(), dst.writer(), processor=triple)
    LocalSession(ws).run(tg)
    assert fetch_v(ws, dst) == [9, 3]


def test_processor_output_of_nets(ws):
    """A processor returning Output(nets, record) of a net of its own: the values plus 10."""
    src = source(ws, [2, 7])
    dst = sink(ws, src.content())

    def plus_ten(rec):
        net = core.Net("plus_ten")
        out = NewRecord(net, rec)
        ten = net.ConstantFill([], shape=[1], value=10, dtype=core.DataType.INT64)
        net.Add([rec.v(), ten], [out.v()], broadcast=1)
        return Output([net], out)

    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(src.reader(), dst.writer(), processor=plus_ten)
    LocalSession(ws).run(tg)
    assert fetch_v(ws, dst) == [12, 17]


def test_reader_with_limit_stops_and_says_why(ws):
    src = source(ws, range(10))
    for limit, expected, finished in ((4, [0, 1, 2, 3], False), (None, list(range(10)), True),
                                      (25, list(range(10)), True)):
        dst = sink(ws, src.content(), name=f"dst{limit}")
        with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
            reader = ReaderWithLimit(src.reader(), num_iter=limit)
            pipe(reader, dst.writer())
        LocalSession(ws).run(tg)
        assert fetch_v(ws, dst) == expected
        assert bool(ws.blobs[str(reader.data_finished())].fetch()) is finished


def test_count_until_and_pipe_and_output(ws):
    """CountUntil(5) reads 0..4; a processor sums them into a task output fetched after the run."""
    total = core.BlobReference("total")
    init = core.Net("total_init")
    init.ConstantFill([], [total], shape=[1], value=0, dtype=core.DataType.INT64)
    ws.run(init)
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        def add(rec):
            ops.Add([total, rec.iter()], [total], broadcast=1)

        _, out = pipe_and_output(CountUntil(5), processor=add, final_outputs=total)
    LocalSession(ws).run(tg)
    assert out.fetch().tolist() == [0 + 1 + 2 + 3 + 4]


def test_enqueue_copies_a_blob_given_twice_and_dequeue_names(ws, caplog):
    net = core.Net("q")
    queue = net.CreateBlobsQueue([], "queue", capacity=2, num_blobs=2)
    net.ConstantFill([], "x", shape=[2], value=7.0)
    with caplog.at_level(logging.WARNING, logger="stepnet.compat.queue_util"):
        status = enqueue(net, queue, ["x", "x"])
    assert "Need to copy blob x to enqueue" in caplog.text
    fields, dq_status = dequeue(net, queue, 2, field_names=["a", "b"])
    assert [str(f) for f in fields] == ["q/a", "q/b"]
    ws.run(net)
    assert ws.blobs["q/a"].fetch().tolist() == [7.0, 7.0] == ws.blobs["q/b"].fetch().tolist()
    assert not ws.blobs[str(status)].fetch() and not ws.blobs[str(dq_status)].fetch()


def test_queue_needs_a_schema_to_be_set_up():
    with pytest.raises(AssertionError, match="does not have a schema"):
        Queue(capacity=2).setup(core.Net("init"))


def test_processor_names():
    def proc(rec):
        return rec

    class Named:
        name = "named"

    assert processor_name(proc) == "proc"
    assert processor_name(Named()) == "named"
    assert processor_name(lambda r: r) == __name__
    assert processor_name(Queue(capacity=1)) == "Queue"


def test_cached_reader_reads_the_file_not_its_source(ws, tmp_path):
    path = str(tmp_path / "cache")
    session = LocalSession(ws)
    first = CachedReader(source(ws, [5, 6, 7], name="a").reader(), db_type="minidb")
    session.run(first.build_cache(path))
    second = CachedReader(source(ws, [1, 2], name="b").reader(), db_type="minidb")
    session.run(second.build_cache(path))
    dst = sink(ws, second.schema(), name="out")
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(second, dst.writer())
    session.run(tg)
    assert sorted(fetch_v(ws, dst)) == [5, 6, 7]


def test_net_processor_runs_a_copy_of_the_net_per_thread(ws):
    """A core.Net with input and output records as the processor: out = v * v + v, through 2 static threads
    (each its own copy of the net, its blobs prefixed with the thread's builder name)."""
    src = source(ws, [1, 2, 3, 4, 5])
    dst = sink(ws, src.content())
    net = core.Net("square_plus")
    rec = net.set_input_record(src.content().clone_schema())
    square = net.Mul([rec.v(), rec.v()])
    result = net.Add([square, rec.v()])
    net.set_output_record(Struct(("v", result)))
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(src.reader(), dst.writer(), processor=net, num_threads=2)
    LocalSession(ws).run(tg)
    assert sorted(fetch_v(ws, dst)) == [2, 6, 12, 20, 30]
    assert not ws.has_blob(str(result))   # the original net's blobs are not the copies'
