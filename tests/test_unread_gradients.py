"""passes/unread.py: the gradient values nothing reads, left out of what `stepnet run` runs. The runs with
and without them must agree on every blob both have, bit for bit; what is left out must be exactly what
nothing reads (a read from a nested net, a string argument, an external output, a stop blob or a fetch keeps
it)."""
from pathlib import Path

import numpy as np
import pytest

from stepnet import Workspace, load
from stepnet.cli.run import main
from stepnet.core.errors import OpError
from stepnet.io import checkpoints
from stepnet.io.proto import NetDef, PlanDef, parse_text
from stepnet.passes.unread import drop_unread_gradients

ROOT = Path(__file__).resolve().parents[1]


def _ops(model):
    nets = model.network if isinstance(model, PlanDef) else [model]
    return [(op.type, tuple(op.output)) for net in nets for op in net.op]


def test_char_rnn_loses_the_one_hot_inputs_gradient_and_nothing_else():
    plan = load(ROOT / "models/char_rnn.pbtxt")
    before = plan.SerializeToString()
    pruned, n = drop_unread_gradients(plan)
    assert plan.SerializeToString() == before          # a new plan; the one given is unchanged
    gone = set(_ops(plan)) - set(_ops(pruned))
    assert gone == {("FCGradient", ("LSTM/i2h_w_grad", "LSTM/i2h_b_grad", "input_blob_grad")),
                    ("Reshape", ("x_onehot_grad", "_x_onehot_grad_dims"))} and n == 2
    assert ("FCGradient", ("LSTM/i2h_w_grad", "LSTM/i2h_b_grad")) in _ops(pruned)
    kept, _ = drop_unread_gradients(plan, keep=["input_blob_grad"])
    assert set(_ops(plan)) - set(_ops(kept)) == {("Reshape", ("x_onehot_grad", "_x_onehot_grad_dims"))}


def _run(plan, iterations):
    ws = Workspace(seed=3)
    ws.run_plan(plan, iterations=iterations)
    return ws


def test_a_pruned_training_plan_computes_the_same_bits(monkeypatch):
    """The digits MLP (FC, Relu, FC, softmax loss, momentum SGD) for 6 iterations with and without its data
    gradient: every tensor both workspaces hold is the same, and the pruned run has no data_grad."""
    monkeypatch.chdir(ROOT)     # (the plan's data paths are relative to the repository root)
    plan = load(ROOT / "models/digits/train.pbtxt")
    pruned, n = drop_unread_gradients(plan)
    assert n == 1 and ("FCGradient", ("fc1_w_grad", "fc1_b_grad")) in _ops(pruned)
    full, less = _run(plan, 6), _run(pruned, 6)
    assert set(full.blobs()) - set(less.blobs()) == {"data_grad"}
    compared = 0
    for name in less.blobs():
        value = less.fetch(name)
        if isinstance(value, np.ndarray):
            assert np.array_equal(value, full.fetch(name)), name
            compared += 1
    assert compared > 15


NESTED = """
name: "p"
network {
  name: "train"
  external_output: "%(output)s"
  op { input: "x" input: "w" input: "dy" output: "w_grad" output: "b_grad" output: "x_grad" type: "FCGradient"
       is_gradient_op: true }
  op { input: "x_grad" output: "x_grad_copy" type: "Copy" is_gradient_op: true }
  op { input: "cond" output: "out" type: "If"
       arg { name: "then_net" n { name: "then" op { input: "%(nested)s" output: "out" type: "Copy" } } } }
  op { input: "w_grad" output: "unread_forward" type: "Copy" }
  op { output: "shown" type: "Print" input: "b_grad" arg { name: "note" s: "%(string)s" } }
}
execution_step { name: "s" network: "train" should_stop_blob: "%(stop)s" }
"""


@pytest.mark.parametrize("where", ["output", "nested", "string", "stop", "keep"])
def test_a_read_anywhere_keeps_the_value(where):
    fields = dict.fromkeys(("output", "nested", "string", "stop"), "other")
    if where != "keep":
        fields[where] = "x_grad_copy"
    plan = parse_text(NESTED % fields, "plan")
    pruned, n = drop_unread_gradients(plan, keep=["x_grad_copy"] if where == "keep" else ())
    assert n == 0 and pruned is plan
    alone, n = drop_unread_gradients(parse_text(NESTED % dict.fromkeys(fields, "other"), "plan"))
    assert n == 2 and ("Copy", ("x_grad_copy",)) not in _ops(alone)
    assert ("FCGradient", ("w_grad", "b_grad")) in _ops(alone)
    assert ("Copy", ("unread_forward",)) in _ops(alone)          # (not a gradient op: never dropped)


def test_a_convolutions_unread_data_gradient_is_dropped_with_or_without_bias():
    net = parse_text("""
      name: "n"
      op { input: "x" input: "w" input: "dy" output: "w_grad" output: "b_grad" output: "x_grad"
           type: "ConvGradient" is_gradient_op: true arg { name: "kernel" i: 3 } }
      op { input: "x" input: "v" input: "dz" output: "v_grad" output: "x_grad2" type: "ConvGradient"
           is_gradient_op: true arg { name: "kernel" i: 3 } arg { name: "no_bias" i: 1 } }
      op { input: "x" input: "u" input: "de" output: "u_grad" output: "c_grad" type: "ConvGradient"
           is_gradient_op: true arg { name: "kernel" i: 3 } }
      op { input: "x" input: "t" input: "df" output: "t_grad" output: "x_grad3" type: "ConvGradient"
           arg { name: "kernel" i: 3 } arg { name: "no_bias" i: 1 } }
    """, "net")
    pruned, n = drop_unread_gradients(net)
    assert n == 2 and [tuple(op.output) for op in pruned.op] == [
        ("w_grad", "b_grad"), ("v_grad",), ("u_grad", "c_grad"),     # (the third had no dX: its bias gradient stays)
        ("t_grad", "x_grad3")]                                      # (not a gradient op: as written)


def test_only_pure_gradient_ops_are_dropped():
    net = parse_text("""
      name: "n"
      op { input: "a" output: "r" type: "UniformFill" is_gradient_op: true arg { name: "shape" ints: 2 } }
      op { input: "g" output: "g" type: "Copy" is_gradient_op: true }
      op { input: "h" output: "h2" type: "NoSuchGradient" is_gradient_op: true }
      op { input: "h" output: "h3" type: "Copy" is_gradient_op: true }
    """, "net")
    pruned, n = drop_unread_gradients(net)
    assert isinstance(pruned, NetDef) and n == 1
    assert _ops(pruned) == [("UniformFill", ("r",)), ("Copy", ("g",)), ("NoSuchGradient", ("h2",))]


def test_a_two_output_fc_gradient_computes_no_input_gradient(monkeypatch):
    from stepnet.ops import math_grad
    from stepnet.testing import run_op

    def refuse(*args):
        raise AssertionError("dX computed for an FCGradient without a dX output")
    monkeypatch.setattr(math_grad, "input_gradient_into", refuse)
    x, w, dy = (np.ones(s, np.float32) for s in ((70, 65), (8, 65), (70, 8)))
    x[:, 1:] = 0                                             # (one-hot rows: the scatter-add path too)
    for fused in (False, True):
        dw, db = run_op("FCGradient", [x, w, dy], 2, ws=Workspace(fused_cells=fused))
        assert np.array_equal(db, dy.sum(0)) and np.allclose(dw, dy.T @ x)
    with pytest.raises(OpError, match="dX computed"):       # (the refusal is reached with a dX output)
        run_op("FCGradient", [x, w, dy], 3)


def test_the_command_line_keeps_what_it_saves_or_fetches(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    ck = tmp_path / "ck.minidb"
    assert main(["run", "models/digits/train.pbtxt", "-n", "2", "--checkpoint", str(ck), "--quiet"]) == 0
    ws = Workspace()
    checkpoints.load(ws, ck)
    assert ws.fetch("data_grad").shape == (64, 64)       # --checkpoint saves every blob: all computed
    assert main(["run", "models/digits/train.pbtxt", "-n", "2", "--fetch", "data_grad"]) == 0
    assert "data_grad: shape (64, 64) float32" in capsys.readouterr().out


def test_a_chain_read_backwards_is_dropped_whole():
    """Each op reads the next op's output and nothing reads the first one's: dropping it frees the second, and
    so on (a worklist, not one sweep per op: a hostile file's long chain stays linear). A read of one blob in
    the middle keeps the ops that write it and what they read."""
    for kept in (None, 250):
        net = NetDef(name="chain")
        for i in range(500):
            op = net.op.add(type="Copy", is_gradient_op=True)
            op.input.append(f"b{i + 1}")
            op.output.append(f"b{i}")
        if kept is not None:
            net.op.add(type="Copy", input=[f"b{kept}"], output=["kept"])   # (not a gradient op)
        pruned, n = drop_unread_gradients(net)
        assert n == (500 if kept is None else kept)
        assert [tuple(op.output) for op in pruned.op] == (
            [] if kept is None else [(f"b{i}",) for i in range(kept, 500)] + [("kept",)])
