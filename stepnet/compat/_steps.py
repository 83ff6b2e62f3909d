"""Caffe2's core.ExecutionStep and core.Plan (re-exported by core): builders of ExecutionStep and PlanDef
messages that remember the nets they name, so a Plan carries every net its steps run, in order of use."""
from __future__ import annotations

from ..io.proto import ExecutionStep as _StepProto
from ..io.proto import PlanDef
from .scope import CurrentNameScope

NET_TYPE: list = []   # [core.Net]: set by core, which imports this module, for the steps and plans made from protos


def _net_name(net) -> str:
    return net if isinstance(net, str) else net.Name() if hasattr(net, "Name") else net.name


def _add_net(nets: dict, net) -> bool:
    name = _net_name(net)
    if name in nets:
        if nets[name] is not None and net is not nets[name] and not isinstance(net, str):
            raise ValueError(f"Different nets with same name: {name}")
        return False
    nets[name] = None if isinstance(net, str) else net
    return True


class ExecutionStep:
    """An ExecutionStep message under construction: nets or substeps, iterations, stop blob, ..."""

    _step_names_used: set = set()

    def __init__(self, name, nets=None, num_iter=None):
        self._step = _StepProto(name=name or self._next_name("step"))
        self._net_dict: dict = {}
        self._substeps: list = []
        self._is_used = False
        if nets is not None:
            for net in ([nets] if hasattr(nets, "Proto") else nets):
                if _add_net(self._net_dict, net):
                    self._step.network.append(_net_name(net))
        if num_iter is not None:
            self._step.num_iter = num_iter

    @classmethod
    def create_from_proto(cls, step_proto, net_obj_dict: dict, net_proto_dict: dict) -> "ExecutionStep":
        """The step an ExecutionStep message describes, over the Net objects of net_obj_dict (made from
        net_proto_dict's NetDefs where missing); its substeps likewise."""
        if bool(step_proto.network) == bool(step_proto.substep):
            raise ValueError(f"execution step {step_proto.name!r} must have either networks or substeps")
        if step_proto.substep:
            items = [cls.create_from_proto(sub, net_obj_dict, net_proto_dict) for sub in step_proto.substep]
        else:
            items = []
            for name in step_proto.network:
                if name not in net_obj_dict:
                    if name not in net_proto_dict:
                        raise ValueError(f"execution step {step_proto.name!r} names network {name!r}, which the "
                                         "plan does not hold")
                    net_obj_dict[name] = NET_TYPE[0](net_proto_dict[name])
                items.append(net_obj_dict[name])
        given = {f: getattr(step_proto, f) for f in ("num_iter", "concurrent_substeps", "only_once",
                                                      "num_concurrent_instances", "create_workspace", "run_every_ms")
                 if step_proto.HasField(f)}
        if step_proto.HasField("should_stop_blob"):
            given["should_stop_blob"] = step_proto.should_stop_blob
        return execution_step(step_proto.name, items, **given)

    @classmethod
    def _next_name(cls, base: str) -> str:
        name, k = base, 1
        while name in cls._step_names_used:
            name, k = f"{base}_{k}", k + 1
        cls._step_names_used.add(name)
        return name

    def _mutable(self) -> None:
        if self._is_used:
            raise RuntimeError("Cannot mutate a step that has already been added to a plan/step.")

    def get_net(self, name):
        return self._net_dict[name]

    def Name(self) -> str:
        return self._step.name

    __str__ = Name

    def Proto(self) -> _StepProto:
        return self._step

    def HasNets(self) -> bool:
        return len(self._step.network) > 0

    def HasSubsteps(self) -> bool:
        return len(self._step.substep) > 0

    def Nets(self) -> list:
        return list(self._net_dict.values())

    def Substeps(self) -> list:
        return self._substeps

    def SetIter(self, num_iter) -> None:
        self._mutable()
        self._step.num_iter = num_iter

    def SetCreateWorkspace(self, create_workspace) -> None:
        self._mutable()
        self._step.create_workspace = create_workspace

    def SetNumConcurrentInstances(self, n) -> None:
        self._mutable()
        self._step.num_concurrent_instances = n

    def SetOnlyOnce(self, only_once) -> None:
        self._mutable()
        self._step.only_once = only_once

    def SetShouldStopBlob(self, should_stop_blob) -> None:
        self._mutable()
        self._step.should_stop_blob = str(should_stop_blob)

    def RunEveryMillis(self, interval) -> None:
        self._step.run_every_ms = interval

    def SetReportNet(self, report_net, report_interval) -> None:
        self._mutable()
        _add_net(self._net_dict, report_net)
        self._step.report_net = _net_name(report_net)
        self._step.report_interval = report_interval

    def SetConcurrentSubsteps(self, concurrent_substeps) -> None:
        self._mutable()
        if self.HasNets():
            raise ValueError("Cannot have both network and substeps.")
        self._step.concurrent_substeps = concurrent_substeps

    def AddSubstep(self, substep) -> "ExecutionStep":
        self._mutable()
        if self.HasNets():
            raise ValueError("Cannot have both network and substeps.")
        if isinstance(substep, ExecutionStep):
            substep._is_used = True
            if not substep.HasNets() and not substep.HasSubsteps():
                return self
            for net in substep._net_dict.values():
                if net is not None:
                    _add_net(self._net_dict, net)
            self._substeps.append(substep)
            substep = substep.Proto()
        self._step.substep.add().CopyFrom(substep)
        return self

    def get_all_attributes(self, name) -> list:
        """The attributes under `name` of every net of the step and its substeps."""
        return [a for net in self._net_dict.values() if net is not None for a in net.get_attributes(name)]

    def AddNet(self, net) -> "ExecutionStep":
        self._mutable()
        if self.HasSubsteps():
            raise ValueError("Cannot have both network and substeps.")
        _add_net(self._net_dict, net)
        self._step.network.append(_net_name(net))
        return self


def add_nets_in_order(step, net_list: list) -> None:
    """Append to net_list the names of the nets step runs that it lacks: its substeps' first, depth first, then
    its own, then its report net (Caffe2's core.add_nets_in_order)."""
    for sub in step.Substeps():
        add_nets_in_order(sub, net_list)
    proto = step.Proto()
    for name in list(proto.network) + ([proto.report_net] if proto.report_net else []):
        if name not in net_list:
            net_list.append(name)


class Plan:
    """A PlanDef under construction: steps, and the nets they run (copied in when a step is added)."""

    def __init__(self, name_or_step):
        self._plan = PlanDef()
        self._net_dict: dict = {}
        self._steps: list = []
        if isinstance(name_or_step, ExecutionStep):
            self._plan.name = name_or_step.Name()
            self.AddStep(name_or_step)
        elif isinstance(name_or_step, str):
            self._plan.name = name_or_step
        else:
            raise ValueError("name_or_step must be a string or ExecutionStep")

    def __str__(self):
        return self._plan.name

    @classmethod
    def create_from_proto(cls, plan_proto) -> "Plan":
        """The Plan a PlanDef describes: a core.Net for each network (named anew, as core.Net names nets), the
        steps over them, the plan's other fields kept."""
        if not isinstance(plan_proto, PlanDef):
            raise TypeError(f"create_from_proto takes a PlanDef, got {type(plan_proto).__name__}")
        plan = cls(plan_proto.name)
        plan._plan.CopyFrom(plan_proto)
        del plan._plan.network[:]
        del plan._plan.execution_step[:]
        protos: dict = {}
        for net in plan_proto.network:
            if net.name in protos:
                raise ValueError(f"plan {plan_proto.name!r}: two networks are named {net.name!r}")
            protos[net.name] = net
        nets = {name: NET_TYPE[0](net) for name, net in protos.items()}
        for step in plan_proto.execution_step:
            plan.AddStep(ExecutionStep.create_from_proto(step, nets, protos))
        return plan

    def Proto(self) -> PlanDef:
        return self._plan

    def AddNets(self, nets) -> None:
        for net in nets:
            if net is not None and _add_net(self._net_dict, net):
                self._plan.network.add().CopyFrom(net.Proto())

    def Nets(self) -> list:
        return list(self._net_dict.values())

    def AddStep(self, step) -> None:
        if not isinstance(step, ExecutionStep):
            raise TypeError(f"AddStep takes an ExecutionStep, got {type(step).__name__}")
        step._is_used = True
        if not step.HasNets() and not step.HasSubsteps():
            return
        self._plan.execution_step.add().CopyFrom(step.Proto())
        self._steps.append(step)
        names: list = []
        add_nets_in_order(step, names)
        self.AddNets(step._net_dict.get(n) for n in names)

    def Steps(self) -> list:
        return self._steps

    def get_all_attributes(self, name) -> list:
        """The attributes under `name` of every net of the plan."""
        return [a for net in self._net_dict.values() if net is not None for a in net.get_attributes(name)]


def execution_step(default_name, steps_or_nets, num_iter=None, report_net=None, report_interval=None,
                   concurrent_substeps=None, should_stop_blob=None, only_once=None, num_concurrent_instances=None,
                   create_workspace=False, run_every_ms=None) -> ExecutionStep:
    """An ExecutionStep over a net, a step, or a list of either (num_iter 1 unless a stop blob is given)."""
    if should_stop_blob is not None and num_iter is not None:
        raise ValueError("Cannot set both should_stop_blob and num_iter.")
    if should_stop_blob is None and num_iter is None:
        num_iter = 1
    step = ExecutionStep(default_name)
    if should_stop_blob is not None:
        step.SetShouldStopBlob(should_stop_blob)
    if num_iter is not None:
        step.SetIter(num_iter)
    if only_once is not None:
        step.SetOnlyOnce(only_once)
    if concurrent_substeps is not None:
        step.SetConcurrentSubsteps(concurrent_substeps)
    if report_net is not None:
        step.SetReportNet(report_net, report_interval)
    if num_concurrent_instances is not None:
        step.SetNumConcurrentInstances(num_concurrent_instances)
    if create_workspace:
        step.SetCreateWorkspace(True)
    if run_every_ms:
        step.RunEveryMillis(run_every_ms)
    if steps_or_nets and not isinstance(steps_or_nets, (list, ExecutionStep)) and not hasattr(steps_or_nets, "Proto"):
        raise ValueError("steps_or_nets must be a step, a net, or a list of nets or steps.")
    items = steps_or_nets if isinstance(steps_or_nets, list) else [steps_or_nets] if steps_or_nets else []
    if items and all(hasattr(x, "Proto") and not isinstance(x, ExecutionStep) for x in items):
        for net in items:
            step.AddNet(net)
    else:
        for x in items:
            step.AddSubstep(to_execution_step(x))
    return step


def to_execution_step(step_or_nets, default_name=None) -> ExecutionStep:
    """A step of a net, a list of nets/steps/builders, or a net_builder.NetBuilder (its children, until its
    stop blob is true when it has one); a step as it is."""
    if isinstance(step_or_nets, ExecutionStep):
        return step_or_nets
    stop_blob = None
    name = getattr(step_or_nets, "name", None)
    if not default_name and isinstance(name, str):
        default_name = name
    if hasattr(step_or_nets, "_stop_blob") and hasattr(step_or_nets, "get"):   # a net_builder.NetBuilder
        stop_blob = step_or_nets._stop_blob
        step_or_nets = step_or_nets.get()
    return execution_step(default_name, step_or_nets, should_stop_blob=stop_blob)


def scoped_execution_step(name, *args, **kwargs) -> ExecutionStep:
    """execution_step with the step's name under the current name scope."""
    return execution_step(CurrentNameScope() + name if name else name, *args, **kwargs)
