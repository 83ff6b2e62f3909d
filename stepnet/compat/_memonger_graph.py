"""The op dependency graph memonger orders a net by, and its two topological orders.

`DiGraph` is the small part of a networkx DiGraph Caffe2's memonger and its tests use (nodes with attributes,
edges in insertion order, successors, predecessors), so stepnet needs no graph library. Node i is op i; an edge
i -> j (i < j) means op j reads a blob op i writes.
"""
from __future__ import annotations

import heapq
from typing import Iterable, Sequence

from ..io.proto import OperatorDef


class DiGraph:
    """Directed graph: nodes in insertion order, each with an attribute dict; edges in insertion order."""

    def __init__(self):
        self.node: dict = {}
        self._succ: dict = {}
        self._pred: dict = {}

    nodes = property(lambda self: self.node)

    def add_node(self, n, **attrs) -> None:
        if n not in self.node:
            self.node[n], self._succ[n], self._pred[n] = {}, {}, {}
        self.node[n].update(attrs)

    def add_edge(self, u, v, **attrs) -> None:
        self.add_node(u)
        self.add_node(v)
        data = self._succ[u].setdefault(v, {})
        data.update(attrs)
        self._pred[v][u] = data

    def __iter__(self):
        return iter(self.node)

    def __len__(self) -> int:
        return len(self.node)

    def __contains__(self, n) -> bool:
        return n in self.node

    def __getitem__(self, u) -> dict:
        return self._succ[u]

    def successors(self, n) -> Iterable:
        return iter(self._succ[n])

    def predecessors(self, n) -> Iterable:
        return iter(self._pred[n])

    def edges(self) -> list[tuple]:
        return [(u, v) for u in self.node for v in self._succ[u]]

    def descendants(self, n) -> list:
        """Every node reachable from n (not n), in breadth-first order."""
        seen, order, frontier = {n}, [], [n]
        while frontier:
            nxt = []
            for u in frontier:
                for v in self._succ[u]:
                    if v not in seen:
                        seen.add(v)
                        order.append(v)
                        nxt.append(v)
            frontier = nxt
        return order

    def copy(self) -> "DiGraph":
        g = DiGraph()
        for n, attrs in self.node.items():
            g.add_node(n, **attrs)
        for u, v in self.edges():
            g.add_edge(u, v, **self._succ[u][v])
        return g


def compute_interference_graph(ops: Sequence[OperatorDef]) -> DiGraph:
    """Op i -> op j (i < j) when j reads a blob i writes; `deps` on the edge names those blobs."""
    g = DiGraph()
    for i, op in enumerate(ops):
        g.add_node(i, op=op)
    for i, parent in enumerate(ops):
        outs = set(parent.output)
        for j in range(i + 1, len(ops)):
            deps = outs.intersection(ops[j].input)
            if deps:
                g.add_edge(i, j, deps=deps)
    return g


def topological_sort_traversal(g: DiGraph) -> list:
    """Depth-first topological order: reversed post-order of a DFS started at each node in turn (the order
    networkx 1.x gave, which Caffe2's memonger was written against)."""
    done: set = set()
    post: list = []
    for start in g:
        if start in done:
            continue
        done.add(start)
        stack = [(start, iter(list(g.successors(start))))]
        while stack:
            node, children = stack[-1]
            child = next((c for c in children if c not in done), None)
            if child is None:
                stack.pop()
                post.append(node)
            else:
                done.add(child)
                stack.append((child, iter(list(g.successors(child)))))
    return post[::-1]


def _sources(g: DiGraph) -> list:
    return [n for n in g if not g._pred[n]]


def _targets(g: DiGraph) -> list:
    return [n for n in g if not g._succ[n]]


def _longest_path(g: DiGraph, source) -> list:
    """The longest path from source (ties: the first node reached at that length)."""
    order = [n for n in topological_sort_traversal(g)]
    dist, pred = {source: 0}, {source: None}
    for u in order:
        if u not in dist:
            continue
        for v in g.successors(u):
            if v not in dist or dist[u] + 1 > dist[v]:
                dist[v], pred[v] = dist[u] + 1, u
    end = max(dist, key=lambda n: dist[n])
    path = []
    while end is not None:
        path.append(end)
        end = pred[end]
    return path[::-1]


def topological_sort_traversal_longest_path(g: DiGraph) -> list:
    """A topological order that starts the sources with the longest paths to the sink first (shorter live
    ranges): the longest paths from each source to one common sink form a tree rooted at the sink; its leaves
    sorted by subtree height order the sources, and the ops are then taken in that order as they become ready."""
    if not len(g):
        return []
    gt = g
    targets = _targets(g)
    if len(targets) > 1:
        gt = g.copy()
        sink = max(g) + 1
        gt.add_node(sink)
        for t in targets:
            gt.add_edge(t, sink)
    sources = _sources(gt)
    paths = [_longest_path(gt, s) for s in sources]
    root = paths[0][-1]
    children: dict = {}
    for path in paths:
        for a, b in zip(path[1:], path[:-1]):      # toward the leaves
            kids = children.setdefault(a, [])
            if b not in kids:
                kids.append(b)
    height: dict = {}

    def tree_height(n) -> int:
        stack, order = [n], []
        while stack:
            u = stack.pop()
            order.append(u)
            stack.extend(children.get(u, ()))
        for u in reversed(order):
            height[u] = 1 + max((height[c] for c in children.get(u, ())), default=-1)
        return height[n]

    tree_height(root)

    sorted_sources, stack = [], [root]
    while stack:                       # the leaves, children in order of height (no recursion: deep nets)
        n = stack.pop()
        kids = children.get(n)
        if not kids:
            sorted_sources.append(n)
        else:
            stack.extend(reversed(sorted(kids, key=lambda c: height[c])))
    dependency = list(sorted_sources)
    seen = set(dependency)
    for s in sorted_sources:
        for d in g.descendants(s):
            if d not in seen:
                seen.add(d)
                dependency.append(d)
    key = {v: len(dependency) - i for i, v in enumerate(dependency)}
    indegree = {n: len(g._pred[n]) for n in g}
    ready = [(key[n], n) for n in g if indegree[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for v in g.successors(n):
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, (key[v], v))
    return order
