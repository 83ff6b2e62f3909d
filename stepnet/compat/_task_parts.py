"""The parts of Caffe2's task module that Task and TaskGroup are built from (task re-exports them): the Node
and Cluster contexts, WorkspaceType, setup objects (get_setup_nets, add_setup_steps, SetupNets) and task outputs
(TaskOutput, TaskOutputList)."""
from __future__ import annotations

from . import core
from .context import define_context
from .schema import Field, from_blob_list


def _merge_node_kwargs(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return {**a, **b}


@define_context(allow_default=True)
class Cluster:
    """The node names used (in order of first use) and their keyword arguments."""

    def __init__(self):
        self._nodes: list = []
        self._node_kwargs: dict = {}

    def add_node(self, node) -> None:
        if str(node) not in self._nodes:
            self._nodes.append(str(node))
        self._node_kwargs[str(node)] = _merge_node_kwargs(node.kwargs(), self._node_kwargs.get(str(node)))

    def nodes(self) -> list:
        return self._nodes

    def node_kwargs(self) -> dict:
        return self._node_kwargs


@define_context(allow_default=True)
class Node:
    """The node that Tasks made inside it run on (only the name counts); 'local' by default."""

    def __init__(self, node="local", **kwargs):
        self._name = str(node)
        self._kwargs = kwargs
        Cluster.current().add_node(self)

    def __str__(self):
        return self._name

    def kwargs(self) -> dict:
        return self._kwargs


class WorkspaceType:
    """Whether a TaskGroup's tasks run in the session's workspace (GLOBAL, kept across runs) or in a child
    workspace made for the run (PRIVATE)."""
    PRIVATE = "private"
    GLOBAL = "global"


def _attributes(step_or_net, key) -> list:
    """The attributes under `key` of a net, or of every net of a step (its substeps' too)."""
    if isinstance(step_or_net, core.ExecutionStep):
        return [a for net in step_or_net.Nets() if net is not None for a in net.get_attributes(key)]
    if hasattr(step_or_net, "get_attributes"):
        return list(step_or_net.get_attributes(key))
    return []


def _as_list(made, what: str) -> list:
    if isinstance(made, (list, tuple)):
        return list(made)
    if isinstance(made, (core.Net, core.ExecutionStep)):
        return [made]
    if made is not None:
        raise TypeError(f"Unsupported type for {what}: {type(made).__name__}")
    return []


def get_setup_nets(key, steps_or_nets, target) -> tuple[list, list]:
    """(init nets/steps, exit nets/steps) of the setup objects under `key` in these steps' and nets' attributes,
    each object used once (and only for `target` when it names one)."""
    init_net, exit_net = core.Net(key + "/init"), core.Net(key + "/exit")
    init_nets, exit_nets = [], []
    objs = [obj for s in steps_or_nets for obj in _attributes(s, key)]
    for obj in objs:
        if getattr(obj, "_setup_used", False):
            continue
        if hasattr(obj, "_setup_target") and obj._setup_target != target:
            continue
        if hasattr(obj, "setup"):
            init_nets += _as_list(obj.setup(init_net), "setup")
            obj._setup_used = True
        if hasattr(obj, "exit"):
            exit_nets += _as_list(obj.exit(exit_net), "exit")
            obj._setup_used = True
    if init_net.Proto().op:
        init_nets.insert(0, init_net)
    if exit_net.Proto().op:
        exit_nets.insert(0, exit_net)
    return init_nets, exit_nets


def add_setup_steps(step, init_nets, exit_nets, name):
    """step between a '<name>:init' step of init_nets and a '<name>:exit' step of exit_nets (step itself when
    there are none)."""
    if not init_nets and not exit_nets:
        return step
    steps = [core.execution_step(f"{name}:init", init_nets)] if init_nets else []
    steps.append(step)
    if exit_nets:
        steps.append(core.execution_step(f"{name}:exit", exit_nets))
    return core.execution_step(name, steps)


class TaskOutput:
    """What a task returns: a blob, a list of blobs or a record; its value (fetch) once a session ran it."""

    def __init__(self, names):
        self._schema = None
        if isinstance(names, Field):
            self._schema = names
            names = names.field_blobs()
        self._is_scalar = type(names) not in (tuple, list)
        self.names = [names] if self._is_scalar else names
        self._values = None
        self._fetch_func = None

    def set(self, values, _fetch_func=None) -> None:
        if len(values) != len(self.names):
            raise AssertionError(f"{len(values)} values for {len(self.names)} outputs")
        self._values = values
        self._fetch_func = _fetch_func

    def _shaped(self, values):
        if self._is_scalar:
            return values[0]
        if self._schema is not None:
            return from_blob_list(self._schema, values)
        return values

    def get(self):
        if self._values is None:
            raise AssertionError("Output value not set yet.")
        return self._shaped(self._values)

    def fetch(self):
        if self._fetch_func is None:
            raise AssertionError("Cannot fetch value for this output.")
        return self._shaped([self._fetch_func(v) for v in self._values])


class TaskOutputList:
    """The outputs of a task, set from one list of values."""

    def __init__(self, outputs=None):
        self.outputs = outputs or []

    def names(self) -> list:
        return [n for o in self.outputs for n in o.names]

    def set_values(self, values, _fetch_func=None) -> None:
        offset = 0
        for o in self.outputs:
            o.set(values[offset:offset + len(o.names)], _fetch_func)
            offset += len(o.names)
        if offset != len(values):
            raise AssertionError("Wrong number of output values.")


class SetupNets:
    """Nets to run once at the start (init_nets) and end (exit_nets) of a Task or TaskGroup, attached to a net
    with `net.add_attribute(Task.TASK_SETUP, SetupNets(...))` (or TaskGroup.LOCAL_SETUP)."""

    def __init__(self, init_nets=None, exit_nets=None):
        self.init_nets = init_nets
        self.exit_nets = exit_nets

    def setup(self, init_net):
        return self.init_nets

    def exit(self, exit_net):
        return self.exit_nets
