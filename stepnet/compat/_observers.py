"""`workspace.C`'s net observers (Caffe2's `add_observer_to_net` and the `Observer` it returns), and the
`core.Net` methods over them (`AddObserver`, `RemoveObserver`, `NumObservers`), on the runtime's observer
hook (`runtime.profile.Observer`) of a net created in the current workspace.

The two observer types Caffe2's Python binding offers:
  - "TimeObserver": `average_time()`, the mean milliseconds of the net's runs; `average_time_children()`, the
    sum over the net's ops of each op's mean milliseconds, over the number of ops.
  - "RunCountObserver": counts op runs, the ops of step nets at every timestep included (Caffe2 copies it onto
    the RNN executor's step ops); `debug_info()` says "This operator runs N times.". The ops are those stepnet
    runs: a forward step net's are Caffe2's, its links counted as Caffe2's link ops; a backward step net
    holds stepnet's own rewrite of the gradient ops (runtime docs), so its count may differ from Caffe2's.
Any other observer's `debug_info()` is Caffe2's "Not implemented.", its timings an error.
"""
from __future__ import annotations

import time

from ..runtime.profile import Observer as _Hook
from ._workspaces import _ws


def _ms() -> float:
    return time.perf_counter() * 1000.0


def _mean(total: float, count: int) -> float:
    return total / count if count else float("nan")   # Caffe2 divides by zero runs too (a NaN)


class Observer(_Hook):
    """C.Observer: what add_observer_to_net returns and remove_observer_from_net takes."""

    def average_time(self) -> float:
        raise RuntimeError("[enforce fail] Observer does not implement this function.")

    def average_time_children(self) -> float:
        raise RuntimeError("[enforce fail] Observer does not implement this function.")

    def debug_info(self) -> str:
        return "Not implemented."


class TimeObserver(Observer):
    """Times the observed net's runs and each of its own ops (milliseconds)."""

    def __init__(self, net):
        self._net, self._runs, self._total, self._start = net, 0, 0.0, 0.0
        self._ops = [[0, 0.0, 0.0] for _ in net.ops]   # per op: runs, total ms, start

    def net_started(self, net) -> None:
        self._runs += 1
        self._start = _ms()

    def net_stopped(self, net) -> None:
        self._total += _ms() - self._start

    def op_started(self, net, index: int, op_type: str) -> None:
        if net is self._net:
            stat = self._ops[index]
            stat[0] += 1
            stat[2] = _ms()

    def op_stopped(self, net, index: int, op_type: str) -> None:
        if net is self._net:
            stat = self._ops[index]
            stat[1] += _ms() - stat[2]

    def average_time(self) -> float:
        return _mean(self._total, self._runs)

    def average_time_children(self) -> float:
        return _mean(sum(_mean(total, runs) for runs, total, _ in self._ops), len(self._ops))


LINKS_OP = "rnn_internal_apply_links"   # stepnet's one op for a step net's links: one Caffe2 op per link


class RunCountObserver(Observer):
    """Counts the ops run, the observed net's and those of the nets they run; a step net's links op counts as
    the rnn_internal_apply_link ops Caffe2 prepends in its place, one per link (each link writes one output)."""

    def __init__(self, net):
        self.count = 0

    def op_started(self, net, index: int, op_type: str) -> None:
        self.count += len(net.ops[index].outputs) if op_type == LINKS_OP else 1

    def debug_info(self) -> str:
        return f"This operator runs {self.count} times."


OBSERVERS = {"TimeObserver": TimeObserver, "RunCountObserver": RunCountObserver}


def _net(net_name: str):
    ws = _ws()
    if net_name not in ws.nets():
        raise RuntimeError(f"[enforce fail] Can't find net {net_name}")
    return ws.net(net_name)


def add_observer_to_net(net_name: str, observer_type: str) -> Observer:
    """Attach a new observer of observer_type to the created net net_name and return it."""
    net = _net(net_name)
    if observer_type not in OBSERVERS:
        raise RuntimeError(f"[enforce fail] observer != nullptr: no observer type {observer_type!r} "
                           f"(Caffe2's Python binding offers {', '.join(OBSERVERS)})")
    observer = OBSERVERS[observer_type](net)
    net.observers.append(observer)
    return observer


def remove_observer_from_net(net_name: str, observer: Observer) -> None:
    """Detach the observer from the net (nothing happens when it is not attached, as in Caffe2)."""
    net = _net(net_name)
    net.observers[:] = [o for o in net.observers if o is not observer]


def num_observers_on_net(net_name: str) -> int:
    return len(_net(net_name).observers)


class NetObserverMethods:
    """core.Net's observer methods (its net as created in the current workspace, by name)."""

    def AddObserver(self, observer_type: str) -> Observer:
        return add_observer_to_net(self._net.name, observer_type)

    def RemoveObserver(self, observer: Observer) -> None:
        remove_observer_from_net(self._net.name, observer)

    def NumObservers(self) -> int:
        return num_observers_on_net(self._net.name)
