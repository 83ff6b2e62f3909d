"""Opt-in op timing (Caffe2's `prof_dag` net and its observers): where a run's time goes.

A `Profiler` given as `Workspace(profiler=...)` is inherited by child workspaces; every net bound there wraps
each op's call in a timer (`Profiler.timed`, chosen at bind time, so nets without a profiler run unchanged).
Ops that run sub-nets (RecurrentNetwork, If, While, Do) are timed too: their step-net ops are recorded under
the step net's name, once per timestep, and the enclosing op keeps how much of its time each sub-net took, so
its own time splits into its sub-nets and its overhead. Self time (an op's time minus the ops inside it) adds
up, over all ops, to the time spent in ops: the table's percentages are of the measured run time.

An `Observer` is the hook for a net already bound (Caffe2's net observers): put in a bound net's `observers`,
it is told when each run of that net starts and stops, and when each op starts and stops: the net's own ops
and those of the nets its ops run (step nets at every timestep, branches, loop bodies), in the thread that
runs the net. A net with observers runs op by op (compiled routines call no hooks).
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..core.errors import one_line


@dataclass
class OpStat:
    """One op of one net: calls and seconds, with the seconds of the sub-nets it ran, by net name."""
    net: str
    index: int
    type: str
    calls: int = 0
    total: float = 0.0
    inner: dict[str, float] = field(default_factory=dict)

    @property
    def self_time(self) -> float:
        return self.total - sum(self.inner.values())


class Profiler:
    """Collects per-op timings of every net bound in a workspace that has it."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.stats: dict[tuple[str, int], OpStat] = {}
        self._stack: list[dict[str, float]] = []   # per running op: seconds of its sub-nets' ops, by net

    def timed(self, call: Callable, net: str, index: int, op_type: str) -> Callable:
        """call, timed into the stat of (net, index); the time also counts as sub-net time of the enclosing op."""
        stat = self.stats.get((net, index))
        if stat is None:
            stat = self.stats[(net, index)] = OpStat(net, index, op_type)
        stack, clock = self._stack, self.clock

        def run(*values: Any):
            inner: dict[str, float] = {}
            stack.append(inner)
            start = clock()
            try:
                return call(*values)
            finally:
                elapsed = clock() - start
                stack.pop()
                stat.calls += 1
                stat.total += elapsed
                for name, t in inner.items():
                    stat.inner[name] = stat.inner.get(name, 0.0) + t
                if stack:
                    outer = stack[-1]
                    outer[net] = outer.get(net, 0.0) + elapsed
        return run

    # ------------------------------------------------------------------------------------------ results
    def by_type(self) -> dict[str, tuple[int, float]]:
        """op type -> (calls, self seconds), slowest first."""
        out: dict[str, list] = {}
        for s in self.stats.values():
            row = out.setdefault(s.type, [0, 0.0])
            row[0] += s.calls
            row[1] += s.self_time
        return {k: (c, t) for k, (c, t) in sorted(out.items(), key=lambda kv: -kv[1][1])}

    def total(self) -> float:
        """Seconds spent in ops (the sum of self times: nested ops counted once)."""
        return sum(s.self_time for s in self.stats.values())

    def slowest(self, count: int = 10) -> list[OpStat]:
        return sorted(self.stats.values(), key=lambda s: -s.self_time)[:count]

    def report(self, wall: float, top: int = 10) -> str:
        """The text table: time per op type, the slowest ops, and how ops with sub-nets split their time."""
        wall = max(wall, 1e-12)
        types = {one_line(t): v for t, v in self.by_type().items()}   # names from the file: one line each
        w = max([len("op type"), *map(len, types)])
        lines = [f"profile: {self.total():.3f} s in ops of {wall:.3f} s measured ({100 * self.total() / wall:.1f} %)",
                 f"{'op type':<{w}} {'calls':>9} {'total s':>10} {'mean ms':>10} {'% of run':>9}"]
        for op_type, (calls, t) in types.items():
            lines.append(f"{op_type:<{w}} {calls:>9} {t:>10.3f} {1000 * t / max(calls, 1):>10.4f} "
                         f"{100 * t / wall:>8.1f}%")
        lines.append("slowest ops (self time; sub-net ops are listed on their own):")
        slow = [OpStat(one_line(s.net), s.index, one_line(s.type), s.calls, s.total, s.inner)
                for s in self.slowest(top)]
        nw = max([3, *(len(s.net) for s in slow)])
        tw = max([4, *(len(s.type) for s in slow)])
        lines.append(f"{'net':<{nw}} {'op':>4} {'type':<{tw}} {'calls':>8} {'total s':>10} {'% of run':>9}")
        for s in slow:
            lines.append(f"{s.net:<{nw}} {s.index:>4} {s.type:<{tw}} {s.calls:>8} {s.self_time:>10.3f} "
                         f"{100 * s.self_time / wall:>8.1f}%")
        nested = [s for s in self.stats.values() if s.inner]
        if nested:
            lines.append("ops that run sub-nets (time = sub-nets + own overhead):")
        for s in sorted(nested, key=lambda s: -s.total):
            parts = " + ".join(f"net {one_line(repr(name))} {t:.3f} s"
                               for name, t in sorted(s.inner.items(), key=lambda kv: -kv[1]))
            lines.append(f"  {one_line(s.type)} (net {one_line(repr(s.net))}, op #{s.index}): {s.total:.3f} s = "
                         f"{parts} + overhead {s.self_time:.3f} s")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- observers
class Observer:
    """Hooks on the runs of one bound net (`executor.Net.observers`); the methods here do nothing. `net` is the
    bound net an op is in (the observed net itself or a net one of its ops runs), `index` the op's place there."""

    def net_started(self, net) -> None:
        """A run of the observed net begins."""

    def net_stopped(self, net) -> None:
        """A run of the observed net ended without an error."""

    def op_started(self, net, index: int, op_type: str) -> None:
        """An op is about to run."""

    def op_stopped(self, net, index: int, op_type: str) -> None:
        """The op ran without an error."""


_ACTIVE = threading.local()


def active_observers() -> tuple:
    """The observers of the nets running in this thread (outermost first); empty when none is observed."""
    return getattr(_ACTIVE, "observers", ())


@contextlib.contextmanager
def observing(observers) -> Iterator[None]:
    """Within the block, the ops this thread runs are reported to `observers` too."""
    before = active_observers()
    _ACTIVE.observers = before + tuple(observers)
    try:
        yield
    finally:
        _ACTIVE.observers = before
