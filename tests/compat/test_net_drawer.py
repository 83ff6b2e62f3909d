"""compat.net_drawer and its dot writer: the graphs Caffe2's drawer makes (ops, blob versions, minimal edges,
plans, JSON), dot quoting, and rendering with and without Graphviz."""
import json
import shutil

import pytest

from stepnet.compat import core, net_drawer
from stepnet.compat.dot import Cluster, Dot, Edge, Node, quote
from stepnet.core.errors import StepnetError


def small_net():
    net = core.Net("small")
    net.FC(["x", "w", "b"], "y")
    net.Relu("y", "y")                  # in place: a new version of y
    net.Sigmoid("y", "z", name="act")
    return net


def edges(graph):
    return [(e.get_source(), e.get_destination()) for e in graph.get_edges()]


def test_full_graph_has_ops_and_blob_versions():
    graph = net_drawer.GetPydotGraph(small_net(), rankdir="TB")
    assert graph.get_name() == "small" and graph.attrs == {"rankdir": "TB"}
    names = [n.get_name() for n in graph.get_nodes()]
    assert names == ["FC (op#0)", "x0", "w0", "b0", "y0", "Relu (op#1)", "y1", "act/Sigmoid (op#2)", "z0"]
    assert edges(graph) == [("x0", "FC (op#0)"), ("w0", "FC (op#0)"), ("b0", "FC (op#0)"), ("FC (op#0)", "y0"),
                            ("y0", "Relu (op#1)"), ("Relu (op#1)", "y1"), ("y1", "act/Sigmoid (op#2)"),
                            ("act/Sigmoid (op#2)", "z0")]
    assert graph.get_node("y1")[0].attrs == {"label": "y", "shape": "octagon"}
    assert graph.get_node("FC (op#0)")[0].attrs == net_drawer.OP_STYLE
    text = graph.to_string()
    assert text.startswith('digraph "small" {\n  rankdir="TB";') and '"y0" -> "Relu (op#1)";' in text


def test_the_graph_of_a_netdef_or_op_list_and_output_labels():
    net = small_net()
    assert net_drawer.GetPydotGraph(net.Proto()).get_name() == "small"
    from_ops = net_drawer.GetPydotGraph(net.Proto().op, "ops", node_producer=net_drawer.GetOpNodeProducer(True))
    assert from_ops.get_name() == "ops" and from_ops.get_nodes()[0].get_name() == "FC (op#0)\ny"
    assert net_drawer.GetPydotGraph(list(net.Proto().op)).get_name() == "unnamed"


def test_minimal_graph_and_minimal_dependency():
    net = core.Net("chain")
    net.Relu("x", "a")            # op 0
    net.Relu("a", "b")            # op 1
    net.Add(["a", "b"], "c")      # op 2: depends on 0 directly and through 1
    full = net_drawer.GetPydotGraphMinimal(net)
    assert len(full.get_nodes()) == 3 and len(edges(full)) == 3
    minimal = net_drawer.GetPydotGraphMinimal(net, minimal_dependency=True)
    assert edges(minimal) == [("Relu (op#0)", "Relu (op#1)"), ("Relu (op#1)", "Add (op#2)")]


def test_plan_graph_and_operator_map():
    init, train = core.Net("init"), core.Net("train")
    init.ConstantFill([], "x", shape=[1])
    train.Relu("x", "x")
    outer = core.execution_step("outer", [core.execution_step("inner", [train], num_iter=2)], num_iter=3)
    plan = core.Plan(core.execution_step("setup", [init]))
    plan.AddStep(outer)
    graph = net_drawer.GetPlanGraph(plan.Proto())
    names = [n.get_name() for n in graph.get_nodes()]
    assert names == ["setup\n", "init", "outer\n", "inner\n", "train"]
    assert ("setup\n", "outer\n") in edges(graph) and graph.get_edges()[-1].attrs["style"] == "dashed"
    assert sorted(net_drawer.GetOperatorMapForPlan(plan.Proto())) == ["setup_init", "setup_train"]


def test_graph_in_json(tmp_path):
    net_drawer.GetGraphInJson(small_net(), tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    assert [n["label"] for n in data["nodes"]] == ["FC", "x", "w", "b", "y", "Relu", "y", "act/Sigmoid", "z"]
    assert [n["type"] for n in data["nodes"]][:2] == ["op", "blob"] and len(data["edges"]) == 8


def test_dot_quoting_and_structure():
    assert quote('a "b"\\c\nd') == '"a \\"b\\"\\\\c\\nd"' and quote('"kept"') == '"kept"'
    assert quote('"a" -> "b"') == '"\\"a\\" -> \\"b\\""'      # not a quoted ID: escaped, cannot add an edge
    assert quote('"x\\"') == '"\\"x\\\\\\""' and quote('"a\\"b"') == '"a\\"b"'
    graph = Dot("g", rankdir="LR")
    graph.add_node(Node('say "hi"', shape="box"))
    sub = Cluster("step", label="step net")
    sub.add_node(Node("inner"))
    graph.add_subgraph(sub)
    graph.add_edge(Edge(Node('say "hi"'), "inner", style="dashed"))
    assert graph.to_string() == (
        'digraph "g" {\n  rankdir="LR";\n  subgraph "cluster_step" {\n    label="step net";\n    "inner";\n  }\n'
        '  "say \\"hi\\"" [shape="box"];\n  "say \\"hi\\"" -> "inner" [style="dashed"];\n}\n')
    assert str(Dot("u", graph_type="graph")).startswith('graph "u" {')


def test_rendering_without_graphviz_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    graph = net_drawer.GetPydotGraph(small_net())
    with pytest.raises(StepnetError, match="apt-get install graphviz"):
        graph.create_png()
    graph.write_dot(tmp_path / "g.dot")          # the text needs no Graphviz
    assert (tmp_path / "g.dot").read_text() == graph.to_string()
    assert net_drawer.GetGraphPngSafe(net_drawer.GetPydotGraph, small_net()) == net_drawer._DummyPngImage
    with pytest.raises(AttributeError):
        getattr(graph, "render_png")  # noqa: B009


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_rendering_with_graphviz(tmp_path):
    svg = net_drawer.GetPydotGraph(small_net()).create_svg()
    assert b"<svg" in svg and b"act/Sigmoid (op#2)" in svg
    net_drawer.GetPydotGraphMinimal(small_net()).write_png(tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG")
