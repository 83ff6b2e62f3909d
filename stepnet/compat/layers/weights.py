"""Layers that weight several losses or labels: AdaptiveWeight, ConstantWeight, HomotopyWeight and
LabelSmooth."""
from __future__ import annotations

import logging

import numpy as np

from .. import core, schema
from .layers import ModelLayer

logger = logging.getLogger(__name__)


class AdaptiveWeight(ModelLayer):
    """sum_i x_i / (2 exp(mu_i)) + mu_i over the input scalars, mu learned (uncertainty weighting, Kendall et
    al. 2017); mu starts at log(1 / (2 w_i)) for given weights, log(n / 2) otherwise."""

    def __init__(self, model, input_record, name="adaptive_weight", optimizer=None, weights=None, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        self.output_schema = schema.Scalar(np.float32, self.get_next_blob_reference("adaptive_weight"))
        self.data = self.input_record.field_blobs()
        self.num = len(self.data)
        if weights is None:
            initializer = ("ConstantFill", {"value": np.log(self.num / 2.)})
        else:
            assert len(weights) == self.num
            values = np.log(1. / 2. / np.array(weights).astype(np.float32))
            initializer = ("GivenTensorFill", {"values": values, "dtype": core.DataType.FLOAT})
        self.mu = self.create_param(param_name="mu", shape=[self.num], initializer=initializer,
                                    optimizer=optimizer)

    def concat_data(self, net):
        reshaped = [net.NextScopedBlob(f"reshaped_data_{i}") for i in range(self.num)]
        for i in range(self.num):
            net.Reshape([self.data[i]], [reshaped[i], net.NextScopedBlob(f"new_shape_{i}")], shape=[1])
        concated = net.NextScopedBlob("concated_data")
        net.Concat(reshaped, [concated, net.NextScopedBlob("concated_new_shape")], axis=0)
        return concated

    def compute_adaptive_sum(self, x, net):
        mu_exp = net.NextScopedBlob("mu_exp")
        net.Exp(self.mu, mu_exp)
        mu_exp_double = net.NextScopedBlob("mu_exp_double")
        net.Scale(mu_exp, mu_exp_double, scale=2.0)
        weighted_x = net.NextScopedBlob("weighted_x")
        net.Div([x, mu_exp_double], weighted_x)
        weighted_elements = net.NextScopedBlob("weighted_elements")
        net.Add([weighted_x, self.mu], weighted_elements)
        net.SumElements(weighted_elements, self.output_schema())

    def add_ops(self, net):
        self.compute_adaptive_sum(self.concat_data(net), net)


class ConstantWeight(ModelLayer):
    """sum_i w_i x_i with constant weights (default 1/n each)."""

    def __init__(self, model, input_record, weights=None, name="constant_weight", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        self.output_schema = schema.Scalar(np.float32, self.get_next_blob_reference("adaptive_weight"))
        self.data = self.input_record.field_blobs()
        self.num = len(self.data)
        weights = weights if weights is not None else [1. / self.num] * self.num
        assert len(weights) == self.num
        self.weights = [self.model.add_global_constant(f"{self.name}_weight_{i}", float(weights[i]))
                        for i in range(self.num)]

    def add_ops(self, net):
        net.WeightedSum([b for pair in zip(self.data, self.weights) for b in pair], self.output_schema())


class HomotopyWeight(ModelLayer):
    """alpha x + beta y for two inputs, alpha moving from max_weight towards min_weight with the iterations
    (LearningRate 'inv' fitted so that alpha = beta at half_life and alpha = beta / 3 at quad_life)."""

    def __init__(self, model, input_record, name="homotopy_weight", min_weight=0., max_weight=1., half_life=1e6,
                 quad_life=3e6, atomic_iter=None, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        self.output_schema = schema.Scalar(np.float32, self.get_next_blob_reference("homotopy_weight"))
        data = self.input_record.field_blobs()
        assert len(data) == 2
        self.x, self.y = data
        self.use_external_iter = atomic_iter is not None
        self.atomic_iter = atomic_iter if self.use_external_iter else self.create_atomic_iter()
        assert max_weight > min_weight
        self.scale = float(max_weight - min_weight)
        self.offset = self.model.add_global_constant(f"{self.name}_offset_1dfloat", float(min_weight))
        self.gamma, self.power = self.solve_inv_lr_params(half_life, quad_life)

    def solve_inv_lr_params(self, half_life, quad_life):
        """gamma, power of lr = (1 + gamma t)^-power with lr(half_life) = 1/2 and lr(quad_life) = 1/4."""
        assert half_life > 0
        assert quad_life > 2 * half_life
        t = float(quad_life) / float(half_life)
        x = t * (1.0 + np.sqrt(2.0)) / 2.0 - np.sqrt(2.0)
        gamma = (x - 1.0) / float(half_life)
        power = np.log(2.0) / np.log(x)
        logger.info("homotopy_weighting: found lr param: gamma=%g, power=%g", gamma, power)
        return gamma, power

    def create_atomic_iter(self):
        self.mutex = self.create_param(param_name=f"{self.name}_mutex", shape=None, initializer=("CreateMutex", ),
                                       optimizer=self.model.NoOptim)
        self.atomic_iter = self.create_param(
            param_name=f"{self.name}_atomic_iter", shape=[1],
            initializer=("ConstantFill", {"value": 0, "dtype": core.DataType.INT64}), optimizer=self.model.NoOptim)
        return self.atomic_iter

    def update_weight(self, net):
        alpha, beta = net.NextScopedBlob("alpha"), net.NextScopedBlob("beta")
        lr, comp_lr = net.NextScopedBlob("lr"), net.NextScopedBlob("complementary_lr")
        scaled_lr = net.NextScopedBlob("scaled_lr")
        scaled_comp_lr = net.NextScopedBlob("scaled_complementary_lr")
        if not self.use_external_iter:
            net.AtomicIter([self.mutex, self.atomic_iter], [self.atomic_iter])
        net.LearningRate([self.atomic_iter], [lr], policy="inv", gamma=self.gamma, power=self.power, base_lr=1.0)
        net.Sub([self.model.global_constants["ONE"], lr], [comp_lr])
        net.Scale([lr], [scaled_lr], scale=self.scale)
        net.Scale([comp_lr], [scaled_comp_lr], scale=self.scale)
        net.Add([lr, self.offset], [alpha])
        net.Add([comp_lr, self.offset], beta)
        return alpha, beta

    def add_ops(self, net):
        alpha, beta = self.update_weight(net)
        net.WeightedSum([self.x, alpha, self.y, beta], self.output_schema())


class LabelSmooth(ModelLayer):
    """The smoothed label: row `label` of a K x K smooth_matrix (OneHot then MatMul), or for a matrix of 2
    values (binary probability labels) smooth_matrix[label > 0.5] (StumpFunc)."""

    def __init__(self, model, label, smooth_matrix, name="label_smooth", **kwargs):
        super().__init__(model, name, label, **kwargs)
        self.label = label
        smooth_matrix = np.array(smooth_matrix).astype(np.float32).flatten()
        self.set_dim(smooth_matrix)
        self.set_smooth_matrix(smooth_matrix)
        self.output_schema = schema.Scalar((np.float32, (self.dim, )), self.get_next_blob_reference("smoothed_label"))

    def set_dim(self, smooth_matrix):
        num_elements = smooth_matrix.size
        self.binary_prob_label = num_elements == 2
        if self.binary_prob_label:
            self.dim = 1
        else:
            assert np.sqrt(num_elements) ** 2 == num_elements
            self.dim = int(np.sqrt(num_elements))

    def set_smooth_matrix(self, smooth_matrix):
        if self.binary_prob_label:
            self.smooth_matrix = smooth_matrix
            return
        self.smooth_matrix = self.model.add_global_constant(
            f"{self.name}_label_smooth_matrix", array=smooth_matrix.reshape((self.dim, self.dim)),
            dtype=np.dtype(np.float32))
        self.len = self.model.add_global_constant(f"{self.name}_label_dim", array=self.dim,
                                                  dtype=np.dtype(np.int64))

    def add_ops_for_binary_prob_label(self, net):
        label = self.label()
        if self.label.field_type().base != np.float32:
            label = net.NextScopedBlob("float32_label")
            net.Cast([self.label()], [label], to=core.DataType.FLOAT)
        net.StumpFunc(label, self.output_schema(), threshold=0.5, low_value=self.smooth_matrix[0],
                      high_value=self.smooth_matrix[1])

    def add_ops_for_categorical_label(self, net):
        label = self.label()
        if self.label.field_type().base != np.int64:
            label = net.NextScopedBlob("int64_label")
            net.Cast([self.label()], [label], to=core.DataType.INT64)
        one_hot_label = net.NextScopedBlob("one_hot_label")
        net.OneHot([label, self.len], [one_hot_label])
        net.MatMul([one_hot_label, self.smooth_matrix], self.output_schema())

    def add_ops(self, net):
        if self.binary_prob_label:
            self.add_ops_for_binary_prob_label(net)
        else:
            self.add_ops_for_categorical_label(net)
