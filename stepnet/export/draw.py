"""Pictures of nets and plans: Graphviz dot text built from the graph view (`to_dot`), laid out by Graphviz's
`dot` program run as a subprocess (`draw`).

Ops are boxes labelled with their type (and name), their parameters listed in a shaded row; every other blob
version is a small ellipse between the op that writes it and the ops that read it (inputs from outside the net
shaded green, declared outputs outlined bold). A RecurrentNetwork's step net (its backward step net with
`backward=True`), If's then/else nets and While/Do bodies are nested clusters around the op; a plan draws each of
its nets as a cluster (nets that only fill blobs as one box) and its execution steps as a note. Long runs of a
repeated op-type sequence are drawn once in a cluster labelled ×k; an op's inputs and outputs beyond MAX_OP_EDGES
are one "… k more" node, and drawing stops after `max_ops` ops or `max_edges` edges (what dot's layout time
grows with) with a note saying how many were left out. Every name from a file reaches the dot text only escaped
(HTML-like labels), and node ids are generated, so no name can change the graph. Text is drawn at its full size
(a PNG at 96 dpi): a big plan makes a big PNG, with a note saying how to get a smaller one (`max_size` scales
it down, `nets` draws fewer nets); `graphviz.py` runs `dot`."""
from __future__ import annotations

import html
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..io import proto
from .draw_blocks import Block, filled_blobs, is_init_net, parameters, repeated_blocks, role
from ..core.errors import ArgumentError
from ..graph.view import Graph, nested_nets, walk
from ..io.proto import NetDef, PlanDef
from ..io.validate import NET_IN_ARG
from .graphviz import render

COLLAPSE_AT = 100      # collapse="auto": nets with more ops than this have their repeated blocks collapsed
MAX_OPS = 600          # default --max-ops
MAX_EDGES = 2000       # default --max-edges
MAX_OP_EDGES = 16      # inputs (and outputs) of one op drawn before the rest become one "… k more" node
MAX_KINDS = 12         # op types listed in a plan's init-net box
MAX_STEP_LINES = 40   # lines of a plan's execution-step note
MAX_LABEL = 48         # characters of a name shown before it is cut with "…"
LARGE_PX = 4000        # a PNG wider or taller than this gets a note on how to make it smaller
DPI = 96               # Graphviz's raster resolution, stated so that max_size means pixels
FORMATS = {".svg": "svg", ".png": "png", ".dot": "dot", ".gv": "dot", ".pdf": "pdf"}
FILL = {"forward": "#E3EDFD", "gradient": "#FBE3E1", "optimizer": "#FEEFD6", "data": "#DDF2E1", "loss": "#EDE1F5",
        "fill": "#EEEEEE"}
PARAM_BG, PARAM_FG = "#FFF4C2", "#6B5200"


def text(value, limit: int = MAX_LABEL) -> str:
    """A name as HTML-label text: control characters shown as escapes, cut at limit characters, and & < > " ' ]
    escaped, so that no name can end the label or add markup."""
    s = str(value)
    s = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in s)
    if len(s) > limit:
        s = s[:limit - 1] + "…"
    if not s:
        return "&quot;&quot;"   # an empty name, shown as ""; Graphviz refuses empty HTML text
    return html.escape(s, quote=True).replace("]", "&#93;")   # a label of only ']' trips Graphviz's lexer


@dataclass
class Options:
    """backward: draw backward step nets (and the nets of gradient ops); max_ops, max_edges: no op is drawn once
    this many ops or edges are (then a note); collapse: 'auto' (nets over COLLAPSE_AT ops), 'yes' or 'no'; nets:
    for a plan, only these nets; max_size: the picture's longest side at most this many pixels (at 96 dpi; text
    shrinks with it), None for full-size text."""
    backward: bool = False
    max_ops: int = MAX_OPS
    max_edges: int = MAX_EDGES
    collapse: str = "auto"
    nets: Sequence[str] = ()
    max_size: int | None = None


@dataclass
class _Dot:
    options: Options
    lines: list = field(default_factory=list)
    ids: int = 0
    drawn: int = 0
    edges: int = 0
    skipped: int = 0

    def new_id(self, kind: str) -> str:
        self.ids += 1
        return f"{kind}{self.ids}"

    def full(self) -> bool:
        return self.drawn >= self.options.max_ops or self.edges >= self.options.max_edges


def to_dot(models: Sequence, options: Options | None = None, title: str | None = None) -> str:
    """The dot text of one picture of the given models: NetDefs (an init net among several nets marks its
    outputs as parameters and is not drawn itself) and PlanDefs."""
    options = options or Options()
    for name in ("max_ops", "max_edges", "max_size"):
        if getattr(options, name) is not None and getattr(options, name) < 1:
            raise ArgumentError(f"{name} must be at least 1, got {getattr(options, name)}")
    if options.collapse not in ("auto", "yes", "no"):
        raise ArgumentError(f"collapse must be 'auto', 'yes' or 'no', got {options.collapse!r}")
    d = _Dot(options)
    nets = [m for m in models if isinstance(m, NetDef)]
    plans = [m for m in models if isinstance(m, PlanDef)]
    if len(nets) + len(plans) != len(models):
        raise ArgumentError("only NetDefs and PlanDefs can be drawn")
    inits = [n for n in nets if is_init_net(n)] if len(nets) > 1 else []
    filled = filled_blobs(inits)
    drawn = [n for n in nets if not any(n is i for i in inits)] or nets   # init nets alone: draw them
    for plan in plans:
        filled |= filled_blobs(n for n in plan.network if is_init_net(n))
    d.lines += ["digraph stepnet {", '  graph [rankdir=TB, fontname="Helvetica", nodesep=0.25, ranksep=0.3, '
                f'compound=true, dpi={DPI}{_size(options.max_size)}];', '  node [fontname="Helvetica", fontsize=11];',
                '  edge [color="#555555", arrowsize=0.6];']
    if title:
        d.lines.append(f"  labelloc=t; label=<<B>{text(title, 200)}</B>>;")
    for net in drawn:
        _net(d, net, filled, level=0, cluster=len(drawn) + len(plans) > 1)
    for plan in plans:
        _plan(d, plan, filled)
    if d.skipped:
        limit = (f"max_ops {options.max_ops}; raise it with --max-ops N" if d.drawn >= options.max_ops else
                 f"max_edges {options.max_edges}; raise it with --max-edges N")
        d.lines.append(f'  {d.new_id("note")} [shape=note, style=filled, fillcolor="#FFFFFF", label=<{d.skipped} '
                       f'more ops not drawn ({limit})>];')
    d.lines.append("}")
    return "\n".join(d.lines) + "\n"


def _size(max_size: int | None) -> str:
    return f', size="{max_size / DPI:.4f},{max_size / DPI:.4f}"' if max_size else ""


def _plan(d: _Dot, plan: PlanDef, filled: set) -> None:
    cid = d.new_id("cluster_plan")
    d.lines += [f"  subgraph {cid} {{", f'    label=<<B>plan</B> {text(plan.name)}>; style="rounded"; '
                'color="#888888";']
    lines = [line for step in plan.execution_step for line in _step_lines(step, 0)]
    if len(lines) > MAX_STEP_LINES:
        lines = lines[:MAX_STEP_LINES - 1] + [f"… {len(lines) - MAX_STEP_LINES + 1} more lines"]
    steps = "".join(f"{line}<BR ALIGN=\"LEFT\"/>" for line in lines)
    d.lines.append(f'    {d.new_id("steps")} [shape=note, style=filled, fillcolor="#FFFFFF", fontsize=10, '
                   f'label=<<B>execution steps</B><BR ALIGN="LEFT"/>{steps}>];')
    wanted = set(d.options.nets)
    unknown = wanted - {n.name for n in plan.network}
    if unknown:
        raise ArgumentError(f"plan {plan.name!r} has no network named {', '.join(map(repr, sorted(unknown)))}; it "
                            f"has {', '.join(repr(n.name) for n in plan.network)}")
    for net in plan.network:
        if wanted and net.name not in wanted:
            continue
        if is_init_net(net) and not wanted:
            counts = {}
            for op in net.op:
                counts[op.type] = counts.get(op.type, 0) + 1
            kinds = ", ".join(f"{text(t)}×{c}" for t, c in sorted(counts.items())[:MAX_KINDS])
            kinds += f", … {len(counts) - MAX_KINDS} more types" if len(counts) > MAX_KINDS else ""
            d.lines.append(f'    {d.new_id("init")} [shape=box, style="rounded,filled", fillcolor="{FILL["fill"]}", '
                           f'fontsize=10, label=<<B>net {text(net.name)}</B><BR/>init: {len(net.op)} ops '
                           f'({kinds})>];')
            continue
        _net(d, net, filled, level=1, cluster=True)
    d.lines.append("  }")


def _step_lines(step, depth: int) -> list[str]:
    """One line per execution step: name, iterations or stop blob, its nets or (indented) substeps."""
    loop = (f" until {text(step.should_stop_blob)}" if step.should_stop_blob
            else f" ×{step.num_iter}" if step.HasField("num_iter") and step.num_iter != 1 else "")
    nets = (": " + ", ".join(text(n) for n in step.network)) if step.network else ""
    lines = ["&#160;" * (4 * depth) + f"{text(step.name or '<step>')}{loop}{nets}"]
    for sub in step.substep[:20]:
        lines += _step_lines(sub, depth + 1)
    if len(step.substep) > 20:
        lines.append("&#160;" * (4 * depth + 4) + f"… {len(step.substep) - 20} more substeps")
    return lines


def _net(d: _Dot, net: NetDef, filled: set, level: int, cluster: bool, label: str | None = None,
         indent: str = "  ") -> tuple[str, str | None]:
    """Draw one net (in a cluster when `cluster`): its ops, blob versions and nested nets. Returns the
    cluster's id ('' without one) and the id of its first op drawn (None: none)."""
    list(walk(net, level=level))  # a net nested too deep is an error here, before any recursion
    graph = Graph.of(net)
    params = parameters(graph, filled)
    inner, cid = indent, ""
    if cluster:
        cid = d.new_id("cluster_net")
        head = label if label is not None else f"<B>net</B> {text(net.name)}"
        d.lines += [f"{indent}subgraph {cid} {{", f'{indent}  label=<{head}>; style="rounded"; color="#7B8CA8";']
        inner = indent + "  "
    collapse = d.options.collapse == "yes" or (d.options.collapse == "auto" and len(graph) > COLLAPSE_AT)
    blocks = repeated_blocks(graph, params) if collapse else []
    rep = _representatives(blocks)
    outputs = set(net.external_output)
    blob_ids: dict[tuple[str, int], str] = {}
    tail: list[str] = []
    edges: list[str] = []
    op_ids: dict[int, str] = {}

    def blob(name: str, v: int) -> str:
        w = graph.writer.get((name, v))
        if w is not None and w in rep:  # written by a hidden repeat: its counterpart in the block drawn
            j = list(graph.ops[w].output).index(name)
            r = rep[w]
            name, v = graph.ops[r].output[j], graph.out_versions[r][j]
        key = (name, v)
        if key not in blob_ids:
            bid = blob_ids[key] = d.new_id("b")
            fill = "#D9F2D9" if v == 0 else "#FFFFFF"
            bold = ", penwidth=2" if name in outputs and v == graph.final.get(name, 0) else ""
            where = tail if v == 0 else d.lines   # values from outside belong to the net, not to a block in it
            where.append(f'{inner}{bid} [shape=ellipse, fontsize=9, height=0.2, margin="0.04,0.01", style=filled, '
                           f'fillcolor="{fill}", color="#888888"{bold}, label=<{text(name)}>];')
        return blob_ids[key]

    blocks_at = {b.start: b for b in blocks}
    i, sub_indent, open_block = 0, inner, None
    for i, op in enumerate(graph.ops):
        if open_block is not None and i == open_block.start + open_block.period:
            d.lines.append(f"{inner}}}")
            sub_indent, open_block = inner, None
        if i in blocks_at and not d.full():
            open_block = blocks_at[i]
            b = open_block
            d.lines += [f'{inner}subgraph {d.new_id("cluster_rep")} {{',
                        f'{inner}  label=<<B>×{b.count}</B> a block of {b.period} ops, drawn once '
                        f'(ops {i}–{b.end - 1})>; style="dashed,rounded"; color="#AA5500";']
            sub_indent = inner + "  "
        if i in rep:
            continue
        if d.full():
            d.skipped += 1 + sum(1 for _ in _nested_ops(op, level))
            continue
        oid = op_ids[i] = _op(d, op, i, graph, params, filled, level, sub_indent)
        ins = [(name, v) for name, v in zip(op.input, graph.in_versions[i]) if not (name in params and v == 0)]
        outs = list(zip(op.output, graph.out_versions[i]))
        edges += [f"{inner}{blob(name, v)} -> {oid};" for name, v in ins[:MAX_OP_EDGES]]
        edges += [f"{inner}{oid} -> {blob(name, v)};" for name, v in outs[:MAX_OP_EDGES]]
        for rest, kind, arrow in ((ins, "inputs", "{} -> " + oid), (outs, "outputs", oid + " -> {}")):
            if len(rest) > MAX_OP_EDGES:
                more = d.new_id("more")
                tail.append(f'{inner}{more} [shape=plaintext, fontsize=9, label=<… {len(rest) - MAX_OP_EDGES} '
                            f'more {kind}>];')
                edges.append(f"{inner}{arrow.format(more)} [style=dotted];")
        d.edges += min(len(ins), MAX_OP_EDGES + 1) + min(len(outs), MAX_OP_EDGES + 1)
    if open_block is not None:
        d.lines.append(f"{inner}}}")
    d.lines += tail + edges   # after the body: a node belongs to the cluster where it first appears
    if cluster:
        d.lines.append(f"{indent}}}")
    return cid, next(iter(op_ids.values()), None)


def _representatives(blocks: list[Block]) -> dict[int, int]:
    """{op index of a hidden repeat: index of its counterpart in the first repeat}."""
    return {i: b.start + (i - b.start) % b.period for b in blocks for i in range(b.start + b.period, b.end)}


def _nested_ops(op, level: int):
    for _, sub in nested_nets(op, level):
        yield from walk(sub, level=level + NET_IN_ARG)


def _op(d: _Dot, op, index: int, graph: Graph, params: set, filled: set, level: int, indent: str) -> str:
    """The op's box (and its nested nets, as clusters around it); returns the box's node id."""
    d.drawn += 1
    oid = d.new_id("op")
    rows = [f"<TR><TD><B>{text(op.type)}</B></TD></TR>"]
    if op.name:
        rows.append(f'<TR><TD><FONT POINT-SIZE="9">{text(op.name)}</FONT></TD></TR>')
    ps = [n for j, n in enumerate(op.input) if n in params and graph.in_versions[index][j] == 0]
    if ps:
        ps = list(dict.fromkeys(ps))
        shown = [text(p) for p in ps[:MAX_OP_EDGES]] + ([f"… {len(ps) - MAX_OP_EDGES} more"] if len(ps) > MAX_OP_EDGES
                                                         else [])
        rows.append(f'<TR><TD BGCOLOR="{PARAM_BG}"><FONT POINT-SIZE="9" COLOR="{PARAM_FG}">'
                    + "<BR/>".join(shown) + "</FONT></TD></TR>")
    label = f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">{"".join(rows)}</TABLE>>'
    box = (f'{oid} [shape=box, style="rounded,filled", fillcolor="{FILL[role(op)]}", color="#4A5A78", '
           f'margin="0.08,0.03", label={label}];')
    subs = [(arg, sub) for arg, sub in nested_nets(op, level) if _drawn_arg(d, op, arg)]
    if not subs:
        d.lines.append(indent + box)
        return oid
    d.lines += [f'{indent}subgraph {d.new_id("cluster_op")} {{',
                f'{indent}  label=<<B>{text(op.type)}</B> #{index}>; style="rounded,filled"; fillcolor="#F8F8F8"; '
                'color="#999999";', indent + "  " + box]
    links = []
    for arg, sub in subs:   # each nested net hangs below the op's box, joined by a dashed line
        cid, first = _net(d, sub, filled, level + NET_IN_ARG, cluster=True, indent=indent + "  ",
                          label=f"<I>{text(arg)}</I> {text(sub.name)}")
        if first is not None:
            links.append(f'{indent}  {oid} -> {first} [lhead={cid}, style=dashed, color="#999999", arrowhead=none];')
    d.lines += links + [f"{indent}}}"]
    return oid


def _drawn_arg(d: _Dot, op, arg: str) -> bool:
    if arg == "backward_step_net" or role(op) == "gradient":
        return d.options.backward
    return True


# --------------------------------------------------------------------------------------------- rendering
@dataclass(frozen=True)
class Drawn:
    """What draw() wrote: the path, its format, and a note for the user (empty when nothing to add)."""
    path: Path
    format: str
    note: str = ""


def draw(models: Sequence, out, options: Options | None = None, title: str | None = None) -> Drawn:
    """Draw models into `out` (.svg, .png, .pdf or .dot, by its suffix), atomically. Without Graphviz's dot, an
    .svg/.png/.pdf request writes the dot text next to it (OUT with suffix .dot) and says how to render it; a
    file already there, which the request did not name, is not replaced (an error says so)."""
    out = Path(out)
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise ArgumentError(f"{out}: the picture's format comes from its suffix; use one of "
                            f"{', '.join(sorted(FORMATS))}")
    proto.check_replaceable(out)      # (a directory or device there is refused whether or not dot is installed)
    dot_text = to_dot(models, options, title)
    if fmt == "dot":
        proto.atomic_write(out, dot_text.encode())
        return Drawn(out, fmt, f"render it with: dot -Tsvg {_shell(out)} -o {_shell(out.with_suffix('.svg'))}")
    if shutil.which("dot") is None:
        dot_path = out.with_suffix(".dot")
        if os.path.lexists(dot_path):
            raise ArgumentError(f"Graphviz's dot is not installed (Debian/Ubuntu: apt-get install graphviz), so {out} "
                                f"cannot be made, and {dot_path}, where its dot text would go instead, is there "
                                f"already: pass -o {_shell(dot_path)} to replace it, or move it")
        proto.atomic_write(dot_path, dot_text.encode())
        return Drawn(dot_path, "dot", f"Graphviz's dot is not installed (Debian/Ubuntu: apt-get install graphviz), "
                     f"so {out} was not made; render it with: dot -T{fmt} {_shell(dot_path)} -o {_shell(out)}")
    picture = render(dot_text, fmt)
    proto.atomic_write(out, picture)
    return Drawn(out, fmt, _large_note(picture, fmt, options or Options()))


def _large_note(picture: bytes, fmt: str, options: Options) -> str:
    """For a PNG over LARGE_PX drawn at full size: its size and how to make it smaller."""
    if fmt != "png" or options.max_size or len(picture) < 24 or picture[12:16] != b"IHDR":
        return ""
    width, height = int.from_bytes(picture[16:20], "big"), int.from_bytes(picture[20:24], "big")
    if max(width, height) <= LARGE_PX:
        return ""
    return (f"{width}×{height} px, its text at full size: view it at 100 % (or write .svg, which zooms), draw one "
            "net with --net NAME, or scale it down with --max-size PX")


def _shell(path: Path) -> str:
    import shlex

    return shlex.quote(os.fspath(path))
