"""Caffe2's session module: Session (runs Nets, ExecutionSteps, Plans, Tasks and TaskGroups) and LocalSession,
which runs everything on one node in one workspace (the current one unless given).

A runnable is compiled once (cached per runnable) into a plan of the group's tasks grouped on the node; the
outputs of its tasks are blobs of the session's workspace, made before the run so that tasks running in child
workspaces write them there, and read back with TaskOutput.fetch().
"""
from __future__ import annotations

from . import core, workspace
from .task import Cluster, Task, TaskGroup, WorkspaceType


class CompiledRunnable:
    """What Session.compile returns: the compiled object and the session class it is for."""

    def __init__(self, obj, session_class):
        self.obj = obj
        self.session_class = session_class


class Session:
    """Runs Nets, ExecutionSteps, Plans, Tasks and TaskGroups (the subclass says where)."""

    _compiled_cache: dict = {}

    def __init__(self):
        self._open = True

    def is_open(self) -> bool:
        return self._open

    @classmethod
    def compile(cls, runnable, workspace_type=None, setup_net_list=None) -> CompiledRunnable:
        if isinstance(runnable, CompiledRunnable):
            if runnable.session_class is not cls:
                raise AssertionError(f"Runnable was compiled for different session type. Need: {cls.__name__}, got: "
                                     f"{runnable.session_class.__name__}")
            return runnable
        if runnable in cls._compiled_cache:
            return cls._compiled_cache[runnable]
        if isinstance(runnable, TaskGroup):
            if workspace_type:
                if runnable.workspace_type() and runnable.workspace_type() != workspace_type:
                    raise AssertionError(f"Require {workspace_type} but already have {runnable.workspace_type()}")
                runnable._workspace_type = workspace_type
            group = runnable
        else:
            group = TaskGroup(workspace_type=workspace_type or WorkspaceType.GLOBAL)
            if isinstance(runnable, Task):
                group.add(runnable)
            elif isinstance(runnable, core.ExecutionStep):
                group.add(Task(step=runnable))
            elif isinstance(runnable, core.Plan):
                steps = runnable.Steps()
                if not steps:
                    raise AssertionError("the plan has no step to run")
                group.add(Task(step=steps[0] if len(steps) == 1 else steps))
            else:
                group.add(Task(step=core.execution_step("runnable", runnable)))
        compiled = CompiledRunnable(cls._compile_task_group(group, setup_net_list), session_class=cls)
        cls._compiled_cache[runnable] = compiled
        return compiled

    def run(self, runnable, workspace_type=None, setup_net_list=None) -> None:
        """Run a TaskGroup, Task, Plan, ExecutionStep or Net (compiled on first use)."""
        if not self.is_open():
            raise AssertionError("Session is closed.")
        if runnable is None:
            raise AssertionError("Got a none runnable.")
        self._run_compiled(self.compile(runnable, workspace_type, setup_net_list).obj)

    def close(self) -> None:
        if self.is_open():
            self._do_close()
            self._open = False

    def fetch_output(self, output):
        raise NotImplementedError()

    def _run_compiled(self, task_group):
        raise NotImplementedError()

    @classmethod
    def _compile_task_group(cls, task_group, setup_net_list=None):
        return task_group

    def _do_close(self) -> None:
        pass

    def __enter__(self):
        if not self._open:
            raise AssertionError("Session already closed.")
        return self

    def __exit__(self, ex_type, value, traceback):
        if ex_type is None:
            self.close()


class LocalSession(Session):
    """A session on one node: every task of a group runs on 'local', in the session's workspace (a private
    task in a child workspace of it, as its step says)."""

    def __init__(self, ws=None):
        Session.__init__(self)
        self._ws = ws or workspace.C.Workspace.current

    @classmethod
    def _compile_task_group(cls, task_group, setup_net_list=None):
        with Cluster():
            task = task_group.to_task()
        plan = core.Plan("task_group_plan")
        plan.AddStep(task.get_step())
        return plan, task.output_list(), task.workspace_type()

    def _run_compiled(self, compiled) -> None:
        plan, output_list, _ = compiled   # a private task's step makes its own child workspace
        outputs = []
        for name in output_list.names():
            self._ws.create_blob(str(name))
            outputs.append(core.BlobReference(str(name)))
        output_list.set_values(outputs, _fetch_func=self._fetch_output)
        self._ws.run(plan)

    def _fetch_output(self, output):
        return self._ws.blobs[str(output)].fetch()
