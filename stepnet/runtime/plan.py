"""PlanDef execution (Caffe2's plan executor): steps, substeps, iterations, stop blobs, report nets, fresh child
workspaces, concurrent substeps in threads (runtime.concurrent); and the hooks that checkpoint a run and resume it
(stepnet.io.checkpoints).

A step is named by its path of indices (top-level step, then substeps). After every iteration of an outermost
iterating step (one that no iterating step encloses) and after every top-level step, the `boundary` callback
sees the run's Position; a run resumed from a Position re-runs the setup steps before it (steps that never
iterate), restores the checkpoint and goes on from there. The training iterations (training_loops) are counted
for the `progress` callback and set by `iterations`. The substeps of a concurrent step are never outermost: no
checkpoint is taken while threads run."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from ..core import backend
from ..io.checkpoints import FINISHED, Position, Resume
from ..io.files import quoted
from ..core.errors import PlanError
from ..core.waits import Group, Stopped
from ..graph.view import copy_net, plan_networks, step_network
from ..ops.control import _may_change, _writes
from .concurrent import check_threads, deal, is_concurrent, raise_failure, run_threads

Progress = Callable[[str, int, int], None]
Boundary = Callable[[Position, Any], None]


class PlanRun:
    """One run of a plan: its nets by name and the bound copies created so far, per workspace."""

    def __init__(self, plan, workspace, progress: Progress | None = None, iterations: int | None = None,
                 boundary: Boundary | None = None, resume: Resume | None = None):
        self.plan = plan
        self.progress = progress
        self.iterations = iterations
        self.boundary = boundary
        self.resume = resume
        if resume is not None:
            _check_position(plan, resume)
        # this run's own NetDefs: bound afresh in each workspace
        self.netdefs = {name: copy_net(nd) for name, nd in plan_networks(plan).items()}
        self.root = workspace
        self.loops = training_loops(plan, iterations)
        self.total = sum(loop.units for loop in self.loops.values())  # training iterations of the whole run
        self.done = 0                                                   # ... of which done
        self._units: dict[int, Loop] = {}    # id of a loop's innermost step -> its loop, while it runs
        self._budget: Loop | None = None     # the loop whose iteration budget is counted down
        # id of a step with a stop blob -> (the step, ops.control._writes of its nets): the step is held so that its
        # id is not reused by another step message while the run lasts
        self._writes: dict[int, tuple] = {}
        self.group = Group(workspace.waits)   # the run's threads (core.waits), stopped together on a failure

    def net(self, name: str, ws):
        """The net bound in ws (Workspace.bind), created on first use in this run, replacing a same-named net
        made outside the plan or by an earlier run, as Caffe2's plan executor creates nets with overwrite. A plan's
        networks sit one level below the PlanDef."""
        return ws.bind(step_network(self.plan, self.netdefs, name), level=1)

    def run(self) -> None:
        steps = self.plan.execution_step
        previous = self.root.waits.enter(self.group)
        try:
            for k, step in enumerate(steps):
                self.step(step, self.root, outer=True, path=(k,))
                if self.boundary is not None and self.resume is None:
                    self.boundary(Position((k + 1,)) if k + 1 < len(steps) else Position(FINISHED), self.root)
        except Stopped:
            raise_failure(self.group)
        finally:
            self.root.waits.leave(previous)

    # ------------------------------------------------------------------------------------------- steps
    def step(self, step, ws, outer: bool = False, path: tuple = ()) -> None:
        """Run one execution step (its nets or substeps, num_iter times or until its stop blob is true). `outer`:
        no enclosing step iterates, so it may head a training loop; `path` names the step."""
        action = self._resume_action(step, path)
        if action == "skip":
            skipped = self.loops.get(path)
            self.done += skipped.units if skipped is not None else 0
            return
        name = step.name or "<unnamed step>"
        if step.substep and step.network:
            raise PlanError(f"execution step {name!r} has both substeps and networks; a step holds one kind")
        has_stop = bool(step.should_stop_blob)
        if has_stop and step.HasField("num_iter"):
            raise PlanError(f"execution step {name!r} sets both num_iter and should_stop_blob; use one")
        if step.only_once and not has_stop:
            raise PlanError(f"execution step {name!r}: only_once needs should_stop_blob")
        if step.create_workspace:
            ws = ws.child()
        if has_stop:
            total = 1 if step.only_once else None
            if total is None:
                self._check_can_stop(step, ws)
        else:
            total = step.num_iter if step.HasField("num_iter") else 1
        iterates = total is None or total > 1
        loop = self.loops.get(path) if outer and iterates and not has_stop else None
        if loop is not None:
            total = loop.head_iterations
            self._units[id(loop.steps[-1])] = loop
            self._budget = loop if self.iterations is not None else None
            loop.left = loop.units
        inner_outer = outer and not iterates  # substeps of a step that runs once are still outermost
        i = 0
        if action == "resume":
            self.resume.restore(ws)
            i, self.resume = self.resume.position.done, None
            if loop is not None:
                self.done += i * loop.per_head
                loop.left -= i * loop.per_head
        unit = self._units.get(id(step))
        chained = self._budget is not None and any(step is s for s in self._budget.steps)
        report = self._reporter(step, ws)
        periodic = [s for s in step.substep if s.run_every_ms > 0]
        regular = [(j, s) for j, s in enumerate(step.substep) if s.run_every_ms <= 0]
        last_periodic = {id(s): time.monotonic() for s in periodic}
        nets = [self.net(n, ws) for n in step.network]
        checkpoints = self.boundary is not None and outer and iterates
        while (total is None or i < total) and not (chained and self._budget.left <= 0) and not self._iteration(
                step, ws, nets, regular, periodic, last_periodic, inner_outer, path, report):
            i += 1
            if unit is not None:
                self.done += 1
                unit.left -= 1
                if self.progress:
                    self.progress(name, self.done, self.total)
            if report:
                report(final=False)
            if checkpoints:
                self.boundary(Position(path, i), ws)
        if loop is not None:
            self._units.pop(id(loop.steps[-1]), None)
            self._budget = None
        for sub in periodic:
            self.step(sub, ws)
        if report:
            report(final=True)

    def _iteration(self, step, ws, nets, regular, periodic, last_periodic, outer: bool, path: tuple,
                   report=None) -> bool:
        """One iteration of a step; True when its stop blob became true (checked after every net/substep, or
        once after a concurrent step's threads)."""
        stop_blob = step.should_stop_blob
        check = self.group.check
        for net in nets:
            check()
            net.run()
            if stop_blob and _should_stop(ws, stop_blob):
                return True
        if is_concurrent(step):
            instances = max(1, step.num_concurrent_instances)
            check_threads(step, len(regular) * instances, self.group)
            jobs = [lambda j=j, sub=sub: self.step(sub, ws, False, path + (j,)) for j, sub in deal(regular, instances)]
            run_threads(jobs, self.group, ws.waits, None if report is None else lambda: report(final=False))
            if stop_blob and _should_stop(ws, stop_blob):
                return True
            regular = ()
        for j, sub in regular:
            check()
            self.step(sub, ws, outer, path + (j,))
            if stop_blob and _should_stop(ws, stop_blob):
                return True
        now = time.monotonic()
        for sub in periodic:
            if (now - last_periodic[id(sub)]) * 1000 >= sub.run_every_ms:
                self.step(sub, ws)
                last_periodic[id(sub)] = now
        return False

    def _check_can_stop(self, step, ws) -> None:
        """A step that loops until its stop blob is true, whose stop blob is false (or absent) and which no net
        of the step (its nets, report net, substeps) can change, would never end: a PlanError before it starts
        (ops.control's rule for While)."""
        name = step.should_stop_blob
        blob = ws.find(name)
        absent = blob is None or blob.value is None
        if not absent and _should_stop(ws, name):
            return
        held, writes = self._writes.get(id(step), (None, None))
        if held is not step:
            writes = _writes([self.netdefs[n] for n in _step_nets(step) if n in self.netdefs])
            self._writes[id(step)] = (step, writes)
        if (writes[1] or name in writes[0]) if absent else _may_change(blob, name, writes, ws):
            return
        raise PlanError(f"execution step {quoted(step.name or '<unnamed step>')} runs until should_stop_blob "
                        f"{quoted(name)} is true, but it is {'absent' if absent else 'false'} and no net of the "
                        "step or its substeps writes it, so the step would never end; have one of its nets compute "
                        "it, or give num_iter instead")

    def _reporter(self, step, ws):
        if not step.report_net:
            return None
        net = self.net(step.report_net, ws)
        interval = max(0, step.report_interval)
        last = [time.monotonic()]

        def report(final: bool):
            now = time.monotonic()
            if final or now - last[0] >= interval:
                net.run()
                last[0] = now
        return report


    def _resume_action(self, step, path: tuple) -> str:
        """'resume' at the checkpoint's step, 'run' on the way to it (and when not resuming), 'skip' for the
        steps before it that iterate (their work is in the checkpoint; setup steps run again)."""
        if self.resume is None:
            return "run"
        target = self.resume.position.path
        if path == target:
            return "resume"
        if target[:len(path)] == path or _setup_only(step):
            return "run"
        return "skip"


class Loop:
    """A training loop: an outermost iterating step (the head) and the chain of single loops nested in it, whose
    innermost step's iterations are the training iterations (a Caffe2 plan's `epochs x (steps, report)`)."""

    def __init__(self, steps: list, budget: int | None):
        self.steps = steps
        self.per_head = int(np.prod([s.num_iter for s in steps[1:]])) if len(steps) > 1 else 1
        natural = steps[0].num_iter * self.per_head
        self.units = natural if budget is None else budget
        self.natural = natural
        self.head_iterations = -(-self.units // self.per_head)   # ceil: the last one may stop its inner loop early
        self.left = self.units

    def describe(self) -> str:
        names = " > ".join(repr(s.name or "<unnamed step>") for s in self.steps)
        counts = " x ".join(str(s.num_iter) for s in self.steps)
        was = f"{counts} = {self.natural}" if len(self.steps) > 1 else str(self.natural)
        return f"{self.units} iterations of {names} (the plan has {was})"


def training_loops(plan, iterations: int | None = None) -> dict[tuple, Loop]:
    """The plan's training loops by step path: its outermost iterating steps with num_iter (a loop with a stop
    blob is not counted), each with the single loops nested in it. `iterations` sets each one's count of
    innermost iterations. Loops inside a concurrent step are not counted: they run in threads of their own."""
    loops: dict[tuple, Loop] = {}

    def scan(steps, prefix):
        for k, step in enumerate(steps):
            path = prefix + (k,)
            if step.should_stop_blob:
                if step.only_once and not is_concurrent(step):
                    scan(step.substep, path)
            elif step.HasField("num_iter") and step.num_iter > 1:
                chain, inner = [step], _single_loop(step)
                while inner is not None:
                    chain.append(inner)
                    inner = _single_loop(inner)
                loops[path] = Loop(chain, iterations)
            elif not is_concurrent(step):
                scan(step.substep, path)
    scan(plan.execution_step, ())
    return loops


def _single_loop(step):
    """The one loop with num_iter nested in step (through steps that run once), when step holds exactly one
    and nothing else that iterates (and runs its substeps one after another); else None."""
    if step.network or is_concurrent(step):
        return None
    found = []
    for sub in step.substep:
        if sub.should_stop_blob:
            return None
        if sub.HasField("num_iter") and sub.num_iter > 1:
            found.append(sub)
        elif not _setup_only(sub):
            inner = _single_loop(sub)
            if inner is None:
                return None
            found.append(inner)
    return found[0] if len(found) == 1 else None


def _iterates(step) -> bool:
    return bool(step.should_stop_blob) or (step.HasField("num_iter") and step.num_iter > 1)


def _step_nets(step):
    """The names of the nets a step runs: its own, its report net's, its substeps'."""
    yield from step.network
    if step.report_net:
        yield step.report_net
    for sub in step.substep:
        yield from _step_nets(sub)


def _setup_only(step) -> bool:
    """A step that never iterates, nor does any of its substeps: run again before a resumed step."""
    return not _iterates(step) and all(_setup_only(s) for s in step.substep)


def _check_position(plan, resume: Resume) -> None:
    """The checkpoint's step must exist in this plan."""
    steps = plan.execution_step
    for k in resume.position.path:
        if k >= len(steps):
            raise PlanError(f"the checkpoint was taken at step path {quoted(list(resume.position.path))}, which "
                            f"plan {quoted(plan.name)} does not have; resume with the plan that wrote it",
                            at=resume.path)
        steps = steps[k].substep


def _should_stop(ws, blob_name: str) -> bool:
    blob = ws.find(blob_name)
    if blob is None or blob.value is None:
        return False
    value = backend.to_host(blob.value)
    try:
        return bool(np.asarray(value).reshape(-1)[0])
    except IndexError:
        raise PlanError(f"should_stop_blob {blob_name!r} is empty; it must hold one boolean") from None


def run_plan(plan, workspace, progress: Progress | None = None, iterations: int | None = None,
             boundary: Boundary | None = None, resume: Resume | None = None) -> None:
    """Execute plan in workspace. iterations sets the training iterations of each training loop (training_loops:
    an outermost step with num_iter > 1 and the loops singly nested in it; the innermost one's iterations count,
    and the last outer iteration stops it early); progress(step, done, total) sees the overall count after each
    training iteration. boundary is called with the run's Position
    after each iteration of those steps and after each top-level step (checkpoints.Checkpointer saves there);
    resume continues a run from a checkpoint."""
    PlanRun(plan, workspace, progress, iterations, boundary, resume).run()
