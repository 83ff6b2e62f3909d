"""compat.gradients: the backward pass as Caffe2's API builds it (GetBackwardPass, AddGradientOperators) where it
differs from stepnet's own: accumulation ops not marked as gradient ops, Add and Sub passing the output gradient
through, the version check of a gradient of a later version, the map after an in-place op without a gradient, an
orphan StopGradient, an op that fails its schema; and that stepnet's own pass keeps its ways."""
import numpy as np
import pytest

from stepnet.compat import core, workspace
from stepnet.core.errors import GradientError
from stepnet.passes.gradients import backward_ops
from stepnet.testing import make_op


def test_accumulation_sums_are_plain_ops_in_caffe2s_api_only():
    fwd = [make_op("Relu", ["x"], ["a"]), make_op("Sigmoid", ["x"], ["b"]), make_op("Mul", ["a", "b"], ["y"])]
    ops, _ = core.GradientRegistry.GetBackwardPass(fwd, {"y": "y_grad"})
    total = ops[-1]
    assert (total.type, list(total.input)) == ("Sum", ["x_grad", "_x_grad_autosplit_0"])
    assert not total.HasField("is_gradient_op") and all(o.is_gradient_op for o in ops[:-1])
    own, _ = backward_ops(fwd, {"y": "y_grad"})
    assert own[-1].type == "Sum" and own[-1].is_gradient_op   # data-parallel training finds the last one by it


def test_add_and_sub_pass_the_gradient_through():
    net = core.Net("pass")
    net.Sub(["x1", "x2"], "x4")
    net.Add(["x2", "x3"], "x5")
    net.Mul(["x4", "x5"], "x6")
    grads = net.AddGradientOperators({"x6": "x6_grad"})
    ops = net.Proto().op[3:]
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
        ("MulGradient", ["x6_grad", "x4", "x5"], ["x4_grad", "x5_grad"]),
        ("Negative", ["x4_grad"], ["x2_grad"]),
        ("Sum", ["x2_grad", "x5_grad"], ["x2_grad"])]
    assert {str(k): str(v) for k, v in grads.items()} == {
        "x6": "x6_grad", "x4": "x4_grad", "x5": "x5_grad", "x1": "x4_grad", "x2": "x2_grad", "x3": "x5_grad"}
    for name, value in {"x1": 1.0, "x2": 2.0, "x3": 3.0, "x6_grad": 1.0}.items():
        workspace.FeedBlob(name, np.full(3, value, np.float32))
    workspace.RunNetOnce(net)
    # x6 = (x1 - x2)(x2 + x3): d/dx2 = -(x2 + x3) + (x1 - x2) = -6
    np.testing.assert_allclose(workspace.FetchBlob("x2_grad"), np.full(3, -6.0))
    broadcast, _ = core.GradientRegistry.GetGradientForOp(
        core.CreateOperator("Add", ["a", "b"], ["c"], broadcast=1), ["c_grad"])
    assert [o.type for o in broadcast] == ["AddGradient"]     # the reduction over broadcast dims: stepnet's maker


def test_a_gradient_of_a_later_version_is_refused():
    fwd = [make_op("Relu", ["x"], ["x"]), make_op("Sigmoid", ["y"], ["x"]), make_op("Tanh", ["x"], ["y"])]
    with pytest.raises(RuntimeError, match="'x_grad' is the gradient of a later version of 'x', not of version 1"):
        core.GradientRegistry.GetBackwardPass(fwd, {"y": "y_grad"})
    ops, grads = backward_ops(fwd, {"y": "y_grad"})    # stepnet's own: x's version 1 is read by nothing
    assert [o.type for o in ops] == ["TanhGradient", "SigmoidGradient"] and grads["y"] == "y_grad"


def test_an_in_place_op_without_gradient_leaves_its_blob_without_one():
    fwd = [make_op("Relu", ["x"], ["h"]), make_op("StopGradient", ["h"], ["h"]), make_op("Tanh", ["h"], ["y"])]
    _, grads = core.GradientRegistry.GetBackwardPass(fwd, {"y": "y_grad"})
    assert grads == {"y": "y_grad"}
    _, own = backward_ops(fwd, {"y": "y_grad"})
    assert own == {"y": "y_grad", "h": "h_grad"}


def test_an_orphan_stop_gradient_and_an_op_failing_its_schema():
    fwd = [make_op("Relu", ["x"], ["h"]), make_op("StopGradient", ["h"], ["cut"]), make_op("Tanh", ["h"], ["y"])]
    with pytest.raises(ValueError, match="StopGradient's output 'cut' is read by no op"):
        core.GradientRegistry.GetBackwardPass(fwd, ["y"])
    net = core.Net("schema")
    product = net.Mul("a", "b")     # one input: Caffe2 checks the schema when the net is created, or here
    net.Sub([product, "one"], "loss")
    with pytest.raises(GradientError, match=r"op #0 \(Mul\) does not pass its schema check \(Mul takes 2 inputs"):
        net.AddGradientOperators(["loss"])
