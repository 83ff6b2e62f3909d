"""Hierarchical softmax: HSoftmax and its gradient op HSoftmaxGradient, over a hierarchy given as a serialized
HierarchyProto (caffe2/proto/hsm.proto, stepnet.hsm_pb2). HSoftmaxSearch and HuffmanTreeHierarchy are in
hsm_search.py.

Semantics from caffe2/operators/h_softmax_op.{h,cc}, which Caffe2 has on the CPU only: the ops compute on the
host and put their results on the op's device. The `hierarchy` argument lists, per word, the path from the
root to it: PathNodeProtos, each a node's first row in W and b (index), its number of children (length) and
the child on the path (target). For row i of X (N x K weights W, bias b of N) with label w, every node on w's
path gives an FC of X[i] over W[index:index+length] and b[index:index+length], the softmax p of that, and adds
-log(max(p[target], 1e-20)) to Y[i]. intermediate_output holds, row after row and node after node, each FC's
output then its softmax (2 * length values a node); HSoftmaxGradient reads the softmaxes there (not X and W)
and also writes the gradient of every such value into its fourth output, which the maker names after the
gradient of intermediate_output (so, as in Caffe2, asking for HSoftmax's gradient needs one for both outputs).

The hierarchy comes from the model file, so it is checked, once per distinct value, before any use: it must
parse (stepnet.io.validate.parse_checked), every path must name a word id >= 0 no other path names, start at
the root node and visit each node once, each node has index >= 0, length >= 1 and 0 <= target < length (and
ends within `size` when that is set), and the paths must form one tree (a node's child leads to one node or
word, a node has one parent and one length). At run time every label must have a path and every node on the
paths used must end within W's rows.
"""
from __future__ import annotations

import functools
import math
import types
from typing import Mapping, NamedTuple

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, FileFormatError, ShapeError
from ..hsm_pb2 import HierarchyProto
from ..io.validate import parse_checked
from .base import check_float, check_int_dtype, like, on_device, out_spec, single_gradient, value_dependent
from .registry import Arg, op

LOG_THRESHOLD = 1e-20   # Caffe2's kLOG_THRESHOLD: the smallest probability a log is taken of
HIERARCHY = Arg("str", "", "serialized HierarchyProto: each word's path from the root of the hierarchy")

Path = tuple[tuple[int, int, int], ...]   # (index, length, target) of each node from the root


def raw_bytes(value) -> bytes:
    """A string argument's bytes (argument values that are valid UTF-8 arrive as str)."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def parse_arg(msg, value, arg: str, hint: str = ""):
    """msg parsed from a string argument with stepnet's checked parsing; an ArgumentError naming the argument
    (placed at the op by the executor), with `hint` after the parser's message, if it is not one."""
    try:
        return parse_checked(msg, raw_bytes(value), f"argument {arg!r}")
    except FileFormatError as e:
        raise ArgumentError(f"argument {arg!r}: {e.message}{hint}") from None


def _bad(message: str):
    return ArgumentError(f"argument 'hierarchy': {message}")


def _check_node(w: int, j: int, node, size: int | None) -> None:
    index, length, target = node
    if index < 0 or length < 1 or not 0 <= target < length:
        raise _bad(f"node {j} of word {w}'s path has index {index}, length {length}, target {target}; each node "
                   "needs index >= 0, length >= 1 and 0 <= target < length")
    if size is not None and index + length > size:
        raise _bad(f"node {j} of word {w}'s path spans rows {index}..{index + length - 1}, past the hierarchy's "
                   f"size {size}")


def _what(step) -> str:
    return f"word {step[1]}" if step[0] == "word" else f"the node at index {step[1]}"


@functools.lru_cache(maxsize=16)
def hierarchy_paths(raw: bytes) -> Mapping[int, Path]:
    """word id -> its path, from a serialized HierarchyProto, after every check the module docstring lists."""
    h = parse_arg(HierarchyProto(), raw, "hierarchy")
    size = h.size if h.HasField("size") else None
    paths: dict[int, Path] = {}
    lengths: dict[int, int] = {}                      # node index -> its length
    leads: dict[tuple[int, int], tuple] = {}          # (index, target) -> ("node", index) or ("word", id)
    parent: dict[int, tuple[int, int]] = {}           # node index -> the (index, target) leading to it
    root = None
    for k, p in enumerate(h.paths):
        if not p.HasField("word_id"):
            raise _bad(f"path {k} has no word_id")
        w = p.word_id
        if w < 0:
            raise _bad(f"path {k} is for word id {w}; word ids must be >= 0")
        if w in paths:
            raise _bad(f"word {w} has two paths")
        nodes = tuple((n.index, n.length, n.target) for n in p.path_nodes)
        if not nodes:
            raise _bad(f"the path of word {w} has no nodes")
        if root is None:
            root = nodes[0][0]
        elif nodes[0][0] != root:
            raise _bad(f"the path of word {w} starts at index {nodes[0][0]}, not at the root's index {root}")
        seen: set[int] = set()
        for j, node in enumerate(nodes):
            _check_node(w, j, node, size)
            index, length, target = node
            if index in seen:
                raise _bad(f"the path of word {w} comes back to the node at index {index} (a cycle)")
            seen.add(index)
            if lengths.setdefault(index, length) != length:
                raise _bad(f"paths give the node at index {index} two lengths ({lengths[index]} and {length})")
            step = ("node", nodes[j + 1][0]) if j + 1 < len(nodes) else ("word", w)
            if leads.setdefault((index, target), step) != step:
                raise _bad(f"child {target} of the node at index {index} leads to {_what(leads[index, target])} "
                           f"and, on the path of word {w}, to {_what(step)}")
            if step[0] == "node" and parent.setdefault(step[1], (index, target)) != (index, target):
                raise _bad(f"the node at index {step[1]} is reached from two places (a cycle, or not a tree): "
                           f"child {parent[step[1]][1]} of index {parent[step[1]][0]} and child {target} of "
                           f"index {index}")
        paths[w] = nodes
    return types.MappingProxyType(paths)


# --------------------------------------------------------------------------------------------- geometry
class Layout(NamedTuple):
    """Where each row's values go in intermediate_output: rows grouped by label, with the label's path."""
    groups: list            # [(path, row indices)]
    starts: np.ndarray      # each row's first position in intermediate_output
    total: int              # intermediate_output's size


def geometry(op_type: str, x, w, b, labels=None) -> tuple[int, int, int]:
    """(M, K, N) after the checks of X (M x K, or one row of K), W (N x K), b (N) and labels (M integers)."""
    check_float(op_type, X=x, W=w, b=b)
    if len(x.shape) < 1:
        raise ShapeError(f"{op_type}: X must be at least 1-D (M x K, or one row of K), got a 0-D tensor")
    m, k = (x.shape[0], math.prod(x.shape[1:])) if len(x.shape) > 1 else (1, x.shape[0])
    if len(w.shape) < 2 or math.prod(w.shape[1:]) != k:
        raise ShapeError(f"{op_type}: W {tuple(w.shape)} must be N x {k} (X's rows have {k} features)")
    n = w.shape[0]
    if tuple(b.shape) != (n,):
        raise ShapeError(f"{op_type}: b {tuple(b.shape)} must be 1-D with one value per row of W ({n},)")
    if labels is not None:
        check_int_dtype(labels.dtype, f"{op_type}: labels")
        if tuple(labels.shape) != (m,):
            raise ShapeError(f"{op_type}: labels {tuple(labels.shape)} must hold one word id per row of X ({m},)")
    return m, k, n


def layout(op_type: str, hierarchy, label_values, n: int) -> Layout:
    """The groups, row starts and size of intermediate_output for these labels (host ints); a ShapeError for a
    label without a path, or a node on a used path past W's n rows."""
    paths = hierarchy_paths(raw_bytes(hierarchy))
    rows: dict[int, list[int]] = {}
    for i, label in enumerate(label_values):
        if label not in paths:
            raise ShapeError(f"{op_type}: labels[{i}] = {label} is not a word of the hierarchy (it has paths for "
                             f"{len(paths)} word(s))")
        rows.setdefault(label, []).append(i)
    sizes = {}
    for label in rows:
        for index, length, _ in paths[label]:
            if index + length > n:
                raise ShapeError(f"{op_type}: the hierarchy's node at index {index} spans rows {index}.."
                                 f"{index + length - 1} of W, which has {n} rows (word {label}'s path)")
        sizes[label] = 2 * sum(length for _, length, _ in paths[label])
    block = np.array([sizes[label] for label in label_values], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(block)[:-1])).astype(np.int64) if block.size else block
    groups = [(paths[label], np.array(r, dtype=np.int64)) for label, r in rows.items()]
    return Layout(groups, starts, int(block.sum()))


def host(x) -> np.ndarray:
    return np.asarray(backend.to_host(x))


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax as Caffe2 computes it (the row's max subtracted, exp, divided by the sum)."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------------------------- HSoftmax
def _hsoftmax_shape(specs, *, hierarchy):
    x, w, b, labels = specs
    m, _, n = geometry("HSoftmax", x, w, b, labels)
    hierarchy_paths(raw_bytes(hierarchy))
    total = None if labels.value is None else \
        layout("HSoftmax", hierarchy, [int(v) for v in np.asarray(labels.value).tolist()], n).total
    return [out_spec((m,), x.dtype), value_dependent((total,), x.dtype)]


@op("HSoftmax", inputs=4, outputs=2, inplace=(), args={"hierarchy": HIERARCHY}, shape=_hsoftmax_shape,
    grows="values", gradient=single_gradient("HSoftmaxGradient", ["I0", "I1", "I2", "I3", "O1", "GO0"],
                                             ["GI0", "GI1", "GI2", "GO1"]))
def h_softmax(xp, x, w, b, labels, *, hierarchy):
    """Y (M): each row's -log probability of its label along the label's path in the hierarchy, and the
    intermediate_output of every node on the paths (FC output, then softmax)."""
    m, k, n = geometry("HSoftmax", x, w, b, labels)
    lay = layout("HSoftmax", hierarchy, [int(v) for v in host(labels).reshape(-1).tolist()], n)
    X, W, B = host(x).reshape(m, k), host(w).reshape(n, k), host(b)
    y = np.zeros(m, dtype=X.dtype)
    inter = np.empty(lay.total, dtype=X.dtype)
    for path, rows in lay.groups:
        xr, at = X[rows], lay.starts[rows][:, None]
        for index, length, target in path:
            fc = xr @ W[index:index + length].T + B[index:index + length]
            p = softmax(fc)
            cols = at + np.arange(length)
            inter[cols], inter[cols + length] = fc, p
            y[rows] -= np.log(np.maximum(p[:, target], LOG_THRESHOLD))
            at = at + 2 * length
    return on_device(xp, y, y.dtype), on_device(xp, inter, inter.dtype)


# --------------------------------------------------------------------------------------------- gradient
def _grad_checks(x, w, b, labels, inter, dy, lay_total=None) -> None:
    check_float("HSoftmaxGradient", X=x, W=w, b=b, intermediate_output=inter, dY=dy)
    if len(inter.shape) != 1 or (lay_total is not None and inter.shape[0] != lay_total):
        want = "1-D" if lay_total is None else f"({lay_total},), as HSoftmax wrote it for these labels"
        raise ShapeError(f"HSoftmaxGradient: intermediate_output {tuple(inter.shape)} must be {want}")
    if tuple(dy.shape) != tuple(labels.shape):
        raise ShapeError(f"HSoftmaxGradient: dY {tuple(dy.shape)} must hold one value per label "
                         f"{tuple(labels.shape)}")


def _grad_shape(specs, *, hierarchy):
    x, w, b, labels, inter, dy = specs
    _, _, n = geometry("HSoftmaxGradient", x, w, b, labels)
    total = None if labels.value is None else \
        layout("HSoftmaxGradient", hierarchy, [int(v) for v in np.asarray(labels.value).tolist()], n).total
    _grad_checks(x, w, b, labels, inter, dy, total)
    return [like(x), like(w), like(b), like(inter)]


@op("HSoftmaxGradient", inputs=6, outputs=4, inplace=(), args={"hierarchy": HIERARCHY}, shape=_grad_shape)
def h_softmax_gradient(xp, x, w, b, labels, inter, dy, *, hierarchy):
    """X, W, b, labels, intermediate_output, dY -> dX, dW, db and the gradient of intermediate_output (the
    softmax's input gradient at each FC output, the loss's gradient at each softmax output)."""
    m, k, n = geometry("HSoftmaxGradient", x, w, b, labels)
    lay = layout("HSoftmaxGradient", hierarchy, [int(v) for v in host(labels).reshape(-1).tolist()], n)
    _grad_checks(x, w, b, labels, inter, dy, lay.total)
    X, W, P, dY = host(x).reshape(m, k), host(w).reshape(n, k), host(inter), host(dy)
    dX, dW = np.zeros_like(X), np.zeros_like(W)
    db, dP = np.zeros(n, dtype=X.dtype), np.zeros_like(P)
    for path, rows in lay.groups:
        xr, at = X[rows], lay.starts[rows][:, None]
        for index, length, target in path:
            cols = at + np.arange(length)
            p = P[cols + length]
            d_entropy = np.zeros_like(p)
            d_entropy[:, target] = -dY[rows] / np.maximum(p[:, target], LOG_THRESHOLD)
            d_fc = (d_entropy - (p * d_entropy).sum(axis=1, keepdims=True)) * p
            dP[cols], dP[cols + length] = d_fc, d_entropy
            dW[index:index + length] += d_fc.T @ xr
            db[index:index + length] += d_fc.sum(axis=0)
            dX[rows] += d_fc @ W[index:index + length]
            at = at + 2 * length
    return tuple(on_device(xp, a, a.dtype) for a in (dX.reshape(x.shape), dW.reshape(w.shape), db, dP))
