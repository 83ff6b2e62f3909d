"""Random plain nets run compiled and op by op (Workspace(compile_steps=False), the reference): elementwise ops,
FC, Softmax, Sum, Concat/Split, Transpose, copies and aliases, a training net's loss chain (LabelCrossEntropy,
AveragedLoss, ConstantFill and their gradients), Reshape by argument or by a fed shape, LearningRate and an SGD
step (WeightedSum in place), some in place, some writing a blob twice or one the net reads before writing it;
run several times with new values (labels, shapes to reshape to, iteration counts), new shapes, references
kept across runs and values fed into outputs in between. After every run each blob has the same bits, each
error the same message, and every array kept from an earlier run holds what it holds op by op (changed only
by an op that writes it in place in both)."""
import numpy as np
import pytest

from stepnet import Workspace
from stepnet.core.errors import StepnetError
from stepnet.io.proto import NetDef

F = np.float32
UNARY = ("Sigmoid", "Tanh", "Relu", "Exp", "Log", "Abs", "Negative", "Softsign", "Scale", "Copy", "Alias",
         "Softmax", "Transpose", "Cast")
BINARY = ("Add", "Sub", "Mul", "Div", "Sum", "GT", "LT", "EQ", "MatMul")


def random_net(rng) -> tuple[NetDef, dict]:
    """(net, feeds): ops over same-shaped m x k blobs, FC to n columns and back."""
    m, k = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    feeds = {f"x{i}": rng.standard_normal((m, k)).astype(F) for i in range(3)}
    feeds.update({"w": rng.standard_normal((k, k)).astype(F), "b": rng.standard_normal(k).astype(F),
                  "s": np.array([0.5], F), "one": np.array([1.0], F), "it": np.array([3], np.int64),
                  "lab": rng.integers(0, k, m).astype(np.int32), "shp": np.array([k, m], np.int64)})
    net, names = NetDef(name="r"), ["x0", "x1", "x2"]
    for i in range(int(rng.integers(1, 7))):
        kind = rng.integers(0, 9)
        out = str(rng.choice(names)) if rng.random() < 0.3 else f"y{i}"       # in place, or a blob written again
        if kind >= 6:
            _training_ops(rng, net, kind, i, str(rng.choice(names)), str(rng.choice(names)), out)
            names.append(out) if out not in names else None
            continue
        if kind == 0:
            op_type, ins = str(rng.choice(UNARY)), [str(rng.choice(names))]
        elif kind == 1:
            op_type = str(rng.choice(BINARY))
            ins = [str(rng.choice(names)) for _ in range(int(rng.integers(2, 4)) if op_type == "Sum" else 2)]
            ins[1] = "w" if op_type == "MatMul" else ins[1]
        elif kind == 5:
            op_type = str(rng.choice(["ElementwiseLinear", "WeightedSum"]))
            a, c = (str(rng.choice(names)) for _ in range(2))
            ins = [a, "b", "b"] if op_type == "ElementwiseLinear" else [a, "s", c, "s"]
        elif kind == 2:
            op_type, ins = "FC", [str(rng.choice(names)), "w", "b"]
        elif kind == 3:
            op_type, ins = "Concat", [str(rng.choice(names)) for _ in range(2)]
            op = net.op.add(type=op_type, input=ins, output=[f"c{i}", f"c{i}_info"])
            op.arg.add(name="axis", i=1)
            net.op.add(type="Split", input=[f"c{i}"], output=[out, f"s{i}"]).arg.add(name="axis", i=1)
            names.append(out) if out not in names else None
            continue
        else:
            op_type, ins = "Softmax", [str(rng.choice(names))]
        if op_type == "Transpose" or (op_type == "Softmax" and k == 1):
            out = f"y{i}"          # (a transposed blob has another shape: never in place, never reused)
        op = net.op.add(type=op_type, input=ins, output=[out])
        if op_type == "Cast":
            op.arg.add(name="to", i=int(rng.choice([1, 10])))          # float, double
        elif op_type == "Scale":
            op.arg.add(name="scale", f=float(rng.choice([0.5, -2.0])))
        if op_type != "Transpose" and out not in names:
            names.append(out)
    return net, feeds


def _training_ops(rng, net, kind, i, a, c, out) -> None:
    """Ops of a training net reading a and c, writing out (of a's shape): the loss chain to the probabilities'
    gradient, a Reshape there and back, or a learning rate and an SGD step on a then copied to out."""
    def add(op_type, ins, outs, **args):
        op = net.op.add(type=op_type, input=ins, output=outs)
        for name, value in args.items():
            arg = op.arg.add(name=name)
            if isinstance(value, list):
                arg.ints.extend(value)
            elif isinstance(value, str):
                arg.s = value.encode()
            elif isinstance(value, float):
                arg.f = value
            else:
                arg.i = value
    if kind == 6:
        add("Softmax", [a], [f"p{i}"])
        add("LabelCrossEntropy", [f"p{i}", "lab"], [f"xent{i}"])
        add("AveragedLoss", [f"xent{i}"], [f"loss{i}"])
        add("ConstantFill", [f"loss{i}"], [f"dloss{i}"], value=float(rng.choice([1.0, 0.5])))
        add("AveragedLossGradient", [f"xent{i}", f"dloss{i}"], [f"dxent{i}"])
        add("LabelCrossEntropyGradient", [f"p{i}", "lab", f"dxent{i}"], [out])
    elif kind == 7:
        if rng.random() < 0.5:
            add("Reshape", [a], [f"r{i}", f"r{i}_old"], shape=[-1])
        else:
            add("Reshape", [a, "shp"], [f"r{i}", f"r{i}_old"])
        add("Reshape", [f"r{i}", f"r{i}_old"], [out, f"r{i}_dims"])
    else:
        add("LearningRate", ["it"], [f"lr{i}"], base_lr=-0.1, policy="step", stepsize=1, gamma=0.9)
        add("WeightedSum", [a, "one", c, f"lr{i}"], [a])
        add("Copy", [a], [out])


def state(ws) -> dict:
    return {b: ws.fetch(b) for b in ws.blobs() if isinstance(ws.find(b).value, np.ndarray)}


def play(net, feeds, events, compiled: bool):
    """Run the net once per event (fed values first); per run its blobs or its error, and the kept arrays."""
    ws = Workspace(compile_steps=compiled, fused_cells=False)
    for name, value in feeds.items():
        ws.feed(name, value)
    kept, seen, bound = [], [], None
    for fed, keep in events:
        for name, value in fed.items():
            ws.feed(name, value)
        try:
            bound = bound or ws.create_net(net)
            with np.errstate(all="ignore"):
                bound.run()
            seen.append(state(ws))
        except StepnetError as e:
            seen.append(f"{type(e).__name__}: {e}")
        if keep and ws.has(keep) and isinstance(ws.find(keep).value, np.ndarray):
            kept.append((ws.find(keep).value, ws.fetch(keep)))
    return seen, kept


def events_for(rng, net, feeds):
    outputs = sorted({o for op in net.op for o in op.output})
    events = []
    for r in range(5):
        fed = {}
        if r and rng.random() < 0.6:
            fed = {name: rng.standard_normal(value.shape).astype(F) for name, value in feeds.items()
                   if name.startswith("x") and rng.random() < 0.7}
        m, k = feeds["x0"].shape
        if r and rng.random() < 0.5:           # the values a training net's extra inputs take
            fed["it"] = np.array([r + 3], np.int64)
            fed["lab"] = rng.integers(0, k + (r == 4), m).astype(np.int32)    # (at the last run one may be over)
            fed["shp"] = np.array([[k, m], [m * k], [m, k]][int(rng.integers(0, 3))], np.int64)
        if r == 3 and rng.random() < 0.4:      # new shapes: compiled again (or the op's error)
            m = int(rng.integers(1, 4))
            fed = {name: rng.standard_normal((m, value.shape[1])).astype(F) for name, value in feeds.items()
                   if name.startswith("x")}
            fed.update(lab=rng.integers(0, k, m).astype(np.int32), shp=np.array([k, m], np.int64))
        if r and rng.random() < 0.3:
            fed[str(rng.choice(outputs))] = np.full((2, 2), 5, F)   # a value fed into an output
        events.append((fed, str(rng.choice(outputs)) if rng.random() < 0.5 else None))
    return events


@pytest.mark.parametrize("seed", range(40))
def test_random_nets_compiled_match_op_by_op(seed):
    rng = np.random.default_rng(seed)
    for case in range(8):
        net, feeds = random_net(rng)
        events = events_for(rng, net, feeds)
        (got, kept_c), (want, kept_i) = (play(net, feeds, events, compiled) for compiled in (True, False))
        where = f"seed {seed} case {case}: {[(op.type, list(op.input), list(op.output)) for op in net.op]}"
        for run, (g, w) in enumerate(zip(got, want)):
            assert type(g) is type(w), f"{where} run {run}: {g if isinstance(g, str) else w}"
            if isinstance(w, str):
                assert g == w, where
                continue
            assert g.keys() == w.keys(), where
            for name, value in w.items():
                np.testing.assert_array_equal(g[name], value, err_msg=f"{where} run {run} blob {name}")
        assert len(kept_c) == len(kept_i), where
        for (got, got_then), (want, want_then) in zip(kept_c, kept_i):   # (an op in place changes both alike)
            np.testing.assert_array_equal(got, want, err_msg=f"{where}: a kept array differs")
            assert np.array_equal(got, got_then) == np.array_equal(want, want_then), f"{where}: a kept array changed"
