"""ONNXWhile (Caffe2's onnx_while_op): ONNX's Loop on the sub-net primitive, as control.py runs If and While.

Inputs: the trip count M (int64, one element), the first iteration's condition (bool, int32 or int64, one
element) and N loop-carried dependencies. The `body` net declares 2 + N external inputs (iteration number,
condition, the N dependencies) and 1 + N + K external outputs (the next condition, the N dependencies' next
values, K scan outputs). The op's outputs are the N final values, then the K scan outputs.

The loop runs while `i < M` (has_trip_count) and the condition holds (has_cond: the op's condition input before
the first iteration, the body's condition output after each); an op with neither never ends, which is refused.
The body runs in a workspace of its own that sees none of the op's blobs (Caffe2's WorkspaceStack with no
bindings): one kept for every run, or with `save_scopes` one per iteration, kept until the next run; with
`disable_scopes` (later Caffe2) it runs in the op's own workspace, where its blobs stay.

Values cross as copies (Caffe2's CopyFrom): into the body the op's dependencies, the iteration number as an
int64 (1,) tensor and the condition in its input's dtype; out of it the outputs an iteration left, read all
before any is carried (the dependencies of the next iteration are the last iteration's outputs, also when an
output names another dependency's input: Caffe2 reads them in place one after another unless save_scopes).
A scan output is Caffe2's growing tensor: the first iteration's value, extended by one row per later iteration,
so after n > 1 iterations a value of shape (1, d...) gives (n, d...); a value of another shape has no defined
layout there (Caffe2 copies past the rows it added) and is refused, as is a shape or dtype that changes. No
iteration gives a scan output an empty int32 (0,) tensor, and the dependencies' final values are the inputs.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, DTypeError, NetError, ShapeError
from ..core.limits import check_blob
from .base import on_device
from .control import _writes, own_net
from .registry import Arg, op

BEFORE_DEPS = 2   # the inputs before the loop-carried dependencies: trip count, first condition
CONDITION_DTYPES = (np.dtype(np.bool_), np.dtype(np.int32), np.dtype(np.int64))

LOOP_ARGS = {
    "body": Arg("net", doc="net run on each iteration: inputs (iteration, condition, N dependencies), outputs "
                           "(condition, N dependencies, K scan outputs)"),
    "has_trip_count": Arg("bool", False, "stop after max_trip_count iterations"),
    "has_cond": Arg("bool", False, "stop when the condition is false (the input's before the first iteration, "
                                   "the body's after each)"),
    "save_scopes": Arg("bool", False, "run each iteration in a workspace of its own, kept until the next run"),
    "disable_scopes": Arg("bool", False, "run the body in the op's own workspace (its blobs stay there)"),
}


def _what(value) -> str:
    if value is None:
        return "<empty>"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{tuple(value.shape)} {value.dtype}"
    return type(value).__name__


def _scalar(value, what: str, dtypes) -> int:
    """The one element of a flag or count tensor whose dtype is one of `dtypes`, on the host."""
    if getattr(value, "dtype", None) not in dtypes or getattr(value, "size", 0) != 1:
        kinds = ", ".join(str(d) for d in dtypes[:-1]) + (" or " if len(dtypes) > 1 else "") + str(dtypes[-1])
        raise ArgumentError(f"{what} must hold one element of type {kinds}, got {_what(value)}")
    return np.asarray(backend.to_host(value)).reshape(-1)[0].item()


class _LoopConfig:
    """The op's arguments and body, checked once (Caffe2 checks them when it creates the op or first runs it)."""

    def __init__(self, ctx, body, has_trip_count: bool, has_cond: bool, save_scopes: bool, disable_scopes: bool):
        if save_scopes and disable_scopes:
            raise ArgumentError("save_scopes and disable_scopes cannot both be set (with disable_scopes there are "
                                "no scopes to save)")
        if not has_trip_count and not has_cond:
            raise ArgumentError("has_trip_count and has_cond are both 0, so nothing can end the loop (the body's "
                                "condition output is ignored); set has_trip_count or has_cond")
        n = len(ctx.opdef.input) - BEFORE_DEPS
        ins, outs = list(body.external_input), list(body.external_output)
        if len(ins) != n + 2:
            raise ArgumentError(f"the body net has {len(ins)} external inputs; it needs 2 + N = {n + 2}: the "
                                f"iteration number, the condition and the op's N = {n} loop-carried dependencies")
        k = len(outs) - 1 - n
        if k < 0:
            raise ArgumentError(f"the body net has {len(outs)} external outputs; it needs 1 + N + K: the condition, "
                                f"the N = {n} loop-carried dependencies and K >= 0 scan outputs")
        if len(ctx.opdef.output) != n + k:
            raise ArgumentError(f"the op has {len(ctx.opdef.output)} outputs; the body gives N + K = {n + k}: the "
                                f"{n} final loop-carried dependencies and {k} scan outputs")
        self.deps, self.scans = n, k
        self.ins, self.outs = ins, outs
        self.has_trip_count, self.has_cond = has_trip_count, has_cond
        self.save, self.shared = save_scopes, disable_scopes
        self.net = own_net(ctx, "body", body)
        names, unnamed = _writes([body])
        # a condition the body passes through unchanged: true once, true for ever
        self.fixed_condition = outs[0] == ins[1] and outs[0] not in names and not unnamed
        self.scopes: list = []   # the body's workspaces (one, or one per iteration with save_scopes)

    def workspace(self, ctx, k: int):
        """The workspace iteration k runs in: the op's own, the one scope, or scope k."""
        if self.shared:
            return ctx.workspace
        k = k if self.save else 0
        while len(self.scopes) <= k:
            self.scopes.append(ctx.workspace.scope())
        return self.scopes[k]


def _enter(ws, cfg: _LoopConfig, xp, k: int, condition, deps: list) -> None:
    """Set the body's inputs in `ws` for iteration k (Caffe2's LocalScope, then the values of the iteration)."""
    cond_out = ws.create_blob(cfg.outs[0])
    if cond_out.value is None:
        cond_out.set(on_device(xp, [False], np.bool_))
    for name, value in zip(cfg.ins[BEFORE_DEPS:], deps):
        ws.create_blob(name).set(value)
    ws.create_blob(cfg.ins[0]).set(on_device(xp, [k], np.int64))
    ws.create_blob(cfg.ins[1]).set(condition)


def _leave(ws, cfg: _LoopConfig, xp) -> list:
    """Copies of the body's outputs after an iteration (the condition, the dependencies, the scan outputs)."""
    values = []
    for name in cfg.outs:
        blob = ws.find(name)
        if blob is None or blob.value is None:
            raise NetError(f"the body left no value in its external output {name!r}")
        if not hasattr(blob.value, "dtype"):
            raise DTypeError(f"the body's external output {name!r} holds a {type(blob.value).__name__}, not a tensor")
        values.append(xp.copy(blob.value))
    return values


def _check_scan(name: str, first, value, k: int, limit: int, label) -> None:
    """Scan output `name`'s value in iteration k >= 1 against the first iteration's: same shape and dtype, a
    leading dimension of 1 (a row appended to Caffe2's growing tensor), the grown tensor within the blob limit."""
    if tuple(value.shape) != tuple(first.shape):
        raise ShapeError(f"Size of scan output {name!r} changed across iterations: {tuple(first.shape)} in the "
                         f"first, {tuple(value.shape)} in iteration {k}")
    if value.dtype != first.dtype:
        raise DTypeError(f"scan output {name!r} changed its type across iterations: {first.dtype} in the first, "
                         f"{value.dtype} in iteration {k}")
    if value.ndim == 0 or value.shape[0] != 1:
        raise ShapeError(f"scan output {name!r} has shape {tuple(value.shape)}; over more than one iteration "
                         "ONNXWhile appends each value as one row of a growing tensor, so it needs shape (1, ...)")
    check_blob(limit, name, (k + 1,) + tuple(value.shape[1:]), value.dtype, label)


@op("ONNXWhile", inputs=(2, None), outputs=(0, None), context=True, devices="any", args=LOOP_ARGS,
    writes_unnamed=True,
    doc="ONNX's Loop: runs `body` while the iteration number is below input 0 (has_trip_count) and the "
        "condition holds (has_cond; input 1 first), carrying inputs 2... as loop-carried dependencies; outputs "
        "their final values, then the body's scan outputs one row per iteration.")
def onnx_while(ctx, xp, max_trip_count, condition, *deps, body, has_trip_count, has_cond, save_scopes,
               disable_scopes):
    """No cap on the iterations beyond the model's own (a trip count up to 2^63 - 1, or a condition), as While:
    the loop runs Python code each iteration, so Ctrl-C stops it, and scan outputs meet the blob limit as they
    grow. A loop that provably never ends (no trip count, a true condition the body passes through) is refused."""
    cfg = ctx.state.get("loop")
    if cfg is None:
        cfg = ctx.state["loop"] = _LoopConfig(ctx, body, has_trip_count, has_cond, save_scopes, disable_scopes)
    names = ctx.opdef.input
    trips = _scalar(max_trip_count, f"the trip count {names[0]!r}", (np.dtype(np.int64),))
    going = bool(_scalar(condition, f"the condition {names[1]!r}", CONDITION_DTYPES))
    for name, value in zip(names[BEFORE_DEPS:], deps):
        if not hasattr(value, "dtype") or not hasattr(value, "shape"):
            raise DTypeError(f"loop-carried dependency {name!r} must be a tensor, got {_what(value)}")
    if going and cfg.has_cond and not cfg.has_trip_count and cfg.fixed_condition:
        raise ArgumentError(f"the condition is true and the body passes it through unchanged ({cfg.outs[0]!r}), so "
                            "the loop would never end; have an op of the body compute its condition output")
    values = [xp.copy(v) for v in deps]
    cond_value, limit = on_device(xp, [going], condition.dtype), ctx.workspace.limits.max_blob_bytes
    scans: list[list] = [[] for _ in range(cfg.scans)]
    k = 0
    while (not cfg.has_trip_count or k < trips) and (not cfg.has_cond or going):
        ws = cfg.workspace(ctx, k)
        _enter(ws, cfg, xp, k, cond_value, values)
        ctx.bind(cfg.net, ws).run()
        out = _leave(ws, cfg, xp)
        said = bool(_scalar(out[0], f"the body's condition output {cfg.outs[0]!r}", CONDITION_DTYPES))
        going = said if cfg.has_cond else going
        cond_value = on_device(xp, [said], condition.dtype)
        values = out[1:1 + cfg.deps]
        for j, value in enumerate(out[1 + cfg.deps:]):
            if k:
                _check_scan(cfg.outs[1 + cfg.deps + j], scans[j][0], value, k, limit, ctx.label)
            scans[j].append(value)
        k += 1
    if cfg.save and k:   # Caffe2 leaves the final values in one more scope
        _enter(cfg.workspace(ctx, k), cfg, xp, k, cond_value, [xp.copy(v) for v in values])
    return tuple(values) + tuple(_stacked(xp, s) for s in scans)


def _stacked(xp, rows: list):
    """A scan output: nothing (an empty int32 tensor), the one value, or the values' rows concatenated."""
    if not rows:
        return on_device(xp, [], np.int32)
    return rows[0] if len(rows) == 1 else xp.concatenate(rows, axis=0)
