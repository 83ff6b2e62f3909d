"""Caffe2's LayerModelHelper: a model built from layers (stepnet.compat.layers) rather than operators. Each
layer owns its parameters and can be instantiated in several nets (training, eval, prediction: see
layer_model_instantiator); `model.FC(record, 2)` creates a registered layer, `model.Relu(record, 1)` wraps
an operator as a Functional layer. The model keeps the input, trainer-extra, output, loss and metrics
schemas, global constants (ONE, ZERO, ...), and each parameter's optimizer and regularizer."""
from __future__ import annotations

import copy
import logging

import numpy as np

from .. import caffe2_pb2
from . import core, model_helper, schema, scope, utils
from .layers import layers
from .modeling.net_modifier import NetModifier
from .modeling.parameter_info import ParameterInfo
from .modeling.parameter_sharing import parameter_sharing_context
from .optimizer import get_param_device
from .regularizer import Regularizer

logger = logging.getLogger(__name__)


def _given_tensor_fill_type(array: np.ndarray) -> str:
    if array.dtype == np.int32:
        return "GivenTensorIntFill"
    if array.dtype == np.int64:
        return "GivenTensorInt64Fill"
    if array.dtype.kind in "USO":
        return "GivenTensorStringFill"
    if array.dtype == np.bool_:
        return "GivenTensorBoolFill"
    return "GivenTensorFill"


class LayerModelHelper(model_helper.ModelHelper):
    """A model of layers over input_feature_schema (the features) and trainer_extra_schema (labels, weights,
    ...): both get blobs of self.net unless keep_blobs."""

    def __init__(self, name, input_feature_schema, trainer_extra_schema, keep_blobs=False):
        super().__init__(name=name)
        self._layer_names: set = set()
        self._layers: list = []
        self._param_to_shape: dict = {}
        self._seed = None
        self._sequence_seed = True
        self.param_to_optim: dict = {}
        self.param_to_reg: dict = {}
        self._default_optimizer = None
        self._loss = None
        self._output_schema = None
        self._post_grad_net_modifiers: list = []
        self._final_net_modifiers: list = []
        self._breakdown_map = None
        if keep_blobs:
            self._input_feature_schema = input_feature_schema.clone()
            self._trainer_extra_schema = trainer_extra_schema.clone()
        else:
            self._input_feature_schema = schema.NewRecord(self.net, input_feature_schema)
            self._trainer_extra_schema = schema.NewRecord(self.net, trainer_extra_schema)
        self._metrics_schema = schema.Struct()
        self._preproc_output_schema = None
        self._init_global_constants()
        self.param_init_net = self.create_init_net("param_init_net")
        self._initialize_params = True

    def clear_output_schema(self) -> None:
        self._output_schema = None

    def set_initialize_params(self, initialize_params: bool) -> None:
        self._initialize_params = initialize_params

    def add_metric_field(self, name, value) -> None:
        assert name not in self._metrics_schema.fields, f"Try to add metric field twice: {name}"
        self._metrics_schema = self._metrics_schema + schema.Struct((name, value))

    # ------------------------------------------------------------------------------------- global constants
    @staticmethod
    def _get_global_constant_initializer_op(blob_name, array=None, dtype=None, initializer=None):
        """The op filling a constant: a GivenTensor*Fill of `array`, or initializer(blob_name)."""
        if array is not None:
            assert initializer is None, "Only one from array and initializer should be specified"
            array = np.array(array) if dtype is None else np.array(array, dtype=dtype)
            op_type = _given_tensor_fill_type(array)

            def initializer(blob_name):
                return core.CreateOperator(op_type, [], blob_name, shape=array.shape,
                                           values=array.flatten().tolist())
        else:
            assert initializer is not None, "a global constant needs an array or an initializer"
        return initializer(blob_name)

    def add_global_constant(self, name, array=None, dtype=None, initializer=None):
        """A constant blob (filled by every init net create_init_net makes); its blob name."""
        assert isinstance(name, str), "name should be a string as we are using it as map key"
        assert name not in self.global_constants, f"{name} already added in global_constants"
        blob_name = self.net.NextBlob(name)
        self.global_constants[name] = blob_name
        op = self._get_global_constant_initializer_op(blob_name, array, dtype, initializer)
        assert blob_name not in self.global_constant_initializers, \
            f"there is already a initializer op associated with blob {blob_name}"
        self.global_constant_initializers[blob_name] = op
        return blob_name

    def maybe_add_global_constant(self, name, *args, **kwargs):
        """add_global_constant, or the existing constant of that name (its initializer must be the same)."""
        if name in self.global_constants:
            blob_name = self.global_constants[name]
            op = self._get_global_constant_initializer_op(blob_name, *args, **kwargs)
            previous = self.global_constant_initializers[blob_name]
            assert utils.OpAlmostEqual(op, previous, "debug_info"), \
                f"conflict initializers for global constant {blob_name}, previous {op}, now {previous}"
            return blob_name
        return self.add_global_constant(name, *args, **kwargs)

    def _init_global_constants(self) -> None:
        self.global_constants: dict = {}
        self.global_constant_initializers: dict = {}
        self.add_global_constant("ONE", 1.0)
        self.add_global_constant("ZERO", 0.0)
        self.add_global_constant("ZERO_RANGE", [0, 0], dtype="int32")

    def _add_global_constants(self, init_net) -> None:
        for op in self.global_constant_initializers.values():
            init_net.Proto().op.extend([op])

    def create_init_net(self, name):
        """A new net that fills the global constants."""
        init_net = core.Net(name)
        self._add_global_constants(init_net)
        return init_net

    # ------------------------------------------------------------------------------------- parameters
    def _validate_param_shape(self, param_name, shape) -> None:
        if param_name in self._param_to_shape and shape != self._param_to_shape[param_name]:
            raise ValueError(
                "Got inconsistent shapes between shared parameters when trying to map a blob in scope "
                f"{scope.CurrentNameScope()} to {param_name}. ref_shape :  {self._param_to_shape[param_name]}, "
                f"shape : {shape}")

    def create_param(self, param_name, shape, initializer, optimizer=None, ps_param=None, regularizer=None):
        """A LayerParameter: a string name is resolved in the current name scope after parameter sharing;
        initializer is (op type,) or (op type, kwargs), its op gets `shape`."""
        if isinstance(param_name, core.BlobReference):
            param_name = str(param_name)
        elif isinstance(param_name, str):
            param_name = parameter_sharing_context.get_parameter_name(param_name)
        else:
            raise TypeError(f"Unsupported type for param_name: {type(param_name).__name__}")
        param_blob = core.BlobReference(param_name)
        if len(initializer) == 1:
            init_op_args = {}
        else:
            assert len(initializer) == 2, f"initializer must be (op type,) or (op type, kwargs): {initializer}"
            init_op_args = copy.deepcopy(initializer[1])
        if shape is not None:
            assert "shape" not in init_op_args, "shape given both as argument and in the initializer"
            init_op_args["shape"] = shape
        init_op = (core.CreateOperator(initializer[0], [], param_blob, **init_op_args)
                   if self._initialize_params else None)
        param = layers.LayerParameter(parameter=param_blob, initializer=init_op, optimizer=optimizer,
                                      ps_param=ps_param, regularizer=regularizer)
        self._validate_param_shape(param_name, shape)
        self._param_to_shape[param_name] = shape
        return param

    def next_layer_name(self, prefix) -> str:
        """prefix in the current name scope, made unique among the model's layers ('fc', 'fc_auto_0', ...)."""
        base = core.ScopedName(prefix)
        name, index = base, 0
        while name in self._layer_names:
            name, index = f"{base}_auto_{index}", index + 1
        self._layer_names.add(name)
        return name

    def add_layer(self, layer):
        """Record the layer and its parameters, add its training ops to self.net (so that errors show at
        once); its output schema."""
        self._layers.append(layer)
        for param in layer.get_parameters():
            assert isinstance(param.parameter, core.BlobReference)
            self.param_to_optim[str(param.parameter)] = param.optimizer or self.default_optimizer
            self.params.append(param.parameter)
            if isinstance(param, layers.LayerParameter):
                self.param_to_reg[param.parameter] = param.regularizer
            elif isinstance(param, ParameterInfo):
                logger.info("regularization is unsupported for ParameterInfo object")
            else:
                raise ValueError(f"unknown object type besides ParameterInfo and LayerParameter: {param}")
        layer.add_operators(self.net, self.param_init_net)
        return layer.output_schema

    def get_parameter_blobs(self) -> list:
        return [param.parameter for layer in self._layers for param in layer.get_parameters()]

    def add_post_grad_net_modifiers(self, modifier) -> None:
        assert modifier not in self._post_grad_net_modifiers, \
            f"{modifier} is already in {self._post_grad_net_modifiers}"
        assert isinstance(modifier, NetModifier), f"{modifier} has to be a NetModifier instance"
        self._post_grad_net_modifiers.append(modifier)

    def add_final_net_modifiers(self, modifier) -> None:
        assert modifier not in self._final_net_modifiers, f"{modifier} is already in {self._final_net_modifiers}"
        assert isinstance(modifier, NetModifier), f"{modifier} has to be a NetModifier instance"
        self._final_net_modifiers.append(modifier)

    @property
    def seed(self):
        return self._seed

    @property
    def sequence_seed(self):
        return self._sequence_seed

    def store_seed(self, seed, sequence_seed=True) -> None:
        """The random seed apply_seed gives a net's ops (op i gets seed + i with sequence_seed)."""
        self._seed = seed
        self._sequence_seed = sequence_seed

    def apply_seed(self, net) -> None:
        if self._seed:
            net.set_rand_seed(self._seed, self._sequence_seed)

    @property
    def default_optimizer(self):
        return self._default_optimizer

    @default_optimizer.setter
    def default_optimizer(self, optimizer):
        self._default_optimizer = optimizer

    @property
    def input_feature_schema(self):
        return self._input_feature_schema

    @property
    def trainer_extra_schema(self):
        return self._trainer_extra_schema

    @property
    def metrics_schema(self):
        """The model outputs used for metric reporting (appended to the output schema in training/eval)."""
        return self._metrics_schema

    @property
    def output_schema(self):
        assert self._output_schema is not None, "the model has no output schema"
        return self._output_schema

    @output_schema.setter
    def output_schema(self, value):
        assert self._output_schema is None, "the model's output schema is already set"
        self._output_schema = value

    @property
    def preproc_output_schema(self):
        assert self._preproc_output_schema is not None
        return self._preproc_output_schema

    @preproc_output_schema.setter
    def preproc_output_schema(self, value):
        assert self._preproc_output_schema is None
        self._preproc_output_schema = value

    @property
    def loss(self):
        assert self._loss is not None, "the model has no loss"
        return self._loss

    @loss.setter
    def loss(self, loss):
        assert self._loss is None, "the model's loss is already set"
        self._loss = loss

    def has_loss(self) -> bool:
        return self._loss is not None

    def add_loss(self, loss, name="unnamed") -> None:
        """Add a loss (Scalar or Struct) to the loss Struct, under name (made unique: name_auto_0, ...)."""
        assert loss is not None, "Added loss should not be None"
        assert isinstance(loss, (schema.Scalar, schema.Struct)), "Added loss should be a scalar or a struct"
        if self._loss is None:
            self._loss = schema.Struct((name, loss))
            return
        prefix, index = name, 0
        while prefix in self._loss:
            prefix, index = f"{name}_auto_{index}", index + 1
        self._loss = self._loss + schema.Struct((prefix, loss))

    def add_output_schema(self, name, value) -> None:
        assert value is not None, f"Added output schema {name} should not be None"
        assert isinstance(value, (schema.Scalar, schema.Struct)), \
            f"Added output schema {name} should be a scalar or a struct.\nNow it is {type(value)}."
        if self._output_schema is None:
            self._output_schema = schema.Struct((name, value))
        else:
            assert name not in self._output_schema.fields, f"Output Schema Field {name} already exists"
            self._output_schema = self._output_schema + schema.Struct((name, value))

    def add_trainer_extra_schema(self, trainer_extra_schema) -> None:
        self._trainer_extra_schema += schema.NewRecord(self.net, trainer_extra_schema)

    def __getattr__(self, layer):
        """model.<Layer>(...): a registered layer; model.<Operator>(...) or model.FunctionalLayer<Op>(...):
        the operator as a Functional layer."""
        if layer.startswith("__"):
            raise AttributeError(layer)
        if layers.layer_exists(layer):
            def make_layer(*args, **kwargs):
                return self._add_new_layer(layers.create_layer(layer, self, *args, **kwargs), kwargs)
            return make_layer
        if core.IsOperator(layer) or layer.startswith("FunctionalLayer"):
            op_type = layer if core.IsOperator(layer) else layer[len("FunctionalLayer"):]

            def make_functional(*args, **kwargs):
                def apply_operator(net, in_record, out_record, **op_kwargs):
                    getattr(net, op_type)(in_record.field_blobs(), out_record.field_blobs(), **op_kwargs)
                kwargs.setdefault("name", op_type)
                new_layer = layers.create_layer("Functional", self, *args, function=apply_operator, **kwargs)
                return self._add_new_layer(new_layer, kwargs)
            return make_functional
        raise ValueError(f"Trying to create non-registered layer: {layer}")

    def _add_new_layer(self, new_layer, kwargs):
        if kwargs.get("output_to_metrics", False):
            new_layer.export_output_for_metrics()
        if kwargs.get("params_to_metrics", False):
            new_layer.export_params_for_metrics()
        return self.add_layer(new_layer)

    @property
    def layers(self) -> list:
        return self._layers

    # ------------------------------------------------------------------------------------- training
    def apply_regularizers_on_loss(self, train_net, train_init_net, blob_to_device=None) -> None:
        """Add each loss regularizer's term to the loss (under its blob's name)."""
        for param, regularizer in self.param_to_reg.items():
            if regularizer is None or regularizer.apply_after_optimizer:
                continue
            assert isinstance(regularizer, Regularizer)
            added = regularizer(train_net, train_init_net, param)
            self.add_loss(schema.Scalar(blob=added), str(added))

    def apply_regularizers_after_optimizer(self, train_net, train_init_net, grad_map, blob_to_device=None):
        for param, regularizer in self.param_to_reg.items():
            if regularizer is None or not regularizer.apply_after_optimizer:
                continue
            assert isinstance(regularizer, Regularizer)
            regularizer(train_net, train_init_net, param, grad_map.get(str(param)))

    def apply_post_grad_net_modifiers(self, trainer_net, trainer_init_net, grad_map, blob_to_device=None):
        param_grad_map = {p: grad_map[p] for p in self.param_to_optim if p in grad_map}
        for modifier in self._post_grad_net_modifiers:
            modifier(trainer_net, trainer_init_net, param_grad_map, blob_to_device=blob_to_device)

    def apply_final_net_modifiers(self, trainer_net, trainer_init_net, grad_map, blob_to_device=None):
        for modifier in self._final_net_modifiers:
            modifier(trainer_net, trainer_init_net, grad_map, blob_to_device=blob_to_device)

    def apply_optimizers(self, train_net, train_init_net, grad_map, blob_to_device=None) -> None:
        """Run each parameter's optimizer (on the parameter's device; None gradient where it has none)."""
        cpu = core.DeviceOption(caffe2_pb2.CPU)
        blob_to_device = blob_to_device or {}
        for param, optimizer in self.param_to_optim.items():
            assert optimizer is not None, "default optimizer must have been set in add_layer"
            grad = grad_map.get(str(param))
            device = get_param_device(param, grad, param_to_device=blob_to_device, default_device=cpu)
            with core.DeviceScope(device):
                optimizer(train_net, train_init_net, param, grad)

    def _GetOne(self):
        return self.global_constants["ONE"]

    def NoOptim(self, *args, **kwargs):
        """The optimizer that does nothing."""

    @property
    def breakdown_map(self):
        return self._breakdown_map

    @breakdown_map.setter
    def breakdown_map(self, breakdown_map):
        assert isinstance(breakdown_map, dict)
        assert all(isinstance(k, str) for k in breakdown_map)
        assert sorted(breakdown_map.values()) == list(range(len(breakdown_map)))
        self._breakdown_map = breakdown_map
