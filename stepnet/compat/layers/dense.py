"""Dense layers: FC, FCWithoutBias, AddBias, Conv, and sampled training of a prediction layer (SamplingTrain
over a SamplingTrainableMixin layer: trains on the parameter rows `indices` selects)."""
from __future__ import annotations

import abc
import math

import numpy as np

from .. import schema
from .layers import ModelLayer, get_layer_class


def _input_dims(input_record, layer: str) -> int:
    assert isinstance(input_record, schema.Scalar), f"Incorrect input type {input_record}"
    shape = input_record.field_types()[0].shape
    assert len(shape) > 0, f"{layer} expects limited dimensions of the input tensor"
    assert shape[0] > 0, f"{layer} expects input dimensions > 0, got {shape[0]}"
    return shape[0]


def _uniform(scale: float):
    return ("UniformFill", {"min": -scale, "max": scale})


class SamplingTrainableMixin(metaclass=abc.ABCMeta):
    """A layer whose training ops may use other parameter blobs (train_param_blobs: sampled rows) than its
    prediction ops (param_blobs)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._train_param_blobs = None
        self._train_param_blobs_frozen = False

    @property
    @abc.abstractmethod
    def param_blobs(self):
        """The parameter blobs of the prediction net."""

    @property
    def train_param_blobs(self):
        """The parameter blobs of the training net (param_blobs unless set)."""
        if self._train_param_blobs is None:
            self.train_param_blobs = self.param_blobs
        return self._train_param_blobs

    @train_param_blobs.setter
    def train_param_blobs(self, blobs):
        assert not self._train_param_blobs_frozen, "train_param_blobs can be set once"
        assert blobs is not None
        self._train_param_blobs_frozen = True
        self._train_param_blobs = blobs

    @abc.abstractmethod
    def _add_ops(self, net, param_blobs):
        """Add the ops to net, using param_blobs."""

    def add_ops(self, net):
        self._add_ops(net, self.param_blobs)

    def add_train_ops(self, net):
        self._add_ops(net, self.train_param_blobs)


class FC(SamplingTrainableMixin, ModelLayer):
    """output = input * w^T + b (op FC); w, b uniform in +-sqrt(1/input_dims) by default."""

    def __init__(self, model, input_record, output_dims, weight_init=None, bias_init=None, weight_optim=None,
                 bias_optim=None, name="fc", weight_reg=None, bias_reg=None, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        input_dims = _input_dims(input_record, "FC")
        scale = math.sqrt(1.0 / input_dims)
        self.w = self.create_param(param_name="w", shape=[output_dims, input_dims],
                                   initializer=weight_init or _uniform(scale), optimizer=weight_optim,
                                   regularizer=weight_reg)
        self.b = self.create_param(param_name="b", shape=[output_dims, ], initializer=bias_init or _uniform(scale),
                                   optimizer=bias_optim, regularizer=bias_reg)
        self.output_schema = schema.Scalar((np.float32, (output_dims, )), self.get_next_blob_reference("output"))

    def _add_ops(self, net, params):
        net.FC(self.input_record.field_blobs() + params, self.output_schema.field_blobs(), **self.kwargs)

    @property
    def param_blobs(self):
        return [self.w, self.b]


class FCWithoutBias(SamplingTrainableMixin, ModelLayer):
    """output = input * w^T (op MatMul with trans_b)."""

    def __init__(self, model, input_record, output_dims, weight_init=None, weight_optim=None,
                 name="fc_without_bias", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        input_dims = _input_dims(input_record, "FCWithoutBias")
        self.output_schema = schema.Scalar((np.float32, (output_dims, )), self.get_next_blob_reference("output"))
        scale = math.sqrt(1.0 / input_dims)
        self.w = self.create_param(param_name="w", shape=[output_dims, input_dims],
                                   initializer=weight_init or _uniform(scale), optimizer=weight_optim)

    def _add_ops(self, net, params):
        net.MatMul(self.input_record.field_blobs() + params, self.output_schema.field_blobs(), trans_b=1,
                   **self.kwargs)

    @property
    def param_blobs(self):
        return [self.w]


class SamplingTrain(ModelLayer):
    """Trains prediction_layer (a SamplingTrainableMixin layer class name) on the rows input_record.indices
    selects of its parameters (Gather), subtracting log(sampling_prob) from its output when
    subtract_log_odd; predicts with the full parameters."""

    def __init__(self, model, input_record, prediction_layer, output_dims, subtract_log_odd=True,
                 name="sampling_train", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        layer_class = get_layer_class(prediction_layer)
        assert issubclass(layer_class, SamplingTrainableMixin), f"{prediction_layer} cannot be sampled"
        assert "indices" in input_record
        assert isinstance(input_record.indices, schema.Scalar), \
            "input_record.indices is expected to be a schema.Scalar"
        assert "input" in input_record
        self.subtract_log_odd = subtract_log_odd
        if subtract_log_odd:
            assert "sampling_prob" in input_record
        self._prediction_layer = layer_class(model, input_record.input, output_dims=output_dims, **kwargs)
        self._prediction_layer.train_param_blobs = [
            model.net.NextBlob(str(blob) + "_sampled") for blob in self._prediction_layer.param_blobs]
        self.params = self._prediction_layer.params
        self.output_schema = self._prediction_layer.output_schema

    def add_ops(self, net):
        self._prediction_layer.add_ops(net)

    def add_train_ops(self, net):
        layer = self._prediction_layer
        for full, sampled in zip(layer.param_blobs, layer.train_param_blobs):
            net.Gather([full, self.input_record.indices()], sampled)
        layer.add_train_ops(net)
        if not self.subtract_log_odd:
            return
        log_q = net.Log(self.input_record.sampling_prob(), net.NextScopedBlob("log_q"))
        net.Sub([self.output_schema(), log_q], self.output_schema(), broadcast=1, use_grad_hack=1)


class AddBias(ModelLayer):
    """output = input + b (broadcast over the batch)."""

    def __init__(self, model, input_record, bias_init=None, bias_optim=None, name="add_bias"):
        super().__init__(model, name, input_record)
        input_dims = _input_dims(input_record, "AddBias")
        scale = math.sqrt(1.0 / input_dims)
        self.b = self.create_param(param_name="b", shape=[input_dims, ], initializer=bias_init or _uniform(scale),
                                   optimizer=bias_optim)
        self.output_schema = schema.Scalar((input_record.field_type().base, (input_dims, )),
                                           self.get_next_blob_reference("output"))

    def add_ops(self, net):
        net.Add(self.input_record.field_blobs() + [self.b], self.output_schema.field_blobs(), broadcast=1)


def _positive_int(value, what: str) -> int:
    assert value > 0 and isinstance(value, int), f"{what} should be positive integer"
    return value


class Conv(ModelLayer):
    """A 2-D convolution of output_dim filters (kernel XavierFill, bias 0). The input's shape gives the
    channels (last dim for NHWC, first for NCHW); with stride 1 a padding left None keeps the size; the output
    schema records the channel count only."""

    def __init__(self, model, input_record, output_dim, kernel_h, kernel_w, stride_h, stride_w, pad_b=None,
                 pad_l=None, pad_r=None, pad_t=None, order="NHWC", kernel_init=None, bias_init=None,
                 kernel_optim=None, bias_optim=None, name="conv", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert isinstance(input_record, schema.Scalar), "Incorrect input type"
        input_dims = input_record.field_type().shape
        self.kernel_h = _positive_int(kernel_h, "kernel_h")
        self.kernel_w = _positive_int(kernel_w, "kernel_w")
        self.stride_h = _positive_int(stride_h, "stride_h")
        self.stride_w = _positive_int(stride_w, "stride_w")
        auto_h = int((kernel_h - 1) / 2) if stride_h == 1 else 0
        auto_w = int((kernel_w - 1) / 2) if stride_w == 1 else 0
        self.pad_t = auto_h if pad_t is None else pad_t
        self.pad_b = auto_h if pad_b is None else pad_b
        self.pad_r = auto_w if pad_r is None else pad_r
        self.pad_l = auto_w if pad_l is None else pad_l
        for what in ("pad_t", "pad_b", "pad_r", "pad_l"):
            value = getattr(self, what)
            assert value >= 0 and isinstance(value, int), f"{what} should be int >= 0"
        assert order in ("NHWC", "NCHW"), "order should either 'NHWC' or 'NCHW'"
        self.order = order
        if order == "NHWC":
            input_c = input_dims[-1]
            kernel_shape = [output_dim, kernel_h, kernel_w, input_c]
        else:
            input_c = input_dims[0]
            kernel_shape = [output_dim, input_c, kernel_h, kernel_w]
        assert input_c > 0, "Number of input channels in conv parameters should be positive"
        self.kernel = self.create_param(param_name="conv_kernel", shape=kernel_shape,
                                        initializer=kernel_init or ("XavierFill", {}), optimizer=kernel_optim)
        self.bias = self.create_param(param_name="conv_bias", shape=[output_dim],
                                      initializer=bias_init or ("ConstantFill", {"value": 0.0}),
                                      optimizer=bias_optim)
        self.output_schema = schema.Scalar((np.float32, (output_dim,)), self.get_next_blob_reference("output"))

    def add_ops(self, net):
        net.Conv(self.input_record.field_blobs() + [self.kernel, self.bias], self.output_schema.field_blobs(),
                 kernel_h=self.kernel_h, kernel_w=self.kernel_w, stride_h=self.stride_h, stride_w=self.stride_w,
                 pad_t=self.pad_t, pad_l=self.pad_l, pad_b=self.pad_b, pad_r=self.pad_r, order=self.order)
