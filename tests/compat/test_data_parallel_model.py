"""compat.data_parallel_model on K CPU devices in one process: the gradients every device ends with are the
float64 numpy gradient of the mean loss over the whole batch (K devices with B/K rows each = one device with B
rows), the init net makes every device's parameters equal, SGD on K devices follows one device, BMUF's block
update follows its formula, checkpoint helpers, memonger inside, and a small ResNet whose loss falls."""
import numpy as np
import pytest

from stepnet.compat import brew, core, data_parallel_model as dpm, data_parallel_model_utils as dpm_utils
from stepnet.compat import model_helper, optimizer, workspace
from stepnet.compat.state import reset
from stepnet.io.proto import NetDef

B, D = 8, 5
RNG = np.random.RandomState(7)
X = RNG.rand(B, D)
Y = np.round(X[:, 0])
W0, B0 = RNG.randn(1, D) * 0.5, np.array([0.1])


def build(model, loss_scale):
    fc = brew.fc(model, "data", "fc", dim_in=D, dim_out=1)
    sigm = model.net.Sigmoid(model.net.FlattenToVec(fc, "fc_fl"), "sigm")
    loss = model.net.AveragedLoss(model.net.SquaredL2Distance([sigm, "label"], "sq"), "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def make(devices, update=None, **kwargs):
    model = model_helper.ModelHelper(name=f"dp{len(devices)}")
    if update is None and "optimizer_builder_fun" not in kwargs:
        kwargs["param_update_builder_fun"] = lambda m: None
    elif update is not None:
        kwargs["param_update_builder_fun"] = update
    dpm.Parallelize(model, input_builder_fun=lambda m: None, forward_pass_builder_fun=build, devices=devices,
                    cpu_device=True, **kwargs)
    return model


def feed(model, x=X, y=Y):
    per = B // len(model._devices)
    for j, d in enumerate(model._devices):
        workspace.FeedBlob(f"cpu_{d}/data", x[j * per:(j + 1) * per].astype(np.float32))
        workspace.FeedBlob(f"cpu_{d}/label", y[j * per:(j + 1) * per].astype(np.float32))


def start(model):
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob(f"cpu_{model._devices[0]}/fc_w", W0.astype(np.float32))
    workspace.FeedBlob(f"cpu_{model._devices[0]}/fc_b", B0.astype(np.float32))
    dpm.FinalizeAfterCheckpoint(model)       # the first device's values to every device
    workspace.CreateNet(model.net)


def reference_grads(w, b, x=X, y=Y):
    """Gradient of mean_n 0.5 (sigmoid(x_n.w + b) - y_n)^2, in float64."""
    a = 1 / (1 + np.exp(-(x @ w.T + b)))[:, 0]
    d = (a - y) * a * (1 - a) / len(x)
    return (d @ x)[None, :], np.array([d.sum()])


@pytest.mark.parametrize("devices", [[0], [0, 1], [0, 1, 2, 3], [1, 3]])
def test_gradients_equal_one_device_with_the_whole_batch(devices):
    model = make(devices)
    feed(model)
    start(model)
    workspace.RunNet(model.net)
    gw, gb = reference_grads(W0, B0)
    for d in devices:
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{d}/fc_w_grad"), gw, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{d}/fc_b_grad"), gb, rtol=1e-4, atol=1e-7)
    sums = [op for op in model.net.Proto().op if op.type == "Sum" and op.name == "dpm"]
    assert len(sums) == (0 if len(devices) == 1 else 2)     # per gradient: one Sum of the CPU devices' blobs


def test_broken_allreduce_is_caught():
    model = make([0, 1])
    proto = model.net.Proto()
    kept = [op for op in proto.op if not (op.type == "Sum" and op.name == "dpm")]
    del proto.op[:]
    proto.op.extend(kept)
    feed(model)
    start(model)
    workspace.RunNet(model.net)
    gw, _ = reference_grads(W0, B0)
    assert not np.allclose(workspace.FetchBlob("cpu_0/fc_w_grad"), gw, rtol=1e-4, atol=1e-7)


def test_init_net_syncs_parameters():
    model = make([0, 1, 2])
    workspace.RunNetOnce(model.param_init_net)
    w0 = workspace.FetchBlob("cpu_0/fc_w")
    for d in (1, 2):
        np.testing.assert_array_equal(workspace.FetchBlob(f"cpu_{d}/fc_w"), w0)
    assert model._device_grouped_blobs["fc_w"] == {d: f"cpu_{d}/fc_w" for d in (0, 1, 2)}


def sgd_reference(steps, lr):
    w, b = W0.copy(), B0.copy()
    for _ in range(steps):
        gw, gb = reference_grads(w, b)
        w, b = w - lr * gw, b - lr * gb
    return w, b


@pytest.mark.parametrize("devices, memonger", [([0], False), ([0, 1], False), ([0, 1], True), ([0, 1, 2, 3], False)])
def test_sgd_on_k_devices_follows_one(devices, memonger):
    model = make(devices, optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.5, policy="fixed"),
                 optimize_gradient_memory=memonger)
    feed(model)
    start(model)
    for _ in range(3):
        workspace.RunNet(model.net)
    w, b = sgd_reference(3, 0.5)
    for d in devices:
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{d}/fc_w"), w, rtol=1e-4)
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{d}/fc_b"), b, rtol=1e-4)
    assert dpm.GetLearningRateBlobNames(model) == ["SgdOptimizer_0_lr_cpu"]
    checkpoint = {str(b) for b in dpm.GetCheckpointParams(model)}
    assert {"cpu_0/fc_w", "cpu_0/fc_b", "optimizer_iteration"} <= checkpoint
    assert not any(c.startswith("cpu_1/") for c in checkpoint)


def test_shared_model_updates_the_master_parameters():
    model = make([0, 1], optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.5, policy="fixed"),
                 shared_model=True)
    assert not any(o.startswith("cpu_1/fc_") for op in model.param_init_net.Proto().op for o in op.output)
    feed(model)
    workspace.RunNetOnce(model.param_init_net)
    workspace.FeedBlob("cpu_0/fc_w", W0.astype(np.float32))
    workspace.FeedBlob("cpu_0/fc_b", B0.astype(np.float32))
    workspace.CreateNet(model.net)
    for _ in range(2):
        workspace.RunNet(model.net)
    w, b = sgd_reference(2, 0.5)
    np.testing.assert_allclose(workspace.FetchBlob("cpu_0/fc_w"), w, rtol=1e-4)


def test_bmuf_block_update():
    model = model_helper.ModelHelper(name="bmuf")

    def update(m):
        lr = m.net.LearningRate([brew.iter(m, "ITER")], "LR", base_lr=-0.5, policy="fixed")
        one = m.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
        for p in m.GetParams():
            m.WeightedSum([p, one, m.param_to_grad[p], lr], p)

    dpm.Parallelize_BMUF(model, lambda m: None, build, update, devices=[0, 1], cpu_device=True)
    feed(model)
    dpm.RunInitNet(model)
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_0/fc_w_v"), np.zeros((1, D), np.float32))
    g0 = workspace.FetchBlob("cpu_0/fc_w_g").copy()
    workspace.RunNet(model.net.Proto().name)
    locals_ = [workspace.FetchBlob(f"cpu_{d}/fc_w").copy() for d in (0, 1)]
    workspace.RunNetOnce(model._global_model_param_updates_net)
    v = 0.5 * 0 + ((locals_[0] + locals_[1]) / 2 - g0)          # block_momentum 1 - 1/2, learning rate 1
    np.testing.assert_allclose(workspace.FetchBlob("cpu_0/fc_w_v"), v, rtol=1e-5, atol=1e-7)
    for d in (0, 1):
        np.testing.assert_allclose(workspace.FetchBlob(f"cpu_{d}/fc_w"), g0 + v, rtol=1e-5, atol=1e-7)


def test_convert_net_for_device_and_activations():
    other = model_helper.ModelHelper(name="other")
    brew.fc(other, "data", "o_fc", dim_in=3, dim_out=2)
    converted = dpm.ConvertNetForDevice(other.net, core.DeviceOption(0, 2))
    op = converted.Proto().op[0]
    assert list(op.input) == ["cpu_2/data", "cpu_2/o_fc_w", "cpu_2/o_fc_b"] and op.device_option.device_id == 2
    assert other.net.Proto().op[0].input[0] == "data"
    model = make([0, 1])
    assert dpm_utils.GetActivationBlobs(model) == ["fc", "fc_fl", "sigm", "sq", "loss", "loss_scaled"]
    assert isinstance(model.net.Proto(), NetDef)


def test_device_scope_is_refused():
    with core.DeviceScope(core.DeviceOption(1, 0)):
        with pytest.raises(AssertionError):
            dpm.Parallelize_GPU(None, None, None)


def resnet_block(model, x, channels, name):
    h = brew.conv(model, x, f"{name}_c1", channels, channels, 3, pad=1)
    h = brew.spatial_bn(model, h, f"{name}_bn1", channels, epsilon=1e-3, is_test=False)
    h = brew.relu(model, h, f"{name}_r1")
    h = brew.conv(model, h, f"{name}_c2", channels, channels, 3, pad=1)
    return brew.relu(model, brew.sum(model, [h, x], f"{name}_sum"), f"{name}_out")


def test_small_resnet_trains_on_cpu_devices(monkeypatch):
    # seeded: the weights' random fills are drawn afresh on each run, as Caffe2 draws them, and one draw in many
    # learns more slowly than the check asks (seeds 0-29 all pass; one unseeded CI run reached 0.51 of its start)
    monkeypatch.setenv("STEPNET_SEED", "3")
    reset()
    rng = np.random.RandomState(3)
    images = rng.randn(8, 2, 6, 6).astype(np.float32)
    labels = (images[:, 0].mean(axis=(1, 2)) > 0).astype(np.int32)

    def forward(model, loss_scale):
        h = brew.relu(model, brew.conv(model, "data", "conv0", 2, 4, 3, pad=1), "relu0")
        h = resnet_block(model, h, 4, "res1")
        h = brew.average_pool(model, h, "pool", kernel=6)
        pred = brew.softmax(model, brew.fc(model, h, "pred", dim_in=4, dim_out=2), "softmax")
        loss = model.net.AveragedLoss(model.net.LabelCrossEntropy([pred, "label"], "xent"), "loss")
        return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    model = model_helper.ModelHelper(name="resnet")
    dpm.Parallelize_CPU(model, input_builder_fun=lambda m: None, forward_pass_builder_fun=forward,
                        optimizer_builder_fun=lambda m: optimizer.build_sgd(m, 0.2, policy="fixed", momentum=0.9),
                        devices=[0, 1])
    for d in (0, 1):
        workspace.FeedBlob(f"cpu_{d}/data", images[4 * d:4 * d + 4])
        workspace.FeedBlob(f"cpu_{d}/label", labels[4 * d:4 * d + 4])
    dpm.RunInitNet(model)
    losses = []
    for _ in range(20):
        dpm.RunNet(model, 1)
        losses.append(sum(float(workspace.FetchBlob(f"cpu_{d}/loss")) for d in (0, 1)) / 2)
    assert losses[-1] < 0.5 * losses[0] and losses[-1] < min(losses[:5]), losses
    np.testing.assert_array_equal(workspace.FetchBlob("cpu_0/conv0_w"), workspace.FetchBlob("cpu_1/conv0_w"))


def test_a_sparse_gradient_is_gathered_from_every_device():
    """An embedding each device holds (a data-parallel parameter read by Gather): after the all-gather every
    device has the indices and values of all K devices' sparse gradients (each row once, paired with its index),
    and the values are the float64 gradient of the mean loss over the whole batch. Device j reads
    ids[j*per:(j+1)*per]. As in Caffe2, only GPU devices gather slices (CPU devices refuse them): the CUDA-tagged
    ops run on the CPU here, where no GPU is."""
    V, E = 6, 3
    vecs = RNG.randn(V, E).astype(np.float32)
    ids = np.array([1, 4, 4, 0, 5, 2, 1, 3], np.int32)
    target = RNG.rand(B).astype(np.float32)

    def build_sparse(model, loss_scale):
        table = model.param_init_net.GivenTensorFill([], "vecs", shape=[V, E], values=vecs.ravel().tolist())
        model.params.append(table)
        gathered = model.net.Gather([table, "ids"], "gathered")
        summed = model.net.ReduceFrontSum(model.net.Transpose(gathered, "t", axes=[1, 0]), "summed")
        loss = model.net.AveragedLoss(model.net.SquaredL2Distance([summed, "target"], "sq"), "loss")
        return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]

    devices = [0, 1]
    model = model_helper.ModelHelper(name="sparse")
    dpm.Parallelize(model, input_builder_fun=lambda m: None, forward_pass_builder_fun=build_sparse,
                    param_update_builder_fun=lambda m: None, devices=devices, cpu_device=False)
    per = B // len(devices)
    for j, d in enumerate(devices):
        workspace.FeedBlob(f"gpu_{d}/ids", ids[j * per:(j + 1) * per])
        workspace.FeedBlob(f"gpu_{d}/target", target[j * per:(j + 1) * per])
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    # float64: d/dvecs of mean_n 0.5 (sum_e vecs[ids_n, e] - target_n)^2, per row n: (s_n - t_n) / B
    s = vecs.astype(np.float64)[ids].sum(axis=1)
    want_values = np.repeat(((s - target) / B)[:, None], E, axis=1)
    want = np.lexsort((want_values[:, 0], ids))
    for d in devices:
        grad = model.param_to_grad[core.BlobReference(f"gpu_{d}/vecs")]
        got_idx = workspace.FetchBlob(str(grad.indices)).reshape(-1)
        got_val = workspace.FetchBlob(str(grad.values)).reshape(-1, E)
        assert got_idx.shape == (B,) and got_val.shape == (B, E)    # all devices' rows
        got = np.lexsort((got_val[:, 0], got_idx))
        assert got_idx[got].tolist() == ids[want].tolist()
        np.testing.assert_allclose(got_val[got], want_values[want], rtol=1e-5, atol=1e-7)
