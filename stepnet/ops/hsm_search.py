"""The hierarchical softmax's tree ops: HSoftmaxSearch (the most likely nodes and words of a trained
hierarchy) and HuffmanTreeHierarchy (a Huffman tree of the labels' counts), both over TreeProtos
(caffe2/proto/hsm.proto, stepnet.hsm_pb2). HSoftmax and its gradient are in hsm.py.

Semantics from caffe2/operators/h_softmax_op.{h,cc}, CPU only there: computed on the host here, scores put on
the op's device, names and trees (string tensors) on the host.

HSoftmaxSearch(X, W, b; tree, beam, topN) -> Y_names (M x topN strings), Y_scores (M x topN): from the root
(score 0), each node's children then words get the softmax of the FC over its rows W[offset:offset+width]
(width = children + words), and score -log(max(p, 1e-20)) + the node's score; those scoring below the node's
score + beam are kept, and a kept child is searched in turn. A row's kept entries are listed node by node (a
node's children, its words, then its children's entries, depth first), ordered by score (ties in that order),
and the first topN are its outputs: a child by its name, a word by its id in decimal; empty names and score 0
pad a row with fewer. Caffe2 needs offset and name on every node it reaches; the tree comes from the model file,
so here it is checked once per distinct value: every node has both, offsets >= 0, word ids >= 0 and each in one
place; at run time every node must end within W's rows.

HuffmanTreeHierarchy(labels; num_classes) -> a 1-element string tensor holding a serialized TreeProto: the
labels (int64 in 0..num_classes-1) counted, the classes merged two by two, least counts first, in a binary
heap with the order of ties that C++'s std::priority_queue (libstdc++) gives, then written out depth first
with Caffe2's node offsets. No gradient is registered for it (Caffe2's SHOULD_NOT_DO_GRADIENT names
"HuffmanTreeHierarchyOp", not the op).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..core.errors import ArgumentError, ShapeError
from ..hsm_pb2 import TreeProto
from .base import check_int_dtype, on_device, out_spec
from .hsm import LOG_THRESHOLD, geometry, host, parse_arg, raw_bytes, softmax
from .registry import Arg, SHOULD_NOT_DO_GRADIENT, op


# --------------------------------------------------------------------------------------------- the tree
class Node(NamedTuple):
    offset: int
    names: tuple[bytes, ...]   # the names of its children, then its words' ids in decimal
    children: tuple[int, ...]  # the children's positions in the tree's node list


@functools.lru_cache(maxsize=16)
def tree_nodes(raw: bytes) -> tuple[Node, ...]:
    """The nodes of a serialized TreeProto, depth first (a node before its children, children in order),
    after the checks of the module docstring."""
    t = parse_arg(TreeProto(), raw, "tree", " (or its nodes nest deeper than protobuf's limit of 100 levels)")
    if not t.HasField("root_node"):
        raise ArgumentError("argument 'tree': the tree has no root_node")
    protos, paths, parents = [t.root_node], ["root_node"], []
    words: dict[int, str] = {}
    k = 0
    while k < len(protos):                       # breadth first numbering, then reordered depth first below
        node, where = protos[k], paths[k]
        for field in ("offset", "name"):
            if not node.HasField(field):
                raise ArgumentError(f"argument 'tree': {where} has no {field}; HSoftmaxSearch needs an offset "
                                    "and a name on every node")
        if node.offset < 0:
            raise ArgumentError(f"argument 'tree': {where} has offset {node.offset}; offsets must be >= 0")
        for w in node.word_ids:
            if w < 0:
                raise ArgumentError(f"argument 'tree': {where} has word id {w}; word ids must be >= 0")
            if w in words:
                raise ArgumentError(f"argument 'tree': word {w} is in two places ({words[w]} and {where})")
            words[w] = where
        for i, child in enumerate(node.children):
            protos.append(child)
            paths.append(f"{where}.children[{i}] ({child.name!r})")
            parents.append(k)
        k += 1
    kids: list[list[int]] = [[] for _ in protos]
    for child, parent in enumerate(parents, start=1):
        kids[parent].append(child)
    order, stack = [], [0]
    while stack:
        k = stack.pop()
        order.append(k)
        stack.extend(reversed(kids[k]))
    place = {k: i for i, k in enumerate(order)}
    return tuple(Node(protos[k].offset,
                      tuple(protos[c].name.encode("utf-8") for c in kids[k])
                      + tuple(str(w).encode("ascii") for w in protos[k].word_ids),
                      tuple(place[c] for c in kids[k])) for k in order)


# --------------------------------------------------------------------------------------------- search
def _search_checks(x, w, b, tree, top_n) -> tuple[int, int, int, tuple[Node, ...]]:
    if len(w.shape) != 2:
        raise ShapeError(f"HSoftmaxSearch: W must be a matrix (N x K), got shape {tuple(w.shape)}")
    m, k, n = geometry("HSoftmaxSearch", x, w, b)
    if top_n < 0:
        raise ArgumentError(f"HSoftmaxSearch: topN must be >= 0, got {top_n}")
    nodes = tree_nodes(raw_bytes(tree))
    for node in nodes:
        if node.offset + len(node.names) > n:
            raise ShapeError(f"HSoftmaxSearch: the tree's node at offset {node.offset} spans rows {node.offset}.."
                             f"{node.offset + len(node.names) - 1} of W, which has {n} rows")
    return m, k, n, nodes


def _search_shape(specs, *, tree, beam, topN):
    x, w, b = specs
    m, _, _, _ = _search_checks(x, w, b, tree, topN)
    return [out_spec((m, topN), object), out_spec((m, topN), x.dtype)]


@op("HSoftmaxSearch", inputs=3, outputs=2, inplace=(), shape=_search_shape, grows="shapes",
    gradient=SHOULD_NOT_DO_GRADIENT,
    args={"tree": Arg("str", "", "serialized TreeProto; every node has a name and an offset"),
          "beam": Arg("float", 0.01, "children scoring below their parent's score + beam are searched"),
          "topN": Arg("int", 5, "entries kept per row")})
def h_softmax_search(xp, x, w, b, *, tree, beam, topN):
    """The topN best-scoring nodes and words of each row of X (names, scores; lower is better) found by
    searching the tree from its root within `beam` of each node's score."""
    m, k, n, nodes = _search_checks(x, w, b, tree, topN)
    X, W, B = host(x).reshape(m, k), host(w), host(b)
    dtype = X.dtype
    reach: list = [None] * len(nodes)
    reach[0] = (np.arange(m), np.zeros(m, dtype=dtype))
    found: list[list] = [[] for _ in range(m)]           # per row: (score, name), in the order they are found
    for i, node in enumerate(nodes):
        if reach[i] is None or not len(reach[i][0]) or not node.names:
            continue
        rows, parent = reach[i]
        end = node.offset + len(node.names)
        p = softmax(X[rows] @ W[node.offset:end].T + B[node.offset:end])
        scores = -np.log(np.maximum(p, LOG_THRESHOLD)) + parent[:, None]
        kept = scores < (parent + np.asarray(beam, dtype=dtype))[:, None]
        for j, child in enumerate(node.children):
            reach[child] = (rows[kept[:, j]], scores[kept[:, j], j])
        for r, row_kept, row_scores in zip(rows.tolist(), kept, scores):
            found[r].extend((row_scores[j], node.names[j]) for j in np.flatnonzero(row_kept))
    names = np.full((m, topN), b"", dtype=object)
    out = np.zeros((m, topN), dtype=dtype)
    for r, entries in enumerate(found):
        for j, (score, name) in enumerate(sorted(entries, key=lambda e: e[0])[:topN]):
            names[r, j], out[r, j] = name, score
    return names, on_device(xp, out, dtype)


# --------------------------------------------------------------------------------------------- Huffman
def _huffman_checks(labels, num_classes) -> None:
    check_int_dtype(labels.dtype, "HuffmanTreeHierarchy: labels")
    if len(labels.shape) != 1:
        raise ShapeError(f"HuffmanTreeHierarchy: labels must be a vector, got shape {tuple(labels.shape)}")
    if num_classes < 1:
        raise ArgumentError(f"HuffmanTreeHierarchy needs num_classes >= 1 (the number of classes), got "
                            f"{num_classes}")


def _huffman_shape(specs, *, num_classes):
    _huffman_checks(specs[0], num_classes)
    return [out_spec((1,), object)]


WORK_PER_CLASS = 320   # bytes the counts, the heap and the tree take per class (measured: about 300)


def _huffman_alloc(labels, *, num_classes):
    """The kernel's working memory, as (num_classes, WORK_PER_CLASS) bytes: a num_classes the blob limit could
    not hold that way is refused up front (num_classes comes from the model file)."""
    return [(0, (max(num_classes, 0), WORK_PER_CLASS), np.uint8)]


def _sift_up(heap: list, hole: int, top: int, value) -> None:
    """libstdc++'s __push_heap, for a queue whose top is the least count (value: (label, count, l, r))."""
    parent = (hole - 1) // 2
    while hole > top and heap[parent][1] > value[1]:
        heap[hole] = heap[parent]
        hole, parent = parent, (parent - 1) // 2
    heap[hole] = value


def _push(heap: list, value) -> None:
    heap.append(value)
    _sift_up(heap, len(heap) - 1, 0, value)


def _pop(heap: list):
    """libstdc++'s pop_heap (__adjust_heap) then pop_back: the top, removed."""
    top, value = heap[0], heap.pop()
    n = len(heap)
    if not n:
        return top
    hole = child = 0
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if heap[child][1] > heap[child - 1][1]:
            child -= 1
        heap[hole], hole = heap[child], child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        heap[hole], hole = heap[child - 1], child - 1
    _sift_up(heap, hole, 0, value)
    return top


def huffman_tree(counts: list[int]) -> TreeProto:
    """Caffe2's Huffman TreeProto of the class counts (see the module docstring)."""
    heap: list = []
    for label, count in enumerate(counts):
        _push(heap, (label, count, -1, -1))
    built: list = []                                   # (label, count, left, right) in the order popped
    while heap:
        left = _pop(heap)
        built.append(left)
        if heap:
            right = _pop(heap)
            built.append(right)
            _push(heap, (-1, left[1] + right[1], len(built) - 2, len(built) - 1))
    leaf = [node[2] == -1 and node[3] == -1 for node in built]
    tree = TreeProto()
    tree.root_node.offset = 0
    offset = 2
    stack = [(len(built) - 1, tree.root_node, 0)]     # (node, its proto, which child comes next)
    while stack:
        index, proto, side = stack.pop()
        if side == 2 or (side == 0 and leaf[index]):
            continue
        stack.append((index, proto, side + 1))
        child = built[index][2 + side]
        if leaf[child]:
            proto.word_ids.append(built[child][0])
            offset += side                             # (Caffe2 counts a right leaf only)
        else:
            sub = proto.children.add()
            sub.offset, offset = offset, offset + 2
            stack.append((child, sub, 0))
    return tree


@op("HuffmanTreeHierarchy", inputs=1, outputs=1, inplace=(), shape=_huffman_shape, alloc=_huffman_alloc,
    args={"num_classes": Arg("int", -1, "the number of classes (labels are 0..num_classes-1)")})
def huffman_tree_hierarchy(xp, labels, *, num_classes):
    """A serialized TreeProto (a 1-element string tensor) of the Huffman coding of the labels' counts."""
    _huffman_checks(labels, num_classes)
    values = host(labels).astype(np.int64, copy=False)
    bad = np.flatnonzero((values < 0) | (values >= num_classes))
    if bad.size:
        raise ShapeError(f"HuffmanTreeHierarchy: labels[{bad[0]}] = {values[bad[0]]} is not in 0.."
                         f"{num_classes - 1} (num_classes = {num_classes})")
    counts = np.bincount(values, minlength=num_classes).tolist()
    out = np.empty(1, dtype=object)
    out[0] = huffman_tree(counts).SerializeToString()
    return out
