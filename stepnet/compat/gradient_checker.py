"""Caffe2's gradient_checker: an operator's or a net's gradients against central finite differences, and the
gradients of several nets against each other.

`GradientChecker.CheckSimple` puts the loss L = sum of y²/2 over the checked outputs on top of an operator (so
dL/dy = y is what is fed as each output's gradient), runs the operator's gradient ops for the analytic gradient
of one input and estimates it element by element as (L(x + h) - L(x - h)) / 2h. The loss is summed in float64;
the inputs given are left unchanged (the steps are taken on copies). A sparse gradient (a GradientSlice) is
summed into a dense array of the input's shape before comparing. Gradients agree when
np.isclose(analytic, estimate, atol=threshold, rtol=threshold) holds everywhere; the elements that do not are
printed as Caffe2 printed them.

`NetGradientChecker.Check` does the same for a net whose loss is the sum of the given outputs, and `CompareNets`
checks that nets compute the same outputs and input gradients (np.testing.assert_allclose: it raises).
"""
from __future__ import annotations

import copy

import numpy as np

from ..io.proto import DeviceOption
from . import core, workspace


def _dense(indices, values, shape) -> np.ndarray:
    """A sparse gradient (rows `indices` get `values`, repeated rows summed) as a dense array of `shape`."""
    values = np.asarray(values)
    dense = np.zeros(shape, dtype=values.dtype if values.dtype.kind == "f" else np.float32)
    np.add.at(dense, np.asarray(indices).astype(np.intp).reshape(-1), values.reshape((-1,) + tuple(shape[1:])))
    return dense


def _get_grad_blob(grad_map, input_to_check) -> np.ndarray:
    """The gradient of input_to_check in the current workspace, dense (a GradientSlice made dense)."""
    grad = grad_map[input_to_check]
    if isinstance(grad, core.GradientSlice):
        shape = np.shape(workspace.blobs[str(input_to_check)])
        return _dense(workspace.blobs[str(grad.indices)], workspace.blobs[str(grad.values)], shape)
    return workspace.blobs[str(grad)]


def _get_grad(net, outputs, outputs_with_grad, input_values, inputs_with_grads) -> tuple:
    """Run a copy of `net` with the backward pass of outputs_with_grad (seeded with ones) after feeding
    input_values; returns ([(output, value)] for `outputs`, {input: its gradient} for inputs_with_grads, the
    copy run)."""
    grad_net = net.Clone(net.Name() + "_copy")
    grad_map = grad_net.AddGradientOperators(outputs_with_grad)
    for name, value in (input_values or {}).items():
        workspace.blobs[name] = value
    for name in inputs_with_grads:
        assert name in grad_map, f"{name} has no gradient, cannot check net gradient."
        assert str(name) in workspace.blobs
    workspace.RunNetOnce(grad_net)
    forward = [(output, workspace.blobs[output]) for output in outputs]
    grads = {name: _get_grad_blob(grad_map, name) for name in inputs_with_grads}
    return forward, grads, grad_net


def _assert_close(value1, value2, threshold, err_msg="") -> tuple:
    """assert_allclose with `threshold` as both tolerances; returns (mean, max) of the absolute differences."""
    np.testing.assert_allclose(value1, value2, atol=threshold, rtol=threshold, err_msg=err_msg)
    delta = np.abs(np.asarray(value1) - np.asarray(value2)).flatten()
    return np.mean(delta), max(delta)


def _write_png(net, path: str) -> None:
    from . import net_drawer
    with open(path, "wb") as f:
        f.write(net_drawer.GetPydotGraph(net).create_png())


class NetGradientChecker:
    """Gradient checks of whole nets (core.Net)."""

    @staticmethod
    def CompareNets(nets, outputs, outputs_with_grad_ids, inputs_with_grads, input_values=None,
                    threshold=0.0000001, print_net_images=False) -> None:
        """Check that `nets` agree: outputs[i] are net i's outputs, compared position by position; the loss is
        the sum of the outputs at outputs_with_grad_ids; the gradients of inputs_with_grads are compared.
        print_net_images writes each forward and backward net as a PNG (Graphviz's dot) into the current
        folder. Raises AssertionError on a difference."""
        if print_net_images:
            for i, net in enumerate(nets):
                _write_png(net, f"caffe2_net_forward_{i}{net.Name()}.png")
        results = [_get_grad(net, net_outputs, [net_outputs[k] for k in outputs_with_grad_ids], input_values,
                             inputs_with_grads)
                   for net, net_outputs in zip(nets, outputs)]
        if print_net_images:
            for i, (_, _, backward) in enumerate(results):
                _write_png(backward, f"caffe2_net_{i}{backward.Name()}.png")
        first_results, first_grads, _ = results[0]
        for net_results, net_grads, _ in results[1:]:
            assert len(net_results) == len(first_results)
            for idx, ((blob1, value1), (blob2, value2)) in enumerate(zip(first_results, net_results)):
                _assert_close(value1, value2, threshold,
                              err_msg=f"Different forward pass results for output id {idx}. "
                                      f"Corresponding output blobs: {blob1} and {blob2}")
            assert net_grads.keys() == first_grads.keys()
            for blob, grad in net_grads.items():
                _assert_close(first_grads[blob], grad, threshold, err_msg=f"Different gradients for input {blob}")

    @staticmethod
    def Check(net, outputs_with_grad, input_values, input_to_check, step_size=0.0001, threshold=0.05,
              print_net=True) -> tuple:
        """Check the gradient of input_to_check of the loss sum(outputs_with_grad) against central differences
        with step step_size (input_values: {blob: array} fed first). Raises AssertionError (with the net's
        text when print_net) on a mismatch; returns (mean, max) of the absolute differences."""
        _, grads, _ = _get_grad(net, [], outputs_with_grad, input_values, [input_to_check])
        analytic = grads[input_to_check]
        start = np.asarray(input_values[input_to_check])

        def loss(value) -> float:
            workspace.blobs[input_to_check] = value
            workspace.RunNetOnce(net)
            return float(sum(np.sum(workspace.blobs[output], dtype=np.float64) for output in outputs_with_grad))

        estimate = np.zeros_like(start)
        for k in range(start.size):
            up, down = start.copy(), start.copy()
            up.flat[k] += step_size
            down.flat[k] -= step_size
            estimate.flat[k] = (loss(up) - loss(down)) / step_size / 2
        workspace.blobs[input_to_check] = start
        message = f"Error in gradient check for net_copy {net.Name()}"
        if print_net:
            message += f": {net.Proto()}"
        return _assert_close(analytic, estimate, threshold, message)


class GradientChecker:
    """Checks an operator's gradient against central finite differences (see the module's docstring).

    stepsize: the step h; threshold: the absolute and relative tolerance; device_option: where the operator and
    its inputs run; workspace_name: the workspace the check runs in (made if missing; when it is not the
    current one it is emptied afterwards and the current one is current again).
    """

    def __init__(self, stepsize, threshold, device_option=None, workspace_name="gradient_check"):
        self._stepsize = stepsize
        self._threshold = threshold
        self._device_option = DeviceOption() if device_option is None else device_option
        self._workspace_name = workspace_name

    def GetLossAndGrad(self, op, grad_ops, x, input_name, grad_name, outputs_with_grads,
                       input_device_option=None) -> tuple:
        """Feed x as input_name, run op, then its gradient ops with each output y of outputs_with_grads given the
        gradient y; returns (the loss sum(y²)/2, the gradient grad_name of x, dense)."""
        self._forward(op, {input_name: x}, {input_name: input_device_option})
        loss = self._loss(op, outputs_with_grads, feed_gradients=True)
        workspace.RunOperatorsOnce(grad_ops)
        if isinstance(grad_name, core.GradientSlice):
            return loss, _dense(workspace.FetchBlob(str(grad_name.indices)),
                                workspace.FetchBlob(str(grad_name.values)), np.shape(x))
        return loss, workspace.FetchBlob(str(grad_name))

    def _forward(self, op, values: dict, device_options: dict) -> None:
        for name, value in values.items():
            option = device_options.get(name)
            workspace.FeedBlob(name, value, self._device_option if option is None else option)
        workspace.RunOperatorOnce(op)

    def _loss(self, op, outputs_with_grads, feed_gradients: bool = False) -> float:
        loss = 0.0
        for idx in outputs_with_grads:
            y = workspace.FetchBlob(op.output[idx])
            loss += float(np.sum(np.square(y, dtype=np.float64)))
            if feed_gradients:
                workspace.FeedBlob(op.output[idx] + "_grad", y, self._device_option)
        return loss / 2

    def CheckSimple(self, op, inputs, input_to_check, outputs_with_grads, grad_ops=None,
                    input_device_options=None) -> tuple:
        """Check the gradient of input number input_to_check of `op` (given its numpy `inputs`), with the loss
        over the outputs numbered outputs_with_grads. grad_ops: the gradient operators (default: the op's, from
        the gradient registry); input_device_options: {input name: DeviceOption} for inputs that live elsewhere
        than the op. Returns (passed, analytic gradient, estimated gradient)."""
        input_device_options = input_device_options or {}
        op = copy.deepcopy(op)
        op.device_option.CopyFrom(self._device_option)
        previous = workspace.CurrentWorkspace()
        if self._workspace_name != previous:
            workspace.SwitchWorkspace(self._workspace_name, True)
        try:
            return self._check(op, inputs, input_to_check, outputs_with_grads, grad_ops, input_device_options)
        finally:
            if self._workspace_name != previous:
                workspace.ResetWorkspace()
                workspace.SwitchWorkspace(previous, True)

    def _check(self, op, inputs, input_to_check, outputs_with_grads, grad_ops, input_device_options) -> tuple:
        g_output = [name + "_grad" for name in op.output]
        if grad_ops is None:
            grad_ops, g_input = core.GradientRegistry.GetGradientForOp(op, g_output)
        else:
            try:
                _, g_input = core.GradientRegistry.GetGradientForOp(op, g_output)
            except Exception:  # noqa: BLE001 - the caller's own gradient ops, for an op the registry has none for
                g_input = [name + "_grad" for name in op.input]
        values = {name: np.array(value) for name, value in zip(op.input, inputs)}
        input_name = op.input[input_to_check]
        x = values[input_name]
        for name, value in values.items():
            workspace.FeedBlob(name, value, input_device_options.get(name, self._device_option))
        _, grad = self.GetLossAndGrad(op, grad_ops, x, input_name, g_input[input_to_check], outputs_with_grads,
                                      input_device_options.get(input_name))
        estimate = np.zeros_like(x)
        if estimate.shape != np.shape(grad):
            raise Exception(f"Mismatched gradient shapes: estimated ({estimate.shape}), grad ({np.shape(grad)})")
        for k in range(x.size):
            losses = []
            for step in (self._stepsize, -self._stepsize):
                moved = dict(values)   # every input again: an in-place op may have overwritten one
                moved[input_name] = x.copy()
                moved[input_name].flat[k] += step
                self._forward(op, moved, input_device_options)
                losses.append(self._loss(op, outputs_with_grads))
            estimate.flat[k] = (losses[0] - losses[1]) / self._stepsize / 2
        failed = ~np.isclose(grad, estimate, atol=self._threshold, rtol=self._threshold)
        if np.any(failed):
            idx = np.flatnonzero(failed)
            print("Failed. [idx, grad, grad_estimate] are:")
            print(np.vstack([idx, np.asarray(grad).flat[idx], estimate.flat[idx]]).T)
            return False, grad, estimate
        return True, grad, estimate
