"""The threads of a plan run (Caffe2's plan executor, concurrent part): a step with concurrent_substeps and more
than one substep, or with num_concurrent_instances > 1, runs each iteration as one thread per substep and
instance (thread i runs substep i mod n, as Caffe2 deals them out); the thread that runs the step waits for all
of them, running the step's report net at its interval meanwhile, then checks the step's should_stop_blob once.

Every thread of a run is in the run's core.waits.Group, which the queue ops' waits consult. The first failure in
any thread stops the group: the others raise core.waits.Stopped at their next net, iteration or wait, and the
run's own thread raises that failure. Ctrl-C (KeyboardInterrupt in the thread that started the run) stops the
group the same way, and is raised once every thread has stopped."""
from __future__ import annotations

import threading
from typing import Callable

from ..core.errors import PlanError
from ..core.waits import Group, Threads
from ..io.files import quoted

JOIN_POLL = 0.1   # seconds between the joining thread's looks (Ctrl-C, the report net's interval)
MAX_THREADS = 1024   # threads a run may have at once (a file asking for more is refused, not obeyed)


def run_threads(jobs: list[Callable[[], None]], group: Group, threads: Threads,
                tick: Callable[[], None] | None = None) -> None:
    """Run each job in its own thread of group and wait for them all, calling tick() (the step's report) every
    JOIN_POLL seconds meanwhile. Raises Stopped when the group stopped (a job failed, here or elsewhere)."""
    group.check()
    if not jobs:
        return
    fork = group.fork(len(jobs))
    started: list[threading.Thread] = []
    try:
        for k, job in enumerate(jobs):
            worker = threading.Thread(target=_work, args=(job, group, threads, fork), daemon=True,
                                      name=f"stepnet-plan-{k}")
            worker.start()
            started.append(worker)
    except BaseException as e:           # (a thread that cannot start: the group stops)
        group.fail(e)
        for _ in range(len(jobs) - len(started)):
            group.finish(fork)
    try:
        _join(started, group, tick)
    except BaseException as e:           # Ctrl-C while joining: stop the threads, then let it out
        group.fail(e)
        _join(started, group, None)
        raise
    group.check()


def _join(workers: list[threading.Thread], group: Group, tick) -> None:
    for worker in workers:
        while worker.is_alive():
            worker.join(JOIN_POLL)
            if tick is not None and worker.is_alive() and group.failure is None:
                group.resume()           # the joining thread runs the report net: it counts as running
                try:
                    tick()
                finally:
                    group.pause()


def _work(job, group: Group, threads: Threads, fork: list) -> None:
    threads.enter(group)
    try:
        group.check()
        job()
    except BaseException as e:          # noqa: BLE001 - kept as the group's failure, raised by the run's thread
        group.fail(e)
    finally:
        threads.leave(None)
        group.finish(fork)


def deal(substeps: list, instances: int) -> list:
    """The substep each thread runs: thread i takes substep i mod n, n x instances threads in all."""
    return [substeps[i % len(substeps)] for i in range(len(substeps) * instances)] if substeps else []


def check_threads(step, count: int, group: Group) -> None:
    """A PlanError when starting count more threads would take the run past MAX_THREADS."""
    if group.running + count > MAX_THREADS:
        raise PlanError(f"execution step {quoted(step.name or '<unnamed step>')} would run {count} threads at once "
                        f"({len(step.substep)} substep(s) x num_concurrent_instances="
                        f"{max(1, step.num_concurrent_instances)}), {group.running} running already, more than the "
                        f"{MAX_THREADS} a run may have; lower num_concurrent_instances")


def is_concurrent(step) -> bool:
    """Whether a step runs its substeps in threads (Caffe2's rule: several substeps with concurrent_substeps, or
    several instances)."""
    return (step.concurrent_substeps and len(step.substep) > 1) or step.num_concurrent_instances > 1


def raise_failure(group: Group) -> None:
    """In the run's own thread, after Stopped: the failure that stopped the group."""
    failure = group.failure
    if failure is None:
        raise RuntimeError("a plan's threads stopped without a failure")
    raise failure

