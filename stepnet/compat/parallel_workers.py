"""Caffe2's parallel_workers: a function run over and over on worker threads until its coordinator stops.

    coordinator = parallel_workers.init_workers(my_worker_fun, worker_name="train")
    coordinator.start()          # init functions first (one after another), then every thread
    ...
    coordinator.stop()           # True when every thread ended

`worker_fun(worker_id)` is called in a loop on each of `num_worker_threads` threads; `init_fun(worker_coordinator,
global_coordinator)` runs once before the threads start, `shutdown_fun()` when the coordinator stops. What
init_workers returns is the process-wide GlobalWorkerCoordinator, the same object every time; each call adds one
WorkerCoordinator to it. Worker ids are numbered across all calls.

A worker's exception is logged and stops its coordinator (the other threads end after their current call). The
threads are daemon threads, as Caffe2's, so a program that never stops them can still exit (the coordinator is
stopped at exit too); they count as live threads for the blob queues' no-hang rule (core.waits), so a queue op
in another thread waits for them as it waits for the program's own threads. Where Caffe2's stop leaves a thread
blocked in a queue op (a full queue nobody reads) for good, here stopping also ends such a wait: the op is
abandoned (nothing is enqueued or dequeued) and the thread ends.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import threading
import time
import traceback

from ..core.waits import FreeGroup, Stopped
from ._workspaces import _ws

log = logging.getLogger("parallel_workers")
log.setLevel(logging.INFO)
LOG_INT_SECS = 60
JOIN_SECS = 5.0   # how long stopping waits for each thread (one may be stuck in I/O)


class WorkerThread(threading.Thread):
    """A worker's thread: a daemon, counted by core.waits as a thread that can still make progress."""

    counts_for_waits = True

    def __init__(self, name: str, target, args):
        super().__init__(target=target, name=name, args=args, daemon=True)


class Metrics:
    """Sums of named measurements (and how many went into each), handed to external loggers' log(dict)."""

    def __init__(self, external_loggers):
        self._external_loggers = external_loggers
        self.reset_metrics()

    def reset_metrics(self) -> None:
        self._metrics = collections.defaultdict(int)

    def log_metrics(self) -> None:
        for logger in self._external_loggers or ():
            try:
                logger.log(self._metrics)
            except Exception as e:
                print(f"Failed to call ExternalLogger: {e}")

    def put_metric(self, key, value, count: bool = True) -> None:
        self._metrics[key] += value
        if count:
            self._metrics[f"{key}_count"] += 1


class State:
    """What a coordinator starts, stops and cleans up besides its threads (data_workers' batch feeder). The
    methods do nothing here: Caffe2 marks them abstract without enforcing it, so a subclass may leave any out."""

    def start(self):
        pass

    def stop(self):
        pass

    def cleanup(self):
        pass


class WorkerCoordinator:
    """One named set of worker threads with its init and shutdown functions and optional State."""

    def __init__(self, worker_name, init_fun, state=None, shutdown_fun=None):
        self._active = True
        self._started = False
        self._workers: list = []
        self._worker_name = worker_name
        self._init_fun = init_fun
        self._state = state
        self._shutdown_fun = shutdown_fun
        self._wait_groups: dict = {}   # per workspace tree: the group its threads' queue waits are in

    def is_active(self) -> bool:
        return self._active

    def init(self, global_coordinator) -> None:
        if self._init_fun is not None and not self._started:
            self._init_fun(self, global_coordinator)

    def _start(self) -> None:
        if self._started:
            return
        self._active = self._started = True
        self._wait_groups = {}
        if self._state is not None:
            self._state.start()
        for thread in self._workers:
            thread.start()

    def _stop(self, reason=None) -> None:
        """Tell the threads to end (they finish their current call); reason: the error that stopped it."""
        self._active = False
        for group in list(self._wait_groups.values()):
            group.fail(RuntimeError(f"workers {self._worker_name!r} stopped"))
        if reason is not None:
            log.error(f"Data input failed due to an error: {reason}")
        if self._shutdown_fun is not None and self._started:
            self._shutdown_fun()
        if self._state is not None:
            self._state.stop()
        self._started = False

    @contextlib.contextmanager
    def _stoppable(self):
        """Run a worker's call with its queue waits in this coordinator's group, which _stop() fails: a wait then
        raises Stopped, which ends the call quietly."""
        threads = _ws().waits
        group = self._wait_groups.get(id(threads))
        if group is None or group.threads is not threads:
            group = self._wait_groups[id(threads)] = FreeGroup(threads)
            if not self._active:
                group.fail(RuntimeError(f"workers {self._worker_name!r} stopped"))
        previous = threads.enter(group)
        try:
            yield
        except Stopped:
            pass
        finally:
            threads.leave(previous)

    def _wait_finish(self, cleanup=None) -> bool:
        """Join the threads (up to JOIN_SECS each); True when all ended (the State is then cleaned up)."""
        print(f"Wait for workers to die: {self._worker_name}")
        current = threading.current_thread()
        for thread in self._workers:
            if thread is not current and thread.ident is not None:
                thread.join(JOIN_SECS)
        alive = [t for t in self._workers if t.is_alive() and t is not current]
        for thread in alive:
            print(f"Worker {thread} failed to close while waiting")
        success = not alive
        if success and self._state is not None:
            self._state.cleanup()
        print(f"All workers terminated: {success}")
        return success


class GlobalWorkerCoordinator:
    """Every coordinator of the process, and the worker ids handed out so far."""

    def __init__(self):
        self._coordinators: list = []
        self._fetcher_id_seq = 0
        self._worker_ids: list = []
        self.register_shutdown_handler()

    def add(self, coordinator) -> None:
        self._coordinators.append(coordinator)

    def get_new_worker_id(self) -> int:
        worker_id = self._fetcher_id_seq
        self._fetcher_id_seq += 1
        self._worker_ids.append(worker_id)
        return worker_id

    def get_worker_ids(self) -> list:
        return self._worker_ids

    def start(self) -> None:
        """Every coordinator's init function, one after another, then every thread."""
        for c in self._coordinators:
            c.init(self)
        for c in self._coordinators:
            c._start()

    def stop(self) -> bool:
        """Stop every coordinator and forget them; True when all their threads ended."""
        for c in self._coordinators:
            c._stop()
        results = [c._wait_finish() for c in self._coordinators]
        self._coordinators = []
        return all(results)

    def stop_coordinator(self, worker_name) -> None:
        """Stop the coordinators named worker_name and forget them."""
        for c in self._coordinators:
            if c._worker_name == worker_name:
                c._stop()
                c._wait_finish()
        self._coordinators = [c for c in self._coordinators if c._worker_name != worker_name]

    def _reset(self) -> None:
        """Stop every coordinator and number workers from 0 again (compat.state.reset: a fresh process's state)."""
        self.stop()
        self._fetcher_id_seq = 0
        self._worker_ids = []

    def register_shutdown_handler(self) -> None:
        atexit.register(self.stop)


class Worker:
    """One thread's work: start() before each call, run() the call, finish() after it."""

    def __init__(self, coordinator, worker_id, worker_fun=None, metrics=None):
        self._coordinator = coordinator
        self._worker_id = worker_id
        self._worker_fun = worker_fun
        self._metrics = metrics

    def start(self) -> None:
        self._start_time = time.time()

    def run(self) -> None:
        self._worker_fun(self._worker_id)

    def handle_exception(self, e) -> None:
        traceback.print_exc()
        log.exception(f"Exception in worker {self._worker_id}")
        self._coordinator._stop(f"Exception in worker {self._worker_id}: {e}")

    def finish(self) -> None:
        self._metrics.put_metric("worker_time", time.time() - self._start_time)
        self._metrics.log_metrics()


def run_worker(coordinator, worker) -> None:
    """A worker thread's loop: the worker's call again and again while its coordinator is active."""
    while coordinator.is_active():
        worker.start()
        try:
            with coordinator._stoppable():
                worker.run()
        except Exception as e:
            worker.handle_exception(e)
        finally:
            worker.finish()


def init_workers(worker_fun, num_worker_threads: int = 2, worker_name: str = "train", init_fun=None,
                 external_loggers=None, shutdown_fun=None) -> GlobalWorkerCoordinator:
    """Make a coordinator of num_worker_threads threads calling worker_fun(worker_id) (started by start())."""
    metrics = Metrics(external_loggers)
    coordinator = WorkerCoordinator(worker_name, init_fun, shutdown_fun=shutdown_fun)
    coordinator._workers = [
        WorkerThread(f"parallel_workers worker id {worker_id}", run_worker,
                     [coordinator, Worker(coordinator, worker_id, worker_fun, metrics)])
        for worker_id in (global_coordinator.get_new_worker_id() for _ in range(num_worker_threads))]
    global_coordinator.add(coordinator)
    return global_coordinator


global_coordinator = GlobalWorkerCoordinator()
