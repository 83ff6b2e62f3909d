"""compat.core: nets with op methods and unique names, BlobReference, CreateOperator, the name and device scopes,
external inputs and outputs, gradients, Clone, Const, ExecutionStep and Plan."""
import copy
import pickle
import warnings

import numpy as np
import pytest

from stepnet import caffe2_pb2
from stepnet.compat import core, scope, workspace
from stepnet.core.errors import ArgumentError, ArityError, StepnetError, StepnetWarning
from stepnet.io.proto import NetDef, arguments


# --------------------------------------------------------------------------------------------- nets and ops
def test_net_names_are_unique_in_the_process():
    assert [core.Net("m").Name() for _ in range(3)] == ["m", "m_1", "m_2"]
    proto = NetDef(name="m")
    copied = core.Net(proto)
    assert copied.Name() == "m_3" and proto.name == "m" and str(copied) == "m_3"


def test_a_net_from_a_netdef_is_a_copy():
    proto = NetDef(name="source", external_input=["x"])
    proto.op.add(type="Relu", input=["x"], output=["y"])
    net = core.Net(proto)
    net.Relu("y", "z")
    assert len(proto.op) == 1 and len(net.Proto().op) == 2
    assert net.BlobIsDefined("y") and net.BlobIsDefined("x") and not net.BlobIsDefined("q")


def test_op_methods_return_blob_references():
    net = core.Net("ops")
    y = net.Relu("x", "y")
    assert isinstance(y, core.BlobReference) and y == "y" and y.Net() is net
    outs = net.Split("y", ["a", "b"], axis=0)
    assert isinstance(outs, tuple) and outs == ("a", "b")
    assert net.Print("a", []) is None
    auto = net.Sigmoid(y)
    assert auto == "ops/Sigmoid" and net.Sigmoid(y) == "ops/Sigmoid_2"
    assert net.Split("y", 2) == ("ops/Split:0", "ops/Split:1")
    assert list(net.Proto().external_input) == ["x"]          # undefined inputs become external inputs


def test_op_methods_check_what_they_can_when_added():
    net = core.Net("checks")
    with pytest.raises(AttributeError, match="not a registered operator.*did you mean Relu"):
        net.Rleu("x", "y")
    short = core.Net("arity")
    short.FC(["x", "w"], "y")     # Caffe2 checks how many inputs an op has when the net is created or run
    with pytest.raises(ArityError, match="FC takes 3 inputs"):
        workspace.CreateNet(short)
    with pytest.raises(ArgumentError, match="must be an integer"):
        net.Softmax("x", "y", axis="two")
    net.Relu("x", "y", not_an_argument=1)       # Caffe2 keeps undeclared arguments; stepnet warns at creation
    workspace.FeedBlob("x", np.ones(2, np.float32))
    with pytest.warns(StepnetWarning, match="argument 'not_an_argument' is not used by Relu"):
        workspace.RunNetOnce(net)


def test_proto_edits_are_seen():
    net = core.Net("edited")
    net.Proto().op.add(type="ConstantFill", output=["c"])
    net.Relu("c", "d")
    assert list(net.Proto().external_input) == []       # c is made by the op added through Proto()
    assert net.UsesBlob("c") and net.UsedBlobNames() == {"c", "d"} and net.GetBlobRef("d").Net() is net
    with pytest.raises(KeyError):
        net.GetBlobRef("zz")


def test_next_names():
    net = core.Net("n")
    assert net.NextName() == "n_blob_0" and net.NextName("FC") == "n/FC" and net.NextName("FC", 1) == "n/FC:1"
    net.Relu("x", "n/FC")
    assert net.NextName("FC") == "n/FC_2"
    with core.NameScope("s"):
        assert net.NextName("Relu") == "n/Relu" and net.NextScopedBlob("b") == "s/b"
    assert net.NextBlob("b") == "b" and net.NextBlob("b") == "b_auto_0"


# --------------------------------------------------------------------------------------------- blob references
def test_blob_reference_is_a_string_that_knows_its_net():
    net = core.Net("refs")
    x = net.AddExternalInput("x")
    assert isinstance(x, str) and x == "x" and hash(x) == hash("x") and {x: 1}["x"] == 1
    assert repr(x) == 'BlobReference("x")' and str(x) == "x"
    y = x + "_grad"
    assert isinstance(y, core.BlobReference) and y == "x_grad" and y.Net() is net
    assert ("pre_" + x).Net() is net
    with pytest.raises(RuntimeError):
        x + 1
    z = x.Relu([], "z")
    fc = z.FC(["w", "b"], "fc")
    assert [list(op.input) for op in net.Proto().op] == [["x"], ["z", "w", "b"]] and fc == "fc"
    assert core.BlobReference("a/b/c").GetNameScope() == "a/b/" and core.BlobReference(b"bytes") == "bytes"
    with pytest.raises(RuntimeError, match="does not have a net source"):
        core.BlobReference("free").Relu([], "y")
    with pytest.raises(AttributeError):
        getattr(x, "NotAnOp")  # noqa: B009
    for clone in (copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert clone == "x" and isinstance(clone, core.BlobReference)
    assert "Relu" in dir(x) and "FC" in dir(net)


def test_blob_references_are_not_scoped_again():
    net = core.Net("scoped")
    x = net.AddExternalInput("x")
    with core.NameScope("layer"):
        y = net.Relu(x, "y")                         # the string gets the scope, the reference does not
        z = net.Relu(y, "z")
    assert (y, z) == ("layer/y", "layer/z") and list(net.Proto().op[1].input) == ["layer/y"]


# --------------------------------------------------------------------------------------------- scopes
def test_name_scopes_nest_reset_and_restore():
    assert core.ScopedName("x") == "x" and scope.CurrentNameScope() == ""
    with core.NameScope("a"):
        with core.NameScope("b"):
            assert core.ScopedName("x") == "a/b/x" and core.ScopedBlobReference("x") == "a/b/x"
            with core.NameScope("c", reset=True):
                assert core.ScopedName("x") == "c/x"
            with core.NameScope(""), core.NameScope(None):
                assert scope.CurrentNameScope() == "a/b/"
        assert scope.CurrentNameScope() == "a/"
    assert scope.CurrentNameScope() == ""
    with pytest.raises(TypeError):
        with core.NameScope(3):
            pass


def test_device_scope_stamps_new_ops():
    net = core.Net("dev")
    gpu = core.DeviceOption(caffe2_pb2.CUDA, 1)
    with core.DeviceScope(gpu):
        net.Relu("x", "y")
        with core.DeviceScope(None, node_name="node"):
            net.Relu("y", "z")
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
                assert scope.CurrentDeviceScope().node_name == "node"     # inherited
        with core.EmptyDeviceScope():
            net.Relu("z", "w")
        net.Relu("w", "v", device_option=core.DeviceOption(caffe2_pb2.CPU), random_seed=7)
    net.Relu("v", "u")
    ops = net.Proto().op
    assert ops[0].device_option.device_type == 1 and ops[0].device_option.device_id == 1
    assert ops[1].device_option.node_name == "node"
    assert not ops[2].HasField("device_option") and not ops[4].HasField("device_option")
    assert ops[3].device_option.device_type == 0 and ops[3].device_option.random_seed == 7
    with pytest.raises(ValueError):
        with core.DeviceScope(None):
            pass


def test_device_options():
    old = core.DeviceOption(caffe2_pb2.CUDA, 2, random_seed=3, node_name="n")
    assert (old.device_type, old.device_id, old.random_seed, old.node_name) == (1, 2, 3, "n")
    assert core.DeviceOption(0, device_id=4).device_id == 4
    assert core.device_option_equal(core.DeviceOption(1, 2), core.DeviceOption(1, 2, random_seed=5))
    assert not core.device_option_equal(core.DeviceOption(1, 2), core.DeviceOption(1, 3))
    assert core.device_option_equal(core.DeviceOption(0, 2), core.DeviceOption(0, 3))
    assert core.DataType.INT64 == 10 and core.IsOperator("FC") and not core.IsOperator("NoSuchOp")


def test_create_operator():
    with core.NameScope("s"), core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 0)):
        op = core.CreateOperator("Conv", ["x", core.BlobReference("w")], "y", name="conv", engine="CUDNN",
                                 control_input=["c"], kernel=3, pads=[1, 1, 1, 1], random_seed=9,
                                 arg=[caffe2_pb2.Argument(name="order", s=b"NCHW")])
    assert list(op.input) == ["s/x", "w"] and list(op.output) == ["s/y"] and list(op.control_input) == ["s/c"]
    assert (op.name, op.engine, op.device_option.device_type, op.device_option.random_seed) == ("conv", "CUDNN", 1, 9)
    assert arguments(op.arg) == {"order": "NCHW", "kernel": 3, "pads": [1, 1, 1, 1]}
    with pytest.raises(TypeError):
        core.CreateOperator("Relu", [3], ["y"])


# --------------------------------------------------------------------------------------------- external blobs
def test_external_inputs_and_outputs():
    net = core.Net("ext")
    a, b = net.AddExternalInputs("a", "b")
    assert (a, b) == ("a", "b") and a.Net() is net and net.AddExternalInput("c") == "c"
    with pytest.raises(ValueError, match="already contains an input named a"):
        net.AddExternalInput("a")
    y = net.Add([a, b], "y")
    ref = net.AddExternalOutput(y)
    assert ref == "y" and ref.Net() is net
    with pytest.raises(StepnetError, match="produced by no op"):
        net.AddExternalOutputs("nothing")
    with core.NameScope("s"):
        assert net.AddScopedExternalInputs("d") == ["s/d"]
    assert net.external_inputs == ["a", "b", "c", "s/d"] and net.external_outputs == ["y"]
    assert net.is_external_input("a") and not net.is_external_input("y")


# --------------------------------------------------------------------------------------------- gradients, clone
def test_add_gradient_operators():
    net = core.Net("grad")
    x, w, b = net.AddExternalInputs("x", "w", "b")
    y = net.FC([x, w, b], "y")
    loss = net.AveragedLoss(y, "loss")
    grads = net.AddGradientOperators([loss])
    assert grads["w"] == "w_grad" and isinstance(grads["w"], core.BlobReference)
    assert isinstance(next(iter(grads)), core.BlobReference)
    types = [op.type for op in net.Proto().op]
    assert types[2:] == ["ConstantFill", "AveragedLossGradient", "FCGradient"]
    workspace.FeedBlob("x", np.ones((2, 3), np.float32))
    workspace.FeedBlob("w", np.full((4, 3), 0.5, np.float32))
    workspace.FeedBlob("b", np.zeros(4, np.float32))
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("w_grad"), np.full((4, 3), 0.25))   # 2 rows / 8 outputs


def test_add_gradient_operators_with_given_gradients_and_skip():
    net = core.Net("given")
    net.ConstantFill([], "x", shape=[2], value=1.0)            # skipped: data generation
    y = net.Scale("x", "y", scale=3.0)
    grads = net.AddGradientOperators({y: "y_given"}, skip=1)
    assert grads["x"] == "x_grad" and "y_given" in net.Proto().external_input
    assert [op.type for op in net.Proto().op] == ["ConstantFill", "Scale", "Scale"]


def test_clone_renames_blobs_everywhere():
    net = core.Net("orig")
    step = NetDef(name="step", external_input=["h_prev"], op=[caffe2_pb2.OperatorDef(type="Relu", input=["h_prev"],
                                                                                       output=["h"])])
    net.Relu("x", "y")
    net.Proto().op.add(type="RecurrentNetwork", input=["y"], output=["h_all"],
                       arg=[caffe2_pb2.Argument(name="step_net", n=step),
                            caffe2_pb2.Argument(name="link_external", strings=[b"y"]),
                            caffe2_pb2.Argument(name="timestep", s=b"t")])
    net.Sigmoid("y", "z")
    net.add_attribute("k", 1)
    clone = net.Clone("copy", blob_remap={"y": "y2", "h_prev": "hp", "t": "t2"}, op_id_mask=[0, 1])
    ops = clone.Proto().op
    assert clone.Name() == "copy" and [op.type for op in ops] == ["Relu", "RecurrentNetwork"]
    assert list(ops[0].output) == ["y2"] and list(ops[1].input) == ["y2"]
    args = arguments(ops[1].arg)
    assert args["link_external"] == ["y2"] and args["timestep"] == "t2" and list(args["step_net"].op[0].input) == ["hp"]
    assert list(net.Proto().op[0].output) == ["y"] and clone.get_attributes("k") == [1]


def test_append_net_and_const():
    a, b = core.Net("a"), core.Net("b")
    a.Relu("x", "y")
    b.Relu("y", "z")
    b.Proto().external_output.append("z")
    a.AppendNet(b)
    assert list(a.Proto().external_input) == ["x"] and list(a.Proto().external_output) == ["z"]
    c = core.Net("c")
    kinds = []
    for value in (np.ones(2, np.float32), np.arange(3, dtype=np.int32), np.array([1, 2], np.int64), True,
                  np.array([True, False])):
        c.Const(value)
        kinds.append(c.Proto().op[-1].type)
    assert kinds == ["GivenTensorFill", "GivenTensorIntFill", "GivenTensorInt64Fill", "ConstantFill",
                     "GivenTensorBoolFill"]
    values = c.Const([[1.5, 2.5]], "given")
    workspace.RunNetOnce(c)
    assert workspace.FetchBlob(values).tolist() == [[1.5, 2.5]]


def test_run_all_on_gpu_and_seeds():
    net = core.Net("gpu")
    net.Relu("x", "y")
    net.Relu("y", "z")
    net.RunAllOnGPU(gpu_id=1, use_cudnn=True)
    assert net.Proto().device_option.device_type == 1 and net.Proto().device_option.device_id == 1
    assert [op.engine for op in net.Proto().op] == ["CUDNN", "CUDNN"]
    net.set_rand_seed(seed=10)
    assert [op.device_option.random_seed for op in net.Proto().op] == [10, 11]


def test_log_info_prints_strings_and_blobs(capsys):
    net = core.Net("log")
    x = net.ConstantFill([], "x", shape=[1], value=4.0)
    net.LogInfo("hello", x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        workspace.RunNetOnce(net)
    out = capsys.readouterr().out
    assert "hello" in out and "Tensor x of type float32" in out


# --------------------------------------------------------------------------------------------- plans
def test_execution_steps_and_plans():
    init, train, report = core.Net("init"), core.Net("train"), core.Net("report")
    init.ConstantFill([], "x", shape=[1], value=1.0)
    train.Scale("x", "x", scale=2.0)
    report.Print("x", [])
    inner = core.ExecutionStep("inner", train, num_iter=2)
    outer = core.execution_step("outer", [inner], num_iter=3)
    outer.SetReportNet(report, 1)
    plan = core.Plan(core.ExecutionStep("init_step", [init]))
    plan.AddStep(outer)
    assert [n.name for n in plan.Proto().network] == ["init", "train", "report"]
    assert plan.Proto().execution_step[1].substep[0].num_iter == 2 and str(plan) == "init_step"
    with pytest.raises(RuntimeError, match="Cannot mutate"):
        inner.SetIter(5)
    with pytest.raises(ValueError, match="both"):
        core.execution_step("x", train, num_iter=1, should_stop_blob="stop")
    workspace.RunPlan(plan)
    assert workspace.FetchBlob("x").tolist() == [64.0]
    assert core.ExecutionStep(None).Name() == "step" and core.ExecutionStep(None).Name() == "step_1"


def test_a_step_with_a_stop_blob():
    net = core.Net("countdown")
    net.Iter("it", "it")
    net.GE(["it", "limit"], "done")
    step = core.execution_step("loop", net, should_stop_blob=core.BlobReference("done"))
    workspace.FeedBlob("it", np.array([0], np.int64))
    workspace.FeedBlob("limit", np.array([4], np.int64))
    workspace.RunPlan(step)
    assert workspace.FetchBlob("it").tolist() == [4]


def test_a_plan_made_from_its_proto_runs_the_same_steps():
    """Plan.create_from_proto: the same steps (names, iterations, stop blob), over new core.Nets made from the
    plan's NetDefs; running it gives the original's result."""
    from stepnet.compat import workspace

    init, body = core.Net("init"), core.Net("body")
    init.ConstantFill([], "x", shape=[1], value=1.0)
    body.Add(["x", "x"], "x")
    plan = core.Plan("p")
    plan.AddStep(core.execution_step("setup", init))
    plan.AddStep(core.execution_step("loop", [core.execution_step("inner", body, num_iter=3)]))
    again = core.Plan.create_from_proto(plan.Proto())
    assert [s.Name() for s in again.Steps()] == ["setup", "loop"]
    assert again.Proto().execution_step[1].substep[0].num_iter == 3
    assert [n.Proto().op[0].type for n in again.Nets()] == ["ConstantFill", "Add"]
    workspace.RunPlan(again)
    assert workspace.FetchBlob("x").tolist() == [8.0]
    bad = plan.Proto()
    bad.execution_step[0].network[0] = "missing"
    with pytest.raises(ValueError, match="names network 'missing', which the plan does not hold"):
        core.Plan.create_from_proto(bad)


def test_get_ssa_numbers_each_write():
    """Caffe2's core.get_ssa: external inputs at version 0, each write one more; a net declaring no external
    inputs takes every blob read before it is written as one (numbers written out by hand)."""
    net = core.Net("ssa")
    net.AddExternalInput("x")
    net.Relu("x", "y")
    net.Add(["y", "x"], "y")
    net.Relu("y", "x")
    ssa, versions = core.get_ssa(net)
    assert ssa == [([("x", 0)], [("y", 1)]), ([("y", 1), ("x", 0)], [("y", 2)]), ([("y", 2)], [("x", 1)])]
    assert versions == {"x": 1, "y": 2}
    undeclared = core.Net("free")
    undeclared.Relu("a", "b")
    assert core.get_ssa(undeclared) == ([([("a", 0)], [("b", 1)])], {"a": 0, "b": 1})
