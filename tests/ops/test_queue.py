"""Blob queues: records in FIFO order through the ring, Caffe2's swap semantics, closing, the Safe ops' status,
several records concatenated, weighted sampling over queues, and the waits no other thread could end (plans of
several threads: tests/test_concurrent_plan.py)."""
import threading
import time

import numpy as np
import pytest

from stepnet import Limits, NetDef, PlanDef, Workspace
from stepnet.core.waits import Deadlock
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, OpError, ResourceError, ShapeError
from stepnet.passes.gradients import add_gradient_ops
from stepnet.ops.queue import BlobsQueue
from stepnet.io.proto import DeviceOption, ExecutionStep
from stepnet.testing import DEVICES, make_op

GPU = DeviceOption(device_type=1)


def workspace(device="cpu"):
    return Workspace(gpu="emulate" if device != "cpu" else None)


def run(ws, op_type, inputs, outputs, device="cpu", **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, device=device, **args))


def feed(ws, name, value, device="cpu"):
    ws.feed(name, value, device_option=GPU if device != "cpu" else None)


def create(ws, capacity=2, num_blobs=1, name="q", device="cpu", **args):
    run(ws, "CreateBlobsQueue", [], [name], device, capacity=capacity, num_blobs=num_blobs, **args)
    return ws.get_blob(name).value


def enqueue(ws, values, device="cpu", queue="q"):
    names = [f"d{j}" for j in range(len(values))]
    for name, v in zip(names, values):
        feed(ws, name, v, device)
    run(ws, "EnqueueBlobs", [queue] + names, names, device)


def dequeue(ws, n=1, device="cpu", queue="q"):
    names = [f"o{j}" for j in range(n)]
    run(ws, "DequeueBlobs", [queue], names, device)
    return [ws.fetch(name) for name in names]


def check_fifo(device):
    """Seven two-blob records through a queue of capacity 3, reads interleaved with writes (so the ring wraps):
    they come out in the order they went in, unchanged, on the op's device."""
    ws = workspace(device)
    create(ws, capacity=3, num_blobs=2, device=device)
    records = [(np.full((2, 3), k, np.float32), np.array([k, -k], np.int64)) for k in range(7)]
    out, pending = [], list(records)
    for step in range(7):
        enqueue(ws, pending.pop(0), device)
        if step % 2 == 1 or step == 6:
            while len(ws.get_blob("q").value):
                out.append(dequeue(ws, 2, device))
                if device != "cpu":
                    assert type(ws.get_blob("o0").value).__name__ != "ndarray"   # still on the device
    assert len(out) == 7
    for (x, y), (a, b) in zip(records, out):
        np.testing.assert_array_equal(a, x)
        np.testing.assert_array_equal(b, y)
        assert a.dtype == x.dtype and b.dtype == y.dtype


# --------------------------------------------------------------------------------------------- create
def test_create_makes_the_record_blobs_in_the_workspace():
    ws = workspace()
    queue = create(ws, capacity=3, num_blobs=2, field_names=["x", "y"])
    assert isinstance(queue, BlobsQueue) and queue.capacity == 3 and queue.num_blobs == 2
    assert queue.field_names == ["x", "y"] and len(queue) == 0
    assert ws.blobs() == ["q"] + [f"q_{i}_{j}" for i in range(3) for j in range(2)]
    assert "BlobsQueue('q', 0/3 records of 2 blob(s), open)" == repr(queue)


@pytest.mark.parametrize("args, message", [
    ({"capacity": 0}, "capacity and num_blobs must be >= 1"),
    ({"num_blobs": 0}, "capacity and num_blobs must be >= 1"),
    ({"num_blobs": 2, "field_names": ["x"]}, "field_names has 1 names for num_blobs=2"),
])
def test_create_bad_arguments(args, message):
    with pytest.raises(ArgumentError, match=message):
        create(workspace(), **{"capacity": 2, "num_blobs": 1, **args})


def test_enforce_unique_name_refuses_existing_record_blobs():
    ws = workspace()
    create(ws)
    create(ws)   # a second queue of that name reuses the record blobs, as Caffe2 allows by default
    with pytest.raises(ArgumentError, match="queue internal blob 'q_0_0' already exists"):
        create(ws, enforce_unique_name=True)
    create(ws, name="other", enforce_unique_name=True)


def test_a_huge_capacity_is_refused_before_anything_is_made():
    ws = Workspace(limits=Limits(max_blob_bytes=1 << 20))
    with pytest.raises(ResourceError, match="'q'"):
        create(ws, capacity=10**9)
    assert ws.blobs() == ["q"] and ws.get_blob("q").value is None


# --------------------------------------------------------------------------------------------- order, swap
@pytest.mark.parametrize("device", DEVICES)
def test_records_come_out_in_fifo_order(device):
    check_fifo(device)


def test_the_fifo_check_catches_a_lifo_queue(broken):
    def lifo(ctx, xp, queue, *, timeout_secs):
        queue.writer -= 1
        blobs = queue.records[queue.writer % queue.capacity]
        for out, slot in zip(ctx.outputs, blobs):
            out.value, slot.value = slot.value, None
    broken("DequeueBlobs", lifo)
    with pytest.raises(AssertionError):
        check_fifo("cpu")


def test_writes_and_reads_swap_contents_as_caffe2_does():
    ws = workspace()
    create(ws, capacity=1)
    enqueue(ws, [np.arange(3.0)])
    assert ws.get_blob("d0").value is None          # the record held nothing: the enqueued blob is left empty
    feed(ws, "o0", np.array([7.0]))
    np.testing.assert_array_equal(dequeue(ws)[0], [0.0, 1.0, 2.0])
    assert ws.get_blob("q_0_0").value.tolist() == [7.0]   # the reader's old value went into the record
    enqueue(ws, [np.arange(2.0)])
    assert ws.fetch("d0").tolist() == [7.0]          # ... and comes back to the next writer of that record


def test_an_enqueued_view_is_copied():
    ws = workspace()
    create(ws)
    base = np.zeros(4, np.float32)
    ws.create_blob("d0").set_view(base[:2])
    run(ws, "EnqueueBlobs", ["q", "d0"], ["d0"])
    base[:] = 5
    np.testing.assert_array_equal(dequeue(ws)[0], [0, 0])


# --------------------------------------------------------------------------------------------- blocking, closing
def test_a_full_open_queue_with_no_other_thread_is_an_error_instead_of_a_wait():
    ws = workspace()
    create(ws, capacity=1)
    enqueue(ws, [np.ones(1)])
    with pytest.raises(Deadlock, match="queue 'q' is full .1 records. and open, and no other thread of this run "
                                       "can read from it: Caffe2 would wait forever"):
        enqueue(ws, [np.ones(1)])


def test_an_empty_open_queue_with_no_other_thread_is_an_error_instead_of_a_wait():
    ws = workspace()
    create(ws)
    for op_type in ("DequeueBlobs", "SafeDequeueBlobs"):
        outs = ["o"] + (["s"] if op_type.startswith("Safe") else [])
        start = time.monotonic()
        with pytest.raises(Deadlock, match="queue 'q' is empty and open, and no other thread.*CloseBlobsQueue"):
            run(ws, op_type, ["q"], outs)
        assert time.monotonic() - start < 0.5


def test_a_dequeue_with_a_timeout_waits_that_long_then_fails():
    """A bounded wait cannot hang, so it waits its timeout even alone (Caffe2's test_blobs_dequeue_timeout)."""
    ws = workspace()
    create(ws)
    start = time.monotonic()
    with pytest.raises(OpError, match="queue 'q': no record came within timeout_secs=0.2"):
        run(ws, "DequeueBlobs", ["q"], ["o"], timeout_secs=0.2)
    assert 0.19 < time.monotonic() - start < 2


def test_a_thread_waits_for_another_python_thread():
    """Outside a plan, a dequeue on an empty queue waits while another (non-daemon) thread of the program runs,
    and gets the record that thread enqueues; the same wait with the other thread gone is an error."""
    ws = workspace()
    create(ws)
    feed(ws, "d0", np.array([7.0]))
    producer = threading.Thread(target=lambda: (time.sleep(0.1), run(ws, "EnqueueBlobs", ["q", "d0"], ["d0"])))
    producer.start()
    run(ws, "DequeueBlobs", ["q"], ["o"])
    producer.join()
    assert ws.fetch("o").tolist() == [7.0]
    with pytest.raises(Deadlock):
        run(ws, "DequeueBlobs", ["q"], ["o"])


@pytest.mark.parametrize("device", DEVICES)
def test_a_closed_queue_drains_then_reports_the_end(device):
    ws = workspace(device)
    create(ws, capacity=3, device=device)
    enqueue(ws, [np.array([1.0])], device)
    run(ws, "CloseBlobsQueue", ["q"], [], device)
    enqueue(ws, [np.array([2.0])], device)       # a closed queue still takes writes while it has room
    assert [dequeue(ws, device=device)[0].tolist() for _ in range(2)] == [[1.0], [2.0]]
    with pytest.raises(OpError, match="queue 'q' is closed and empty"):
        dequeue(ws, device=device)
    feed(ws, "o0", np.array([9.0]), device)
    run(ws, "SafeDequeueBlobs", ["q"], ["o0", "status"], device)
    assert ws.fetch("status").shape == () and ws.fetch("status").dtype == np.bool_
    assert bool(ws.fetch("status")) and ws.fetch("o0").tolist() == [9.0]   # outputs untouched


@pytest.mark.parametrize("device", DEVICES)
def test_safe_enqueue_reports_a_closed_full_queue(device):
    ws = workspace(device)
    create(ws, capacity=1, device=device)
    feed(ws, "d0", np.array([1.0]), device)
    run(ws, "SafeEnqueueBlobs", ["q", "d0"], ["d0", "status"], device)
    assert not bool(ws.fetch("status")) and ws.get_blob("d0").value is None
    run(ws, "CloseBlobsQueue", ["q"], [], device)
    feed(ws, "d0", np.array([2.0]), device)
    run(ws, "SafeEnqueueBlobs", ["q", "d0"], ["d0", "status"], device)
    assert bool(ws.fetch("status")) and ws.fetch("d0").tolist() == [2.0]
    with pytest.raises(OpError, match="queue 'q' is closed and full"):
        enqueue(ws, [np.array([3.0])], device)
    assert dequeue(ws, device=device)[0].tolist() == [1.0]


# --------------------------------------------------------------------------------------------- several records
@pytest.mark.parametrize("device", DEVICES)
def test_safe_dequeue_concatenates_several_records(device):
    ws = workspace(device)
    create(ws, capacity=4, num_blobs=2, device=device)
    for k in range(3):
        enqueue(ws, [np.full((k + 1, 2), k, np.float32), np.array([k], np.int32)], device)
    run(ws, "CloseBlobsQueue", ["q"], [], device)
    names = ["x", "y", "status"]
    run(ws, "SafeDequeueBlobs", ["q"], names, device, num_records=2)
    x, y, status = (ws.fetch(n) for n in names)
    np.testing.assert_array_equal(x, [[0, 0], [1, 1], [1, 1]])
    assert y.tolist() == [0, 1] and y.dtype == np.int32 and not status
    run(ws, "SafeDequeueBlobs", ["q"], names, device, num_records=2)   # one left: a partial batch
    assert ws.fetch("x").tolist() == [[2, 2]] * 3 and ws.fetch("y").tolist() == [2] and not ws.fetch("status")
    run(ws, "SafeDequeueBlobs", ["q"], names, device, num_records=2)
    assert bool(ws.fetch("status")) and ws.fetch("y").tolist() == [2]


@pytest.mark.parametrize("records, message", [
    ([np.float32(1), np.float32(2)], "concatenates tensors along their first axis, but this one is \\(\\)"),
    ([np.ones((1, 2)), np.ones((1, 3))], "records of \\(1, 2\\) float64 and \\(1, 3\\) float64 cannot"),
    ([np.ones((1, 2)), np.ones((1, 2), np.float32)], "cannot be concatenated"),
])
def test_several_records_that_cannot_be_concatenated(records, message):
    ws = workspace()
    create(ws, capacity=2)
    for r in records:
        enqueue(ws, [np.asarray(r)])
    with pytest.raises(ShapeError, match=message):
        run(ws, "SafeDequeueBlobs", ["q"], ["x", "s"], num_records=2)


def test_num_records_must_be_positive():
    ws = workspace()
    create(ws)
    with pytest.raises(ArgumentError, match="num_records must be >= 1, got 0"):
        run(ws, "SafeDequeueBlobs", ["q"], ["x", "s"], num_records=0)


# --------------------------------------------------------------------------------------------- bad ops
def test_enqueue_must_write_its_data_in_place():
    ws = workspace()
    create(ws)
    feed(ws, "d", np.ones(1))
    with pytest.raises(ArgumentError, match="must write input 1 .'d'. in place"):
        run(ws, "EnqueueBlobs", ["q", "d"], ["other"])


@pytest.mark.parametrize("op_type, inputs, outputs, message", [
    ("EnqueueBlobs", ["q", "a", "b"], ["a"], "takes the queue and n data inputs"),
    ("EnqueueBlobs", ["q", "a", "b"], ["a", "b"], "holds records of 1 blob.s., but the op enqueues 2"),
    ("SafeEnqueueBlobs", ["q", "a"], ["a", "b", "s"], "plus the status"),
    ("DequeueBlobs", ["q"], ["a", "b"], "but the op dequeues 2"),
    ("SafeDequeueBlobs", ["q"], ["a", "b", "s"], "but the op dequeues 2"),
])
def test_record_sizes_must_match_the_queue(op_type, inputs, outputs, message):
    ws = workspace()
    create(ws)
    feed(ws, "a", np.ones(1))
    feed(ws, "b", np.ones(1))
    with pytest.raises(ArityError, match=message):
        run(ws, op_type, inputs, outputs)


def test_a_tensor_is_not_a_queue():
    ws = workspace()
    feed(ws, "q", np.ones(1))
    with pytest.raises(DTypeError, match="input 0 must be a queue made by CreateBlobsQueue, got ndarray"):
        dequeue(ws)


# --------------------------------------------------------------------------------------------- weighted sampling
def fill_queues(ws, counts, device="cpu", num_blobs=1):
    for k, count in enumerate(counts):
        create(ws, capacity=count, num_blobs=num_blobs, name=f"q{k}", device=device)
        for _ in range(count):
            enqueue(ws, [np.array([k], np.float32)] * num_blobs, device, queue=f"q{k}")


@pytest.mark.parametrize("device", DEVICES)
def test_weighted_sample_dequeue_follows_the_weights(device):
    ws = workspace(device)
    fill_queues(ws, [400, 400], device)
    op = make_op("WeightedSampleDequeueBlobs", ["q0", "q1"], ["x", "status"], device=device, weights=[1.0, 3.0])
    op.device_option.random_seed = 5
    net = NetDef(name="sample")
    net.op.append(op)
    bound = ws.create_net(net)
    picked = []
    for _ in range(400):
        bound.run()
        picked.append(int(ws.fetch("x")[0]))
        assert not ws.fetch("status")
    share = np.mean(picked)
    assert 0.68 < share < 0.82       # 3/4 expected; the binomial std is 0.022


def test_weighted_sample_dequeue_writes_the_table_index():
    """The queues' records have a column for the index too (Caffe2 overwrites it after the read)."""
    ws = workspace()
    fill_queues(ws, [1, 1], num_blobs=2)
    args = {"weights": [0.0, 1.0], "table_idx_blob": 1}
    run(ws, "WeightedSampleDequeueBlobs", ["q0", "q1"], ["x", "idx", "status"], **args)
    assert ws.fetch("x").tolist() == [1.0] and not ws.fetch("status")
    assert ws.fetch("idx").tolist() == [1] and ws.fetch("idx").dtype == np.int32
    run(ws, "CloseBlobsQueue", ["q1"], [])
    run(ws, "WeightedSampleDequeueBlobs", ["q0", "q1"], ["x", "idx", "status"], **args)
    assert bool(ws.fetch("status"))


@pytest.mark.parametrize("args, message", [
    ({"weights": [1.0]}, "weights has 1 entries for 2 queues"),
    ({"weights": [0.0, 0.0]}, "positive sum"),
    ({"weights": [2.0, -1.0]}, "must be >= 0"),
    ({"table_idx_blob": 1}, "table_idx_blob must be below 1"),
])
def test_weighted_sample_dequeue_bad_arguments(args, message):
    ws = workspace()
    fill_queues(ws, [1, 1])
    with pytest.raises(ArgumentError, match=message):
        run(ws, "WeightedSampleDequeueBlobs", ["q0", "q1"], ["x", "status"], **args)


# --------------------------------------------------------------------------------------------- in nets and plans
def test_a_plan_reads_a_closed_queue_until_its_status_says_the_end():
    """Producer step: 3 records (an Iter counter cast to float); then close; consumer step: SafeDequeueBlobs, then
    a sum, until the status (the step's should_stop_blob, checked after each net) is true."""
    init = NetDef(name="init", op=[make_op("CreateBlobsQueue", [], ["q"], capacity=3),
                                   make_op("ConstantFill", [], ["it"], shape=[1], value=0, dtype=10),
                                   make_op("ConstantFill", [], ["total"], shape=[1], value=0.0)])
    produce = NetDef(name="produce", op=[make_op("Iter", ["it"], ["it"]),
                                         make_op("Cast", ["it"], ["x"], to=1),
                                         make_op("EnqueueBlobs", ["q", "x"], ["x"])])
    close = NetDef(name="close", op=[make_op("CloseBlobsQueue", ["q"], [])])
    read = NetDef(name="read", op=[make_op("SafeDequeueBlobs", ["q"], ["y", "done"])])
    add = NetDef(name="add", op=[make_op("Sum", ["total", "y"], ["total"])])
    plan = PlanDef(name="queue_plan", network=[init, produce, close, read, add])
    plan.execution_step.extend([
        ExecutionStep(name="init", network=["init"]),
        ExecutionStep(name="produce", network=["produce"], num_iter=3),
        ExecutionStep(name="close", network=["close"]),
        ExecutionStep(name="consume", network=["read", "add"], should_stop_blob="done")])
    ws = workspace()
    ws.run_plan(plan)
    assert ws.fetch("total").tolist() == [6.0]   # 1 + 2 + 3: the step stops right after the failed read


def test_queue_ops_pass_no_gradient():
    net = NetDef(name="train", op=[make_op("DequeueBlobs", ["q"], ["x"]),
                                   make_op("FC", ["x", "w", "b"], ["y"]),
                                   make_op("AveragedLoss", ["y"], ["loss"])])
    grads = add_gradient_ops(net, ["loss"])
    assert grads["w"] == "w_grad" and grads.get("q") is None
    assert not any(op.type.startswith("Dequeue") for op in net.op[3:])


# --------------------------------------------------------------------------------------------- queue as a DB
def queue_db(records, key_blob_index=-1, capacity=8):
    """A queue of two-blob records (key, value) and a CreateBlobsQueueDB reader over it."""
    ws = workspace()
    create(ws, capacity=capacity, num_blobs=2)
    for key, value in records:
        ws.feed("k", key)
        ws.feed("v", value)
        run(ws, "SafeEnqueueBlobs", ["q", "k", "v"], ["k", "v", "status"])
    run(ws, "CreateBlobsQueueDB", ["q"], ["reader"], value_blob_index=1, key_blob_index=key_blob_index)
    return ws


def tensor_protos(*arrays):
    from stepnet.io import minidb
    return minidb.tensor_protos_record(arrays)


def check_queue_db_batches():
    """Three records (one value a string tensor, as Caffe2 allows) read as a batch of 2, then one record."""
    strings = np.empty(1, object)
    strings[:] = [tensor_protos(np.array([2.0], np.float32), np.array([20], np.int32))]
    records = [(b"a", tensor_protos(np.array([1.0], np.float32), np.array([10], np.int32))), (b"b", strings),
               (b"c", tensor_protos(np.array([3.0], np.float32), np.array([30], np.int32)))]
    ws = queue_db(records)
    run(ws, "TensorProtosDBInput", ["reader"], ["x", "y"], batch_size=2)
    assert ws.fetch("x").tolist() == [[1.0], [2.0]] and ws.fetch("y").tolist() == [[10], [20]]
    assert len(ws.get_blob("q").value) == 1
    run(ws, "TensorProtosDBInput", ["reader"], ["x", "y"])
    assert ws.fetch("x").tolist() == [3.0] and ws.get_blob("reader").value.pos == 3


def test_a_queue_db_feeds_tensor_protos_db_input_in_order():
    check_queue_db_batches()


def test_the_queue_db_check_catches_a_reader_that_skips(broken):
    def skipping(xp, queue, *, key_blob_index, value_blob_index, timeout_secs):
        from stepnet.ops.queue import BlobsQueueDBReader
        reader = BlobsQueueDBReader(queue, key_blob_index, value_blob_index)
        original, skipped = reader.read, []

        def read():   # drops the first record
            if not skipped:
                skipped.append(original())
            return original()
        reader.read = read
        return reader
    broken("CreateBlobsQueueDB", skipping)
    with pytest.raises(AssertionError):
        check_queue_db_batches()


def test_queue_db_keys_and_empty_queues():
    ws = queue_db([("first", b"payload")], key_blob_index=0)
    reader = ws.get_blob("reader").value
    key, value, where = reader.read()
    assert (key, value) == ("first", b"payload") and "queue 'q', record 0" in where
    with pytest.raises(OpError, match="queue 'q' is empty and open"):
        reader.read()
    run(ws, "CloseBlobsQueue", ["q"], [])
    with pytest.raises(OpError, match="queue 'q' is closed and empty: the DB reader has no record left"):
        reader.read()


def test_queue_db_bad_inputs():
    ws = queue_db([(b"k", np.zeros(2, np.float32))])
    with pytest.raises(DTypeError, match="blob 1 must be a string or a string tensor, got .2,. float32"):
        run(ws, "TensorProtosDBInput", ["reader"], ["x"])
    with pytest.raises(ArgumentError, match="value_blob_index must be in .0, 2. for a queue of 2 blob.s., got 2"):
        run(ws, "CreateBlobsQueueDB", ["q"], ["r"], value_blob_index=2)
    with pytest.raises(DTypeError, match="input 0 must be a queue made by CreateBlobsQueue"):
        run(ws, "CreateBlobsQueueDB", ["status"], ["r"])
