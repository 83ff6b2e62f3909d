"""ModelBuilder (stepnet/builders/model.py): parameters, layer helpers, gradients, Caffe2's optimizer op sequences and
blob names, global-norm clipping, plans that `stepnet run` trains, and bad input. The training numbers are
checked against an independent float64 numpy model of the same updates (Caffe2's formulas)."""
import math
import re

import numpy as np
import pytest

from stepnet import Workspace
from stepnet.cli import run as cli
from stepnet.io import proto
from stepnet.builders.builder import NetBuilder
from stepnet.core.errors import ArgumentError, ShapeError, StepnetError
from stepnet.builders.model import ModelBuilder
from stepnet.io.proto import DeviceOption, argument_value

rng = np.random.default_rng(5)
N, D, K = 6, 3, 2
X = rng.standard_normal((N, D)).astype(np.float32)
T = rng.standard_normal((N, K)).astype(np.float32)
W0 = rng.standard_normal((K, D)).astype(np.float32)
B0 = rng.standard_normal(K).astype(np.float32)


def args_of(op) -> dict:
    """Arguments by name; floats (stored as float32) shown to float32 precision."""
    def shown(v):
        return float(f"{v:.7g}") if isinstance(v, float) else v
    return {a.name: shown(argument_value(a)) for a in op.arg}


def ops(net) -> list:
    return list(net.proto().op)


def given(values) -> tuple:
    return ("GivenTensorFill", {"values": np.asarray(values, np.float32).reshape(-1).tolist()})


def regression(name="m", extra_param=False) -> tuple:
    """y = FC(x); loss = mean over rows of 0.5 |y - t|^2, with data and weights fixed in the init net."""
    m = ModelBuilder(name)
    x = m.init_net.GivenTensorFill([], "x", shape=[N, D], values=X.reshape(-1).tolist())
    t = m.init_net.GivenTensorFill([], "t", shape=[N, K], values=T.reshape(-1).tolist())
    y = m.fc(x, "y", D, K, weight_init=given(W0), bias_init=given(B0))
    if extra_param:
        m.create_param("unused_w", [2, 2])
    loss = m.net.AveragedLoss(m.net.SquaredL2Distance([y, t], "dist"), "loss")
    return m, loss


# ------------------------------------------------------------ reference
def grads_ref(W, b):
    """d loss / d W, d loss / d b for loss = (1/N) sum_i 0.5 |W x_i + b - t_i|^2."""
    x, t = X.astype(np.float64), T.astype(np.float64)
    dW, db = np.zeros_like(W), np.zeros_like(b)
    for i in range(N):
        r = W @ x[i] + b - t[i]
        dW += np.outer(r, x[i]) / N
        db += r / N
    return dW, db


def train_ref(kind, steps, lr, clip=None, **h):
    """The parameters after `steps` updates, by Caffe2's update formulas (iteration counter starts at 1)."""
    p = [W0.astype(np.float64), B0.astype(np.float64)]
    state = [[np.zeros_like(q), np.zeros_like(q)] for q in p]
    for it in range(1, steps + 1):
        g = list(grads_ref(*p))
        rate = lr
        if clip is not None:
            norm = math.sqrt(sum(float((q ** 2).sum()) for q in g))
            rate = lr * clip / max(norm, clip)
        for q, gq, s in zip(p, g, state, strict=True):
            if kind == "sgd":
                q -= rate * gq
            elif kind == "momentum":  # nesterov: the step is (1 + mu) m_new - mu m
                mu = h["momentum"]
                new = mu * s[0] + rate * gq
                q -= (1 + mu) * new - mu * s[0]
                s[0] = new
            elif kind == "adagrad":
                s[0] = s[0] + gq * gq
                q -= rate * gq / (np.sqrt(s[0]) + h["epsilon"])
            elif kind == "adam":  # Caffe2's Adam uses t = iteration + 1
                b1, b2, t = h["beta1"], h["beta2"], it + 1
                s[0] = b1 * s[0] + (1 - b1) * gq
                s[1] = b2 * s[1] + (1 - b2) * gq * gq
                q -= rate * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * s[0] / (np.sqrt(s[1]) + h["epsilon"])
    return p


OPTIMIZERS = [
    ("sgd", dict(), {}),
    ("momentum", dict(momentum=0.9), {"momentum": 0.9}),
    ("adagrad", dict(epsilon=1e-4), {"epsilon": 1e-4}),
    ("adam", dict(beta1=0.9, beta2=0.999, epsilon=1e-8), {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
]


def build_optimizer(m, kind, lr, kwargs, clip=None):
    if kind in ("sgd", "momentum"):
        m.sgd(lr, clip_gradient_norm=clip, **kwargs)
    else:
        getattr(m, kind)(lr, clip_gradient_norm=clip, **kwargs)


def trained(kind, kwargs, steps, lr, clip=None):
    m, loss = regression()
    m.add_gradient_ops([loss])
    build_optimizer(m, kind, lr, kwargs, clip)
    ws = Workspace()
    ws.run_plan(m.to_plan(steps))
    return ws


# ------------------------------------------------------------ params, layers
def test_create_param_scopes_reuses_and_checks_shape():
    m = ModelBuilder("m")
    with m.name_scope("enc"):
        w = m.create_param("w", [3, 2])
        assert m.create_param("w", (3, 2)) == w == "enc/w"
        with pytest.raises(ShapeError, match=r"'enc/w' exists with shape \(3, 2\).*shape \(2, 3\)"):
            m.create_param("w", [2, 3])
    m.create_param("stats", [4], ("ConstantFill", {"value": 0.0}), trainable=False)
    fills = ops(m.init_net)
    assert [(op.type, op.output[0], args_of(op)["shape"]) for op in fills] == [
        ("XavierFill", "enc/w", [3, 2]), ("ConstantFill", "stats", [4])]
    assert m.params == ["enc/w"] and m.param_shapes == {"enc/w": (3, 2), "stats": (4,)}
    assert m.net.external_inputs == ["enc/w", "stats"]


def test_layer_helpers_make_caffe2s_ops_and_params():
    m = ModelBuilder("m")
    h = m.fc("data", "fc", 4, 5, axis=1)
    a = m.relu(h)
    c = m.conv("img", "conv", 3, 8, 3, pad=1)
    p = m.max_pool(c, "pool", kernel=2, stride=2)
    bn = m.spatial_bn(p, "bn", 8)
    d = m.dropout(a, "drop", ratio=0.3)
    m.dropout(a, "drop_test", is_test=True)
    s = m.softmax(d)
    got = [(op.type, list(op.input), list(op.output)) for op in ops(m.net)]
    assert got == [
        ("FC", ["data", "fc_w", "fc_b"], ["fc"]),
        ("Relu", ["fc"], ["m/Relu"]),
        ("Conv", ["img", "conv_w", "conv_b"], ["conv"]),
        ("MaxPool", ["conv"], ["pool"]),
        ("SpatialBN", ["pool", "bn_s", "bn_b", "bn_rm", "bn_riv"],
         ["bn", "bn_rm", "bn_riv", "bn_sm", "bn_siv"]),
        ("Dropout", ["m/Relu"], ["drop", "drop_mask"]),
        ("Dropout", ["m/Relu"], ["drop_test"]),
        ("Softmax", ["drop"], ["m/Softmax"]),
    ]
    assert (a, s, bn) == ("m/Relu", "m/Softmax", "bn")
    assert m.param_shapes == {"fc_w": (5, 4), "fc_b": (5,), "conv_w": (8, 3, 3, 3), "conv_b": (8,),
                              "bn_s": (8,), "bn_b": (8,), "bn_rm": (8,), "bn_riv": (8,)}
    assert m.params == ["fc_w", "fc_b", "conv_w", "conv_b", "bn_s", "bn_b"]
    conv = ops(m.net)[2]
    assert args_of(conv) == {"kernel": 3, "order": "NCHW", "pad": 1}


def test_fc_without_a_name_gets_a_scoped_net_blob_name():
    m = ModelBuilder("m")
    with m.name_scope("s"):
        out = m.fc("x", None, 2, 3)
    assert out == "s/m_blob_0" and m.params == ["s/m_blob_0_w", "s/m_blob_0_b"]


def test_a_param_model_shares_the_weights():
    train = ModelBuilder("train")
    train.fc("x", "fc", 2, 3)
    test = ModelBuilder("test", param_model=train)
    test.fc("x2", "fc", 2, 3)
    assert test.init_net is train.init_net and len(ops(train.init_net)) == 2
    assert list(ops(test.net)[0].input) == ["x2", "fc_w", "fc_b"] and test.params == ["fc_w", "fc_b"]


def test_forward_of_the_helpers_runs():
    m, loss = regression()
    ws = Workspace()
    ws.run_net_once(m.init_net.proto())
    ws.run_net_once(m.net.proto())
    want = sum(0.5 * float(((W0.astype(np.float64) @ X[i] + B0 - T[i]) ** 2).sum()) for i in range(N)) / N
    np.testing.assert_allclose(ws.fetch(loss), want, rtol=1e-5)


# ------------------------------------------------------------ gradients
def test_add_gradient_ops_fills_param_to_grad():
    m, loss = regression(extra_param=True)
    grads = m.add_gradient_ops(loss)
    assert m.param_to_grad == {"y_w": "y_w_grad", "y_b": "y_b_grad"}
    assert grads["loss"] == "loss_autogen_grad" and m.params_without_grad == ["unused_w"]
    with pytest.raises(StepnetError, match="add_gradient_ops was already called"):
        m.add_gradient_ops([loss])
    ws = Workspace()
    ws.run_net_once(m.init_net.proto())
    ws.run_net_once(m.net.proto())
    dW, db = grads_ref(W0.astype(np.float64), B0.astype(np.float64))
    np.testing.assert_allclose(ws.fetch("y_w_grad"), dW, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ws.fetch("y_b_grad"), db, rtol=1e-4, atol=1e-6)


def test_a_loss_that_is_not_a_scalar_is_refused_when_its_shape_is_known():
    m, _ = regression()
    with pytest.raises(ShapeError, match=r"loss 'dist' has shape \(6,\), not a scalar.*AveragedLoss"):
        m.add_gradient_ops(["dist"])
    assert not m.gradient_ops_added and not any(op.type.endswith("Gradient") for op in ops(m.net))
    fed = ModelBuilder("fed")
    dist = fed.net.SquaredL2Distance(["a", "b"], "dist")
    with pytest.raises(ShapeError, match=r"'dist' has shape \(4,\)"):
        fed.add_gradient_ops([dist], shapes={"a": (4, 2), "b": (4, 2)})


def test_a_loss_of_unknown_shape_differentiates_the_sum():
    """Without known shapes the check cannot run: Caffe2's seed, ConstantFill(loss, value=1), has the
    loss's shape, so the gradient is the one of the sum of its elements."""
    m = ModelBuilder("fed")
    dist = m.net.SquaredL2Distance(["a", "b"], "dist")
    grads = m.add_gradient_ops([dist])
    a, b = rng.standard_normal((4, 2)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    ws = Workspace()
    ws.feed("a", a)
    ws.feed("b", b)
    ws.run_net_once(m.net.proto())
    np.testing.assert_array_equal(ws.fetch("dist_autogen_grad"), np.ones(4, np.float32))
    np.testing.assert_allclose(ws.fetch(grads["a"]), a - b, rtol=1e-6)  # d/da sum_i 0.5 |a_i - b_i|^2
    m2 = ModelBuilder("explicit")  # a given gradient skips the check
    m2.net.SquaredL2Distance(["a", "b"], "dist")
    m2.add_gradient_ops({"dist": "dist_grad_in"}, shapes={"a": (4, 2), "b": (4, 2)})


# ------------------------------------------------------------ optimizer ops
def test_sgd_op_sequence_and_names():
    m, loss = regression()
    m.add_gradient_ops([loss])
    n_init, n_net = len(ops(m.init_net)), len(ops(m.net))
    m.sgd(0.1)
    init, net = ops(m.init_net)[n_init:], ops(m.net)[n_net:]
    assert [(op.type, list(op.input), list(op.output)) for op in init] == [
        ("ConstantFill", [], ["optimizer_iteration"]), ("CreateMutex", [], ["iteration_mutex"]),
        ("ConstantFill", [], ["ONE_0_0"])]
    assert args_of(init[0]) == {"shape": [1], "value": 0, "dtype": 10}
    assert init[0].device_option == DeviceOption(device_type=0) == init[1].device_option
    assert args_of(init[2]) == {"shape": [1], "value": 1.0}
    assert [(op.type, list(op.input), list(op.output)) for op in net] == [
        ("AtomicIter", ["iteration_mutex", "optimizer_iteration"], ["optimizer_iteration"]),
        ("LearningRate", ["optimizer_iteration"], ["SgdOptimizer_0_lr_cpu"]),
        ("WeightedSum", ["y_w", "ONE_0_0", "y_w_grad", "SgdOptimizer_0_lr_cpu"], ["y_w"]),
        ("WeightedSum", ["y_b", "ONE_0_0", "y_b_grad", "SgdOptimizer_0_lr_cpu"], ["y_b"])]
    assert args_of(net[1]) == {"base_lr": -0.1, "policy": "fixed"}  # negative: WeightedSum adds it


def test_momentum_sgd_has_a_positive_lr():
    m, loss = regression()
    m.add_gradient_ops([loss])
    n_init, n_net = len(ops(m.init_net)), len(ops(m.net))
    m.sgd(0.1, momentum=0.9, policy="step", stepsize=10, gamma=0.5)
    init, net = ops(m.init_net)[n_init:], ops(m.net)[n_net:]
    assert [(op.type, list(op.input), list(op.output)) for op in init[3:]] == [
        ("ConstantFill", ["y_w"], ["y_w_momentum"]), ("ConstantFill", ["y_b"], ["y_b_momentum"])]
    assert args_of(net[1]) == {"base_lr": 0.1, "policy": "step", "stepsize": 10, "gamma": 0.5}
    assert [(op.type, list(op.input), list(op.output)) for op in net[2:]] == [
        ("MomentumSGDUpdate", ["y_w_grad", "y_w_momentum", "SgdOptimizer_0_lr_cpu", "y_w"],
         ["y_w_grad", "y_w_momentum", "y_w"]),
        ("MomentumSGDUpdate", ["y_b_grad", "y_b_momentum", "SgdOptimizer_0_lr_cpu", "y_b"],
         ["y_b_grad", "y_b_momentum", "y_b"])]
    assert args_of(net[2]) == {"momentum": 0.9, "nesterov": 1}


def test_adagrad_and_adam_op_sequences():
    m, loss = regression()
    m.add_gradient_ops([loss])
    n_net = len(ops(m.net))
    m.adagrad(0.05, params=["y_w"])
    m.adam(0.01, params=["y_b"])
    net = ops(m.net)[n_net:]
    assert [(op.type, list(op.input), list(op.output)) for op in net] == [
        ("AtomicIter", ["iteration_mutex", "optimizer_iteration"], ["optimizer_iteration"]),
        ("LearningRate", ["optimizer_iteration"], ["AdagradOptimizer_0_lr_cpu"]),
        ("Adagrad", ["y_w", "y_w_squared_sum", "y_w_grad", "AdagradOptimizer_0_lr_cpu"],
         ["y_w", "y_w_squared_sum"]),
        ("LearningRate", ["optimizer_iteration"], ["AdamOptimizer_0_lr_cpu"]),
        ("Adam", ["y_b", "y_b_first_moment", "y_b_second_moment", "y_b_grad", "AdamOptimizer_0_lr_cpu",
                  "optimizer_iteration"], ["y_b", "y_b_first_moment", "y_b_second_moment"])]
    assert args_of(net[1])["base_lr"] == -0.05 and args_of(net[3])["base_lr"] == -0.01
    assert args_of(net[2]) == {"epsilon": 1e-4, "decay": 1.0}
    assert args_of(net[4]) == {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}
    init_outs = [op.output[0] for op in ops(m.init_net)]
    assert init_outs[-3:] == ["y_w_squared_sum", "y_b_first_moment", "y_b_second_moment"]


def test_optimizer_counters_and_gpu_names():
    m, loss = regression()
    m.add_gradient_ops([loss])
    m.sgd(0.1, params=["y_w"])
    with m.device_scope(DeviceOption(device_type=1, device_id=1)):
        m.sgd(0.1, params=["y_b"])
    lrs = [op.output[0] for op in ops(m.net) if op.type == "LearningRate"]
    assert lrs == ["SgdOptimizer_0_lr_cpu", "SgdOptimizer_1_lr_gpu1"]
    ones = [op.output[0] for op in ops(m.init_net) if op.output[0].startswith("ONE")]
    assert ones == ["ONE_0_0", "ONE_1_1"]


def test_clipping_op_sequence():
    m, loss = regression()
    m.add_gradient_ops([loss])
    n_init, n_net = len(ops(m.init_net)), len(ops(m.net))
    m.sgd(0.1, clip_gradient_norm=2.5)
    net = ops(m.net)[n_net:]
    s = "norm_clipped_grad_update/"
    assert [(op.type, list(op.input), list(op.output)) for op in net[:8]] == [
        ("SumSqrElements", ["y_w_grad"], [s + "grad_0_squared_sum"]),
        ("EnsureCPUOutput", [s + "grad_0_squared_sum"], [s + "m/EnsureCPUOutput"]),
        ("SumSqrElements", ["y_b_grad"], [s + "grad_1_squared_sum"]),
        ("EnsureCPUOutput", [s + "grad_1_squared_sum"], [s + "m/EnsureCPUOutput_2"]),
        ("Sum", [s + "m/EnsureCPUOutput", s + "m/EnsureCPUOutput_2"], [s + "grad_squared_full_sum"]),
        ("Pow", [s + "grad_squared_full_sum"], [s + "global_norm"]),
        ("Max", [s + "global_norm", s + "clip_norm"], [s + "max_norm"]),
        ("Div", [s + "clip_norm", s + "max_norm"], [s + "norm_ratio"])]
    assert args_of(net[5]) == {"exponent": 0.5}
    assert all(op.device_option == DeviceOption(device_type=0) for op in net[4:8])
    clip = ops(m.init_net)[n_init]
    assert (clip.type, list(clip.output), args_of(clip)) == (
        "ConstantFill", [s + "clip_norm"], {"shape": [], "value": 2.5})
    tail = [(op.type, list(op.input), list(op.output)) for op in net[9:12]]
    assert tail == [
        ("LearningRate", ["optimizer_iteration"], ["SgdOptimizer_0_lr_cpu"]),
        ("CopyFromCPUInput", [s + "norm_ratio"], ["SgdOptimizer_0_lr_multiplier_cpu"]),
        ("Mul", ["SgdOptimizer_0_lr_cpu", "SgdOptimizer_0_lr_multiplier_cpu"],
         ["SgdOptimizer_0_scaled_lr_cpu"])]
    assert args_of(net[11]) == {"broadcast": 1}
    assert all(op.input[3] == "SgdOptimizer_0_scaled_lr_cpu" for op in net[12:])


# ------------------------------------------------------------ training numbers
@pytest.mark.parametrize("kind, kwargs, hyper", OPTIMIZERS)
def test_training_matches_the_update_formulas(kind, kwargs, hyper):
    ws = trained(kind, kwargs, steps=4, lr=0.05)
    W, b = train_ref(kind, 4, 0.05, **hyper)
    np.testing.assert_allclose(ws.fetch("y_w"), W, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ws.fetch("y_b"), b, rtol=1e-4, atol=1e-5)
    assert int(ws.fetch("optimizer_iteration")[0]) == 4


@pytest.mark.parametrize("kind, kwargs, hyper", OPTIMIZERS[:3])
def test_clipping_scales_the_step(kind, kwargs, hyper):
    ws = trained(kind, kwargs, steps=3, lr=0.05, clip=0.5)
    W, b = train_ref(kind, 3, 0.05, clip=0.5, **hyper)
    np.testing.assert_allclose(ws.fetch("y_w"), W, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ws.fetch("y_b"), b, rtol=1e-4, atol=1e-5)
    assert float(ws.fetch("norm_clipped_grad_update/norm_ratio")) < 1  # the clip was active


def test_the_tester_a_sign_flipped_weighted_sum_is_caught(patched):
    wrong = lambda xp, *ins, grad_on_w: ins[0] - ins[2] * ins[3]  # noqa: E731
    patched("WeightedSum", kernel=wrong, inplace_kernel=wrong)  # the SGD update runs in place
    ws = trained("sgd", {}, steps=2, lr=0.05)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(ws.fetch("y_w"), train_ref("sgd", 2, 0.05)[0], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ plans
def reporting_model(iterations, every):
    m, loss = regression()
    m.add_gradient_ops([loss])
    m.sgd(0.05)
    report = NetBuilder("report", m.scope)
    report.Print(loss)
    return m, m.to_plan(iterations, report, every)


def test_to_plan_structure():
    m, plan = reporting_model(250, 100)
    steps = [(s.name, list(s.network), s.num_iter if s.HasField("num_iter") else None)
             for s in plan.execution_step]
    assert steps == [("init", ["m_init"], None), ("train", [], 2), ("train_rest", ["m"], 50),
                     ("report_last", ["report"], None)]
    assert [(s.name, list(s.network), s.num_iter) for s in plan.execution_step[1].substep] == [
        ("train_inner", ["m"], 100), ("report", ["report"], 0)]
    assert [n.name for n in plan.network] == ["m_init", "m", "report"]
    final = NetBuilder("after", m.scope)
    final.Print("loss")
    plan = m.to_plan(3, final_nets=[final])
    assert [(s.name, list(s.network)) for s in plan.execution_step] == [
        ("init", ["m_init"]), ("train", ["m"]), ("final_0", ["after"])]
    with pytest.raises(StepnetError, match="two nets are named 'm'"):
        m.to_plan(3, final_nets=[m.net])
    with pytest.raises(ArgumentError, match="iterations must be >= 1"):
        m.to_plan(0)


def test_stepnet_run_trains_a_built_plan(tmp_path, capsys):
    _, plan = reporting_model(7, 3)
    path = tmp_path / "plan.pbtxt"
    proto.save(plan, path)
    assert cli.main(["run", str(path), "--fetch", "y_w", "y_b", "--save", str(tmp_path / "out.npz")]) == 0
    out = capsys.readouterr().out
    # after iterations 3, 6 and 7; the remainder (one iteration) is no loop, so the count stays at 6
    found = re.findall(r"^iteration (\d+)/6: loss = (\S+)$", out, re.M)
    assert [int(i) for i, _ in found] == [3, 6, 6]
    losses = [float(v) for _, v in found]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]
    saved = np.load(tmp_path / "out.npz")
    W, b = train_ref("sgd", 7, 0.05)
    np.testing.assert_allclose(saved["y_w"], W, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(saved["y_b"], b, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ bad input
def test_optimizer_on_a_parameter_without_gradient():
    m, loss = regression(extra_param=True)
    with pytest.raises(StepnetError, match="no gradients yet; call add_gradient_ops"):
        m.sgd(0.1)
    m.add_gradient_ops([loss])
    n_net = len(ops(m.net))
    for build in (lambda: m.sgd(0.1), lambda: m.adam(0.1), lambda: m.adagrad(0.1, params=["unused_w"])):
        with pytest.raises(StepnetError, match="parameter 'unused_w' has no gradient: no loss depends on it"):
            build()
    with pytest.raises(StepnetError, match="'nope' is not a parameter of model 'm'"):
        m.sgd(0.1, params=["nope"])
    with pytest.raises(ArgumentError, match="base_learning_rate must be >= 0"):
        m.sgd(-0.1, params=["y_w"])
    with pytest.raises(ArgumentError, match="clip_gradient_norm must be > 0"):
        m.sgd(0.1, params=["y_w"], clip_gradient_norm=0.0)
    assert len(ops(m.net)) == n_net  # nothing was added by the refused calls
    m.sgd(0.1, params=["y_w", "y_b"])


def nan_plan(tmp_path):
    """A loss that turns NaN: Sqrt of an FC output that is negative."""
    m = ModelBuilder("nanny")
    x = m.init_net.GivenTensorFill([], "x", shape=[2, 2], values=[1.0, 2.0, 3.0, 4.0])
    y = m.fc(x, "y", 2, 1, weight_init=given([[-1.0, 0.5]]), bias_init=given([0.25]))
    loss = m.net.AveragedLoss(m.net.Sqrt(y, "root"), "loss")
    m.add_gradient_ops([loss])
    m.sgd(0.1)
    path = tmp_path / "nan.pbtxt"
    proto.save(m.to_plan(2), path)
    return path


def test_nan_in_a_loss_is_named_with_check_nan(tmp_path, capsys):
    path = nan_plan(tmp_path)
    assert cli.main(["run", str(path), "--fetch", "loss"]) == 0
    assert "loss: shape () float32 [nan]" in capsys.readouterr().out
    assert cli.main(["run", str(path), "--check-nan", "--fetch", "loss"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"net 'nanny', op #1 \(Sqrt\) produced NaN in output 'root'", err), err
