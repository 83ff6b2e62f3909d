"""Python and PythonGradient (ops/python_op.py): functions registered in this process, called with tensor objects;
tokens a model names but this process never registered are refused; a pickled builder is never unpickled."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, StepnetError
from stepnet.ops.python_op import register_function, register_gradient_function
from stepnet.runtime.workspace import Workspace
from stepnet.testing import check_gradient, make_op, run_op


def _cube(inputs, outputs):
    x = inputs[0].data
    outputs[0].reshape(inputs[0].shape)
    outputs[0].data[...] = x ** 3


def _cube_grad(inputs, outputs):
    # inputs: x, y, dy -> outputs: dx; written from d(x^3)/dx = 3 x^2
    x, dy = inputs[0].data, inputs[2].data
    outputs[0].reshape(inputs[0].shape)
    outputs[0].data[...] = 3.0 * x * x * dy


CUBE = register_function(_cube)
register_gradient_function(CUBE, _cube_grad)


def test_forward_calls_the_registered_function():
    x = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    y = run_op("Python", [x], token=CUBE)
    np.testing.assert_array_equal(y, np.array([[1.0, -8.0], [0.125, 27.0]], np.float32))   # by hand


def test_tokens_are_unique_per_name():
    def f(inputs, outputs):
        pass
    first, second = register_function(f), register_function(f)
    assert first == "f" or first.startswith("f:")
    assert second != first and second.startswith("f:")
    assert register_function(f, name="scope").startswith("scope:f")


def test_gradient_against_finite_differences():
    x = np.array([0.3, -1.2, 2.0, 0.7])
    analytic = check_gradient("Python", [x], token=CUBE)
    np.testing.assert_allclose(analytic["in0"].shape, x.shape)


def test_the_checker_catches_a_wrong_gradient_function():
    def wrong(inputs, outputs):
        outputs[0].reshape(inputs[0].shape)
        outputs[0].data[...] = 2.0 * inputs[0].data * inputs[2].data   # d(x^3) is not 2x
    token = register_function(_cube)
    register_gradient_function(token, wrong)
    with pytest.raises(AssertionError):
        check_gradient("Python", [np.array([0.3, -1.2, 2.0])], token=token)


def test_an_unregistered_token_is_refused():
    with pytest.raises(ArgumentError, match="no Python function under token 'made_up'.*never code from a model"):
        run_op("Python", [np.ones(2, np.float32)], token="made_up")


def test_a_pickled_builder_is_never_unpickled():
    with pytest.raises(ArgumentError, match="pickled_builder.*refuses"):
        run_op("Python", [np.ones(2, np.float32)], pickled_builder="cos\nsystem\n(S'true'\ntR.")


def test_writing_an_input_does_not_change_its_blob():
    def scribble(inputs, outputs):
        inputs[0].data[...] = 99.0
        outputs[0].feed(inputs[0].data + 1)
    token = register_function(scribble)
    x = np.zeros(3, np.float32)
    y = run_op("Python", [x], token=token)   # run_op checks the input blob is unchanged
    np.testing.assert_array_equal(y, np.full(3, 100.0, np.float32))


def test_in_place_blob_is_one_tensor_and_untouched_outputs_keep_their_value():
    def double_first(inputs, outputs):
        outputs[0].data[...] *= 2     # output 0 is input 0: the same tensor
    token = register_function(double_first)
    ws = Workspace()
    ws.feed("x", np.array([1.0, 2.0], np.float32))
    ws.feed("keep", np.array([7], np.int32))
    ws.run_operator_once(make_op("Python", ["x"], ["x", "keep"], token=token))
    np.testing.assert_array_equal(ws.fetch("x"), [2.0, 4.0])
    np.testing.assert_array_equal(ws.fetch("keep"), [7])


def test_reshape_keeps_values_of_the_same_size_and_zero_fills_otherwise():
    seen = {}

    def f(inputs, outputs):
        outputs[0].reshape([2, 3])
        seen["same"] = outputs[0].data.copy()
        outputs[1].reshape([4])
        seen["grown"] = outputs[1].data.copy()
    token = register_function(f)
    ws = Workspace()
    ws.feed("a", np.arange(6, dtype=np.int32))
    ws.feed("b", np.arange(3, dtype=np.float64))
    ws.run_operator_once(make_op("Python", [], ["a", "b"], token=token))
    np.testing.assert_array_equal(seen["same"], np.arange(6).reshape(2, 3))
    assert seen["grown"].dtype == np.float64 and not seen["grown"].any()


def test_pass_workspace_and_builders():
    calls = []

    def builder(scale):
        calls.append("built")

        def f(inputs, outputs, ws):
            outputs[0].feed(np.array([scale * len(ws.blobs())], np.int64))
        return f
    token = register_function(lambda: builder(10), pass_workspace=True, builder=True)
    ws = Workspace()
    ws.feed("x", np.zeros(1, np.float32))
    net = ws.create_net(_net([make_op("Python", ["x"], ["n"], token=token, pass_workspace=True)]))
    net.run()
    net.run()
    assert calls == ["built"]                      # once per op instance
    assert ws.fetch("n")[0] == 10 * len(ws.blobs())


def test_a_function_error_is_one_line_naming_the_op():
    def bad(inputs, outputs):
        raise ValueError("no good")
    token = register_function(bad)
    with pytest.raises(StepnetError, match=r"Python.*ValueError: no good"):
        run_op("Python", [np.ones(1, np.float32)], token=token)


def test_a_non_tensor_input_is_refused():
    ws = Workspace()
    ws.run_operator_once(make_op("CreateMutex", [], ["m"]))
    with pytest.raises(DTypeError, match="input 0 \\('m'\\) holds a .*not a tensor"):
        ws.run_operator_once(make_op("Python", ["m"], [], token=CUBE))


def test_gradient_maker_narrows_to_the_given_indices():
    from stepnet.passes.gradients import backward_ops

    op = make_op("Python", ["a", "b"], ["y", "z"], token=CUBE, grad_output_indices=[1], grad_input_indices=[0])
    ops, grads = backward_ops([op], {"y": "y_g", "z": "z_g"})
    assert [o.type for o in ops] == ["PythonGradient"]
    assert list(ops[0].input) == ["a", "b", "y", "z", "z_g"] and list(ops[0].output) == ["a_grad"]
    assert grads["a"] == "a_grad" and grads.get("b") is None


def _net(ops):
    from stepnet.io.proto import NetDef

    net = NetDef(name="python_ops")
    net.op.extend(ops)
    return net
