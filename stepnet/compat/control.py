"""Caffe2's control module: execution steps that run nets or steps once (Do, DoParallel), in loops (For, While,
Until, DoWhile, DoUntil) or on conditions (If, IfNot, Switch, SwitchNot), and the condition nets they use.

A condition is a bool blob or a net whose last external output is that blob (the net then runs first, as part of
the step). Loops and conditionals are steps with a should_stop_blob (checked after every net and substep): a
While stops on the negation of its condition, an If is a step run at most once (only_once) that stops at once
when its condition is false. Steps are named '<name>/<control>' under the current name scope, made unique.
"""
from __future__ import annotations

from . import core

_used_step_names: set = set()
_next_index = [1]


def _get_next_step_name(control_name: str, base_name: str) -> str:
    name = f"{base_name}/{control_name}"
    result = name
    while result in _used_step_names:
        result = f"{name}_{_next_index[0]}"
        _next_index[0] += 1
    _used_step_names.add(result)
    return result


def _MakeList(items) -> list:
    """(a, b, c) -> [a, b, c]; (a,) -> [a]; ([a, b],) -> [a, b]."""
    if len(items) == 0:
        raise ValueError("input cannot be empty.")
    if len(items) == 1:
        return items[0] if isinstance(items[0], list) else [items[0]]
    return list(items)


def _IsNets(nets_or_steps) -> bool:
    if isinstance(nets_or_steps, list):
        return all(isinstance(n, core.Net) for n in nets_or_steps)
    return isinstance(nets_or_steps, core.Net)


def _PrependNets(nets_or_steps, *nets) -> list:
    nets_or_steps, nets = _MakeList((nets_or_steps,)), _MakeList(nets)
    return nets + nets_or_steps if _IsNets(nets_or_steps) else [Do("prepend", nets)] + nets_or_steps


def _AppendNets(nets_or_steps, *nets) -> list:
    nets_or_steps, nets = _MakeList((nets_or_steps,)), _MakeList(nets)
    return nets_or_steps + nets if _IsNets(nets_or_steps) else nets_or_steps + [Do("append", nets)]


def GetConditionBlobFromNet(condition_net):
    """The condition blob of a condition net: its last external output (a single bool)."""
    outputs = condition_net.Proto().external_output
    if not outputs:
        raise AssertionError(f"Condition net {condition_net.Name()} must have at least one external output")
    return core.BlobReference(outputs[-1])   # a reference: not scoped again when used


def BoolNet(*blobs_with_bool_value):
    """A net setting each blob to its bool constant: BoolNet((blob, value), ...) or BoolNet([(blob, value), ...])."""
    bool_net = core.Net("bool_net")
    for blob, value in _MakeList(blobs_with_bool_value):
        out = bool_net.ConstantFill([], [blob], shape=[], value=value, dtype=core.DataType.BOOL)
        bool_net.AddExternalOutput(out)
    return bool_net


def NotNet(condition_blob_or_net):
    """(a net computing the negation of the condition, its output blob)."""
    if isinstance(condition_blob_or_net, core.Net):
        condition_blob = GetConditionBlobFromNet(condition_blob_or_net)
    else:
        condition_blob = condition_blob_or_net
    not_net = core.Net("not_net")
    out = not_net.Not(condition_blob)
    not_net.AddExternalOutput(out)
    return not_net, out


def _CopyConditionBlobNet(condition_blob):
    """(a net copying the condition blob, the copy)."""
    net = core.Net("copy_condition_blob_net")
    out = net.Copy(condition_blob)
    net.AddExternalOutput(out)
    return net, out


def MergeConditionNets(name, condition_nets, relation):
    """One condition net running all of condition_nets, its condition their conditions combined by relation
    ('And' or 'Or')."""
    if not isinstance(condition_nets, list):
        return condition_nets
    if len(condition_nets) <= 1:
        return condition_nets[0] if condition_nets else None
    merged = core.Net(name)
    last = None
    for net in condition_nets:
        proto = net.Proto()
        if proto.device_option != merged.Proto().device_option or proto.type != merged.Proto().type:
            raise AssertionError(f"condition net {net.Name()} has another device option or net type")
        merged.extend_ops(proto.op)
        merged.Proto().external_input.extend(proto.external_input)
        cond = GetConditionBlobFromNet(net)
        last = cond if last is None else getattr(merged, relation)([last, cond])
        for k, v in net._attr_dict.items():
            merged._attr_dict[k] += v
    merged.AddExternalOutput(last)
    return merged


def CombineConditions(name, condition_nets, relation):
    """A net combining the conditions of condition_nets by relation ('And' or 'Or') without running them."""
    if not condition_nets:
        return None
    if not isinstance(condition_nets, list):
        raise ValueError("condition_nets must be a list of nets.")
    if len(condition_nets) == 1:
        return _CopyConditionBlobNet(GetConditionBlobFromNet(condition_nets[0]))[0]
    combined = core.Net(name)
    last = None
    for net in condition_nets:
        cond = GetConditionBlobFromNet(net)
        last = cond if last is None else getattr(combined, relation)([last, cond])
    combined.AddExternalOutput(last)
    return combined


def Do(name, *nets_or_steps):
    """Run the nets or steps once, in order (a single step is returned as it is)."""
    nets_or_steps = _MakeList(nets_or_steps)
    if len(nets_or_steps) == 1 and isinstance(nets_or_steps[0], core.ExecutionStep):
        return nets_or_steps[0]
    return core.scoped_execution_step(_get_next_step_name("Do", name), nets_or_steps)


def DoParallel(name, *nets_or_steps):
    """Run the nets or steps once, as concurrent substeps (in threads, as Caffe2 runs them)."""
    nets_or_steps = _MakeList(nets_or_steps)
    if len(nets_or_steps) == 1 and isinstance(nets_or_steps[0], core.ExecutionStep):
        return nets_or_steps[0]
    return core.scoped_execution_step(_get_next_step_name("DoParallel", name), nets_or_steps,
                                      concurrent_substeps=True)


def _RunOnceIf(name, condition_blob_or_net, nets_or_steps):
    """Run nets_or_steps once if the condition is true (a condition net runs first)."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, core.Net):
        nets_or_steps = _PrependNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        nets_or_steps = _PrependNets(nets_or_steps, not_net)

    def if_step(control_name):
        return core.scoped_execution_step(_get_next_step_name(control_name, name), nets_or_steps,
                                          should_stop_blob=stop_blob, only_once=True)
    if _IsNets(nets_or_steps):
        return Do(name + "/_RunOnceIf", BoolNet((stop_blob, False)), if_step("_RunOnceIf-inner"))
    return if_step("_RunOnceIf")


def _RunOnceIfNot(name, condition_blob_or_net, nets_or_steps):
    """Run nets_or_steps once if the condition is false (a condition net runs first)."""
    if isinstance(condition_blob_or_net, core.Net):
        condition_blob = GetConditionBlobFromNet(condition_blob_or_net)
        nets_or_steps = _PrependNets(nets_or_steps, condition_blob_or_net)
    else:
        copy_net, condition_blob = _CopyConditionBlobNet(condition_blob_or_net)
        nets_or_steps = _PrependNets(nets_or_steps, copy_net)
    return core.scoped_execution_step(_get_next_step_name("_RunOnceIfNot", name), nets_or_steps,
                                      should_stop_blob=condition_blob, only_once=True)


def For(name, nets_or_steps, iter_num):
    """Run nets_or_steps iter_num times (a counter counted down before each iteration)."""
    init_net = core.Net("init-net")
    counter = init_net.CreateCounter([], init_count=iter_num)
    iter_net = core.Net("For-iter")
    done = iter_net.CountDown([counter])
    for_step = core.scoped_execution_step(_get_next_step_name("For-inner", name),
                                          _PrependNets(nets_or_steps, iter_net), should_stop_blob=done)
    return Do(name + "/For", Do(name + "/For-init-net", init_net), for_step)


def While(name, condition_blob_or_net, nets_or_steps):
    """Run nets_or_steps while the condition is true, testing it before each iteration."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, core.Net):
        nets_or_steps = _PrependNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        nets_or_steps = _PrependNets(nets_or_steps, not_net)

    def while_step(control_name):
        return core.scoped_execution_step(_get_next_step_name(control_name, name), nets_or_steps,
                                          should_stop_blob=stop_blob)
    if _IsNets(nets_or_steps):
        # the stop blob may be left true by an earlier run: reset it so the condition decides
        return Do(name + "/While", BoolNet((stop_blob, False)), while_step("While-inner"))
    return while_step("While")


def Until(name, condition_blob_or_net, nets_or_steps):
    """Run nets_or_steps until the condition is true, testing it before each iteration."""
    if isinstance(condition_blob_or_net, core.Net):
        stop_blob = GetConditionBlobFromNet(condition_blob_or_net)
        nets_or_steps = _PrependNets(nets_or_steps, condition_blob_or_net)
    else:
        stop_blob = core.BlobReference(str(condition_blob_or_net))
    return core.scoped_execution_step(_get_next_step_name("Until", name), nets_or_steps,
                                      should_stop_blob=stop_blob)


def DoWhile(name, condition_blob_or_net, nets_or_steps):
    """Run nets_or_steps, then again while the condition is true (tested after each iteration)."""
    not_net, stop_blob = NotNet(condition_blob_or_net)
    if isinstance(condition_blob_or_net, core.Net):
        nets_or_steps = _AppendNets(nets_or_steps, condition_blob_or_net, not_net)
    else:
        nets_or_steps = _AppendNets(nets_or_steps, not_net)
    return Do(name + "/DoWhile", BoolNet((stop_blob, False)),
              core.scoped_execution_step(_get_next_step_name("DoWhile-inner", name), nets_or_steps,
                                         should_stop_blob=stop_blob))


def DoUntil(name, condition_blob_or_net, nets_or_steps):
    """Run nets_or_steps, then again until the condition is true (tested after each iteration). A condition
    blob already true stops the loop after the first net or step."""
    if not isinstance(condition_blob_or_net, core.Net):
        return core.scoped_execution_step(_get_next_step_name("DoUntil", name), nets_or_steps,
                                          should_stop_blob=core.BlobReference(condition_blob_or_net))
    nets_or_steps = _AppendNets(nets_or_steps, condition_blob_or_net)
    stop_blob = GetConditionBlobFromNet(condition_blob_or_net)
    return Do(name + "/DoUntil", BoolNet((stop_blob, False)),
              core.scoped_execution_step(_get_next_step_name("DoUntil-inner", name), nets_or_steps,
                                         should_stop_blob=stop_blob))


def Switch(name, *conditions):
    """Run each (condition, nets_or_steps) pair's nets_or_steps whose condition is true (several may run)."""
    conditions = _MakeList(conditions)
    return core.scoped_execution_step(_get_next_step_name("Switch", name),
                                      [_RunOnceIf(name + "/Switch", cond, step) for cond, step in conditions])


def SwitchNot(name, *conditions):
    """Run each (condition, nets_or_steps) pair's nets_or_steps whose condition is false."""
    conditions = _MakeList(conditions)
    return core.scoped_execution_step(_get_next_step_name("SwitchNot", name),
                                      [_RunOnceIfNot(name + "/SwitchNot", cond, step) for cond, step in conditions])


def If(name, condition_blob_or_net, true_nets_or_steps, false_nets_or_steps=None):
    """Run true_nets_or_steps if the condition is true, else false_nets_or_steps (when given)."""
    if not false_nets_or_steps:
        return _RunOnceIf(name + "/If", condition_blob_or_net, true_nets_or_steps)
    condition_blob = (GetConditionBlobFromNet(condition_blob_or_net)
                      if isinstance(condition_blob_or_net, core.Net) else condition_blob_or_net)
    return Do(name + "/If", _RunOnceIf(name + "/If-true", condition_blob_or_net, true_nets_or_steps),
              _RunOnceIfNot(name + "/If-false", condition_blob, false_nets_or_steps))


def IfNot(name, condition_blob_or_net, true_nets_or_steps, false_nets_or_steps=None):
    """Run true_nets_or_steps if the condition is false, else false_nets_or_steps (when given)."""
    if not false_nets_or_steps:
        return _RunOnceIfNot(name + "/IfNot", condition_blob_or_net, true_nets_or_steps)
    condition_blob = (GetConditionBlobFromNet(condition_blob_or_net)
                      if isinstance(condition_blob_or_net, core.Net) else condition_blob_or_net)
    return Do(name + "/IfNot", _RunOnceIfNot(name + "/IfNot-true", condition_blob_or_net, true_nets_or_steps),
              _RunOnceIf(name + "/IfNot-false", condition_blob, false_nets_or_steps))
