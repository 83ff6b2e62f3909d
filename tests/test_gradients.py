"""The backward-pass rewrite (spec §6.2): names, accumulation, pass-through, sparse, versions, errors."""
import pytest

from stepnet.passes.gradients import GradientError, GradientSlice, add_gradient_ops, backward_ops
from stepnet.ops.registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT
from stepnet.io.proto import NetDef, OperatorDef


def dense_maker(g):
    """Like most Caffe2 makers: one gradient op reading inputs, outputs and output gradients."""
    outs = [g.GI(i) for i in range(g.n_inputs)]
    g.op(g.def_.type + "Gradient", [*g.def_.input, *g.def_.output, g.GO(0)], outs)


def in_maker(g):
    g.op("TInGradient", [g.I(0), g.GO(0)], [g.GI(0)])


def out_maker(g):
    g.op("TOutGradient", [g.O(0), g.GO(0)], [g.GI(0)])


def passthrough_maker(g):
    for i in range(g.n_inputs):
        g.set_dense(i, g.GO(0))


def sparse_maker(g):
    g.set_sparse(0, g.I(1), g.GO(0))


OPS = {"TDense": (dense_maker, (1, 3)), "TIn": (in_maker, 1), "TOut": (out_maker, 1),
       "TPass": (passthrough_maker, (1, 4)), "TSparse": (sparse_maker, 2),
       "TNoGrad": (NO_GRADIENT, 1), "TNever": (SHOULD_NOT_DO_GRADIENT, 1), "TMissing": (None, 1)}


@pytest.fixture(autouse=True)
def fake_ops(temporary_op):
    for name, (maker, arity) in OPS.items():
        temporary_op(name, lambda xp, *a: a[0], inputs=arity, outputs=(0, 1), gradient=maker)


def op(type_, inputs, outputs):
    return OperatorDef(type=type_, input=list(inputs), output=list(outputs))


def sig(ops):
    return [(o.type, list(o.input), list(o.output)) for o in ops]


def test_chain_and_autogen_seed():
    ops, grads = backward_ops([op("TDense", ["x"], ["h"]), op("TDense", ["h"], ["loss"])], ["loss"])
    assert sig(ops) == [
        ("ConstantFill", ["loss"], ["loss_autogen_grad"]),
        ("TDenseGradient", ["h", "loss", "loss_autogen_grad"], ["h_grad"]),
        ("TDenseGradient", ["x", "h", "h_grad"], ["x_grad"]),
    ]
    assert ops[0].arg[0].name == "value" and ops[0].arg[0].f == 1.0
    assert all(o.is_gradient_op for o in ops[1:])
    assert grads == {"loss": "loss_autogen_grad", "h": "h_grad", "x": "x_grad"}


def test_fan_out_is_summed_at_first_consumer_with_autosplit_names():
    fwd = [op("TDense", ["x"], ["a"]), op("TDense", ["x"], ["b"]), op("TPass", ["a", "b"], ["y"])]
    ops, grads = backward_ops(fwd, {"y": "y_grad"})
    assert sig(ops) == [
        ("TDenseGradient", ["x", "b", "y_grad"], ["x_grad"]),
        ("TDenseGradient", ["x", "a", "y_grad"], ["_x_grad_autosplit_0"]),
        ("Sum", ["x_grad", "_x_grad_autosplit_0"], ["x_grad"]),
    ]
    assert grads["x"] == "x_grad" and grads["a"] == grads["b"] == "y_grad"


def test_three_consumers_and_pass_through_generator():
    fwd = [op("TDense", ["x"], ["a"]), op("TPass", ["x", "a"], ["b"]), op("TDense", ["x", "b"], ["y"])]
    ops, grads = backward_ops(fwd, {"y": "y_grad"})
    assert sig(ops) == [
        ("TDenseGradient", ["x", "b", "y", "y_grad"], ["x_grad", "b_grad"]),
        ("TDenseGradient", ["x", "a", "b_grad"], ["_x_grad_autosplit_0"]),
        ("Sum", ["x_grad", "b_grad", "_x_grad_autosplit_0"], ["x_grad"]),
    ]
    assert grads["x"] == "x_grad"


def test_in_place_op_whose_gradient_reads_its_output():
    """Like Relu in place: the gradient reads the output, which is the final version, so it is valid."""
    fwd = [op("TIn", ["x"], ["h"]), op("TOut", ["h"], ["h"]), op("TIn", ["h"], ["y"])]
    ops, grads = backward_ops(fwd, {"y": "y_grad"})
    assert sig(ops) == [
        ("TInGradient", ["h", "y_grad"], ["h_grad"]),
        ("TOutGradient", ["h", "h_grad"], ["h_grad"]),
        ("TInGradient", ["x", "h_grad"], ["x_grad"]),
    ]
    assert grads["x"] == "x_grad"


def test_one_op_consuming_a_blob_twice():
    """Mul(x, x): both gradients come from one op; the second output is renamed and summed."""
    ops, grads = backward_ops([op("TDense", ["x", "x"], ["y"])], {"y": "y_grad"})
    assert sig(ops) == [
        ("TDenseGradient", ["x", "x", "y", "y_grad"], ["x_grad", "_x_grad_autosplit_0"]),
        ("Sum", ["x_grad", "_x_grad_autosplit_0"], ["x_grad"]),
    ]


def test_all_pass_through_consumers():
    fwd = [op("TPass", ["x"], ["a"]), op("TPass", ["x"], ["b"]), op("TDense", ["a", "b"], ["y"])]
    ops, grads = backward_ops(fwd, {"y": "y_grad"})
    assert sig(ops)[-1] == ("Sum", ["b_grad", "a_grad"], ["x_grad"])
    assert grads["x"] == "x_grad"


def test_overwritten_version_is_an_error_naming_both_ops():
    fwd = [op("TDense", ["x"], ["h"]), op("TDense", ["h"], ["y"]), op("TNoGrad", ["x"], ["h"])]
    with pytest.raises(GradientError, match=r"gradient of op #1 \(TDense\).*needs 'h' at version 1.*"
                                             r"overwritten in place by op #2 \(TNoGrad\)"):
        backward_ops(fwd, {"y": "y_grad"})


def test_sparse_gradients_are_concatenated():
    fwd = [op("TSparse", ["w", "i1"], ["e1"]), op("TSparse", ["w", "i2"], ["e2"]), op("TPass", ["e1", "e2"], ["y"])]
    ops, grads = backward_ops(fwd, {"y": "y_grad"})
    assert grads["w"] == GradientSlice("w_grad_indices_concat", "w_grad_values_concat")
    assert sig(ops) == [
        ("Concat", ["i2", "i1"], ["w_grad_indices_concat", "w_grad_indices_concat_split"]),
        ("Concat", ["y_grad", "y_grad"], ["w_grad_values_concat", "w_grad_values_concat_split"]),
    ]


def test_dense_plus_sparse_is_an_error():
    fwd = [op("TSparse", ["w", "i"], ["e"]), op("TDense", ["w"], ["d"]), op("TPass", ["e", "d"], ["y"])]
    with pytest.raises(GradientError, match="both dense and sparse"):
        backward_ops(fwd, {"y": "y_grad"})


def test_no_gradient_stops_and_errors_name_the_op():
    ops, grads = backward_ops([op("TNoGrad", ["x"], ["h"]), op("TDense", ["h"], ["y"])], {"y": "y_grad"})
    assert "x" not in grads and grads["h"] == "h_grad"
    with pytest.raises(GradientError, match=r"op #0 \(TNever\) is registered as not differentiable.*'h'"):
        backward_ops([op("TNever", ["x"], ["h"]), op("TDense", ["h"], ["y"])], {"y": "y_grad"})
    with pytest.raises(GradientError, match=r"op #0 \(TMissing\) has no gradient registered"):
        backward_ops([op("TMissing", ["x"], ["h"]), op("TDense", ["h"], ["y"])], {"y": "y_grad"})


def test_add_gradient_ops_appends_to_net():
    net = NetDef(name="n")
    net.op.extend([op("TDense", ["x"], ["loss"])])
    grads = add_gradient_ops(net, ["loss"])
    assert [o.type for o in net.op] == ["TDense", "ConstantFill", "TDenseGradient"] and grads["x"] == "x_grad"


def test_maker_copies_device_engine_and_args():
    fwd = op("TDense", ["x"], ["y"])
    fwd.device_option.device_type = 1
    fwd.engine = "CUDNN"
    from stepnet.io.proto import make_argument
    fwd.arg.append(make_argument("axis", 2))
    ops, _ = backward_ops([fwd], {"y": "y_grad"})
    assert ops[0].device_option.device_type == 1 and ops[0].engine == "CUDNN"
    assert [(a.name, a.i) for a in ops[0].arg] == [("axis", 2)]
