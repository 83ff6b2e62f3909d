"""A read-only view of a NetDef, and rewrites that return new NetDefs.

Every pass reads nets through this module instead of walking protobuf itself: blob versions in SSA form (each
write bumps a blob's version), which op wrote each version and which ops read it, and the nets nested in op
arguments (RecurrentNetwork's step nets, If/While/Do bodies, as NetDefs in `n`/`nets` or as text in `s`).
Rewrites copy: none changes the message it is given (design rule 9).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Iterator

from ..core.errors import FileFormatError, NetError, PlanError, did_you_mean
from ..io.proto import NetDef, OperatorDef, parse_text
from ..io.validate import MAX_DEPTH, NET_IN_ARG, too_deep_text

# Arguments that hold a nested net (a NetDef in `n`, or its text form in `s`): RecurrentNetwork, If, While, Do.
NET_ARGS = frozenset({"step_net", "backward_step_net", "then_net", "else_net", "loop_net", "cond_net", "net",
                      "body"})   # ONNXWhile's loop body


class Graph:
    """SSA view of a list of ops. Version 0 of a blob is its value before the ops run; the k-th write makes
    version k. For op i: `in_versions[i][j]` is the version input j reads, `out_versions[i][j]` the version
    output j makes; `writer[(name, v)]` is the op that made version v; `consumers[(name, v)]` the ops reading
    it, in order; `final[name]` the version after the last op (external inputs first, then blobs in the order
    of their first write; blobs only read are absent, i.e. at version 0)."""

    def __init__(self, ops: Iterable[OperatorDef], external_input: Iterable[str] = ()):
        self.ops: tuple[OperatorDef, ...] = tuple(ops)
        self.external_input: tuple[str, ...] = tuple(external_input)
        self.in_versions: list[tuple[int, ...]] = []
        self.out_versions: list[tuple[int, ...]] = []
        self.writer: dict[tuple[str, int], int] = {}
        self.consumers: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.final: dict[str, int] = {name: 0 for name in self.external_input}
        for i, op in enumerate(self.ops):
            ins = tuple(self.final.get(name, 0) for name in op.input)
            for name, v in zip(op.input, ins):
                self.consumers[(name, v)].append(i)
            outs = []
            for name in op.output:
                v = self.final[name] = self.final.get(name, 0) + 1
                self.writer[(name, v)] = i
                outs.append(v)
            self.in_versions.append(ins)
            self.out_versions.append(tuple(outs))

    @classmethod
    def of(cls, net: NetDef) -> "Graph":
        return cls(net.op, net.external_input)

    def __len__(self) -> int:
        return len(self.ops)

    def producer(self, index: int, j: int) -> int | None:
        """The op that wrote the value op `index` reads as input j (None: it is read before any write)."""
        return self.writer.get((self.ops[index].input[j], self.in_versions[index][j]))

    def writers(self, name: str) -> list[int]:
        """Every op writing `name`, in order."""
        return [self.writer[(name, v)] for v in range(1, self.final.get(name, 0) + 1)]

    def readers(self, name: str) -> list[int]:
        """Every op reading any version of `name`, in order."""
        return sorted(i for v in range(self.final.get(name, 0) + 1) for i in self.consumers.get((name, v), ()))

    def read_before_written(self) -> dict[str, int]:
        """{blob: first op reading it at version 0}: what the ops need from outside (in first-read order)."""
        first: dict[str, int] = {}
        for i, op in enumerate(self.ops):
            for name, v in zip(op.input, self.in_versions[i]):
                if v == 0 and name not in first:
                    first[name] = i
        return first

    def uses(self, name: str) -> int:
        """How many op input and output slots name `name`."""
        writes = self.final.get(name, 0)
        return writes + sum(len(self.consumers.get((name, v), ())) for v in range(writes + 1))

    def blobs(self) -> set[str]:
        """Every blob name the ops and the external inputs mention."""
        return set(self.final) | {name for name, _ in self.consumers}


def blob_names(*nets: NetDef) -> set[str]:
    """Every blob name of the nets: external inputs and outputs, op inputs and outputs."""
    names: set[str] = set()
    for net in nets:
        names.update(net.external_input, net.external_output)
        for op in net.op:
            names.update(op.input, op.output)
    return names


# ------------------------------------------------------------------------------------------- nested nets
def nested_nets(op: OperatorDef, level: int = 0) -> Iterator[tuple[str, NetDef]]:
    """(argument name, net) for every net an op's arguments hold: any NetDef in `n` or `nets`, and text in `s`
    of the net arguments (NET_ARGS). `level`: the nesting level of the op's net; text nets count it, so that
    text in text cannot nest deeper than MAX_DEPTH in all. Text that does not parse (not UTF-8, a syntax
    error, too deep) is skipped: binding the op reports it."""
    for arg in op.arg:
        if arg.HasField("n"):
            yield arg.name, arg.n
        for i, n in enumerate(arg.nets):
            yield f"{arg.name}[{i}]", n
        if arg.HasField("s") and arg.name in NET_ARGS:
            try:
                yield arg.name, parse_text(arg.s.decode(), "net", depth=level + NET_IN_ARG)
            except (FileFormatError, UnicodeDecodeError):
                continue


def walk(net: NetDef, depth: int = 0, level: int = 0) -> Iterator[tuple[int, NetDef, int, OperatorDef]]:
    """(depth, net, index, op) for every op of net and of the nets nested in its ops' arguments, depth first.
    `level`: the message nesting level of net (1 for a plan's networks); nets deeper than MAX_DEPTH in all
    are an error, never a runaway recursion."""
    if level > MAX_DEPTH:
        raise NetError(too_deep_text(level), at=f"net {net.name!r}")
    for index, op in enumerate(net.op):
        yield depth, net, index, op
        for _, sub in nested_nets(op, level):
            yield from walk(sub, depth + 1, level + NET_IN_ARG)


# ------------------------------------------------------------------------------------------- rewrites
def copy_op(op: OperatorDef) -> OperatorDef:
    out = OperatorDef()
    out.CopyFrom(op)
    return out


def copy_net(net: NetDef) -> NetDef:
    out = NetDef()
    out.CopyFrom(net)
    return out


def with_ops(net: NetDef, ops: Iterable[OperatorDef], external_input: Iterable[str] | None = None) -> NetDef:
    """A new NetDef with net's name, type, arguments, device option and external outputs, and the given ops
    (copied) and external inputs (net's when None)."""
    out = NetDef()
    out.CopyFrom(net)
    del out.op[:]
    out.op.extend(ops)
    if external_input is not None:
        del out.external_input[:]
        out.external_input.extend(external_input)
    return out


def add_external_inputs(net: NetDef, names: Iterable[str]) -> NetDef:
    """net with `names` appended to its external inputs (those it lacks, in order)."""
    inputs = list(net.external_input)
    for name in names:
        if name not in inputs:
            inputs.append(name)
    return with_ops(net, net.op, inputs)


def renamed(net: NetDef, mapping: dict[str, str]) -> NetDef:
    """net with every op input and output named in `mapping` renamed (external inputs/outputs unchanged)."""
    ops = []
    for op in net.op:
        op = copy_op(op)
        op.input[:] = [mapping.get(n, n) for n in op.input]
        op.output[:] = [mapping.get(n, n) for n in op.output]
        ops.append(op)
    return with_ops(net, ops)


def plan_networks(plan) -> dict[str, NetDef]:
    """{name: NetDef} of a PlanDef's networks; a PlanError if two share a name."""
    nets: dict[str, NetDef] = {}
    for net in plan.network:
        if net.name in nets:
            raise PlanError(f"plan {plan.name!r}: two networks are named {net.name!r}")
        nets[net.name] = net
    return nets


def step_network(plan, nets: dict[str, NetDef], name: str) -> NetDef:
    """The network an execution step names; a PlanError (with the close names) if the plan has none so named."""
    if name not in nets:
        raise PlanError(f"plan {plan.name!r}: execution step refers to network {name!r}, which the plan does not "
                        f"define{did_you_mean(name, nets)}")
    return nets[name]
