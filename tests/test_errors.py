"""Errors carry where they happened as data (stepnet.core.errors): StepnetError.at is an OpAt (net, op index, op
type, op name) for failures at an op, set once where the error is first placed and kept as it travels out of
nested nets, and str() puts it first. No message text is sniffed for it."""
import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, OpAt, OpError, ShapeError, StepnetError
from stepnet.testing import make_op


def test_a_kernel_failure_is_placed_at_its_op():
    ws = Workspace()
    ws.feed("x", np.ones((2, 3), np.float32))
    ws.feed("w", np.ones((4, 5), np.float32))
    ws.feed("b", np.ones(4, np.float32))
    fc = make_op("FC", ["y", "w", "b"], ["z"])
    fc.name = "fc1"
    with pytest.raises(ShapeError) as info:
        ws.run_net_once(NetDef(name="m", op=[make_op("Relu", ["x"], ["y"]), fc]))
    e = info.value
    assert e.op == OpAt("m", 1, "FC", "fc1") and (e.op.net, e.op.index, e.op.type) == ("m", 1, "FC")
    assert str(e).startswith("net 'm', op #1 (FC 'fc1'): FC: X (2, 3) at axis=1") and "[inputs: y (2, 3)" in str(e)


def test_a_binding_error_carries_the_op_and_an_unplaced_error_takes_the_first_place():
    with pytest.raises(ArgumentError) as info:
        Workspace(strict=True).create_net(NetDef(name="n", op=[make_op("ConstantFill", [], ["c"], shape=[1], nope=1)]))
    assert info.value.op == OpAt("n", 0, "ConstantFill")
    e = StepnetError("plain")
    assert e.op is None and str(e) == "plain"
    assert e.located(OpAt("a", 2, "Sum"), " [more]") is e and str(e) == "net 'a', op #2 (Sum): plain [more]"
    e.located(OpAt("b", 0, "If"))                      # a place once set is kept
    assert e.op == OpAt("a", 2, "Sum")
    assert str(OpError("failed: boom", at=OpAt(None, 3, "Tanh"), sep=" ")) == "op #3 (Tanh) failed: boom"


def test_a_failure_inside_a_step_net_keeps_the_inner_op():
    """A While's loop net failing: the error names the op inside the nested net, not the While."""
    body = NetDef(name="body", op=[make_op("Reshape", ["x"], ["y", "old"], shape=[5])])
    ws = Workspace()
    ws.feed("x", np.ones(4, np.float32))
    ws.feed("c", np.array(True))
    with pytest.raises(StepnetError) as info:
        ws.run_net_once(NetDef(name="outer", op=[make_op("If", ["c"], [], then_net=body)]))
    op = info.value.op
    assert op is not None and op.type == "Reshape" and op.index == 0 and "body" in op.net
    assert str(info.value).count(" op #") == 1
