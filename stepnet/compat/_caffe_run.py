"""What caffe_translator learns by running a partial translation on a scratch workspace: the blob shapes Crop
needs, and the explicit pads that replace Caffe1's ceil-mode pooling (`legacy_pad`) for --remove_legacy_pad."""
from __future__ import annotations

import numpy as np

from ..core.errors import StepnetError
from ..ops.window import CAFFE_LEGACY_POOLING
from ..runtime.workspace import Workspace
from . import utils
from ._caffe_layers import TranslationError

LEGACY_TYPES = ("Conv", "ConvTranspose", "MaxPool", "AveragePool")


def scratch_run(ops, net_params, input_shapes: dict, why: str):
    """Runs ops on random inputs of input_shapes with the trained params; yields (index, op, input shapes)
    before each op runs, and returns the workspace."""
    ws = Workspace(seed=0)
    rng = np.random.default_rng(0)
    for name, shape in input_shapes.items():   # (sizes from the file: checked before anything is allocated)
        size = 4 * int(np.prod(shape, dtype=object))
        if any(int(d) < 0 for d in shape) or size > ws.limits.max_blob_bytes:
            raise TranslationError(f"input {name!r} of shape {list(shape)} ({size} bytes) cannot be run to {why}: "
                                   f"over the blob limit of {ws.limits.max_blob_bytes} bytes (give smaller "
                                   "--input_dims)")
        ws.feed(name, rng.standard_normal(shape, dtype=np.float32))
    for p in net_params.protos:
        ws.feed(p.name, utils.Caffe2TensorToNumpyArray(p))
    for i, op in enumerate(ops):
        shapes = [np.shape(ws.fetch(b)) if ws.has(b) else None for b in op.input]
        yield i, op, shapes
        try:
            ws.run_operator_once(op)
        except StepnetError as e:
            raise TranslationError(f"running the translated net on inputs {input_shapes} to {why} failed at op "
                                   f"#{i} ({op.type}): {e}") from None
    return ws


def blob_shapes(net, net_params, input_shapes: dict, why: str) -> dict:
    """The shape of every blob after running net's ops (and the inputs' own shapes)."""
    shapes = {name: tuple(shape) for name, shape in input_shapes.items()}
    run = scratch_run(net.op, net_params, input_shapes, why)
    try:
        while True:
            next(run)
    except StopIteration as done:
        ws = done.value
    for op in net.op:
        shapes.update((b, np.shape(ws.fetch(b))) for b in op.output if ws.has(b))
    return shapes


def _args(op) -> dict:
    return {a.name: a for a in op.arg}


def remove_legacy_pad(net, net_params, input_shapes: dict):
    """net with each op's legacy_pad=CAFFE_LEGACY_POOLING replaced by explicit pads giving the same output size:
    Caffe1's ceil-mode output o needs an end pad of (o-1)*stride + kernel - size - begin pad. A `pad` argument
    becomes pad_l, pad_t, pad_r, pad_b (as Caffe2's translator writes them) where an end pad changes."""
    run = scratch_run(net.op, net_params, input_shapes, "remove the legacy pads")
    for _, op, shapes in run:
        args = _args(op)
        if op.type not in LEGACY_TYPES or "legacy_pad" not in args:
            continue
        if args["legacy_pad"].i != CAFFE_LEGACY_POOLING or len(shapes[0] or ()) != 4:
            raise TranslationError(f"op {op.output[0]!r} ({op.type}): only 4-D inputs with legacy_pad "
                                   f"{CAFFE_LEGACY_POOLING} (Caffe1's pooling) can have their legacy pad removed")
        h, w = shapes[0][2:]
        pads = _pads(args)
        is_global = "global_pooling" in args and args["global_pooling"].i
        kernel = (h, w) if is_global else _pair(args, "kernel", None)
        stride = _pair(args, "stride", (1, 1))
        ends = {}
        for begin, end, n, k, s in (("pad_t", "pad_b", h, kernel[0], stride[0]),
                                    ("pad_l", "pad_r", w, kernel[1], stride[1])):
            p = pads[begin]
            out = -(-(n + 2 * p - k) // s) + 1          # Caffe1: ceil
            if p > 0 and (out - 1) * s >= n + p:
                out -= 1                                # the last window starts inside the image
            if (n + p + pads[end] - k) // s + 1 != out:
                ends[end] = (out - 1) * s + k - n - p
        op.arg.remove(args["legacy_pad"])
        if not ends:
            continue
        pads.update(ends)
        if "pad" in args:
            op.arg.remove(args["pad"])
            op.arg.extend(utils.MakeArgument(k, v) for k, v in pads.items())
        else:
            for name, value in pads.items():
                if name in args:
                    args[name].i = value
                else:
                    op.arg.append(utils.MakeArgument(name, value))
    return net


def _pads(args) -> dict:
    keys = ("pad_l", "pad_t", "pad_r", "pad_b")
    if "pad" in args:
        return {k: args["pad"].i for k in keys}
    return {k: args[k].i if k in args else 0 for k in keys}


def _pair(args, name, default):
    if name in args:
        return (args[name].i, args[name].i)
    if f"{name}_h" in args:
        return (args[f"{name}_h"].i, args[f"{name}_w"].i)
    return default
