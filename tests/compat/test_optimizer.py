"""compat.optimizer: learning-rate policies against hand-computed rates, each optimizer's first updates against
its formula, gradient clipping, weight decay, learning-rate injection, sparse gradients, blob names and devices."""
import logging

import numpy as np
import pytest

from stepnet.compat import core, model_helper, optimizer, workspace
from stepnet.compat.modeling.initializers import Initializer
from stepnet.compat.modeling.parameter_info import ParameterTags

W0 = np.array([1.0, -2.0], np.float32)
X = np.array([3.0, -4.0], np.float32)      # loss = sum(w * x): the gradient of w is x (norm 5)


def linear_model(name="opt"):
    model = model_helper.ModelHelper(name=name)
    w = model.create_param("w", [2], Initializer("GivenTensorFill", values=W0.tolist()), tags=ParameterTags.WEIGHT)
    model.net.SumElements(model.net.Mul([w, "x"], "wx"), "loss")
    model.AddGradientOperators(["loss"])
    return model


def train(model, steps, fetch=("w",)):
    """Run the init net, then `steps` iterations; returns [[fetched blobs] after each iteration]."""
    workspace.FeedBlob("x", X)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    out = []
    for _ in range(steps):
        workspace.RunNet(model.net)
        out.append([workspace.FetchBlob(f).copy() for f in fetch])
    return out


@pytest.mark.parametrize("policy, args, rate", [
    ("fixed", {}, lambda k: 1.0),
    ("step", {"stepsize": 2, "gamma": 0.5}, lambda k: 0.5 ** (k // 2)),
    ("exp", {"gamma": 0.9}, lambda k: 0.9 ** k),
    ("inv", {"gamma": 0.1, "power": 0.5}, lambda k: (1 + 0.1 * k) ** -0.5),
    ("poly", {"max_iter": 10, "power": 2.0}, lambda k: (1 - k / 10) ** 2),
])
def test_learning_rate_policies_match_hand_computed_rates(policy, args, rate):
    model = linear_model()
    optimizer.build_sgd(model, base_learning_rate=0.1, policy=policy, **args)
    runs = train(model, 5, ("SgdOptimizer_0_lr_cpu", "optimizer_iteration", "w"))
    w = W0.astype(np.float64)
    for k, (lr, it, w_now) in enumerate(runs, start=1):   # AtomicIter runs first: iteration k sees iter == k
        assert it.tolist() == [k]
        assert float(lr) == pytest.approx(-0.1 * rate(k), rel=1e-6)     # negative: SGD descends
        w = w - 0.1 * rate(k) * X
        np.testing.assert_allclose(w_now, w, rtol=1e-5, atol=1e-6)


def test_the_update_ops_and_names_caffe2_builds():
    model = linear_model()
    optimizer.build_sgd(model, base_learning_rate=0.1)
    types = [op.type for op in model.net.Proto().op]
    assert types[-3:] == ["AtomicIter", "LearningRate", "WeightedSum"]
    assert list(model.net.Proto().op[-1].input) == ["w", "ONE_0_0", "w_grad", "SgdOptimizer_0_lr_cpu"]
    inits = [(op.type, op.output[0]) for op in model.param_init_net.Proto().op]
    assert ("ConstantFill", "optimizer_iteration") in inits and ("CreateMutex", "iteration_mutex") in inits
    iteration = next(op for op in model.param_init_net.Proto().op if op.output[0] == "optimizer_iteration")
    assert iteration.device_option.device_type == 0          # the counter lives on the CPU
    second = linear_model("second")
    optimizer.build_sgd(second, base_learning_rate=0.1)
    assert "SgdOptimizer_1_lr_cpu" in second.net.Proto().op[-2].output      # counted per process, as Caffe2 does


def test_blob_names_and_devices_under_a_gpu_scope():
    gpu = core.DeviceOption(1, 0)
    with core.DeviceScope(gpu):
        model = linear_model()
    optimizer.build_sgd(model, base_learning_rate=0.1, momentum=0.9)
    ops = {op.type: op for op in model.net.Proto().op}
    assert ops["LearningRate"].output[0] == "SgdOptimizer_0_lr_gpu0" and ops["LearningRate"].device_option == gpu
    assert ops["AtomicIter"].device_option.device_type == 0
    assert ops["MomentumSGDUpdate"].device_option == gpu
    assert "ONE_1_0" in [op.output[0] for op in model.param_init_net.Proto().op]


def test_momentum_sgd():
    model = linear_model()
    optimizer.build_sgd(model, base_learning_rate=0.1, momentum=0.9)
    (lr, w1), = train(model, 1, ("SgdOptimizer_0_lr_cpu", "w"))
    assert float(lr) == pytest.approx(0.1)                    # positive: MomentumSGDUpdate subtracts
    np.testing.assert_allclose(w1, W0 - 1.9 * 0.1 * X, rtol=1e-6)   # nesterov: (1 + mu) * lr * g on step one
    assert "w_momentum" in [op.output[0] for op in model.param_init_net.Proto().op]


def test_adam():
    model = linear_model()
    optimizer.build_adam(model, base_learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-6)
    (w1, m1, m2), = train(model, 1, ("w", "w_first_moment", "w_second_moment"))
    np.testing.assert_allclose(m1, 0.2 * X, rtol=1e-6)
    np.testing.assert_allclose(m2, 0.01 * X ** 2, rtol=1e-5)
    t = 2       # Caffe2's Adam corrects with t = iteration + 1, and the first run sees iteration 1
    step = 0.01 * np.sqrt(1 - 0.99 ** t) / (1 - 0.8 ** t) * m1 / (np.sqrt(m2) + 1e-6)
    np.testing.assert_allclose(w1, W0 - step, rtol=1e-5)


def test_adagrad():
    model = linear_model()
    optimizer.build_adagrad(model, base_learning_rate=0.5, epsilon=1e-4)
    (w1, h1), (w2, h2) = train(model, 2, ("w", "w_squared_sum"))
    np.testing.assert_allclose(h1, X ** 2, rtol=1e-6)
    np.testing.assert_allclose(w1, W0 - 0.5 * X / (np.abs(X) + 1e-4), rtol=1e-5)
    np.testing.assert_allclose(w2, w1 - 0.5 * X / (np.sqrt(2 * X ** 2) + 1e-4), rtol=1e-5)


def test_rms_prop():
    model = linear_model()
    optimizer.build_rms_prop(model, base_learning_rate=0.01, decay=0.9, epsilon=1e-5)
    (w1,), = train(model, 1)
    np.testing.assert_allclose(w1, W0 - 0.01 * X / np.sqrt(1e-5 + 0.1 * X ** 2), rtol=1e-5)
    types = [op.type for op in model.net.Proto().op]
    assert types[-2:] == ["RmsProp", "MomentumSGDUpdate"]


def test_gradient_clipping_scales_the_rate():
    model = linear_model()
    optimizer.build_sgd(model, base_learning_rate=0.1, max_gradient_norm=0.5)
    (ratio, w1), = train(model, 1, ("norm_clipped_grad_update/norm_ratio", "w"))
    assert float(ratio) == pytest.approx(0.5 / 5.0)
    np.testing.assert_allclose(w1, W0 - 0.1 * 0.1 * X, rtol=1e-5)


def test_weight_decay():
    model = linear_model()
    optimizer.add_weight_decay(model, 0.1)
    optimizer.build_sgd(model, base_learning_rate=0.1)
    (w1,), = train(model, 1)
    np.testing.assert_allclose(w1, W0 - 0.1 * (X + 0.1 * W0), rtol=1e-5)


def test_learning_rate_injection():
    model = linear_model()
    optimizer.build_sgd(model, base_learning_rate=0.1, allow_lr_injection=True)
    train(model, 1)
    optimizer.set_lr_injection(0.5)
    assert optimizer.get_lr_injection().tolist() == [0.5]
    w1 = workspace.FetchBlob("w")
    workspace.RunNet(model.net)
    assert float(workspace.FetchBlob("SgdOptimizer_0_scaled_lr_cpu")) == pytest.approx(-0.05)
    np.testing.assert_allclose(workspace.FetchBlob("w"), w1 - 0.05 * X, rtol=1e-5)


def test_sparse_gradients():
    model = model_helper.ModelHelper(name="sparse")
    emb = model.create_param("emb", [4, 2], Initializer("ConstantFill", value=1.0))
    model.net.SumElements(model.net.Gather([emb, "idx"], "rows"), "loss")
    model.AddGradientOperators(["loss"])
    optimizer.build_sgd(model, base_learning_rate=0.5)
    assert model.net.Proto().op[-1].type == "ScatterWeightedSum"
    workspace.FeedBlob("idx", np.array([1, 3, 1], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    np.testing.assert_allclose(workspace.FetchBlob("emb"), [[1, 1], [0, 0], [1, 1], [0.5, 0.5]])
    optimizer.build_adagrad(model, 0.1, sparse_dedup_aggregator="sum")   # (dedup: tests/compat/test_api_gaps.py)
    assert [op.type for op in model.net.Proto().op[-3:]] == ["Unique", "UnsortedSegmentSum", "SparseAdagrad"]


def test_parameters_without_gradients_are_skipped_with_a_warning(caplog):
    model = model_helper.ModelHelper(name="unused")
    model.create_param("orphan", [1], Initializer("ConstantFill", value=1.0))
    w = model.create_param("w", [2], Initializer("ConstantFill", value=1.0))
    model.net.SumElements(model.net.Mul([w, "x"], "wx"), "loss")
    model.AddGradientOperators(["loss"])
    with caplog.at_level(logging.WARNING):
        optimizer.build_sgd(model, base_learning_rate=0.1)
    assert "without a gradient are not optimized: orphan" in caplog.text
    assert sum(op.type == "WeightedSum" for op in model.net.Proto().op) == 1


def test_zero_rates_add_nothing_and_negative_ones_are_refused():
    model = linear_model()
    optimizer.build_sgd(model, base_learning_rate=0.0)
    assert "LearningRate" not in [op.type for op in model.net.Proto().op]
    with pytest.raises(ValueError, match="positive base learning rate"):
        optimizer.build_sgd(model, base_learning_rate=-1.0)


def _op(model, op_type):
    return next(op for op in model.net.Proto().op if op.type == op_type)


@pytest.mark.parametrize("build, lr, rate", [
    (lambda m: optimizer.build_sgd(m, base_learning_rate=0.1, lars=0.5), 0.1, lambda lars: 0.1 * lars),
    (lambda m: optimizer.build_adagrad(m, base_learning_rate=0.2, lars=0.5, epsilon=0.0), 0.2,
     lambda lars: 0.2 * lars / np.abs(X)),
])
def test_lars_scales_the_rate_of_dense_parameters(build, lr, rate):
    model = linear_model()
    build(model)
    lars_op = _op(model, "Lars")
    assert list(lars_op.input) == ["w", "w_grad"] and lars_op.output[0].endswith("_w_lars_cpu")
    (factor, w1), = train(model, 1, (lars_op.output[0], "w"))
    want = 1 / (np.linalg.norm(X) / np.linalg.norm(W0) + 0.5)       # 1 / (|grad| / |param| + offset)
    np.testing.assert_allclose(factor, [want], rtol=1e-6)
    np.testing.assert_allclose(w1, W0 - rate(want) * X, rtol=1e-5)
    with pytest.raises(ValueError, match="Lars offset must be nonnegative"):
        optimizer.build_sgd(linear_model("neg"), base_learning_rate=0.1, lars=-1.0)


def _embedding_model(name):
    model = model_helper.ModelHelper(name=name)
    emb = model.create_param("emb", [4, 2], Initializer("ConstantFill", value=1.0))
    model.net.SumElements(model.net.Gather([emb, "idx"], "rows"), "loss")
    model.AddGradientOperators(["loss"])
    return model


def test_row_wise_adagrad_and_adam_keep_one_state_value_per_row():
    model = _embedding_model("rowwise_adagrad")
    optimizer.build_adagrad(model, base_learning_rate=0.5, rowWise=True, epsilon=0.0)
    assert model.net.Proto().op[-1].type == "RowWiseSparseAdagrad"
    workspace.FeedBlob("idx", np.array([1, 3], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    np.testing.assert_allclose(workspace.FetchBlob("emb_avg_squared_sum"), [0, 1, 0, 1])   # mean of g² = 1
    np.testing.assert_allclose(workspace.FetchBlob("emb"), [[1, 1], [0.5, 0.5], [1, 1], [0.5, 0.5]])
    adam = _embedding_model("rowwise_adam")
    optimizer.build_adam(adam, base_learning_rate=0.1, rowWise=True)
    assert adam.net.Proto().op[-1].type == "RowWiseSparseAdam"
    workspace.RunNetOnce(adam.param_init_net)
    assert workspace.FetchBlob("emb_avg_second_moment").shape == (4,)
    with pytest.raises(ValueError, match="rowWise=True, gradient must be a gradientslice"):
        optimizer.build_adagrad(linear_model("dense"), base_learning_rate=0.1, rowWise=True)


def test_ftrl_and_yellowfin_builders_add_their_ops():
    model = linear_model("ftrl")
    optimizer.build_ftrl(model, alpha=1.0, beta=0.1, lambda1=0.0, lambda2=0.0)
    assert _op(model, "Ftrl").input[:] == ["w", "w_ftrl_nz", "w_grad"]
    (w1, nz1), = train(model, 1, ("w", "w_ftrl_nz"))
    assert nz1.shape == (2, 2)
    np.testing.assert_allclose(nz1[:, 0], X ** 2)                     # n = g²
    np.testing.assert_allclose(w1, -nz1[:, 1] / (0.1 + np.abs(X)), rtol=1e-5)   # w = -z / ((beta + √n) / alpha)
    yf = linear_model("yellowfin")
    optimizer.build_yellowfin(yf, base_learning_rate=0.1)
    assert len(_op(yf, "YellowFin").input) == 10
    (w1,), = train(yf, 1)
    np.testing.assert_allclose(w1, W0 - 0.1 * X, rtol=1e-6)           # the first step: momentum 0, rate alpha
