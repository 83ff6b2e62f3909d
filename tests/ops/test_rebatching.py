"""Rebatching queues (stepnet/ops/rebatching.py): random batch sizes in and out against a FIFO of rows kept
here (each dequeue stacks its elements along a new first axis, as Caffe2's docs say), closing, the waits no
other thread could end, bad inputs, and a broken kernel caught (plans of several threads:
tests/test_concurrent_plan.py)."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.waits import Deadlock
from stepnet.core.errors import ArgumentError, ArityError, DTypeError, OpError, ShapeError
from stepnet.testing import make_op

rng = np.random.default_rng(13)


def run(ws, op_type, inputs, outputs, **args):
    ws.run_operator_once(make_op(op_type, inputs, outputs, **args))


def create(ws, capacity=50, num_blobs=2):
    run(ws, "CreateRebatchingQueue", [], ["q"], capacity=capacity, num_blobs=num_blobs)


def check_rebatching():
    """Batches of random sizes of (int32 [n], float32 [n, 2]) rows in, batches of other sizes out."""
    ws = Workspace()
    create(ws)
    pending, counter = [], 0
    for _ in range(12):
        n = int(rng.integers(1, 5))
        ids = np.arange(counter, counter + n, dtype=np.int32)
        vecs = np.stack([ids * 0.5, -ids * 1.0], axis=1).astype(np.float32)
        counter += n
        ws.feed("a", ids)
        ws.feed("b", vecs)
        run(ws, "EnqueueRebatchingQueue", ["q", "a", "b"], [], enqueue_batch=True)
        pending.extend(zip(ids.tolist(), vecs.tolist()))
        while len(pending) >= 3:
            k = int(rng.integers(1, 4))
            run(ws, "DequeueRebatchingQueue", ["q"], ["x", "y"], num_elements=k)
            want, pending = pending[:k], pending[k:]
            x, y = ws.fetch("x"), ws.fetch("y")
            assert x.dtype == np.int32 and y.dtype == np.float32 and x.shape == (k,) and y.shape == (k, 2)
            assert x.tolist() == [w[0] for w in want] and y.tolist() == [w[1] for w in want]


def test_rows_come_out_in_order_in_new_batches():
    check_rebatching()


def test_the_check_catches_a_lifo_queue(broken):
    def lifo(ctx, xp, queue, *, num_elements):
        rows = [queue.elements.pop() for _ in range(num_elements)]
        return tuple(np.stack([r[j] for r in rows]) for j in range(queue.num_blobs))
    broken("DequeueRebatchingQueue", lifo)
    with pytest.raises(AssertionError):
        check_rebatching()


def test_single_elements_get_a_new_first_axis():
    ws = Workspace()
    create(ws, num_blobs=1)
    for v in (1.0, 2.0):
        ws.feed("t", np.array([v], np.float32))
        run(ws, "EnqueueRebatchingQueue", ["q", "t"], [])
    run(ws, "DequeueRebatchingQueue", ["q"], ["out"], num_elements=2)
    assert ws.fetch("out").tolist() == [[1.0], [2.0]]
    ws.feed("s", np.array(3, np.int64))
    run(ws, "EnqueueRebatchingQueue", ["q", "s"], [])
    run(ws, "DequeueRebatchingQueue", ["q"], ["out"])
    assert ws.fetch("out").tolist() == [3]


def test_an_enqueued_tensor_is_copied():
    ws = Workspace()
    create(ws, num_blobs=1)
    base = np.zeros(2, np.float32)
    ws.feed("t", base)
    run(ws, "EnqueueRebatchingQueue", ["q", "t"], [])
    ws.get_blob("t").value[:] = 9
    run(ws, "DequeueRebatchingQueue", ["q"], ["out"])
    assert ws.fetch("out").tolist() == [[0, 0]]


def test_closing_and_what_cannot_be_waited_for():
    ws = Workspace()
    create(ws, capacity=4, num_blobs=1)
    ws.feed("t", np.arange(3, dtype=np.int32))
    run(ws, "EnqueueRebatchingQueue", ["q", "t"], [], enqueue_batch=True)
    with pytest.raises(Deadlock, match="is open and full .4 of 4 elements., with 2 more to enqueue, and no other "
                                       "thread of this run can dequeue from it: Caffe2 would wait forever"):
        run(ws, "EnqueueRebatchingQueue", ["q", "t"], [], enqueue_batch=True)   # (what fits went in, as in Caffe2)
    with pytest.raises(Deadlock, match="is open and holds 4 element.s., fewer than the 5 asked, and no other"):
        run(ws, "DequeueRebatchingQueue", ["q"], ["out"], num_elements=5)   # (the 4 it took are put back)
    run(ws, "CloseRebatchingQueue", ["q"], [])
    run(ws, "DequeueRebatchingQueue", ["q"], ["out"], num_elements=5)   # closed: what is left
    assert ws.fetch("out").tolist() == [0, 1, 2, 0]
    with pytest.raises(OpError, match="is closed and empty"):
        run(ws, "DequeueRebatchingQueue", ["q"], ["out"])
    with pytest.raises(OpError, match="is closed: nothing more can be enqueued"):
        run(ws, "EnqueueRebatchingQueue", ["q", "t"], [])


def test_bad_inputs():
    ws = Workspace()
    with pytest.raises(ArgumentError, match="capacity and num_blobs must be >= 1"):
        create(ws, capacity=0)
    create(ws, num_blobs=2)
    ws.feed("a", np.zeros(3, np.int32))
    ws.feed("b", np.zeros((2, 2), np.float32))
    with pytest.raises(ArityError, match="holds elements of 2 tensor.s., but the op enqueues 1"):
        run(ws, "EnqueueRebatchingQueue", ["q", "a"], [])
    with pytest.raises(ShapeError, match="must be the same size for all of them"):
        run(ws, "EnqueueRebatchingQueue", ["q", "a", "b"], [], enqueue_batch=True)
    with pytest.raises(ArityError, match="but the op has 1 outputs"):
        run(ws, "DequeueRebatchingQueue", ["q"], ["x"])
    run(ws, "EnqueueRebatchingQueue", ["q", "a", "b"], [])
    ws.feed("b", np.zeros((3, 2), np.float32))
    run(ws, "EnqueueRebatchingQueue", ["q", "a", "b"], [])
    with pytest.raises(ShapeError, match="component 1: elements of .2, 2. float32 and .3, 2. float32 cannot"):
        run(ws, "DequeueRebatchingQueue", ["q"], ["x", "y"], num_elements=2)
    with pytest.raises(DTypeError, match="input 0 must be a queue made by CreateRebatchingQueue, got ndarray"):
        run(ws, "CloseRebatchingQueue", ["a"], [])
