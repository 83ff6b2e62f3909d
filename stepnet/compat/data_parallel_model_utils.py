"""Caffe2's data_parallel_model_utils: the activations of a data-parallel model, and moving the ops of some
activations to another GPU (simple model parallelism), with the cross-device copies that needs."""
from __future__ import annotations

import logging

from . import core
from ._dpm_groups import stripBlobName

log = logging.getLogger("data_parallel_model_utils")


def GetActivationBlobs(model):   # noqa: N802 - Caffe2's names
    """The first device's activations (unscoped): blobs the net writes and reads that are not parameters and
    have a gradient read in the net."""
    first = f"{model._device_prefix}_{model._devices[0]}/"
    read = {b for op in model.net.Proto().op for b in op.input}
    params = {str(p) for p in model.GetParams("")}
    out = []
    for op in model.net.Proto().op:
        for b in op.output:
            if (b.startswith(first) and not b.endswith("_grad") and b in read and b not in params
                    and b + "_grad" in read):
                out.append(stripBlobName(b))
    return out


def _shift(model, activations, from_device: int, to_device: int) -> None:
    prefix = f"{model._device_prefix}_{from_device}/"
    moved = {prefix + a for a in activations}
    every = {prefix + a for a in GetActivationBlobs(model)}
    placement = {a: to_device for a in moved}
    placement.update((b, from_device) for b in every if b not in moved)
    for op in model.net.Proto().op:
        if op.device_option.device_id != from_device:
            continue
        device = None
        for b in list(op.input) + list(op.output):     # activations decide; the op's outputs last
            if b in placement and (b in every or device is None):
                device = placement[b]
        device = op.device_option.device_id if device is None else device
        for b in list(op.input) + list(op.output):
            if b not in placement and b.startswith(prefix):
                placement[b] = device
        op.device_option.device_id = device
    for op in model.param_init_net.Proto().op:
        if op.output and op.output[0] in placement:
            op.device_option.device_id = placement[op.output[0]]


def ShiftActivationDevices(model, activations, shifts):   # noqa: N802
    """Move the ops of `activations` (unscoped, see GetActivationBlobs) of each device in shifts {from: to} to
    the other GPU, with their parameters and gradient ops, and add the copies between devices."""
    if set(shifts.values()) & set(shifts):
        raise AssertionError("a device cannot be both shifted from and to")
    for source, target in shifts.items():
        log.info("Shifting %d activations from %s --> %s", len(activations), source, target)
        _shift(model, activations, source, target)
    model.param_init_net, blob_to_device = core.InjectCrossDeviceCopies(model.param_init_net)
    model.net, _ = core.InjectCrossDeviceCopies(model.net, blob_to_device)
