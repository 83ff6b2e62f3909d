"""Caffe2's net_builder: NetBuilder and `ops`, which builds nets, loops and conditionals in the scope of the
active NetBuilder (or Task).

    with NetBuilder() as nb:
        c = ops.Const(5)
        d = ops.Const(0)
        with ops.loop():
            ops.stop_if(ops.LE([c, ops.Const(0)]))
            ops.Add([c, ops.Const(-1)], [c])
            with ops.If(ops.GE([c, ops.Const(3)])):
                ops.Add([d, ops.Const(10)], [d])
    step = core.to_execution_step(nb)

`ops.<Operator>(...)` adds the op to the builder's current net; loop, stop_guard, If (with Elif/Else) open
blocks that become execution steps controlled by stop blobs; IfNet/Else and WhileNet/Condition open blocks that
become one net of If/While ops (net_builder's _use_control_ops mode); task_init, task_exit, task_instance_init,
task_instance_exit, local_init and local_exit open blocks that a Task or TaskGroup runs at its start or end.
"""
from __future__ import annotations

from . import core
from ._netblocks import (_Loop, _RunElseNet, _RunIf, _RunIfNet, _RunOnce, _RunWhileCondition,  # noqa: F401
                         _RunWhileNet, _StopGuard, stop)
from ._netbuilder import NetBuilder
from .task import Cluster, Node, Task, TaskGroup


class _SetupBuilder(NetBuilder):
    """A block run at a Task's (or TaskGroup's) start (INIT) or end (EXIT): a setup object of the net it was
    opened in."""

    INIT = "init"
    EXIT = "exit"

    def __init__(self, type, name=None):  # noqa: A002 - Caffe2's argument name
        NetBuilder.__init__(self, name)
        self.type = type

    def setup(self, net):
        if self.type == _SetupBuilder.INIT:
            return core.to_execution_step(self)
        return None

    def exit(self, net):
        if self.type == _SetupBuilder.EXIT:
            return core.to_execution_step(self)
        return None


class _ReporterBuilder(NetBuilder):
    """A block run every interval_ms while the task (net given) or task group runs."""

    def __init__(self, interval_ms, net=None, name=None):
        NetBuilder.__init__(self, name)
        self._net = net
        self.interval_ms = interval_ms

    def __exit__(self, etype, *args):
        if etype is None:
            step = core.to_execution_step(self)
            step.RunEveryMillis(self.interval_ms)
            if self._net:
                self._net.add_attribute(Task.REPORT_STEP, step)
            else:
                TaskGroup.current().report_step(step, interval_ms=self.interval_ms)
        return NetBuilder.__exit__(self, etype, *args)


class Operations:
    """The operations of the active NetBuilder (`ops`): any operator by name, and the blocks."""

    def net(self, net=None, name=None):
        """Add `net` to the active builder (and return it), or return its current net (a new one named `name`
        when a name is given)."""
        if name is not None and net is not None:
            raise AssertionError("Cannot provide both `net` and `name`.")
        if net is not None:
            NetBuilder.current().add(net)
            return net
        return NetBuilder.current().current_net(name=name)

    def __getattr__(self, op_type):
        if op_type.startswith("__"):
            raise AttributeError(op_type)
        if NetBuilder.current(required=False) is None:   # hasattr(ops, X) works outside a builder
            raise AttributeError("No active NetBuilder.")
        return getattr(self.net(), op_type)

    def task_group(self):
        """A TaskGroup (on node 'local') run as the next step of the active builder."""
        builder = NetBuilder.current()
        with Cluster():
            with Node("local"):
                group = TaskGroup()
                builder.add(group)
                return group

    def stop(self) -> None:
        """Stop the active builder's step here."""
        stop()

    def stop_if(self, blob) -> None:
        """Stop the active builder's step here when the scalar bool `blob` is true."""
        NetBuilder.current().stop_if(blob)

    def loop(self, iters=None, name=None):
        """A block run in a loop: `iters` times (a number or a blob; `loop.iter()` counts from 0), or until
        stop/stop_if when not given."""
        return NetBuilder.current().add(_Loop(iters, name=name))

    def stop_guard(self, has_stopped_blob=None, name=None):
        """A block run once; its has_stopped() blob says whether a stop ended it early."""
        return NetBuilder.current().add(_StopGuard(has_stopped_blob=has_stopped_blob, name=name))

    def If(self, cond, name=None):
        """A block run once if the scalar bool `cond` is true; .Elif(cond) and .Else() on it continue the
        chain."""
        return NetBuilder.current().add(_RunIf(cond, name=name))

    def IfNet(self, cond, name=None):
        """As If, but the block becomes one net with an If operator (its blobs not in the outer scope stay
        local)."""
        return NetBuilder.current().add(_RunIfNet(cond, name=name))

    def Else(self, name=None):
        """The else branch of the IfNet block just before it."""
        return _RunElseNet(name=name)

    def WhileNet(self, name=None):
        """A block that becomes one net with a While operator; open ops.Condition() first inside it."""
        return NetBuilder.current().add(_RunWhileNet(name=name))

    def Condition(self, name=None):
        """The loop condition of the enclosing WhileNet: its last op's output, computed before each iteration."""
        if not isinstance(NetBuilder.current(), _RunWhileNet):
            raise AssertionError("Use of Condition outside of WhileNet")
        return _RunWhileCondition(name=name)

    def _setup(self, key, kind, name=None):
        setup = _SetupBuilder(kind, name)
        self.net().add_attribute(key, setup)
        return setup

    def task_init(self):
        """A block run once at the start of the task (before all of its instances)."""
        return self._setup(Task.TASK_SETUP, _SetupBuilder.INIT)

    def task_exit(self):
        """A block run once at the end of the task (after all of its instances)."""
        return self._setup(Task.TASK_SETUP, _SetupBuilder.EXIT)

    def task_instance_init(self):
        """A block run at the start of each instance of the task, in its workspace."""
        return self._setup(Task.TASK_INSTANCE_SETUP, _SetupBuilder.INIT)

    def task_instance_exit(self):
        """A block run at the end of each instance of the task, in its workspace."""
        return self._setup(Task.TASK_INSTANCE_SETUP, _SetupBuilder.EXIT)

    def local_init(self):
        """A block run once on each node before any task of the TaskGroup."""
        return self._setup(TaskGroup.LOCAL_SETUP, _SetupBuilder.INIT)

    def local_exit(self, name=None):
        """A block run once on each node after every task of the TaskGroup."""
        return self._setup(TaskGroup.LOCAL_SETUP, _SetupBuilder.EXIT, name)

    def task_reporter(self, interval_ms: int = 1000, name=None):
        """A block run every interval_ms while the task runs (and once at its end)."""
        return _ReporterBuilder(interval_ms, net=self.net(), name=name)

    def local_reporter(self, interval_ms: int = 1000, name=None):
        """A block run every interval_ms while any task of the current TaskGroup runs."""
        return _ReporterBuilder(interval_ms, name=name)


ops = Operations()

__all__ = ["NetBuilder", "Operations", "ops"]
