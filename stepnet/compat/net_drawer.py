"""Caffe2's net_drawer: nets and plans as Graphviz graphs (dot.Dot, pydot's interface: to_string(),
create_png(), write_svg(), ...). Ops are green boxes; in GetPydotGraph every version of a blob is an octagon
between the op that writes it and the ops that read it. `main()` is Caffe2's command (`python -m
stepnet.compat.net_drawer --input net.pb`): each net of a file as `.dot` and `.pdf`."""
from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict

from ..core.errors import StepnetError
from ..export.graphviz import render
from ..io.proto import NetDef, PlanDef, load
from .dot import Dot, Edge, Node

logger = logging.getLogger(__name__)
OP_STYLE = {"shape": "box", "color": "#0F9D58", "style": "filled", "fontcolor": "#FFFFFF"}
BLOB_STYLE = {"shape": "octagon"}


def _rectify_operator_and_name(operators_or_net, name):
    """(ops, name) of a NetDef, a core.Net or a list of ops."""
    if hasattr(operators_or_net, "Proto"):
        operators_or_net = operators_or_net.Proto()
    if isinstance(operators_or_net, NetDef):
        return operators_or_net.op, name if name is not None else operators_or_net.name
    return operators_or_net, name if name is not None else "unnamed"


def GetOpNodeProducer(append_output, **kwargs):
    """A function (op, op_id) -> Node labelled '<name>/<type> (op#<id>)' (and the outputs with append_output)."""
    def op_node(op, op_id):
        label = f"{op.name}/{op.type} (op#{op_id})" if op.name else f"{op.type} (op#{op_id})"
        if append_output:
            label += "".join("\n" + o for o in op.output)
        return Node(label, **kwargs)
    return op_node


def GetPydotGraph(operators_or_net, name=None, rankdir="LR", node_producer=None) -> Dot:
    """Ops and blob versions: input blob -> op -> output blob (a rewritten blob is a new node)."""
    node_producer = node_producer or GetOpNodeProducer(False, **OP_STYLE)
    operators, name = _rectify_operator_and_name(operators_or_net, name)
    graph = Dot(name, rankdir=rankdir)
    blob_nodes, versions = {}, defaultdict(int)

    def blob_node(blob):
        return Node(f"{blob}{versions[blob]}", label=blob, **BLOB_STYLE)
    for op_id, op in enumerate(operators):
        op_node = node_producer(op, op_id)
        graph.add_node(op_node)
        for blob in op.input:
            node = blob_nodes.setdefault(blob, blob_node(blob))
            graph.add_node(node)
            graph.add_edge(Edge(node, op_node))
        for blob in op.output:
            if blob in blob_nodes:
                versions[blob] += 1
            node = blob_nodes[blob] = blob_node(blob)
            graph.add_node(node)
            graph.add_edge(Edge(op_node, node))
    return graph


def GetPydotGraphMinimal(operators_or_net, name=None, rankdir="LR", minimal_dependency=False,
                         node_producer=None) -> Dot:
    """Ops only, an edge from each op to the ops that read what it wrote; with minimal_dependency, only the
    edges not implied by others."""
    node_producer = node_producer or GetOpNodeProducer(False, **OP_STYLE)
    operators, name = _rectify_operator_and_name(operators_or_net, name)
    graph = Dot(name, rankdir=rankdir)
    writer, ancestors = {}, defaultdict(set)
    for op_id, op in enumerate(operators):
        node = node_producer(op, op_id)
        graph.add_node(node)
        key = node.get_name()
        parents = list(dict.fromkeys(writer[b] for b in op.input if b in writer))
        for p in parents:
            ancestors[key] |= {p} | ancestors[p]
        for p in parents:
            if not minimal_dependency or all(p not in ancestors[other] for other in parents):
                graph.add_edge(Edge(p, key))
        for blob in op.output:
            writer[blob] = key
    return graph


def GetOperatorMapForPlan(plan_def) -> dict:
    """{'<plan>_<net>': ops} for every net of a PlanDef."""
    return {f"{plan_def.name}_{net.name}" if net.name else f"{plan_def.name}_network_{i}": net.op
            for i, net in enumerate(plan_def.network)}


def _draw_steps(steps, graph, skip_step_edges=False) -> list:
    nodes = []
    for i, step in enumerate(steps):
        label = [step.name + "\n"] + ([f"Reporter: {step.report_net}"] if step.report_net else []) + (
            [f"Stopper: {step.should_stop_blob}"] if step.should_stop_blob else []) + (
            ["Concurrent"] if step.concurrent_substeps else []) + (["Once"] if step.only_once else [])
        nodes.append(Node("\n".join(label), **OP_STYLE))
        graph.add_node(nodes[-1])
        if i > 0 and not skip_step_edges:
            graph.add_edge(Edge(nodes[-2], nodes[-1]))
        if step.network:
            subs = []
            for j, net in enumerate(step.network):
                subs.append(Node(net))
                graph.add_node(subs[-1])
                if j > 0:
                    graph.add_edge(Edge(subs[-2], subs[-1]))
        elif step.substep:
            subs = _draw_steps(step.substep[:3] if step.concurrent_substeps else step.substep, graph,
                               skip_step_edges=step.concurrent_substeps)
        else:
            raise ValueError(f"invalid step {step.name!r}: no nets and no substeps")
        for sub in (subs if step.concurrent_substeps else subs[:1]):
            graph.add_edge(Edge(nodes[-1], sub, arrowhead="dot", style="dashed"))
        if step.concurrent_substeps and len(step.substep) > 3:
            more = Node(f"{len(step.substep) - 3} more steps", **OP_STYLE)
            graph.add_node(more)
            graph.add_edge(Edge(nodes[-1], more, arrowhead="dot", style="dashed"))
    return nodes


def GetPlanGraph(plan_def, name=None, rankdir="TB") -> Dot:
    """A plan's execution steps, their nets and substeps."""
    graph = Dot(name or plan_def.name, rankdir=rankdir)
    _draw_steps(plan_def.execution_step, graph)
    return graph


def GetGraphInJson(operators_or_net, output_filepath) -> None:
    """The GetPydotGraph graph as JSON {'nodes': [...], 'edges': [...]} in a file."""
    operators, _ = _rectify_operator_and_name(operators_or_net, None)
    graph = GetPydotGraph(operators, node_producer=GetOpNodeProducer(False))
    ids = {n.get_name(): i for i, n in enumerate(graph.get_nodes())}
    nodes = [{"id": i, "label": n.attrs.get("label", n.get_name().rsplit(" (op#", 1)[0]),
              "type": "blob" if "label" in n.attrs else "op"} for i, n in enumerate(graph.get_nodes())]
    edges = [{"source": ids[e.get_source()], "target": ids[e.get_destination()]} for e in graph.get_edges()]
    with open(output_filepath, "w") as f:
        json.dump({"nodes": nodes, "edges": edges}, f)


_DummyPngImage = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x01\x00\x00\x00\x007n"
                  b"\xf9$\x00\x00\x00\nIDATx\x9cc`\x00\x00\x00\x02\x00\x01H\xaf\xa4q\x00\x00\x00\x00IEND\xaeB`\x82")


def GetGraphPngSafe(func, *args, **kwargs) -> bytes:
    """func(...).create_png(), or a 1x1 PNG when drawing fails (Graphviz missing, ...)."""
    try:
        return func(*args, **kwargs).create_png()
    except Exception:  # noqa: BLE001 - Caffe2's contract: never raise
        return _DummyPngImage


def main() -> None:
    """Caffe2's net_drawer command (`python -m caffe2.python.net_drawer --input net.pb`, under stepnet's alias):
    draw every net of a NetDef or PlanDef file (text or binary) as
    `<output_prefix><graph name>.dot`, and as `.pdf` beside it when Graphviz's dot is installed (otherwise the
    .dot alone, with Caffe2's note). Flags: --input (required), --output_prefix, --minimal,
    --minimal_dependency, --append_output, --rankdir (default LR)."""
    parser = argparse.ArgumentParser(description="Caffe2 net drawer.")
    parser.add_argument("--input", type=str, required=True, help="The input protobuf file.")
    parser.add_argument("--output_prefix", type=str, default="", help="The prefix to be added to the output filename.")
    parser.add_argument("--minimal", action="store_true", help="If set, produce a minimal visualization.")
    parser.add_argument("--minimal_dependency", action="store_true", help="If set, only draw minimal dependency.")
    parser.add_argument("--append_output", action="store_true",
                        help="If set, append the output blobs to the operator names.")
    parser.add_argument("--rankdir", type=str, default="LR", help="The rank direction of the pydot graph.")
    args = parser.parse_args()
    try:
        message = load(args.input)   # a NetDef or PlanDef, text or binary
    except StepnetError as e:
        parser.exit(1, f"net_drawer: {e}\n")
    graphs = GetOperatorMapForPlan(message) if isinstance(message, PlanDef) else {message.name: message.op}
    producer = GetOpNodeProducer(args.append_output, **OP_STYLE)
    for key, operators in graphs.items():
        if args.minimal:
            graph = GetPydotGraphMinimal(operators, name=key, rankdir=args.rankdir, node_producer=producer,
                                         minimal_dependency=args.minimal_dependency)
        else:
            graph = GetPydotGraph(operators, name=key, rankdir=args.rankdir, node_producer=producer)
        filename = args.output_prefix + graph.get_name() + ".dot"
        graph.write(filename, format="raw")
        try:
            picture = render(graph.to_string(), "pdf")
        except StepnetError:
            print("Error when writing out the pdf file. Pydot requires graphviz to convert dot files to pdf, and "
                  "you may not have installed graphviz. On ubuntu this can usually be installed with \"sudo apt-get "
                  "install graphviz\". We have generated the .dot file but will not be able to generate pdf file "
                  "for now.")
            continue
        with open(filename[:-3] + "pdf", "wb") as f:
            f.write(picture)


if __name__ == "__main__":
    main()
