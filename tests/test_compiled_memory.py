"""What compiling a training net costs in memory: the run that builds the program and the first compiled run
peak no higher than a steady run (tracemalloc, numpy's arrays included) by more than a fraction of the input
projection, and a buffer keeps the array its op made when nothing else holds it (no second copy); one that
something else holds is replaced, never written under its holder."""
import tracemalloc
import weakref

import numpy as np

from stepnet import Workspace
from stepnet.builders.builder import BlobRef
from stepnet.builders.model import ModelBuilder
from stepnet.builders.rnn import lstm
from stepnet.io.proto import NetDef

F = np.float32
T, B, V, H = 50, 8, 65, 64


def training_net():
    """A char-rnn step (one-hot input, LSTM, output FC, Softmax, cross entropy, SGD), as benchmarks/targets.py."""
    m = ModelBuilder("mem")
    outs = lstm(m, BlobRef("x"), BlobRef("seq"), (BlobRef("h0"), BlobRef("c0")), V, H, scope="L")
    probs = m.net.Softmax(m.fc(outs[0], "out", H, V, axis=2), BlobRef("probs"), axis=2)
    flat, _ = m.net.Reshape([probs], [BlobRef("flat"), BlobRef("old")], shape=[-1, V])
    xent = m.net.LabelCrossEntropy([flat, BlobRef("labels")], BlobRef("xent"))
    loss = m.net.AveragedLoss([xent], BlobRef("loss"))
    m.add_gradient_ops([loss])
    m.sgd(0.1, policy="fixed")
    ws = Workspace(seed=0)
    ws.run_net_once(m.init_net.proto())
    rng = np.random.default_rng(0)
    x = np.zeros((T, B, V), F)
    x[np.arange(T)[:, None], np.arange(B)[None, :], rng.integers(0, V, (T, B))] = 1
    for name, value in (("x", x), ("seq", np.full(B, T, np.int32)), ("h0", np.zeros((1, B, H), F)),
                        ("c0", np.zeros((1, B, H), F)), ("labels", rng.integers(0, V, T * B).astype(np.int32))):
        ws.feed(name, value)
    return ws, ws.create_net(m.net.proto())


def test_compiling_a_training_net_adds_no_transient_copies():
    ws, net = training_net()
    peaks = []
    tracemalloc.start()
    try:
        for _ in range(6):
            tracemalloc.reset_peak()
            start = tracemalloc.get_traced_memory()[0]
            net.run()
            peaks.append(tracemalloc.get_traced_memory()[1] - start)
    finally:
        tracemalloc.stop()
    assert net.compiler.program is not None
    projection = T * B * 4 * H * 4                 # the input projection's bytes, the largest tensor of a run
    steady = peaks[-1]
    assert peaks[1] <= steady + projection // 2, peaks     # the run that builds the program
    assert peaks[2] <= steady + projection // 2, peaks     # the first compiled run


def test_a_buffer_keeps_its_ops_array_unless_something_else_holds_it():
    ws = Workspace()
    ws.feed("x", np.ones((2, 3), F))
    nd = NetDef(name="n")
    nd.op.add(type="Sigmoid", input=["x"], output=["t"])
    nd.op.add(type="Softmax", input=["t"], output=["s"])
    net = ws.create_net(nd)
    net.run()
    net.run()                                    # (builds the program; Sigmoid's result owns its memory)
    made = weakref.ref(ws.get_blob("t").value)   # (not a holder)
    net.run()
    assert ws.get_blob("t").value is made()     # the array the op made is the buffer: no second copy
    ws.feed("x", np.full((2, 3), 2, F))
    net.run()
    assert ws.get_blob("t").value is made()
    ws2 = Workspace()
    ws2.feed("x", np.ones((2, 3), F))
    net2 = ws2.create_net(nd)
    net2.run()
    net2.run()
    kept = ws2.get_blob("t").value              # a holder since the program was built
    before = kept.copy()
    ws2.feed("x", np.full((2, 3), 2, F))
    net2.run()
    assert ws2.get_blob("t").value is not kept
    np.testing.assert_array_equal(kept, before)  # never written under its holder
