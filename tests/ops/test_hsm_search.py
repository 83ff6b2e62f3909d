"""HSoftmaxSearch and HuffmanTreeHierarchy (stepnet/ops/hsm_search.py): the search against a float64 recursive
reference written from Caffe2's definition (prune each node's children and words within `beam` of its score,
list a node's kept entries before its children's, order by score, keep topN), a hand-computed case; the Huffman
tree against hand-traced trees (ties in libstdc++'s std::priority_queue order) and, on random counts, the
optimal code length of a textbook Huffman code; bad trees and arguments refused; broken kernels caught."""
import heapq
import math

import numpy as np
import pytest
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.core.limits import Limits
from stepnet.hsm_pb2 import NodeProto, TreeProto
from stepnet.ops import REGISTRY, hsm_search
from stepnet.ops.registry import SHOULD_NOT_DO_GRADIENT
from stepnet.runtime.workspace import Workspace
from stepnet.testing import run_op

RNG = np.random.default_rng(52)


def node(name, offset, children=(), words=()) -> NodeProto:
    n = NodeProto(name=name, offset=offset, word_ids=list(words))
    n.children.extend(children)
    return n


def tree(root: NodeProto) -> bytes:
    t = TreeProto()
    t.root_node.CopyFrom(root)
    return t.SerializeToString()


# root(0: A, B, word 5)  A(3: words 0 1 2)  B(6: C, word 3)  C(8: words 4 6); W has 10 rows
ROOT = node("root", 0, [node("A", 3, words=[0, 1, 2]), node("B", 6, [node("C", 8, words=[4, 6])], [3])], [5])
TREE = tree(ROOT)


def ref_search(x, w, b, root, beam, top_n):
    """Names and scores in float64, one row at a time, by the recursive definition."""
    names = np.full((len(x), top_n), b"", dtype=object)
    scores = np.zeros((len(x), top_n))

    def prune(xr, n, parent):   # -> (kept children as (name, score, their result), kept words as (id, score))
        width = len(n.children) + len(n.word_ids)
        z = [float(np.dot(w[n.offset + r].astype(np.float64), xr)) + float(b[n.offset + r]) for r in range(width)]
        e = [math.exp(v - max(z)) for v in z]
        s = [-math.log(max(v / sum(e), 1e-20)) + parent for v in e]
        kids = [(c.name.encode(), s[i], prune(xr, c, s[i])) for i, c in enumerate(n.children) if s[i] < parent + beam]
        words = [(str(wd).encode(), s[len(n.children) + i]) for i, wd in enumerate(n.word_ids)
                 if s[len(n.children) + i] < parent + beam]
        return kids, words

    def extract(result):
        kids, words = result
        return [(nm, s) for nm, s, _ in kids] + words + [e for _, _, sub in kids for e in extract(sub)]

    for i, xr in enumerate(np.asarray(x, np.float64)):
        for j, (nm, s) in enumerate(sorted(extract(prune(xr, root, 0.0)), key=lambda e: e[1])[:top_n]):
            names[i, j], scores[i, j] = nm, s
    return [names, scores.astype(x.dtype)]


def check(inputs, args, expected, tol):
    """The names exactly, the scores within tol (on the CPU: Caffe2 has the op there only, and its names are
    strings, which live on the host)."""
    names, scores = run_op("HSoftmaxSearch", inputs, 2, **args)
    assert names.dtype == object and names.tolist() == expected[0].tolist()
    assert scores.dtype == expected[1].dtype
    np.testing.assert_allclose(scores, expected[1], rtol=tol, atol=tol)


X = RNG.standard_normal((5, 3)).astype(np.float32)
W = RNG.standard_normal((10, 3)).astype(np.float32)
B = RNG.standard_normal(10).astype(np.float32)


@pytest.mark.parametrize("beam, top_n", [(5.0, 5), (0.7, 3), (100.0, 12), (2.0, 0), (-1.0, 4)])
def test_search_matches_the_reference(beam, top_n):
    check([X, W, B], {"tree": TREE, "beam": beam, "topN": top_n}, ref_search(X, W, B, ROOT, beam, top_n), 1e-5)


def test_search_in_float64_and_on_one_row():
    x, w, b = (a.astype(np.float64) for a in (X, W, B))
    check([x, w, b], {"tree": TREE, "beam": 3.0}, ref_search(x, w, b, ROOT, 3.0, 5), 1e-12)
    check([X[0], W, B], {"tree": TREE, "beam": 3.0}, ref_search(X[:1], W, B, ROOT, 3.0, 5), 1e-5)


def test_a_hand_computed_search():
    # two words under the root, equal logits: both score ln 2 < 0 + beam, in tree order; the third slot is padding
    names, scores = run_op("HSoftmaxSearch", [np.zeros((1, 2), np.float32), np.ones((2, 2), np.float32),
                                              np.zeros(2, np.float32)], 2,
                           tree=tree(node("r", 0, words=[7, 3])), beam=1.0, topN=3)
    assert names.tolist() == [[b"7", b"3", b""]]
    np.testing.assert_allclose(scores, [[math.log(2), math.log(2), 0]], rtol=1e-6)


def test_the_reference_catches_an_unsorted_search(broken):
    kernel = hsm_search.h_softmax_search

    def reversed_rows(xp, x, w, b, **args):
        names, scores = kernel(xp, x, w, b, **args)
        return names[:, ::-1].copy(), scores[:, ::-1].copy()
    broken("HSoftmaxSearch", reversed_rows)
    with pytest.raises(AssertionError):
        check([X, W, B], {"tree": TREE, "beam": 100.0, "topN": 12}, ref_search(X, W, B, ROOT, 100.0, 12), 1e-5)


@pytest.mark.parametrize("raw, message", [
    (b"\x0a\xff", "not a serialized TreeProto"),
    (b"", "the tree has no root_node"),
    (tree(NodeProto(offset=0, word_ids=[1])), "root_node has no name"),
    (tree(node("r", 0, [NodeProto(name="kid", word_ids=[1])])), r"root_node.children\[0\] \('kid'\) has no offset"),
    (tree(node("r", -3, words=[1])), "offset -3"),
    (tree(node("r", 0, [node("a", 2, words=[4])], [4])), "word 4 is in two places"),
    (tree(node("r", 0, words=[-1])), "word id -1"),
])
def test_bad_trees_are_refused(raw, message):
    with pytest.raises(ArgumentError, match=f"argument 'tree': .*{message}"):
        run_op("HSoftmaxSearch", [X, W, B], 2, tree=raw)


def test_a_tree_nested_past_protobufs_limit_is_refused_in_one_line():
    def chain(depth):
        t = TreeProto()
        n = t.root_node
        for i in range(depth):
            n.name, n.offset = f"n{i}", 0
            n.word_ids.append(i)
            n = n.children.add()
        n.name, n.offset = "last", 0
        return t.SerializeToString()
    w, b = np.ones((2, 3), np.float32), np.zeros(2, np.float32)
    names, _ = run_op("HSoftmaxSearch", [X[:1], w, b], 2, tree=chain(90), beam=1.0, topN=1)   # a tie: the child first
    assert names.tolist() == [[b"n1"]]
    with pytest.raises(ArgumentError, match="argument 'tree': the value is not a serialized TreeProto .or its nodes "
                                            "nest deeper than protobuf's limit of 100 levels.( \\[|$)"):
        run_op("HSoftmaxSearch", [X[:1], w, b], 2, tree=chain(150))


@pytest.mark.parametrize("inputs, args, error, message", [
    ([X, W[:9], B[:9]], {}, ShapeError, "node at offset 8 spans rows 8..9 of W, which has 9 rows"),
    ([X, W.reshape(10, 3, 1), B], {}, ShapeError, "W must be a matrix"),
    ([X, W, B], {"topN": -1}, ArgumentError, "topN must be >= 0"),
    ([X, W[:, :2], B], {}, ShapeError, "must be N x 3"),
    ([X.astype(np.int32), W, B], {}, DTypeError, "X must be a float tensor"),
])
def test_bad_search_inputs_are_refused(inputs, args, error, message):
    with pytest.raises(error, match=message):
        run_op("HSoftmaxSearch", inputs, 2, tree=TREE, **args)


def test_search_outputs_over_the_blob_limit_are_refused():
    with pytest.raises(Exception, match="max_blob_bytes"):
        run_op("HSoftmaxSearch", [X, W, B], 2, ws=Workspace(limits=Limits(max_blob_bytes=100_000)), tree=TREE,
               topN=10_000)


# --------------------------------------------------------------------------------------------- Huffman
def render(n: NodeProto) -> str:
    return f"{{{n.offset} " + "".join(f"w{w} " for w in n.word_ids) + "".join(map(render, n.children)) + "}"


def huffman(counts, num_classes=None) -> TreeProto:
    labels = np.array([c for c, k in enumerate(counts) for _ in range(k)], np.int64)
    out = run_op("HuffmanTreeHierarchy", [labels], 1, num_classes=num_classes or len(counts))
    assert out.shape == (1,) and out.dtype == object
    return TreeProto.FromString(out[0])


@pytest.mark.parametrize("counts, want", [
    # traced by hand: the queue pops 0 and 2 first (equal counts leave libstdc++'s heap in that order), then 1, 3;
    # offsets: 2 a node (the root's too), plus 1 for a word that is a right child
    ([1, 1, 1, 1], "{0 {2 w0 w2 }{5 w1 w3 }}"),
    ([1, 2, 3, 4, 5, 6], "{0 {2 w3 w4 }{5 w5 {7 w2 {9 w0 w1 }}}}"),   # Caffe2's hsm_test paths
    ([7], "{0 }"),
    ([0, 0], "{0 w0 w1 }"),
    ([3, 0, 3, 0, 3], "{0 {2 w4 {4 w1 w3 }}{8 w2 w0 }}"),
])
def test_huffman_trees_traced_by_hand(counts, want):
    assert render(huffman(counts).root_node) == want


def leaf_depths(n: NodeProto, depth=1, out=None) -> dict:
    out = {} if out is None else out
    for w in n.word_ids:
        out[w] = depth
    for c in n.children:
        leaf_depths(c, depth + 1, out)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_huffman_trees_have_the_optimal_code_length(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 30, rng.integers(2, 40)).tolist()
    depths = leaf_depths(huffman(counts).root_node)
    assert sorted(depths) == list(range(len(counts)))           # every class once, as a word
    heap, cost = list(counts), 0                                 # the textbook cost: the sum of all merges
    heapq.heapify(heap)
    while len(heap) > 1:
        merged = heapq.heappop(heap) + heapq.heappop(heap)
        cost += merged
        heapq.heappush(heap, merged)
    assert sum(counts[c] * d for c, d in depths.items()) == cost


def test_classes_without_labels_are_in_the_tree():
    t = huffman([2, 0, 1], num_classes=5)
    assert sorted(leaf_depths(t.root_node)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("labels, args, error, message", [
    (np.array([0, 1], np.int64), {}, ArgumentError, "num_classes >= 1"),
    (np.array([0, 3], np.int64), {"num_classes": 3}, ShapeError, r"labels\[1\] = 3 is not in 0..2"),
    (np.array([-1], np.int64), {"num_classes": 3}, ShapeError, r"labels\[0\] = -1"),
    (np.zeros((2, 2), np.int64), {"num_classes": 3}, ShapeError, "labels must be a vector"),
    (np.zeros(2, np.float32), {"num_classes": 3}, DTypeError, "labels must hold integers"),
])
def test_bad_huffman_inputs_are_refused(labels, args, error, message):
    with pytest.raises(error, match=message):
        run_op("HuffmanTreeHierarchy", [labels], 1, **args)


def test_a_huge_num_classes_is_refused_up_front():
    with pytest.raises(Exception, match="max_blob_bytes"):
        run_op("HuffmanTreeHierarchy", [np.zeros(1, np.int64)], 1, ws=Workspace(limits=Limits(max_blob_bytes=10**6)),
               num_classes=10**9)


def test_gradients_as_caffe2_registers_them():
    assert REGISTRY.get("HSoftmaxSearch").gradient == SHOULD_NOT_DO_GRADIENT
    assert REGISTRY.get("HuffmanTreeHierarchy").gradient is None    # Caffe2 names HuffmanTreeHierarchyOp
