"""Plans whose substeps run in threads (runtime.concurrent) and the queue ops' waits between them (core.waits):
records move from producers to consumers exactly once, a wait no thread could end is one quick error, closing a
queue wakes a waiting consumer, a failure in one thread stops the others, Ctrl-C stops a run. Each check is
shown to fail on a deliberately broken runtime or kernel."""
from __future__ import annotations

import _thread
import threading
import time

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core import waits
from stepnet.core.errors import OpError
from stepnet.core.waits import Deadlock
from stepnet.io.proto import parse_text
from stepnet.ops.queue import BlobsQueue
from stepnet.testing import make_op

N = 40   # records per producer


def fill(name: str, value, dtype: int = 10, shape=(1,)) -> str:
    dims = " ".join(f"ints: {d}" for d in shape)
    return (f'op {{ type: "ConstantFill" output: "{name}" arg {{ name: "shape" {dims} }} '
            f'arg {{ name: "value" i: {value} }} arg {{ name: "dtype" i: {dtype} }} }}')


def plan_text(producers: int, consumers: int, capacity: int = 2) -> str:
    """Producers p enqueue p*1000 + 1..N (one int64 record each), then the queue is closed; each consumer c
    dequeues (SafeDequeueBlobs) and appends the record to its own list `got_c` until the status says closed."""
    init = [f'op {{ type: "CreateBlobsQueue" output: "q" arg {{ name: "capacity" i: {capacity} }} }}']
    nets, prod, cons = [], [], []
    for p in range(producers):
        init += [fill(f"it{p}", p * 1000)]
        nets.append(f'network {{ name: "produce{p}" op {{ type: "Iter" input: "it{p}" output: "it{p}" }} '
                    f'op {{ type: "Copy" input: "it{p}" output: "rec{p}" }} '
                    f'op {{ type: "SafeEnqueueBlobs" input: ["q", "rec{p}"] output: ["rec{p}", "ps{p}"] }} }}')
        prod.append(f'substep {{ name: "producer{p}" network: "produce{p}" num_iter: {N} }}')
    for c in range(consumers):
        init += [fill(f"got{c}", 0, shape=(0,))]
        nets.append(f'network {{ name: "take{c}" op {{ type: "SafeDequeueBlobs" input: "q" '
                    f'output: ["x{c}", "st{c}"] }} }}')
        nets.append(f'network {{ name: "keep{c}" op {{ type: "Append" input: ["got{c}", "x{c}"] output: "got{c}" }} }}')
        cons.append(f'substep {{ name: "consumer{c}" network: ["take{c}", "keep{c}"] should_stop_blob: "st{c}" }}')
    nets.append('network { name: "close" op { type: "CloseBlobsQueue" input: "q" } }')
    return f"""name: "pc"
network {{ name: "init" {' '.join(init)} }}
{chr(10).join(nets)}
execution_step {{ name: "init" network: "init" }}
execution_step {{ name: "work" concurrent_substeps: true
  substep {{ name: "producing" substep {{ name: "producers" concurrent_substeps: true {' '.join(prod)} }}
                               substep {{ name: "closing" network: "close" }} }}
  substep {{ name: "consumers" concurrent_substeps: true {' '.join(cons)} }} }}"""


def check_exactly_once(producers: int = 3, consumers: int = 2) -> None:
    ws = Workspace()
    ws.run_plan(parse_text(plan_text(producers, consumers), "plan"))
    got = sorted(v for c in range(consumers) for v in ws.fetch(f"got{c}").tolist())
    assert got == sorted(p * 1000 + k for p in range(producers) for k in range(1, N + 1))


def test_producers_and_consumers_move_every_record_exactly_once():
    check_exactly_once()
    check_exactly_once(producers=1, consumers=4)


def test_the_check_catches_a_dequeue_that_loses_records(patched):
    from stepnet.ops import REGISTRY

    kernel, calls = REGISTRY.get("SafeDequeueBlobs").kernel, [0]

    def lossy(ctx, xp, queue, **args):     # every third call throws a record away and takes the next
        calls[0] += 1
        if calls[0] % 3 == 0:
            kernel(ctx, xp, queue, **args)
        return kernel(ctx, xp, queue, **args)
    patched("SafeDequeueBlobs", kernel=lossy)
    with pytest.raises(AssertionError):
        check_exactly_once()


# --------------------------------------------------------------------------------------------- deadlocks
LONE = """name: "lone"
network { name: "init" op { type: "CreateBlobsQueue" output: "q" } }
network { name: "take" op { type: "SafeDequeueBlobs" input: "q" output: ["x", "st"] } }
execution_step { name: "init" network: "init" }
execution_step { name: "consume" network: "take" }"""

BOTH_WAIT = """name: "both"
network { name: "init" op { type: "CreateBlobsQueue" output: "q" } op { type: "CreateBlobsQueue" output: "q2" }
  op { type: "ConstantFill" output: "d" arg { name: "shape" ints: 1 } } }
network { name: "take" op { type: "SafeDequeueBlobs" input: "q" output: ["x", "st"] } }
network { name: "put" op { type: "EnqueueBlobs" input: ["q2", "d"] output: ["d"] } }
execution_step { name: "init" network: "init" }
execution_step { name: "work" concurrent_substeps: true
  substep { name: "consumer" network: "take" } substep { name: "filler" network: "put" num_iter: 2 } }"""


def in_thread(ws, plan, seconds: float):
    """Run the plan in a daemon thread for up to `seconds`: (finished, the error it raised or None)."""
    out = []

    def go():
        try:
            ws.run_plan(plan)
            out.append(None)
        except BaseException as e:      # noqa: BLE001
            out.append(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive()), (out[0] if out else None), t


def check_deadlock_is_one_quick_error(text: str, *parts: str) -> None:
    ws = Workspace()
    start = time.monotonic()
    finished, error, _ = in_thread(ws, parse_text(text, "plan"), 3.0)
    assert finished, "the plan still waits"
    assert isinstance(error, Deadlock) and time.monotonic() - start < 2.0, error
    line = str(error)
    assert "\n" not in line and all(p in line for p in parts), line


def test_a_consumer_alone_on_an_empty_queue_is_one_quick_error():
    check_deadlock_is_one_quick_error(LONE, "net 'take', op #0 (SafeDequeueBlobs): queue 'q' is empty and open, and "
                                            "no other thread of this run can write to it: Caffe2 would wait forever")


def test_every_thread_waiting_is_a_deadlock_naming_them_all():
    check_deadlock_is_one_quick_error(BOTH_WAIT, "every other thread of this run waits too",
                                      "queue 'q' is empty and open", "queue 'q2' is full (1 records) and open",
                                      "net 'take', op #0 (SafeDequeueBlobs)", "net 'put', op #0 (EnqueueBlobs)")


def test_the_check_catches_a_coordinator_that_never_sees_a_deadlock(monkeypatch):
    monkeypatch.setattr(waits.Group, "_stuck", lambda self, token: False)
    ws = Workspace()
    finished, _, thread = in_thread(ws, parse_text(LONE, "plan"), 0.5)
    assert not finished                       # the check above would fail: the plan hangs ...
    ws.get_blob("q").value.close()            # ... until the queue is closed here
    thread.join(5)
    assert not thread.is_alive() and bool(ws.fetch("st"))


# --------------------------------------------------------------------------------------------- closing wakes
def check_close_wakes_a_waiting_consumer(close) -> None:
    """A thread waits in SafeDequeueBlobs on an empty queue (the main thread runs, so the wait goes on); closing
    the queue wakes it with status true."""
    ws = Workspace()
    ws.run_operator_once(make_op("CreateBlobsQueue", [], ["q"]))
    queue: BlobsQueue = ws.get_blob("q").value
    consumer = threading.Thread(target=ws.run_operator_once,
                                args=(make_op("SafeDequeueBlobs", ["q"], ["x", "st"]),), daemon=True)
    consumer.start()
    try:
        deadline = time.monotonic() + 5
        while not queue.signal._tokens and time.monotonic() < deadline:
            time.sleep(0.005)
        assert queue.signal._tokens, "the consumer never waited"
        close(queue)
        consumer.join(1.0)
        assert not consumer.is_alive(), "closing did not wake the consumer"
        assert bool(ws.fetch("st"))
    finally:
        queue.close()
        consumer.join(5)


def test_closing_a_queue_wakes_a_waiting_consumer():
    check_close_wakes_a_waiting_consumer(BlobsQueue.close)


def test_the_check_catches_a_close_that_does_not_close():
    def notify_only(queue):
        with queue.signal:
            queue.signal.notify()
    with pytest.raises(AssertionError, match="did not wake"):
        check_close_wakes_a_waiting_consumer(notify_only)


# --------------------------------------------------------------------------------------------- failures, Ctrl-C
FAILING = """name: "fail"
network { name: "init" op { type: "CreateBlobsQueue" output: "dead" } op { type: "CloseBlobsQueue" input: "dead" }
  FILL_IT FILL_LIMIT }
network { name: "spin" op { type: "Iter" input: "it" output: "it" }
  op { type: "GE" input: ["it", "limit"] output: "stop" } }
network { name: "boom" op { type: "DequeueBlobs" input: "dead" output: "o" } }
execution_step { name: "init" network: "init" }
execution_step { name: "work" concurrent_substeps: true
  substep { name: "spinner" network: "spin" should_stop_blob: "stop" }
  substep { name: "failing" network: "boom" } }""".replace(
    "FILL_IT", fill("it", 0)).replace("FILL_LIMIT", fill("limit", 10**12))


def plan_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith("stepnet-plan-")]


def test_a_failure_in_one_thread_stops_the_others_and_is_raised():
    ws = Workspace()
    start = time.monotonic()
    finished, error, _ = in_thread(ws, parse_text(FAILING, "plan"), 5.0)
    assert finished and time.monotonic() - start < 3.0
    assert isinstance(error, OpError) and "net 'boom', op #0 (DequeueBlobs): queue 'dead' is closed and empty" in str(
        error)
    assert int(ws.fetch("it")[0]) < 10**12 and not plan_threads()


def test_the_check_catches_threads_that_never_stop(monkeypatch):
    monkeypatch.setattr(waits.Group, "check", lambda self: None)
    ws = Workspace()
    finished, _, thread = in_thread(ws, parse_text(FAILING, "plan"), 0.5)
    assert not finished                       # the spinner goes on after the failure ...
    ws.feed("limit", np.zeros(1, np.int64))   # ... until its stop blob is made true here
    thread.join(5)
    assert not thread.is_alive()


def test_ctrl_c_stops_a_concurrent_run():
    """Consumers wait on an empty queue while a spinner runs; Ctrl-C (in the main thread, which joins them)
    stops every thread, and the KeyboardInterrupt comes out of run_plan."""
    text = FAILING.replace('substep { name: "failing" network: "boom" }',
                           'substep { name: "c1" network: "take" } substep { name: "c2" network: "take" }').replace(
        'network { name: "boom"', 'network { name: "take" op { type: "SafeDequeueBlobs" input: "q" '
                                  'output: ["x", "st"] } }\nnetwork { name: "boom"').replace(
        'op { type: "CloseBlobsQueue" input: "dead" }', 'op { type: "CreateBlobsQueue" output: "q" }')
    ws = Workspace()
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        ws.run_plan(parse_text(text, "plan"))
    timer.join()
    assert time.monotonic() - start < 3.0 and not plan_threads()


def test_training_loops_stop_at_concurrent_steps():
    """A concurrent step with num_iter heads a loop of its own iterations; loops inside it run in threads and are
    not counted (nor checkpointed)."""
    from stepnet.runtime.plan import training_loops
    p = parse_text("""name: "p" network { name: "n" }
        execution_step { name: "epochs" num_iter: 3 concurrent_substeps: true
          substep { name: "a" network: "n" num_iter: 5 } substep { name: "b" network: "n" } }
        execution_step { name: "once" concurrent_substeps: true
          substep { name: "c" network: "n" num_iter: 5 } substep { name: "d" network: "n" } }""", "plan")
    loops = training_loops(p)
    assert list(loops) == [(0,)] and loops[(0,)].units == 3 and len(loops[(0,)].steps) == 1


def test_the_report_net_runs_while_the_threads_do():
    """As Caffe2's reporter thread does, the report net runs at its interval while a concurrent step's threads
    run (here for about 0.35 s: its thread runs it every JOIN_POLL), then after the iteration and at the end."""
    text = f"""name: "rep"
network {{ name: "init" {fill("it", 0)} {fill("r", 0)} {fill("limit", 10**12)} }}
network {{ name: "spin" op {{ type: "Iter" input: "it" output: "it" }}
  op {{ type: "GE" input: ["it", "limit"] output: "stop" }} }}
network {{ name: "rep" op {{ type: "Iter" input: "r" output: "r" }} }}
network {{ name: "noop" }}
execution_step {{ name: "init" network: "init" }}
execution_step {{ name: "work" concurrent_substeps: true report_net: "rep" report_interval: 0
  substep {{ name: "spinner" network: "spin" should_stop_blob: "stop" }}
  substep {{ name: "idle" network: "noop" }} }}"""
    ws = Workspace()
    timer = threading.Timer(0.35, lambda: ws.feed("limit", np.zeros(1, np.int64)))
    timer.start()
    ws.run_plan(parse_text(text, "plan"))
    timer.join()
    assert int(ws.fetch("r")[0]) >= 2 + 1 + 1     # at least 2 while joining, after the iteration, at the end


def test_the_last_thread_to_end_hands_its_place_back_to_the_joining_one():
    """Between a fork's last thread ending and the joining thread going on, the group never counts fewer
    running threads (a waiting thread elsewhere would take that moment for a deadlock)."""
    group = waits.Group()
    fork = group.fork(3)
    assert group.running == 3
    for left in (2, 1, 1):
        group.finish(fork)
        assert group.running == left


def test_a_step_asking_for_too_many_threads_is_refused():
    from stepnet.core.errors import PlanError
    text = ('name: "p" network { name: "n" } execution_step { name: "many" num_concurrent_instances: 1000000000 '
            'substep { network: "n" } substep { network: "n" } }')
    with pytest.raises(PlanError, match="'many' would run 2000000000 threads at once .2 substep.s. x "
                                        "num_concurrent_instances=1000000000., 1 running already, more than the 1024"):
        Workspace().run_plan(parse_text(text, "plan"))
