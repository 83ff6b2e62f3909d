"""The graph layer: SSA versions against their definitions on random nets, nested nets in every argument form,
and rewrites that never change the NetDef they are given."""
import numpy as np
import pytest

from stepnet.graph import view as graph
from stepnet.core.errors import NetError
from stepnet.graph.view import Graph
from stepnet.io.proto import NetDef, OperatorDef, make_argument, to_text
from stepnet.testing import nested_nets


def random_ops(rng, n_ops: int, names="abcdef") -> list[OperatorDef]:
    """Ops reading 0-3 and writing 1-2 names from a small pool, so blobs are rewritten, read twice, in place."""
    ops = []
    for i in range(n_ops):
        ins = [str(rng.choice(list(names))) for _ in range(rng.integers(0, 4))]
        outs = [str(rng.choice(list(names))) for _ in range(rng.integers(1, 3))]
        ops.append(OperatorDef(type=f"Op{i}", input=ins, output=outs))
    return ops


@pytest.mark.parametrize("seed", range(40))
def test_versions_match_their_definitions_on_random_nets(seed):
    rng = np.random.default_rng(seed)
    ops = random_ops(rng, int(rng.integers(1, 12)))
    g = Graph(ops, external_input=["a"])
    for i, op in enumerate(ops):
        for j, name in enumerate(op.input):
            earlier = [k for k in range(i) if name in ops[k].output]
            # definition: the producer of a read is the last earlier op writing that name
            assert g.producer(i, j) == (earlier[-1] if earlier else None)
            # the version read counts every write slot of that name before op i
            assert g.in_versions[i][j] == sum(list(ops[k].output).count(name) for k in range(i))
    for name in "abcdef":
        writes = [k for k, op in enumerate(ops) for out in op.output if out == name]
        assert g.writers(name) == writes
        assert g.final.get(name, 0) == len(writes)
        assert g.readers(name) == [k for k, op in enumerate(ops) for n in op.input if n == name]
        assert g.uses(name) == sum(list(op.input).count(name) + list(op.output).count(name) for op in ops)
    first = {}
    for k, op in enumerate(ops):
        for name in op.input:
            if not any(name in ops[m].output for m in range(k)):
                first.setdefault(name, k)
    assert g.read_before_written() == first
    written = [n for op in ops for n in op.output]
    assert list(g.final) == list(dict.fromkeys(["a", *written]))   # external inputs, then first writes
    assert g.blobs() == {"a", *written, *(n for op in ops for n in op.input)}


def test_consumers_of_each_version_and_in_place_ops():
    ops = [OperatorDef(type="Fill", output=["x"]), OperatorDef(type="Relu", input=["x"], output=["x"]),
           OperatorDef(type="Mul", input=["x", "x"], output=["y"])]
    g = Graph(ops)
    assert g.in_versions == [(), (1,), (2, 2)] and g.out_versions == [(1,), (2,), (1,)]
    assert g.consumers[("x", 1)] == [1] and g.consumers[("x", 2)] == [2, 2]
    assert g.writer[("x", 2)] == 1 and g.producer(1, 0) == 0 and g.producer(2, 1) == 1


def step(name):
    return NetDef(name=name, op=[OperatorDef(type="Relu", input=["i"], output=["o"])])


def test_nested_nets_in_n_nets_and_text():
    inner = NetDef(name="deep", op=[OperatorDef(type="Tanh", input=["a"], output=["b"])])
    body = step("body")
    body.op.append(OperatorDef(type="Do", arg=[make_argument("net", inner)]))
    op = OperatorDef(type="Weird", arg=[
        make_argument("then_net", step("then")),
        make_argument("nets", [step("n0"), step("n1")]),
        make_argument("step_net", to_text(body)),                 # text form, as old files store step nets
        make_argument("name", to_text(step("not_a_net_arg"))),    # text in an argument that is not a net
        make_argument("backward_step_net", "op { type: "),        # broken text: skipped here
    ])
    found = [(arg, n.name) for arg, n in graph.nested_nets(op)]
    assert found == [("then_net", "then"), ("nets[0]", "n0"), ("nets[1]", "n1"), ("step_net", "body")]
    outer = NetDef(name="outer", op=[op])
    walked = [(depth, net.name, i, o.type) for depth, net, i, o in graph.walk(outer)]
    assert walked == [(0, "outer", 0, "Weird"), (1, "then", 0, "Relu"), (1, "n0", 0, "Relu"),
                      (1, "n1", 0, "Relu"), (1, "body", 0, "Relu"), (1, "body", 1, "Do"), (2, "deep", 0, "Tanh")]


def test_rewrites_return_new_nets_and_leave_theirs_alone():
    net = NetDef(name="n", type="dag", external_input=["x"], external_output=["z"],
                 op=[OperatorDef(type="Relu", input=["x"], output=["y"]),
                     OperatorDef(type="Sigmoid", input=["y"], output=["z"])])
    before = net.SerializeToString()
    renamed = graph.renamed(net, {"y": "y2"})
    more = graph.add_external_inputs(net, ["x", "w", "w"])
    only = graph.with_ops(net, [net.op[1]], external_input=["y"])
    copy = graph.copy_net(net)
    assert net.SerializeToString() == before
    assert [list(o.input) + list(o.output) for o in renamed.op] == [["x", "y2"], ["y2", "z"]]
    assert list(more.external_input) == ["x", "w"] and more.type == "dag"
    assert [o.type for o in only.op] == ["Sigmoid"] and list(only.external_input) == ["y"]
    assert only.external_output == net.external_output and only.name == "n"
    assert copy == net and copy is not net
    renamed.op[0].type = "Changed"
    assert net.op[0].type == "Relu"


def chain(levels: int, text_at: int | None = None) -> NetDef:
    """Nets n{levels-1} ... n0 nested in Do ops' arguments around a leaf net; n{text_at} holds its net as text."""
    return nested_nets(levels, "Do", step("leaf"), text_at)


def test_walk_stops_at_protobufs_nesting_limit():
    assert sum(1 for _ in graph.walk(chain(33))) == 34      # 99 levels: what one protobuf file can hold
    with pytest.raises(NetError, match="net 'leaf': messages are nested more than 100 levels deep"):
        list(graph.walk(chain(34)))
    with pytest.raises(NetError, match="nested more than 100 levels deep"):
        list(graph.walk(chain(2000)))                       # never a RecursionError
    with pytest.raises(NetError, match="nested more than 100 levels deep"):
        list(graph.walk(chain(2), level=98))                # a plan's networks start one level down, and so on


def test_a_net_held_as_text_counts_the_nets_around_it():
    # the text of n9 holds 9 more levels of nets: 3 * 33 = 99 levels in all, then one wrapper too many
    assert sum(1 for _ in graph.walk(chain(33, text_at=9))) == 34
    deep = chain(34, text_at=9)
    walked = [net.name for _, net, _, _ in graph.walk(deep)]
    assert walked[-1] == "n9" and "leaf" not in walked      # the text is skipped here; binding reports it
    assert [name for name, _ in graph.nested_nets(deep.op[0], level=0)] == ["net"]
    text_op = OperatorDef(type="Do", arg=[make_argument("net", to_text(chain(3)))])
    assert [n.name for _, n in graph.nested_nets(text_op, level=87)] == ["n2"]
    assert list(graph.nested_nets(text_op, level=88)) == []   # n2 at 91, and its own 10 levels pass 100
