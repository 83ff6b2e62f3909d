"""What `stepnet draw` needs to know about a net before drawing it: each op's role (forward, gradient, optimizer,
data, fill), which blobs are parameters, which nets of a plan only initialize, and runs of repeated blocks
(ResNet's residual blocks, DenseNet's dense layers) to draw once as one cluster labelled ×k."""
from __future__ import annotations

import heapq
import re
from dataclasses import dataclass
from typing import Iterable

from ..graph.view import Graph, nested_nets
from ..io.proto import NetDef, OperatorDef

# Blob names Caffe2's builders give weights: conv1_w, fc_b, res2_0_branch2a_bn_s / _rm / _riv, ..._weight.
WEIGHT_NAME = re.compile(r"(_w|_b|_s|_rm|_riv|_weight|_bias|_scale|_shift|_gamma|_beta)$")
OPTIMIZER_FAMILIES = frozenset({"optim", "sparse_optim", "lr", "clipping"})
DATA_TYPES = frozenset({"TensorProtosDBInput", "CreateDB", "DBExists", "Save", "Load", "Checkpoint", "Snapshot",
                        "CreateBlobsQueue", "EnqueueBlobs", "DequeueBlobs", "SafeEnqueueBlobs",
                        "SafeDequeueBlobs", "CloseBlobsQueue", "WeightedSampleDequeueBlobs"})
COUNTER_TYPES = frozenset({"Iter", "AtomicIter", "CreateMutex"})
# Ops that compute a loss from a prediction (their first input) and a target.
MAX_PERIOD = 64   # the longest block looked for (a residual or inception block is 10-25 ops)
LOSS_TYPES = frozenset({"LabelCrossEntropy", "CrossEntropy", "SoftmaxWithLoss", "SpatialSoftmaxWithLoss",
                        "SigmoidCrossEntropyWithLogits", "WeightedSigmoidCrossEntropyWithLogits",
                        "SquaredL2Distance", "L1Distance", "AveragedLoss", "MakeTwoClass"})


def role(op: OperatorDef) -> str:
    """'gradient', 'optimizer', 'data', 'loss', 'fill' or 'forward'."""
    from ..ops import REGISTRY

    t = op.type
    if op.is_gradient_op or t.endswith("Gradient") or t.endswith("Grad"):
        return "gradient"
    family = REGISTRY.get(t).family if t in REGISTRY else ""
    if family in OPTIMIZER_FAMILIES or t in COUNTER_TYPES:
        return "optimizer"
    if t in DATA_TYPES or family == "db":
        return "data"
    if t in LOSS_TYPES:
        return "loss"
    if t.endswith("Fill"):
        return "fill"
    return "forward"


def is_init_net(net: NetDef) -> bool:
    """A net that only makes blobs: it reads nothing it did not write itself and runs no nested nets (the
    parameter fills of an init net, a plan's setup nets)."""
    if not net.op or any(True for op in net.op for _ in nested_nets(op)):
        return False
    return not Graph.of(net).read_before_written()


def filled_blobs(nets: Iterable[NetDef]) -> set[str]:
    """Every blob a fill op of the given nets writes."""
    return {name for net in nets for op in net.op if op.type.endswith("Fill") for name in op.output}


def parameters(graph: Graph, filled: set[str]) -> set[str]:
    """The blobs of a net to draw as parameters: read before any write in it, written in it by nothing but
    optimizer updates, and either filled by an init net or named like a weight (…_w, …_b, …_bn_s, …_rm)."""
    params = set()
    for name in graph.read_before_written():
        if name not in filled and not WEIGHT_NAME.search(name):
            continue
        if all(role(graph.ops[i]) == "optimizer" for i in graph.writers(name)):
            params.add(name)
    return params


@dataclass(frozen=True)
class Block:
    """ops [start, start + period * count) repeat one op-type sequence of `period` ops `count` times."""
    start: int
    period: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.period * self.count


def repeated_blocks(graph: Graph, params: set[str], min_ops: int = 8) -> list[Block]:
    """Non-overlapping runs of a repeated op-type sequence covering at least min_ops ops (a single type must
    repeat at least 3 times), in op order. A run counts only if its blocks form a chain (what a block makes is
    read by it or the next one, or after the run by anything). Among shifted copies of a run, blocks that take
    one value from before them (a residual block's input, not also the middle of the block before) win, then more
    repeats, longer runs, and blocks that start with an op reading parameters (a Conv, not the Relu before it)."""
    ops = graph.ops
    codes: dict[str, str] = {}
    text = "".join(codes.setdefault(op.type, chr(0x100 + len(codes))) for op in ops)
    weighted = [any(n in params for n in op.input) for op in ops]
    n = len(text)

    def candidate(i: int, p: int, k: int):   # a heap entry: the best run pops first
        if k >= 2 and p * k >= min_ops and (p > 1 or k >= 3):
            return (_entries(graph, params, i, p) != 1, -k, -p * k, not weighted[i], i, p, k)
        return None
    heap = []
    for i in range(n):
        for p in range(1, min(MAX_PERIOD, (n - i) // 2) + 1):
            unit = text[i:i + p]
            if i >= p and text.startswith(unit, i - p):
                continue   # the run starting p ops earlier holds this one (tried if that one is no chain)
            k = 1
            while text.startswith(unit, i + k * p):
                k += 1
            heap.append(candidate(i, p, k))
    heap = [c for c in heap if c is not None]
    heapq.heapify(heap)
    taken = [False] * n
    blocks = []
    while heap:
        *_, i, p, k = heapq.heappop(heap)
        if any(taken[i:i + p * k]):
            continue
        if not _chained(graph, i, p, k):   # the costly check last; without its first block it may be one
            shorter = candidate(i + p, p, k - 1)
            if shorter is not None:
                heapq.heappush(heap, shorter)
            continue
        taken[i:i + p * k] = [True] * (p * k)
        blocks.append(Block(i, p, k))
    return sorted(blocks, key=lambda b: b.start)


def _entries(graph: Graph, params: set[str], start: int, period: int) -> int:
    """How many values ops [start, start + period) read from before start (parameters aside)."""
    seen = set()
    for i in range(start, start + period):
        for name, v in zip(graph.ops[i].input, graph.in_versions[i]):
            w = graph.writer.get((name, v))
            if (w is None or w < start) and name not in params:
                seen.add((name, v))
    return len(seen)


def _chained(graph: Graph, start: int, period: int, count: int) -> bool:
    """Whether each block but the last of the run has its outputs read only by itself and the next block."""
    for j in range(count - 1):
        limit = start + (j + 2) * period
        for i in range(start + j * period, start + (j + 1) * period):
            for name, v in zip(graph.ops[i].output, graph.out_versions[i]):
                if any(r >= limit for r in graph.consumers.get((name, v), ())):
                    return False
    return True
