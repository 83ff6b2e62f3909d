"""Dense optimizer ops (MomentumSGD, MomentumSGDUpdate, Adagrad, Adam, RmsProp) against element-by-element
float64 references over several in-place iterations, their checks and in-place rules, and an end-to-end
check: a small linear regression trained by every optimizer (dense and sparse forms) through a created net."""
import math

import numpy as np
import pytest
from optim_steps import CPU, GPU, INT64, assert_close, counter, f32, feed, lr_blob, run_steps, workspace

from stepnet import NetDef
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import GradientError, add_gradient_ops, backward_ops
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, make_op, run_op

RNG = np.random.default_rng(7)
STEPS = 5


# --------------------------------------------------------------------------------------------- references
def ref_momentum(g, m, lr, mu, nesterov):
    """(adjusted grad, moment) element by element."""
    g, m = g.astype(np.float64).ravel(), m.astype(np.float64).ravel()
    ng, nm = np.empty_like(g), np.empty_like(m)
    for i in range(g.size):
        if nesterov:
            nm[i] = mu * m[i] + lr * g[i]
            ng[i] = (1 + mu) * nm[i] - mu * m[i]
        else:
            nm[i] = lr * g[i] + mu * m[i]
            ng[i] = nm[i]
    return ng, nm


def ref_adagrad(w, h, g, lr, eps, decay, wd):
    w, h, g = (a.astype(np.float64).ravel() for a in (w, h, g))
    nw, nh, eff, upd = (np.empty_like(w) for _ in range(4))
    for i in range(w.size):
        gi = g[i] + wd * w[i]
        nh[i] = decay * h[i] + gi * gi
        eff[i] = lr / (math.sqrt(nh[i]) + eps)
        upd[i] = eff[i] * gi
        nw[i] = w[i] + upd[i]
    return nw, nh, eff, upd


def ref_adam(w, m1, m2, g, lr, it, b1, b2, eps):
    w, m1, m2, g = (a.astype(np.float64).ravel() for a in (w, m1, m2, g))
    t = it + 1
    c = math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    nw, n1, n2, eg = (np.empty_like(w) for _ in range(4))
    for i in range(w.size):
        n1[i] = b1 * m1[i] + (1 - b1) * g[i]
        n2[i] = b2 * m2[i] + (1 - b2) * g[i] ** 2
        eg[i] = c * n1[i] / (math.sqrt(n2[i]) + eps)
        nw[i] = w[i] + lr * eg[i]
    return nw, n1, n2, eg


def ref_rmsprop(g, ms, mom, lr, decay, mu, eps):
    g, ms, mom = (a.astype(np.float64).ravel() for a in (g, ms, mom))
    nms, nmom = np.empty_like(ms), np.empty_like(mom)
    for i in range(g.size):
        nms[i] = ms[i] + (1 - decay) * (g[i] * g[i] - ms[i])
        nmom[i] = mu * mom[i] + lr * g[i] / math.sqrt(eps + nms[i])
    return nmom.copy(), nms, nmom


def shaped(flat, like):
    return flat.reshape(np.shape(like))


# --------------------------------------------------------------------------------------------- momentum
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mu,nesterov", [(0.9, 0), (0.9, 1), (0.0, 0), (0.5, 1)])
def test_momentum_sgd_update_steps(device, mu, nesterov):
    w0, grads = f32(RNG, 3, 4), [f32(RNG, 3, 4) for _ in range(STEPS)]
    lrs = [0.1, 0.1, 0.05, 0.05, 0.2]
    out = run_steps("MomentumSGDUpdate", ["g", "m", "lr", "w"], ["g", "m", "w"],
                    {"w": w0, "m": np.zeros_like(w0)},
                    [{"g": g, "lr": lr_blob(lr)} for g, lr in zip(grads, lrs, strict=True)],
                    device, momentum=mu, nesterov=nesterov)
    w, m = w0.astype(np.float64).ravel(), np.zeros(w0.size)
    for k, (g, lr) in enumerate(zip(grads, lrs, strict=True)):
        ng, m = ref_momentum(g, m, lr, mu, nesterov)
        w = w - ng
        assert_close(out[k]["g"], shaped(ng, g), what=f"adjusted grad, step {k}")
        assert_close(out[k]["m"], shaped(m, w0), what=f"moment, step {k}")
        assert_close(out[k]["w"], shaped(w, w0), what=f"param, step {k}")


@pytest.mark.parametrize("device", DEVICES)
def test_momentum_sgd_out_of_place_and_size_not_shape(device):
    # MomentumSGD writes new blobs here; Caffe2 compares sizes, so a (12,) moment serves a (3, 4) grad.
    g, m = f32(RNG, 3, 4), f32(RNG, 12)
    ng, nm = run_op("MomentumSGD", [g, m, lr_blob(0.3)], ["g2", "m2"], device=device, momentum=0.7,
                    nesterov=1)
    rg, rm = ref_momentum(g, m, 0.3, 0.7, True)
    assert_close(ng, shaped(rg, g))
    assert_close(nm, shaped(rm, m))


# --------------------------------------------------------------------------------------------- Adagrad
ADAGRAD_CASES = [dict(epsilon=1e-5, decay=1.0, weight_decay=0.0),
                 dict(epsilon=1e-4, decay=0.9, weight_decay=0.0),
                 dict(epsilon=1e-3, decay=1.0, weight_decay=0.1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("args", ADAGRAD_CASES)
def test_adagrad_steps(device, args):
    w0, grads = f32(RNG, 2, 5), [f32(RNG, 2, 5) for _ in range(STEPS)]
    out = run_steps("Adagrad", ["w", "h", "g", "lr"], ["w", "h", "eff", "upd"],
                    {"w": w0, "h": np.zeros_like(w0), "lr": lr_blob(-0.1)}, [{"g": g} for g in grads], device,
                    **args)
    w, h = w0.ravel().astype(np.float64), np.zeros(w0.size)
    for k, g in enumerate(grads):
        w, h, eff, upd = ref_adagrad(w, h, g, -0.1, args["epsilon"], args["decay"], args["weight_decay"])
        for name, want in (("w", w), ("h", h), ("eff", eff), ("upd", upd)):
            assert_close(out[k][name], shaped(want, w0), what=f"{name}, step {k}")


# --------------------------------------------------------------------------------------------- Adam
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b1,b2,eps", [(0.9, 0.999, 1e-5), (0.5, 0.9, 1e-3)])
def test_adam_steps(device, b1, b2, eps):
    w0, grads = f32(RNG, 4, 3), [f32(RNG, 4, 3) for _ in range(STEPS)]
    out = run_steps("Adam", ["w", "m1", "m2", "g", "lr", "iter"], ["w", "m1", "m2", "eg"],
                    {"w": w0, "m1": np.zeros_like(w0), "m2": np.zeros_like(w0), "lr": lr_blob(-0.01)},
                    [{"g": g, "iter": counter(k + 1)} for k, g in enumerate(grads)], device, host=("iter",),
                    beta1=b1, beta2=b2, epsilon=eps)
    w, m1, m2 = w0.ravel().astype(np.float64), np.zeros(w0.size), np.zeros(w0.size)
    for k, g in enumerate(grads):
        w, m1, m2, eg = ref_adam(w, m1, m2, g, -0.01, k + 1, b1, b2, eps)
        for name, want in (("w", w), ("m1", m1), ("m2", m2), ("eg", eg)):
            assert_close(out[k][name], shaped(want, w0), rtol=1e-4, what=f"{name}, step {k}")


# --------------------------------------------------------------------------------------------- RmsProp
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decay,mu,eps", [(0.9, 0.0, 1e-5), (0.5, 0.8, 1e-2)])
def test_rmsprop_steps(device, decay, mu, eps):
    shape = (3, 2)
    grads = [f32(RNG, *shape) for _ in range(STEPS)]
    out = run_steps("RmsProp", ["g", "ms", "mom", "lr"], ["go", "ms", "mom"],
                    {"ms": np.zeros(shape, np.float32), "mom": np.zeros(shape, np.float32),
                     "lr": lr_blob(0.2)},
                    [{"g": g} for g in grads], device, decay=decay, momentum=mu, epsilon=eps)
    ms, mom = np.zeros(6), np.zeros(6)
    for k, g in enumerate(grads):
        go, ms, mom = ref_rmsprop(g, ms, mom, 0.2, decay, mu, eps)
        for name, want in (("go", go), ("ms", ms), ("mom", mom)):
            assert_close(out[k][name], want.reshape(shape), what=f"{name}, step {k}")


# --------------------------------------------------------------------------------------------- bad input
def test_bad_inputs():
    w = f32(RNG, 2, 3)
    with pytest.raises(ShapeError, match="moment .* as many elements as param"):
        run_op("Adagrad", [w, f32(RNG, 5), w, lr_blob(-1)], 2)
    with pytest.raises(ShapeError, match="lr must hold exactly one element"):
        run_op("MomentumSGDUpdate", [w, w, np.ones(2, np.float32), w], 3)
    with pytest.raises(DTypeError, match="param must be a float tensor"):
        run_op("Adagrad", [w.astype(np.int32), w, w, lr_blob(-1)], 2)
    with pytest.raises(DTypeError, match="grad is float64 but param is float32"):
        run_op("Adam", [w, w, w, w.astype(np.float64), lr_blob(-1), counter(0)], 3)
    with pytest.raises(DTypeError, match="iteration counter must be an int64"):
        run_op("Adam", [w, w, w, w, lr_blob(-1), np.array([1], np.int32)], 3)


def test_inplace_rules():
    ws = workspace("cpu")
    for name in "gmlw":
        ws.feed(name, lr_blob(1.0))
    bad = NetDef(name="bad")
    bad.op.append(make_op("MomentumSGDUpdate", ["g", "m", "l", "w"], ["w", "m", "g"]))
    with pytest.raises(ArgumentError, match="cannot write output 0 in place over input 3"):
        ws.create_net(bad)


def test_optimizers_are_not_differentiable():
    for op_type, n_in, n_out in (("Adam", 6, 3), ("Adagrad", 4, 2), ("MomentumSGDUpdate", 4, 3),
                                 ("RmsProp", 4, 3), ("MomentumSGD", 3, 2)):
        assert REGISTRY.get(op_type).gradient == "should_not_do_gradient"
        opdef = make_op(op_type, [f"i{k}" for k in range(n_in)], [f"o{k}" for k in range(n_out)])
        with pytest.raises(GradientError, match="not differentiable"):
            backward_ops([opdef], ["o0"])


def test_reference_catches_broken_adam(broken):
    # Adam without the bias correction must fail the comparison the table uses.
    def wrong(xp, w, m1, m2, g, lr, it, *, beta1, beta2, epsilon):
        a = beta1 * m1 + (1 - beta1) * g
        b = beta2 * m2 + (1 - beta2) * g * g
        return w + lr * a / (xp.sqrt(b) + epsilon), a, b, a

    test_adam_steps("cpu", 0.9, 0.999, 1e-5)
    broken("Adam", wrong)
    with pytest.raises(AssertionError):
        test_adam_steps("cpu", 0.9, 0.999, 1e-5)


# --------------------------------------------------------------------------------------------- end to end
N, D, K = 32, 4, 2
X = RNG.standard_normal((N, D)).astype(np.float32)
W_TRUE, B_TRUE = RNG.standard_normal((K, D)).astype(np.float32), np.array([0.5, -1.0], np.float32)
Y = X @ W_TRUE.T + B_TRUE
ROWS = np.arange(K, dtype=np.int64)


def optimizer_ops(kind, p, dp):
    """(ops, state blobs {name: initial value}, LearningRate args) updating param p with gradient dp, as
    caffe2.python.optimizer builds them (lr sign conventions of §11.8)."""
    z = np.zeros((K, D) if p == "W" else (K,), np.float32)
    rowwise_z = np.zeros(K, np.float32)
    m, h = p + "_m", p + "_h"
    table = {
        "sgd": ([make_op("WeightedSum", [p, "ONE", dp, "lr"], [p])], {}, -0.1),
        "momentum": ([make_op("MomentumSGDUpdate", [dp, m, "lr", p], [dp, m, p], momentum=0.9, nesterov=0)],
                     {m: z}, 0.02),
        "nesterov": ([make_op("MomentumSGDUpdate", [dp, m, "lr", p], [dp, m, p], momentum=0.9, nesterov=1)],
                     {m: z}, 0.02),
        "adagrad": ([make_op("Adagrad", [p, h, dp, "lr"], [p, h], epsilon=1e-4)], {h: z}, -0.5),
        "adam": ([make_op("Adam", [p, m, h, dp, "lr", "iter"], [p, m, h])], {m: z, h: z}, -0.1),
        "rmsprop": ([make_op("RmsProp", [dp, h, m, "ONE"], [dp + "_o", h, m], decay=0.9, momentum=0.0),
                     make_op("MomentumSGDUpdate", [dp + "_o", m, "lr", p], [dp + "_o", m, p])],
                    {m: z, h: z}, 0.05),
        "sparse_sgd": ([make_op("ScatterWeightedSum", [p, "ONE", "rows", dp, "lr"], [p])], {}, -0.1),
        "sparse_momentum": ([make_op("SparseMomentumSGDUpdate", [dp, m, "lr", p, "rows"], [dp, m, p],
                                     momentum=0.9, nesterov=1)], {m: z}, 0.02),
        "sparse_adagrad": ([make_op("SparseAdagrad", [p, h, "rows", dp, "lr"], [p, h])], {h: z}, -0.5),
        "rowwise_adagrad": ([make_op("RowWiseSparseAdagrad", [p, h, "rows", dp, "lr"], [p, h])],
                            {h: rowwise_z}, -0.5),
        "sparse_adam": ([make_op("SparseAdam", [p, m, h, "rows", dp, "lr", "iter"], [p, m, h])], {m: z, h: z},
                        -0.1),
        "rowwise_adam": ([make_op("RowWiseSparseAdam", [p, m, h, "rows", dp, "lr", "iter"], [p, m, h])],
                         {m: z, h: rowwise_z}, -0.1),
    }
    return table[kind]


def train_50_steps(ws, net, device, state) -> list[float]:
    """Feed the regression data, zero parameters and optimizer state, then run net 50 times; the losses."""
    for name, value in {"X": X, "Y": Y, "W": np.zeros((K, D), np.float32), "b": np.zeros(K, np.float32),
                        "ONE": lr_blob(1.0), "rows": ROWS, **state}.items():
        feed(ws, name, value, device)
    train = ws.create_net(net)
    losses = []
    for _ in range(50):
        train.run()
        losses.append(float(ws.fetch("loss")))
    return losses


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["sgd", "momentum", "nesterov", "adagrad", "adam", "rmsprop", "sparse_sgd",
                                  "sparse_momentum", "sparse_adagrad", "rowwise_adagrad", "sparse_adam",
                                  "rowwise_adam"])
def test_linear_regression_trains(device, kind):
    ws = workspace(device)
    net = NetDef(name=f"train_{kind}")
    if device != "cpu":
        net.device_option.CopyFrom(GPU)
    net.op.append(make_op("Iter", ["iter"], ["iter"]))
    net.op[-1].device_option.CopyFrom(CPU)  # the counter lives on the CPU whatever the net's device
    opt_w, state_w, base_lr = optimizer_ops(kind, "W", "dW")
    opt_b, state_b, _ = optimizer_ops(kind, "b", "db")
    net.op.extend([
        make_op("LearningRate", ["iter"], ["lr"], base_lr=base_lr, policy="fixed"),
        make_op("FC", ["X", "W", "b"], ["pred"]),
        make_op("Sub", ["pred", "Y"], ["diff"]),
        make_op("SumSqrElements", ["diff"], ["loss"], average=1),            # loss = mean(diff²)
        make_op("Scale", ["diff"], ["dpred"], scale=2.0 / N),               # d loss / d pred
        make_op("MatMul", ["dpred", "X"], ["dW"], trans_a=1),               # (K, D)
        make_op("ReduceFrontSum", ["dpred"], ["db"]),                       # (K,)
        *opt_w, *opt_b])
    ws.feed("iter", np.zeros(1, np.int64))
    losses = train_50_steps(ws, net, device, {**state_w, **state_b})
    assert int(ws.fetch("iter")[0]) == 50 and ws.fetch("W").dtype == np.float32
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.1 * losses[0], f"{kind}: loss {losses[0]:.4g} -> {losses[-1]:.4g}"
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


def test_int64_counter_from_constant_fill():
    # The init net of caffe2.python.optimizer: ConstantFill(shape=[1], value=0, dtype=INT64) feeds Adam.
    ws = workspace("cpu")
    init = NetDef(name="init")
    init.op.append(make_op("ConstantFill", [], ["iter"], shape=[1], value=0, dtype=INT64))
    ws.run_net_once(init)
    w = f32(RNG, 3)
    for name, v in {"w": w, "m1": np.zeros(3, np.float32), "m2": np.zeros(3, np.float32), "g": w,
                    "lr": lr_blob(-0.1)}.items():
        ws.feed(name, v)
    ws.run_operator_once(make_op("Adam", ["w", "m1", "m2", "g", "lr", "iter"], ["w", "m1", "m2"]))
    want = ref_adam(w, np.zeros(3), np.zeros(3), w, -0.1, 0, 0.9, 0.999, 1e-5)[0]
    assert_close(ws.fetch("w"), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["sgd", "momentum", "adagrad", "adam", "rmsprop", "sparse_adam"])
def test_caffe2_style_training_net(device, kind):
    # FC + SquaredL2Distance + AveragedLoss, gradients by the graph rewrite, then the optimizer's ops, as
    # model_helper + optimizer.build_* produce them (autogen loss gradient, <param>_grad names, in place).
    net = NetDef(name=f"c2_{kind}")
    if device != "cpu":
        net.device_option.CopyFrom(GPU)
    net.op.extend([make_op("FC", ["X", "W", "b"], ["pred"]),
                   make_op("SquaredL2Distance", ["pred", "Y"], ["dist"]),
                   make_op("AveragedLoss", ["dist"], ["loss"])])
    grads = add_gradient_ops(net, ["loss"])
    assert grads["W"] == "W_grad" and grads["b"] == "b_grad"
    opt_w, state_w, base_lr = optimizer_ops(kind, "W", "W_grad")
    opt_b, state_b, _ = optimizer_ops(kind, "b", "b_grad")
    counter_op = make_op("Iter", ["iter"], ["iter"])
    counter_op.device_option.CopyFrom(CPU)
    net.op.extend([counter_op, make_op("LearningRate", ["iter"], ["lr"], base_lr=base_lr, policy="step",
                                       stepsize=40, gamma=0.5), *opt_w, *opt_b])
    ws = workspace(device)
    ws.feed("iter", np.zeros(1, np.int64))
    losses = train_50_steps(ws, net, device, {**state_w, **state_b})
    assert losses[-1] < 0.1 * losses[0], f"{kind}: loss {losses[0]:.4g} -> {losses[-1]:.4g}"


@pytest.mark.parametrize("beta1, beta2, iteration", [(0.9, 1.5, 3), (1.0, 0.999, 0), (0.9, 3.0, 2 ** 40)])
def test_adam_betas_outside_their_range_give_nan_or_inf_as_caffe2(beta1, beta2, iteration):
    """sqrt(1 - beta2^t) / (1 - beta1^t) with a beta2 above 1 (a negative root), beta1 = 1 (a zero divisor) or a
    power that overflows: C++ gives NaN or inf, so does the correction, instead of a Python math error."""
    from stepnet.ops.optim import adam_correction

    with np.errstate(all="ignore"):
        want = np.sqrt(1.0 - np.float64(np.float32(beta2)) ** (iteration + 1)) / (
            1.0 - np.float64(np.float32(beta1)) ** (iteration + 1))
    got = adam_correction(beta1, beta2, iteration)
    assert not math.isfinite(got) and (math.isnan(got) == bool(np.isnan(want)))


# --------------------------------------------------------------------------------------------- Lars, SparseNormalize
def _norm(a):
    return math.sqrt(math.fsum(float(v) ** 2 for v in np.ravel(a)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0.0, 0.5, 7.0])
def test_lars(offset, device):
    rng = np.random.default_rng(3)
    x, dx = rng.random((3, 4, 5)).astype(np.float32), rng.random((3, 4, 5)).astype(np.float32)
    got = run_op("Lars", [x, dx], device=device, offset=offset)
    assert got.shape == (1,) and got.dtype == np.float32
    np.testing.assert_allclose(got, [1 / (_norm(dx) / _norm(x) + offset)], rtol=1e-5)
    np.testing.assert_array_equal(run_op("Lars", [x * 0, dx], device=device), [1.0])


def test_lars_bad_inputs():
    x = np.ones(3, np.float32)
    with pytest.raises(ArgumentError, match="offset must be >= 0"):
        run_op("Lars", [x, x], offset=-1.0)
    with pytest.raises(ShapeError, match="as many elements"):
        run_op("Lars", [x, np.ones(4, np.float32)])


def sparse_normalize_ref(param, indices, use_max_norm=True, norm=1.0):
    out = param.astype(np.float64).copy()
    for i in indices.ravel().tolist():
        size = _norm(out[i]) + 1e-12
        if not (use_max_norm and size < norm):
            out[i] = out[i] * (norm / size)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_max_norm, norm", [(True, 1.0), (False, 2.5), (True, 3.0)])
def test_sparse_normalize(use_max_norm, norm, device):
    rng = np.random.default_rng(9)
    param = (rng.standard_normal((6, 2, 2)) * 2).astype(np.float32)
    indices = np.array([4, 0, 2, 4], np.int64)
    grad = np.ones((4, 2, 2), np.float32)
    got = run_op("SparseNormalize", {"param": param, "idx": indices, "grad": grad}, ["param"], device=device,
                 use_max_norm=use_max_norm, norm=norm)
    np.testing.assert_allclose(got, sparse_normalize_ref(param, indices, use_max_norm, norm), rtol=1e-5)


def test_sparse_normalize_bad_inputs():
    feeds = {"param": np.ones((3, 2), np.float32), "idx": np.array([3], np.int32), "grad": np.ones((1, 2), np.float32)}
    with pytest.raises(ShapeError, match="index 3 is out of range"):
        run_op("SparseNormalize", feeds, ["param"])
    with pytest.raises(ShapeError, match="one row of param"):
        run_op("SparseNormalize", dict(feeds, idx=np.array([0], np.int32), grad=np.ones((1, 3), np.float32)),
               ["param"])
    with pytest.raises(GradientError):
        backward_ops([make_op("Lars", ["x", "dx"], ["r"])], {"r": "r_grad"})


def test_sparse_normalize_reference_catches_a_broken_kernel(broken):
    broken("SparseNormalize", lambda xp, p, i, g, **a: p.copy())
    param = np.full((2, 2), 3.0, np.float32)
    got = run_op("SparseNormalize", {"param": param, "idx": np.array([1], np.int32),
                                     "grad": np.ones((1, 2), np.float32)}, ["param"])
    assert not np.allclose(got, sparse_normalize_ref(param, np.array([1])))
