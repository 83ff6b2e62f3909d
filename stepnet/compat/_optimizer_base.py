"""The base of Caffe2's optimizer classes (stepnet.compat.optimizer re-exports everything here): Optimizer, with
the learning-rate machinery every optimizer shares, and the SGD family (SgdOptimizer, and the mixed-precision
MultiPrecisionSgdOptimizer and FP16SgdOptimizer).

As in Caffe2: one int64 `optimizer_iteration` (on the CPU, +1 per run by AtomicIter) drives a LearningRate op per
optimizer (`<Optimizer>_<k>_lr_cpu`, or `_gpu<id>` under a GPU device scope; k counts instances in the process)
with `base_lr` negated for descent and any LearningRate policy and its arguments (`policy="step", stepsize=,
gamma=`, ...).
"""
from __future__ import annotations

from collections import defaultdict, namedtuple

from ..ops.base import GradientSlice
from . import core
from .scope import CurrentDeviceScope

_OPTIMIZER_ITERATION_NAME = "optimizer_iteration"
_LEARNING_RATE_INJECTION = "lr_injection"
_optimizer_instance_count: dict = defaultdict(int)
AuxOptimizerParams = namedtuple("AuxOptimizerParams", ["local", "shared"])   # local: one per parameter


class Optimizer:
    """Adds the update of one parameter per call: optimizer(net, param_init_net, param_info)."""

    def __init__(self):
        self._instance_num = _optimizer_instance_count[type(self).__name__]
        _optimizer_instance_count[type(self).__name__] += 1
        self._lr_multiplier = None
        self._lr_multiplier_on_gpu = False
        self._aux_params = AuxOptimizerParams(local=[], shared=[])

    def __call__(self, net, param_init_net, param, grad=None):
        if grad is not None:
            from .modeling.parameter_info import ParameterInfo
            param = ParameterInfo(param_id=None, param=core.BlobReference(str(param)), grad=grad)
        if param.grad is None:
            raise ValueError(f"parameter {param.name!r} has no gradient")
        self._run(net, param_init_net, param)

    def _run(self, net, param_init_net, param_info):
        raise NotImplementedError

    def get_cpu_blob_name(self, base_str: str, node_name: str = "") -> str:
        """`<Optimizer>_<k>_<base_str><node_name>_cpu`: this optimizer instance's blob on a CPU."""
        return f"{type(self).__name__}_{self._instance_num}_{base_str}{node_name}_cpu"

    def get_gpu_blob_name(self, base_str: str, gpu_id: int, node_name: str) -> str:
        """`<Optimizer>_<k>_<base_str><node_name>_gpu<gpu_id>`: this optimizer instance's blob on a GPU."""
        return f"{type(self).__name__}_{self._instance_num}_{base_str}{node_name}_gpu{gpu_id}"

    def make_unique_blob_name(self, base: str) -> str:
        """The blob name of `base` unique to this optimizer and the current device scope (get_gpu_blob_name under
        a CUDA scope, get_cpu_blob_name otherwise)."""
        dev = CurrentDeviceScope()
        if dev is None:
            return self.get_cpu_blob_name(base)
        if dev.device_type == 1:
            return self.get_gpu_blob_name(base, dev.device_id, dev.node_name)
        return self.get_cpu_blob_name(base, dev.node_name)

    def build_lr(self, net, param_init_net, base_learning_rate, learning_rate_blob=None, policy="fixed",
                 iter_val=0, **kwargs):
        """(lr, iteration): LearningRate(optimizer_iteration) with base_lr = -base_learning_rate, made once per
        optimizer; the iteration counter and its AtomicIter are made once per model."""
        lr_blob = learning_rate_blob or self.make_unique_blob_name("lr")
        iteration = self.iteration(net, param_init_net, iter_val)
        if not net.BlobIsDefined(lr_blob):
            lr = net.LearningRate([iteration], lr_blob, base_lr=-float(base_learning_rate), policy=policy, **kwargs)
        else:
            lr = net.GetBlobRef(lr_blob)
        if self._lr_multiplier is not None:
            multiplier = self._lr_multiplier
            dev = CurrentDeviceScope()
            if dev is not None and dev.device_type == 1 and not self._lr_multiplier_on_gpu:
                multiplier = net.CopyFromCPUInput(multiplier, self.make_unique_blob_name("lr_multiplier"))
            lr = net.Mul([lr, multiplier], self.make_unique_blob_name("scaled_lr"), broadcast=1)
        return lr, iteration

    @staticmethod
    def iteration(net, param_init_net, iter_val: int = 0):
        """The model's `optimizer_iteration` (int64, on the CPU), made with its AtomicIter the first time."""
        if param_init_net.BlobIsDefined(_OPTIMIZER_ITERATION_NAME):
            return param_init_net.GetBlobRef(_OPTIMIZER_ITERATION_NAME)
        with core.DeviceScope(core.DeviceOption(0)):
            iteration = param_init_net.ConstantFill([], _OPTIMIZER_ITERATION_NAME, shape=[1], value=iter_val,
                                                    dtype=core.DataType.INT64)
            mutex = param_init_net.CreateMutex([], ["iteration_mutex"])
            net.AtomicIter([mutex, iteration], [iteration])
        return iteration

    def add_lr_multiplier(self, lr_multiplier, is_gpu_blob: bool = False) -> None:
        self._lr_multiplier, self._lr_multiplier_on_gpu = lr_multiplier, is_gpu_blob

    def _add_lars(self, net, param, grad, offset) -> None:
        """LARS (dense gradients only, as in Caffe2): the rate is scaled by Lars(param, grad) =
        1/(|grad|/|param| + offset), which replaces any earlier multiplier of this optimizer."""
        if offset is None or isinstance(grad, GradientSlice):
            return
        if offset < 0:
            raise ValueError(f"Lars offset must be nonnegative, got {offset}")
        multiplier = net.Lars([param, grad], self.make_unique_blob_name(str(param) + "_lars"), offset=offset)
        dev = CurrentDeviceScope()
        self.add_lr_multiplier(multiplier, is_gpu_blob=dev is not None and dev.device_type == 1)

    @staticmethod
    def dedup(net, sparse_dedup_aggregator, grad):
        """A sparse gradient with each index once: with an aggregator ('sum' or 'mean'), Unique on its indices
        and UnsortedSegmentSum / UnsortedSegmentMean of its values by the remapping (Caffe2's
        DeduplicateGradientSlices); without one, grad itself."""
        if not isinstance(grad, GradientSlice):
            raise AssertionError(f"Dedup only works for sparse gradient, got {grad}")
        if not sparse_dedup_aggregator:
            return grad
        return net.DeduplicateGradientSlices(grad, aggregator=sparse_dedup_aggregator)

    def get_auxiliary_parameters(self):
        """AuxOptimizerParams: `local`, the state blobs of each parameter (Adagrad's squared sums, ...), and
        `shared`, those all its parameters share (the iteration, ONE)."""
        return self._aux_params

    def scale_learning_rate(self, *args, **kwargs):
        """Scale the base learning rate (before the ops are added); each optimizer says how."""
        raise NotImplementedError("Optimizer Need to Implement `scale_learning_rate` method.")

    def _one(self, param_init_net):
        dev = CurrentDeviceScope() or core.DeviceOption(0)
        return param_init_net.ConstantFill([], f"ONE_{dev.device_type}_{dev.device_id}{dev.node_name}", shape=[1],
                                           value=1.0)

    def _state(self, param_init_net, param, suffix: str):
        blob = param_init_net.ConstantFill([param], str(param) + suffix, value=0.0)
        self._aux_params[0].append(blob)
        return blob


class SgdOptimizer(Optimizer):
    """WeightedSum(param, ONE, grad, lr) with lr = -base_lr; with momentum, MomentumSGDUpdate (lr = base_lr);
    lars=offset scales the rate of a dense parameter by its Lars factor."""

    def __init__(self, base_learning_rate=0.01, policy="fixed", momentum=0.0, nesterov=1,
                 sparse_dedup_aggregator=None, lars=None, **kwargs):
        super().__init__()
        self.base_learning_rate, self.policy, self.lars = base_learning_rate, policy, lars
        self.momentum, self.nesterov = momentum, nesterov
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.base_learning_rate == 0:
            return
        if self.base_learning_rate < 0:
            raise ValueError(f"Expect positive base learning rate, got {self.base_learning_rate}")
        self._add_lars(net, param, grad, self.lars)
        sign = -1 if self.momentum else 1
        lr, _ = self.build_lr(net, param_init_net, self.base_learning_rate * sign, policy=self.policy,
                              **self.init_kwargs)
        one = self._one(param_init_net)
        self._aux_params[1].append(one)
        momentum = self._state(param_init_net, param, "_momentum") if self.momentum > 0 else None
        if isinstance(grad, GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            if momentum is not None:
                net.SparseMomentumSGDUpdate([grad.values, momentum, lr, param, grad.indices],
                                            [grad.values, momentum, param], momentum=self.momentum,
                                            nesterov=self.nesterov)
            else:
                net.ScatterWeightedSum([param, one, grad.indices, grad.values, lr], param)
        elif momentum is not None:
            net.MomentumSGDUpdate([grad, momentum, lr, param], [grad, momentum, param], momentum=self.momentum,
                                  nesterov=self.nesterov)
        else:
            net.WeightedSum([param, one, grad, lr], param)

    def scale_learning_rate(self, scale) -> None:
        self.base_learning_rate *= scale


def _positive_lr(optimizer) -> bool:
    """False for a rate of 0 (no update, as Caffe2 skips it); ValueError for a negative one."""
    if optimizer.base_learning_rate < 0:
        raise ValueError(f"Expect positive base learning rate, got {optimizer.base_learning_rate}")
    return optimizer.base_learning_rate != 0


class MultiPrecisionSgdOptimizer(SgdOptimizer):
    """SGD of a float16 parameter kept with a float32 copy (param_info.blob_copy[FLOAT]): the gradient is made
    float32 (HalfToFloat into `<grad>_fp32`), MomentumSGDUpdate updates the copy with `<param>_momentum`, and
    FloatToHalf writes the parameter back. A parameter without a float32 copy gets plain SgdOptimizer updates."""

    def __init__(self, base_learning_rate=0.1, momentum=0.0, policy="fixed", nesterov=1,
                 sparse_dedup_aggregator=None, **kwargs):
        super().__init__(base_learning_rate=base_learning_rate, policy=policy, momentum=momentum, nesterov=nesterov,
                         sparse_dedup_aggregator=sparse_dedup_aggregator, **kwargs)

    def _run(self, net, param_init_net, param_info):
        copies = param_info.blob_copy
        param_fp32 = copies.get(core.DataType.FLOAT) if copies else None
        if param_fp32 is None:
            return SgdOptimizer._run(self, net, param_init_net, param_info)
        param, grad = param_info.blob, param_info.grad
        if not _positive_lr(self):
            return
        if isinstance(grad, GradientSlice):
            raise ValueError("MultiPrecisionSgd does not support sparse gradients")
        lr, _ = self.build_lr(net, param_init_net, -self.base_learning_rate, policy=self.policy, **self.init_kwargs)
        momentum = param_init_net.ConstantFill(param_fp32, str(param) + "_momentum", value=0.0)
        self._aux_params.local.append(momentum)
        grad_fp32 = net.HalfToFloat(grad, str(grad) + "_fp32")
        net.MomentumSGDUpdate([grad_fp32, momentum, lr, param_fp32], [grad_fp32, momentum, param_fp32],
                              momentum=self.momentum, nesterov=self.nesterov)
        net.FloatToHalf(param_fp32, param)


class FP16SgdOptimizer(SgdOptimizer):
    """Momentum SGD with weight decay on float16 parameters: FP16MomentumSGDUpdate on the parameter with a float16
    momentum (`<param>_momentum`, made from a float32 zero `<param>_momentum_fp32`); FP32MomentumSGDUpdate with the
    float32 momentum for a float32 parameter (no blob_copy, or a name with "spatbn": cuDNN's batch norm keeps
    float32 parameters). blob_copy[FLOAT] names the float32 copy of a float16 parameter, blob_copy[FLOAT16] the
    float16 copy of a float32 one."""

    def __init__(self, base_learning_rate=0.1, momentum=0.0, policy="fixed", nesterov=1, weight_decay=0.0001,
                 sparse_dedup_aggregator=None, **kwargs):
        super().__init__(base_learning_rate=base_learning_rate, policy=policy, momentum=momentum, nesterov=nesterov,
                         sparse_dedup_aggregator=sparse_dedup_aggregator, **kwargs)
        self.weight_decay = weight_decay

    def _run(self, net, param_init_net, param_info, fp32_update=False):
        copies = param_info.blob_copy
        fp32_update = fp32_update or "spatbn" in str(param_info.blob) or copies is None
        param = param_fp32 = param_info.blob
        if not fp32_update:
            if core.DataType.FLOAT in copies:
                param_fp32 = copies[core.DataType.FLOAT]
            elif core.DataType.FLOAT16 in copies:
                param = copies[core.DataType.FLOAT16]
            else:
                raise ValueError(f"Unrecognized parameter format to be updated by FP16 Optimizer. Parameter: "
                                 f"{param_info.name}")
        grad = param_info.grad
        if not _positive_lr(self):
            return
        if isinstance(grad, GradientSlice):
            raise ValueError("FP16Sgd does not support sparse gradients")
        lr, _ = self.build_lr(net, param_init_net, -self.base_learning_rate, policy=self.policy, **self.init_kwargs)
        momentum_fp32 = param_init_net.ConstantFill(param_fp32, str(param) + "_momentum_fp32", value=0.0)
        momentum = param_init_net.FloatToHalf(momentum_fp32, str(param) + "_momentum")
        self._aux_params.local.append(momentum)
        args = {"momentum": self.momentum, "nesterov": self.nesterov, "weight_decay": self.weight_decay}
        if fp32_update:
            net.FP32MomentumSGDUpdate([grad, momentum_fp32, lr, param], [grad, momentum_fp32, param], **args)
        else:
            net.FP16MomentumSGDUpdate([grad, momentum, lr, param], [grad, momentum, param], **args)
