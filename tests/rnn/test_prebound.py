"""Prebound timesteps (stepnet.compiled.prebound): each step workspace's compiled routine bound once to the arrays
it reads and writes. Against the op-by-op path bit for bit while inputs are replaced between runs (an entry
whose dependency holds a new array binds again, and reads it fresh from then on); the LSTM steps really bound
by their forms; no tensor of the main net held from one run to the next; a wrong binding caught."""
import functools
import weakref

import numpy as np
import pytest

import stepnet.compiled.prebound as prebound
from stepnet.compiled import forms

from stepnet.builders.builder import BlobRef, NetBuilder

from .test_compiled import (
    CELLS, D, F, H, N, compilers, gru, loss_of, lstm, recurrent_net, run_both, run_model, sequence)


def feeds_of(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {**sequence(rng), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F),
            "c0": rng.uniform(-1, 1, (1, N, H)).astype(F)}


def build_cell(cell: str):
    def build(m):
        h = lstm(m, "X", "seq", ["h0", "c0"], D, H) if cell == "lstm" else gru(m, "X", "seq", ["h0"], D, H)
        m.add_gradient_ops([loss_of(m, h[0])])
    return build


def routines(net) -> list:
    """Every step routine of the net's RecurrentNetwork ops (forward and backward)."""
    return [run for c in compilers(net).values() for _, run in c.routines.values()]


@pytest.mark.parametrize("fused", CELLS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_replaced_inputs_rebind_and_keep_the_op_by_op_bits(cell, fused):
    """New arrays fed for the recurrent weights (a dependency of the bound FC entries) and for the sequence
    lengths between runs: the entries bind again and every blob stays bit-identical to the op-by-op path (the
    fused cells: within float32 rounding, as test_compiled checks)."""
    def change(ws, r):
        if r in (3, 5):
            for name in ws.blobs():
                if name.endswith("_t_w"):
                    ws.feed(name, ws.fetch(name) * F(0.9))
        if r == 4:
            ws.feed("seq", np.array([2, 4, 1], np.int32))
    _, net = run_both(build_cell(cell), feeds_of(1), runs=7, change=change, fused=fused)
    assert all(run.bound is not None for run in routines(net))


@pytest.mark.skipif(not CELLS[-1].values[0], reason="numba (the fast extra) not installed")
def test_every_lstm_step_entry_is_bound_by_its_form(monkeypatch):
    """The char-rnn's LSTM steps with the fused cells: after the first runs every entry of every step routine is
    its form's own bound call (none falls back to calling its fn), and later runs bind nothing again."""
    ws, net = run_model(build_cell("lstm"), feeds_of(2), runs=3, fused_cells=True)
    bound = [run.bound for run in routines(net)]
    assert bound and all(b is not None for b in bound)
    calls = [c for b in bound for c in b.state[1]]
    assert calls and not any(c is None or isinstance(c, functools.partial) and c.func is not np.matmul
                             for c in calls)
    again = []
    monkeypatch.setattr(prebound.Prebound, "_again", lambda self, i: again.append(i))
    net.run()
    net.run()
    assert again == []


@pytest.mark.parametrize("fused", CELLS)
@pytest.mark.parametrize("cell, workspaces", [("lstm", 2), ("gru", 2), ("lstm", 1)])
def test_a_forward_only_op_binds_one_routine_per_timestep(cell, workspaces, fused):
    """A forward-only op runs its timesteps in a few step workspaces (num_workspaces: Caffe2's default 2, or
    one for all), in turn: each timestep gets a routine of its own, bound to that timestep's arrays (a binding
    is one timestep's link rows), the routines of one workspace writing the same buffers; bit for bit the
    op-by-op path while new sequences, states and weights are fed between runs (its main net compiled from the
    third run, so later runs replay)."""
    def build(m):
        if cell == "lstm":
            lstm(m, "X", "seq", ["h0", "c0"], D, H, forward_only=True)
        else:
            gru(m, "X", "seq", ["h0"], D, H, forward_only=True)
        for op in m.net.proto().op:
            if op.type == "RecurrentNetwork" and workspaces != 2:
                arg = op.arg.add()
                arg.name, arg.i = "num_workspaces", workspaces

    def change(ws, r):
        fresh = feeds_of(10 + r)
        for name in ("X", "h0", "c0"):
            ws.feed(name, fresh[name])
        if r == 4:
            for name in ws.blobs():
                if name.endswith("_t_w"):
                    ws.feed(name, ws.fetch(name) * F(0.9))
    _, net = run_both(build, feeds_of(3), runs=6, change=change, fused=fused)
    compiler = compilers(net)["RecurrentNetwork"]
    assert compiler.cycle
    keys = list(compiler.routines)
    steps = feeds_of(3)["X"].shape[0]
    assert sorted(k[1] for k in keys) == list(range(steps))           # one routine per timestep
    assert len({k[0] for k in keys}) == workspaces                      # over the op's step workspaces
    assert all(run.bound is not None for _, run in compiler.routines.values())
    buffers = {}
    for (net_id, _), (step_net, _) in compiler.routines.items():
        values = tuple(id(b.value) for bop in step_net.ops for b in bop.outputs if b.name.endswith("gates_t"))
        assert buffers.setdefault(net_id, values) == values            # one set of buffers per workspace


def test_bindings_hold_no_tensor_of_the_main_net():
    """The input projection (its link views are made fresh each call) keeps its array from run to run, so the
    main net's FC writes into it; the output gradient the main net makes anew each run is released after the
    run that read it."""
    ws, net = run_model(build_cell("lstm"), feeds_of(4), runs=1, fused_cells=False)   # (steps bound in this run)
    for _ in range(2):
        net.run()                  # (the main net compiled: its FC's buffer from the third run on)
    assert net.compiler.program is not None
    grad = weakref.ref(ws.find("LSTM/hidden_state_all_grad").value)
    ids = [id(ws.find("LSTM/i2h").value)]
    for _ in range(3):
        net.run()
        ids.append(id(ws.find("LSTM/i2h").value))
        assert grad() is None
        grad = weakref.ref(ws.find("LSTM/hidden_state_all_grad").value)
    assert len(set(ids)) == 1


def test_a_wrong_binding_is_caught(monkeypatch):
    """The comparison with the op-by-op path fails when a bound call computes otherwise than its form (the
    step nets' in-place Sum bound to add its input twice)."""
    make = forms.MAKERS["Sum"].make

    def broken(bop, ins, outs):
        fast = make(bop, ins, outs)

        def prebind(ins, outs, fresh):
            call = fast.prebind(ins, outs, fresh)
            return None if call is None else (lambda: (call(), call()))
        return fast._replace(prebind=prebind)
    monkeypatch.setitem(forms.MAKERS, "Sum", forms.Maker(broken))
    with pytest.raises(AssertionError):
        run_both(build_cell("lstm"), feeds_of(5), runs=3)


@pytest.mark.parametrize("write", ["copy", "add"])
def test_a_step_net_writing_its_timestep_other_than_in_place_runs_op_by_op(write):
    """A step op that writes the timestep blob other than in place (a Copy over it): the compiled routine took
    the blob for a buffer of its own and overwrote the [t] the loop puts there (the link op then read garbage: a
    ShapeError at timestep 1056964608); such a step net runs op by op. One that adds to it in place compiles
    (tests/rnn/test_replay.py). Both give the op-by-op results."""
    step = NetBuilder("ts_step")
    step.add_external_inputs("input_t", "h_prev", "shift", "timestep")
    if write == "copy":
        step.Copy(["shift"], "timestep")
    else:
        step.Add(["timestep", "shift"], "timestep", broadcast=1)
    step.Add([step.Tanh(["h_prev"], "th"), "input_t"], "h")
    step.add_external_outputs(BlobRef("h"))

    def build(m):
        recurrent_net(m.net, step, [(BlobRef("input_t"), BlobRef("X"))], [(BlobRef("h_prev"), BlobRef("h0"))],
                      {BlobRef("h_prev"): BlobRef("h")}, scope="ts", timestep="timestep", outputs_with_grads=(0,),
                      forward_only=True)
    rng = np.random.default_rng(8)
    feeds = {"X": rng.uniform(-1, 1, (4, N, H)).astype(F), "h0": rng.uniform(-1, 1, (1, N, H)).astype(F),
             "shift": np.array([0], np.int32)}
    _, net = run_both(build, feeds, runs=4, change=lambda ws, r: ws.feed("shift", np.array([r % 2], np.int32)))
    assert (compilers(net)["RecurrentNetwork"].program is None) == (write == "copy")
