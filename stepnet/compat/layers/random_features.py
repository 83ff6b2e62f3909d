"""Random-feature kernel maps: RandomFourierFeatures, ArcCosineFeatureMap and SemiRandomFeatures (random
parameters are fixed: not optimized, or global constants)."""
from __future__ import annotations

import numpy as np

from .. import schema
from .layers import ModelLayer


class RandomFourierFeatures(ModelLayer):
    """sqrt(2 / output_dims) * cos(x w^T + b), w ~ N(0, 1/sigma^2), b ~ U[0, 2 pi)."""

    def __init__(self, model, input_record, output_dims, sigma, w_init=None, b_init=None,
                 name="random_fourier_features", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert isinstance(input_record, schema.Scalar), "Incorrect input type"
        input_dims = input_record.field_type().shape[0]
        assert input_dims >= 1, f"Expected input dimensions >= 1, got {input_dims}"
        self.output_dims = output_dims
        assert output_dims >= 1, f"Expected output dimensions >= 1, got {output_dims}"
        self.output_schema = schema.Scalar((np.float32, (output_dims, )), self.get_next_blob_reference("output"))
        assert sigma > 0.0, f"Expected bandwidth > 0, got {sigma}"
        self.w = self.create_param(param_name="w", shape=[output_dims, input_dims],
                                   initializer=w_init or ("GaussianFill", {"mean": 0.0, "std": 1.0 / sigma}),
                                   optimizer=model.NoOptim)
        self.b = self.create_param(param_name="b", shape=[output_dims],
                                   initializer=b_init or ("UniformFill", {"min": 0.0, "max": 2 * np.pi}),
                                   optimizer=model.NoOptim)

    def add_ops(self, net):
        cosine_arg = net.FC(self.input_record.field_blobs() + [self.w, self.b], net.NextScopedBlob("cosine_arg"))
        features = net.Cos([cosine_arg], net.NextScopedBlob("new_feature_vec"))
        net.Scale([features], self.output_schema.field_blobs(), scale=np.sqrt(2.0 / self.output_dims))


class ArcCosineFeatureMap(ModelLayer):
    """H(x) * x^s of x = input w^T + b (H: the Heaviside step; s = 0 uses softsign(x) in place of H(x)): the
    arc-cosine kernel map of degree s, with random w ~ N(0, (scale / sqrt(input_dims))^2) and b uniform."""

    def __init__(self, model, input_record, output_dims, s=1, scale=1.0, weight_init=None, bias_init=None,
                 weight_optim=None, bias_optim=None, set_weight_as_global_constant=False,
                 initialize_output_schema=True, name="arc_cosine_feature_map", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert isinstance(input_record, schema.Scalar), "Incorrect input type"
        self.params = []
        self.model = model
        self.set_weight_as_global_constant = set_weight_as_global_constant
        self.input_dims = input_record.field_type().shape[0]
        assert self.input_dims >= 1, f"Expected input dimensions >= 1, got {self.input_dims}"
        if initialize_output_schema:
            self.output_schema = schema.Scalar((np.float32, (output_dims, )),
                                               model.net.NextScopedBlob(name + "_output"))
        self.output_dims = output_dims
        assert output_dims >= 1, f"Expected output dimensions >= 1, got {output_dims}"
        self.s = s
        assert s >= 0, f"Expected s >= 0, got {s}"
        assert isinstance(s, int), f"Expected s to be type int, got type {type(s)}"
        assert scale > 0.0, f"Expected scale > 0, got {scale}"
        self.stddev = scale * np.sqrt(1.0 / self.input_dims)
        if set_weight_as_global_constant:
            w_init = np.random.normal(scale=self.stddev, size=(self.output_dims, self.input_dims))
            b_init = np.random.uniform(low=-0.5 * self.stddev, high=0.5 * self.stddev, size=self.output_dims)
            self.random_w = self.model.add_global_constant(name=self.name + "_fixed_rand_W", array=w_init)
            self.random_b = self.model.add_global_constant(name=self.name + "_fixed_rand_b", array=b_init)
        else:
            self.random_w, self.random_b = self._initialize_params(
                "random_w", "random_b", w_init=weight_init, b_init=bias_init, w_optim=weight_optim,
                b_optim=bias_optim)

    def _initialize_params(self, w_name, b_name, w_init=None, b_init=None, w_optim=None, b_optim=None):
        """Weight (Gaussian of self.stddev) and bias (uniform in +-stddev/2) parameters; not optimized unless
        an optimizer is given."""
        w_init = w_init or ("GaussianFill", {"mean": 0.0, "std": self.stddev})
        b_init = b_init or ("UniformFill", {"min": -0.5 * self.stddev, "max": 0.5 * self.stddev})
        w = self.create_param(param_name=w_name, shape=(self.output_dims, self.input_dims), initializer=w_init,
                              optimizer=w_optim or self.model.NoOptim)
        b = self.create_param(param_name=b_name, shape=[self.output_dims], initializer=b_init,
                              optimizer=b_optim or self.model.NoOptim)
        return [w, b]

    def _heaviside_with_power(self, net, input_features, output_blob, s):
        """relu(softsign(x)) for s = 0, relu(x) for s = 1, relu(x) * x^(s-1) above."""
        if s == 0:
            softsign = net.Softsign([input_features], net.NextScopedBlob("softsign"))
            return net.Relu(softsign, output_blob)
        if s == 1:
            return net.Relu([input_features], output_blob)
        relu = net.Relu([input_features], net.NextScopedBlob("relu_rand"))
        power = net.Pow([input_features], net.NextScopedBlob("pow_rand"), exponent=float(s - 1))
        return net.Mul([relu, power], output_blob)

    def add_ops(self, net):
        random_features = net.FC(self.input_record.field_blobs() + [self.random_w, self.random_b],
                                 net.NextScopedBlob("random_features"))
        self._heaviside_with_power(net, random_features, self.output_schema.field_blobs(), self.s)


class SemiRandomFeatures(ArcCosineFeatureMap):
    """Semi-random features: (arc-cosine map of the random input, degree s) * (a learned FC of the full
    input). input_record is a Scalar, or a Struct of 'full' and 'random'; the output a Struct of both."""

    def __init__(self, model, input_record, output_dims, s=1, scale_random=1.0, scale_learned=1.0,
                 weight_init_random=None, bias_init_random=None, weight_init_learned=None, bias_init_learned=None,
                 weight_optim=None, bias_optim=None, set_weight_as_global_constant=False,
                 name="semi_random_features", **kwargs):
        if isinstance(input_record, schema.Struct):
            schema.is_schema_subset(schema.Struct(("full", schema.Scalar()), ("random", schema.Scalar())),
                                    input_record)
            self.input_record_full = input_record.full
            self.input_record_random = input_record.random
        elif isinstance(input_record, schema.Scalar):
            self.input_record_full = self.input_record_random = input_record
        super().__init__(model, self.input_record_full, output_dims, s=s, scale=scale_random,
                         weight_init=weight_init_random, bias_init=bias_init_random, weight_optim=None,
                         bias_optim=None, set_weight_as_global_constant=set_weight_as_global_constant,
                         initialize_output_schema=False, name=name, **kwargs)
        self.output_schema = schema.Struct(
            ("full", schema.Scalar((np.float32, output_dims), model.net.NextScopedBlob(name + "_full_output"))),
            ("random", schema.Scalar((np.float32, output_dims),
                                     model.net.NextScopedBlob(name + "_random_output"))))
        assert scale_learned > 0.0, f"Expected scale (learned) > 0, got {scale_learned}"
        self.stddev = scale_learned * np.sqrt(1.0 / self.input_dims)
        self.learned_w, self.learned_b = self._initialize_params(
            "learned_w", "learned_b", w_init=weight_init_learned, b_init=bias_init_learned, w_optim=weight_optim,
            b_optim=bias_optim)

    def add_ops(self, net):
        learned = net.FC(self.input_record_full.field_blobs() + [self.learned_w, self.learned_b],
                         net.NextScopedBlob("learned_features"))
        random = net.FC(self.input_record_random.field_blobs() + [self.random_w, self.random_b],
                        net.NextScopedBlob("random_features"))
        processed = self._heaviside_with_power(net, random, self.output_schema.random.field_blobs(), self.s)
        net.Mul([processed, learned], self.output_schema.full.field_blobs())
