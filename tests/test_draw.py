"""`stepnet draw`: pictures of nets and plans. The SVG Graphviz makes is parsed and checked for every op's label,
nested clusters (RecurrentNetwork's step net, If's branches) are checked by geometry, hostile names must come
through as text, the .dot fallback without Graphviz, repeated blocks, --max-ops, and the big nets' time."""
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stepnet import NetDef, load
from stepnet.cli.run import main
from stepnet.export.draw import Options, draw, to_dot
from stepnet.export.draw_blocks import parameters, repeated_blocks
from stepnet.graph.view import Graph
from stepnet.testing import make_op

ROOT = Path(__file__).resolve().parents[1]
RESNET = ROOT / "tests/data/models/resnet50_predict_net.pbtxt"
SVG = "{http://www.w3.org/2000/svg}"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (CI installs it)")


def net(name, *ops, inputs=(), outputs=()):
    return NetDef(name=name, op=list(ops), external_input=list(inputs), external_output=list(outputs))


def svg_of(path):
    """{'texts': every <text> of the picture, 'nodes': [(texts, (x, y))], 'clusters': [(texts, bbox)]}."""
    root = ET.parse(path).getroot()
    out = {"texts": [t.text or "" for t in root.iter(SVG + "text")], "nodes": [], "clusters": []}
    for g in root.iter(SVG + "g"):
        texts = [t.text or "" for t in g.findall(SVG + "text")]
        if g.get("class") == "node":
            xs = [float(t.get("x")) for t in g.findall(SVG + "text")]
            ys = [float(t.get("y")) for t in g.findall(SVG + "text")]
            out["nodes"].append((texts, (sum(xs) / max(len(xs), 1), sum(ys) / max(len(ys), 1))))
        elif g.get("class") == "cluster":
            shape = g.find(SVG + "path")
            shape = shape if shape is not None else g.find(SVG + "polygon")
            nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", shape.get("d") or shape.get("points"))]
            xs, ys = nums[0::2], nums[1::2]
            out["clusters"].append((texts, (min(xs), min(ys), max(xs), max(ys))))
    return out


def inside(svg, cluster_text, node_text) -> bool:
    """Whether a node showing node_text lies in a cluster whose label shows cluster_text."""
    boxes = [b for texts, b in svg["clusters"] if cluster_text in texts]
    points = [p for texts, p in svg["nodes"] if node_text in texts]
    assert boxes and points, (cluster_text, node_text)
    return any(x0 <= x <= x1 and y0 <= y <= y1 for x0, y0, x1, y1 in boxes for x, y in points)


def if_net():
    then = net("then", make_op("Relu", ["x"], ["r"]), make_op("Scale", ["r"], ["y"], scale=2.0))
    other = net("else", make_op("Negative", ["x"], ["y"]))
    return net("main", make_op("Exp", ["x0"], ["x"]), make_op("If", ["c", "x"], ["y"], then_net=then, else_net=other),
               inputs=["c", "x0"], outputs=["y"])


# ------------------------------------------------------------------------------------------- small nets
@needs_dot
def test_svg_names_every_op_and_marks_parameters(tmp_path):
    out = tmp_path / "xor.svg"
    assert main(["draw", str(ROOT / "models/xor/init_net.pbtxt"), str(ROOT / "models/xor/predict_net.pbtxt"),
                 "-o", str(out)]) == 0
    svg = svg_of(out)
    predict = load(ROOT / "models/xor/predict_net.pbtxt")
    assert [t for texts, _ in svg["nodes"] for t in texts if t in {"FC", "Relu"}] == [op.type for op in predict.op]
    assert {"W1", "b1", "W2", "b2", "X", "hidden", "y"} <= set(svg["texts"])
    dot = to_dot([load(ROOT / "models/xor/init_net.pbtxt"), predict])
    assert re.search(r"#FFF4C2\"><FONT[^>]*>W1<BR/>b1<", dot)      # parameters in the op's shaded row
    assert not re.search(r"label=<W1>", dot)                        # ... and not as blob nodes
    assert re.search(r'fillcolor="#D9F2D9", color="#888888", label=<X>', dot)  # the data input, shaded green


@needs_dot
def test_recurrent_step_net_and_if_branches_are_nested_clusters(tmp_path):
    sample = load(ROOT / "models/char_rnn_sample.pbtxt")
    out = tmp_path / "sample.svg"
    assert main(["draw", str(ROOT / "models/char_rnn_sample.pbtxt"), "--net", "char_rnn_sample", "-o", str(out)]) == 0
    svg = svg_of(out)
    main_net = next(n for n in sample.network if n.name == "char_rnn_sample")
    step = next(a.n for a in main_net.op[4].arg if a.name == "step_net")
    texts = svg["texts"]
    for op in [*main_net.op, *step.op]:
        assert op.type in texts
    assert inside(svg, "step_net", "LSTMUnit") and not inside(svg, "step_net", "WeightedSample")
    assert inside(svg, "RecurrentNetwork", "LSTMUnit")

    out = tmp_path / "if.svg"
    draw([if_net()], out)
    svg = svg_of(out)
    assert inside(svg, "then_net", "Scale") and inside(svg, "else_net", "Negative")
    assert not inside(svg, "then_net", "Negative") and not inside(svg, "else_net", "Exp")
    assert inside(svg, "If", "Relu")


def test_loop_bodies_are_clusters():
    body = net("body", make_op("Add", ["i", "one"], ["i"]))
    cond = net("cond", make_op("LT", ["i", "n"], ["go"]))
    inner = net("scope", make_op("Sqr", ["a"], ["b"]))
    do = make_op("Do", ["a", "ws"], ["b", "ws"], net=inner, inner_blobs=["a", "b"], outer_blobs_idx=[0, 1])
    dot = to_dot([net("loops", make_op("While", ["go"], ["i"], loop_net=body, cond_net=cond), do)])
    clusters = re.findall(r"subgraph (cluster_\w+) \{\n\s*label=<([^\n]*)>;", dot)
    labels = [label for _, label in clusters]
    assert any(label.startswith("<I>loop_net</I> body") for label in labels)
    assert any(label.startswith("<I>cond_net</I> cond") for label in labels)
    assert any(label.startswith("<I>net</I> scope") for label in labels)
    body_at = dot.index("<I>loop_net</I> body")
    assert body_at < dot.index("<B>Add</B>") < dot.index("<I>cond_net</I>") < dot.index("<B>LT</B>")


def test_backward_step_net_only_with_backward():
    plan = load(ROOT / "models/char_rnn.pbtxt")
    plain = to_dot([plan], Options(nets=["char_rnn"]))
    full = to_dot([plan], Options(nets=["char_rnn"], backward=True))
    assert "step_net</I>" in plain and "backward_step_net" not in plain
    assert "<I>backward_step_net</I>" in full and plain.count("LSTMUnitGradient") < full.count("LSTMUnitGradient")


def test_plan_draws_its_steps_and_nets_compactly():
    dot = to_dot([load(ROOT / "models/char_rnn.pbtxt")])
    assert "train ×8" in dot and "train_steps ×250: prepare_state, char_rnn" in dot
    assert "<B>net</B> char_rnn>" in dot and "<B>net char_rnn_init</B><BR/>init: 30 ops" in dot
    with pytest.raises(Exception, match="no network named 'nope'"):
        to_dot([load(ROOT / "models/char_rnn.pbtxt")], Options(nets=["nope"]))
    from stepnet.io.proto import PlanDef
    many = PlanDef(name="many", network=[net("n", make_op("Relu", ["x"], ["y"]))])
    for i in range(100):
        many.execution_step.add(name=f"s{i}", network=["n"])
    dot = to_dot([many])
    assert "s38: n" in dot and "s39: n" not in dot and "… 61 more lines" in dot   # the note stays small


# ------------------------------------------------------------------------------------------- hostile input
HOSTILE = ['a"b', 'back\\slash', "new\nline", "<script>x</script>", "&amp; &bogus;", "}]; evil -> x [", "\x07\x1b[31m",
           "]", ""]


@needs_dot
def test_hostile_names_are_text(tmp_path):
    ops = [make_op("Relu", [HOSTILE[k]], [HOSTILE[k + 1]]) for k in range(len(HOSTILE) - 1)]
    ops[0].name = HOSTILE[3]
    ops[1].type = HOSTILE[0]
    ops[2].type = HOSTILE[5]
    ops[3].type = ""                     # Graphviz refuses empty HTML text, and a label of only "]"
    out = tmp_path / "hostile.svg"
    draw([net(HOSTILE[4], *ops, inputs=[HOSTILE[0]])], out)
    svg = svg_of(out)                     # parses: nothing broke out of a label
    shown = {"new\\nline", "\\x07\\x1b[31m"}  # control characters are shown as escapes
    assert {'a"b', "back\\slash", "<script>x</script>", "&amp; &bogus;", "}]; evil -> x ["} <= set(svg["texts"])
    assert shown <= set(svg["texts"])
    assert {"]", '""'} <= set(svg["texts"])
    assert len(svg["nodes"]) == len(ops) + len(HOSTILE)   # one node per op and per blob: no injected nodes
    dot = out.with_suffix(".dot")
    draw([net("n", *ops)], dot)
    assert "<script>" not in dot.read_text() and "\x1b" not in dot.read_text()


# ------------------------------------------------------------------------------------------- without Graphviz
def test_without_dot_writes_dot_text_and_says_how(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))     # no dot on PATH
    out = tmp_path / "xor.svg"
    assert main(["draw", str(ROOT / "models/xor/predict_net.pbtxt"), "-o", str(out)]) == 0
    line = capsys.readouterr().out
    assert not out.exists() and out.with_suffix(".dot").exists()
    assert line.count("\n") == 1 and f"dot -Tsvg {out.with_suffix('.dot')} -o {out}" in line
    assert out.with_suffix(".dot").read_text().startswith("digraph stepnet {")
    # a file already where the dot text would go, which the request did not name, stays (hostile campaign
    # seed 20 case 1681 wrote there): one error line saying how to replace it
    mine = tmp_path / "mine.svg"
    mine.with_suffix(".dot").write_text("my own graph")
    assert main(["draw", str(ROOT / "models/xor/predict_net.pbtxt"), "-o", str(mine)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is there already: pass -o {mine.with_suffix('.dot')} to replace it" in err
    assert mine.with_suffix(".dot").read_text() == "my own graph" and not mine.exists()


def test_bad_requests_are_one_line(tmp_path, capsys):
    assert main(["draw", str(ROOT / "models/xor/predict_net.pbtxt"), "-o", str(tmp_path / "x.jpg")]) == 1
    assert "use one of .dot, .gv, .pdf, .png, .svg" in capsys.readouterr().err
    assert main(["draw", str(ROOT / "models/xor/predict_net.pbtxt"), "-o", str(tmp_path / "x.dot"),
                 "--max-ops", "0"]) == 1
    assert "max_ops must be at least 1" in capsys.readouterr().err
    (tmp_path / "d.svg").mkdir()
    assert main(["draw", str(ROOT / "models/xor/predict_net.pbtxt"), "-o", str(tmp_path / "d.svg")]) == 1
    assert "it is a directory" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- big nets
def test_resnet_residual_blocks_are_found():
    g = Graph.of(load(RESNET))
    blocks = repeated_blocks(g, parameters(g, set()))
    assert [(b.period, b.count) for b in blocks] == [(10, 2), (10, 3), (10, 5), (10, 2)]   # 3, 4, 6, 3 blocks
    assert all(g.ops[b.start].type == "Conv" and g.ops[b.start + b.period - 1].type == "Relu" for b in blocks)
    assert [g.ops[b.start].output[0] for b in blocks] == [f"gpu_0/res{s}_1_branch2a" for s in (2, 3, 4, 5)]


def densenet121() -> NetDef:
    """DenseNet-121's predict net (Caffe2 ops, no weights): blocks of 6, 12, 24, 16 layers, growth 32."""
    ops, k = [], 0

    def add(t, ins, out, params=(), **args):
        nonlocal k
        k += 1
        ops.append(make_op(t, [*ins, *(f"{out}_{p}" for p in params)], [out], **args))
        return out
    x = add("Conv", ["data"], "conv0", ["w"], kernel=7, stride=2, pad=3)
    x = add("MaxPool", [add("Relu", [add("SpatialBN", [x], "bn0", ["s", "b", "rm", "riv"], is_test=1)], "relu0")],
            "pool0", kernel=3, stride=2)
    for b, layers in enumerate((6, 12, 24, 16)):
        for i in range(layers):
            p = f"b{b}_l{i}"
            y = add("Relu", [add("SpatialBN", [x], f"{p}_bn1", ["s", "b", "rm", "riv"], is_test=1)], f"{p}_r1")
            y = add("Conv", [y], f"{p}_conv1", ["w"], kernel=1)
            y = add("Relu", [add("SpatialBN", [y], f"{p}_bn2", ["s", "b", "rm", "riv"], is_test=1)], f"{p}_r2")
            y = add("Conv", [y], f"{p}_conv2", ["w"], kernel=3, pad=1)
            x = add("Concat", [x, y], f"{p}_cat")
        if b < 3:
            y = add("Relu", [add("SpatialBN", [x], f"t{b}_bn", ["s", "b", "rm", "riv"], is_test=1)], f"t{b}_r")
            x = add("AveragePool", [add("Conv", [y], f"t{b}_conv", ["w"], kernel=1)], f"t{b}_pool", kernel=2, stride=2)
    x = add("Relu", [add("SpatialBN", [x], "bn5", ["s", "b", "rm", "riv"], is_test=1)], "relu5")
    x = add("FC", [add("AveragePool", [x], "pool5", global_pooling=1)], "fc", ["w", "b"])
    add("Softmax", [x], "prob")
    return net("densenet121", *ops, inputs=["data"], outputs=["prob"])


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (Graphviz's dot): what the drawing cost, whatever
    else the machine is doing."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@needs_dot
@pytest.mark.parametrize("which", ["resnet50", "densenet121"])
def test_big_nets_draw_in_seconds(tmp_path, which):
    model = load(RESNET) if which == "resnet50" else densenet121()
    assert len(model.op) == (175 if which == "resnet50" else 427)
    start = cpu_seconds()
    draw([model], tmp_path / "big.svg")
    took = cpu_seconds() - start
    assert took < 60, f"{which} took {took:.1f} s of CPU"   # about 1 s
    svg = svg_of(tmp_path / "big.svg")
    reps = [t for texts, _ in svg["clusters"] for t in texts if re.match(r"^×\d+$", t)]
    assert reps == (["×2", "×3", "×5", "×2"] if which == "resnet50" else ["×6", "×12", "×24", "×16"])


def test_max_ops_truncates_with_a_note(tmp_path, capsys):
    out = tmp_path / "r.dot"
    assert main(["draw", str(RESNET), "-o", str(out), "--max-ops", "10", "--collapse", "no"]) == 0
    text = out.read_text()
    assert text.count("shape=box, style=\"rounded,filled\"") == 10
    assert "165 more ops not drawn (max_ops 10; raise it with --max-ops N)" in text
    full = to_dot([load(RESNET)], Options(collapse="no"))
    assert full.count("shape=box, style=\"rounded,filled\"") == 175 and "more ops not drawn" not in full


def test_block_search_stays_fast_on_long_runs():
    chain = Graph([make_op("Relu", [f"x{i}"], [f"x{i + 1}"]) for i in range(3000)])
    fan = Graph([make_op("Relu", ["y0" if i else "x"], [f"y{i}"]) for i in range(2000)])  # op 0 feeds every op
    start = cpu_seconds()
    assert [(b.start, b.period, b.count) for b in repeated_blocks(chain, set())] == [(0, 1, 3000)]
    assert [(b.start, b.period, b.count) for b in repeated_blocks(fan, set())] == [(1, 1, 1999)]
    assert cpu_seconds() - start < 30   # about 2 s
