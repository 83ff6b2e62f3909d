"""compat.core's Caffe2 API beyond adding ops: ClonePartial, where ops were created (PopulateProtoWithFileName and
the report when a net fails), CreateOperator's None argument, engines, arity checked at creation of the net, and
model_helper.ExtractPredictorNet."""
import sys

import numpy as np
import pytest

from stepnet import caffe2_pb2
from stepnet.compat import core, workspace
from stepnet.compat.model_helper import ExtractPredictorNet


# --------------------------------------------------------------------------------------------- ClonePartial
def branchy_net():
    n = core.Net("orig")
    a1, a2 = n.AddExternalInput("a1", "a2")
    b1, b2 = n.Concat([a1, a2], ["b1", "b2"], axis=0)
    c1 = n.Sum([b1, "p"], ["c1"])
    c2 = n.Relu([b2], ["c2"])
    d = n.Sum([c1, c2], ["d"])
    n.Sum([d], [d])                       # d rewritten in place: its latest version is what a clone computes
    n.Scale([a1], ["unrelated"])
    return n, d


def test_clone_partial_keeps_the_ops_on_the_path_and_renames_what_they_make():
    n, d = branchy_net()
    before = n.Proto().SerializeToString()
    clone, (out,) = n.ClonePartial("f", {"a1": "x1", "a2": "x2"}, [d])
    assert [op.type for op in clone.Proto().op] == ["Concat", "Sum", "Relu", "Sum", "Sum"]
    assert list(clone.Proto().op[0].input) == ["x1", "x2"] and list(clone.Proto().op[0].output) == ["f/b1", "f/b2"]
    assert list(clone.Proto().op[1].input) == ["f/b1", "p"]       # read from outside: name kept
    assert list(clone.Proto().external_input) == ["x1", "x2", "p"]
    assert list(clone.Proto().external_output) == ["f/d"] and str(out) == "f/d" and out.Net() is clone
    assert n.Proto().SerializeToString() == before

    part, (c1,) = n.ClonePartial("g", ["b1"], ["c1"])             # a list: inputs keep their names
    assert [op.type for op in part.Proto().op] == ["Sum"] and set(part.Proto().external_input) == {"b1", "p"}
    assert str(c1) == "g/c1"


def test_clone_partial_refuses_inputs_the_path_itself_makes():
    n, d = branchy_net()
    with pytest.raises(AssertionError, match="also make the given inputs"):
        n.ClonePartial("h", ["a1", "a2", "c2"], [d])              # c2 comes from a2 through Concat, which d needs
    with pytest.raises(AssertionError, match="does not define output 'zz'"):
        n.ClonePartial("h", ["a1"], ["zz"])


# --------------------------------------------------------------------------------------------- where ops were made
def test_populate_proto_with_file_name_names_the_line_that_made_each_op():
    net = core.Net("where")
    net.Relu("x", "y"); line = sys._getframe().f_lineno  # noqa: E702
    net.Proto().op.add(type="Relu", input=["y"], output=["z"])    # not made by a Net method: left alone
    net.PopulateProtoWithFileName()
    name = net.Proto().op[0].name
    assert name == f"{__file__}:{line}:test_populate_proto_with_file_name_names_the_line_that_made_each_op"
    assert net.Proto().op[1].name == ""


def test_a_failing_net_reports_where_its_op_was_made(capsys):
    net = core.Net("fails")
    net.Split("a", ["b", "c"], axis=0); line = sys._getframe().f_lineno  # noqa: E702
    workspace.FeedBlob("a", np.ones(3, np.float32))
    with pytest.raises(RuntimeError, match="cannot be split into 2 equal parts"):
        workspace.RunNetOnce(net)
    out = capsys.readouterr().out
    assert "Original python traceback for operator 0 in network `fails`" in out
    assert f'File "{__file__}", line {line}, in test_a_failing_net_reports_where_its_op_was_made' in out
    with pytest.raises(RuntimeError):
        workspace.C.Workspace().run(net)                          # the C.Workspace reports it too
    assert "operator 0 in network `fails`" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="no net named 'never_created'"):
        workspace.RunNet("never_created")
    assert capsys.readouterr().out == ""                          # no op to name: nothing printed


# --------------------------------------------------------------------------------------------- creating ops
def test_create_operator_refuses_a_none_argument():
    with pytest.raises(ValueError, match="argument 'arg1' of Ludicrous is None"):
        core.CreateOperator("Ludicrous", "x", "y", arg1=None)
    assert core.CreateOperator("Relu", "x", "y", engine=None).engine == ""


def test_engines_caffe2_registers_ops_under():
    assert core.IsOperatorWithEngine("Relu", "DEFAULT") and core.IsOperatorWithEngine("Relu", "")
    assert core.IsOperatorWithEngine("Conv", "NNPACK") and core.IsOperatorWithEngine("CreateCommonWorld", "MPI")
    assert not core.IsOperatorWithEngine("Relu", "NOEXIST") and not core.IsOperatorWithEngine("NoSuchOp", "")


def test_arity_and_in_place_rules_are_checked_when_the_net_is_created_or_run():
    net = core.Net("arity")
    outs = net.Sum(["a", "a"], outputs=2)                         # names first, as Caffe2 allows
    assert [str(o) for o in outs] == ["arity/Sum:0", "arity/Sum:1"]
    workspace.FeedBlob("a", np.ones(2, np.float32))
    for run in (workspace.RunNetOnce, workspace.CreateNet):
        with pytest.raises(RuntimeError, match=r"op #0 \(Sum\): \[enforce fail\] Sum takes 1 outputs, got 2"):
            run(net)
    inplace = core.Net("inplace")
    inplace.Softmax("a", "a")                                      # in-place rules too: memonger builds such nets
    with pytest.raises(RuntimeError, match="cannot write output 0 in place over input 0"):
        workspace.CreateNet(inplace)


# --------------------------------------------------------------------------------------------- ExtractPredictorNet
def training_net():
    net = core.Net("train")
    net.AddExternalInput("reader", "w", "b", "label")
    net.ConstantFill([], "data", shape=[2, 3])          # stands for the input op: before the first op reading data
    net.FC(["data", "w", "b"], "fc")
    net.Relu("fc", "pred")
    net.SoftmaxWithLoss(["pred", "label"], ["softmax", "loss"])
    net.AddExternalOutput("loss")
    return net


def test_extract_predictor_net_keeps_the_ops_between_inputs_and_outputs():
    net = training_net()
    before = net.Proto().SerializeToString()
    predict, params = ExtractPredictorNet(net.Proto(), ["data"], ["pred"], renames={"data": "image"},
                                          device=core.DeviceOption(caffe2_pb2.CPU))
    proto = predict.Proto()
    assert proto.name == "train_predict" and [op.type for op in proto.op] == ["FC", "Relu"]
    assert list(proto.op[0].input) == ["image", "w", "b"] and proto.op[0].HasField("device_option")
    assert list(proto.external_input) == ["image", "w", "b"] and list(proto.external_output) == ["pred"]
    assert params == ["b", "w"]
    assert net.Proto().SerializeToString() == before


def test_extract_predictor_net_refuses_what_it_cannot_extract():
    net = training_net()
    with pytest.raises(ValueError, match="no op of net 'train' reads the inputs"):
        ExtractPredictorNet(net.Proto(), ["nothing"], ["pred"])
    with pytest.raises(ValueError, match="no op of net 'train' writes the outputs"):
        ExtractPredictorNet(net.Proto(), ["data"], ["nothing"])
    net.Dropout("fc", "dropped", is_test=0)
    with pytest.raises(ValueError, match="has is_test=0"):
        ExtractPredictorNet(net.Proto(), ["data"], ["dropped"])
    skipped, _ = ExtractPredictorNet(net.Proto(), ["data"], ["pred"], disabled_inputs=["b"])
    assert [op.type for op in skipped.Proto().op] == []              # FC reads b, so nothing after it is known


# --------------------------------------------------------------------------------------------- cuda_gpu_id
def test_device_option_takes_caffe2s_older_field_name():
    """DeviceOption field 2 was cuda_gpu_id until 2018-08: with compat imported, that name reads and writes
    device_id (attribute, constructor keyword, HasField, ClearField) and the wire form is device_id's."""
    option = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU, cuda_gpu_id=3)
    assert option.device_id == 3 and option.cuda_gpu_id == 3 and option.HasField("cuda_gpu_id")
    op = caffe2_pb2.OperatorDef()
    op.device_option.cuda_gpu_id = 1
    assert op.device_option.device_id == 1
    assert op.device_option.SerializeToString() == caffe2_pb2.DeviceOption(device_id=1).SerializeToString()
    option.ClearField("cuda_gpu_id")
    assert not option.HasField("device_id")
    with pytest.raises(AttributeError, match="no \"cuda_gpu\" field"):
        option.cuda_gpu = 1          # any other unknown name still fails as protobuf's own error
    with pytest.raises(ValueError, match="both cuda_gpu_id and device_id"):
        caffe2_pb2.DeviceOption(cuda_gpu_id=1, device_id=2)
    assert core.DeviceOption(caffe2_pb2.CPU, 2).cuda_gpu_id == 2
