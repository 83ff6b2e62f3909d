"""The parameter rules of synth.synth_init: how each op's parameters are shaped and filled from the op, its
data input and the width the walk gives it (see synth_init's docstring for the rules themselves)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import synth_widths as sw
from ..core.errors import ArgumentError, ShapeError, StepnetError
from ..io.feeds import MAX_DIMS
from ..io.files import quoted
from ..ops.base import canonical_axis


@dataclass(frozen=True)
class Fill:
    """How to fill one parameter: Gaussian N(0, std²) when std is set, the given values when set, else the
    constant value."""
    shape: tuple
    std: float | None = None
    value: float = 0.0
    values: tuple | None = None


class Site:
    """One op whose parameters are being shaped: its data input, arguments and the output width to use; the
    rule records whether it used that width (free), kept its input's (follows_input), and the arguments a
    planning walk runs the op with (overrides)."""

    def __init__(self, walk, opdef, args, todo, out, label, head=False):
        self.walk, self.opdef, self.args, self.todo = walk, opdef, args, todo
        self.out, self.label, self.head = out, label, head
        self.free = self.follows_input = False
        self.overrides: dict = {}

    def constrain(self, *constraint) -> None:
        """A constraint on the channel class of input 0 (ignored when it has none)."""
        tag = self.walk.tags.get(self.opdef.input[0])
        if tag is not None:
            self.walk.constraints.add((constraint[0], tag[1], *constraint[1:]))

    def known(self, j) -> tuple | None:
        """Shape of input j if known (a user-given parameter counts), else None."""
        name = self.opdef.input[j] if j < len(self.opdef.input) else None
        if name in self.walk.params:
            return self.walk.params[name]
        s = self.walk.specs.get(name)
        return None if s is None or s.shape is None or None in s.shape else s.shape

    def x(self, j=0) -> tuple:
        """The shape of data input j, or an error saying why it is not known."""
        shape = self.known(j)
        if shape is not None:
            return shape
        name = self.opdef.input[j]
        if name not in self.walk.specs:
            raise ShapeError(f"input {name!r} is made by no earlier op; if it is a data input, "
                             f"give its shape: inputs={{{name!r}: DIMS}}", at=self.label)
        why = self.walk.why.get(name, "the shape of the op that makes it is unknown")
        raise self.cannot(next(iter(self.todo)), f"the shape of its input {name!r} is unknown: {why}")

    def axis(self, shape, value: int, name: str = "axis") -> int:
        """Argument `name` (its value) as an axis of shape, negative counting from the end; an ArgumentError at
        the op when it is out of range."""
        try:
            return canonical_axis(value, len(shape), name)
        except StepnetError as e:
            raise e.located(self.label) from None

    def channels(self, shape) -> int:
        if len(shape) < 2:
            raise ShapeError(f"input {self.opdef.input[0]!r} {shape} has no channel axis", at=self.label)
        return shape[1] if self.args.get("order", "NCHW") == "NCHW" else shape[-1]

    def cannot(self, j, why) -> ShapeError:
        name = self.opdef.input[j]
        return ShapeError(f"cannot shape parameter {name!r} of {self.label}: {why}; give its dims: "
                          f"params={{{name!r}: DIMS}} (CLI: --param {name}=D1,D2,...)")


def he(shape, fan_in) -> Fill:
    return Fill(tuple(shape), std=math.sqrt(2.0 / max(fan_in, 1)))


def _kernel(site, nd) -> tuple:
    a = site.args
    if a.get("kernels"):
        ks = tuple(a["kernels"])
    elif a.get("kernel_h") is not None and a.get("kernel_w") is not None:
        ks = (a["kernel_h"], a["kernel_w"])
    elif a.get("kernel") is not None:
        ks = (a["kernel"],) * nd
    else:
        raise site.cannot(1, "the op gives no kernel size (kernel, kernel_h/kernel_w or kernels)")
    if len(ks) != nd:
        raise site.cannot(1, f"the kernel {list(ks)} does not match the input's {nd} spatial dims")
    return ks


def _round_up(n, group) -> int:
    return group * max(1, -(-n // group))


def _conv(site):
    """Conv W (M, C/group, kernel...) (NCHW): M is the planned width, the classes (rounded up to the group) for
    the last layer, or C for a grouped conv (a grouped conv keeps its width)."""
    x = site.x()
    group, nhwc = site.args.get("group", 1), site.args.get("order", "NCHW") == "NHWC"
    c = site.channels(x)
    w = site.known(1)
    if site.opdef.input[1] in site.walk.params:    # a given weight fixes the width it reads
        site.constrain("fixed", (w[-1] if nhwc else w[1]) * group)
    if group > 1:
        site.constrain("group", group)
    site.free = w is None and (group == 1 or site.head)
    site.follows_input = w is None and not site.free
    if c % group:
        if not site.walk.planning:
            raise site.cannot(1, f"group {group} does not divide the {c} input channels")
        site.overrides = {"group": 1}     # planning: keep going as if the widths fitted
        group = 1
    if w is None:
        ks = _kernel(site, len(x) - 2)
        m = _round_up(site.out, group) if site.free else c
        w = (m, *ks, c // group) if nhwc else (m, c // group, *ks)
    yield 1, he(w, math.prod(w[1:]))
    yield 2, Fill((w[0],))


def _conv_transpose(site):
    x = site.x()
    group, nhwc = site.args.get("group", 1), site.args.get("order", "NCHW") == "NHWC"
    c = site.channels(x)
    w = site.known(1)
    if w is None:
        site.free = True
        ks = _kernel(site, len(x) - 2)
        m = _round_up(site.out, group) // group
        w = (c, *ks, m) if nhwc else (c, m, *ks)
    taps = math.prod(w[1:-1]) if nhwc else math.prod(w[2:])
    yield 1, he(w, c // group * taps)
    yield 2, Fill(((w[-1] if nhwc else w[1]) * group,))


def _fc(transposed):
    def rule(site):
        x, aw, w = site.x(), site.args.get("axis_w", 1), site.known(1)
        k = math.prod(x[site.axis(x, site.args.get("axis", 1)):])
        if w is not None:
            aw = site.axis(w, aw, "axis_w")
        elif not 1 <= aw < MAX_DIMS:   # the weight made here has aw + 1 dims
            raise ArgumentError(f"axis_w={aw} is out of range for the weight synth-init makes (1..{MAX_DIMS - 1})",
                                at=site.label)
        else:
            site.free = True
            w = (k,) + (1,) * (aw - 1) + (site.out,) if transposed else (site.out,) + (1,) * (aw - 1) + (k,)
        n = math.prod(w[aw:]) if transposed else math.prod(w[:aw])
        yield 1, he(w, k)
        yield 2, Fill((n,))
    return rule


def _per_channel(*values):
    def rule(site):
        c = site.channels(site.x())
        for j, v in enumerate(values, start=1):
            yield j, Fill((c,), value=v)
    return rule


def _layer_norm(site):
    x = site.x()
    dims = tuple(x[site.axis(x, site.args.get("axis", 1)):])
    yield 1, Fill(dims, value=1.0)
    yield 2, Fill(dims, value=0.0)


def _binary(value):
    def rule(site):
        j = site.todo[0]
        other = site.known(1 - j)
        if other is None or len(site.todo) > 1:
            raise site.cannot(j, "both operands are unknown, so broadcasting cannot tell its shape")
        if not site.args.get("broadcast"):
            yield j, Fill(other, value=value)
            return
        if j == 0:
            raise site.cannot(j, "with broadcast=1 operand A is the larger one and cannot be inferred from B")
        axis, axis_str, order = site.args.get("axis", -1), site.args.get("axis_str", ""), site.args.get("order", "NCHW")
        if axis == -1 and axis_str:
            if len(axis_str) != 1 or axis_str not in order:
                raise ArgumentError(f"axis_str {quoted(axis_str)} is not one letter of order {quoted(order)}",
                                    at=site.label)
            axis = order.index(axis_str)
        yield j, Fill((other[site.axis(other, axis)],) if other else (), value=value)
    return rule


def _elementwise_linear(site):
    x = site.x()
    d = math.prod(x[site.axis(x, site.args.get("axis", 1)):])
    yield 1, Fill((d,), value=1.0)
    yield 2, Fill((d,), value=0.0)


def _anchors(site):
    """GenerateProposals' anchors: (A, 4) real anchors for scores of A channels at the op's stride, (A, 5)
    rotated ones when the deltas have 5A channels."""
    scores, deltas = site.x(0), site.x(1)
    if len(scores) != 4:
        raise site.cannot(3, f"the scores {scores} are not 4-D (images, A, H, W), so they give no anchor count A")
    a = scores[1]
    box = 5 if len(deltas) == 4 and deltas[1] == 5 * a else 4
    values = sw.anchors(a, 1.0 / site.args.get("spatial_scale", 1.0 / 16), box)
    yield 3, Fill((a, box), values=tuple(values.ravel().tolist()))


RULES = {**{t: _conv for t in ("Conv", "Conv1D", "Conv2D", "Conv3D")}, "ConvTranspose": _conv_transpose,
         "GenerateProposals": _anchors, "GenerateProposalsCPP": _anchors,
         "FC": _fc(False), "FCTransposed": _fc(True), "SpatialBN": _per_channel(1.0, 0.0, 0.0, 1.0, 0.0, 0.0),
         "InstanceNorm": _per_channel(1.0, 0.0), "GroupNorm": _per_channel(1.0, 0.0),
         "PRelu": _per_channel(0.25), "LayerNorm": _layer_norm, "ElementwiseLinear": _elementwise_linear,
         "Add": _binary(0.0), "Sub": _binary(0.0), "Mul": _binary(1.0), "Div": _binary(1.0)}
