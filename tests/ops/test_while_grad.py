"""The gradient of While (control_grad.py): whole-net gradients against float64 central differences of the net's
loss for loops run 0 to 3 times, the gradient ops it builds, and the loops it refuses."""
import numpy as np
import pytest

from stepnet.core.errors import GradientError
from stepnet.ops import control_grad
from stepnet.ops.control import net_argument
from stepnet.passes.gradients import backward_ops
from stepnet.testing import make_op

from control_nets import check_net_gradient, host, net, net_gradients

RNG = np.random.default_rng(11)
X = RNG.uniform(-1, 1, (2, 3))
W = RNG.uniform(-1, 1, (2, 3))


def feeds(n):
    return {"x": X.copy(), "w": W.copy(), "n": np.array(n, np.int32), "zero": np.array(0, np.int32),
            "one": np.array(1, np.int32)}


def while_net(body=None, outputs=("s",), copy_external=True, cond_writes=("i", "cond")):
    """s = x; for n iterations: s = tanh(s * w) (in a Do, its own workspace per iteration); loss = sum(s * w).
    w is read in the loop and after it; the counter i is advanced by cond_net."""
    body = body or net("body", make_op("Scale", ["a"], ["a0"], scale=1.0), make_op("Mul", ["a0", "v"], ["h"]),
                       make_op("Tanh", ["h"], ["a"]))
    do_args = {"copy_external_blobs": 1} if copy_external else {}
    do = make_op("Do", ["s", "w", "scope"], [*outputs, "scope"], net=body, inner_blobs=["a", "v"],
                 outer_blobs_idx=[0, 1], **do_args)
    cond_net = net("cond", make_op("Add", ["i", "one"], ["i"]), make_op("LE", ["i", "n"], [cond_writes[1]]))
    return net("while_net", make_op("Copy", ["zero"], ["i"]), make_op("LE", ["i", "n"], ["cond"]),
               make_op("CreateScope", [], ["scope"]), make_op("Copy", ["x"], ["s"]),
               make_op("While", ["cond", "s", "w", "i", "one", "n", "scope"], ["s", "i", "cond", "scope"],
                       loop_net=net("loop", do), cond_net=cond_net),
               make_op("Mul", ["s", "w"], ["z"]), make_op("SumElements", ["z"], ["loss"]))


def loss_by_hand(x, w, n):
    for _ in range(n):
        x = np.tanh(x * w)
    return (x * w).sum()


@pytest.mark.parametrize("n", [0, 1, 3])
def test_while_gradient_against_finite_differences(n):
    got = check_net_gradient(while_net(), feeds(n), ["x", "w"])
    ws, _, _ = net_gradients(while_net(), feeds(n))
    assert np.isclose(host(ws, "loss"), loss_by_hand(X, W, n))
    if n == 0:   # the loop passes x through: d sum(x * w) / dx = w
        np.testing.assert_allclose(got["x"], W)


def test_while_gradient_over_several_training_steps():
    check_net_gradient(while_net(), feeds(2), ["x", "w"], runs=3)


def test_a_state_whose_output_has_no_gradient():
    """u is carried by the loop (u = u * w, s = tanh(s * u)) but only s reaches the loss: u's gradient starts
    from zeros and flows back through the iterations (Caffe2 dropped it)."""
    copy = {"scale": 1.0}
    body = net("body", make_op("Scale", ["a"], ["a0"], **copy), make_op("Scale", ["u"], ["u0"], **copy),
               make_op("Mul", ["u0", "v"], ["un"]), make_op("Mul", ["a0", "un"], ["h"]), make_op("Tanh", ["h"], ["a"]),
               make_op("Scale", ["un"], ["u"], **copy))
    do = make_op("Do", ["s", "w", "u", "scope"], ["s", "u", "scope"], net=body, inner_blobs=["a", "v", "u"],
                 outer_blobs_idx=[0, 1, 2], copy_external_blobs=1)
    cond_net = net("cond", make_op("Add", ["i", "one"], ["i"]), make_op("LE", ["i", "n"], ["cond"]))
    fwd = net("state", make_op("Copy", ["zero"], ["i"]), make_op("LE", ["i", "n"], ["cond"]),
              make_op("CreateScope", [], ["scope"]), make_op("Copy", ["w"], ["u"]), make_op("Copy", ["x"], ["s"]),
              make_op("While", ["cond", "s", "w", "u", "i", "one", "n", "scope"], ["s", "u", "i", "cond", "scope"],
                      loop_net=net("loop", do), cond_net=cond_net),
              make_op("Mul", ["s", "w"], ["z"]), make_op("SumElements", ["z"], ["loss"]))
    check_net_gradient(fwd, feeds(3), ["x", "w"])


def test_the_gradient_while():
    ops, grads = backward_ops(while_net().op, {"loss": "loss_grad"})
    types = [o.type for o in ops]
    assert types[types.index("HasScope"):] == ["HasScope", "Copy", "Scale", "While", "Copy", "Copy", "Sum",
                                               "CopyOnDeviceLike"]
    grad_while = next(o for o in ops if o.type == "While")
    assert grad_while.is_gradient_op and grad_while.input[0] == "scope_grad_while_cond"
    cond_net, loop = net_argument(grad_while, "cond_net"), net_argument(grad_while, "loop_net")
    assert [(o.type, list(o.input), list(o.output)) for o in cond_net.op] == [
        ("HasScope", ["scope"], ["scope_grad_while_cond"]), ("Copy", ["_s_grad_while"], ["_s_grad_while_seed"])]
    assert [o.type for o in loop.op] == ["Do", "Sum"]              # w's gradients of all iterations summed
    assert list(loop.op[0].output) == ["_s_grad_while", "_w_grad_while_step", "scope"]
    assert grads["x"] == "x_grad" and grads["w"] == "w_grad"      # w also gets one from after the loop


def _first_iteration_only(g):
    """Caffe2's While gradient for a weight: each iteration overwrites its gradient instead of adding to it."""
    control_grad.while_gradient(g)
    loop = next(a.n for o in g.ops if o.type == "While" for a in o.arg if a.name == "loop_net")
    del loop.op[-1]
    do = loop.op[0]
    do.output[list(do.output).index("_w_grad_while_step")] = "_w_grad_while"


def test_the_whole_net_check_catches_a_broken_while_gradient(patched):
    check_net_gradient(while_net(), feeds(3), ["w"])
    patched("While", gradient=_first_iteration_only)
    with pytest.raises(AssertionError, match="gradient of 'w' is wrong"):
        check_net_gradient(while_net(), feeds(3), ["w"])


def test_loops_whose_gradient_is_refused():
    fwd = while_net()
    loop = net_argument(fwd.op[4], "loop_net")
    two = net("two", *loop.op, *loop.op)
    fwd.op[4].arg[0].n.CopyFrom(two)
    with pytest.raises(GradientError, match=r"op #4 \(While\): the gradient of While needs a loop_net of one Do"):
        backward_ops(fwd.op, {"loss": "loss_grad"})
    with pytest.raises(GradientError, match="set copy_external_blobs on the loop body's Do"):
        backward_ops(while_net(copy_external=False).op, {"loss": "loss_grad"})
    with pytest.raises(GradientError, match=r"output\(s\) 'i' get a gradient but are not written by the loop"):
        backward_ops(while_net().op, {"i": "i_grad", "loss": "loss_grad"})
    with pytest.raises(GradientError, match="cond_net writes 's', whose gradient the loop needs"):
        backward_ops(while_net(cond_writes=("i", "s")).op, {"loss": "loss_grad"})
