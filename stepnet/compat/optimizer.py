"""Caffe2's optimizer module: the optimizer classes and build_sgd / build_multi_precision_sgd / build_fp16_sgd /
build_adagrad / build_adam / build_ftrl / build_yellowfin / build_rms_prop / add_weight_decay, which add the
update ops of every parameter that has a gradient to model.net.

The base class and the SGD family are in _optimizer_base (re-exported here): one int64 `optimizer_iteration`
drives a LearningRate op per optimizer; max_gradient_norm scales the rate by clip / max(global gradient norm,
clip); each parameter's ops run on the device of the op that created it.
"""
from __future__ import annotations

import contextlib
import logging

import numpy as np

from ..ops.base import GradientSlice
from . import core, workspace
from ._optimizer_base import (  # noqa: F401 - Caffe2's optimizer module has them
    _LEARNING_RATE_INJECTION, _OPTIMIZER_ITERATION_NAME, AuxOptimizerParams, FP16SgdOptimizer,
    MultiPrecisionSgdOptimizer, Optimizer, SgdOptimizer, _optimizer_instance_count)
from .scope import CurrentDeviceScope

log = logging.getLogger(__name__)


class WeightDecayBuilder(Optimizer):
    """grad += weight_decay * param (WeightedSum(grad, ONE, param, wd))."""

    def __init__(self, weight_decay):
        super().__init__()
        self.weight_decay = weight_decay

    def _run(self, net, param_init_net, param_info):
        if isinstance(param_info.grad, GradientSlice):
            raise ValueError("Weight decay does not yet support sparse gradients")
        dev = CurrentDeviceScope() or core.DeviceOption(0)
        one = param_init_net.ConstantFill([], f"ONE_{dev.device_type}_{dev.device_id}", shape=[1], value=1.0)
        wd = param_init_net.ConstantFill([], f"wd_{dev.device_type}_{dev.device_id}", shape=[1],
                                         value=float(self.weight_decay))
        net.WeightedSum([param_info.grad, one, param_info.blob, wd], param_info.grad)


class AdagradOptimizer(Optimizer):
    """Adagrad(param, `<param>_squared_sum`, grad, lr) (SparseAdagrad for a sparse gradient; with rowWise,
    RowWiseSparseAdagrad with one `<param>_avg_squared_sum` value per row, sparse gradients only); lars=offset
    scales the rate of a dense parameter by its Lars factor."""

    def __init__(self, alpha=0.01, epsilon=1e-4, decay=1, policy="fixed", sparse_dedup_aggregator=None,
                 rowWise=False, engine="", lars=None, **kwargs):
        super().__init__()
        self.alpha, self.epsilon, self.decay, self.policy, self.engine = alpha, epsilon, decay, policy, engine
        self.sparse_dedup_aggregator, self.rowWise, self.lars = sparse_dedup_aggregator, rowWise, lars
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        self._add_lars(net, param, grad, self.lars)
        lr, _ = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        if self.rowWise:
            history = _per_row_state(param_init_net, param, "_avg_squared_sum")
            self._aux_params.local.append(history)
        else:
            history = self._state(param_init_net, param, "_squared_sum")
        if self.rowWise and not isinstance(grad, GradientSlice):
            raise ValueError("If SparseAdagrad with rowWise=True, gradient must be a gradientslice: row-wise "
                             "Adagrad has no dense form")
        if isinstance(grad, GradientSlice):
            if self.decay != 1:
                raise ValueError("Decay is not implemented for SparseAdagrad and must be set to 1")
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            update = net.RowWiseSparseAdagrad if self.rowWise else net.SparseAdagrad
            update([param, history, grad.indices, grad.values, lr], [param, history], epsilon=self.epsilon,
                   engine=self.engine)
        else:
            net.Adagrad([param, history, grad, lr], [param, history], epsilon=self.epsilon,
                        decay=float(self.decay), engine=self.engine)

    def scale_learning_rate(self, scale) -> None:
        self.alpha *= scale


class AdamOptimizer(Optimizer):
    """Adam(param, `<param>_first_moment`, `<param>_second_moment`, grad, lr, iteration) (SparseAdam for a
    sparse gradient; with rowWise, RowWiseSparseAdam with one `<param>_avg_second_moment` value per row, sparse
    gradients only)."""

    def __init__(self, alpha=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, policy="fixed",
                 sparse_dedup_aggregator=None, rowWise=False, engine="", **kwargs):
        super().__init__()
        self.rowWise = rowWise
        self.alpha, self.beta1, self.beta2, self.epsilon = alpha, beta1, beta2, epsilon
        self.policy, self.engine, self.sparse_dedup_aggregator = policy, engine, sparse_dedup_aggregator
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        lr, iteration = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        m1 = self._state(param_init_net, param, "_first_moment")
        if self.rowWise:
            m2 = _per_row_state(param_init_net, param, "_avg_second_moment")
            self._aux_params.local.append(m2)
        else:
            m2 = self._state(param_init_net, param, "_second_moment")
        self._aux_params[1].append(iteration)
        args = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}
        if self.rowWise and not isinstance(grad, GradientSlice):
            raise ValueError("If SparseAdam with rowWise=True, gradient must be a gradientslice: row-wise Adam "
                             "has no dense form")
        if isinstance(grad, GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            update = net.RowWiseSparseAdam if self.rowWise else net.SparseAdam
            update([param, m1, m2, grad.indices, grad.values, lr, iteration], [param, m1, m2], **args)
        else:
            net.Adam([param, m1, m2, grad, lr, iteration], [param, m1, m2], **args)

    def scale_learning_rate(self, scale) -> None:
        self.alpha *= scale


def _per_row_state(param_init_net, param, suffix: str):
    """A zero state of one value per row of param: ConstantFill(shape=[rows]) when the init net's shapes are
    known, else made from Shape(param)[0:1] at run time (as Caffe2 does)."""
    shapes, _ = workspace.InferShapesAndTypes([param_init_net])
    if str(param) in shapes:
        return param_init_net.ConstantFill([], str(param) + suffix, shape=[shapes[str(param)][0]], value=0.0)
    shape = param_init_net.Shape(param, str(param) + "_shape")
    rows = param_init_net.Slice([shape], str(shape) + "_numrows", starts=[0], ends=[1])
    return param_init_net.ConstantFill(rows, str(param) + suffix, input_as_shape=1, value=0.0)


class FtrlOptimizer(Optimizer):
    """Ftrl(param, `<param>_ftrl_nz`, grad) -> (param, nz) (SparseFtrl for a sparse gradient); nz holds the z and n
    accumulators of each weight (the parameter's shape + [2])."""

    def __init__(self, alpha=0.01, beta=1e-4, lambda1=0, lambda2=0, sparse_dedup_aggregator=None, engine=""):
        super().__init__()
        self.alpha, self.beta, self.lambda1, self.lambda2 = alpha, beta, lambda1, lambda2
        self.sparse_dedup_aggregator, self.engine = sparse_dedup_aggregator, engine

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if self.alpha <= 0:
            return
        nz = param_init_net.ConstantFill([param], str(param) + "_ftrl_nz", extra_shape=[2], value=0.0)
        self._aux_params.local.append(nz)
        args = {"engine": self.engine, "alpha": self.alpha, "beta": self.beta, "lambda1": self.lambda1,
                "lambda2": self.lambda2}
        if isinstance(grad, GradientSlice):
            grad = self.dedup(net, self.sparse_dedup_aggregator, grad)
            net.SparseFtrl([param, nz, grad.indices, grad.values], [param, nz], **args)
        else:
            net.Ftrl([param, nz, grad], [param, nz], **args)

    def scale_learning_rate(self, scale) -> None:
        self.alpha *= scale


class YellowFinOptimizer(Optimizer):
    """YellowFin (arXiv:1706.03471), a tuner of momentum SGD with a rate and momentum per parameter: one YellowFin
    op over the parameter and its state (`<param>_moment`, `_lr_avg`, `_mu_avg`, `_curv_win`, `_g_avg`, `_g2_avg`,
    `_scalars_memory`), the gradient and the optimizer iteration."""
    SCALARS_MEMORY_SIZE = 5

    def __init__(self, alpha=0.1, mu=0.0, beta=0.999, curv_win_width=20, zero_debias=True, epsilon=0.1 ** 6,
                 policy="fixed", sparse_dedup_aggregator=None, **kwargs):
        super().__init__()
        self.alpha, self.mu, self.beta, self.curv_win_width = alpha, mu, beta, curv_win_width
        self.zero_debias, self.epsilon, self.policy = zero_debias, epsilon, policy
        self.sparse_dedup_aggregator, self.init_kwargs = sparse_dedup_aggregator, kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if not self.alpha > 0:
            raise ValueError(f"YellowFin needs alpha > 0, got {self.alpha}")
        if isinstance(grad, GradientSlice):
            raise ValueError("YellowFin does not support sparse gradients")
        fill = param_init_net.ConstantFill
        state = [param,
                 fill([param], str(param) + "_moment", value=0.0),
                 fill([], str(param) + "_lr_avg", shape=[1], value=self.alpha),
                 fill([], str(param) + "_mu_avg", shape=[1], value=self.mu),
                 fill([], str(param) + "_curv_win", shape=[self.curv_win_width], value=0.0),
                 fill([param], str(param) + "_g_avg", value=0.0),
                 fill([param], str(param) + "_g2_avg", value=0.0),
                 fill([], str(param) + "_scalars_memory", shape=[self.SCALARS_MEMORY_SIZE], value=0.0)]
        iteration = self.iteration(net, param_init_net)
        self._aux_params.shared.append(iteration)
        self._aux_params.local.extend(state[i] for i in (1, 2, 3, 4, 5, 6, 7))
        net.YellowFin(state + [grad, iteration], state, beta=self.beta, epsilon=self.epsilon,
                      curv_win_width=self.curv_win_width, zero_debias=self.zero_debias)

    def scale_learning_rate(self, scale) -> None:
        self.alpha *= scale


class RmsPropOptimizer(Optimizer):
    """RmsProp(grad, mean_squares, momentum, ONE) into `<param>_grad_o`, then MomentumSGDUpdate with lr = -alpha."""

    def __init__(self, alpha=0.01, decay=0.9, momentum=0.0, epsilon=1e-5, policy="fixed", engine="", **kwargs):
        super().__init__()
        self.alpha, self.decay, self.momentum, self.epsilon = alpha, decay, momentum, epsilon
        self.policy, self.engine, self.init_kwargs = policy, engine, kwargs

    def _run(self, net, param_init_net, param_info):
        param, grad = param_info.blob, param_info.grad
        if not self.alpha > 0:
            raise ValueError(f"RmsProp needs alpha > 0, got {self.alpha}")
        if isinstance(grad, GradientSlice):
            raise ValueError("RmsPropOptimizer doesn't support sparse gradients")
        dev = CurrentDeviceScope() or core.DeviceOption(0)
        one = param_init_net.ConstantFill([], f"ONE_{dev.device_type}_{dev.device_id}", shape=[1], value=1.0)
        lr, _ = self.build_lr(net, param_init_net, -self.alpha, policy=self.policy, **self.init_kwargs)
        grad_o = param_init_net.ConstantFill([param], str(param) + "_grad_o", value=0.0)
        ms = self._state(param_init_net, param, "_mean_squares")
        mom = self._state(param_init_net, param, "_momentum")
        net.RmsProp([grad, ms, mom, one], [grad_o, ms, mom], decay=self.decay, momentum=self.momentum,
                    epsilon=self.epsilon, engine=self.engine)
        net.MomentumSGDUpdate([grad_o, mom, lr, param], [grad_o, mom, param])

    def scale_learning_rate(self, scale) -> None:
        self.alpha *= scale


def _param_devices(model) -> dict:
    """{blob: the DeviceOption of the op that writes it, None for an op without one} (init net last)."""
    devices = {}
    for net in (model.net, model.param_init_net):
        for op in net.Proto().op:
            devices.update((b, op.device_option if op.HasField("device_option") else None) for b in op.output)
    return devices


def _device_scope(name, grad, devices):
    """The scope a parameter's update ops are made in: the device of the op that made the parameter (or its
    gradient); the current scope for a parameter no op makes (a fed one)."""
    for blob in (name, *(grad if isinstance(grad, GradientSlice) else (grad,))):
        if str(blob) in devices:
            device = devices[str(blob)]
            return core.EmptyDeviceScope() if device is None else core.DeviceScope(device)
    return contextlib.nullcontext()


def _calc_norm_ratio(model, params, name_scope, devices, max_gradient_norm):
    """clip_norm / max(global gradient norm, clip_norm), on the CPU."""
    with core.NameScope(name_scope):
        sums = []
        for i, info in enumerate(params):
            grad = info.grad.values if isinstance(info.grad, GradientSlice) else info.grad
            with _device_scope(info.name, info.grad, devices):
                squared = model.net.SumSqrElements(grad, f"grad_{i}_squared_sum")
                sums.append(model.net.EnsureCPUOutput(squared))
        with core.DeviceScope(core.DeviceOption(0)):
            total = model.net.Sum(sums, "grad_squared_full_sum")
            norm = model.net.Pow(total, "global_norm", exponent=0.5)
            clip = model.param_init_net.ConstantFill([], "clip_norm", shape=[], value=float(max_gradient_norm))
            biggest = model.net.Max([norm, clip], "max_norm")
            return model.net.Div([clip, biggest], "norm_ratio")


def _build(model, optimizer, weights_only=False, use_param_info_optim=True, max_gradient_norm=None,
           allow_lr_injection=False):
    """Add optimizer's ops for every parameter that has a gradient (weights_only: model.weights)."""
    devices = _param_devices(model)
    model.Validate()
    params = [p for p in model.GetOptimizationParamInfo() if not weights_only or p.blob in model.weights]
    missing = [str(p) for p in model.params if p not in model.param_to_grad]
    if missing and not weights_only:
        log.warning("parameters without a gradient are not optimized: %s", ", ".join(missing))
    multiplier = None
    if max_gradient_norm is not None:
        multiplier = _calc_norm_ratio(model, params, "norm_clipped_grad_update", devices, max_gradient_norm)
    if allow_lr_injection:
        injection = (_LEARNING_RATE_INJECTION if model.net.BlobIsDefined(_LEARNING_RATE_INJECTION) else
                     model.param_init_net.ConstantFill([], _LEARNING_RATE_INJECTION, shape=[1], value=1.0))
        multiplier = injection if multiplier is None else model.net.Mul([multiplier, injection], "lr_multiplier",
                                                                         broadcast=1)
    optimizer.add_lr_multiplier(multiplier)
    for info in params:
        with _device_scope(info.name, info.grad, devices):
            chosen = info.optimizer if info.optimizer and use_param_info_optim else optimizer
            chosen(model.net, model.param_init_net, info)
    return optimizer


def add_weight_decay(model, weight_decay):
    """L2 regularization of the model's weights: grad += weight_decay * weight."""
    _build(model, WeightDecayBuilder(weight_decay=weight_decay), weights_only=True, use_param_info_optim=False)


def build_sgd(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    return _build(model, SgdOptimizer(base_learning_rate, **kwargs), max_gradient_norm=max_gradient_norm,
                  allow_lr_injection=allow_lr_injection)


def build_adagrad(model, base_learning_rate, parameters=None, max_gradient_norm=None, allow_lr_injection=False,
                  **kwargs):
    return _build(model, AdagradOptimizer(alpha=base_learning_rate, **kwargs), max_gradient_norm=max_gradient_norm,
                  allow_lr_injection=allow_lr_injection)


def build_adam(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    return _build(model, AdamOptimizer(alpha=base_learning_rate, **kwargs), max_gradient_norm=max_gradient_norm,
                  allow_lr_injection=allow_lr_injection)


def build_rms_prop(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    return _build(model, RmsPropOptimizer(alpha=base_learning_rate, **kwargs), max_gradient_norm=max_gradient_norm,
                  allow_lr_injection=allow_lr_injection)


def build_multi_precision_sgd(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False,
                              **kwargs):
    return _build(model, MultiPrecisionSgdOptimizer(base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_fp16_sgd(model, base_learning_rate, **kwargs):
    return _build(model, FP16SgdOptimizer(base_learning_rate, **kwargs))


def build_ftrl(model, engine="SIMD", **kwargs):
    """FTRL updates; engine "SIMD" is Caffe2's vectorized kernel, an engine hint here (the same op runs)."""
    return _build(model, FtrlOptimizer(engine=engine, **kwargs))


def build_yellowfin(model, base_learning_rate=0.1, **kwargs):
    return _build(model, YellowFinOptimizer(alpha=base_learning_rate, **kwargs))


def _get_param_to_device(model) -> dict:
    """{blob: DeviceOption of the op that writes it} over model.net and then model.param_init_net."""
    devices = core.InferBlobDevices(model.net)
    devices.update(core.InferBlobDevices(model.param_init_net))
    return devices


def get_param_device(param_name, grad, param_to_device=None, default_device=None):
    """The device of a parameter: of the op making it, else of the one making its gradient, else default_device."""
    param_to_device = param_to_device or {}
    names = [str(param_name)] + ([str(grad.values), str(grad.indices)] if isinstance(grad, GradientSlice)
                                 else [str(grad)])
    device = next((param_to_device[n] for n in names if n in param_to_device), default_device)
    if device is None:
        raise ValueError(f"Cannot infer device for {param_name}: no op creates it")
    return device


def get_lr_injection():
    """The current multiplier of every base learning rate (built with allow_lr_injection=True)."""
    return workspace.FetchBlob(_LEARNING_RATE_INJECTION)


def set_lr_injection(lr_injection_value) -> None:
    workspace.FeedBlob(_LEARNING_RATE_INJECTION, np.array([float(lr_injection_value)], dtype=np.float32))
