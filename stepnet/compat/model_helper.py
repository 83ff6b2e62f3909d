"""Caffe2's ModelHelper: a main net (`net`) and its init net (`param_init_net`), the parameters the layer
helpers create (`params`, weights, biases, computed parameters), their gradients once AddGradientOperators ran
(`param_to_grad`), the argument scope brew passes to helpers, and every operator forwarded to `net`
(`model.Flatten(x)`).

It is also the model object stepnet.builders.rnn builds on (`scope`, `net`, `init_net`, `create_param` taking
initializers as (operator, kwargs) pairs too), which is how compat.rnn_cell reuses stepnet's RNN layers.
"""
from __future__ import annotations

import logging

from ..builders.builder import BlobRef
from ..core.errors import ShapeError, StepnetError, did_you_mean
from ..ops import REGISTRY
from ..ops.base import GradientSlice
from . import core
from .modeling.initializers import Initializer
from .modeling.parameter_info import ParameterInfo, ParameterTags
from .modeling.parameter_sharing import parameter_sharing_context
from .optimizer_context import DEFAULT_OPTIM, OptimizerContext
from .scope import SCOPE, CurrentNameScope

log = logging.getLogger(__name__)

# Ops Caffe2's ModelHelper forwards without a warning (others are forwarded too, with one).
_known_working_ops = [
    "Accuracy", "Adam", "Add", "Adagrad", "SparseAdagrad", "AveragedLoss", "Cast", "Checkpoint", "ConstantFill",
    "Copy", "CopyGPUToCPU", "CopyCPUToGPU", "DequeueBlobs", "EnsureCPUOutput", "ExpandDims", "Flatten",
    "FlattenToVec", "LabelCrossEntropy", "LearningRate", "MakeTwoClass", "MatMul", "NCCLAllreduce", "NHWC2NCHW",
    "PackSegments", "Print", "PRelu", "ReduceFrontSum", "Scale", "ScatterWeightedSum", "Sigmoid",
    "SortedSegmentSum", "Snapshot", "Softmax", "SoftmaxWithLoss", "SquaredL2Distance", "Squeeze", "StopGradient",
    "Summarize", "Tanh", "Transpose", "UnpackSegments", "WeightedSum", "YellowFin",
]


class ParamShapeError(ShapeError, AssertionError):
    """A parameter created again with another shape: a ShapeError, and the AssertionError Caffe2 raises."""


class ModelHelper:
    """A model under construction; param_model=other builds another net over other's parameters."""

    scope = SCOPE   # the (per-thread) name and device scope every compat net uses

    def __init__(self, name=None, init_params=True, allow_not_known_ops=True, skip_sparse_optim=False,
                 param_model=None, arg_scope=None):
        self.name = name or "model"
        self.net = core.Net(self.name)
        if param_model is not None:
            self.param_init_net = param_model.param_init_net
            self.param_to_grad = param_model.param_to_grad
            self.params = param_model.params
            self._parameters_info = param_model._parameters_info
            self._computed_params = param_model._computed_params
        else:
            self.param_init_net = core.Net(self.name + "_init")
            self.param_to_grad = {}
            self.params = []
            self._parameters_info = {}
            self._computed_params = []
        self._param_info_deprecated = []   # add_param_DEPRECATED / param_info's list, by param_id
        self._devices = []
        self.gradient_ops_added = False
        self.grad_map = {}
        self.init_params = init_params
        self.allow_not_known_ops = allow_not_known_ops
        self.skip_sparse_optim = skip_sparse_optim
        self.weights, self.biases = [], []
        self._arg_scope = {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": False}
        self._arg_scope.update(arg_scope or {})

    @property
    def arg_scope(self) -> dict:
        return self._arg_scope

    @property
    def init_net(self):
        return self.param_init_net

    def get_name(self) -> str:
        return self.name

    # ------------------------------------------------------------------------------------- parameters
    def create_param(self, param_name, shape, initializer, tags=None):
        """The parameter blob: a string name gets the current name scope, a BlobReference is used as it is; an
        existing parameter of that name is returned (its shape must agree). initializer: an Initializer, or an
        (operator, kwargs) pair."""
        name = (str(param_name) if isinstance(param_name, BlobRef)
                else parameter_sharing_context.get_parameter_name(param_name))   # the scope, after sharing
        shape = [int(d) for d in shape]
        info = self._parameters_info.get(name)
        if info is not None:
            if info.shape is not None and list(info.shape) != shape:
                raise ParamShapeError(f"parameter {name!r} exists with shape {list(info.shape)}; it cannot be "
                                      f"created again with shape {shape}")
            return info.blob
        if isinstance(initializer, tuple):
            initializer = Initializer(initializer[0], **initializer[1])
        info = initializer.create_param(param_name=core.BlobReference(name), init_net=self.param_init_net,
                                        shape=shape)
        optimizers = OptimizerContext.current()   # a UseOptimizer block's optimizer: by tag, else its default
        for tag in self._tags(tags):
            if optimizers.has_optimizer(tag):
                info.optimizer = optimizers.get_optimizer(tag)
        if not info.optimizer and optimizers.has_optimizer(DEFAULT_OPTIM):
            info.optimizer = optimizers.get_optimizer(DEFAULT_OPTIM)
        self._parameters_info[name] = info
        self.AddParameter(info.blob, tags)
        return info.blob

    def get_param_info(self, param):
        return self._parameters_info.get(str(param))

    def _infer_param_shape(self, param):
        """The `shape` argument of the init-net op writing param (None without one)."""
        for op in self.param_init_net.Proto().op:
            if str(param) in op.output:
                for arg in op.arg:
                    if arg.name == "shape":
                        return list(arg.ints)
        return None

    def _update_param_info_deprecated(self) -> None:
        """The deprecated list: a ParameterInfo for each parameter added since (param_id: its position), and
        every entry's gradient from param_to_grad."""
        if len(self._param_info_deprecated) > len(self.params):
            raise AssertionError("more deprecated parameter infos than parameters")
        for param in self.params[len(self._param_info_deprecated):]:
            if not isinstance(param, core.BlobReference):
                raise ValueError(f"Param {param} must be a BlobReference!")
            self._param_info_deprecated.append(ParameterInfo(
                param_id=len(self._param_info_deprecated), param=param, shape=self._infer_param_shape(param)))
        for info in self._param_info_deprecated:
            info.grad = self.param_to_grad.get(info.name)

    def add_param_DEPRECATED(self, param, key=None, shape=None, length=None):  # noqa: N802 - Caffe2's name
        """Deprecated (use create_param): record the parameter blob `param` and return its ParameterInfo in the
        deprecated list (key: a blob of the net's input record, named by its field; shape: default the init
        net's `shape` argument)."""
        log.warning("add_param method is DEPRECATED")
        if not isinstance(param, core.BlobReference):
            raise ValueError(f"Param {param} must be a BlobReference!")
        self._update_param_info_deprecated()
        self.AddParameter(param)
        record = self.net.input_record()
        if key is not None and record is not None:
            key = record.field_names()[record.field_blobs().index(key)]
        shape = shape if shape is not None else self._infer_param_shape(param)
        self._param_info_deprecated.append(ParameterInfo(param_id=len(self._param_info_deprecated), param=param,
                                                         shape=shape, key=key, length=length))
        return self._param_info_deprecated[-1]

    def param_info(self, grad_type=None, id=None):  # noqa: A002 - Caffe2's name
        """Deprecated (use get_param_info): the ParameterInfo of every parameter, by position; id: the one at
        that position; grad_type: those whose gradient is of that ParameterType ('dense' or 'sparse')."""
        log.info("param_info method is DEPRECATED")
        self._update_param_info_deprecated()
        if id is not None:
            if grad_type is not None:
                raise AssertionError("param_info takes grad_type or id, not both")
            info = self._param_info_deprecated[id]
            if info.param_id != id:
                raise AssertionError(f"parameter info {id} has param_id {info.param_id}")
            return info
        if grad_type is not None:
            return [info for info in self._param_info_deprecated if info.grad_type() == grad_type]
        return self._param_info_deprecated

    @staticmethod
    def _tags(tags) -> set:
        return set(tags) if isinstance(tags, (list, tuple, set)) else {tags} if tags else set()

    def AddParameter(self, param, tags=None) -> None:
        """Record a parameter blob (COMPUTED_PARAM: a computed one; WEIGHT / BIAS: also a weight / bias)."""
        if not isinstance(param, core.BlobReference):
            param = core.BlobReference(str(param), self.param_init_net)
        tags = self._tags(tags)
        (self._computed_params if ParameterTags.COMPUTED_PARAM in tags else self.params).append(param)
        if ParameterTags.WEIGHT in tags:
            self.weights.append(param)
        if ParameterTags.BIAS in tags:
            self.biases.append(param)

    @staticmethod
    def _namescope(namescope) -> str:
        if namescope is None:
            return CurrentNameScope()
        return namescope if namescope == "" or namescope.endswith("/") else namescope + "/"

    def GetParams(self, namescope=None, top_scope=False) -> list:
        """The parameters under namescope (default: the current name scope; '' for all)."""
        scope = self._namescope(namescope)
        return [p for p in self.params if _name_scope_of(p).startswith(scope)]

    def GetComputedParams(self, namescope=None) -> list:
        scope = self._namescope(namescope)
        return [p for p in self._computed_params if _name_scope_of(p).startswith(scope)]

    def GetAllParams(self, namescope=None) -> list:
        return self.GetParams(namescope) + self.GetComputedParams(namescope)

    def _Validate(self) -> list:
        names = [str(p) for p in self.params]
        return sorted({n for n in names if names.count(n) > 1})

    def Validate(self) -> None:
        dupes = self._Validate()
        if dupes:
            raise StepnetError(f"Duplicate params: {dupes}")

    # ------------------------------------------------------------------------------------- gradients
    def AddGradientOperators(self, *args, **kwargs) -> dict:
        """The backward pass of the main net (once); fills param_to_grad."""
        if self.gradient_ops_added:
            raise RuntimeError("You cannot run AddGradientOperators twice.")
        self.Validate()
        self.gradient_ops_added = True
        self.grad_map = self.net.AddGradientOperators(*args, **kwargs)
        self.param_to_grad = self.get_param_to_grad(self.params)
        for param, grad in self.param_to_grad.items():
            info = self.get_param_info(param)
            if info is None:
                info = self._parameters_info[str(param)] = ParameterInfo(param_id=None, param=param)
            info.grad = grad
        return self.grad_map

    def get_param_to_grad(self, params) -> dict:
        if not self.gradient_ops_added:
            raise RuntimeError("You need to run AddGradientOperators first.")
        return {p: self.grad_map[str(p)] for p in params if str(p) in self.grad_map}

    def GetOptimizationParamInfo(self, params=None) -> list:
        """ParameterInfo of each parameter that has a gradient (params: a subset)."""
        if not self.gradient_ops_added:
            raise RuntimeError("Need to call AddGradientOperators first")
        param_to_grad = self.get_param_to_grad(params) if params else self.param_to_grad
        return [self.get_param_info(p) for p, g in param_to_grad.items()
                if not (self.skip_sparse_optim and isinstance(g, GradientSlice))]

    # ------------------------------------------------------------------------------------- nets
    def Proto(self):
        return self.net.Proto()

    def InitProto(self):
        return self.param_init_net.Proto()

    def RunAllOnGPU(self, *args, **kwargs) -> None:
        self.param_init_net.RunAllOnGPU(*args, **kwargs)
        self.net.RunAllOnGPU(*args, **kwargs)

    def CreateDB(self, blob_out, db, db_type, **kwargs):
        return self.param_init_net.CreateDB([], blob_out, db=db, db_type=db_type, **kwargs)

    def TensorProtosDBInput(self, unused_blob_in, blob_out, batch_size, db, db_type, **kwargs):
        if len(unused_blob_in):
            raise ValueError("You cannot pass reader to model_helper.TensorProtosDBInput; use "
                             "model.net.TensorProtosDBInput instead to create the op.")
        from .helpers.db_input import db_input
        return db_input(self, blob_out, batch_size, db, db_type, **kwargs)

    def GetDevices(self) -> list:
        if not self._devices:
            raise RuntimeError("Use data_parallel_model to run model on multiple GPUs.")
        return self._devices

    def __getattr__(self, op_type):
        """Every operator, added to `net` (with a logged warning for ops Caffe2 did not list as safe)."""
        if op_type.startswith("_") or op_type not in REGISTRY:
            raise AttributeError(f"Method {op_type} is not a registered operator"
                                 f"{did_you_mean(op_type, list(REGISTRY))}")
        if op_type not in _known_working_ops:
            if not self.allow_not_known_ops:
                raise AttributeError(f"Operator {op_type} is not known to be safe")
            log.warning("You are creating an op that the ModelHelper does not recognize: %s.", op_type)
        return getattr(self.net, op_type)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_known_working_ops))


def _name_scope_of(blob) -> str:
    name = str(blob)
    return name[:name.rfind("/") + 1]


def ExtractPredictorNet(net_proto, input_blobs, output_blobs, device=None, renames=None, disabled_inputs=None):
    """A prediction net from a training net: the ops from the first one reading an input (StopGradient aside) to
    the last one writing an output, kept where everything they read is known (the net's external inputs, the
    inputs, and what kept ops write; disabled_inputs are not known), RecurrentNetwork without its backward step
    net; blobs renamed by `renames`, ops put on `device` when given. net_proto is not changed. Returns
    (the core.Net, the external inputs it needs besides the inputs: its parameters)."""
    from ..graph.view import copy_op

    renames = {str(k): str(v) for k, v in (renames or {}).items()}
    orig_inputs, orig_outputs = set(net_proto.external_input), set(net_proto.external_output)
    inputs, outputs = [str(b) for b in input_blobs], {str(b) for b in output_blobs}
    known = (orig_inputs | set(inputs)) - {str(b) for b in disabled_inputs or ()}
    ext_in, ext_out = dict.fromkeys(inputs), dict.fromkeys(sorted(outputs))
    ops = list(net_proto.op)
    starts = [j for j, op in enumerate(ops) if set(inputs) & set(op.input) and op.type != "StopGradient"]
    ends = [j for j, op in enumerate(ops) if outputs & set(op.output)]
    if not starts:
        raise ValueError(f"ExtractPredictorNet: no op of net {net_proto.name!r} reads the inputs {sorted(inputs)}")
    if not ends:
        raise ValueError(f"ExtractPredictorNet: no op of net {net_proto.name!r} writes the outputs {sorted(outputs)}")

    def rename(names) -> list:
        return [renames.get(b, b) for b in names]

    def place(op) -> None:
        if device is not None:
            op.device_option.device_type = device.device_type
            op.device_option.device_id = device.device_id

    kept = []
    for op in ops[min(starts):max(ends) + 1]:
        if not known.issuperset(op.input):
            log.debug("ExtractPredictorNet: op %s skipped, it reads unknown blobs %s", op.type,
                      set(op.input) - known)
            continue
        if any(a.name == "is_test" and a.i == 0 for a in op.arg):
            raise ValueError(f"ExtractPredictorNet: op {op.type} {list(op.output)} has is_test=0: extract a "
                             "predictor from the test model, not the training one")
        op = copy_op(op)
        if op.type == "RecurrentNetwork":
            for arg in op.arg:
                if arg.name == "backward_step_net":
                    arg.ClearField("n")
                elif arg.name == "step_net":
                    for step_op in arg.n.op:
                        step_op.input[:], step_op.output[:] = rename(step_op.input), rename(step_op.output)
                        place(step_op)
                    arg.n.external_input[:] = rename(arg.n.external_input)
                    arg.n.external_output[:] = rename(arg.n.external_output)
                    ext_in.update(dict.fromkeys(b for b in arg.n.external_input if b in orig_inputs))
        place(op)
        kept.append(op)
        known.update(op.output)
        ext_in.update(dict.fromkeys(b for b in op.input if b in orig_inputs))
        ext_out.update(dict.fromkeys(b for b in op.output if b in orig_outputs))
    for op in kept:
        op.input[:], op.output[:] = rename(op.input), rename(op.output)
    predict_net = core.Net(net_proto.name + "_predict")
    proto = predict_net.Proto()
    proto.op.extend(kept)
    proto.external_input.extend(rename(ext_in))
    proto.external_output.extend(rename(ext_out))
    return predict_net, sorted(set(proto.external_input) - set(rename(inputs)))
