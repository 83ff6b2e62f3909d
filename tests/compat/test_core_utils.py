"""core's net utilities, against values worked out by hand from Caffe2's documented behaviour (core.py at
157ff81a: the docstrings of get_undefined_blobs, get_output_producers, get_op_ids_in_path, clone_and_bind_net,
recover_input_record_by_prefix, DeduplicateGradientSlices; the remap functions' renaming inside nested nets).
DeduplicateGradientSlices is run and compared with numpy float64 sums and means."""
import numpy as np
import pytest

from stepnet import caffe2_pb2
from stepnet.compat import core, net_builder, workspace
from stepnet.compat.schema import Scalar, Struct
from stepnet.io.proto import arguments


def ops_of(net):
    return [(op.type, list(op.input), list(op.output)) for op in net.Proto().op]


# ------------------------------------------------------------------------------------------------ SSA analyses
def diamond():
    """0: a = Relu(x); 1: b = Relu(a); 2: c = Sigmoid(a); 3: d = Sum(b, c); 4: e = Relu(x); 5: a = Relu(d)."""
    net = core.Net("diamond")
    net.AddExternalInput("x")
    net.Relu("x", "a")
    net.Relu("a", "b")
    net.Sigmoid("a", "c")
    net.Sum(["b", "c"], "d")
    net.Relu("x", "e")
    net.Relu("d", "a")
    return net


def test_get_undefined_blobs_are_the_inputs_read_before_written():
    net = core.Net("small")
    net.FC(["x", "w", "b"], "y")
    net.Relu("y", "z")
    net.Relu("z", "y")
    net.Add(["y", "w"], "q")
    ssa, versions = core.get_ssa(net)
    assert core.get_undefined_blobs(ssa) == {"x", "w", "b"}
    assert versions == {"x": 0, "w": 0, "b": 0, "y": 2, "z": 1, "q": 1}


def test_get_output_producers():
    ssa, _ = core.get_ssa(diamond())
    assert core.get_output_producers(ssa) == {("a", 1): 0, ("b", 1): 1, ("c", 1): 2, ("d", 1): 3, ("e", 1): 4,
                                              ("a", 2): 5}


def test_get_op_ids_in_path_on_a_diamond():
    ssa, versions = core.get_ssa(diamond())
    assert core.get_op_ids_in_path(ssa, versions, ["x"], ["d"]) == [0, 1, 2, 3]
    assert core.get_op_ids_in_path(ssa, versions, ["b"], ["d"]) == [0, 2, 3]      # c still needs a
    assert core.get_op_ids_in_path(ssa, versions, ["b", "c"], ["d"]) == [3]
    assert core.get_op_ids_in_path(ssa, versions, [], ["e", "d"]) == [0, 1, 2, 3, 4]
    assert core.get_op_ids_in_path(ssa, versions, ["x"], ["a"]) == [0, 1, 2, 3, 5]   # a's latest version: op 5
    assert core.get_op_ids_in_path(ssa, versions, ["a"], ["a"]) == []                # given in its latest version


# ------------------------------------------------------------------------------------------------ remapping
def netdef(name, *ops, inputs=(), outputs=()):
    proto = caffe2_pb2.NetDef(name=name, external_input=list(inputs), external_output=list(outputs))
    for op_type, ins, outs in ops:
        proto.op.add(type=op_type, input=ins, output=outs)
    return proto


def nested_net():
    """A RecurrentNetwork whose step net holds an If whose then_net holds a While; and an If at the top."""
    loop = netdef("loop", ("Relu", ["h"], ["h"]))
    cond = netdef("cond", ("LT", ["h", "lim"], ["go"]))
    then = netdef("then", ("While", ["go"], []), inputs=["h"])
    then.op[0].arg.add(name="loop_net").n.CopyFrom(loop)
    then.op[0].arg.add(name="cond_net").n.CopyFrom(cond)
    step = netdef("step", ("FC", ["x_t", "w", "b"], ["h"]), ("If", ["flag"], []), inputs=["x_t", "w", "b"])
    step.op[1].arg.add(name="then_net").n.CopyFrom(then)
    net = core.Net("outer")
    net.Proto().op.add().CopyFrom(core.CreateOperator(
        "RecurrentNetwork", ["x", "w", "b", "h0"], ["hs", "h_last"], step_net=step, timestep="t",
        link_internal=["h", "x_t"], link_external=["hs", "x"], alias_src=["hs"], alias_dst=["h_last"]))
    if_op = core.CreateOperator("If", ["flag"], [], then_net=netdef("top_then", ("Relu", ["h_last"], ["y"])),
                                else_net=netdef("top_else", ("Copy", ["x"], ["y"])))
    net.Proto().op.add().CopyFrom(if_op)
    return net


REMAP = {"x": "p/x", "h": "p/h", "x_t": "p/x_t", "hs": "p/hs", "w": "p/w", "t": "p/t", "lim": "p/lim",
         "y": "p/y", "go": "p/go"}


def test_clone_renames_blobs_inside_nested_nets():
    clone = nested_net().Clone("outer_copy", blob_remap=REMAP)
    rnn, top_if = clone.Proto().op
    assert list(rnn.input) == ["p/x", "p/w", "b", "h0"] and list(rnn.output) == ["p/hs", "h_last"]
    args = arguments(rnn.arg)
    assert args["timestep"] == "p/t"
    assert args["link_internal"] == ["p/h", "p/x_t"] and args["link_external"] == ["p/hs", "p/x"]
    assert args["alias_src"] == ["p/hs"] and args["alias_dst"] == ["h_last"]
    step = args["step_net"]
    assert step.name == "cloned_sub_net"                       # remap_proto: the step net is a Clone of that name
    assert [(op.type, list(op.input), list(op.output)) for op in step.op] == [
        ("FC", ["p/x_t", "p/w", "b"], ["p/h"]), ("If", ["flag"], [])]
    assert list(step.external_input) == ["p/x_t", "p/w", "b"]
    then = arguments(step.op[1].arg)["then_net"]
    assert then.name == "then_remapped" and list(then.external_input) == ["p/h"]   # control_op_remap: '<net>_remapped'
    loop, cond = arguments(then.op[0].arg)["loop_net"], arguments(then.op[0].arg)["cond_net"]
    assert (loop.name, cond.name) == ("loop_remapped", "cond_remapped")
    assert [list(op.input) + list(op.output) for op in loop.op] == [["p/h", "p/h"]]
    assert [list(op.input) + list(op.output) for op in cond.op] == [["p/h", "p/lim", "p/go"]]
    top_args = arguments(top_if.arg)
    assert [list(op.input) + list(op.output) for op in top_args["then_net"].op] == [["h_last", "p/y"]]
    assert [list(op.input) + list(op.output) for op in top_args["else_net"].op] == [["p/x", "p/y"]]
    assert (top_args["then_net"].name, top_args["else_net"].name) == ("top_then_remapped", "top_else_remapped")


def test_remap_functions_directly():
    arg = caffe2_pb2.Argument(name="step_net")
    arg.n.CopyFrom(netdef("s", ("Relu", ["a"], ["b"]), inputs=["a"], outputs=["b"]))
    core.remap_proto(arg, {"a": "A", "b": "B"})
    assert (arg.n.name, list(arg.n.external_input), list(arg.n.external_output)) == ("cloned_sub_net", ["A"], ["B"])
    core.remap_proto(arg, {})   # Net(arg.n) takes cloned_sub_net_1 (the name is used), its Clone the next one
    assert arg.n.name == "cloned_sub_net_2"                    # made unique in the process, as Caffe2's Net names
    op = core.CreateOperator("While", ["c"], [], loop_net=netdef("body", ("Relu", ["a"], ["a"])))
    core.control_op_remap(op, "", {"a": "z"})
    assert [list(o.input) for o in arguments(op.arg)["loop_net"].op] == [["z"]]
    op = core.CreateOperator("RecurrentNetwork", ["i"], ["o"], recompute_blobs_on_backward=["i", "k"], timestep="i")
    core.recurrent_network_op_remap(op, "ignored/", {"i": "I"})
    assert arguments(op.arg)["recompute_blobs_on_backward"] == ["I", "k"] and arguments(op.arg)["timestep"] == "I"
    assert list(op.input) == ["i"]                             # the op's own inputs are Clone's to rename
    assert set(core.DEFAULT_REMAP_FUNCS) == {"RecurrentNetwork", "RecurrentNetworkGradient", "If", "While"}


def test_custom_remap_funcs_get_the_clones_prefix():
    seen = []
    net = core.Net("n")
    net.Relu("x", "y")
    net.Clone("copy", remap_funcs={"Relu": lambda op, prefix, remap: seen.append(prefix)})
    net.Clone("", remap_funcs={"Relu": lambda op, prefix, remap: seen.append(prefix)})
    assert seen == ["copy/", ""]


# ------------------------------------------------------------------------------------------------ records, binding
def processor():
    """out = Scale(a); input record (a, b) made by the net, output record (out)."""
    net = core.Net("proc")
    rec = net.set_input_record(Struct(("a", Scalar(np.float32)), ("b", Scalar(np.float32))))
    out = net.Scale(rec.a(), "out", scale=2.0)
    net.Add([out, rec.b()], "out2")
    net.set_output_record(Struct(("out", Scalar(np.float32, out))))
    return net, rec


def test_clone_keeps_the_schema_records_over_the_renamed_blobs():
    net, rec = processor()
    assert [str(b) for b in rec.field_blobs()] == ["proc/a", "proc/b"]
    clone = net.Clone("proc_copy", blob_remap={"proc/a": "A", "out": "OUT"})
    assert [str(b) for b in clone.input_record().field_blobs()] == ["A", "proc/b"]
    assert clone.input_record().field_names() == ["a", "b"]
    assert [str(b) for b in clone.output_record().field_blobs()] == ["OUT"]
    assert clone.output_record().field_blobs()[0].Net() is clone
    bare = net.Clone("proc_bare", blob_remap={"proc/a": "A"}, keep_schema=False)
    assert bare.input_record() is None and bare.output_record() is None


def test_clone_and_bind_net_prefixes_what_the_net_defines():
    net, _ = processor()
    inputs = Struct(("a", Scalar(np.float32, core.BlobReference("data_a"))),
                    ("b", Scalar(np.float32, core.BlobReference("data_b"))),
                    ("extra", Scalar(np.float32, core.BlobReference("data_c"))))
    given = {"out2": "kept_name"}
    clone, remap = core.clone_and_bind_net(net, "bound", "p/", blob_remap=given, inputs=inputs)
    assert remap is given
    assert remap == {"out2": "kept_name", "proc/a": "data_a", "proc/b": "data_b", "out": "p/out"}
    assert clone.Name() == "bound"
    assert ops_of(clone) == [("Scale", ["data_a"], ["p/out"]), ("Add", ["p/out", "data_b"], ["kept_name"])]
    assert [str(b) for b in clone.input_record().field_blobs()] == ["data_a", "data_b"]
    assert [str(b) for b in clone.output_record().field_blobs()] == ["p/out"]
    loose, _ = core.clone_and_bind_net(net, "loose", "q/", inputs=inputs, keep_schema=False)
    assert loose.input_record() is inputs and loose.output_record() is None
    with pytest.raises(AssertionError, match="extra fields {'b'}"):
        core.clone_and_bind_net(net, "bad", "r/", inputs=Struct(("a", Scalar(np.float32, core.BlobReference("z")))))
    with pytest.raises(AssertionError):
        core.clone_and_bind_net(net.Proto(), "bad", "r/")


def test_recover_records_by_prefix():
    net = core.Net("recovered")
    net.AddExternalInput("in:a", "in:lst:lengths", "in:lst:values", "other")
    net.Relu("in:a", "out:y")
    net.Proto().external_output.extend(["out:y"])
    net.recover_input_record_by_prefix("in:")
    rec = net.input_record()
    assert rec.field_names() == ["a", "lst:lengths", "lst:values"]
    assert [str(b) for b in rec.field_blobs()] == ["in:a", "in:lst:lengths", "in:lst:values"]
    assert type(rec.lst).__name__ == "List"
    net.recover_output_record_by_prefix("out:")
    assert net.output_record().field_names() == ["y"] and net.output_record().field_blobs() == ["out:y"]
    empty = core.Net("none")
    empty.recover_input_record_by_prefix("in:")
    assert empty.input_record() is None


# ------------------------------------------------------------------------------------------------ gradient slices
@pytest.mark.parametrize("aggregator", ["sum", "MEAN"])
def test_deduplicate_gradient_slices(aggregator):
    indices = np.array([3, 1, 3, 0, 1, 3], np.int64)
    values = np.arange(18, dtype=np.float32).reshape(6, 3) - 7.5
    workspace.FeedBlob("idx", indices)
    workspace.FeedBlob("val", values)
    net = core.Net("dedup")
    g = net.DeduplicateGradientSlices(core.GradientSlice(core.BlobReference("idx"), core.BlobReference("val")),
                                      aggregator=aggregator)
    assert isinstance(g, core.GradientSlice)
    assert [op.type for op in net.Proto().op] == ["Unique", "UnsortedSegmentSum" if aggregator == "sum"
                                                  else "UnsortedSegmentMean"]
    workspace.RunNetOnce(net)
    unique, rows = workspace.FetchBlob(g.indices), workspace.FetchBlob(g.values)
    assert sorted(unique.tolist()) == [0, 1, 3]
    for k, index in enumerate(unique):
        picked = values.astype(np.float64)[indices == index]
        expected = picked.sum(axis=0) if aggregator == "sum" else picked.mean(axis=0)
        np.testing.assert_allclose(rows[k], expected, rtol=1e-6)
    with pytest.raises(ValueError, match="max is not supported"):
        net.DeduplicateGradientSlices(g, aggregator="max")


# ------------------------------------------------------------------------------------------------ small helpers
def test_names_lists_and_indices():
    net = core.Net("named")
    assert core.get_net_name(net) == "named" and core.get_net_name(net.Proto()) == "named"
    assert core.get_net_name("just_a_name") == "just_a_name"
    y = net.Relu("x", "y")
    assert core.output_to_list(y) == [y] and core.output_to_list((y, y)) == [y, y]
    with pytest.raises(AssertionError):
        core.output_to_list("y")
    slice_ = core.GradientSlice("g_idx", "g_val")
    assert core.GetIndexFromGradientList(["a_grad", slice_, None], "g_val") == 1
    assert core.GetIndexFromGradientList(["a_grad", slice_], "a_grad") == 0
    assert core.GetIndexFromGradientList(["a_grad", slice_], "b_grad") is None


def test_add_nets_in_order():
    a, b, c, report = core.Net("a"), core.Net("b"), core.Net("c"), core.Net("report")
    inner = core.execution_step("inner", [b, a])
    outer = core.execution_step("outer", [inner, core.execution_step("last", c)], report_net=report,
                                report_interval=1)
    names = ["c"]
    core.add_nets_in_order(outer, names)
    assert names == ["c", "b", "a", "report"]


def test_flags_registry_prefix_and_mkl():
    core.GlobalInit(["prog", "--caffe2_log_level=0"])
    core.GlobalInit(["prog", "--flag=1"])
    assert core.GetGlobalInitArgs() == ["--caffe2_log_level=0", "--flag=1"]
    core.GetGlobalInitArgs().append("not kept")
    assert len(core.GetGlobalInitArgs()) == 2
    core.RefreshRegisteredOperators()
    assert core.IsOperator("Relu") and not core.IsOperator("NoSuchOp")
    assert core.Net.current_prefix() == ""
    with net_builder.NetBuilder("outer"):
        with net_builder.NetBuilder("inner"):
            assert core.Net.current_prefix() == "outer/inner"
    net = core.Net("mkl")
    net.RunAllOnMKL()
    assert net.Name() == "mkl"
    assert net.Proto().device_option == caffe2_pb2.DeviceOption(device_type=caffe2_pb2.MKLDNN)   # no id set


def test_a_net_made_inside_a_net_builder_is_named_under_it():
    """Caffe2's Net._get_next_net_name: the active NetBuilder's name, '/', the name asked for, then _1, _2 where
    taken; a proto's name too; None names the net after the builder alone ('' outside any)."""
    with net_builder.NetBuilder("nb_prefix_outer"):
        with net_builder.NetBuilder("inner"):
            assert core.Net("made").Name() == "nb_prefix_outer/inner/made"
            assert core.Net("made").Name() == "nb_prefix_outer/inner/made_1"
            assert core.Net(caffe2_pb2.NetDef(name="given")).Name() == "nb_prefix_outer/inner/given"
        assert core.Net(None).Name() == "nb_prefix_outer"
        assert core.Net("made").Name() == "nb_prefix_outer/made"
    assert core.Net("nb_prefix_outer").Name() == "nb_prefix_outer_1"


def test_set_per_op_engine_pref_replaces_what_set_op_engine_pref_adds_to():
    """core.SetPerOpEnginePref (Caffe2: C.set_per_op_engine_pref) replaces the per-op table; SetOpEnginePref adds
    one op type to it. Recorded only: engines are hints here."""
    from stepnet.compat import engines
    saved = {k: dict(v) for k, v in engines._ENGINE_PREF.items()}
    try:
        core.SetOpEnginePref("Relu", {0: ["EIGEN"]})
        core.SetPerOpEnginePref({1: {"Conv": ("CUDNN",)}})
        core.SetOpEnginePref("FC", {1: ["TENSORCORE"]})
        assert engines._ENGINE_PREF["op"] == {1: {"Conv": ["CUDNN"], "FC": ["TENSORCORE"]}}
    finally:
        engines._ENGINE_PREF.update(saved)
