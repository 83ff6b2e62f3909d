"""Caffe2's hypothesis_test_util: property-based operator tests (Hypothesis draws the inputs).

`HypothesisTestCase` (a test_util.TestCase) checks an operator against
  - a reference function: assertReferenceChecks(device, op, inputs, reference) runs the op and compares each
    output with `reference(*inputs)` (np.testing.assert_allclose), its statically inferred shapes too, and
    with `grad_reference` the gradient of one output as well;
  - finite differences: assertGradientChecks(device, op, inputs, input_index, output_indices)
    (gradient_checker.GradientChecker);
  - itself on other devices: assertDeviceChecks(devices, op, inputs, output_indices)
    (device_checker.DeviceChecker);
  - a validator (assertValidationChecks) or an expected exception (assertRunOpRaises).

The strategies (dims, arrays, tensor, tensors, segment_ids, lengths, ...) are in _hypothesis_strategies.
`gcs` draws the device of a gradient check (`gc`) and the devices of a device check (`dc`): the CPU, and the
first CUDA device where stepnet's workspaces have a GPU (CuPy), as `workspace.has_gpu_support` says; on a
machine without one, the CPU only, as a CPU-only Caffe2. `gcs_cpu_only` is the CPU; `gcs_gpu_only` the CUDA
device (Caffe2's tests using it skip themselves without a GPU; an op given it runs on the CPU there, as any CUDA
device option does in stepnet's workspaces without a GPU).

Importing the module registers Caffe2's Hypothesis profiles ("sandcastle", "dev", "debug"; no deadline) and
loads one for the process, as Caffe2's did: "sandcastle" on Facebook's CI, else CAFFE2_HYPOTHESIS_PROFILE
(default "dev"). Hypothesis is a test dependency: this module is for test programs only.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os

import hypothesis
import hypothesis.strategies as st
import numpy as np

from ..io.proto import DeviceOption, NetDef, TensorProto
from . import core, device_checker, gradient_checker, test_util, workspace
from ._hypothesis_strategies import (  # noqa: F401 - Caffe2's strategies, by their names here
    arrays, dims, elements_of_type, lengths, lengths_tensor, segment_ids, segmented_tensor, sparse_lengths_tensor,
    sparse_segmented_tensor, tensor, tensor1d, tensors, tensors1d)

CUDA = 1   # caffe2_pb2.CUDA


def is_sandcastle() -> bool:
    """Whether this runs on Facebook's CI (Sandcastle)."""
    return os.getenv("SANDCASTLE") == "1" or os.getenv("TW_JOB_USER") == "sandcastle"


def is_travis() -> bool:
    return "TRAVIS" in os.environ


def _register_profiles() -> None:
    common = dict(suppress_health_check=[hypothesis.HealthCheck.too_slow], database=None, deadline=None,
                  verbosity=hypothesis.Verbosity.verbose)
    hypothesis.settings.register_profile("sandcastle", derandomize=True, max_examples=100, **common)
    hypothesis.settings.register_profile("dev", max_examples=10, **common)
    hypothesis.settings.register_profile("debug", max_examples=1000, **common)
    hypothesis.settings.load_profile("sandcastle" if is_sandcastle()
                                     else os.getenv("CAFFE2_HYPOTHESIS_PROFILE", "dev"))


_register_profiles()

# ----------------------------------------------------------------------------------------------- devices
cpu_do = DeviceOption()
gpu_do = DeviceOption(device_type=CUDA)
cuda_do = gpu_do   # (later Caffe2's name)
device_options = [cpu_do] + ([gpu_do] if workspace.has_gpu_support else [])
expanded_device_options = [cpu_do] + ([DeviceOption(device_type=CUDA, device_id=i)
                                       for i in range(workspace.NumCudaDevices())]
                                      if workspace.has_gpu_support else [])


def device_checker_device_options():
    """The devices of a device check: all of device_options at once."""
    return st.just(device_options)


def gradient_checker_device_option():
    """The device of a gradient check: one of device_options."""
    return st.sampled_from(device_options)


gcs = dict(gc=gradient_checker_device_option(), dc=device_checker_device_options())
gcs_cpu_only = dict(gc=st.sampled_from([cpu_do]), dc=st.just([cpu_do]))
gcs_gpu_only = dict(gc=st.sampled_from([gpu_do]), dc=st.just([gpu_do]))
gcs_cuda_only = gcs_gpu_only   # (later Caffe2's name)


@contextlib.contextmanager
def temp_workspace(name=b"temp_ws"):
    """A block run in workspace `name` (made if missing), emptied at the end; the current one is current again
    afterwards."""
    previous = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace(name.decode() if isinstance(name, bytes) else name, True)
    try:
        yield
    finally:
        workspace.ResetWorkspace()
        workspace.SwitchWorkspace(previous, True)


def _feed(op, inputs, device_option, input_device_options) -> None:
    for name, value in zip(op.input, inputs):
        workspace.FeedBlob(name, value, device_option=input_device_options.get(name, device_option))


def _on_device(op, device_option):
    op = copy.deepcopy(op)
    op.device_option.CopyFrom(device_option)
    return op


def runOpBenchmark(device_option, op, inputs, input_device_options=None, iterations=10):
    """Time `op` on `inputs` in a temporary workspace (workspace.BenchmarkNet: one warm-up run, then
    `iterations` timed runs); returns BenchmarkNet's result."""
    op = _on_device(op, device_option)
    net = NetDef(name=op.name or "test")
    net.op.extend([op])
    with temp_workspace():
        _feed(op, inputs, device_option, input_device_options or {})
        workspace.CreateNet(net)
        return workspace.BenchmarkNet(net.name, 1, iterations, True)


_TENSOR_TYPES = {np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.float32): TensorProto.FLOAT,
                 np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64}


def _shape_inference_failed(error: Exception) -> None:
    """Shape and type inference that fails or disagrees is a warning, an error with
    CAFFE2_ASSERT_SHAPEINFERENCE=1 (as in Caffe2)."""
    logging.warning(str(error))
    if os.getenv("CAFFE2_ASSERT_SHAPEINFERENCE") == "1":
        raise error


class HypothesisTestCase(test_util.TestCase):
    """A test_util.TestCase with the operator checks of the module's docstring, for tests whose inputs and devices
    Hypothesis draws (`@given(X=hu.tensor(), **hu.gcs)`)."""

    def assertDeviceChecks(self, device_options, op, inputs, outputs_to_check, input_device_options=None,
                           threshold=0.01):
        """Assert that `op` computes the outputs numbered outputs_to_check alike (within threshold) on every
        one of device_options."""
        checker = device_checker.DeviceChecker(threshold, device_options=device_options)
        self.assertTrue(checker.CheckSimple(op, inputs, outputs_to_check, input_device_options))

    def assertGradientChecks(self, device_option, op, inputs, outputs_to_check, outputs_with_grads, grad_ops=None,
                             threshold=0.005, stepsize=0.05, input_device_options=None):
        """Assert that the gradient of input number outputs_to_check (despite its name: an input index) of the
        loss over the outputs numbered outputs_with_grads matches central finite differences."""
        checker = gradient_checker.GradientChecker(stepsize=stepsize, threshold=threshold,
                                                   device_option=device_option, workspace_name=str(device_option))
        passed, grad, estimate = checker.CheckSimple(op, inputs, outputs_to_check, outputs_with_grads,
                                                     grad_ops=grad_ops, input_device_options=input_device_options)
        self.assertEqual(np.shape(grad), np.shape(estimate))
        self.assertTrue(passed, "Gradient check failed for input " + str(op.input[outputs_to_check]))

    def _assertGradReferenceChecks(self, op, inputs, ref_outputs, output_to_grad, grad_reference, threshold=1e-4):
        """Run op's backward pass from output_to_grad (its gradient: the output's own value) and compare each
        input's gradient with grad_reference(output gradient, reference outputs, inputs): one entry per input,
        an array, (values, indices) for a sparse gradient, or None where the input has no gradient."""
        grad_blob = output_to_grad + "_grad"
        grad_ops, grad_map = core.GradientRegistry.GetBackwardPass([op], {output_to_grad: grad_blob})
        output_grad = workspace.FetchBlob(output_to_grad)
        grad_ref_outputs = grad_reference(output_grad, ref_outputs, inputs)
        workspace.FeedBlob(grad_blob, output_grad)
        workspace.RunOperatorsOnce(grad_ops)
        self.assertEqual(len(grad_ref_outputs), len(inputs))
        for name, ref in zip(op.input, grad_ref_outputs):
            grad = grad_map.get(name)
            if grad is None:   # the input has no gradient
                self.assertIsNone(ref)
                continue
            sparse = isinstance(grad, core.GradientSlice)
            ref_values, ref_indices = ref if sparse else (ref, None)
            values_name = grad.values if sparse else grad
            np.testing.assert_allclose(
                workspace.FetchBlob(str(values_name)), ref_values, atol=threshold, rtol=threshold,
                err_msg=f"Gradient {values_name} (x) is not matching the reference (y)")
            if ref_indices is not None:
                np.testing.assert_allclose(workspace.FetchBlob(str(grad.indices)), ref_indices, atol=1e-4, rtol=1e-4)

    def _assertInferTensorChecks(self, name, shapes, types, output):
        """The statically inferred shape of blob `name` against its value (its type too where it is int32,
        as Caffe2 checked); a difference is _shape_inference_failed's."""
        if name not in shapes:
            return
        output = workspace.FetchBlob(name)
        if isinstance(output, np.ndarray):
            correct_type = _TENSOR_TYPES.get(output.dtype, f"unknown {output.dtype}")
        else:
            correct_type = str(type(output))
        try:
            np.testing.assert_array_equal(
                np.array(shapes[name]).astype(np.int32), np.array(output.shape).astype(np.int32),
                err_msg=f"Shape {name} mismatch: {shapes[name]} vs. {output.shape}")
            if correct_type == TensorProto.INT32:
                np.testing.assert_equal(types[name], correct_type,
                                        err_msg=f"Type {name} mismatch: {types[name]} vs. {correct_type}")
        except AssertionError as e:
            _shape_inference_failed(e)

    def assertReferenceChecks(self, device_option, op, inputs, reference, input_device_options=None, threshold=1e-4,
                              output_to_grad=None, grad_reference=None, atol=None, outputs_to_check=None):
        """Assert that `op` run on `inputs` gives what `reference(*inputs)` returns (a tuple or list of arrays,
        one per output, or one per index of outputs_to_check), within rtol=threshold and atol (default
        threshold); string outputs must be equal. With grad_reference (and output_to_grad), the gradients too
        (_assertGradReferenceChecks). Returns the op's outputs."""
        input_device_options = input_device_options or {}
        op = _on_device(op, device_option)
        with temp_workspace():
            if len(op.input) > len(inputs):
                raise ValueError(f"must supply an input for each input on the op: {op.input} vs {inputs}")
            _feed(op, inputs, device_option, input_device_options)
            net = core.Net("opnet")
            net.Proto().op.extend([op])
            shapes = types = None
            try:
                shapes, types = workspace.InferShapesAndTypes([net])
            except RuntimeError as e:
                _shape_inference_failed(e)
            workspace.RunNetOnce(net)
            reference_outputs = reference(*inputs)
            if not isinstance(reference_outputs, (tuple, list)):
                raise RuntimeError("You are providing a wrong reference implementation. A proper one should "
                                   "return a tuple/list of numpy arrays.")
            if not outputs_to_check:
                self.assertEqual(len(reference_outputs), len(op.output))
                outputs_to_check = list(range(len(op.output)))
            outs = []
            for index, ref in zip(outputs_to_check, reference_outputs):
                name = op.output[index]
                output = workspace.FetchBlob(name)
                if getattr(output, "dtype", np.dtype(object)).kind in "SOU":
                    np.testing.assert_array_equal(output, ref)
                else:
                    np.testing.assert_allclose(output, ref, atol=threshold if atol is None else atol, rtol=threshold,
                                               err_msg=f"Output {name} is not matching the reference")
                if shapes is not None:
                    self._assertInferTensorChecks(name, shapes, types, output)
                outs.append(output)
            if grad_reference is not None:
                assert output_to_grad is not None, "If grad_reference is set,output_to_grad has to be set as well"
                with core.DeviceScope(device_option):
                    self._assertGradReferenceChecks(op, inputs, reference_outputs, output_to_grad, grad_reference,
                                                    threshold=threshold)
            return outs

    def assertValidationChecks(self, device_option, op, inputs, validator, input_device_options=None,
                               as_kwargs=True, init_net=None):
        """Run `op` on `inputs` (after init_net, if given) and call validator with the inputs and outputs: by
        blob name as keywords (as_kwargs; the op may not be in place then), else as inputs=, outputs=."""
        if as_kwargs:
            names = list(op.input) + list(op.output)
            assert len(set(names)) == len(names), "in-place ops are not supported in as_kwargs mode"
        op = _on_device(op, device_option)
        with temp_workspace():
            _feed(op, inputs, device_option, input_device_options or {})
            if init_net:
                workspace.RunNetOnce(init_net)
            workspace.RunOperatorOnce(op)
            outputs = [workspace.FetchBlob(n) for n in op.output]
            if as_kwargs:
                validator(**dict(zip(list(op.input) + list(op.output), list(inputs) + outputs)))
            else:
                validator(inputs=inputs, outputs=outputs)

    def assertRunOpRaises(self, device_option, op, inputs, input_device_options=None, exception=(Exception,),
                          regexp=None):
        """Assert that running `op` on `inputs` raises `exception` (matching `regexp`, if given)."""
        op = _on_device(op, device_option)
        with temp_workspace():
            _feed(op, inputs, device_option, input_device_options or {})
            if regexp is None:
                self.assertRaises(exception, workspace.RunOperatorOnce, op)
            else:
                self.assertRaisesRegex(exception, regexp, workspace.RunOperatorOnce, op)
