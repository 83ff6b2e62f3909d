"""compat.workspace's Caffe2 API beyond blobs and nets: the "default" workspace after a reset, immediate mode,
SerializeBlob / DeserializeBlob, Predictor, GetOperatorCost (hand-computed costs) and the net transforms."""
import os

import numpy as np
import pytest

from stepnet import caffe2_pb2
from stepnet.compat import core, workspace
from stepnet.compat.state import reset


def test_default_exists_after_a_reset():
    reset()
    workspace.SwitchWorkspace("default")        # Caffe2's module makes it when it loads
    assert workspace.Workspaces() == ["default"]


# --------------------------------------------------------------------------------------------- immediate mode
def test_immediate_mode_runs_ops_in_a_workspace_of_its_own(capsys):
    workspace.StartImmediate(i_know=True)
    assert workspace.IsImmediate() and capsys.readouterr().out == ""
    folder = workspace._immediate_root_folder
    assert os.path.isdir(folder)
    core.CreateOperator("ConstantFill", [], ["c"], shape=[2], value=3.0)
    net = core.Net("imm")
    net.Scale("c", "d", scale=2.0)
    assert workspace.ImmediateBlobs() == ["c", "d"]
    assert workspace.FetchImmediate("d").tolist() == [6.0, 6.0]
    assert workspace.Blobs() == [] and workspace.CurrentWorkspace() == "default"
    assert workspace.FeedImmediate("e", np.arange(3)) and workspace.FetchImmediate("e").tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="blob 'nope' does not exist"):
        workspace.FetchImmediate("nope")
    with pytest.raises(RuntimeError, match="blob 'missing' does not exist"):
        net.Relu("missing", "r")                # an op that cannot run now fails as it is made
    workspace.StopImmediate()
    assert not workspace.IsImmediate() and workspace._immediate_root_folder == "" and not os.path.exists(folder)
    with pytest.raises(RuntimeError):
        workspace.FetchImmediate("c")
    core.CreateOperator("ConstantFill", [], ["c"], shape=[2])   # off again: nothing runs
    assert workspace.ImmediateBlobs() == [] and workspace.Blobs() == []


def test_immediate_mode_warns_unless_told_and_restarts_empty(capsys):
    workspace.StartImmediate()
    assert "Immediate mode is on" in capsys.readouterr().out
    workspace.FeedImmediate("a", np.ones(1))
    workspace.StartImmediate(i_know=True)
    assert workspace.ImmediateBlobs() == []
    reset()
    assert not workspace.IsImmediate()


# --------------------------------------------------------------------------------------------- serialization
@pytest.mark.parametrize("value", [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([3, -1], np.int64),
                                   np.array([True, False]), b"some bytes"])
def test_serialize_blob_is_a_blob_proto_and_deserializes_back(value):
    workspace.FeedBlob("x", value)
    data = workspace.SerializeBlob("x")
    proto = caffe2_pb2.BlobProto.FromString(data)
    assert proto.name == "x"
    if isinstance(value, np.ndarray):
        assert proto.HasField("tensor") and list(proto.tensor.dims) == list(value.shape)
        assert proto.tensor.device_detail.device_type == caffe2_pb2.CPU
    workspace.DeserializeBlob("y", data)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), value)
    if isinstance(value, np.ndarray):
        assert workspace.FetchBlob("y").dtype == value.dtype


def test_serialize_refuses_missing_and_malformed():
    with pytest.raises(RuntimeError, match="blob 'nope' does not exist"):
        workspace.SerializeBlob("nope")
    with pytest.raises(RuntimeError, match="not a serialized BlobProto"):
        workspace.DeserializeBlob("y", b"\xff\xff\xff")
    assert not workspace.HasBlob("y")


# --------------------------------------------------------------------------------------------- Predictor
def predictor_nets():
    init = core.Net("init")
    init.GivenTensorFill([], "w", shape=[2, 3], values=[1.0, 2.0, 3.0, 0.0, 0.0, 1.0])
    init.ConstantFill([], "b", shape=[2], value=0.5)
    predict = core.Net("predict")
    predict.AddExternalInput("x", "w", "b")
    predict.FC(["x", "w", "b"], "y")
    predict.AddExternalOutput("y")
    return init, predict


def test_predictor_runs_on_inputs_by_position_or_name():
    init, predict = predictor_nets()
    workspace.FeedBlob("keep", np.ones(1))
    p = workspace.Predictor(init.Proto(), predict.Proto())
    x = np.array([[1.0, 1.0, 1.0], [0.0, 2.0, 0.0]], np.float32)
    want = [[6.5, 1.5], [4.5, 0.5]]                     # x @ w.T + b, by hand
    (y,) = p.run([x])
    np.testing.assert_allclose(y, want)
    np.testing.assert_allclose(p.run({"x": 2 * x})[0], [[12.5, 2.5], [8.5, 0.5]])
    assert "w" not in workspace.Blobs() and workspace.HasBlob("keep")   # its parameters stay its own
    with pytest.raises(RuntimeError, match="must be a numpy array"):
        p.run([[1.0, 2.0, 3.0]])
    with pytest.raises(RuntimeError, match="4 inputs given, but the predict net .predict. has 3"):
        p.run([x, x, x, x])


def test_predictor_sees_the_current_blobs():
    init, predict = predictor_nets()
    workspace.FeedBlob("x", np.ones((1, 3), np.float32))
    p = workspace.Predictor(workspace.StringifyProto(init), workspace.StringifyProto(predict))
    np.testing.assert_allclose(p.run([])[0], [[6.5, 1.5]])


# --------------------------------------------------------------------------------------------- operator cost
def cost(op_type, shapes, **args):
    names = [f"in{i}" for i in range(len(shapes))]
    for name, shape in zip(names, shapes):
        workspace.FeedBlob(name, np.zeros(shape, np.float32))
    op = core.CreateOperator(op_type, names, ["out"], **args)
    return workspace.GetOperatorCost(op.SerializeToString(), names)


def test_conv_cost_counts_output_positions_kernel_and_channels():
    # Y is 2 x 4 x 3 x 3 ((5 + 2 - 3) // 2 + 1 = 3): 2 * 9 positions * 9 taps * 3 in * 4 out * 2 flops
    assert cost("Conv", [(2, 3, 5, 5), (4, 3, 3, 3)], stride=2, pad=1, kernel=3) == (3888, 2 * 4 * 9 * 4)
    assert cost("Conv", [(2, 5, 5, 3), (4, 3, 3, 3)], stride=2, pad=1, kernel=3, order="NHWC") == (3888, 288)
    assert cost("Conv2D", [(1, 8, 8, 8), (1, 1, 3, 3)], pad=1, kernel=3) == (1152, 256)   # channels unchecked
    assert cost("Conv", [(1, 1, 2, 4, 4), (2, 1, 1, 3, 3)])[0] == 1 * 2 * 2 * 2 * 9 * 1 * 2 * 2


def test_fc_sum_and_pointwise_costs():
    assert cost("FC", [(3, 5), (4, 5), (4,)]) == (2 * 5 * 3 * 4 + 12, 48)
    assert cost("FCTransposed", [(3, 5), (5, 4), (4,)]) == (132, 48)
    assert cost("FC", [(3, 2, 5), (4, 10), (4,)], axis=1) == (2 * 10 * 3 * 4 + 12, 48)
    assert cost("Sum", [(2, 3)] * 3) == (12, 24)
    assert cost("Mul", [(2, 3), (2, 3)]) == (6, 24)


def test_cost_refuses_ops_caffe2_has_no_cost_for():
    with pytest.raises(RuntimeError, match="no cost inference for Relu"):
        cost("Relu", [(2, 3)])
    with pytest.raises(RuntimeError, match="blob 'in1' does not exist"):
        workspace.FeedBlob("in0", np.zeros(3))
        workspace.GetOperatorCost(core.CreateOperator("FC", ["in0", "in1", "b"], ["y"]), ["in0", "in1"])


# --------------------------------------------------------------------------------------------- transforms
def conv_net():
    net = core.Net("convs")
    net.Conv(["x", "w", "b"], "y", kernel=3, engine="CUDNN")
    net.Conv(["x", "w", "b"], "y2", kernel=3, device_option=core.DeviceOption(caffe2_pb2.CUDA, 0))
    net.Conv2D(["x", "w", "b"], "y3", kernel=3)
    net.Relu("y", "z")
    return net


def test_conv_to_nnpack_sets_the_engine_of_cpu_convs_only():
    net = conv_net()
    before = net.Proto().SerializeToString()
    new = workspace.ApplyTransform("ConvToNNPack", net.Proto())
    assert [op.engine for op in new.op] == ["NNPACK", "", "", ""]
    assert [op.type for op in new.op] == [op.type for op in net.Proto().op]
    assert net.Proto().SerializeToString() == before          # the given net is not changed
    with pytest.raises(RuntimeError, match="Transform not found in registry: 'ConvToNNpack'.*ConvToNNPack"):
        workspace.ApplyTransform("ConvToNNpack", net.Proto())


def test_apply_transform_if_faster_keeps_the_original_unless_faster():
    init = core.Net("init")
    init.ConstantFill([], "x", shape=[1, 2, 5, 5], value=1.0)
    init.ConstantFill([], "w", shape=[3, 2, 3, 3], value=1.0)
    init.ConstantFill([], "b", shape=[3], value=0.0)
    net = core.Net("conv")
    net.Conv(["x", "w", "b"], "y", kernel=3)
    kept = workspace.ApplyTransformIfFaster("ConvToNNPack", net.Proto(), init.Proto(), warmup_runs=0,
                                            main_runs=2, improvement_threshold=1e9)
    assert kept == net.Proto() and kept is not net.Proto()
    assert workspace.Blobs() == []                              # timed in workspaces of its own
    taken = workspace.ApplyTransformIfFaster("ConvToNNPack", net.Proto(), init.Proto(), main_runs=2,
                                             improvement_threshold=0.0)
    assert taken.op[0].engine == "NNPACK"
    with pytest.raises(RuntimeError, match="main runs should be positive"):
        workspace.ApplyTransformIfFaster("ConvToNNPack", net.Proto(), init.Proto(), main_runs=0)


def test_the_later_caffe2_names_of_the_gpu_queries():
    """PyTorch-era Caffe2 programs (DLRM) ask workspace.GpuDeviceType and NumGpuDevices()."""
    from stepnet import caffe2_pb2
    assert workspace.GpuDeviceType == caffe2_pb2.CUDA
    assert workspace.NumGpuDevices() == workspace.NumCudaDevices()


def test_infer_shapes_from_dimensions_takes_softmax_labels_as_caffe2_does():
    """Given dimensions alone, Caffe2 takes every blob for float and its SoftmaxWithLoss inference never looks
    at the labels: the shapes come out, no dtype error (caffe2/operators/softmax_with_loss_op.cc)."""
    net = core.Net("swl")
    net.SoftmaxWithLoss(["logits", "label"], ["softmax", "loss"])
    shapes, types = workspace.InferShapesAndTypes([net], {"logits": [4, 10], "label": [4]})
    assert shapes["softmax"] == [4, 10] and shapes["loss"] == []
    assert types["softmax"] == caffe2_pb2.TensorProto.FLOAT and types["loss"] == caffe2_pb2.TensorProto.FLOAT
