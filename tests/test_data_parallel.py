"""The data-parallel rewrite (stepnet.passes.data_parallel, ModelBuilder.data_parallel) in one process: where
its collectives go, that it leaves its input alone, that the saved plan carries them, and that alone (K = 1) the
data-parallel model trains exactly as the plain one. K ranks ≡ one process on the concatenated batch:
tests/mpi/test_jobs.py."""
import numpy as np
import pytest

from stepnet import Workspace, load, save
from stepnet.builders.builder import BlobRef
from stepnet.core.errors import GradientError, StepnetError
from stepnet.builders.model import ModelBuilder
from stepnet.passes import data_parallel as dp
from stepnet.io.proto import DeviceOption, OperatorDef

RNG = np.random.default_rng(3)
X, LABEL, IDS = RNG.normal(size=(6, 5)).astype(np.float32), RNG.integers(0, 3, 6).astype(np.int32), \
    RNG.integers(0, 9, 6).astype(np.int32)


def mlp(data_parallel=None, optimizer="adam", device=None):
    """FC-Relu-FC-Softmax-cross entropy; data_parallel: None (plain) or the fuse flag."""
    m = ModelBuilder("mlp")
    with m.device_scope(device):
        h = m.relu(m.fc(BlobRef("x"), "h", 5, 7), "hr")
        p = m.net.Softmax(m.fc(h, "y", 7, 3), "p")
        m.net.AveragedLoss(m.net.LabelCrossEntropy([p, BlobRef("label")], "xent"), "loss")
        m.add_gradient_ops(["loss"])
        if data_parallel is not None:
            m.data_parallel(fuse=data_parallel)
        getattr(m, optimizer)(0.05)
    return m


def embedding(data_parallel=None):
    """Gather from an embedding (a sparse gradient) + FC, updated with ScatterWeightedSum and SGD."""
    m = ModelBuilder("emb")
    table = m.create_param("table", [9, 4])
    rows = m.net.Gather([table, BlobRef("ids")], "rows")
    p = m.net.Softmax(m.fc(rows, "y", 4, 3), "p")
    m.net.AveragedLoss(m.net.LabelCrossEntropy([p, BlobRef("label")], "xent"), "loss")
    m.add_gradient_ops(["loss"])
    if data_parallel is not None:
        m.data_parallel(fuse=data_parallel)
    m.sgd(0.1, params=["y_w", "y_b"])
    g = m.param_to_grad[table]
    lr, one = BlobRef("SgdOptimizer_0_lr_cpu"), BlobRef("ONE_0_0")
    m.net.ScatterWeightedSum([table, one, g.indices, g.values, lr], table)
    return m


def train(m, steps=4, device="cpu"):
    ws = Workspace(seed=0, gpu="emulate" if device != "cpu" else None)
    ws.run_net_once(m.init_net.proto())
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in (("x", X), ("label", LABEL), ("ids", IDS)):
        ws.feed(name, value, device_option=do if name != "ids" else None)
    net = ws.create_net(m.net.proto())
    for _ in range(steps):
        net.run()
    return {p: ws.fetch(p) for p in m.params}


def types(net):
    return [op.type for op in net.op]


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_alone_it_trains_exactly_as_the_plain_model(fuse, optimizer):
    plain, parallel = train(mlp(None, optimizer)), train(mlp(fuse, optimizer))
    assert all(np.array_equal(plain[p], parallel[p]) for p in plain)


def test_sparse_gradients_are_gathered_and_train_as_the_plain_model():
    m = embedding(False)
    kinds = types(m.net.proto())
    assert kinds.count("MPIAllgather") == 2 and "ScatterWeightedSum" in kinds
    scatter = m.net.proto().op[kinds.index("ScatterWeightedSum")]
    assert list(scatter.input[2:4]) == ["ids_dp_gathered", "rows_grad_dp_gathered"]
    assert m.param_to_grad["table"] == ("ids_dp_gathered", "rows_grad_dp_gathered")
    plain, parallel = train(embedding()), train(embedding(False))
    assert all(np.array_equal(plain[p], parallel[p]) for p in plain)


def test_the_collectives_sit_between_the_backward_pass_and_the_optimizer(tmp_path):
    m = mlp(False, "sgd")
    init, net = types(m.init_net.proto()), types(m.net.proto())
    assert init[4:12] == ["MPICreateCommonWorld"] + ["MPIBroadcast"] * 4 + ["ConstantFill", "MPIAllreduce",
                                                                            "Reciprocal"]
    last_grad = max(i for i, op in enumerate(m.net.proto().op) if op.is_gradient_op)
    assert net[last_grad + 1:] == ["MPIAllreduce", "WeightedSum"] * 4 + ["AtomicIter", "LearningRate"] + \
        ["WeightedSum"] * 4
    assert {"dp_comm", "dp_grad_scale"} <= set(m.net.proto().external_input)
    save(m.to_plan(3), tmp_path / "plan.pbtxt")    # the rewrite shows in the saved plan, which runs
    saved = (tmp_path / "plan.pbtxt").read_text()
    assert saved.count('type: "MPIAllreduce"') == 5 and saved.count('type: "MPIBroadcast"') == 4
    ws = Workspace(seed=0)
    ws.feed("x", X)
    ws.feed("label", LABEL)
    ws.run_plan(load(tmp_path / "plan.pbtxt"))
    assert ws.fetch("dp_grad_scale").tolist() == [1.0]


def test_fused_gradients_take_one_allreduce():
    net = types(mlp(True, "sgd").net.proto())
    assert net.count("MPIAllreduce") == 1 and net.count("Concat") == 1 and net.count("Split") == 1
    assert net.count("Reshape") == 8


def test_the_input_nets_are_unchanged():
    m = mlp(None, "sgd")
    init, net = m.init_net.proto().SerializeToString(), m.net.proto().SerializeToString()
    dp.data_parallel(m.init_net.proto(), m.net.proto(), m.params, m.param_to_grad, fuse=True)
    assert (m.init_net.proto().SerializeToString(), m.net.proto().SerializeToString()) == (init, net)


def test_on_a_gpu_device_the_collectives_run_there():
    gpu = DeviceOption(device_type=1)
    m = mlp(False, "sgd", device=gpu)
    copies = [op for op in m.init_net.proto().op if op.type == "CopyCPUToGPU"]
    assert [c.output[0] for c in copies] == ["dp_grad_scale_gpu0"] and copies[0].device_option.device_type == 1
    reduce = [op for op in m.net.proto().op if op.type == "MPIAllreduce"]
    assert all(op.device_option.device_type == 1 for op in reduce)
    plain, parallel = train(mlp(None, "sgd", gpu), device="emulated"), train(m, device="emulated")
    assert all(np.array_equal(plain[p], parallel[p]) for p in plain)


def test_bad_uses():
    m = ModelBuilder("m")
    m.fc(BlobRef("x"), "y", 2, 2)
    with pytest.raises(StepnetError, match="call add_gradient_ops first"):
        m.data_parallel()
    m = mlp(False, "sgd")
    with pytest.raises(StepnetError, match="already creates 'dp_comm'"):
        m.data_parallel()
    m = mlp(None, "sgd")
    with pytest.raises(GradientError, match="gradient 'nothing' of parameter 'h_w' is made by no gradient op"):
        dp.data_parallel(m.init_net.proto(), m.net.proto(), m.params, {"h_w": "nothing"})
    m = mlp(None, "sgd")
    net = m.net.proto()
    last = max(i for i, op in enumerate(net.op) if op.is_gradient_op)   # FCGradient of h, after y's
    net.op.insert(last, OperatorDef(type="SumSqrElements", input=["y_w_grad"], output=["n"]))
    with pytest.raises(GradientError, match=r"op #\d+ \(SumSqrElements\) reads the gradient 'y_w_grad' before the "
                                            "backward pass ends"):
        dp.data_parallel(m.init_net.proto(), net, m.params, m.param_to_grad)
