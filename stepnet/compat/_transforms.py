"""Caffe2's net transforms (workspace.ApplyTransform / ApplyTransformIfFaster, caffe2/core/transform.cc):
rewrites from a NetDef to a new NetDef, by the name Caffe2 registers them under. The given net is never
changed.

- ConvToNNPack (caffe2/transforms/conv_to_nnpack_transform.h): every Conv op on the CPU whose engine is not
  NNPACK gets engine NNPACK. Engines are hints in stepnet, so the net computes the same thing.
"""
from __future__ import annotations

import time

from ..core.errors import ArgumentError, did_you_mean
from ..core.limits import Limits
from ..graph.view import copy_net
from ..io.proto import NetDef
from ..runtime.workspace import Workspace

CPU = 0


def conv_to_nnpack(net: NetDef) -> NetDef:
    new = copy_net(net)
    for op in new.op:
        if op.type == "Conv" and op.device_option.device_type == CPU and op.engine != "NNPACK":
            op.engine = "NNPACK"
    return new


TRANSFORMS = {"ConvToNNPack": conv_to_nnpack}


def apply_transform(key: str, net: NetDef) -> NetDef:
    """A new NetDef: the transform registered as `key` applied to net."""
    transform = TRANSFORMS.get(key)
    if transform is None:
        raise ArgumentError(f"Transform not found in registry: {key!r}{did_you_mean(key, list(TRANSFORMS))} "
                            f"(stepnet has {', '.join(sorted(TRANSFORMS))})")
    return transform(net)


def run_time_ms(net: NetDef, init_net: NetDef, warmup_runs: int, main_runs: int) -> float:
    """Milliseconds main_runs runs of net take after warmup_runs, in a fresh workspace that init_net set up
    (or, with no init ops, where the net's external inputs exist empty, as Caffe2 does)."""
    if warmup_runs < 0:
        raise ArgumentError(f"Number of warm up runs should be non negative, provided {warmup_runs}.")
    if main_runs <= 0:
        raise ArgumentError(f"Number of main runs should be positive, provided {main_runs}.")
    ws = Workspace(limits=Limits(trusted=True))
    if len(init_net.op):
        ws.run_net_once(init_net)
    else:
        for name in net.external_input:
            ws.create_blob(name)
    bound = ws.create_net(net)
    for _ in range(warmup_runs):
        bound.run()
    start = time.perf_counter()
    for _ in range(main_runs):
        bound.run()
    return (time.perf_counter() - start) * 1000


def apply_transform_if_faster(key: str, net: NetDef, init_net: NetDef, warmup_runs: int = 5,
                              main_runs: int = 10, improvement_threshold: float = 1.01) -> NetDef:
    """The transformed net if it runs faster than net by more than improvement_threshold times, else net."""
    transformed = apply_transform(key, net)
    before = run_time_ms(net, init_net, warmup_runs, main_runs)
    after = run_time_ms(transformed, init_net, warmup_runs, main_runs)
    return transformed if before > improvement_threshold * after else copy_net(net)
