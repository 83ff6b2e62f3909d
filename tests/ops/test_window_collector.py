"""LastNWindowCollector (stepnet/ops/window_collector.py) against a ring written here row by row from Caffe2's
doc (rows go to the next position while the buffer fills, then overwrite the oldest; a batch longer than N
leaves its last N rows in order and the position at 0), the count of rows seen, the mutex, bad inputs and a
broken collector caught."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.testing import make_op


def ring(batches, n):
    """(buffer rows, next position) after the batches, one row at a time."""
    rows, pos = [], 0
    for batch in batches:
        if len(batch) > n:
            rows, pos = [list(r) for r in batch[-n:]], 0
            continue
        for r in batch:
            if len(rows) < n:
                rows.append(list(r))
            else:
                rows[pos] = list(r)
            pos = (pos + 1) % n
    return rows, pos


def collect(batches, n, visited=False, mutex=False):
    ws = Workspace()
    ws.create_blob("buf")
    ws.feed("next", np.array(0, np.int32))
    ins, outs = ["buf", "next", "data"], ["buf", "next"]
    if mutex or visited:
        ws.run_operator_once(make_op("CreateMutex", [], ["m"]))
        ins.append("m")
    if visited:
        ws.feed("seen", np.array([5], np.int64))
        ins.append("seen")
        outs.append("seen")
    net = NetDef(name="collect")
    net.op.extend([make_op("LastNWindowCollector", ins, outs, num_to_collect=n)])
    bound = None
    for batch in batches:
        ws.feed("data", np.asarray(batch, np.float32).reshape(-1, 2))
        bound = bound or ws.bind(net)
        bound.run()
    return ws


BATCHES = [[[1, 1], [2, 2], [3, 3]], [[4, 4]], [], [[5, 5], [6, 6], [7, 7]], [[k, -k] for k in range(8, 17)],
           [[20, 0], [21, 0]]]


@pytest.mark.parametrize("n", [1, 4, 5, 7, 30])
@pytest.mark.parametrize("upto", [1, 2, 3, 4, 5, 6])
def test_the_buffer_follows_the_ring(n, upto):
    ws = collect(BATCHES[:upto], n)
    rows, pos = ring(BATCHES[:upto], n)
    assert ws.fetch("buf").tolist() == rows and ws.fetch("buf").dtype == np.float32
    assert ws.fetch("next").dtype == np.int32 and ws.fetch("next").item() == pos


def test_the_check_catches_a_collector_that_keeps_the_first_rows(broken):
    def first_rows(ctx, xp, buf, nxt, data, *extra, num_to_collect):
        kept = data if buf is None or buf.size == 0 else np.concatenate([buf, data])
        return kept[:num_to_collect], np.asarray(0, np.int32)
    broken("LastNWindowCollector", first_rows)
    with pytest.raises(AssertionError):
        test_the_buffer_follows_the_ring(4, 4)


def test_the_count_of_rows_seen_and_the_mutex():
    ws = collect(BATCHES[:4], 4, visited=True)
    assert ws.fetch("seen").tolist() == [7]            # counted afresh when the ring starts: 3 + 1 + 0 + 3
    assert not ws.get_blob("m").value.locked()
    assert ws.fetch("buf").tolist() == ring(BATCHES[:4], 4)[0]


def test_an_empty_first_batch_keeps_its_shape():
    ws = collect([np.zeros((0, 2))], 3)
    assert ws.fetch("buf").shape == (0, 2) and ws.fetch("next").item() == 0


def test_bad_inputs():
    with pytest.raises(ArgumentError, match="num_to_collect must be > 0, got 0"):
        collect(BATCHES[:1], 0)
    ws = collect(BATCHES[:1], 4)
    op = make_op("LastNWindowCollector", ["buf", "next", "data"], ["buf", "next"], num_to_collect=4)
    ws.feed("data", np.zeros((1, 3), np.float32))
    with pytest.raises(ShapeError, match=r"the buffer holds rows \(2,\) float32, DATA rows \(3,\) float32"):
        ws.run_operator_once(op)
    ws.feed("data", np.zeros((1, 2), np.float32))
    ws.feed("next", np.array(4, np.int32))
    with pytest.raises(ShapeError, match="the next position 4 is out of range for a buffer of 4 rows"):
        ws.run_operator_once(op)
    ws.feed("next", np.array([1], np.int32))
    with pytest.raises(DTypeError, match="must be an int32 0-d tensor"):
        ws.run_operator_once(op)
    ws.feed("data", np.float32(1))
    with pytest.raises(ShapeError, match="DATA is 0-d"):
        ws.run_operator_once(op)
    ws.feed("data", np.zeros((1, 2), np.float32))
    ws.feed("m", np.zeros(1))
    with pytest.raises(DTypeError, match="input 3 must be a mutex made by CreateMutex"):
        ws.run_operator_once(make_op("LastNWindowCollector", ["buf", "next", "data", "m"], ["buf", "next"],
                                     num_to_collect=4))
