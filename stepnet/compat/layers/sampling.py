"""Layers that collect or draw samples: LastNWindowCollector (the last N rows seen) and UniformSampling (the
input ids plus unique uniform samples from a range)."""
from __future__ import annotations

import numpy as np

from .. import core, schema
from .layers import ModelLayer


class LastNWindowCollector(ModelLayer):
    """Keeps the last num_to_collect rows of the input in a parameter blob (not thread safe); outputs last_n,
    num_visited (rows seen) and the mutex."""

    def __init__(self, model, input_record, num_to_collect, name="last_n_window_collector", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert num_to_collect > 0
        self.num_to_collect = num_to_collect
        assert isinstance(input_record, schema.Scalar), f"Got {input_record!r}"

        def state(param_name, shape, init):
            return self.create_param(param_name=param_name, shape=shape, initializer=init, optimizer=model.NoOptim)
        self.last_n = state("last_n", [0], ("ConstantFill", {}))
        self.next_blob = state("next", [], ("ConstantFill", {"value": 0, "dtype": core.DataType.INT32}))
        self.mutex = state("mutex", None, ("CreateMutex",))
        self.num_visited_blob = state("num_visited", [], ("ConstantFill", {"value": 0,
                                                                            "dtype": core.DataType.INT64}))
        self.output_schema = schema.Struct(
            ("last_n", schema.from_blob_list(input_record, [self.last_n])),
            ("num_visited", schema.Scalar(blob=self.num_visited_blob)),
            ("mutex", schema.Scalar(blob=self.mutex)))

    def add_ops(self, net):
        net.LastNWindowCollector(
            [self.last_n, self.next_blob, self.input_record(), self.mutex, self.num_visited_blob],
            [self.last_n, self.next_blob, self.num_visited_blob], num_to_collect=self.num_to_collect)


class UniformSampling(ModelLayer):
    """samples: the input ids (expected unique) followed by num_samples - len(input) unique ids drawn
    uniformly from [0, num_elements) apart from them; sampling_prob: num_samples / num_elements each."""

    def __init__(self, model, input_record, num_samples, num_elements, name="uniform_sampling", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert num_elements > num_samples > 0
        assert isinstance(input_record, schema.Scalar)
        self.num_elements = num_elements
        self.num_samples = self.create_param(param_name="num_examples", shape=(1,),
                                             initializer=("GivenTensorInt64Fill", {"values": [num_samples]}),
                                             optimizer=model.NoOptim)
        prob_init = ("ConstantFill", {"value": float(num_samples) / num_elements, "dtype": core.DataType.FLOAT})
        self.sampling_prob = self.create_param(param_name="prob", shape=(num_samples,), initializer=prob_init,
                                               optimizer=model.NoOptim)
        self.output_schema = schema.Struct(
            ("samples", schema.Scalar(np.int32, self.get_next_blob_reference("samples"))),
            ("sampling_prob", schema.Scalar(np.float32, self.sampling_prob)))

    def add_ops(self, net):
        net.StopGradient(self.sampling_prob, self.sampling_prob)
        shape = net.Shape([self.input_record()], net.NextScopedBlob("shape"))
        shape = net.Sub([self.num_samples, shape], shape)
        samples = net.UniqueUniformFill([shape, self.input_record()], net.NextScopedBlob("samples_before_concat"),
                                        min=0, max=self.num_elements - 1, input_as_shape=True)
        net.Concat([self.input_record(), samples], [self.output_schema.samples(), net.NextScopedBlob("split_info")],
                   axis=0)
        net.StopGradient(self.output_schema.samples(), self.output_schema.samples())


class ReservoirSampling(ModelLayer):
    """A uniform sample of num_to_collect rows of input_record.data over all rows seen (reservoir sampling;
    with object_id, an object is kept once)."""

    def __init__(self, model, input_record, num_to_collect, name="reservoir_sampling", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert num_to_collect > 0
        self.num_to_collect = num_to_collect

        def state(param_name, shape, init):
            return self.create_param(param_name=param_name, shape=shape, initializer=init, optimizer=model.NoOptim)
        self.reservoir = state("reservoir", [0], ("ConstantFill",))
        self.num_visited_blob = state("num_visited", [], ("ConstantFill", {"value": 0,
                                                                            "dtype": core.DataType.INT64}))
        self.mutex = state("mutex", None, ("CreateMutex",))
        self.extra_input_blobs, self.extra_output_blobs = [], []
        if "object_id" in input_record:
            object_to_pos = state("object_to_pos", None, ("CreateMap", {"key_dtype": core.DataType.INT64,
                                                                        "valued_dtype": core.DataType.INT32}))
            pos_to_object = state("pos_to_object", [0], ("ConstantFill", {"value": 0,
                                                                           "dtype": core.DataType.INT64}))
            self.extra_input_blobs += [input_record.object_id(), object_to_pos, pos_to_object]
            self.extra_output_blobs += [object_to_pos, pos_to_object]
        self.output_schema = schema.Struct(
            ("reservoir", schema.from_blob_list(input_record.data, [self.reservoir])),
            ("num_visited", schema.Scalar(blob=self.num_visited_blob)),
            ("mutex", schema.Scalar(blob=self.mutex)))

    def add_ops(self, net):
        net.ReservoirSampling(
            [self.reservoir, self.num_visited_blob, self.input_record.data(), self.mutex] + self.extra_input_blobs,
            [self.reservoir, self.num_visited_blob] + self.extra_output_blobs, num_to_collect=self.num_to_collect)
