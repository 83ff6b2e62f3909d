"""Normalisation and dropout ops against references written as per-channel / per-row Python loops."""
import itertools
import math

import numpy as np
import pytest

from stepnet import NetDef, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.io.proto import DeviceOption
from stepnet.testing import DEVICES, infer_alone, make_op, run_op

rng = np.random.default_rng(5)


def f32(*shape, lo=-2.0, hi=3.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def check(got, want, tol=1e-5):
    want = np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == np.float32, f"dtype {got.dtype}"
    np.testing.assert_allclose(got, want.astype(np.float64), rtol=tol, atol=tol)


def moments(values):
    """Mean and biased variance of a list of numbers, by plain loops in double precision."""
    m = sum(values) / len(values)
    return m, sum((v - m) ** 2 for v in values) / len(values)


def channel_of(index, order, ndim):
    return index[1] if order == "NCHW" else index[ndim - 1]


# ----------------------------------------------------------------------------------------------- SpatialBN
def bn_reference(x, scale, bias, order, eps, mean=None, var=None):
    """Y and per-channel batch mean/var; uses the given mean/var when supplied (test mode)."""
    c_count = x.shape[1] if order == "NCHW" else x.shape[-1]
    buckets = [[] for _ in range(c_count)]
    for idx in np.ndindex(*x.shape):
        buckets[channel_of(idx, order, x.ndim)].append(float(x[idx]))
    stats = [moments(b) for b in buckets]
    m = [float(v) for v in mean] if mean is not None else [s[0] for s in stats]
    v = [float(v) for v in var] if var is not None else [s[1] for s in stats]
    y = np.zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        c = channel_of(idx, order, x.ndim)
        y[idx] = (float(x[idx]) - m[c]) / math.sqrt(v[c] + eps) * float(scale[c]) + float(bias[c])
    return y, [s[0] for s in stats], [s[1] for s in stats]


BN_SHAPES = [("NCHW", (2, 3, 4, 5)), ("NHWC", (2, 4, 5, 3)), ("NCHW", (6, 3)), ("NCHW", (2, 3, 2, 3, 2)),
             ("NHWC", (2, 3, 2, 2, 4))]


def bn_inputs(order, shape):
    c = shape[1] if order == "NCHW" else shape[-1]
    return {"X": f32(*shape), "scale": f32(c, lo=0.5, hi=2), "bias": f32(c), "rm": f32(c),
            "rv": f32(c, lo=0.5, hi=2)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order,shape", BN_SHAPES)
def test_spatial_bn_test_mode(device, order, shape):
    ins = bn_inputs(order, shape)
    y = run_op("SpatialBN", ins, ["Y"], device=device, is_test=1, order=order, epsilon=1e-3)
    want, _, _ = bn_reference(ins["X"], ins["scale"], ins["bias"], order, 1e-3, ins["rm"], ins["rv"])
    check(y, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order,shape", BN_SHAPES)
def test_spatial_bn_training(device, order, shape):
    ins = bn_inputs(order, shape)
    y, rm, rv, sm, siv = run_op("SpatialBN", ins, ["Y", "rm", "rv", "sm", "siv"], device=device, order=order,
                                momentum=0.8)
    want, bm, bv = bn_reference(ins["X"], ins["scale"], ins["bias"], order, 1e-5)
    check(y, want, 1e-4)
    check(rm, [0.8 * float(r) + 0.2 * b for r, b in zip(ins["rm"], bm, strict=True)])
    check(rv, [0.8 * float(r) + 0.2 * b for r, b in zip(ins["rv"], bv, strict=True)])
    check(sm, bm)
    check(siv, [1 / math.sqrt(v + 1e-5) for v in bv], 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_spatial_bn_multi_batch_sums(device):
    ins = bn_inputs("NCHW", (2, 3, 2, 2))
    sums, sumsq = f32(3, lo=-5, hi=5), f32(3, lo=40, hi=60)
    ins.update(sums=sums, sumsq=sumsq)
    outs = ["Y", "rm", "rv", "sm", "siv"]
    y, rm, rv, sm, siv = run_op("SpatialBN", ins, outs, device=device, num_batches=3)
    count = 2 * 3 * 4
    mean = [float(s) / count for s in sums]
    var = [float(q) / count - m * m for q, m in zip(sumsq, mean, strict=True)]
    want, _, _ = bn_reference(ins["X"], ins["scale"], ins["bias"], "NCHW", 1e-5, mean, var)
    check(y, want, 1e-4)
    check(sm, mean)
    check(siv, [1 / math.sqrt(v + 1e-5) for v in var], 1e-4)
    check(rv, [0.9 * float(r) + 0.1 * v for r, v in zip(ins["rv"], var, strict=True)])


def feed(ws, device, arrays):
    do = DeviceOption(device_type=1) if device != "cpu" else None
    for name, value in arrays.items():
        ws.feed(name, value, device_option=do)


@pytest.mark.parametrize("device", DEVICES)
def test_spatial_bn_running_stats_over_two_runs_of_one_net(device):
    ins = bn_inputs("NCHW", (3, 2, 3, 3))
    ins["rm"], ins["rv"] = np.zeros(0, np.float32), np.zeros(0, np.float32)  # uninitialised: start at zero
    ws = Workspace(gpu="emulate" if device != "cpu" else None)
    feed(ws, device, ins)
    net = NetDef(name="bn", external_input=list(ins))
    outs = ["Y", "rm", "rv", "sm", "siv"]
    net.op.append(make_op("SpatialBN", list(ins), outs, device=device, momentum=0.7))
    ws.create_net(net)
    ws.run_net("bn")
    x2 = f32(3, 2, 3, 3, lo=1, hi=4)
    feed(ws, device, {"X": x2})
    ws.run_net("bn")
    _, m1, v1 = bn_reference(ins["X"], ins["scale"], ins["bias"], "NCHW", 1e-5)
    _, m2, v2 = bn_reference(x2, ins["scale"], ins["bias"], "NCHW", 1e-5)
    check(ws.fetch("rm"), [0.7 * (0.3 * a) + 0.3 * b for a, b in zip(m1, m2, strict=True)])
    check(ws.fetch("rv"), [0.7 * (0.3 * a) + 0.3 * b for a, b in zip(v1, v2, strict=True)])
    check(ws.fetch("sm"), m2)


# ----------------------------------------------------------------------------------------------- LayerNorm
def ln_reference(x, axis, eps, gamma=None, beta=None):
    rows = int(np.prod(x.shape[:axis]))
    flat = x.reshape(rows, -1).astype(np.float64)
    y, means, stds = np.zeros(flat.shape), [], []
    for i in range(rows):
        m, v = moments(flat[i].tolist())
        s = math.sqrt(v + eps)
        means.append(m)
        stds.append(s)
        for j in range(flat.shape[1]):
            y[i, j] = (flat[i, j] - m) / s
            if gamma is not None:
                y[i, j] = y[i, j] * float(gamma.ravel()[j]) + float(beta.ravel()[j])
    stat_shape = x.shape[:axis] + (1,)
    return y.reshape(x.shape), np.reshape(means, stat_shape), np.reshape(stds, stat_shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,axis,affine", [((4, 6), 1, False), ((2, 3, 4), 1, False),
                                               ((2, 3, 4), -1, False), ((2, 2, 3, 2), 2, False),
                                               ((3, 2, 4), 1, True)])
def test_layer_norm(device, shape, axis, affine):
    x = f32(*shape)
    ins = [x]
    gamma = beta = None
    if affine:
        gamma, beta = f32(*shape[axis:]), f32(*shape[axis:])
        ins += [gamma, beta]
    args = {"axis": axis, "epsilon": 1e-3, "elementwise_affine": affine}
    y, mean, std = run_op("LayerNorm", ins, 3, device=device, **args)
    want = ln_reference(x, axis % x.ndim, 1e-3, gamma, beta)
    for got, w in zip((y, mean, std), want, strict=True):
        check(got, w)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_of_no_rows_is_empty_and_so_is_its_gradient(device):
    """A batch of 0 rows (found by the fuzz campaign: the kernels reshaped to (0, -1), which numpy refuses)."""
    x, gamma, beta = np.zeros((0, 3), np.float32), f32(3), f32(3)
    y, mean, std = run_op("LayerNorm", [x, gamma, beta], 3, device=device, elementwise_affine=1)
    assert y.shape == (0, 3) and mean.shape == std.shape == (0, 1)
    dx, dgamma, dbeta = run_op("LayerNormGradient", [x, y, mean, std, x, gamma], 3, device=device,
                               elementwise_affine=1)
    assert dx.shape == (0, 3) and not dgamma.any() and not dbeta.any() and dgamma.shape == (3,)


# ------------------------------------------------------------------------------------------- Instance/Group
def grouped_reference(x, order, groups, gamma, beta, eps):
    """GroupNorm by loops; InstanceNorm is the case groups == C. Returns Y, mean and inv std (N, groups)."""
    n_count = x.shape[0]
    c_count = x.shape[1] if order == "NCHW" else x.shape[-1]
    per = c_count // groups
    buckets = {(n, g): [] for n in range(n_count) for g in range(groups)}
    for idx in np.ndindex(*x.shape):
        buckets[(idx[0], channel_of(idx, order, x.ndim) // per)].append(float(x[idx]))
    stats = {k: moments(v) for k, v in buckets.items()}
    y = np.zeros(x.shape)
    for idx in np.ndindex(*x.shape):
        c = channel_of(idx, order, x.ndim)
        m, v = stats[(idx[0], c // per)]
        y[idx] = (float(x[idx]) - m) / math.sqrt(v + eps) * float(gamma[c]) + float(beta[c])
    mean = [[stats[(n, g)][0] for g in range(groups)] for n in range(n_count)]
    inv = [[1 / math.sqrt(stats[(n, g)][1] + eps) for g in range(groups)] for n in range(n_count)]
    return y, mean, inv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order,shape", [("NCHW", (2, 3, 4, 5)), ("NHWC", (2, 4, 5, 3)), ("NCHW", (2, 3, 7))])
def test_instance_norm(device, order, shape):
    x = f32(*shape)
    c = shape[1] if order == "NCHW" else shape[-1]
    s, b = f32(c), f32(c)
    y, mean, inv = run_op("InstanceNorm", [x, s, b], 3, device=device, order=order, epsilon=1e-4)
    for got, w in zip((y, mean, inv), grouped_reference(x, order, c, s, b, 1e-4), strict=True):
        check(got, w, 1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order,shape,group", [("NCHW", (2, 6, 3, 2), 2), ("NHWC", (2, 3, 2, 6), 3),
                                               ("NCHW", (1, 4, 5), 4), ("NCHW", (2, 4, 2, 2, 2), 1)])
def test_group_norm(device, order, shape, group):
    x = f32(*shape)
    c = shape[1] if order == "NCHW" else shape[-1]
    g, b = f32(c), f32(c)
    outs = run_op("GroupNorm", [x, g, b], 3, device=device, order=order, group=group, is_test=0)
    for got, w in zip(outs, grouped_reference(x, order, group, g, b, 1e-5), strict=True):
        check(got, w, 1e-4)


# ----------------------------------------------------------------------------------------------- Normalize
def lp_reference(x, axis, p):
    y = np.zeros(x.shape)
    axis %= x.ndim
    other = [range(s) for i, s in enumerate(x.shape) if i != axis]
    for rest in itertools.product(*other):
        idxs = [rest[:axis] + (k,) + rest[axis:] for k in range(x.shape[axis])]
        vals = [float(x[i]) for i in idxs]
        norm = math.sqrt(sum(v * v for v in vals)) if p == 2 else sum(abs(v) for v in vals)
        for i, v in zip(idxs, vals, strict=True):
            y[i] = v / norm if norm else 0.0
    return y


NORM_X = f32(3, 4, 5)
NORM_X[1, :, 2] = 0  # an all-zero slice along axis 1
NORM_X[2, 3, :] = 0  # ... and along axis -1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,p", [("Normalize", 2), ("NormalizeL1", 1)])
@pytest.mark.parametrize("axis", [None, -1, 0, 1])
def test_normalize(device, op_type, p, axis):
    args = {} if axis is None else {"axis": axis}
    y = run_op(op_type, [NORM_X], 1, device=device, **args)
    check(y, lp_reference(NORM_X, -1 if axis is None else axis, p))


# ----------------------------------------------------------------------------------------------- Dropout
def dropout_ws(device, seed):
    return Workspace(seed=seed, gpu="emulate" if device != "cpu" else None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.8])
def test_dropout_statistics(device, ratio):
    x = f32(400, 500, lo=0.5, hi=2.0)  # no zeros in x, so zeros in Y come from the mask
    y, mask = run_op("Dropout", [x], 2, device=device, ws=dropout_ws(device, 1), ratio=ratio)
    assert mask.dtype == np.bool_ and mask.shape == x.shape
    assert abs((~mask).mean() - ratio) < 0.01, f"dropped fraction {(~mask).mean()} far from {ratio}"
    assert np.all(y[~mask] == 0)
    scale = np.float32(1.0 / (1.0 - float(np.float32(ratio))))
    np.testing.assert_allclose(y[mask], x[mask].astype(np.float64) / (1 - ratio), rtol=1e-6)
    assert np.array_equal(y[mask], x[mask] * scale)
    assert y.dtype == np.float32


def test_dropout_is_deterministic_per_seed_and_same_on_both_devices():
    x = f32(50, 40)
    runs = {(d, s): run_op("Dropout", [x], 2, device=d, ws=dropout_ws(d, s)) for d in DEVICES for s in (7, 8)}
    for s in (7, 8):
        assert all(np.array_equal(a, b) for a, b in zip(runs[("cpu", s)], runs[("emulated", s)], strict=True))
    assert not np.array_equal(runs[("cpu", 7)][1], runs[("cpu", 8)][1])


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_seed_from_device_option_and_fresh_draws_per_run(device):
    x = f32(30, 30)
    masks = []
    for _ in range(2):
        ws = dropout_ws(device, None)
        feed(ws, device, {"X": x})
        opdef = make_op("Dropout", ["X"], ["Y", "mask"], device=device)
        opdef.device_option.random_seed = 123
        net = NetDef(name="d", external_input=["X"])
        net.op.append(opdef)
        ws.create_net(net)
        ws.run_net("d")
        first = ws.fetch("mask")
        ws.run_net("d")
        masks.append((first, ws.fetch("mask")))
    assert np.array_equal(masks[0][0], masks[1][0]) and np.array_equal(masks[0][1], masks[1][1])
    assert not np.array_equal(masks[0][0], masks[0][1]), "each run draws a new mask"


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_test_mode_and_ratio_zero_are_identity(device):
    x = f32(6, 7)
    assert np.array_equal(run_op("Dropout", [x], 1, device=device, is_test=1), x)
    y, mask = run_op("Dropout", [x], 2, device=device, ratio=0.0)
    assert np.array_equal(y, x) and mask.all()


# ----------------------------------------------------------------------------------------------- bad input
BN = bn_inputs("NCHW", (2, 3, 2, 2))
TRAIN = ["Y", "rm", "rv", "a", "b"]
BAD = [  # (id, op, inputs, outputs, args, error, match)
    ("bn-train-1-output", "SpatialBN", BN, ["Y"], {}, ArgumentError, "is_test=0.*5 outputs"),
    ("bn-test-5-outputs", "SpatialBN", BN, TRAIN, {"is_test": 1}, ArgumentError, "1 output"),
    ("bn-not-in-place", "SpatialBN", BN, ["Y", "m2", "rv", "a", "b"], {}, ArgumentError, "in place"),
    ("bn-scale-size", "SpatialBN", {**BN, "scale": f32(4)}, ["Y"], {"is_test": 1}, ShapeError, "scale.*3"),
    ("bn-order", "SpatialBN", BN, ["Y"], {"is_test": 1, "order": "CHWN"}, ArgumentError, "order"),
    ("bn-int", "SpatialBN", {**BN, "X": np.ones((2, 3, 2, 2), np.int32)}, ["Y"], {"is_test": 1}, DTypeError,
     "float"),
    ("bn-sums-missing", "SpatialBN", BN, TRAIN, {"num_batches": 2}, ArgumentError, "sums"),
    ("ln-1d", "LayerNorm", [f32(5)], 3, {}, ShapeError, "at least 2"),
    ("ln-affine-no-gamma", "LayerNorm", [f32(2, 3)], 3, {"elementwise_affine": 1}, ArgumentError, "gamma"),
    ("ln-gamma-size", "LayerNorm", [f32(2, 3), f32(4), f32(3)], 3, {"elementwise_affine": 1}, ShapeError,
     "gamma"),
    ("gn-group", "GroupNorm", [f32(2, 6, 2, 2), f32(6), f32(6)], 3, {"group": 4}, ShapeError, "divide"),
    ("gn-train-1-output", "GroupNorm", [f32(2, 6, 2), f32(6), f32(6)], 1, {"group": 2, "is_test": 0},
     ArgumentError, "3 outputs"),
    ("in-scale", "InstanceNorm", [f32(2, 3, 2, 2), f32(2), f32(3)], 1, {}, ShapeError, "scale"),
    ("dropout-ratio-1", "Dropout", [f32(3)], 2, {"ratio": 1.0}, ArgumentError, r"\[0, 1\)"),
    ("dropout-train-no-mask", "Dropout", [f32(3)], 1, {}, ArgumentError, "mask"),
    ("normalize-axis", "Normalize", [f32(2, 3)], 1, {"axis": 2}, ArgumentError, "axis 2"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,outputs,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input(device, cid, op_type, inputs, outputs, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, outputs, device=device, **args)


RUNTIME_ONLY = {  # shape functions are not told how many outputs an op has, nor the in-place pairs
    "bn-train-1-output", "bn-test-5-outputs", "bn-not-in-place", "gn-train-1-output", "dropout-train-no-mask"}


STATIC_BAD = [b for b in BAD if b[0] not in RUNTIME_ONLY]


@pytest.mark.parametrize("cid,op_type,inputs,outputs,args,err,match", STATIC_BAD,
                         ids=[b[0] for b in STATIC_BAD])
def test_bad_input_found_statically(cid, op_type, inputs, outputs, args, err, match):
    with pytest.raises(err, match=match):
        infer_alone(op_type, inputs, outputs, **args)


@pytest.mark.parametrize("op_type,inputs,allowed", [
    ("LayerNorm", [f32(2, 3)], False), ("GroupNorm", [f32(2, 4, 3), f32(4), f32(4)], False),
    ("Normalize", [f32(2, 3)], False), ("NormalizeL1", [f32(2, 3)], False),
    ("InstanceNorm", [f32(2, 3, 4), f32(3), f32(3)], True), ("Dropout", [f32(2, 3)], True)])
def test_in_place_rules_follow_caffe2(op_type, inputs, allowed):
    names = {f"in{i}": v for i, v in enumerate(inputs)}
    args = {"is_test": 1} if op_type == "Dropout" else {"group": 2} if op_type == "GroupNorm" else {}
    outs = ["in0", "mean", "std"] if op_type == "LayerNorm" else ["in0"]
    if allowed:
        assert run_op(op_type, names, outs, **args).shape == inputs[0].shape
    else:
        with pytest.raises(ArgumentError, match="in place"):
            run_op(op_type, names, outs, **args)


# ----------------------------------------------------------------------------------------------- the tester
def test_reference_checks_catch_broken_kernels(broken):
    ins = bn_inputs("NCHW", (2, 3, 4, 5))
    y = run_op("SpatialBN", ins, ["Y"], is_test=1)
    check(y, bn_reference(ins["X"], ins["scale"], ins["bias"], "NCHW", 1e-5, ins["rm"], ins["rv"])[0])
    bn, drop = REGISTRY.get("SpatialBN").kernel, REGISTRY.get("Dropout").kernel

    def wrong_eps_bn(ctx, xp, x, *rest, **args):  # a plausible bug: the wrong epsilon
        return bn(ctx, xp, x, *rest, **{**args, "epsilon": args["epsilon"] * 100})

    def unscaled_dropout(ctx, xp, x, **args):
        y, mask = drop(ctx, xp, x, **args)
        return x * mask, mask

    broken("SpatialBN", wrong_eps_bn)
    with pytest.raises(AssertionError):
        test_spatial_bn_training("cpu", "NCHW", (2, 3, 4, 5))
    broken("Dropout", unscaled_dropout)
    with pytest.raises(AssertionError):
        test_dropout_statistics("cpu", 0.5)
