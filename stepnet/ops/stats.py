"""Named int64 counters (Caffe2's stats_ops and core/stats): StatRegistryCreate, StatRegistryUpdate,
StatRegistryExport; the wall-clock timers TimerBegin, TimerEnd, TimerGetAndEnd, TimerGet; WallClockTime (the time
since the epoch in ns, caffe2/operators/utility_ops.h); CpuUtilizationReport.

A StatRegistry maps names (bytes) to int64 counts. The ops use the one given as an input, or else the default
registry of their workspace tree (default_registry: kept in Workspace.shared, so every net of a workspace and its
children shares it; Caffe2 keeps one per process, stepnet keeps no global state): the timers and
CpuUtilizationReport add their events to it ("<name>/time_ns/sum" and "/count", "<stats_name>/cpu_utilization"),
and `record` lets other families add theirs."""
from __future__ import annotations

import threading
import time

import numpy as np

from ..core.errors import ArgumentError, DTypeError, OpError, ShapeError
from .base import held_object, out_spec, size_of
from .registry import SHOULD_NOT_DO_GRADIENT, op


class StatRegistry:
    """Counters by name, in the order they were first added; safe to share between threads."""

    def __init__(self):
        self.stats: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def add(self, key, value: int = 0) -> int:
        """Add value to the counter `key` (created at 0 when new); its new count."""
        key = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        with self._lock:
            count = self.stats[key] = (self.stats.get(key, 0) + int(value) + 2**63) % 2**64 - 2**63
            return count

    def publish(self, reset: bool) -> list[tuple[bytes, int, int]]:
        """(key, count, time in ns) of every counter; with reset the counts go back to 0 (the keys stay)."""
        with self._lock:
            now = time.time_ns()
            out = [(k, v, now) for k, v in self.stats.items()]
            if reset:
                self.stats = dict.fromkeys(self.stats, 0)
            return out

    def __repr__(self):
        return f"StatRegistry({len(self.stats)} counters)"


def default_registry(workspace) -> StatRegistry:
    """The default StatRegistry of a workspace tree (made on first use)."""
    return workspace.shared.setdefault("stats", StatRegistry())


def record(workspace, key, value: int = 1) -> int:
    """Add value to the counter `key` of the workspace tree's default registry (Caffe2's CAFFE_EVENT)."""
    return default_registry(workspace).add(key, value)


def _object(value, i: int, cls: type, maker: str):
    return held_object(value, cls, i, f"a {cls.__name__}", maker)


def _registry(ctx, inputs: tuple, i: int) -> StatRegistry:
    return _object(inputs[0], i, StatRegistry, "StatRegistryCreate") if inputs else default_registry(ctx.workspace)


@op("StatRegistryCreate", inputs=0, outputs=1)
def stat_registry_create(xp):
    """A new empty StatRegistry."""
    return StatRegistry()


def _update_shape(specs, **_):
    keys, values = specs[:2]
    if len(specs) > 2:
        _object(specs[2], 2, StatRegistry, "StatRegistryCreate")
    if size_of(keys) != size_of(values):
        raise ShapeError(f"keys and values must have as many elements, got {keys.shape} and {values.shape}")
    return []


@op("StatRegistryUpdate", inputs=(2, 3), outputs=0, context=True, shape=_update_shape)
def stat_registry_update(ctx, xp, keys, values, *registry):
    """Add values[i] (int64) to the counter named keys[i] (strings), in the given registry or the default
    one; counters that do not exist yet start at 0."""
    target = _registry(ctx, registry, 2)
    if getattr(keys, "dtype", None) is None or keys.dtype.kind != "O":
        raise DTypeError(f"input 0 (keys) must be a string tensor, got {getattr(keys, 'dtype', type(keys))}")
    if getattr(values, "dtype", None) != np.int64:
        raise DTypeError(f"input 1 (values) must be an int64 tensor, got {getattr(values, 'dtype', type(values))}")
    if keys.size != values.size:
        raise ShapeError(f"keys and values must have as many elements, got {tuple(keys.shape)} and "
                         f"{tuple(values.shape)}")
    names = np.asarray(keys).reshape(-1).tolist()
    if not all(isinstance(k, (bytes, str)) for k in names):
        raise DTypeError("input 0 (keys) must hold strings, but it holds other objects")
    for k, v in zip(names, np.asarray(values).reshape(-1).tolist()):
        target.add(k, v)


def _export_shape(specs, **_):
    if specs:
        _object(specs[0], 0, StatRegistry, "StatRegistryCreate")
    return []


@op("StatRegistryExport", inputs=(0, 1), outputs=3, args={"reset": True}, context=True, shape=_export_shape)
def stat_registry_export(ctx, xp, *registry, reset):
    """Every counter of the given registry (or the default one): its names (strings), counts (int64) and the
    time of the export in ns since the epoch (int64), 1-D each; reset (default true) sets the counts to 0."""
    data = _registry(ctx, registry, 0).publish(reset)
    keys = np.empty(len(data), object)
    keys[:] = [k for k, _, _ in data]
    return (keys, np.asarray([v for _, v, _ in data], np.int64).reshape(-1),
            np.asarray([t for _, _, t in data], np.int64).reshape(-1))


# --------------------------------------------------------------------------------------------- timers
class Timer:
    """A wall-clock timer named `name`; each end adds its nanoseconds to "<name>/time_ns/sum" and one to
    "<name>/time_ns/count" in `stats` (its workspace tree's default registry)."""
    __slots__ = ("name", "start", "stats")

    def __init__(self, name: str, stats: StatRegistry):
        self.name, self.start, self.stats = name, None, stats
        for part in ("sum", "count"):
            stats.add(f"{name}/time_ns/{part}", 0)

    def begin(self) -> None:
        if self.start is not None:
            raise OpError(f"timer {self.name!r} is already running (TimerBegin twice without TimerEnd)")
        self.start = time.perf_counter_ns()

    def elapsed(self) -> int:
        if self.start is None:
            raise OpError(f"timer {self.name!r} is not running (TimerBegin starts it)")
        return time.perf_counter_ns() - self.start

    def end(self) -> int:
        nanos = self.elapsed()
        self.stats.add(f"{self.name}/time_ns/sum", nanos)
        self.stats.add(f"{self.name}/time_ns/count", 1)
        self.start = None
        return nanos

    def __repr__(self):
        return f"Timer({self.name!r}, {'running' if self.start is not None else 'stopped'})"


def _timer(value) -> Timer:
    return _object(value, 0, Timer, "TimerBegin")


@op("TimerBegin", inputs=0, outputs=1, context=True, args={"counter_name": ""})
def timer_begin(ctx, xp, *, counter_name):
    """Start the op's timer (one per op, named counter_name, by default the output's name) and output it."""
    timer = ctx.state.get("timer")
    if timer is None:
        timer = ctx.state["timer"] = Timer(counter_name or ctx.opdef.output[0], default_registry(ctx.workspace))
    timer.begin()
    return timer


@op("TimerEnd", inputs=1, outputs=0)
def timer_end(xp, timer):
    """Stop the timer, adding its time to its stats."""
    _timer(timer).end()


def _timer_shape(specs):
    _timer(specs[0])   # (a known spec is a tensor: an error before anything runs)
    return []


@op("TimerGetAndEnd", inputs=1, outputs=1, shape=_timer_shape)
def timer_get_and_end(xp, timer):
    """Stop the timer, adding its time to its stats; the output is that time in ns (int64, shape [1])."""
    return np.asarray([_timer(timer).end()], np.int64)


@op("TimerGet", inputs=1, outputs=1, shape=_timer_shape)
def timer_get(xp, timer):
    """The running timer's time so far in ns (int64, 0-d); it keeps running."""
    return np.asarray(_timer(timer).elapsed(), np.int64)


@op("WallClockTime", inputs=0, outputs=1, random=True, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=lambda specs, **_: [out_spec((), np.int64)])
def wall_clock_time(xp, rng=None):
    """The time since the epoch in nanoseconds (int64, 0-d), read when the op runs. Recorded `random` (rng
    unused): its value is no function of its inputs, so the ONNX exporter must not fold it into a constant."""
    return np.asarray(time.time_ns(), np.int64)


def _utilization_shape(specs, **_):
    if specs[0].dtype is not None and specs[0].dtype != np.float32:
        raise DTypeError(f"input 0 (utilization) must be float32, got {specs[0].dtype}")
    return []


@op("CpuUtilizationReport", inputs=1, outputs=0, context=True, args={"stats_name": "utilization"},
    shape=_utilization_shape)
def cpu_utilization_report(ctx, xp, utilization, *, stats_name):
    """Add 100 x the first element of `utilization` (float32, a percentage), truncated to an integer, to the
    default registry's counter "<stats_name>/cpu_utilization"."""
    _utilization_shape([utilization])
    if utilization.size < 1:
        raise ArgumentError("input 0 (utilization) is empty; the op reads its first element")
    value = float(np.asarray(utilization).reshape(-1)[0])
    if not np.isfinite(value):
        raise ArgumentError(f"input 0 (utilization) must be a finite percentage, got {value}")
    record(ctx.workspace, f"{stats_name}/cpu_utilization", int(value * 100))
