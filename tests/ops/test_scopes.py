"""Do and its workspace stack (scopes.py): CreateScope, HasScope, Do's blob bindings, its child workspaces
(pushed, reused, popped; they see only bound blobs), copy_external_blobs, bad bindings and their messages, and a
broken kernel caught by each check. Do's gradient: test_control_grad.py."""
import numpy as np
import pytest
from control_nets import host, net, op_on, run, workspace

from stepnet.core.errors import ArgumentError, MissingBlobError, NetError
from stepnet.ops import REGISTRY
from stepnet.ops.scopes import WorkspaceStack
from stepnet.runtime.workspace import ScopeWorkspace
from stepnet.testing import DEVICES, make_op

X = np.array([[-1.5, 2.0, 0.0], [3.0, -0.5, 1.0]], np.float32)


def do_net(device="cpu", **do_args):
    """y = x * x + x in the Do's own workspace (t stays there)."""
    mk = op_on(device)
    inner = net("inner", mk("Mul", ["a", "a"], ["t"]), mk("Add", ["t", "a"], ["b"]))
    args = {"net": inner, "inner_blobs": ["a", "b"], "outer_blobs_idx": [0, 1], **do_args}
    return net("d", mk("CreateScope", [], ["scope"]), mk("Do", ["x", "scope"], ["y", "scope"], **args))


def check_do(device):
    ws = run(do_net(device), device, x=X)
    np.testing.assert_array_equal(host(ws, "y"), X * X + X)
    assert not ws.has("t") and not ws.has("a")   # inner blobs live in the Do's workspace only
    stack = ws.get_blob("scope").value
    assert isinstance(stack, WorkspaceStack) and stack.top == 0
    np.testing.assert_array_equal(host(stack.workspaces[0], "t"), X * X)


@pytest.mark.parametrize("device", DEVICES)
def test_do(device):
    check_do(device)


def test_do_workspace_sees_only_bound_blobs():
    inner = net("inner", make_op("Mul", ["a", "x"], ["b"]))   # x exists outside, but is not bound
    d = net("d", make_op("CreateScope", [], ["s"]),
            make_op("Do", ["x", "s"], ["y", "s"], net=inner, inner_blobs=["a", "b"], outer_blobs_idx=[0, 1]))
    with pytest.raises(MissingBlobError, match=r"net 'd/Do#1.net\(inner\)', op #0 \(Mul\): input blob 'x' does "
                                               "not exist"):
        run(d, x=X)


def test_do_reuses_workspaces_and_create_scope_empties_the_stack():
    ws = workspace(x=X)
    d = ws.create_net(do_net())
    for _ in range(3):
        d.run()
    stack = ws.get_blob("scope").value
    assert stack.top == 0 and len(stack.workspaces) == 1   # pushed, emptied and pushed again into the same one
    # Without CreateScope each run pushes one more workspace, which HasScope sees.
    mk = op_on("cpu")
    inner = net("inner", mk("Copy", ["a"], ["b"]))
    push = net("push", mk("Do", ["x", "s"], ["y", "s"], net=inner, inner_blobs=["a", "b"], outer_blobs_idx=[0, 1]),
               mk("HasScope", ["s"], ["has"]))
    ws = run(net("scope", mk("CreateScope", [], ["s"])), x=X)
    ws.run_net_once(push)
    assert ws.fetch("has").tolist() == [True]
    ws.run_net_once(push)
    assert ws.get_blob("s").value.top == 1
    ws.run_net_once(net("clear", mk("CreateScope", [], ["s"]), mk("HasScope", ["s"], ["has"])))
    assert ws.fetch("has").tolist() == [False] and len(ws.get_blob("s").value.workspaces) == 2


def test_reuse_workspace_runs_in_the_last_pushed_one():
    mk = op_on("cpu")
    first = net("first", mk("Scale", ["a"], ["t"], scale=3.0), mk("Copy", ["a"], ["b"]))
    second = net("second", mk("Add", ["t", "a"], ["b"]))   # t: a local of the first Do's workspace
    bind = {"inner_blobs": ["a", "b"], "outer_blobs_idx": [0, 1]}
    both = [mk("CreateScope", [], ["s"]), mk("Do", ["x", "s"], ["y", "s"], net=first, **bind)]
    ws = run(net("reuse", *both, mk("Do", ["x", "s"], ["z", "s"], net=second, reuse_workspace=1, **bind)), x=X)
    np.testing.assert_allclose(ws.fetch("z"), 4 * X)
    assert ws.get_blob("s").value.top == 0
    with pytest.raises(MissingBlobError, match="input blob 't' does not exist"):
        run(net("push", *both, mk("Do", ["x", "s"], ["z", "s"], net=second, **bind)), x=X)


def test_copy_external_blobs_keeps_the_values_of_that_run():
    ws = workspace(x=X)
    d = ws.create_net(do_net(copy_external_blobs=1))
    d.run()
    child = ws.get_blob("scope").value.workspaces[0]
    assert isinstance(child, ScopeWorkspace) and child.has_local("a") and child.has_local("b")
    ws.feed("x", 2 * X)
    d.run()                                    # bound to the outer blobs again for the run, then copied again
    np.testing.assert_array_equal(ws.fetch("y"), 4 * X * X + 2 * X)
    np.testing.assert_array_equal(child.fetch("a"), 2 * X)
    ws.feed("x", X)
    np.testing.assert_array_equal(child.fetch("a"), 2 * X)   # a copy, not the outer blob


def test_a_gradient_do_needs_a_forward_workspace():
    inner = net("inner", make_op("Copy", ["a"], ["b"]))
    grad = make_op("Do", ["x", "s"], ["y", "s"], net=inner, inner_blobs=["a", "b"], outer_blobs_idx=[0, 1])
    grad.is_gradient_op = True
    with pytest.raises(NetError, match="the workspace stack 's' is empty: this gradient Do has no forward Do"):
        run(net("g", make_op("CreateScope", [], ["s"]), grad), x=X)


@pytest.mark.parametrize("inputs, outputs, args, message", [
    (["x", "s"], ["y", "t"], {}, r"the last input \('s'\) and the last output \('t'\) must be the same"),
    (["x", "s"], ["y", "s"], {"outer_blobs_idx": [0]}, "inner_blobs has 2 names but outer_blobs_idx 1"),
    (["x", "s"], ["y", "s"], {"outer_blobs_idx": [0, 2]}, r"outer_blobs_idx 2 \(inner blob 'b'\) is outside 0..1"),
    (["x", "s"], ["y", "s"], {"outer_blobs_idx": [0, 0]}, "outer blob 'x' is bound to both 'a' and 'b'"),
    (["x", "s"], ["y", "s"], {"inner_blobs": ["a", "a"]}, "inner blob 'a' is bound twice"),
    (["x", "x2", "s"], ["y", "s"], {}, r"outer blobs 'y' are bound to no inner blob"),
    (["x", "x", "s"], ["y", "s"], {}, "duplicate inputs 'x'"),
    (["x", "s"], ["y", "s"], {"reuse_workspace": 1, "copy_external_blobs": 1},
     "reuse_workspace and copy_external_blobs cannot be set together"),
])
def test_do_bindings_are_checked(inputs, outputs, args, message):
    inner = net("inner", make_op("Copy", ["a"], ["b"]))
    args = {"net": inner, "inner_blobs": ["a", "b"], "outer_blobs_idx": [0, 1], **args}
    with pytest.raises(ArgumentError, match=r"net 'd', op #1 \(Do\): " + message):
        run(net("d", make_op("CreateScope", [], ["s"]), make_op("Do", inputs, outputs, **args)), x=X, x2=X)


def test_gradient_do_cannot_reuse_workspaces():
    op = make_op("Do", ["x", "s"], ["y", "s"], net=net("i"), reuse_workspace=1, inner_blobs=["a", "b"],
                 outer_blobs_idx=[0, 1])
    op.is_gradient_op = True
    with pytest.raises(ArgumentError, match="reuse_workspace must be 0"):
        run(net("d", make_op("CreateScope", [], ["s"]), op), x=X)


def test_has_scope_needs_a_stack():
    with pytest.raises(ArgumentError, match=r"op #0 \(HasScope\): input 0 must hold a workspace stack"):
        run(net("h", make_op("HasScope", ["x"], ["has"])), x=X)


# ------------------------------------------------------------------------------------------- broken kernels
_DO = REGISTRY.get("Do").kernel


def _do_off_by_one(ctx, xp, *inputs, **args):
    _DO(ctx, xp, *inputs, **args)
    ctx.outputs[0].value = ctx.outputs[0].value + 1


def test_the_do_check_catches_a_broken_kernel(broken):
    check_do("cpu")
    broken("Do", _do_off_by_one)
    with pytest.raises(AssertionError):
        check_do("cpu")


@pytest.mark.parametrize("op_type, wrong", [
    ("CreateScope", lambda ctx, xp: None),                   # never makes or empties the stack
    ("HasScope", lambda xp, stack: xp.asarray([True]))])     # sees workspaces in an empty stack
def test_the_scope_check_catches_broken_create_scope_and_has_scope(op_type, wrong, broken):
    test_do_reuses_workspaces_and_create_scope_empties_the_stack()
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        test_do_reuses_workspaces_and_create_scope_empties_the_stack()
