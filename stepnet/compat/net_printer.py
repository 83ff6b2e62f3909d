"""Caffe2's net_printer: nets, execution steps, plans' tasks, task groups and jobs as readable pseudo-Python, and
a check that a job reads no blob before something defines it.

    print(net_printer.to_string(job))        # with Job.current().init_group: with TaskGroup(): with Task(...): ...
    net_printer.analyze(job)                 # AssertionError "Blob undefined: a" for a blob read before written

The text is Caffe2's: a net is `name = core.Net('name')` then one `name.Op([inputs], [outputs], arg=value)` line
an op (with `c2_syntax=False`: `# net: name` and `outputs = Op(inputs, arg=value)`, where `factor_prefixes=True`
writes names sharing a prefix as `prefix[a, b]`); a step's loops, concurrency and reports are `with` blocks
(`loop(n)`, `parallel`, `step(name)`, `workspace(name)`, `report_net(interval)`, `reporter(name,
interval_ms=...)`, `yield stop_if(blob)`), an empty block holds `pass`.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from copy import copy
from itertools import chain

from ..io.proto import NetDef, OperatorDef
from .checkpoint import Job
from .core import ExecutionStep, Net, Plan
from .task import Task, TaskGroup, TaskOutput, WorkspaceType


class Visitor:
    """Calls the function registered for the first of its classes' registered types the object is an
    instance of (None is skipped)."""

    @classmethod
    def register(cls, Type):
        if "visitors" not in cls.__dict__:
            cls.visitors = []

        def _register(func):
            cls.visitors.append((Type, func))
            return func
        return _register

    def __call__(self, obj, *args, **kwargs):
        if obj is None:
            return None
        for Type, func in type(self).visitors:
            if isinstance(obj, Type):
                return func(self, obj, *args, **kwargs)
        raise TypeError(f"{type(self).__name__}: unsupported object type: {type(obj)}")


# ------------------------------------------------------------------------------------------------ analysis
class Analyzer(Visitor):
    """Walks a job keeping, per workspace, how often each blob was defined; a read of an undefined blob fails."""

    PREFIXES_TO_IGNORE = {"distributed_ctx_init"}

    def __init__(self):
        self.workspaces = defaultdict(lambda: defaultdict(int))   # per node
        self.workspace_ctx: list = []

    @property
    def workspace(self):
        return self.workspace_ctx[-1]

    @contextmanager
    def set_workspace(self, node=None, ws=None, do_copy: bool = False):
        """Work in ws (or node's workspace, or the current one; a copy of it with do_copy) inside the block."""
        if ws is None:
            ws = self.workspaces[str(node)] if node is not None else self.workspace
        if do_copy:
            ws = copy(ws)
        self.workspace_ctx.append(ws)
        try:
            yield ws
        finally:
            del self.workspace_ctx[-1]

    def define_blob(self, blob) -> None:
        self.workspace[blob] += 1

    def need_blob(self, blob) -> None:
        if any(blob.startswith(p) for p in Analyzer.PREFIXES_TO_IGNORE):
            return
        assert blob in self.workspace, f"Blob undefined: {blob}"


@Analyzer.register(OperatorDef)
def analyze_op(analyzer, op):
    for x in op.input:
        analyzer.need_blob(x)
    for x in op.output:
        analyzer.define_blob(x)


@Analyzer.register(Net)
def analyze_net(analyzer, net):
    for op in net.Proto().op:
        analyzer(op)


@Analyzer.register(ExecutionStep)
def analyze_step(analyzer, step):
    proto = step.Proto()
    made_by_parallel: set = set()
    with analyzer.set_workspace(do_copy=proto.create_workspace):
        if proto.report_net:
            with analyzer.set_workspace(do_copy=True):
                analyzer(step.get_net(proto.report_net))
        for sub in step.Substeps() + [step.get_net(n) for n in proto.network]:
            with analyzer.set_workspace(do_copy=proto.concurrent_substeps) as ws_in:
                analyzer(sub)
                if proto.should_stop_blob:
                    analyzer.need_blob(proto.should_stop_blob)
            if proto.concurrent_substeps:
                new = set(ws_in) - set(analyzer.workspace)
                both = made_by_parallel & new
                assert not both, f"Error: Blobs created by multiple parallel steps: {', '.join(both)}"
                made_by_parallel |= new
    for blob in made_by_parallel:
        analyzer.define_blob(blob)


@Analyzer.register(Task)
def analyze_task(analyzer, task):
    step = task.get_step()
    plan = Plan(task.node)
    plan.AddStep(step)
    size = len(plan.Proto().SerializeToString())
    assert size < 2 ** 26, ("Due to a protobuf limitation, serialized tasks must be smaller than 64Mb, but this "
                            f"task has {size} bytes.")
    with analyzer.set_workspace(do_copy=task.workspace_type() != WorkspaceType.GLOBAL):
        analyzer(step)


@Analyzer.register(TaskGroup)
def analyze_task_group(analyzer, tg):
    for task in tg.tasks_by_node().tasks():
        with analyzer.set_workspace(node=task.node):
            analyzer(task)


@Analyzer.register(Job)
def analyze_job(analyzer, job):
    analyzer(job.init_group)
    analyzer(job.epoch_group)


def analyze(obj) -> None:
    """Check a Job: no blob is read before it is defined, no blob is defined by two concurrent steps
    (AssertionError otherwise)."""
    Analyzer()(obj)


# ------------------------------------------------------------------------------------------------ text
class Text:
    """Lines of indented text; context(header) opens a `with header:` block (`pass` when left empty)."""

    def __init__(self):
        self._indent = 0
        self._lines_in_context = [0]
        self.lines: list = []

    @contextmanager
    def context(self, text):
        if text is not None:
            self.add(f"with {text}:")
            self._indent += 4
            self._lines_in_context.append(0)
        try:
            yield
        finally:
            if text is not None:
                if self._lines_in_context[-1] == 0:
                    self.add("pass")
                self._indent -= 4
                del self._lines_in_context[-1]

    def add(self, text) -> None:
        self._lines_in_context[-1] += 1
        self.lines.append(" " * self._indent + text)

    def __str__(self):
        return "\n".join(self.lines)


class Printer(Visitor, Text):
    def __init__(self, factor_prefixes: bool = False, c2_syntax: bool = True):
        Text.__init__(self)
        self.factor_prefixes = factor_prefixes
        self.c2_syntax = c2_syntax
        self.c2_net_name = None


def _sanitize_str(s) -> str:
    """A quoted string, cut after 64 characters (bytes read as ASCII, others dropped)."""
    if isinstance(s, bytes):
        s = s.decode("ascii", errors="ignore")
    elif not isinstance(s, str):
        s = str(s)
    if len(s) < 64:
        return f"'{s}'"
    return f"'{s[:64]}'...<+len={len(s) - 64}>"


def _arg_val(arg) -> str:
    if arg.HasField("f"):
        return str(arg.f)
    if arg.HasField("i"):
        return str(arg.i)
    if arg.HasField("s"):
        return _sanitize_str(arg.s)
    if arg.floats:
        return str(list(arg.floats))
    if arg.ints:
        return str(list(arg.ints))
    if arg.strings:
        return str([_sanitize_str(s) for s in arg.strings])
    return "[]"


def commonprefix(m) -> str:
    "Given a list of strings, returns the longest common prefix"
    if not m:
        return ""
    lo, hi = min(m), max(m)
    for i, c in enumerate(lo):
        if c != hi[i]:
            return lo[:i]
    return lo


def format_value(val) -> str:
    if isinstance(val, list):
        return "[" + ", ".join(f"'{v}'" for v in val) + "]"
    return str(val)


def factor_prefix(vals, do_it) -> str:
    vals = [format_value(v) for v in vals]
    prefix = commonprefix(vals) if len(vals) > 1 and do_it else ""
    joined = ", ".join(v[len(prefix):] for v in vals)
    return f"{prefix}[{joined}]" if prefix else joined


def call(op, inputs=None, outputs=None, factor_prefixes=False) -> str:
    """`op(inputs, key=value)`, preceded by `outputs = ` when there are outputs (tuples in inputs are key=value)."""
    text = ""
    if inputs:
        positional = [a for a in inputs if not isinstance(a, tuple)]
        keyword = [a for a in inputs if isinstance(a, tuple)]
        text = ", ".join(x for x in chain([factor_prefix(positional, factor_prefixes)],
                                          (f"{k}={v}" for k, v in keyword)) if x)
    made = f"{op}({text})"
    return f"{factor_prefix(outputs, factor_prefixes)} = {made}" if outputs else made


def format_device_option(dev_opt):
    if not dev_opt or not (dev_opt.device_type or dev_opt.device_id or dev_opt.node_name):
        return None
    return call("DeviceOption", [dev_opt.device_type, dev_opt.device_id, f"'{dev_opt.node_name}'"])


@Printer.register(OperatorDef)
def print_op(text, op):
    args = [(a.name, _arg_val(a)) for a in op.arg]
    device = format_device_option(op.device_option) if op.HasField("device_option") else None
    if device:
        args.append(("device_option", device))
    if text.c2_net_name:
        text.add(call(f"{text.c2_net_name}.{op.type}", [list(op.input), list(op.output)] + args))
    else:
        text.add(call(op.type, list(op.input) + args, op.output, factor_prefixes=text.factor_prefixes))
    for arg in op.arg:
        if arg.HasField("n"):
            with text.context(f"arg: {arg.name}"):
                text(arg.n)


@Printer.register(NetDef)
def print_net_def(text, net_def):
    if text.c2_syntax:
        text.add(call("core.Net", [f"'{net_def.name}'"], [net_def.name]))
        text.c2_net_name = net_def.name
    else:
        text.add(f"# net: {net_def.name}")
    for op in net_def.op:
        text(op)
    if text.c2_syntax:
        text.c2_net_name = None


@Printer.register(Net)
def print_net(text, net):
    text(net.Proto())


def _get_step_context(step):
    """The `with` header of a step and whether its substeps get blocks of their own."""
    proto = step.Proto()
    if proto.should_stop_blob:
        return call("loop"), False
    if proto.num_iter and proto.num_iter != 1:
        return call("loop", [proto.num_iter]), False
    if proto.num_concurrent_instances > 1:
        return call("parallel", [("num_instances", proto.num_concurrent_instances)]), len(step.Substeps()) > 1
    if proto.concurrent_substeps and len(step.Substeps()) > 1:
        return call("parallel"), True
    if proto.report_net:
        return call("run_once"), False
    return None, False


@Printer.register(ExecutionStep)
def print_step(text, step):
    proto = step.Proto()
    header, own_blocks = _get_step_context(step)
    with text.context(header):
        if proto.report_net:
            with text.context(call("report_net", [proto.report_interval])):
                text(step.get_net(proto.report_net))
        for sub in step.Substeps() + [step.get_net(n) for n in proto.network]:
            sub_proto = sub.Proto() if isinstance(sub, ExecutionStep) else None
            if sub_proto is not None and sub_proto.run_every_ms:
                sub_header = call("reporter", [str(sub), ("interval_ms", sub_proto.run_every_ms)])
            elif own_blocks:
                kind = "workspace" if sub_proto is not None and sub_proto.create_workspace else "step"
                sub_header = call(kind, [str(sub)])
            else:
                sub_header = None
            with text.context(sub_header):
                text(sub)
                if proto.should_stop_blob:
                    text.add(call("yield stop_if", [proto.should_stop_blob]))


def _print_task_output(x) -> str:
    assert isinstance(x, TaskOutput)
    return "Output[" + ", ".join(str(n) for n in x.names) + "]"


@Printer.register(Task)
def print_task(text, task):
    outs = ", ".join(_print_task_output(o) for o in task.outputs())
    with text.context(call("Task", [("node", task.node), ("name", task.name), ("outputs", outs)])):
        text(task.get_step())


@Printer.register(TaskGroup)
def print_task_group(text, tg, header=None):
    with text.context(header or call("TaskGroup")):
        for task in tg.tasks_by_node().tasks():
            text(task)


@Printer.register(Job)
def print_job(text, job):
    text(job.init_group, "Job.current().init_group")
    text(job.epoch_group, "Job.current().epoch_group")
    with text.context("Job.current().stop_signals"):
        for out in job.stop_signals:
            text.add(_print_task_output(out))
    text(job.download_group, "Job.current().download_group")
    text(job.exit_group, "Job.current().exit_group")


def to_string(obj, **kwargs) -> str:
    """The text of a Net, ExecutionStep, Task, TaskGroup or Job (kwargs: factor_prefixes, c2_syntax)."""
    printer = Printer(**kwargs)
    printer(obj)
    return str(printer)


def debug_net(net) -> Net:
    """A copy of net that logs each op's text (LogInfo) before running it."""
    assert isinstance(net, Net)
    logged = Net(str(net))
    for op in net.Proto().op:
        text = Printer()
        print_op(text, op)
        logged.LogInfo(str(text))
        logged.Proto().op.extend([op])
    return logged
