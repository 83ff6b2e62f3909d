"""Blob recycling rewrites (what Caffe2 computes in C++, caffe2/core/memonger.cc): both return new NetDefs in
which blobs whose lives do not overlap share one name.

- `recycle_for_dag` (share_grad_blobs, optimize_inference_for_dag): walks the ops depth first from the ops
  reading the head blobs (losses, or inputs). A sharable blob is free once every walked op reading it ran; an
  op's sharable output takes a free blob when the blob is on the op's device and the walk reached the op on
  every branch the blob was used on (tokens: a branch of the graph gets a new token, and a blob may be reused
  only by an op holding every token of its users), so parallel branches of a DAG never share.
- `recycle_in_order` (optimize_inference_fast): for a net run in its op order, an output first written by op i
  takes a blob whose last read was before i.
A blob in dont_share keeps its name and its value: it neither takes a free blob nor is freed (Caffe2 only
kept it from being freed, so a dont_share blob that took another's storage could still be overwritten).
Recurrent ops' step nets are renamed too, and the op gets `<blob>.rename` arguments for the outer blobs it
names.
"""
from __future__ import annotations

import heapq
import logging

from ..core.errors import NetError
from ..io.proto import DeviceOption, NetDef, make_argument, parse_text
from ..graph.view import copy_net
from google.protobuf import text_format

log = logging.getLogger("memonger")
STEP_NET_ARGS = ("step_net", "backward_step_net")


def _size(name: str, shapes: dict) -> int:
    if name not in shapes:
        return 0
    n = 1
    for d in shapes[name]:
        n *= int(d)
    return n


class _DagRecycler:
    def __init__(self, net: NetDef, heads, op_indices, sharable, namescope: str, dont_share, shapes: dict):
        self.net, self.heads, self.namescope = net, [str(h) for h in heads], namescope
        self.sharable, self.dont_share, self.shapes = set(sharable), set(dont_share), dict(shapes or {})
        n = len(net.op)
        self.op_inputs, self.visits, self.deposit = [0] * n, [0] * n, [set() for _ in range(n)]
        self.visited = [False] * n
        self.tokens_made = 1
        self.blob_to_ops: dict = {}
        self.input_count: dict = {}
        self.share_counts: dict = {}
        self.sizes: dict = {}
        self.req_tokens: dict = {}
        self.mapping: dict = {}
        self.device: dict = {}
        self.processed: set = set()
        self.optim_outputs = {o for i in op_indices for o in net.op[i].output}
        self._count_inputs(op_indices)

    def _count_inputs(self, op_indices) -> None:
        heads = set(self.heads)
        seen: dict = {}
        for i in op_indices:
            op = self.net.op[i]
            for name in op.input:
                if name in self.sharable or name in heads:
                    if name in self.optim_outputs:
                        if name not in seen:
                            raise NetError(f"memonger: input {name!r} of op #{i} ({op.type}) is not written by an "
                                           "op before it")
                        self.op_inputs[i] += seen[name]
                    else:
                        self.share_counts[name] = 1
                    self.blob_to_ops.setdefault(name, []).append(i)
            for name in op.output:
                seen[name] = seen.get(name, 0) + 1
                device = DeviceOption()
                device.CopyFrom(op.device_option)
                if op.type == "CopyGPUToCPU":       # its outputs are on the CPU whatever its device option says
                    device.device_type, device.device_id = 0, 0
                self.device[name] = device

    def mapped(self, name: str) -> str:
        return self.mapping.get(name, name)

    def run(self) -> NetDef:
        for head in self.heads:
            for i in list(self.blob_to_ops.get(head, ())):
                if not self.visited[i]:
                    self.tokens_made += 1
                    self._walk(i, [], {self.tokens_made - 1})
        self._finish_names()
        return self._apply(self.net)

    def _walk(self, start: int, free: list, tokens: set) -> None:
        """The depth-first walk, with an explicit stack of suspended visits (nets are deeper than Python's
        recursion limit)."""
        stack = [self._visit(start, free, tokens)]
        while stack:
            try:
                child = next(stack[-1])
            except StopIteration:
                stack.pop()
                continue
            stack.append(self._visit(*child))

    def _visit(self, i: int, free: list, tokens: set):
        tokens |= self.deposit[i]
        self.deposit[i] = set()
        if self.visited[i]:
            raise NetError(f"memonger: op #{i} visited twice")
        self.visited[i] = True
        op = self.net.op[i]
        for name in list(op.input) + list(op.output):
            actual = self.mapped(name)
            self.req_tokens.setdefault(actual, set()).update(tokens)
            if actual != name:
                self.req_tokens.setdefault(name, set()).update(tokens)
        freed, freed_names = [], set()
        for name in op.input:
            if name in self.sharable:
                self.input_count[name] = self.input_count.get(name, 0) + 1
                if self.input_count[name] == len(self.blob_to_ops.get(name, ())):
                    actual = self.mapped(name)
                    if actual not in self.dont_share:
                        freed.append((-self.share_counts.get(actual, 0), actual))
                        freed_names.add(actual)
        for name in op.output:
            if (name in self.sharable and name not in self.processed and name not in freed_names
                    and name not in self.dont_share):
                blob = self._take_free(name, tokens, free, self.device.get(name, DeviceOption()))
                if blob:
                    self.req_tokens.setdefault(blob, set()).update(tokens)
                    self.share_counts[blob] = self.share_counts.get(blob, 0) + 1
                    self.mapping[name] = blob
                self.processed.add(name)
        in_pool = {name for _, name in free}
        for entry in freed:
            if entry[1] not in in_pool:
                heapq.heappush(free, entry)
                if self.shapes and entry[1] not in self.sizes:
                    self.sizes[entry[1]] = _size(entry[1], self.shapes)
        branches = sum(len(self.blob_to_ops.get(name, ())) for name in op.output)
        for name in op.output:
            for child in self.blob_to_ops.get(name, ()):
                self.visits[child] += 1
                if self.visits[child] == self.op_inputs[child]:
                    child_tokens = set(tokens)
                    if branches > 1:
                        child_tokens.add(self.tokens_made)
                        self.tokens_made += 1
                    yield child, free, child_tokens
                elif not self.visited[child]:
                    self.deposit[child] |= tokens

    def _usable(self, blob: str, tokens: set, device) -> bool:
        where = self.device.get(blob, DeviceOption())
        if (device.device_type, device.device_id) != (where.device_type, where.device_id):
            return False
        return self.req_tokens.get(blob, set()) <= tokens

    def _take_free(self, name: str, tokens: set, free: list, device) -> str:
        if not self.shapes:
            skipped, found = [], ""
            while free:
                entry = heapq.heappop(free)
                if self._usable(entry[1], tokens, device):
                    found = entry[1]
                    break
                skipped.append(entry)
            for entry in skipped:
                heapq.heappush(free, entry)
            return found
        # with shapes: the largest free blob while none is as large as the output, then the smallest that is
        want, best, index = _size(name, self.shapes), -1, -1
        for k, (_, blob) in enumerate(free):
            if self._usable(blob, tokens, device):
                size = self.sizes[blob]
                if size >= best and (best < want or best >= size):
                    best, index = size, k
        if index < 0:
            return ""
        blob = free.pop(index)[1]
        heapq.heapify(free)
        return blob

    def _finish_names(self) -> None:
        """Shared blobs made by the optimized ops get new names (<namescope>__m<k>_shared)."""
        renamed: dict = {}
        for target in list(self.mapping.values()):
            if target in self.optim_outputs:
                if target not in renamed:
                    renamed[target] = f"{self.namescope}__m{len(renamed)}_shared"
            else:
                renamed.setdefault(target, target)
        for k, v in renamed.items():
            self.mapping.setdefault(k, v)
        for blob in list(self.mapping):
            target = self.mapping[blob]
            if target in renamed and renamed[target] != target:
                renamed[blob] = renamed[target]
                self.mapping[blob] = renamed[blob]

    def _apply(self, net: NetDef) -> NetDef:
        out = copy_net(net)
        for op in out.op:
            if op.type.startswith("RecurrentNetwork"):
                _rename_step_nets(op, self.mapped, self._apply)
            op.input[:] = [self.mapped(n) for n in op.input]
            op.output[:] = [self.mapped(n) for n in op.output]
        return out


def _rename_step_nets(op, mapped, apply) -> None:
    """A recurrent op's step nets renamed by `apply`, and `<blob>.rename` arguments for its renamed blobs."""
    for arg in op.arg:
        if arg.name not in STEP_NET_ARGS:
            continue
        if arg.HasField("n"):
            if arg.HasField("s"):
                raise NetError(f"memonger: argument {arg.name!r} of {op.type} holds both a NetDef and text")
            arg.n.CopyFrom(apply(arg.n))
        elif arg.HasField("s"):
            step = apply(parse_text(arg.s.decode(), "net"))
            arg.s = text_format.MessageToString(step).encode()
    for name in list(op.input) + list(op.output):
        if mapped(name) != name:
            op.arg.append(make_argument(name + ".rename", mapped(name)))


def recycle_for_dag(net: NetDef, heads, op_indices, sharable, namescope: str, dont_share=(), blob_shapes=None,
                    ) -> NetDef:
    """net with the sharable blobs of the ops `op_indices` recycled, walking from the heads (see the module)."""
    return _DagRecycler(net, heads, op_indices, sharable, namescope, dont_share or (), blob_shapes or {}).run()


def recycle_in_order(net: NetDef, static_blobs) -> NetDef:
    """net (a simple net run in op order) with each non-static output reusing a blob no later op reads."""
    if net.type not in ("", "simple"):
        log.info("Cannot optimize memory for nets of type: %s", net.type)
        return copy_net(net)
    if any(op.type == "RecurrentNetwork" for op in net.op):
        log.info("Memonger does not support RecurrentNetwork yet")
        return copy_net(net)
    static = set(static_blobs)
    everything: set = set()
    first_last: dict = {}
    for i, op in enumerate(net.op):
        for name in op.input:
            if name in first_last:
                first_last[name][1] = i
            everything.add(name)
        for name in op.output:
            everything.add(name)
            if name not in static and name not in first_last:
                first_last[name] = [i, i]
    pool: list = []
    names: dict = {}       # a released blob -> its shared name
    home: dict = {}        # a blob -> the released blob whose storage it uses
    for i, op in enumerate(net.op):
        released = []
        for name in op.input:
            span = first_last.get(name)
            if span is not None and span[1] == i:
                if name not in home:
                    home[name] = name
                    shared = f"__m{len(names)}_shared"
                    if shared in everything:
                        log.info("Net was already memongered!")
                        return copy_net(net)
                    names[name] = shared
                    if name not in released:
                        released.append(name)
                elif home[name] not in released:
                    released.append(home[name])
        for name in op.output:
            span = first_last.get(name)
            if pool and span is not None and span[0] == i:
                home[name] = pool.pop()
        pool.extend(released)
    out = copy_net(net)
    for op in out.op:
        op.input[:] = [names[home[n]] if n in home else n for n in op.input]
        op.output[:] = [names[home[n]] if n in home else n for n in op.output]
    log.info("optimized net using %d shared blobs", len(names))
    return out
