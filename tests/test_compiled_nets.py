"""Plain nets run many times (stepnet.compiled.program, StepCompiler(main=True) kept by every top-level Net): the
first two runs of a new input signature run op by op, the second builds the program, later runs run it.
Checked against the op-by-op path (Workspace(compile_steps=False)): every blob the same bits over a sampling
loop that feeds its states back, for each cell, with and without the fused kernels; buffers reused only while
nothing else holds them; a value fed into an output replaced as the op would; new shapes compiled again, bad
ones refused with the op's message; what may not be a buffer (a blob read before written, the output of an op
without a form, a result sharing its input's memory) is stored as op by op, a buffer blob made a view runs op by
op; an op sized by values or a form meeting values it does not cover sends the rest of that run op by op; a
net run once is never compiled."""
import importlib.util

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.builders.builder import BlobRef
from stepnet.core.errors import OpError, ShapeError
from stepnet.builders.model import ModelBuilder
from stepnet.io.proto import NetDef
from stepnet.builders.rnn import basic_rnn, gru, lstm

F = np.float32
V, H = 7, 6
FUSED = [pytest.param(False, id="numpy"),
         pytest.param(True, id="fused", marks=pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                                                 reason="numba (the fast extra) not installed"))]
CELLS = {"lstm": (lstm, 2), "gru": (gru, 1), "rnn": (basic_rnn, 1)}


def predict_net(cell: str, compiled: bool, fused: bool, batch: int = 1, steps: int = 1):
    """(workspace, bound predict net, state names): one-hot input -> cell -> FC -> Softmax, initial states fed."""
    make, n_states = CELLS[cell]
    m = ModelBuilder("sample")
    inits = [BlobRef(f"s{i}_init") for i in range(n_states)]
    outs = make(m, BlobRef("x"), BlobRef("seq") if cell != "rnn" else None, inits, V, H, scope="C",
                forward_only=True)
    m.net.Softmax(m.fc(outs[0], "out", H, V, axis=2), BlobRef("probs"), axis=2)
    ws = Workspace(seed=4, compile_steps=compiled, fused_cells=fused)
    ws.run_net_once(m.init_net.proto())
    feed_step(ws, 0, n_states, batch, steps)
    return ws, ws.create_net(m.net.proto()), [str(outs[1 + 2 * i]) for i in range(n_states)]


def feed_step(ws, ch, n_states, batch, steps, states=None):
    x = np.zeros((steps, batch, V), F)
    x[:, :, ch] = 1
    ws.feed("x", x)
    ws.feed("seq", np.full(batch, steps, np.int32))
    for i in range(n_states):
        ws.feed(f"s{i}_init", np.zeros((1, batch, H), F) if states is None else states[i])


def sample(ws, net, lasts, chars, batch=1, steps=1):
    """A greedy sampling loop (the previous character and states fed back); every blob after each run."""
    seen, ch = [], 0
    for _ in range(chars):
        states = [ws.fetch(s) for s in lasts] if seen else None
        feed_step(ws, ch, len(lasts), batch, steps, states)
        net.run()
        seen.append({b: ws.fetch(b) for b in ws.blobs() if isinstance(ws.find(b).value, np.ndarray)})
        ch = int(ws.fetch("probs")[-1, 0].argmax())
    return seen


@pytest.mark.parametrize("batch, steps", [(1, 1), (3, 4)])
@pytest.mark.parametrize("fused", FUSED)
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_predict_nets_run_compiled_with_the_op_by_op_bits(cell, fused, batch, steps):
    runs = []
    for compiled in (True, False):
        ws, net, lasts = predict_net(cell, compiled, fused, batch, steps)
        runs.append(sample(ws, net, lasts, 5, batch, steps))
        if compiled:
            program, routines = net.compiler.program, net.compiler.routines
    for got, want in zip(*runs):
        assert got.keys() == want.keys()
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert program is not None and routines, "the predict net never ran compiled"
    assert [at for _, _, at in program.ops] == [(0,), (1,), (2,), (3,)]
    softmax = program.ops[3][0].fn       # Softmax's own form (numpy rows or numba's row kernel), not the generic one
    assert softmax.__module__ == ("stepnet.compiled.jit_forms" if fused else "stepnet.compiled.forms")
    assert softmax.__qualname__ == "softmax.<locals>.run"


def address(ws, name) -> int:
    return ws.get_blob(name).value.__array_interface__["data"][0]


def test_buffers_are_reused_only_while_nothing_else_holds_them():
    ws, net, lasts = predict_net("lstm", True, False)
    for _ in range(3):
        net.run()
    where = address(ws, "probs")
    net.run()
    assert address(ws, "probs") == where                   # nothing else held it: rewritten in place
    kept = ws.get_blob("probs").value                      # a reference kept past the run
    before = kept.copy()
    feed_step(ws, 3, 2, 1, 1)
    net.run()
    np.testing.assert_array_equal(kept, before)            # not changed under its holder
    assert ws.get_blob("probs").value is not kept
    assert not np.array_equal(ws.fetch("probs"), before)


def test_a_value_fed_into_an_output_is_replaced_as_the_op_would():
    ws, net, _ = predict_net("gru", True, False)
    ref_ws, ref_net, _ = predict_net("gru", False, False)
    for w, n in ((ws, net), (ref_ws, ref_net)):
        n.run()
        n.run()
        w.feed("out", np.full((5, 5), 9, F))               # another shape, into the FC's output
        w.feed("probs", np.zeros((1, 1, V), np.float64))   # another dtype, into Softmax's
        n.run()
    assert ws.fetch("out").shape == (1, 1, V) and ws.fetch("probs").dtype == F
    for name in ("out", "probs"):
        np.testing.assert_array_equal(ws.fetch(name), ref_ws.fetch(name))


def test_new_shapes_compile_again_and_bad_ones_fail_as_op_by_op():
    ws, net, lasts = predict_net("lstm", True, False)
    ref_ws, ref_net, _ = predict_net("lstm", False, False)
    for batch, steps in ((1, 1), (1, 1), (1, 1), (2, 3), (2, 3), (2, 3), (1, 1), (1, 1)):
        for w, n in ((ws, net), (ref_ws, ref_net)):
            feed_step(w, 2, 2, batch, steps)
            n.run()
        np.testing.assert_array_equal(ws.fetch("probs"), ref_ws.fetch("probs"))
    assert net.compiler.program is not None
    for w in (ws, ref_ws):
        w.feed("out_w", np.zeros((V, H + 1), F))
    with pytest.raises(ShapeError) as got:
        net.run()
    with pytest.raises(ShapeError) as want:
        ref_net.run()
    assert str(got.value) == str(want.value) and "op #2 (FC)" in str(got.value)


def two_op_net(ws, first, second):
    net = NetDef(name="n")
    for op_type, inputs, output in (first, second):
        op = net.op.add(type=op_type, output=[output] if output else [])
        op.input.extend(inputs)
    return ws.create_net(net)


def test_a_blob_read_before_it_is_written_is_never_a_buffer():
    """y is read (from the last run, or as fed) before the net writes it: Tanh writing it runs by its kernel
    (a new array each run, as op by op), never into a buffer."""
    ws = Workspace()
    ws.feed("x", np.ones((2, 3), F))
    ws.feed("y", np.full((2, 3), 2, F))
    net = two_op_net(ws, ("Sigmoid", ["y"], "z"), ("Tanh", ["x"], "y"))
    for _ in range(3):
        kept = ws.get_blob("y").value
        net.run()
        assert ws.get_blob("y").value is not kept
        np.testing.assert_array_equal(ws.fetch("y"), np.tanh(np.ones((2, 3), F)))
    assert net.compiler.program is not None
    np.testing.assert_array_equal(ws.fetch("z"), 1 / (1 + np.exp(-np.tanh(np.ones((2, 3), F)))))


def test_a_result_sharing_its_inputs_memory_is_stored_as_op_by_op():
    """Alias's result is its input's array: run by its kernel in the compiled net, the blobs share it."""
    ws = Workspace()
    ws.feed("x", np.ones((2, 3), F))
    net = two_op_net(ws, ("Alias", ["x"], "a"), ("Tanh", ["a"], "t"))
    for _ in range(3):
        net.run()
    assert net.compiler.program is not None and ws.get_blob("a").value is ws.get_blob("x").value


def test_an_op_without_a_form_of_its_own_runs_its_kernel_in_the_compiled_net():
    """Print has no compiled form: the compiled net calls its bound kernel, which prints at every run."""
    ws = Workspace(seed=0)
    ws.feed("x", np.ones((2, 3), F))
    net = two_op_net(ws, ("Tanh", ["x"], "t"), ("Print", ["t"], None))
    printed = []
    ws.reporter = lambda name, value: printed.append(name) or True
    for _ in range(4):
        net.run()
    assert net.compiler.program is not None and printed == ["t"] * 4


def test_an_op_whose_sizes_follow_its_values_sends_the_rest_of_that_run_op_by_op():
    """Reshape to a fed shape (its output shape follows the shape input's values, not its shape): the compiled
    net's Sigmoid writes a (2, 3) buffer; a run with the shape [3, 2] (same signature) runs the ops after the
    Reshape op by op, as the interpreted net would, and the next run compiled again."""
    ws = Workspace()
    ws.feed("x", np.arange(6, dtype=F))
    ws.feed("shape", np.array([2, 3], np.int64))
    nd = NetDef(name="n")
    nd.op.add(type="Reshape", input=["x", "shape"], output=["r", "old"])
    nd.op.add(type="Sigmoid", input=["r"], output=["s"])
    net = ws.create_net(nd)
    for shape in ([2, 3], [2, 3], [2, 3], [3, 2], [2, 3], [6, 1]):
        ws.feed("shape", np.array(shape, np.int64))
        net.run()
        want = 1 / (1 + np.exp(-np.arange(6, dtype=F).reshape(shape)))
        np.testing.assert_allclose(ws.fetch("s"), want, rtol=1e-6)   # (Sigmoid's own exp: within 1e-6)
        assert ws.fetch("s").shape == tuple(shape)
    assert net.compiler.program is not None


def test_a_buffer_blob_made_a_view_runs_the_net_op_by_op_that_time():
    ws = Workspace()
    ws.feed("x", np.ones((2, 3), F))
    net = two_op_net(ws, ("Tanh", ["x"], "t"), ("Sigmoid", ["t"], "s"))
    for _ in range(3):
        net.run()
    assert net.compiler.program is not None
    window = np.zeros((4, 3), F)
    ws.get_blob("t").set_view(window[1:3])                 # as a link or alias would make it
    net.run()
    np.testing.assert_array_equal(window[1:3], np.tanh(np.ones((2, 3), F)))   # written through, as op by op
    np.testing.assert_array_equal(ws.fetch("s"), 1 / (1 + np.exp(-np.tanh(np.ones((2, 3), F)))))


def test_an_entry_that_raises_is_named_after_its_op():
    ws, net, _ = predict_net("rnn", True, False)
    net.run()
    net.run()
    program = net.compiler.program
    fast, kinds, at = program.ops[2]

    def broken(ins, outs):
        raise ValueError("deliberately broken")
    program.ops[2] = (fast._replace(fn=broken), kinds, at)
    net.compiler.routines = {}
    with pytest.raises(OpError, match=r"op #2 \(FC\) failed: ValueError: deliberately broken"):
        net.run()


def test_without_compile_steps_a_net_is_never_compiled():
    ws, net, _ = predict_net("lstm", False, False)
    for _ in range(3):
        net.run()
    assert net.compiler.program is None


def test_input_signatures_are_rechecked_for_changed_arrays_only():
    from stepnet.compiled.inputs import Inputs

    ws = Workspace()
    ws.feed("x", np.ones((2, 3), F))
    ws.feed("w", np.ones((3,), F))
    net = two_op_net(ws, ("Mul", ["x", "w"], "y"), ("Tanh", ["y"], "t"))
    inputs = Inputs(net)
    first = inputs.signature()
    assert first == (((2, 3), np.dtype(F)), ((3,), np.dtype(F)))
    assert inputs.signature() is first                     # same arrays: the same signature object
    ws.feed("x", np.zeros((2, 3), F))
    assert inputs.signature() == first                     # a new array of the same shape
    ws.feed("x", np.zeros((4, 3), F))
    assert inputs.signature()[0] == ((4, 3), np.dtype(F))
    ws.get_blob("w").value = None                          # no array: no signature, then back
    assert inputs.signature() is None
    ws.get_blob("w").value = b"a handle"                   # no array at all: its type (only kernels read it)
    assert inputs.signature()[1] == (bytes,)
    ws.feed("w", np.ones((3,), np.float64))
    assert inputs.signature()[1] == ((3,), np.dtype(np.float64))


@pytest.mark.parametrize("keep", [1, 0])
def test_a_link_view_is_made_once_per_array_and_row(keep):
    """A link into a tensor the op owns (keep=1, its states) has each row's view made once and kept while the
    array is; a link into another tensor (keep=0: an input projection the main net recomputes) gets its
    views made each time and the form holds nothing of that array (its memory is free for the next run)."""
    import functools
    import sys
    import types

    from stepnet.compiled.link_forms import apply_links
    from stepnet.runtime.workspace import Blob

    bop = types.SimpleNamespace(plain=functools.partial(print, offsets=[0, 1], windows=[1, 1], keep=[keep, 1]),
                                opdef=types.SimpleNamespace(input=["t", "xs", "states"]))
    xs, states = np.arange(6, dtype=F).reshape(3, 2), np.zeros((4, 2), F)
    blobs = (Blob("x_t"), Blob("s_t"))
    fast = apply_links(bop, [np.array([0], np.int32), xs, states], [None, None])
    fast.fn([np.array([1], np.int32), xs, states], blobs)
    first = blobs[0].value
    np.testing.assert_array_equal(first, xs[1:2])
    assert np.shares_memory(blobs[1].value, states[2:3]) and all(b.view for b in blobs)
    fast.fn([np.array([1], np.int32), xs, states], blobs)
    assert (blobs[0].value is first) == bool(keep)          # the same rows of the same array: its view again
    fast.fn([np.array([2], np.int32), xs, states], blobs)
    np.testing.assert_array_equal(blobs[0].value, xs[2:3])
    fast.fn([np.array([1], np.int32), xs, states], blobs)
    assert (blobs[0].value is first) == bool(keep)   # each row's view of an array is made once (next runs too)
    np.testing.assert_array_equal(blobs[0].value, xs[1:2])
    other = xs + 10
    fast.fn([np.array([2], np.int32), other, states], blobs)
    np.testing.assert_array_equal(blobs[0].value, other[2:3])
    if not keep:      # only the blob's view and these names hold `other`, nothing the form kept
        held = sys.getrefcount(other)
        blobs[0].value = None
        assert sys.getrefcount(other) == held - 1
    with pytest.raises(ShapeError, match=r"link .x_t. -> .xs.: at timestep 3"):
        fast.fn([np.array([3], np.int32), xs, states], blobs)


@pytest.mark.parametrize("spoil", [False, True])
def test_one_hot_rows_are_gathered_compiled_as_op_by_op(spoil, monkeypatch):
    """An FC over 80 one-hot rows: gathered in the compiled form as in the kernel (an inf in W: the GEMM, its
    NaNs), the same bits either way."""
    import stepnet.compiled.products as products
    from stepnet.kernels.onehot import gather_fc

    gathered = []
    monkeypatch.setattr(products, "gather_fc", lambda *a: gathered.append(1) or gather_fc(*a))
    rng = np.random.default_rng(7)
    x = np.eye(V, dtype=F)[rng.integers(0, V, 80)]
    w, b = rng.standard_normal((5, V)).astype(F), rng.standard_normal(5).astype(F)
    if spoil:
        w[2, 3] = np.inf
    results = []
    for compiled in (True, False):
        ws = Workspace(compile_steps=compiled)
        for name, value in (("x", x), ("w", w), ("b", b)):
            ws.feed(name, value)
        net = two_op_net(ws, ("FC", ["x", "w", "b"], "y"), ("Relu", ["y"], "r"))
        with np.errstate(invalid="ignore"):
            for _ in range(3):
                net.run()
        results.append((ws.fetch("y"), ws.fetch("r")))
        assert (net.compiler.program is not None) == compiled
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)
    assert gathered and np.isnan(results[0][0]).any() == spoil


def test_recurrent_networks_compile_in_plain_nets_only():
    from stepnet.compiled.forms import compiled_form

    ws, net, _ = predict_net("lstm", True, False)
    net.run()
    rnn = net.ops[1]
    ins, outs = [b.value for b in rnn.inputs], [b.value for b in rnn.outputs]
    assert compiled_form(rnn, ins, outs, main=True) is not None
    assert compiled_form(rnn, ins, outs) is None            # not in a step net's program


def test_a_net_run_once_is_not_compiled(monkeypatch):
    from stepnet.compiled.program import Program

    built = []
    monkeypatch.setattr(Program, "of", classmethod(lambda cls, net, trace, *_: built.append(net) or None))
    ws = Workspace()
    ws.feed("x", np.ones((2, 3), F))
    net = two_op_net(ws, ("Tanh", ["x"], "t"), ("Sigmoid", ["t"], "s"))
    net.run()
    ws.feed("x", np.ones((4, 3), F))            # another signature: again run once
    net.run()
    assert not built
    net.run()                                  # its second run: compiled from its arrays
    assert built == [net]


def test_a_blob_written_twice_is_compiled_from_what_each_op_made():
    """y is written by Tanh (float32) and then by a Cast of x to int64: a program built from the values at the
    end of the run would give Tanh an int64 buffer; built from each op's own values (Net.run_ops' trace) the
    net compiles only where each write fits, and runs as op by op."""
    second = ("Cast", ["x"], "y")
    results = []
    for compiled in (True, False):
        ws = Workspace(compile_steps=compiled)
        ws.feed("x", np.full((2, 3), 0.5, F))
        net = NetDef(name="n")
        net.op.add(type="Tanh", input=["x"], output=["y"])
        net.op.add(type="Sigmoid", input=["y"], output=["s"])
        op = net.op.add(type=second[0], input=second[1], output=[second[2]])
        op.arg.add(name="to", i=10)                              # int64
        bound = ws.create_net(net)
        for _ in range(4):
            bound.run()
        results.append(state_of(ws))
    for name, value in results[1].items():
        np.testing.assert_array_equal(results[0][name], value, err_msg=name)
        assert results[0][name].dtype == value.dtype, name


def state_of(ws) -> dict:
    return {b: ws.fetch(b) for b in ws.blobs() if isinstance(ws.find(b).value, np.ndarray)}


def test_an_fc_fed_a_fortran_ordered_input_keeps_the_op_by_op_bits(monkeypatch):
    """A fed array keeps its memory order (Workspace.feed copies in order K): an FC of 8 rows (8×128 by 128×512)
    fed an F-ordered X gives, compiled, the bits of the op-by-op run, whose kernel sums that layout its own way
    — also with the compiled FC taking X·Wᵀ from a per-run Wᵀ copy (forced here where this machine's check
    accepts it for a C-contiguous X)."""
    import stepnet.compiled.products as products
    from stepnet.kernels.fc_forms import forms, same_sums

    accepted = 1 in same_sums(8, 128, 512, F, forms(8, 128, 512, F))
    monkeypatch.setattr(products, "fastest", lambda *a: 1 if accepted else "kernel")
    rng = np.random.default_rng(9)
    x = np.asfortranarray(rng.standard_normal((8, 128)).astype(F))
    w, b = rng.standard_normal((512, 128)).astype(F), rng.standard_normal(512).astype(F)
    results = []
    for compiled in (True, False):
        ws = Workspace(compile_steps=compiled)
        for name, value in (("x", x), ("w", w), ("b", b)):
            ws.feed(name, value)
        assert not ws.get_blob("x").value.flags.c_contiguous
        net = two_op_net(ws, ("FC", ["x", "w", "b"], "y"), ("Relu", ["y"], "r"))
        for _ in range(4):
            net.run()
        assert (net.compiler.program is not None) == compiled
        results.append(ws.fetch("y"))
    np.testing.assert_array_equal(*results)


def test_a_recurrent_layer_after_an_op_sized_by_values_runs_each_length_as_op_by_op():
    """Slice by fed ends makes the sequence 2 or 3 steps long under one input signature: the runs whose length
    differs from the compiled one go op by op from the Slice on, and the recurrent op's kept run (replayed by
    the compiled net) is checked against its inputs, never trusted: every run's probabilities and final states
    the same bits as op by op."""
    B = 2

    def build(compiled):
        m = ModelBuilder("sliced")
        m.net.Slice([BlobRef("x_all"), BlobRef("starts"), BlobRef("ends")], BlobRef("x"))
        outs = lstm(m, BlobRef("x"), BlobRef("seq"), [BlobRef("s0_init"), BlobRef("s1_init")], V, H, scope="C",
                    forward_only=True)
        m.net.Softmax(m.fc(outs[0], "out", H, V, axis=2), BlobRef("probs"), axis=2)
        ws = Workspace(seed=4, compile_steps=compiled)
        ws.run_net_once(m.init_net.proto())
        ws.feed("x_all", np.random.default_rng(0).random((3, B, V), dtype=F))
        for i in range(2):
            ws.feed(f"s{i}_init", np.zeros((1, B, H), F))
        ws.feed("starts", np.zeros(3, np.int32))
        ws.feed("ends", np.array([3, -1, -1], np.int32))
        ws.feed("seq", np.full(B, 3, np.int32))
        return ws, ws.create_net(m.net.proto()), [str(outs[1]), str(outs[3])]

    runs = [build(True), build(False)]
    for T in (3, 3, 3, 2, 3, 2, 2, 3, 3):
        seen = []
        for ws, net, lasts in runs:
            ws.feed("ends", np.array([T, -1, -1], np.int32))
            ws.feed("seq", np.full(B, T, np.int32))
            net.run()
            seen.append([ws.fetch(n) for n in ["probs", *lasts]])
        for a, b in zip(*seen):
            np.testing.assert_array_equal(a, b)
        assert seen[0][0].shape[0] == T
    assert runs[0][1].compiler.program is not None


def test_an_sgd_step_on_a_read_only_weight_runs_op_by_op_that_time():
    """WeightedSum in place over w compiles to an update in place; a read-only array fed as w cannot take it:
    that run goes op by op from the update on (w gets a new array, the fed one is left as it was), and the next
    run updates in place again."""
    ws = Workspace()
    g, lr = np.full((2, 3), 0.5, F), np.array([-0.25], F)
    for name, value in (("w", np.ones((2, 3), F)), ("one", np.array([1.0], F)), ("g", g), ("lr", lr)):
        ws.feed(name, value)
    nd = NetDef(name="sgd")
    nd.op.add(type="WeightedSum", input=["w", "one", "g", "lr"], output=["w"])
    nd.op.add(type="Tanh", input=["w"], output=["t"])
    net = ws.create_net(nd)
    for _ in range(3):
        net.run()
    assert net.compiler.program is not None
    frozen = np.full((2, 3), 2.0, F)
    frozen.setflags(write=False)
    ws.feed("w", frozen)
    net.run()
    np.testing.assert_array_equal(frozen, np.full((2, 3), 2.0, F))
    np.testing.assert_array_equal(ws.fetch("w"), np.full((2, 3), 2.0 - 0.125, F))
    np.testing.assert_array_equal(ws.fetch("t"), np.tanh(np.full((2, 3), 2.0 - 0.125, F)))
    held = ws.get_blob("w").value
    net.run()
    assert ws.get_blob("w").value is held
    np.testing.assert_array_equal(held, np.full((2, 3), 2.0 - 0.25, F))
