"""Caffe2's data_parallel_model: one model built K times, once per device, in one net.

Parallelize calls the input and forward builders under each device's scopes (name scope `gpu_<i>/` or, with
cpu_device, `cpu_<i>/`; device option CUDA i or CPU i), adds the backward pass (each device's loss gradient
filled with ones), sums every parameter gradient over the devices into each (Sum + Copy ops in the net, see
_dpm_allreduce; across processes, Allreduce over a Gloo rendezvous), then adds the parameter updates (per device,
or one optimizer for all) and, in the init net, copies of the first device's parameters to the others, so all
devices start equal and stay equal. Each device's loss is scaled by 1/K, so K devices with batch B/K each
compute the gradient of one device with batch B.

Parallelize_BMUF (block-wise model-update filtering) is in _dpm_bmuf; the bookkeeping in _dpm_groups.
"""
from __future__ import annotations

import copy
import logging

from . import core, dyndep, memonger, model_helper, scope, workspace
from ._dpm_allreduce import (  # noqa: F401 - Caffe2's module has these names
    DEFAULT_TIMEOUT_SEC as _DEFAULT_TIMEOUT_SEC, CollectivesConcurrencyControl, allreduce_blobs,
    broadcast_computed_params as _broadcast_computed_params,
    create_or_clone_common_world as _CreateOrCloneCommonWorld, sync_all_params)
from ._dpm_bmuf import Parallelize_BMUF, Parallelize_CPU_BMUF, Parallelize_GPU_BMUF  # noqa: F401
from ._dpm_bn import inter_device_batch_normalization, interleave_ops
from ._dpm_groups import (  # noqa: F401
    analyze_operators, blobs_to_sync, group_by_device, infer_blob_devices, prune_parameters_for_sharing,
    remap_parameters_for_shared_model, stripBlobName, validate_params)
from ._dpm_setup import (add_blob_sync, add_dynamic_memory_optimization, add_gradient_operators, device_kind,
                         for_each_device, optimize_gradient_memory_simple)

dyndep.InitOpsLibrary("@/caffe2/caffe2/contrib/nccl:nccl_ops")
dyndep.InitOpsLibrary("@/caffe2/caffe2/contrib/gloo:gloo_ops")
dyndep.InitOpsLibrary("@/caffe2/caffe2/contrib/gloo:gloo_ops_gpu")

log = logging.getLogger("data_parallel_model")
CPU, CUDA = 0, 1


def Parallelize_GPU(*args, **kwargs):   # noqa: N802 - Caffe2's names
    kwargs["cpu_device"] = False
    Parallelize(*args, **kwargs)


def Parallelize_CPU(*args, **kwargs):   # noqa: N802
    kwargs["cpu_device"] = True
    Parallelize(*args, **kwargs)


def Parallelize(model_helper_obj, input_builder_fun, forward_pass_builder_fun, param_update_builder_fun=None,  # noqa: N802
                optimizer_builder_fun=None, post_sync_builder_fun=None, devices=None, rendezvous=None,
                net_type="dag", broadcast_computed_params=True, optimize_gradient_memory=False,
                dynamic_memory_management=False, blobs_to_keep=None, use_nccl=False,
                max_concurrent_distributed_ops=16, cpu_device=False, num_threads_per_device=4, shared_model=False,
                combine_spatial_bn=False):
    """Build the model data-parallel over `devices` (see the module). forward_pass_builder_fun(model,
    loss_scale) returns the device's losses; give param_update_builder_fun(model) (called per device) or
    optimizer_builder_fun(model) (called once), or neither for a forward-only model."""
    model = model_helper_obj
    device_kind(model, cpu_device, devices, shared_model)
    if devices is None:
        devices = list(range(workspace.NumCudaDevices()))
    if not isinstance(model, model_helper.ModelHelper):
        raise AssertionError("Parallelize needs a ModelHelper")
    if shared_model and rendezvous is not None:
        raise AssertionError("Shared model only supported on single-node currently")
    log.info("Parallelizing model for devices: %s", devices)
    num_workers = len(devices) * num_threads_per_device + (8 if rendezvous is not None else 0)
    max_concurrent_distributed_ops = min(max_concurrent_distributed_ops, num_workers - 1)
    model.net.Proto().num_workers = num_workers
    model.net.Proto().type = net_type
    model._devices = list(devices)
    model._rendezvous = rendezvous
    model._broadcast_context = None
    model._grad_names = []
    model._optimizer = None
    non_datapar_params = copy.copy(model.params)
    num_shards = 1 if rendezvous is None else rendezvous["num_shards"]
    loss_scale = 1.0 / (len(devices) * num_shards)
    if param_update_builder_fun is not None and optimizer_builder_fun is not None:
        raise AssertionError("Can only specify one of param_update_builder_fun, optimizer_builder_fun")
    has_updates = param_update_builder_fun is not None or optimizer_builder_fun is not None
    if not has_updates and model.init_params:
        log.warning("Model %s is used for testing/validation but has init_params=True: running its init net "
                    "overwrites the trained parameters (use ModelHelper(init_params=False))", model.name)

    losses_by_gpu = {}

    def build(device):
        input_builder_fun(model)
        losses = forward_pass_builder_fun(model, loss_scale)
        if has_updates:
            if not isinstance(losses, list):
                raise AssertionError("Model builder function must return list of loss blobs")
            for loss in losses:
                if not isinstance(loss, core.BlobReference):
                    raise AssertionError("Model builder func must return list of loss blobs")
        losses_by_gpu[device] = losses

    for_each_device(model, devices, build)
    validate_params(model.params)
    model._device_grouped_blobs = group_by_device(model, devices, model.params, non_datapar_params)
    computed = group_by_device(model, devices, model.GetComputedParams(""), [])
    model._device_grouped_blobs.update(computed)
    model._param_names = list(model._device_grouped_blobs)
    model._computed_param_names = list(computed)
    if not has_updates:
        log.info("Parameter update function not defined --> only forward")
        infer_blob_devices(model)
        return

    add_gradient_operators(devices, model, losses_by_gpu)
    if combine_spatial_bn:
        if not cpu_device:
            raise AssertionError("combine_spatial_bn is currently only supported on the CPU")
        interleave_ops(model)
        inter_device_batch_normalization(model)
    validate_params(model.params)
    grads = [model.param_to_grad[p] for p in model.params if p in model.param_to_grad]
    non_datapar_grads = [model.param_to_grad[p] for p in non_datapar_params]
    grads_grouped = group_by_device(model, devices, grads, non_datapar_grads)
    model._device_grouped_blobs.update(grads_grouped)
    model._grad_names = list(grads_grouped)
    model._losses_by_gpu = losses_by_gpu
    infer_blob_devices(model)

    if broadcast_computed_params:
        _broadcast_computed_params(devices, model, rendezvous, use_nccl)
    if model._grad_names:
        allreduce_blobs(list(reversed(model._grad_names)), devices, model, model.net, rendezvous, use_nccl,
                        max_concurrent_distributed_ops)
    else:
        log.info("NOTE: Param builder function did not create any parameters.")

    all_params = set(model.GetParams(""))
    if shared_model:
        prune_parameters_for_sharing(model)
    if param_update_builder_fun is not None:
        for_each_device(model, devices, lambda _: param_update_builder_fun(model))
    else:
        model._optimizer = optimizer_builder_fun(model)

    sync_blobs, sync_names = blobs_to_sync(model)
    model._device_grouped_blobs.update(group_by_device(model, devices, sync_blobs, []))
    infer_blob_devices(model)
    analyze_operators(model)
    arg = model.Proto().arg.add()
    arg.name, arg.i = "first_iter_only_one_worker", 1

    sync_all_params(devices, model, model.param_init_net, model.param_init_net, rendezvous, sync_names,
                    max_concurrent_distributed_ops=1)
    if post_sync_builder_fun is not None:
        for_each_device(model, devices, lambda _: post_sync_builder_fun(model))
    if optimize_gradient_memory and dynamic_memory_management:
        raise AssertionError("It is not advised to use gradient optimization ('memonger') with dynamic memory "
                             "management.")
    if optimize_gradient_memory:
        optimize_gradient_memory_simple(model, losses_by_gpu, devices)
    if dynamic_memory_management:
        add_dynamic_memory_optimization(model, blobs_to_keep, devices)
    model._data_parallel_model_init_nets = [model.param_init_net]
    model._data_parallel_model_nets = [model.net]
    if shared_model:
        remap_parameters_for_shared_model(model, all_params)


def RunInitNet(model):   # noqa: N802
    for init_net in model._data_parallel_model_init_nets:
        workspace.RunNetOnce(init_net)
    for net in model._data_parallel_model_nets:
        workspace.CreateNet(net[0] if isinstance(net, tuple) else net)


def RunWarmup(model):   # noqa: N802
    workspace.RunNet(model.net, model._warmup_iterations)
    workspace.RunNetOnce(model._warmup_broadcast)


def RunNet(model, num_iterations):   # noqa: N802
    for net in model._data_parallel_model_nets:
        if isinstance(net, tuple):
            workspace.RunNet(net[0].Proto().name, net[1])
        else:
            workspace.RunNet(net, num_iterations)


_barrier_instance = [0]


def Synchronize(model, timeout_sec=_DEFAULT_TIMEOUT_SEC):   # noqa: N802
    """A barrier over the processes of the rendezvous (nothing for one process)."""
    if model._rendezvous is None or model._rendezvous["num_shards"] <= 1:
        return
    if model._rendezvous["engine"] != "GLOO":
        raise AssertionError("Engine does not support barrier")
    instance = _barrier_instance[0]
    _barrier_instance[0] += 1
    net = core.Net(f"sync_barrier_net_{instance}")
    world = _CreateOrCloneCommonWorld(net, f"sync_barrier_cw_{instance}", rendezvous=model._rendezvous,
                                      status_blob=f"sync_barrier_cw_status_{instance}", timeout_sec=timeout_sec)
    net.Barrier([world], [], engine=model._rendezvous["engine"], status_blob=f"sync_barrier_status_{instance}")
    workspace.RunNetOnce(net)


def ConvertNetForDevice(net, device=None):   # noqa: N802
    """A copy of net with every blob under the device's name scope (`gpu_<i>/`, `cpu_<i>/`) and every op on
    the device (default: the current device scope), e.g. to AppendNet another model's net in a builder."""
    converted = core.Net(net.Proto())          # a copy (a Net holds thread-local scopes: no deepcopy)
    converted.Proto().name = net.Proto().name
    device = device if device is not None else scope.CurrentDeviceScope()
    if device is None:
        raise AssertionError("ConvertNetForDevice needs a device (or a device scope)")
    prefix = f"{'gpu' if device.device_type == CUDA else 'cpu'}_{device.device_id}/"
    proto = converted.Proto()
    for op in proto.op:
        if "RecurrentNetwork" in op.type:
            raise NotImplementedError("RecurrentNetwork conversion not yet supported")
        op.input[:] = [prefix + b for b in op.input]
        op.output[:] = [prefix + b for b in op.output]
        op.control_input[:] = [prefix + b for b in op.control_input]
        op.device_option.CopyFrom(device)
    proto.external_input[:] = [prefix + b for b in proto.external_input]
    proto.external_output[:] = [prefix + b for b in proto.external_output]
    return converted


def ExtractPredictorNet(model, inputs, outputs, device):   # noqa: N802
    """(predictor net, blobs to export) of the first device's forward pass, blobs renamed without its scope."""
    extract = getattr(model_helper, "ExtractPredictorNet", None)
    if extract is None:
        raise NotImplementedError("model_helper.ExtractPredictorNet is not available in stepnet.compat")
    prefix = f"{model._device_prefix}_{model._devices[0]}/"
    scoped_in, scoped_out = [prefix + str(b) for b in inputs], [prefix + str(b) for b in outputs]
    return extract(net_proto=model.net.Proto(), input_blobs=scoped_in, output_blobs=scoped_out, device=device,
                   renames=dict(zip(scoped_in + scoped_out, [str(b) for b in list(inputs) + list(outputs)])))


def GetCheckpointParams(model):   # noqa: N802
    """The blobs a checkpoint needs: the first device's synced blobs and the unscoped iteration counters."""
    blobs, _ = blobs_to_sync(model)
    first = f"{model._device_prefix}_{model._devices[0]}/"
    params = {b for b in blobs if str(b).startswith(first)}
    for op in model.net.Proto().op:
        if op.type in ("Iter", "AtomicIter") and not op.output[0].startswith(model._device_prefix + "_"):
            params.add(core.BlobReference(op.output[0]))
    return params


def FinalizeAfterCheckpoint(model, blobs=None):   # noqa: N802
    """After loading a checkpoint (the first device's blobs): copy them to the other devices."""
    if not hasattr(model, "_checkpoint_net"):
        names = blobs_to_sync(model)[1] if blobs is None else [stripBlobName(b) for b in blobs]
        devices = model.GetDevices()
        for name in names:
            if name not in model._device_grouped_blobs:
                model._device_grouped_blobs[name] = {
                    d: core.BlobReference(f"{model._device_prefix}_{d}/{name}") for d in devices}
        model._checkpoint_net = core.Net("checkpoint_sync_net")
        if model._device_type == CUDA:
            model._checkpoint_net.RunAllOnGPU()
        init_net = None
        if model._rendezvous is not None and model._rendezvous["num_shards"] > 1:
            init_net = core.Net("checkpoint_init_net")
            if model._device_type == CUDA:
                init_net.RunAllOnGPU()
        sync_all_params(devices, model, init_net, model._checkpoint_net, model._rendezvous, names,
                        max_concurrent_distributed_ops=1)
        if init_net is not None:
            workspace.RunNetOnce(init_net)
        workspace.CreateNet(model._checkpoint_net)
    workspace.RunNet(model._checkpoint_net.Proto().name)


def _lr_name(optimizer, suffix: str) -> str:
    return f"{type(optimizer).__name__}_{optimizer._instance_num}_lr{suffix}"


def GetLearningRateBlobNames(model):   # noqa: N802
    """The learning-rate blobs: the optimizer's (one on the CPU; one per GPU), or every LearningRate output."""
    optimizer = getattr(model, "_optimizer", None)
    if optimizer is not None:
        if model._device_type == CPU:
            return [_lr_name(optimizer, "_cpu")]
        if model._device_type == CUDA:
            return [_lr_name(optimizer, f"_gpu{d}") for d in model._devices]
        raise Exception(f"Unsupported device type : {model._device_type}")
    return [op.output[0] for op in model.net.Proto().op if op.type == "LearningRate"]


def AddBlobSync(model, blobs, net=None):   # noqa: N802
    """Copy the first device's value of each (unscoped) blob to the other devices, in `net` (the model's)."""
    add_blob_sync(model, blobs, net)


def AddDistributedBlobSync(model, blobs):   # noqa: N802
    """Sum blobs over the processes of the rendezvous (not over devices)."""
    if model._rendezvous is None:
        return
    name = "_".join(str(b) for b in blobs)
    world = _CreateOrCloneCommonWorld(model.param_init_net, f"blob_sync_cw_{name}", rendezvous=model._rendezvous,
                                      status_blob=f"create_blob_sync_cw_{name}_cw_status")
    model.net.Allreduce([world] + list(blobs), list(blobs), engine=model._rendezvous["engine"],
                        status_blob=f"blob_sync_allred_{name}_status")


def OptimizeGradientMemory(model, input_shapes, excluded_blobs, recycle_activations):   # noqa: N802
    """Recycle the backward pass's blobs on every device (memonger.share_grad_blobs). input_shapes: {blob:
    shape} of the unscoped inputs (None: unknown); excluded_blobs: unscoped blobs read from outside;
    recycle_activations: forward activations too."""
    shapes = None
    if input_shapes is not None:
        scoped = {f"{model._device_prefix}_{d}/{b}": s for b, s in input_shapes.items() for d in model._devices}
        shapes, _ = workspace.InferShapesAndTypes([model.param_init_net, model.net], scoped)
    for device in model._devices:
        namescope = f"{model._device_prefix}_{device}/"
        shared = memonger.share_grad_blobs(
            model.net, model._losses_by_gpu[device], set(model.param_to_grad.values()), namescope,
            dont_share_blobs={namescope + b for b in excluded_blobs}, share_activations=recycle_activations,
            blob_shapes=shapes)
        model.net.Proto().CopyFrom(shared)


def _GetReverseOrderedGrads(model):   # noqa: N802
    return list(reversed(model._grad_names))
