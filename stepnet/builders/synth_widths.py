"""How wide synth.synth_init makes the layers a net leaves free: channel classes and the constraints on them.

A layer (Conv, ConvTranspose, FC) whose weight nobody gives has a free output width. Its output channels flow
through the ops after it: an op whose output has the same rank as an input and the same size on that input's
channel axis carries the input's channels (activations, normalisation, pooling, Sum and the elementwise ops,
RoIAlign, Softmax, ...), and every input carried into one output must have the same width, so the channels
form classes of blobs that must be equally wide (a Sum joins its operands' classes). What the net says about a
class becomes a constraint on it:

- a Conv with group g reads a class whose width is a multiple of g, and, when its own weight is free, its
  output stays in that class (a grouped convolution keeps its width: depthwise, out = in);
- a given weight (--param) or a data input fixes the width it reads or writes;
- detection ops relate widths: GenerateProposals reads scores of A channels and deltas of 4A (5A for rotated
  anchors), A = the anchors' rows; BoxWithNMSLimit reads C class scores and 4C box coordinates;
  BBoxTransform's deltas are a multiple of 4;
- a preferred width: the class scores of BoxWithNMSLimit (`classes`), the anchors (DEFAULT_ANCHORS), and,
  unless those say otherwise, the last layer (`classes`).

A class's width is then: the fixed width if any; else the preferred width, or `width`, rounded to the nearest
multiple (at least one) of what its groups and ratios need: the least common multiple of its groups, so a
depthwise conv whose group is at least about `width` gets exactly its group's channels (in = out = group, as
in Mask R-CNN2Go's group-96 convs at width 64), while AlexNet's group-2 convs keep `width`. Widths relate by
integer ratios (4A and A), so the classes are a weighted union-find: every member is a rational multiple of
its root. The walk that finds the classes is repeated with
the widths found until nothing changes (a class found wider may let later ops be shaped).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

DEFAULT_ANCHORS = 15          # Detectron's 5 sizes x 3 aspect ratios
NO_CHANNEL_FLOW = {"GenerateProposals", "GenerateProposalsCPP", "BoxWithNMSLimit", "CollectRpnProposals",
                   "DistributeFpnProposals", "CollectAndDistributeFpnRpnProposals", "Shape", "Size", "IsEmpty"}


class Classes:
    """Channel classes of tags under constraints: ("same", a, b), ("ratio", a, k, b) (a = k·b), ("fixed", a, v),
    ("group", a, g) (a grouped conv reads a) and ("multiple", a, g): a multiple of g; ("prefer", a, v[, rank])."""

    def __init__(self, constraints):
        self.parent: dict = {}
        self.ratio: dict = {}                # value(node) = ratio[node] · value(parent[node])
        self.fixed: dict = {}
        self.prefer: dict = {}
        self.multiple: list = []
        self.conflicts: list = []
        order = ("same", "ratio", "fixed", "group", "multiple", "prefer")
        for c in sorted(constraints, key=lambda c: (order.index(c[0]), repr(c))):
            getattr(self, "_" + c[0])(*c[1:])

    def find(self, node):
        """(root, r) with value(node) = r · value(root)."""
        r = Fraction(1)
        while node in self.parent:
            r *= self.ratio[node]
            node = self.parent[node]
        return node, r

    def _ratio(self, a, k, b):
        (ra, alpha), (rb, beta) = self.find(a), self.find(b)
        if ra == rb:
            if alpha != k * beta:
                self.conflicts.append(("ratio", a, k, b))
            return
        self.parent[rb], self.ratio[rb] = ra, alpha / (k * beta)

    def _same(self, a, b):
        self._ratio(a, 1, b)

    def _fixed(self, a, v):
        root, r = self.find(a)
        value = Fraction(v) / r
        if self.fixed.setdefault(root, value) != value:
            self.conflicts.append(("fixed", a, v))

    def _multiple(self, a, g):
        self.multiple.append((a, int(g)))

    def _group(self, a, g):
        self._multiple(a, g)

    def _prefer(self, a, v, rank=0):
        """A preferred width; of several, the lowest rank's (then the least) wins."""
        root, r = self.find(a)
        self.prefer[root] = min(self.prefer.get(root, (rank, Fraction(v) / r)), (rank, Fraction(v) / r))

    def widths(self, nodes, default: int) -> dict:
        """{node: width} for the given nodes."""
        members: dict = {}
        for node in nodes:
            root, r = self.find(node)
            members.setdefault(root, []).append((node, r))
        steps: dict = {}
        for a, g in self.multiple:
            root, r = self.find(a)
            steps.setdefault(root, []).append((r, g))
        out = {}
        for root, nodes_r in members.items():
            value = self._root_value(root, [r for _, r in nodes_r], steps.get(root, []), default)
            for node, r in nodes_r:
                out[node] = int(r * value)
        return out

    def _root_value(self, root, ratios, steps, default) -> Fraction:
        if root in self.fixed:
            return self.fixed[root]
        unit = 1             # the least root value making every member a whole multiple of its group
        for r, g in [(r, 1) for r in ratios] + steps:
            unit = math.lcm(unit, r.denominator * g // math.gcd(r.numerator, g))
        want = self.prefer.get(root, (0, Fraction(default)))[1]
        return Fraction(unit * max(1, round(want / unit)))


def channel_axis(op_type: str, args: dict, rank: int) -> int:
    """The axis of a layer's output that holds its width."""
    if op_type.startswith("FC"):
        return rank - 1
    return rank - 1 if args.get("order", "NCHW") == "NHWC" else 1


def carried(ins, tags, out_shape):
    """The tags of the inputs whose channels an output carries: same rank, same size on their channel axis."""
    found = []
    for name, s in ins:
        tag = tags.get(name)
        if tag is None or s.shape is None or len(s.shape) != len(out_shape):
            continue
        axis, node = tag
        if s.shape[axis] == out_shape[axis]:
            found.append((axis, node))
    return found


def detection_constraints(opdef, args, ins, tags, classes: int):
    """Constraints the detection ops put on the channel classes of their inputs (ins: [(name, spec)], the specs
    of what the caller gave, UNKNOWN for the rest)."""
    def tag(j):
        t = tags.get(opdef.input[j]) if j < len(opdef.input) else None
        return None if t is None else t[1]

    out = []
    if opdef.type in ("GenerateProposals", "GenerateProposalsCPP"):
        anchors = ins[3][1] if len(ins) > 3 else None
        box = 5 if anchors is not None and anchors.shape is not None and anchors.shape[-1:] == (5,) else 4
        if tag(0) is not None:
            if anchors is not None and anchors.shape is not None and len(anchors.shape) == 2:
                out.append(("fixed", tag(0), anchors.shape[0]))
            out.append(("prefer", tag(0), DEFAULT_ANCHORS))
            if tag(1) is not None:
                out.append(("ratio", tag(1), box, tag(0)))
    elif opdef.type == "BoxWithNMSLimit":
        box = 5 if args.get("rotated") else 4
        if tag(0) is not None:
            out.append(("prefer", tag(0), classes))
        if tag(1) is not None:
            if args.get("cls_agnostic_bbox_reg"):
                out.append(("fixed", tag(1), box))
            elif args.get("input_boxes_include_bg_cls", True) and tag(0) is not None:
                out.append(("ratio", tag(1), box, tag(0)))
    elif opdef.type == "BBoxTransform" and tag(1) is not None:
        out.append(("multiple", tag(1), 5 if args.get("rotated") else 4))
    return out


def anchors(count: int, stride: float, box: int = 4) -> np.ndarray:
    """count Detectron-like anchors centred on the first cell of a map of the given stride: sizes stride·2,
    stride·4, ..., stride·32 (then again), and, when count is a multiple of 3, aspect ratios (height/width) 0.5,
    1 and 2 at each size.
    Rotated anchors (box 5) are the same boxes as [ctr_x, ctr_y, w, h, 0]."""
    ratios = (0.5, 1.0, 2.0) if count % 3 == 0 else (1.0,)
    centre = (stride - 1) / 2
    rows = []
    for k in range(count):
        size, r = stride * 2 ** ((k // len(ratios)) % 5 + 1), ratios[k % len(ratios)]
        w, h = size / math.sqrt(r), size * math.sqrt(r)
        rows.append([centre, centre, w, h, 0.0] if box == 5 else
                    [centre - (w - 1) / 2, centre - (h - 1) / 2, centre + (w - 1) / 2, centre + (h - 1) / 2])
    return np.array(rows, np.float32).reshape(count, box)
