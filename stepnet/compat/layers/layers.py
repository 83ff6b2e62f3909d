"""The base of Caffe2's layer-model API: ModelLayer (a meta-operator owning its parameters, whose operators are
added per instantiation context: training, eval, prediction), LayerParameter, the layer registry, and the
helpers on sparse records (IdList, IdScoreList, get_key, set_request_only, ...)."""
from __future__ import annotations

import logging
from collections import namedtuple

import numpy as np

from ... import caffe2_pb2
from .. import core, schema, scope, utils, workspace
from .tags import TagContext

logger = logging.getLogger(__name__)

IdList = schema.List(np.int64)
IdScoreList = schema.Map(np.int64, np.float32)


def get_key(record):
    """The id field of an IdList (values) or IdScoreList (values:keys) record; it must carry metadata."""
    if schema.equal_schemas(record, IdList):
        key = "values"
    elif schema.equal_schemas(record, IdScoreList, check_field_types=False):
        key = "values:keys"
    else:
        raise NotImplementedError(f"Not implemented for {record}")
    assert record[key].metadata is not None, f"Blob {record[key]()} doesn't have metadata"
    return record[key]


def get_categorical_limit(record):
    return get_key(record).metadata.categorical_limit


def get_avg_length(record):
    return record["lengths"].metadata.expected_value


def set_request_only(field) -> None:
    """Mark every scalar of field as a request-only feature (keeping its other metadata)."""
    for scalar in field.all_scalars():
        meta = scalar.metadata
        limit = meta.categorical_limit if meta else None
        expected = meta.expected_value if meta else None
        specs = meta.feature_specs if meta else None
        if specs:
            new_specs = schema.FeatureSpec(
                feature_type=specs.feature_type, feature_names=specs.feature_names,
                feature_ids=specs.feature_ids, feature_is_request_only=True,
                desired_hash_size=specs.desired_hash_size)
        else:
            new_specs = schema.FeatureSpec(feature_is_request_only=True)
        if not np.issubdtype(scalar.field_type(), np.integer):
            assert limit is None, "categorical_limit shouldn't be set for no-integer field"
        scalar.set_metadata(schema.Metadata(categorical_limit=limit, expected_value=expected,
                                            feature_specs=new_specs))


class InstantiationContext:
    """The nets a layer can be instantiated in."""
    ACCUMULATE_PRED = "accumulate_pred"   # accumulates predictions, labels and weights (e.g. for calibration)
    EVAL = "eval"
    PREDICTION = "prediction"
    TRAINING = "training"


_LAYER_REGISTRY: dict = {}


def register_layer(name, layer) -> None:
    assert name not in _LAYER_REGISTRY, f"{name} already exists"
    _LAYER_REGISTRY[name] = layer


def layer_exists(name) -> bool:
    return name in _LAYER_REGISTRY


def get_layer_class(name):
    return _LAYER_REGISTRY[name]


def create_layer(layer_name, *args, **kwargs):
    return _LAYER_REGISTRY[layer_name](*args, **kwargs)


LayerPsParam = namedtuple("LayerPsParam", ["sparse_key", "average_length"])


class LayerParameter:
    """A parameter blob of a layer with its initializer op (its shape is read from the op), optimizer,
    parameter-server hints and regularizer."""

    def __init__(self, parameter=None, optimizer=None, initializer=None, ps_param=None, regularizer=None):
        assert isinstance(parameter, core.BlobReference), f"expect {parameter} to be a blob reference"
        self._shape = None          # set before the initializer, which sets it
        self.parameter = parameter
        self.optimizer = optimizer
        self.initializer = initializer
        self.ps_param = ps_param
        self.regularizer = regularizer

    @property
    def initializer(self):
        return self._initializer

    @initializer.setter
    def initializer(self, op):
        assert op is None or core.IsOperator(getattr(op, "type", None)), \
            f"initializer expects an operator, got type: {type(op)}"
        self._initializer = op
        if op is not None:
            self.shape = self._infer_shape_from_initializer()

    @property
    def shape(self):
        return self._shape

    @shape.setter
    def shape(self, shape):
        assert self.shape is None or self.shape == shape, \
            f"inconsistent shape for layer parameter: {self}, expect: {self.shape}, but got {shape}"
        self._shape = shape

    def _infer_shape_from_initializer(self):
        for arg in self.initializer.arg:
            if arg.name == "shape":
                return list(arg.ints)
        # no shape argument: run the initializer in a scratch workspace and look
        with workspace.WorkspaceGuard("model_init_by_loading_params"):
            try:
                net = core.Net("shape_checker")
                net.Proto().op.extend([self.initializer])
                shape_blob = net.NextScopedBlob(self.parameter + "_shape")
                net.Shape([self.parameter], shape_blob)
                workspace.RunNetOnce(net)
                return workspace.FetchBlob(shape_blob).tolist()
            except RuntimeError as exc:
                logger.warning("Cannot infer the shape of blob %s from operator %s: %s",
                               self.parameter, self.initializer.type, exc)
                return None
            finally:
                workspace.ResetWorkspace()

    def __str__(self):
        return str(self.parameter)


def is_request_only_scalar(scalar) -> bool:
    metas = scalar.field_metadata()
    if not metas:
        return False
    return all(m and m.feature_specs and getattr(m.feature_specs, "feature_is_request_only", False)
               for m in metas)


class ModelLayer:
    """A layer of a LayerModelHelper: inputs and outputs are schema records; add_ops (prediction),
    add_eval_ops and add_train_ops (by default the same ops) put its operators into a net, add_init_params
    its parameters' initializers into an init net. Tags (from the arguments and the current TagContext)
    decide which nets it is instantiated in."""

    def __init__(self, model, prefix, input_record, predict_input_record_fields=None, tags=None, **kwargs):
        self.name = model.next_layer_name(prefix)
        self.model = model
        self.kwargs = kwargs
        self._input_record = input_record
        if predict_input_record_fields:
            if not isinstance(predict_input_record_fields, list):
                predict_input_record_fields = [predict_input_record_fields]
            self._predict_input_record = self._input_record[predict_input_record_fields]
        else:
            self._predict_input_record = None
        scalars = input_record.all_scalars()
        self.request_only = bool(scalars) and all(is_request_only_scalar(s) for s in scalars)
        self._output_schema = None
        self._predict_output_schema = None
        self.eval_output_schema = None
        self.tags = set(tags or [])
        self.tags.update(TagContext.current().tags)
        self.params = []
        self._export_output_for_metrics = False
        self._export_params_for_metrics = False

    def get_type(self) -> str:
        return type(self).__name__

    def _check_output_schema(self) -> None:
        assert self._output_schema is not None, "Schema is not initialized"
        assert (self._predict_output_schema is None
                or schema.is_schema_subset(self._predict_output_schema, self._output_schema)), \
            "predict_output_schema is not a subset of the output_schema"

    @property
    def predict_input_record(self):
        return self._predict_input_record or self._input_record

    @property
    def input_record(self):
        return self._input_record

    @property
    def predict_output_schema(self):
        self._check_output_schema()
        return self._predict_output_schema or self._output_schema

    @predict_output_schema.setter
    def predict_output_schema(self, output_schema):
        assert self._predict_output_schema is None
        self._predict_output_schema = output_schema

    @property
    def output_schema(self):
        if self.request_only:
            set_request_only(self._output_schema)
        self._check_output_schema()
        return self._output_schema

    @output_schema.setter
    def output_schema(self, output_schema):
        assert self._output_schema is None
        self._output_schema = output_schema

    def get_parameters(self) -> list:
        return self.params

    def get_fp16_compatible_parameters(self) -> list:
        """The parameters that can be converted to fp16."""
        return []

    def get_memory_usage(self) -> int:
        return 0

    def add_init_params(self, init_net) -> None:
        """Add the parameters' initializer ops to init_net (in the current device scope; an op init_net
        already has is not added twice)."""
        device = scope.CurrentDeviceScope()
        for param in self.params:
            init_op = param.initializer
            if not init_op:
                continue
            if not init_op.HasField("device_option") and device:
                init_op = caffe2_pb2.OperatorDef()
                init_op.CopyFrom(param.initializer)
                init_op.device_option.CopyFrom(device)
            if any(utils.OpAlmostEqual(op, init_op, "debug_info") for op in init_net.Proto().op):
                continue
            init_net.Proto().op.extend([init_op])

    def create_param(self, param_name, shape, initializer, optimizer, ps_param=None, regularizer=None):
        """A parameter '<layer name>/<param_name>' (after parameter sharing), recorded in self.params."""
        with scope.NameScope(self.name, reset=True):
            param = self.model.create_param(param_name=param_name, shape=shape, initializer=initializer,
                                            optimizer=optimizer, ps_param=ps_param, regularizer=regularizer)
            assert all(param.parameter != p.parameter for p in self.params), \
                f"parameter {param.parameter} created twice in layer {self.name}"
            self.params.append(param)
            return param.parameter

    def get_next_blob_reference(self, name):
        with scope.NameScope(self.name, reset=True):
            return self.model.net.NextScopedBlob(name)

    def add_operators(self, net, init_net=None, context=InstantiationContext.TRAINING) -> None:
        """Add the ops of `context` to net (inside the layer's name scope) and, when init_net is given, the
        parameters' initializers to it (training needs one)."""
        with scope.NameScope(self.name):
            if context not in (InstantiationContext.PREDICTION, InstantiationContext.EVAL,
                               InstantiationContext.ACCUMULATE_PRED):
                assert init_net, "Only prediction and eval context don't need init_net"
            if init_net:
                self.add_init_params(init_net)
            if context == InstantiationContext.TRAINING:
                self.add_train_ops(net)
            elif context == InstantiationContext.EVAL:
                self.add_eval_ops(net)
            elif context == InstantiationContext.ACCUMULATE_PRED:
                self.add_ops_to_accumulate_pred(net)
            else:
                self.add_ops(net)
            if (context in (InstantiationContext.TRAINING, InstantiationContext.EVAL)
                    and self._export_params_for_metrics):
                self.add_param_copy_operators(net)

    def add_ops(self, net):
        """The prediction ops."""
        raise NotImplementedError

    def add_eval_ops(self, net):
        self.add_ops(net)

    def add_train_ops(self, net):
        self.add_eval_ops(net)

    def add_ops_to_accumulate_pred(self, net):
        self.add_eval_ops(net)

    def add_param_copy_operators(self, net) -> None:
        for param in self.params:
            copy_ref = self.model.metrics_schema[str(param.parameter)]
            net.Copy([param.parameter], copy_ref.field_blobs())

    def export_output_for_metrics(self) -> None:
        self._export_output_for_metrics = True
        self.model.add_metric_field(self.name + "/output", self.output_schema)

    def export_params_for_metrics(self) -> None:
        self._export_params_for_metrics = True
        for param in self.params:
            copy_ref = self.get_next_blob_reference(str(param).split("/")[-1] + "_copy")
            self.model.add_metric_field(str(param.parameter), copy_ref)
