"""Gradients of If (control.py) and Do (scopes.py): the backward nets they build, the renaming of an If's branch outputs
when the backward pass splits a gradient, and whole-net gradients against float64 central differences of the
net's loss, with each branch taken, on the CPU and the emulated device."""
import numpy as np
import pytest

from stepnet.core.errors import GradientError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import control, scopes
from stepnet.ops.base import GradientContext
from stepnet.ops.control import net_argument
from stepnet.ops.scopes import INNER_GRAD, INNER_GRAD_COPY, WorkspaceStack
from stepnet.io.proto import to_text
from stepnet.testing import DEVICES, make_op

from control_nets import check_net_gradient, host, net, net_gradients, op_on

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3))
W = RNG.standard_normal((2, 3))


def feeds(cond):
    return {"c": np.array(cond), "x": X.copy(), "w": W.copy()}


def if_net(device="cpu", text=False):
    """y = tanh(x * w) if c else sigmoid(x); loss = sum(y * w): w is read in a branch and after the If."""
    mk = op_on(device)
    then = net("then", mk("Mul", ["x", "w"], ["h"]), mk("Tanh", ["h"], ["y"]))
    other = net("else", mk("Sigmoid", ["x"], ["y"]))
    branches = {"then_net": to_text(then), "else_net": to_text(other)} if text else {"then_net": then,
                                                                                       "else_net": other}
    return net("if_net", mk("If", ["c", "x", "w"], ["y"], **branches),
               mk("Mul", ["y", "w"], ["z"]), mk("SumElements", ["z"], ["loss"]))


def if_loss(cond, x, w):
    y = np.tanh(x * w) if cond else 1 / (1 + np.exp(-x))
    return (y * w).sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cond", [True, False])
def test_if_gradient_against_finite_differences(device, cond):
    got = check_net_gradient(if_net(device), feeds(cond), ["x", "w"], device)
    # and the loss itself is the definition's
    ws, _, _ = net_gradients(if_net(device), feeds(cond), device)
    assert np.isclose(host(ws, "loss"), if_loss(cond, X, W))
    if not cond:   # w is not read by the else branch: its gradient is only the one from after the If
        np.testing.assert_allclose(got["w"], 1 / (1 + np.exp(-X)))


@pytest.mark.parametrize("cond", [True, False])
def test_if_gradient_with_branches_as_text(cond):
    check_net_gradient(if_net(text=True), feeds(cond), ["x", "w"])


def test_the_gradient_if_and_the_autosplit_renaming_of_its_branch_outputs():
    ops, grads = backward_ops(if_net().op, {"loss": "loss_grad"})
    assert [(o.type, list(o.output)) for o in ops] == [
        ("SumElementsGradient", ["z_grad"]), ("MulGradient", ["y_grad", "w_grad"]),
        ("If", ["h_grad", "x_grad", "_w_grad_autosplit_0"]), ("Sum", ["w_grad"])]
    grad_if = ops[2]
    assert grad_if.input[0] == "c" and grad_if.is_gradient_op
    assert grads["x"] == "x_grad" and grads["w"] == "w_grad"
    then, other = net_argument(grad_if, "then_net"), net_argument(grad_if, "else_net")
    assert then.name == "then_grad" and other.name == "else_grad"
    # both branches write the renamed gradient of w: then by MulGradient, else by zeros shaped like w
    assert "_w_grad_autosplit_0" in then.op[-1].output
    assert [(o.type, list(o.input), list(o.output)) for o in other.op] == [
        ("SigmoidGradient", ["y", "y_grad"], ["x_grad"]), ("Scale", ["w"], ["_w_grad_autosplit_0"])]
    assert not any("w_grad" == n for o in [*then.op, *other.op] for n in o.output)


def test_renaming_follows_later_reads_and_nested_ifs():
    inner = net("inner", make_op("Copy", ["a"], ["g"]))
    branch = net("b", make_op("If", ["c2", "a"], ["g"], then_net=inner), make_op("Scale", ["g"], ["h"]),
                 make_op("Copy", ["h"], ["g"]))
    grad_if = make_op("If", ["c", "a"], ["g"], then_net=branch, else_net=to_text(inner))
    control.rename_gradient_output(grad_if, 0, "g2")
    then, other = net_argument(grad_if, "then_net"), net_argument(grad_if, "else_net")
    assert grad_if.output[0] == "g2"
    assert [list(o.output) for o in then.op] == [["g2"], ["h"], ["g2"]]
    assert list(then.op[1].input) == ["g2"]                               # read after the write: renamed
    assert list(net_argument(then.op[0], "then_net").op[0].output) == ["g2"]   # the nested If's branch too
    assert list(other.op[0].output) == ["g2"]                             # a branch given as text
    do = make_op("Do", ["a", "s"], ["g", "s"], net=inner, inner_blobs=["a", "g"], outer_blobs_idx=[0, 1])
    control.rename_gradient_output(do, 0, "g3")
    assert list(do.output) == ["g3", "s"] and list(net_argument(do, "net").op[0].output) == ["g"]


def overwriting_if_net(device="cpu"):
    """y = 2x; if c: y = tanh(x * w) (no else); loss = sum(y * w). The If overwrites its input y without reading
    it, so when it runs, the y made before it gets no gradient."""
    mk = op_on(device)
    then = net("then", mk("Mul", ["x", "w"], ["h"]), mk("Tanh", ["h"], ["y"]))
    return net("overwrite", mk("Scale", ["x"], ["y"], scale=2.0),
               mk("If", ["c", "x", "w", "y"], ["y"], then_net=then),
               mk("Mul", ["y", "w"], ["z"]), mk("SumElements", ["z"], ["loss"]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cond", [True, False])
def test_if_without_else_that_overwrites_an_input(device, cond):
    got = check_net_gradient(overwriting_if_net(device), feeds(cond), ["x", "w"], device)
    if not cond:
        np.testing.assert_allclose(got["x"], 2 * W)


def do_net(device="cpu"):
    """y = tanh(x * w) + x computed by a Do in its own workspace; loss = sum(y * w)."""
    mk = op_on(device)
    inner = net("inner", mk("Mul", ["a", "v"], ["t"]), mk("Tanh", ["t"], ["u"]), mk("Add", ["u", "a"], ["b"]))
    return net("do_net", mk("CreateScope", [], ["scope"]),
               mk("Do", ["x", "w", "scope"], ["y", "scope"], net=inner, inner_blobs=["a", "v", "b"],
                  outer_blobs_idx=[0, 1, 2]),
               mk("Mul", ["y", "w"], ["z"]), mk("SumElements", ["z"], ["loss"]))


@pytest.mark.parametrize("device", DEVICES)
def test_do_gradient_against_finite_differences(device):
    got = check_net_gradient(do_net(device), feeds(True), ["x", "w"], device)
    t = np.tanh(X * W)
    np.testing.assert_allclose(got["x"], W * (1 - t**2) * W + W)   # by hand


def test_the_gradient_do():
    ops, grads = backward_ops(do_net().op, {"loss": "loss_grad"})
    grad_do = next(o for o in ops if o.type == "Do")
    assert grad_do.is_gradient_op
    assert list(grad_do.input) == ["y_grad", "x", "w", "scope"]   # as the backward net reads them
    assert list(grad_do.output) == ["x_grad", "_w_grad_autosplit_0", "scope"]   # renamed: bound by position
    args = {a.name: a for a in grad_do.arg}
    inner = [s.decode() for s in args["inner_blobs"].strings]
    outer = [*grad_do.input[:-1], *grad_do.output[:-1]]
    bound = {i: outer[k] for i, k in zip(inner, args["outer_blobs_idx"].ints)}
    assert bound == {"b" + INNER_GRAD: "y_grad", "a": "x", "v": "w",
                     "a" + INNER_GRAD_COPY: "x_grad", "v" + INNER_GRAD_COPY: "_w_grad_autosplit_0"}
    assert [s.decode() for s in args["saved_fwd_blobs"].strings] == ["u"]   # a local of the forward Do (tanh)
    copies = [o for o in net_argument(grad_do, "net").op if o.type == "Copy"]
    assert [list(o.input) for o in copies] == [["a_grad"], ["v_grad"]]   # a's two gradients summed inside
    assert grads["x"] == "x_grad" and grads["w"] == "w_grad"


def test_do_gradient_over_several_training_steps_pops_what_it_pushed():
    ws, grads, _ = net_gradients(do_net(), feeds(True), runs=3)
    stack = ws.get_blob("scope").value
    assert isinstance(stack, WorkspaceStack) and stack.empty() and len(stack.workspaces) == 1
    check_net_gradient(do_net(), feeds(True), ["x", "w"], runs=3)


def do_in_if_net(device="cpu"):
    """if c: y = Do(tanh(x * w)) else: y = sigmoid(x) * w; loss = sum(y)."""
    mk = op_on(device)
    inner = net("inner", mk("Mul", ["a", "v"], ["t"]), mk("Tanh", ["t"], ["b"]))
    then = net("then", mk("Do", ["x", "w", "scope"], ["y", "scope"], net=inner, inner_blobs=["a", "v", "b"],
                          outer_blobs_idx=[0, 1, 2]))
    other = net("else", mk("Sigmoid", ["x"], ["s"]), mk("Mul", ["s", "w"], ["y"]))
    return net("do_in_if", mk("CreateScope", [], ["scope"]),
               mk("If", ["c", "x", "w", "scope"], ["y", "scope"], then_net=then, else_net=other),
               mk("SumElements", ["y"], ["loss"]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cond", [True, False])
def test_do_in_if_gradient(device, cond):
    check_net_gradient(do_in_if_net(device), feeds(cond), ["x", "w"], device, runs=2)


def test_gradient_errors_name_the_op_and_net():
    bad = net("bad", make_op("If", ["c", "x"], ["y"], then_net=net("t", make_op("Assert", ["x"], ["y"]))),
              make_op("SumElements", ["y"], ["loss"]))
    with pytest.raises(GradientError, match=r"op #0 \(If\), then_net 't': op #0 \(Assert\)"):
        backward_ops(bad.op, {"loss": "loss_grad"})
    with pytest.raises(GradientError, match=r"op #0 \(If\): the gradient of If needs the backward pass"):
        control.if_gradient(GradientContext(bad.op[0], ["y_grad"]))
    duo = make_op("Do", ["x", "s"], ["y", "s"], net=net("n"), inner_blobs=["a"], outer_blobs_idx=[0])
    with pytest.raises(GradientError, match="every input and output of the Do must be bound"):
        backward_ops([duo], {"y": "y_grad"})


def test_shared_output_gradients_are_deduplicated():
    then = net("t", make_op("Copy", ["x"], ["y1"]), make_op("Scale", ["x"], ["y2"], scale=3.0))
    ops, grads = backward_ops([make_op("If", ["c", "x"], ["y1", "y2"], then_net=then)], {"y1": "g", "y2": "g"})
    assert ops[0].type == "Copy" and list(ops[0].output) == ["y2_g_DEDUP"]
    both = net("n", make_op("If", ["c", "x"], ["y1", "y2"], then_net=then), make_op("Add", ["y1", "y2"], ["loss"]))
    ws, grads, _ = net_gradients(both, feeds(True))
    np.testing.assert_allclose(host(ws, grads["x"]), np.full_like(X, 4.0))   # d(x + 3x)/dx


# ------------------------------------------------------------------------------------------- broken makers
def _swapped_branches(g):
    control.if_gradient(g)
    for o in g.ops:
        if o.type == "If":
            for a in o.arg:
                a.name = {"then_net": "else_net", "else_net": "then_net"}[a.name]


def _doubled_copy(g):
    scopes.do_gradient(g)
    for a in g.ops[-1].arg:
        if a.name == "net":
            copy = next(o for o in a.n.op if o.type == "Copy")
            copy.type = "Scale"
            copy.arg.add(name="scale", f=2.0)


def _no_overwrite_fix(g):
    """The If gradient as Caffe2 builds it for an input the branch overwrites: the output gradient passed through."""
    control.if_gradient(g)
    for o in g.ops:
        for a in o.arg:
            for f in a.n.op:
                if f.type == "Scale" and f.input[0] == "y":   # zeros -> a copy of y's output gradient
                    f.type, f.input[0] = "Copy", g.g_output[0]
                    del f.arg[:]


@pytest.mark.parametrize("op_type, maker, build, cond", [
    ("If", _swapped_branches, if_net, True), ("Do", _doubled_copy, do_net, True),
    ("If", _no_overwrite_fix, overwriting_if_net, True)])
def test_the_whole_net_check_catches_broken_makers(op_type, maker, build, cond, patched):
    check_net_gradient(build(), feeds(cond), ["x", "w"])
    patched(op_type, gradient=maker)
    with pytest.raises(AssertionError, match="gradient of 'x' is wrong"):
        check_net_gradient(build(), feeds(cond), ["x", "w"])


def test_do_gradient_passed_through():
    """A Do whose net passes its input's gradient through (Sum of one input makes no gradient op) still gets one."""
    mk = op_on("cpu")
    inner = net("inner", mk("Sum", ["a"], ["b"]))
    fwd = net("pass", mk("CreateScope", [], ["scope"]),
              mk("Do", ["x", "scope"], ["y", "scope"], net=inner, inner_blobs=["a", "b"], outer_blobs_idx=[0, 1]),
              mk("Mul", ["y", "w"], ["z"]), mk("SumElements", ["z"], ["loss"]))
    got = check_net_gradient(fwd, feeds(True), ["x", "w"])
    np.testing.assert_allclose(got["x"], W)


@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("other", ["sigmoid", "pass", "none"])
def test_if_gradient_passed_through_a_branch(cond, other):
    """then passes x's gradient through (Sum of one input: no gradient op); else differentiates, passes it through
    too, or is absent (y keeps its value from before the If)."""
    mk = op_on("cpu")
    branches = {"then_net": net("then", mk("Sum", ["x"], ["y"]))}
    if other != "none":
        one = mk("Sigmoid", ["x"], ["y"]) if other == "sigmoid" else mk("Sum", ["x"], ["y"])
        branches["else_net"] = net("else", one)
    fwd = net("pass", mk("Scale", ["w"], ["y"], scale=3.0), mk("If", ["c", "x", "y"], ["y"], **branches),
              mk("Mul", ["y", "w"], ["z"]), mk("SumElements", ["z"], ["loss"]))
    check_net_gradient(fwd, feeds(cond), ["x", "w"])
