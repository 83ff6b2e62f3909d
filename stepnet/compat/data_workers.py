"""Caffe2's data_workers: Python threads that fetch data and feed it to a net through blob queues.

    coordinator = data_workers.init_data_input_workers(
        model, ["data", "label"], my_fetch_fun, batch_size=32, input_source_name="train")
    coordinator.start()
    ...                      # each run of model.net dequeues one batch into "data" and "label"
    coordinator.stop()

`fetch_fun(worker_id, batch_size)` returns one numpy array per input blob, with any number of samples (the batch
size is a hint). Fetcher threads (`num_worker_threads`) put what they fetch on a Python queue of
`max_buffered_batches` chunks, one per `input_source_name` and shared by every call with that name; one enqueuer
thread regroups the chunks into batches of exactly `batch_size` samples along each input's `batch_columns` entry
(0 by default; with `dont_rebatch=True` chunks go as they are) and writes each array into a Caffe2 blob queue
`<blob>_c2queue_<input_source_name>` (capacity 4, through the scratch blob `<namescope><blob>_scratch_<source>`).
The net gets one DequeueBlobs op per input, which waits up to `timeout` seconds for a batch.

Stopping closes the Caffe2 queues (waking the enqueuer and a waiting net) and joins the threads; init_fun,
external_loggers and the coordinator objects are parallel_workers'.
"""
from __future__ import annotations

import logging
import queue
import time

import numpy as np

from .. import caffe2_pb2
from . import core, scope, utils, workspace
from .parallel_workers import (GlobalWorkerCoordinator, Metrics, State, Worker, WorkerCoordinator, WorkerThread,
                               run_worker)

log = logging.getLogger("data_workers")
log.setLevel(logging.INFO)
LOG_INT_SECS = 60
GET_POLL_SECS = 0.5    # how often a blocked Python-queue get or put looks whether its coordinator still runs
SLOW_WARNING_SECS = 10.0


def get_worker_ids(num_workers) -> list:
    return list(range(num_workers))


def init_data_input_workers(net, input_blob_names, fetch_fun, batch_size, num_worker_threads=2,
                            input_source_name="train", max_buffered_batches=800, init_fun=None,
                            external_loggers=None, dont_rebatch=False, batch_columns=None, timeout=600):
    """Add the dequeue ops to net and make the fetcher and enqueuer threads (started by start()); returns the
    process-wide GlobalCoordinator."""
    device_option = scope.CurrentDeviceScope()
    if device_option is None:
        device_option = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU)
    metrics = Metrics(external_loggers)
    feeder = BatchFeeder(net, input_blob_names, batch_size, device_option, scope.CurrentNameScope(),
                         input_source_name, global_coordinator.get_queue(input_source_name, max_buffered_batches),
                         metrics, dont_rebatch, batch_columns, timeout=timeout)
    coordinator = WorkerCoordinator(input_source_name, init_fun, feeder)
    threads = [
        WorkerThread(f"data_workers fetcher id {worker_id}", run_worker,
                     [coordinator, DataWorker(coordinator, worker_id, fetch_fun, metrics, batch_size, feeder)])
        for worker_id in (global_coordinator.get_new_worker_id() for _ in range(num_worker_threads))]
    threads.append(WorkerThread(f"Enqueuer {input_source_name} {scope.CurrentNameScope()}", enqueuer,
                                [coordinator, feeder]))
    coordinator._workers = threads
    global_coordinator.add(coordinator)
    return global_coordinator


class BatchFeeder(State):
    """Between the fetchers and the net: the Python queue of fetched chunks, the Caffe2 queues, the scratch blobs
    and the batching."""

    def __init__(self, net, input_blob_names, batch_size, device_option, namescope, input_source_name, queue,
                 metrics, dont_rebatch, batch_columns, timeout=600):
        self._counter = 0
        self._input_blob_names = input_blob_names
        self._batch_size = batch_size
        self._internal_queue = queue
        self._queues: list = []
        self._device_option = device_option
        self._namescope = namescope
        self._timeout = timeout
        self._input_source_name = input_source_name
        self._c2_queue_capacity = 4
        self._create_caffe2_queues(net)
        self._create_caffe2_ops(net)
        self._inputs = 0
        self._prev_seconds = 0
        self._last_warning = time.time()
        self._dont_rebatch = dont_rebatch
        self._init_scratch()
        self._metrics = metrics
        self._batch_columns = [0] * len(input_blob_names) if batch_columns is None else batch_columns

    # ------------------------------------------------------------------------------------ State
    def start(self) -> None:
        self._inputs = 0
        self._prev_seconds = time.time()

    def stop(self) -> None:
        try:
            for q in self._queues:
                workspace.RunOperatorOnce(core.CreateOperator("CloseBlobsQueue", [q], []))
        finally:
            self._log_inputs_per_interval(0, force=True)

    def cleanup(self) -> None:
        utils.ResetBlobs(self._scratch_blob.values())
        utils.ResetBlobs(self._scratch_status.values())

    # ------------------------------------------------------------------------------------ fetched chunks
    def _get(self, coordinator):
        """The next chunk from the Python queue, or None once the coordinator stopped."""
        start = last_warning = time.time()
        while coordinator.is_active():
            try:
                return self._internal_queue.get(block=True, timeout=GET_POLL_SECS)
            except queue.Empty:
                if time.time() - last_warning > SLOW_WARNING_SECS:
                    log.warning(f"** Data input is slow: (still) no data in {time.time() - start} secs.")
                    last_warning = time.time()
        return None

    def _validate_chunk(self, chunk) -> bool:
        if chunk is None:
            log.warning("Fetcher function returned None")
            return False
        assert len(chunk) == len(self._input_blob_names), "Expecting data blob for each input"
        for d in chunk:
            assert isinstance(d, np.ndarray), "Fetcher function must return a numpy array"
        if not self._dont_rebatch:
            samples = chunk[0].shape[self._batch_columns[0]]
            for j, d in enumerate(chunk[1:], 1):
                assert d.shape[self._batch_columns[j]] == samples, \
                    "Each returned input must have equal number of samples"
        if len(chunk) == 0:
            log.warning("Worker provided zero length input")
            return False
        return True

    def put(self, chunk, coordinator) -> None:
        """A fetcher's chunk onto the Python queue (waiting for room while the coordinator runs)."""
        if not self._validate_chunk(chunk):
            return
        while coordinator.is_active():
            qsize = self._internal_queue.qsize()
            if qsize < 2 and time.time() - self._last_warning > LOG_INT_SECS:
                log.warning(f"Warning, data loading lagging behind: name={self._input_source_name}")
                self._last_warning = time.time()
            self._counter += 1
            try:
                self._internal_queue.put(chunk, block=True, timeout=GET_POLL_SECS)
            except queue.Full:
                log.debug("Queue full: stalling fetchers...")
                continue
            self._log_inputs_per_interval(chunk[0].shape[0])
            return

    # ------------------------------------------------------------------------------------ batches
    def _enqueue_batch_direct(self, coordinator) -> None:
        data = self._get(coordinator)
        if data is not None and coordinator.is_active():
            for blob, q, arr in zip(self._input_blob_names, self._queues, data):
                self._enqueue(blob, q, arr)

    def _enqueue_batch(self, coordinator) -> None:
        """Gather chunks into one batch of batch_size samples (the rest goes back to the Python queue) and write
        it to the Caffe2 queues; with dont_rebatch one chunk as it is."""
        if self._dont_rebatch:
            self._enqueue_batch_direct(coordinator)
            return
        first_col = self._batch_columns[0]
        batch = [None] * len(self._input_blob_names)

        def samples():
            return 0 if batch[0] is None or batch[0].shape[0] == 0 else batch[0].shape[first_col]

        while samples() < self._batch_size and coordinator.is_active():
            chunk = self._get(coordinator)
            if chunk is None:
                continue
            for j, part in enumerate(chunk):
                batch[j] = part.copy() if batch[j] is None or batch[j].shape[0] == 0 else \
                    np.append(batch[j], part, axis=self._batch_columns[j])
        start = time.time()
        try:
            if samples() > self._batch_size:
                pieces = [np.split(b, [self._batch_size], axis=self._batch_columns[j]) for j, b in enumerate(batch)]
                batch = [p[0] for p in pieces]
                try:
                    self._internal_queue.put([p[1] for p in pieces], block=False)
                except queue.Full:
                    pass
            if coordinator.is_active() and batch[0] is not None:
                for blob, q, arr in zip(self._input_blob_names, self._queues, batch):
                    self._enqueue(blob, q, arr)
        finally:
            self._metrics.put_metric("enqueue_time", time.time() - start)

    def _init_scratch(self) -> None:
        """The scratch blobs the enqueuer writes through, made here (empty) so that its threads only feed them."""
        self._scratch_blob, self._scratch_status = {}, {}
        for name in self._input_blob_names:
            scratch = f"{self._namescope}{name}_scratch_{self._input_source_name}"
            self._scratch_blob[name] = core.BlobReference(scratch)
            self._scratch_status[name] = core.BlobReference(scratch + "_status")
        for blob in [*self._scratch_blob.values(), *self._scratch_status.values()]:
            workspace.FeedBlob(blob, np.array([], dtype=np.float32), device_option=self._device_option)

    def _enqueue(self, blob_name, queue, data_arr) -> None:
        """One input's batch into its Caffe2 queue (waits while the queue is full; closing it ends the wait)."""
        scratch, status = self._scratch_blob[blob_name], self._scratch_status[blob_name]
        workspace.FeedBlob(scratch, data_arr, device_option=self._device_option)
        workspace.RunOperatorOnce(core.CreateOperator(
            "SafeEnqueueBlobs", [queue, scratch], [scratch, status], device_option=self._device_option))

    def _create_caffe2_queues(self, net) -> None:
        for name in self._input_blob_names:
            qname = f"{name}_c2queue_{self._input_source_name}"
            workspace.RunOperatorOnce(core.CreateOperator(
                "CreateBlobsQueue", [], [qname], num_blobs=1, capacity=self._c2_queue_capacity))
            self._queues.append(core.ScopedBlobReference(qname))

    def _create_caffe2_ops(self, net) -> None:
        for q, name in zip(self._queues, self._input_blob_names):
            net.DequeueBlobs(q, name, timeout_secs=float(self._timeout))

    def _log_inputs_per_interval(self, inputs, force: bool = False) -> None:
        self._inputs += inputs
        now = time.time()
        elapsed = now - self._prev_seconds
        if elapsed < LOG_INT_SECS and not force:
            return
        per_sec = int(self._inputs / elapsed) if elapsed > 0 else 0
        qsize = self._internal_queue.qsize()
        log.info(f"{self._input_source_name}/{self._namescope}: {per_sec} inputs/sec")
        log.info(f"-- queue: {qsize} batches")
        self._metrics.put_metric("inputs_per_sec", per_sec, False)
        self._metrics.put_metric("queue_size", qsize, False)
        self._metrics.put_metric("time_elapsed", elapsed, False)
        self._metrics.log_metrics()
        self._metrics.reset_metrics()
        self._inputs = 0
        self._prev_seconds = now


class GlobalCoordinator(GlobalWorkerCoordinator):
    """GlobalWorkerCoordinator with the Python queues of fetched chunks, one per input source name."""

    def __init__(self):
        super().__init__()
        self._queues: dict = {}

    def get_queue(self, queue_name, max_buffered_batches):
        assert isinstance(max_buffered_batches, int)
        if queue_name not in self._queues:
            self._queues[queue_name] = queue.Queue(maxsize=max_buffered_batches)
        return self._queues[queue_name]

    def _reset(self) -> None:
        super()._reset()
        self._queues = {}

    def reset_data_input(self, namescope, name, net, batch_size) -> None:
        """Give the sources named `name` under namescope a new batch size and their dequeue ops in net."""
        log.info(f"Reset data input {name}, batch size {batch_size}: ")
        for c in self._coordinators:
            if c._worker_name == name and c._state._namescope == namescope:
                c._state._batch_size = batch_size
                c._state._create_caffe2_ops(net)


class DataWorker(Worker):
    """A fetcher thread's work: fetch_fun(worker_id, batch_size), put on the Python queue."""

    def __init__(self, coordinator, worker_id, worker_fun, metrics, batch_size, batch_feeder):
        super().__init__(coordinator, worker_id, worker_fun=worker_fun, metrics=metrics)
        self._batch_size = batch_size
        self._batch_feeder = batch_feeder

    def run(self) -> None:
        self._batch_feeder.put(self._worker_fun(self._worker_id, self._batch_size), self._coordinator)

    def finish(self) -> None:
        self._metrics.put_metric("fetcher_time", time.time() - self._start_time)


def enqueuer(coordinator, batch_feeder) -> None:
    """The enqueuer thread's loop: batches into the Caffe2 queues while the coordinator runs."""
    while coordinator.is_active():
        with coordinator._stoppable():
            batch_feeder._enqueue_batch(coordinator)


global_coordinator = GlobalCoordinator()
