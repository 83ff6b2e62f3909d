"""Layers on sparse features (IdList: List of int64 ids; IdScoreList: Map of ids to scores): SparseLookup
(embedding table + pooling), PositionWeighted, SparseFeatureHash, MergeIdLists, MapToRange."""
from __future__ import annotations

import collections
import functools
import logging
import math
import operator

import numpy as np

from .. import core, schema
from ..helpers.arg_scope import get_current_scope
from .layers import IdList, IdScoreList, LayerPsParam, ModelLayer, get_categorical_limit, get_key
from .tags import Tags

logger = logging.getLogger(__name__)


def get_sparse_lookup_predictor_version(version):
    assert version in {"fp32", "fp16", "uint8rowwise", "fused_uint8rowwise"}, \
        f"Unexpected version of sparse_lookup layer {version}"
    return version


def _is_id_list(record) -> bool:
    return schema.equal_schemas(record, IdList)


def _is_id_score_list(record) -> bool:
    return schema.equal_schemas(record, IdScoreList, check_field_types=False)


def _unsupported_version(version):
    return ValueError(f"Unsupported version of operator in SparseLookUp layer: {version}")


class SparseLookup(ModelLayer):
    """An embedding table w of (categorical limit) x inner_shape rows, looked up by the record's ids and pooled
    per example by `reducer` (Sum, Mean, Sqrt, Max, LogSumExp, ...; PositionWeighted / WeightedSum use the
    scores; None: no pooling). The arg_scope of get_sparse_lookup_predictor_version picks the table type."""

    _id_list_supported_reducers = ["LogMeanExp", "LogSumExp", "Max", "Mean", "Sum", "WeightedSum",
                                   "WeightedMean", "Sqrt", "None"]
    _id_score_list_supported_reducers = ["PositionWeighted", "Mean", "Sum", "WeightedSum", "WeightedMean",
                                         "None"]

    def __init__(self, model, input_record, inner_shape, reducer, weight_init=None, weight_optim=None,
                 name="sparse_lookup", regularizer=None, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        if isinstance(inner_shape, int):
            inner_shape = [inner_shape]
        assert isinstance(inner_shape, (list, tuple)), \
            f"Unexpected type for inner_shape, expected list or tuple, got {type(inner_shape)}"
        if reducer == "PositionWeighted":
            assert _is_id_score_list(self.input_record), (
                f"PositionWeighted only support IdScoreList, but got {self.input_record!r} please use "
                "PositionWeighted layer to convert IdList to IdScoreList")
            self.external_weights = input_record.values()
        self.reducer = reducer
        input_dim = get_categorical_limit(input_record)
        assert input_dim > 0, f"{get_key(input_record)()} should have categorical limit > 0, but got {input_dim}"
        scale = math.sqrt(1.0 / input_dim)
        self.shape = [input_dim] + list(inner_shape)
        self.weight_init = weight_init or ("UniformFill", {"min": -scale, "max": scale})
        if _is_id_list(self.input_record):
            sparse_key = self.input_record.items()
        elif _is_id_score_list(self.input_record):
            sparse_key = self.input_record.keys()
        else:
            raise NotImplementedError(f"SparseLookup takes an IdList or IdScoreList, got {self.input_record}")
        lengths_meta = self.input_record.lengths.metadata
        avg_length = lengths_meta.expected_value if lengths_meta else None
        self.w = self.create_param(param_name="w", shape=self.shape, initializer=self.weight_init,
                                   optimizer=weight_optim,
                                   ps_param=LayerPsParam(sparse_key=sparse_key, average_length=avg_length),
                                   regularizer=regularizer)
        self.scale_bias_init = ("ConstantFill", {"value": 0.0})
        self.scale_bias = self.create_param(param_name="scale_bias", shape=[], initializer=self.scale_bias_init,
                                            optimizer=model.NoOptim)
        self.output_schema = schema.Scalar((np.float32, inner_shape), self.get_next_blob_reference("output"))

    def get_memory_usage(self):
        return functools.reduce(operator.mul, self.shape) * 4

    def get_fp16_compatible_parameters(self):
        return [self.w]

    def support_8bit(self) -> bool:
        """Row-wise quantization: for a 2-D table of rows of 8 or more."""
        return len(self.shape) == 2 and self.shape[1] >= 8

    def get_8bits_compatible_parameters(self, fused=True):
        if not self.support_8bit():
            return []
        if fused:
            return [collections.namedtuple("RowwiseQuantized8BitsWeight", "w")(self.w)]
        return [collections.namedtuple("RowwiseQuantized8BitsWeight", "w, scale_bias")(self.w, self.scale_bias)]

    def _gather_wrapper(self, net, version, in_indices, out):
        """The table rows of in_indices, as float32."""
        if version == "fp32":
            return net.Gather([self.w, in_indices], out)
        gathered_w = net.Gather([self.w, in_indices], "gathered_w")
        if version == "fp16":
            return net.HalfToFloat(gathered_w, out)
        if version == "uint8rowwise":
            gathered_scale_bias = net.Gather([self.scale_bias, in_indices], "gathered_scale_bias")
            return net.Rowwise8BitQuantizedToFloat([gathered_w, gathered_scale_bias], out)
        if version == "fused_uint8rowwise":
            return net.Fused8BitRowwiseQuantizedToFloat(gathered_w, out)
        raise _unsupported_version(version)

    def _lengths_reducer(self, net, version, op_name, op_input, scale_bias_input=True, **kwargs):
        """SparseLengths<op_name> (or its quantized form) into the output."""
        out = self.output_schema.field_blobs()
        if version in ("fp32", "fp16"):    # these ops take either table type and give float32
            getattr(net, op_name)(op_input, out, **kwargs)
        elif version == "uint8rowwise":
            getattr(net, op_name + "8BitsRowwise")(op_input + ([self.scale_bias] if scale_bias_input else []), out)
        elif version == "fused_uint8rowwise":
            getattr(net, op_name + "Fused8BitRowwise")(op_input, out)
        else:
            raise _unsupported_version(version)

    def _sparse_lengths_weighted_reducer(self, in_indices, weights, reducer, net, version, grad_on_weights=0):
        op_input = [self.w, weights, in_indices, self.input_record.lengths()]
        kwargs = {"grad_on_weights": grad_on_weights} if version in ("fp32", "fp16") else {}
        self._lengths_reducer(net, version, "SparseLengths" + reducer, op_input, **kwargs)

    def _add_ops_id_list(self, net, version):
        assert self.reducer in self._id_list_supported_reducers, f"Unsupported reducer: {self.reducer} for ID_LIST"
        items, lengths = self.input_record.items(), self.input_record.lengths()
        if self.reducer in ("Sum", "Mean", "WeightedSum", "WeightedMean"):
            # an id list weighs every id 1: the weighted reducers are the plain ones
            self.reducer = {"WeightedSum": "Sum", "WeightedMean": "Mean"}.get(self.reducer, self.reducer)
            self._lengths_reducer(net, version, "SparseLengths" + self.reducer, [self.w, items, lengths])
        elif self.reducer == "Sqrt":
            sqrt_weight = net.LengthsToWeights([lengths], [net.NextScopedBlob("lengths_sqrt")], power=0.5)
            self._sparse_lengths_weighted_reducer(items, sqrt_weight, "WeightedSum", net, version)
        elif self.reducer == "None":
            self._gather_wrapper(net, version, items, self.output_schema.field_blobs())
        else:
            table_rows = self._gather_wrapper(net, version, items, "table_rows")
            segment_ids = net.LengthsToSegmentIds(lengths, lengths + "_sid")
            getattr(net, "SortedSegmentRange" + self.reducer)([table_rows, segment_ids],
                                                              self.output_schema.field_blobs())

    def _add_ops_id_score_list(self, net, version):
        assert self.reducer in self._id_score_list_supported_reducers, \
            f"Unsupported reducer: {self.reducer} for ID_SCORE_LIST"
        keys = self.input_record.keys()
        if self.reducer in ("WeightedSum", "WeightedMean"):
            self._sparse_lengths_weighted_reducer(keys, self.input_record.values(), self.reducer, net, version)
        elif self.reducer in ("Sum", "Mean"):
            self._lengths_reducer(net, version, "SparseLengths" + self.reducer,
                                  [self.w, keys, self.input_record.lengths()], scale_bias_input=False)
        elif self.reducer == "PositionWeighted":
            self._sparse_lengths_weighted_reducer(keys, self.external_weights, "WeightedSum", net, version,
                                                  grad_on_weights=1)
        elif self.reducer == "None":
            self._gather_wrapper(net, version, keys, self.output_schema.field_blobs())
        else:
            raise ValueError(f"Only Sum, Mean, None are supported for IdScoreList input. "
                             f"Trying to create with {self.reducer}")

    def add_ops(self, net):
        cur_scope = get_current_scope()
        version = get_sparse_lookup_predictor_version(
            **cur_scope.get(get_sparse_lookup_predictor_version.__name__, {"version": "fp32"}))
        if not self.support_8bit() and version in {"uint8rowwise", "fused_uint8rowwise"}:
            version = "fp32"
        if _is_id_list(self.input_record):
            self._add_ops_id_list(net, version=version)
        elif _is_id_score_list(self.input_record):
            self._add_ops_id_score_list(net, version=version)
        else:
            raise ValueError(f"Unsupported input type {self.input_record}")


class PositionWeighted(ModelLayer):
    """A learned weight per position in the list (pos_w, initialized to 1): position_weights holds, for each
    id, the weight of its position."""

    def __init__(self, model, input_record, weight_optim=None, name="position_weights"):
        super().__init__(model, name, input_record)
        assert isinstance(input_record, schema.List), "Incorrect input type"
        length_metadata = input_record.lengths.metadata
        max_length = length_metadata.categorical_limit if length_metadata is not None else None
        if max_length is not None:
            self.shape = max_length
        else:
            self.shape = get_categorical_limit(input_record)
            logger.warning("%s: categorical_limit of lengths is not available, using categorical_limit of the "
                           "keys: %s", input_record.lengths(), self.shape)
        self.pos_w = self.create_param(param_name="pos_w", shape=[self.shape, ],
                                       initializer=("ConstantFill", {"value": 1.0}), optimizer=weight_optim)
        self.output_schema = schema.Struct(
            ("position_weights",
             schema.Scalar((np.float32, self.shape), self.get_next_blob_reference("pos_w_gather"))))
        self.tags.update({Tags.HANDLE_AS_SPARSE_LAYER})
        self.tags.update({Tags.GRADIENT_FROM_PS})

    def get_memory_usage(self):
        return self.shape

    def add_ops(self, net):
        positions = net.LengthsRangeFill([self.input_record.lengths()],
                                         self.input_record.lengths() + "_pos_w_seq")
        net.Gather([self.pos_w, positions], self.output_schema.position_weights.field_blobs())


class SparseFeatureHash(ModelLayer):
    """The ids of an IdList / IdScoreList mapped into [0, modulo): IndexHash (use_hashing) or Mod."""

    def __init__(self, model, input_record, seed=0, modulo=None, use_hashing=True, name="sparse_feature_hash",
                 **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        self.seed = seed
        self.use_hashing = use_hashing
        if schema.equal_schemas(input_record, IdList):
            base, key = IdList, "items"
        elif schema.equal_schemas(input_record, IdScoreList):
            base, key = IdScoreList, "keys"
        else:
            raise AssertionError("Input type must be one of (IdList, IdScoreList)")
        key_meta = getattr(input_record, key).metadata
        self.modulo = modulo or self.extract_hash_size(key_meta)
        metadata = schema.Metadata(categorical_limit=self.modulo, feature_specs=key_meta.feature_specs,
                                   expected_value=key_meta.expected_value)
        with core.NameScope(name):
            self.output_schema = schema.NewRecord(model.net, base)
        getattr(self.output_schema, key).set_metadata(metadata)
        assert self.modulo >= 1, f"Unexpected modulo: {self.modulo}"
        self.tags.update([Tags.CPU_ONLY])    # ids are usually on the CPU, and the ops are CPU-only

    def extract_hash_size(self, metadata):
        if metadata.feature_specs and metadata.feature_specs.desired_hash_size:
            return metadata.feature_specs.desired_hash_size
        if metadata.categorical_limit is not None:
            return metadata.categorical_limit
        raise AssertionError("desired_hash_size or categorical_limit must be set")

    def add_ops(self, net):
        net.Copy(self.input_record.lengths(), self.output_schema.lengths())
        if schema.equal_schemas(self.output_schema, IdList):
            input_blob, output_blob = self.input_record.items(), self.output_schema.items()
        elif schema.equal_schemas(self.output_schema, IdScoreList):
            input_blob, output_blob = self.input_record.keys(), self.output_schema.keys()
            net.Copy(self.input_record.values(), self.output_schema.values())
        else:
            raise NotImplementedError(f"SparseFeatureHash: unexpected output {self.output_schema}")
        if self.use_hashing:
            net.IndexHash(input_blob, output_blob, seed=self.seed, modulo=self.modulo)
        else:
            net.Mod(input_blob, output_blob, divisor=self.modulo, sign_follow_divisor=True)


class MergeIdLists(ModelLayer):
    """Several IdLists (a Struct of them) merged into one, per example."""

    def __init__(self, model, input_record, name="merged"):
        super().__init__(model, name, input_record)
        assert all(schema.equal_schemas(x, IdList) for x in input_record), \
            "Inputs to MergeIdLists should all be IdLists."
        assert all(record.items.metadata is not None for record in self.input_record), \
            "Features without metadata are not supported"
        merge_dim = max(get_categorical_limit(record) for record in self.input_record)
        assert merge_dim is not None, "Unbounded features are not supported"
        self.output_schema = schema.NewRecord(model.net, schema.List(schema.Scalar(
            np.int64, blob=model.net.NextBlob(name), metadata=schema.Metadata(categorical_limit=merge_dim))))

    def add_ops(self, net):
        return net.MergeIdLists(self.input_record.field_blobs(), self.output_schema.field_blobs())


class MapToRange(ModelLayer):
    """Raw keys mapped to indices in [0, max_index), the map growing during training and frozen in eval and
    prediction (unseen keys: 0)."""

    def __init__(self, model, input_record, max_index, name="map_to_range", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert max_index > 0
        assert isinstance(input_record, schema.Scalar)
        self.max_index = max_index
        self.handler = self.create_param(param_name="handler", shape=None,
                                         initializer=("LongIndexCreate", {"max_elements": self.max_index}),
                                         optimizer=model.NoOptim)
        self.output_schema = schema.Struct(
            ("indices", schema.Scalar(np.int64, self.get_next_blob_reference("indices"))),
            ("handler", schema.Scalar(np.void, self.handler)))

    def add_train_ops(self, net):
        keys = self.input_record()
        if self.input_record.field_type().base != np.int64:
            keys = net.Cast(keys, net.NextScopedBlob("indices_before_mapping"), to=core.DataType.INT64)
        indices = net.IndexGet([self.handler, keys], self.output_schema.indices())
        net.StopGradient(indices, indices)

    def add_eval_ops(self, net):
        net.IndexFreeze(self.handler, self.handler)
        self.add_train_ops(net)

    def add_ops(self, net):
        self.add_eval_ops(net)
