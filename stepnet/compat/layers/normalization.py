"""Layers that act differently in training and inference: BatchNormalization (SpatialBN; running statistics
updated in training) and Dropout (is_test outside training)."""
from __future__ import annotations

import numpy as np

from .. import schema
from .layers import ModelLayer


class _TestModeLayer(ModelLayer):
    """A layer whose op has is_test: its training ops with is_test=0, eval and prediction with is_test=1
    (subclasses write _add_ops)."""

    def _add_ops(self, net, is_test: bool) -> None:
        raise NotImplementedError

    def add_train_ops(self, net):
        self._add_ops(net, is_test=False)

    def add_eval_ops(self, net):
        self._add_ops(net, is_test=True)

    def add_ops(self, net):
        self.add_eval_ops(net)


class BatchNormalization(_TestModeLayer):
    """SpatialBN over a (C,) or 3-D input (a 1-D one is expanded to (N, C, 1, 1) and squeezed back);
    parameters scale, bias, running_mean, running_inv_var (the last two not optimized)."""

    def __init__(self, model, input_record, name="batch_normalization", scale_optim=None, bias_optim=None,
                 momentum=0.9, order="NCHW", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert isinstance(input_record, schema.Scalar), "Incorrect input type"
        self.input_shape = input_record.field_type().shape
        if len(self.input_shape) == 3:
            if order == "NCHW":
                input_dims = self.input_shape[0]
            elif order == "NHWC":
                input_dims = self.input_shape[2]
            else:
                raise ValueError("Please specify a correct order")
        else:
            assert len(self.input_shape) == 1, "This layer supports only 4D or 2D tesnors"
            input_dims = self.input_shape[0]
        self.output_schema = schema.Scalar((np.float32, self.input_shape), self.get_next_blob_reference("output"))
        self.momentum = momentum
        self.order = order

        def param(param_name, value, optimizer):
            return self.create_param(param_name=param_name, shape=[input_dims],
                                     initializer=("ConstantFill", {"value": value}), optimizer=optimizer)
        self.scale = param("scale", 1.0, scale_optim)
        self.bias = param("bias", 0.0, bias_optim)
        self.rm = param("running_mean", 0.0, model.NoOptim)
        self.riv = param("running_inv_var", 1.0, model.NoOptim)

    def _add_ops(self, net, is_test, out_blob=None):
        flat = len(self.input_shape) == 1
        original = self.input_record.field_blobs()
        net.NextScopedBlob("expand_input")   # reserved, as Caffe2 does
        input_blob = net.ExpandDims(original, dims=[2, 3]) if flat else original[0]
        bn_output = self.output_schema.field_blobs() if out_blob is None else out_blob
        outputs = bn_output if is_test else bn_output + [
            self.rm, self.riv, net.NextScopedBlob("bn_saved_mean"), net.NextScopedBlob("bn_saved_iv")]
        net.SpatialBN([input_blob, self.scale, self.bias, self.rm, self.riv], outputs, momentum=self.momentum,
                      is_test=is_test, order=self.order)
        if flat:
            net.Squeeze(bn_output, bn_output, dims=[2, 3])


class Dropout(_TestModeLayer):
    """Dropout of `ratio` in training; the identity (is_test) in eval and prediction."""

    def __init__(self, model, input_record, name="dropout", ratio=0.5, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert isinstance(input_record, schema.Scalar), "Incorrect input type"
        assert 0 <= ratio < 1.0, f"Expected 0 <= ratio < 1, but got ratio of {ratio}"
        self.output_schema = input_record.clone_schema()
        self.output_schema.set_value(self.get_next_blob_reference("output"))
        self.ratio = ratio

    def _add_ops(self, net, is_test):
        outputs = self.output_schema.field_blobs() + [net.NextScopedBlob("d_mask")]
        net.Dropout(self.input_record.field_blobs(), outputs, ratio=self.ratio, is_test=is_test)
