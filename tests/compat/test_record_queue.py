"""compat.record_queue: records of a dataset moved through a RecordQueue (one producer, a queue large enough
for the whole dataset, since stepnet runs steps one at a time) into a second dataset, checked entry by entry."""
import numpy as np
import pytest

from stepnet.compat import core, workspace
from stepnet.compat.dataset import Dataset
from stepnet.compat.record_queue import RecordQueue
from stepnet.compat.schema import FeedRecord, Map, NewRecord, Scalar, Struct, from_blob_list


def test_records_go_through_the_queue_unchanged():
    schema = Struct(("floats", Map(Scalar(np.int32), Scalar(np.float32))))
    contents = from_blob_list(schema, [[1, 2, 3], [11, 21, 22, 31, 32, 33], [1.5, 2.5, 2.25, 3.5, 3.25, 3.125]])
    ds = Dataset(schema)
    net = core.Net("init")
    ds.init_empty(net)
    blobs = NewRecord(net, contents)
    FeedRecord(blobs, contents)
    ds.writer(init_net=net).write_record(net, blobs)
    reader = ds.reader(init_net=net)
    received = Dataset(contents, name="rec")
    received.init_empty(init_net=net)
    received_writer = received.writer(init_net=net)
    workspace.RunNetOnce(net)

    queue = RecordQueue(contents, capacity=4)
    q_reader, q_step, q_exit, _ = queue.build(reader, lambda n, rec: from_blob_list(
        rec, [n.Scale(b, scale=1.0) if i == 2 else n.Copy(b) for i, b in enumerate(rec.field_blobs())]))
    consume = core.Net("consume")
    should_stop, fields = q_reader.read_record(consume)
    store = core.Net("store")
    received_writer.write(store, fields.field_blobs())
    plan = core.Plan("move")
    plan.AddStep(core.execution_step("producer", [q_step, q_exit]))
    plan.AddStep(core.execution_step("consumer", [core.execution_step("c", consume),
                                                  core.execution_step("s", store)], should_stop_blob=should_stop))
    workspace.RunPlan(plan)
    got = workspace.FetchBlobs(received.get_blobs())
    assert [g.tolist() for g in got] == [[1, 2, 3], [11, 21, 22, 31, 32, 33], [1.5, 2.5, 2.25, 3.5, 3.25, 3.125]]
    assert workspace.FetchBlob(should_stop)


def test_fields_must_be_a_struct_or_names():
    with pytest.raises(TypeError, match="Struct or a list"):
        RecordQueue("x")
