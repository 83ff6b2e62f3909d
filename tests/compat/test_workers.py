"""compat.parallel_workers and compat.data_workers beyond Caffe2's own tests: a worker's exception stops its
coordinator, stopping ends a worker blocked on a full queue, an untimed dequeue in the main thread waits for the
workers (they count as live threads for the no-hang rule), and the batches data_workers makes from the fetchers'
chunks (exact sizes, every sample once, chunks as they are with dont_rebatch)."""
import threading
import time

import numpy as np
import pytest

from stepnet.compat import core, data_workers, model_helper, parallel_workers, workspace


def wait_until(condition, secs=5.0):
    end = time.monotonic() + secs
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


def live_workers():
    return [t for t in threading.enumerate() if isinstance(t, parallel_workers.WorkerThread) and t.is_alive()]


@pytest.fixture(autouse=True)
def no_workers_left():
    yield
    parallel_workers.global_coordinator.stop()
    data_workers.global_coordinator.stop()
    assert live_workers() == []


def make_queue(name, capacity):
    workspace.RunOperatorOnce(core.CreateOperator("CreateBlobsQueue", [], [name], num_blobs=1, capacity=capacity))


def enqueue(queue, blob, value):
    workspace.FeedBlob(blob, np.array([value], dtype=np.int64))
    workspace.RunOperatorOnce(core.CreateOperator("SafeEnqueueBlobs", [queue, blob], [blob, blob + "_status"]))


def dequeue(queue):
    workspace.RunOperatorOnce(core.CreateOperator("SafeDequeueBlobs", [queue], ["out", "out_status"]))
    return int(workspace.FetchBlob("out")[0])


def test_exception_in_a_worker_stops_its_coordinator(caplog):
    calls = []

    def worker(worker_id):
        calls.append(worker_id)
        if len(calls) == 3:
            raise ValueError("bad record")
        time.sleep(0.01)

    coordinator = parallel_workers.init_workers(worker, num_worker_threads=2, worker_name="failing")
    own = coordinator._coordinators[-1]
    coordinator.start()
    wait_until(lambda: not own.is_active())
    wait_until(lambda: live_workers() == [])   # both threads end after their current call
    assert "Exception in worker" in caplog.text and "bad record" in caplog.text
    assert coordinator.stop() is True


def test_stop_ends_a_worker_blocked_on_a_full_queue():
    make_queue("full", capacity=2)
    sent = []

    def worker(worker_id):
        enqueue("full", f"blob_{worker_id}", len(sent))
        sent.append(1)

    coordinator = parallel_workers.init_workers(worker, num_worker_threads=1, worker_name="blocked")
    coordinator.start()
    wait_until(lambda: len(sent) == 2)
    time.sleep(0.2)                           # the third enqueue waits: nobody reads
    assert len(sent) == 2 and len(live_workers()) == 1
    start = time.monotonic()
    assert coordinator.stop() is True         # Caffe2 would leave the thread blocked and return False
    assert time.monotonic() - start < 2.0
    assert [dequeue("full"), dequeue("full")] == [0, 1]   # the abandoned third record was never enqueued
    workspace.RunOperatorOnce(core.CreateOperator("CloseBlobsQueue", ["full"], []))
    workspace.RunOperatorOnce(core.CreateOperator("SafeDequeueBlobs", ["full"], ["out", "out_status"]))
    assert bool(workspace.FetchBlob("out_status")) is True   # closed and empty: nothing else was in it


def test_untimed_dequeue_in_the_main_thread_waits_for_a_worker():
    make_queue("slow", capacity=4)
    state = {"n": 0}

    def worker(worker_id):
        if state["n"] < 1:
            time.sleep(0.3)                   # the main thread dequeues from the empty queue meanwhile
            enqueue("slow", "slow_blob", 42)
            state["n"] += 1
        else:
            time.sleep(0.01)

    coordinator = parallel_workers.init_workers(worker, num_worker_threads=1, worker_name="slow")
    coordinator.start()
    assert dequeue("slow") == 42              # waited (no Deadlock: the daemon worker counts as live)
    assert coordinator.stop() is True


def counting_fetcher(chunk_sizes):
    """One fetcher's chunks of consecutive sample numbers: rows [k, k, k] with label k."""
    state = {"next": 0, "i": 0}

    def fetch(worker_id, batch_size):
        n = chunk_sizes[state["i"] % len(chunk_sizes)]
        state["i"] += 1
        ids = np.arange(state["next"], state["next"] + n, dtype=np.float64)
        state["next"] += n
        return [np.repeat(ids[:, None], 3, axis=1), ids.copy()]
    return fetch


def run_batches(model, count):
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    out = []
    for _ in range(count):
        workspace.RunNet(model.net.Proto().name)
        out.append((workspace.FetchBlob("data"), workspace.FetchBlob("label")))
    return out


def test_rebatching_gives_exact_batches_of_every_sample_once():
    model = model_helper.ModelHelper(name="rebatch")
    coordinator = data_workers.init_data_input_workers(
        model, ["data", "label"], counting_fetcher([5, 3, 7]), batch_size=8, num_worker_threads=1,
        input_source_name="rebatch", max_buffered_batches=16)
    coordinator.start()
    batches = run_batches(model, 12)
    assert coordinator.stop() is True
    seen = []
    for data, label in batches:
        assert data.shape == (8, 3) and label.shape == (8,)
        np.testing.assert_array_equal(data, np.repeat(label[:, None], 3, axis=1))
        seen += label.tolist()
    assert len(set(seen)) == len(seen) == 96   # no sample twice
    assert max(seen) < 96 + 16 * 7              # ... and none beyond what the buffer could have held


def test_dont_rebatch_passes_chunks_as_they_are_in_order():
    model = model_helper.ModelHelper(name="direct")
    coordinator = data_workers.init_data_input_workers(
        model, ["data", "label"], counting_fetcher([1, 2, 3, 4, 5]), batch_size=8, num_worker_threads=1,
        input_source_name="direct", dont_rebatch=True)
    coordinator.start()
    batches = run_batches(model, 10)
    assert coordinator.stop() is True
    assert [len(label) for _, label in batches] == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    np.testing.assert_array_equal(np.concatenate([label for _, label in batches]), np.arange(30.0))
    with pytest.raises(RuntimeError, match="holds no value"):     # cleanup reset the scratch blobs
        workspace.FetchBlob("data_scratch_direct")


def test_blob_and_queue_names_follow_caffe2():
    model = model_helper.ModelHelper(name="names")
    with core.NameScope("gpu_0"):
        data_workers.init_data_input_workers(model, ["data"], counting_fetcher([4]), batch_size=4,
                                             input_source_name="src")
    ops = model.net.Proto().op
    assert [(op.type, list(op.input), list(op.output)) for op in ops] == [
        ("DequeueBlobs", ["gpu_0/data_c2queue_src"], ["gpu_0/data"])]
    assert [a.f for a in ops[0].arg if a.name == "timeout_secs"] == [600.0]
    assert workspace.HasBlob("gpu_0/data_scratch_src") and workspace.HasBlob("gpu_0/data_scratch_src_status")
