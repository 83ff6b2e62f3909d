"""Caffe2's task module: Task (an execution step with setup, exit and outputs), TaskGroup, Node, Cluster,
TaskOutput, final_output, WorkspaceType, SetupNets.

A Task used as a context collects what net_builder.ops adds (through a NetBuilder named after it); its step
(get_step) is: the task_init steps, then the instances (each in a workspace of its own when num_instances > 1:
instance init, body, instance exit), then the task_exit steps and the nets computing its outputs. Setup comes
from the nets' attributes (`net.add_attribute(Task.TASK_SETUP, obj)`): an object's setup(net) and exit(net)
give nets or steps to run first or last, once however many nets carry it. A TaskGroup gathers tasks; a session
runs them, grouped by node (session.LocalSession runs every task of the group on one node, in order).
"""
from __future__ import annotations

from collections import defaultdict

from . import core
from ._netbuilder import NetBuilder
from ._task_parts import (Cluster, Node, SetupNets, TaskOutput, TaskOutputList, WorkspaceType,  # noqa: F401
                          _attributes, add_setup_steps, get_setup_nets)
from .context import define_context


@define_context(allow_default=False)
class TaskGroup:
    """Tasks that run together; tasks of one node share its workspace."""

    LOCAL_SETUP = "local_setup"

    def __init__(self, workspace_type=None):
        self._plan_cache = None
        self._tasks: list = []
        self._already_used = False
        self._prev_active = None
        self._tasks_to_add: list = []
        self._report_nets: dict = {}
        self._report_steps: list = []
        self._workspace_type = workspace_type
        self._tasks_by_node = None

    def add(self, task) -> None:
        if self._already_used:
            raise AssertionError("Cannot add Task to an already used TaskGroup.")
        if self._workspace_type is not None and task._workspace_type is not None and \
                self._workspace_type != task._workspace_type:
            raise AssertionError(f"the task's workspace type {task._workspace_type!r} differs from the group's "
                                 f"{self._workspace_type!r}")
        if task._workspace_type is None:
            task._workspace_type = self._workspace_type or WorkspaceType.PRIVATE
        if self._workspace_type is None:
            self._workspace_type = task._workspace_type
        task._notify_used()
        self._tasks.append(task)

    def tasks(self) -> list:
        for task in self._tasks_to_add:
            self.add(task)
        self._tasks_to_add = []
        self._already_used = True
        return self._tasks

    def num_registered_tasks(self) -> int:
        return len(self._tasks_to_add) + len(self._tasks)

    def used_nodes(self) -> list:
        used = []
        for task in self._tasks + self._tasks_to_add:
            if task.node not in used:
                used.append(task.node)
        return used

    def report_step(self, step=None, node=None, interval_ms: int = 1000) -> None:
        """A step run every interval_ms on the node while the group runs, and once after its tasks."""
        step = core.to_execution_step(step)
        step.RunEveryMillis(interval_ms)
        self._report_steps.append((str(node or Node.current(node)), step))

    def report_net(self, net=None, node=None, report_interval: int = 5):
        """Deprecated in Caffe2 (report_step): the node's report net, made on first use."""
        node = str(node or Node.current(node))
        if net is not None and node in self._report_nets:
            raise AssertionError(f"node {node} already has a report net")
        if node not in self._report_nets:
            self._report_nets[node] = (net if net else core.Net(f"{node}/reporter"), report_interval)
        return self._report_nets[node][0]

    def tasks_by_node(self, node_remap=None):
        """A TaskGroup of one task per (remapped) node: the node's init, its tasks' steps (and report steps)
        together, its exit; callable once per mapping."""
        node_map = {}
        for task in self.tasks():
            node_map[task.node] = node_remap(task.node) if node_remap else task.node
        if self._tasks_by_node is not None:
            grouped, prev_map = self._tasks_by_node
            if prev_map != node_map:
                raise AssertionError("Cannot call tasks_by_node multiple times.")
            return grouped
        for node, (net, interval) in self._report_nets.items():
            self.report_step(net, node=node, interval_ms=interval * 1000)
        self._report_nets = {}
        by_node = defaultdict(list)
        for task in self.tasks():
            by_node[node_map[task.node]].append(task)
        reports = defaultdict(list)
        for node, step in self._report_steps:
            reports[node_map[node]].append(step)
        grouped = TaskGroup()
        for node, tasks in by_node.items():
            node_inits, node_exits = get_setup_nets(TaskGroup.LOCAL_SETUP,
                                                    [t.get_step() for t in tasks] + reports[node], self)
            steps, outputs, ws_type = list(reports[node]), [], WorkspaceType.PRIVATE
            for task in tasks:
                step = task.get_step()
                step.SetCreateWorkspace(task.workspace_type() == WorkspaceType.PRIVATE)
                steps.append(step)
                outputs += task.outputs()
                if task.workspace_type() == WorkspaceType.GLOBAL:
                    ws_type = WorkspaceType.GLOBAL
            if not steps:
                steps.append(core.execution_step("empty", []))
            step = steps[0] if len(steps) == 1 else core.execution_step(f"{node}:body", steps,
                                                                         concurrent_substeps=True)
            if node_inits or node_exits:
                around = [core.execution_step(f"{node}:init", node_inits)] if node_inits else []
                around.append(step)
                if node_exits:
                    around.append(core.execution_step(f"{node}:exit", node_exits))
                step = core.execution_step(node, around)
            Task(node=node, step=step, outputs=outputs, name="grouped_by_node", group=grouped,
                 workspace_type=ws_type)
        self._tasks_by_node = (grouped, node_map)
        return grouped

    def to_task(self, node=None):
        """The group as one task on `node` (the current node by default)."""
        node = str(Node.current(node))
        tasks = self.tasks_by_node(lambda _: node).tasks()
        return tasks[0] if tasks else Task()

    def workspace_type(self):
        return self._workspace_type


def final_output(blob_or_record):
    """Add an output to the current Task (or to a new one when none is active); its value is read when the
    task's node has finished."""
    task = Task.current(required=False) or Task()
    return task.add_output(blob_or_record)


@define_context()
class Task:
    """An execution step and its outputs, added to the current TaskGroup and Node; with num_instances, the
    body runs that many times, each in a workspace of its own (in order here: stepnet runs a plan on one
    thread)."""

    TASK_SETUP = "task_setup"                     # once per task, around all instances
    TASK_INSTANCE_SETUP = "task_instance_setup"   # once per instance
    REPORT_STEP = "report_step"
    _global_names_used: set = set()

    @staticmethod
    def _get_next_name(node, group, name) -> str:
        base = f"{node}/{name}"
        used = Task._global_names_used if group is None else {t.name for t in group._tasks_to_add}
        cur, i = base, 0
        while cur in used:
            i += 1
            cur = f"{base}:{i}"
        return cur

    def __init__(self, step=None, outputs=None, workspace_type=None, group=None, node=None, name=None,
                 num_instances=None):
        if not name and isinstance(step, core.ExecutionStep):
            name = step.Proto().name
        name = name or "task"
        self.node = str(Node.current(None if node is None else Node(node)))
        self.group = TaskGroup.current(group, required=False)
        self.name = Task._get_next_name(self.node, self.group, name)
        if self.group is not None:
            self.group._tasks_to_add.append(self)
        self._already_used = False
        self._step = None
        self._step_with_setup = None
        self._outputs: list = []
        if step is not None:
            self.set_step(step)
        if outputs is not None:
            self.add_outputs(outputs)
        self._pipeline = None
        self._is_pipeline_context = False
        self._workspace_type = workspace_type
        self._report_net = None
        self._num_instances = num_instances
        self._net_builder = None

    def __enter__(self):
        if self.group is not None:   # re-added on exit, so tasks made inside come first
            self.group._tasks_to_add.remove(self)
        self._assert_not_used()
        if self._step is not None:
            raise AssertionError("This Task already has an execution step.")
        self._net_builder = NetBuilder(_fullname=self.name)
        self._net_builder.__enter__()
        return self

    def __exit__(self, etype, value, traceback):
        self._net_builder.__exit__(etype, value, traceback)
        if etype is None:
            self.set_step(self._net_builder)
        if self.group is not None:
            self.group._tasks_to_add.append(self)
        self._net_builder = None

    def workspace_type(self):
        return self._workspace_type

    def _assert_not_used(self) -> None:
        if self._already_used:
            raise AssertionError("Cannot modify task since it is already been used.")

    def add_output(self, output):
        self._assert_not_used()
        output = output if isinstance(output, TaskOutput) else TaskOutput(output)
        self._outputs.append(output)
        return output

    def add_outputs(self, outputs):
        self._assert_not_used()
        if type(outputs) not in (list, tuple):
            return self.add_output(outputs)
        return [self.add_output(o) for o in outputs]

    def set_step(self, step) -> None:
        self._assert_not_used()
        self._step = core.to_execution_step(step)

    def get_step(self):
        """The task's whole step (made once): setup, instances, exit, output nets."""
        if self._step_with_setup is not None:
            return self._step_with_setup
        if self._step is None:
            self._step_with_setup = core.execution_step(self.name, [])
            return self._step_with_setup
        report_steps = [s for s in _attributes(self._step, Task.REPORT_STEP)
                        if not hasattr(s, "_report_step_used")]
        for step in report_steps:
            step._report_step_used = True
            if not step.Proto().run_every_ms:
                step.RunEveryMillis(1000)
        task_init, task_exit = get_setup_nets(Task.TASK_SETUP, [self._step] + report_steps, self)
        instance_init, instance_exit = get_setup_nets(Task.TASK_INSTANCE_SETUP, [self._step] + report_steps, self)
        if not self._outputs:
            output_net = core.Net(f"{self.name}:output")
            self.add_output(output_net.ConstantFill([], 1, dtype=core.DataType.INT32, value=0))
            task_exit.append(output_net)
        body = self._step if not report_steps else core.execution_step(f"{self.name}:body",
                                                                       report_steps + [self._step])
        instance = add_setup_steps(body, instance_init, instance_exit, self.name + ":instance")
        if self._num_instances and self._num_instances > 1:
            instance.SetCreateWorkspace(True)
            instance = core.execution_step(f"{self.name}:parallel", [instance],
                                           num_concurrent_instances=self._num_instances)
        self._step_with_setup = add_setup_steps(instance, task_init, task_exit, self.name)
        return self._step_with_setup

    def output_list(self) -> TaskOutputList:
        return TaskOutputList(self._outputs)

    def outputs(self) -> list:
        return self._outputs

    def _notify_used(self) -> None:
        self.get_step()
        self._already_used = True
