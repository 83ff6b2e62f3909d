"""Real model-zoo predict nets (tests/data, see SOURCES.md) run end to end on weights from stepnet.builders.synth.

Expected parameter shapes come from the published architectures (SqueezeNet 1.1's fire modules, AlexNet's
6×6 pool5 at 227×227, GoogLeNet's four-branch concat, ResNet-50's pooled FC), written out here, never read
back from the code under test. Outputs are checked for what any classifier must give: one probability row
per image (finite, non-negative, summing to 1), batch independence, and a signal that is not flat.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from stepnet.io import proto
from stepnet.cli.run import main
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.core.spec import spec
from stepnet.builders.synth import synth_init, write_init
from stepnet.testing import make_op
from stepnet.runtime.workspace import Workspace

DATA = Path(__file__).resolve().parent / "data"
SQUEEZE = DATA / "caffe2" / "squeeze_predict_net.pb"
ZOO = {  # file, data blob, image side
    "squeezenet": (SQUEEZE, "data", 224),
    "armcompute_squeezenet": (DATA / "caffe2" / "armcompute_squeezenet_predict.pb", "data", 224),
    "alexnet": (DATA / "models" / "bvlc_alexnet_predict_net.pbtxt", "data", 227),
    "inception_v1": (DATA / "models" / "inception_v1_predict_net.pbtxt", "data", 224),
    "resnet50": (DATA / "models" / "resnet50_predict_net.pbtxt", "gpu_0/data", 224),
}


def images(n, side, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 3, side, side)).astype(np.float32)


def run_zoo(key, batch=1, x=None, **options):
    """(predict net, init net, probabilities) of one zoo net at the given batch size."""
    path, data, side = ZOO[key]
    net = proto.load(path, kind="net")
    init = synth_init(net, {data: (batch, 3, side, side)}, **options)
    ws = Workspace()
    ws.run_net_once(init)
    ws.feed(data, images(batch, side) if x is None else x)
    ws.create_net(net).run()
    return net, init, ws.fetch(net.external_output[-1])


def check_probabilities(p, batch, classes=1000):
    """One row of class probabilities per image, as a softmax classifier must give."""
    assert p.shape in ((batch, classes), (batch, classes, 1, 1)), p.shape
    rows = p.reshape(batch, classes).astype(np.float64)
    assert np.isfinite(rows).all() and (rows >= 0).all()
    for i, row in enumerate(rows):
        assert math.isclose(math.fsum(row), 1.0, abs_tol=1e-4), f"row {i} sums to {math.fsum(row)}"


def shapes_of(init):
    return {op.output[0]: tuple(a.ints) for op in init.op for a in op.arg if a.name == "shape"}


# --------------------------------------------------------------------------------------------- the zoo
@pytest.mark.parametrize("key", sorted(ZOO))
def test_zoo_net_runs_on_synthesized_weights(key):
    net, init, p = run_zoo(key)
    check_probabilities(p, 1)
    assert p.max() > 2.0 / 1000  # the signal reached the classifier: not the flat softmax of zero logits
    produced = set(init.external_output)
    data = ZOO[key][1]
    read = {n for op in net.op for n in op.input}
    params = {n for n in net.external_input if n != data and n in read}
    assert produced == params  # every parameter read by an op, and nothing for the data input


def test_squeezenet_batch_of_two_matches_single_images():
    x = images(2, 224, seed=3)
    _, _, p2 = run_zoo("squeezenet", batch=2, x=x)
    check_probabilities(p2, 2)
    for i in range(2):
        _, _, p1 = run_zoo("squeezenet", batch=1, x=x[i:i + 1])
        np.testing.assert_allclose(p2[i], p1[0], rtol=1e-4, atol=1e-7)
    assert not np.allclose(p2[0], p2[1])


def test_squeezenet_parameter_shapes_follow_the_architecture():
    # SqueezeNet 1.1: conv1 3×3/2 on RGB; fire2..fire9 = squeeze 1×1, then expand 1×1 and 3×3 concatenated;
    # conv10 1×1 to the classes. With every width 64, each fire module outputs 64 + 64 channels.
    width = 64
    want = {"conv1_w": (width, 3, 3, 3), "conv1_b": (width,)}
    channels_in = width
    for k in range(2, 10):
        f = f"fire{k}/"
        want.update({f + "squeeze1x1_w": (width, channels_in, 1, 1), f + "expand1x1_w": (width, width, 1, 1),
                     f + "expand3x3_w": (width, width, 3, 3)})
        want.update({f + s + "_b": (width,) for s in ("squeeze1x1", "expand1x1", "expand3x3")})
        channels_in = 2 * width
    want.update({"conv10_w": (1000, channels_in, 1, 1), "conv10_b": (1000,)})
    assert shapes_of(synth_init(proto.load(SQUEEZE), {"data": (1, 3, 224, 224)})) == want


@pytest.mark.parametrize("key, blob, dims", [
    ("alexnet", "fc6_w", (64, 64 * 6 * 6)),          # pool5 is 6×6 at 227×227
    ("alexnet", "fc8_w", (1000, 64)),
    ("inception_v1", "conv1/7x7_s2_w", (64, 3, 7, 7)),
    ("inception_v1", "loss3/classifier_w", (1000, 1, 1, 4 * 64)),  # four branches concatenated; axis_w=3
    ("resnet50", "gpu_0/pred_w", (1000, 64)),
    ("resnet50", "gpu_0/res_conv1_bn_riv", (64,)),
])
def test_zoo_parameter_shapes(key, blob, dims):
    path, data, side = ZOO[key]
    assert shapes_of(synth_init(proto.load(path, kind="net"), {data: (1, 3, side, side)}))[blob] == dims


def test_width_classes_and_params_options():
    init = synth_init(proto.load(SQUEEZE), {"data": (1, 3, 224, 224)}, width=16, classes=10,
                      params={"conv1_w": (8, 3, 3, 3)})
    shapes = shapes_of(init)
    assert shapes["conv1_b"] == (8,) and shapes["fire2/squeeze1x1_w"] == (16, 8, 1, 1)
    assert shapes["conv10_w"] == (10, 32, 1, 1)
    ws = Workspace()
    ws.run_net_once(init)
    ws.feed("data", images(1, 224))
    net = proto.load(SQUEEZE)
    ws.create_net(net).run()
    check_probabilities(ws.fetch("softmaxout"), 1, classes=10)


# --------------------------------------------------------------------------------------------- the fills
def test_fills_are_deterministic_and_follow_the_seed():
    net = proto.load(SQUEEZE)
    a, b = (synth_init(net, {"data": (1, 3, 224, 224)}, seed=5) for _ in range(2))
    assert a.SerializeToString() == b.SerializeToString()
    c = synth_init(net, {"data": (1, 3, 224, 224)}, seed=6)
    values = []
    for init, ws_seed in ((a, 0), (b, 99), (c, 0)):
        ws = Workspace(seed=ws_seed)  # the workspace's own seed must not matter
        ws.run_net_once(init)
        values.append(ws.fetch("conv10_w"))
    np.testing.assert_array_equal(values[0], values[1])
    assert not np.allclose(values[0], values[2])


def test_weight_statistics_and_constants():
    init = synth_init(proto.load(SQUEEZE), {"data": (1, 3, 224, 224)})
    ws = Workspace()
    ws.run_net_once(init)
    w = ws.fetch("conv10_w")                      # 1000 × 128 × 1 × 1: fan-in 128
    assert w.dtype == np.float32 and abs(w.mean()) < 0.005
    assert abs(w.std() / math.sqrt(2 / 128) - 1) < 0.02
    w3 = ws.fetch("fire9/expand3x3_w")            # fan-in 64·3·3
    assert abs(w3.std() / math.sqrt(2 / 576) - 1) < 0.03
    assert (ws.fetch("conv10_b") == 0).all() and ws.fetch("conv10_b").dtype == np.float32


def test_broken_gaussian_fill_is_caught(broken):
    schema = REGISTRY.get("GaussianFill")

    def unit_std(xp, *inputs, std, **args):
        return schema.kernel(xp, *inputs, std=1.0, **args)
    broken("GaussianFill", unit_std)
    with pytest.raises(AssertionError):
        test_weight_statistics_and_constants()


def test_broken_softmax_is_caught(broken):
    check_probabilities(run_zoo("alexnet")[2], 1)

    def unnormalised(xp, X, axis=1):
        return xp.exp(X - X.max(axis=axis, keepdims=True))
    broken("Softmax", unnormalised)
    _, _, p = run_zoo("alexnet")
    with pytest.raises(AssertionError, match="sums to"):
        check_probabilities(p, 1)


# --------------------------------------------------------------------------------------------- rules
def small_net(*ops, outputs=("y",), device=None):
    net = proto.NetDef(name="small")
    for type_, ins, outs, args in ops:
        net.op.append(make_op(type_, ins, outs, **args))
    net.external_output.extend(outputs)
    if device is not None:
        net.device_option.CopyFrom(device)
    return net


def run_small(net, feeds, **options):
    init = synth_init(net, {k: v.shape for k, v in feeds.items()}, **options)
    ws = Workspace()
    ws.run_net_once(init)
    for k, v in feeds.items():
        ws.feed(k, v)
    ws.create_net(net).run()
    values = {n: ws.fetch(n) for n in init.external_output}
    return shapes_of(init), values, ws


def rand(*shape):
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("args, x, w, y", [
    ({"kernel": 3, "group": 2}, (1, 4, 8, 8), (6, 2, 3, 3), (1, 6, 6, 6)),
    ({"kernel_h": 3, "kernel_w": 1, "order": "NHWC"}, (1, 8, 8, 3), (6, 3, 1, 3), (1, 6, 8, 6)),
    ({"kernels": [3], "pads": [1, 1]}, (2, 5, 9), (6, 5, 3), (2, 6, 9)),
    ({"kernel": 1, "group": 4}, (1, 4, 3, 3), (8, 1, 1, 1), (1, 8, 3, 3)),  # width 6 rounded up to 8
])
def test_conv_rule(args, x, w, y):
    net = small_net(("Conv", ["x", "w", "b"], ["y"], args), outputs=())
    shapes, values, ws = run_small(net, {"x": rand(*x)}, classes=6)   # the only layer: the classifier
    assert shapes == {"w": w, "b": (w[0],)} and ws.fetch("y").shape == y


@pytest.mark.parametrize("order, x, w, y", [
    ("NCHW", (1, 4, 5, 5), (4, 3, 2, 2), (1, 3, 10, 10)),
    ("NHWC", (1, 5, 5, 4), (4, 2, 2, 3), (1, 10, 10, 3)),
])
def test_conv_transpose_gets_the_classes_as_last_layer(order, x, w, y):
    net = small_net(("ConvTranspose", ["x", "w", "b"], ["y"], {"kernel": 2, "stride": 2, "order": order}))
    shapes, _, ws = run_small(net, {"x": rand(*x)}, width=7, classes=3)
    assert shapes == {"w": w, "b": (3,)} and ws.fetch("y").shape == y


@pytest.mark.parametrize("type_, args, w", [
    ("FC", {"axis": 2}, (64, 20)),
    ("FCTransposed", {"axis": 2}, (20, 64)),
    ("FC", {"axis_w": 2}, (64, 1, 60)),
])
def test_fc_rule(type_, args, w):
    net = small_net((type_, ["x", "w", "b"], ["h"], args), ("Relu", ["h"], ["y"], {}),
                    (type_, ["y", "w2", "b2"], ["z"], args), outputs=("z",))
    shapes, _, ws = run_small(net, {"x": rand(2, 3, 4, 5)}, classes=5)
    assert shapes["w"] == w and shapes["b"] == (64,) and shapes["b2"] == (5,)
    assert ws.fetch("h").shape[-1] == 64 and ws.fetch("z").shape[-1] == 5


def test_per_channel_rules_and_their_constants():
    net = small_net(
        ("SpatialBN", ["x", "s", "bias", "mean", "var"], ["a"], {"is_test": 1, "order": "NHWC"}),
        ("PRelu", ["a", "slope"], ["b"], {"order": "NHWC"}),
        ("InstanceNorm", ["b", "in_s", "in_b"], ["c"], {"order": "NHWC"}),
        ("GroupNorm", ["c", "gn_g", "gn_b"], ["d"], {"group": 2, "order": "NHWC"}),
        ("LayerNorm", ["d", "ln_g", "ln_b"], ["y", "mu", "sig"], {"axis": 2, "elementwise_affine": 1}))
    shapes, v, ws = run_small(net, {"x": rand(2, 3, 5, 6)})
    per_channel = ["s", "bias", "mean", "var", "slope", "in_s", "in_b", "gn_g", "gn_b"]
    assert shapes == {**dict.fromkeys(per_channel, (6,)), "ln_g": (5, 6), "ln_b": (5, 6)}
    ones, zeros = ("s", "var", "in_s", "gn_g", "ln_g"), ("bias", "mean", "in_b", "gn_b", "ln_b")
    assert all((v[n] == 1).all() for n in ones) and all((v[n] == 0).all() for n in zeros)
    assert (v["slope"] == np.float32(0.25)).all() and ws.fetch("y").shape == (2, 3, 5, 6)


@pytest.mark.parametrize("type_, args, j, dims, value", [
    ("Mul", {"broadcast": 1, "axis": 1}, 1, (3,), 1.0),
    ("Add", {"broadcast": 1, "axis_str": "C", "order": "NHWC"}, 1, (5,), 0.0),
    ("Div", {"broadcast": 1}, 1, (5,), 1.0),
    ("Sub", {}, 1, (2, 3, 4, 5), 0.0),
    ("Add", {}, 0, (2, 3, 4, 5), 0.0),
])
def test_broadcast_operand_rule(type_, args, j, dims, value):
    ins = ["p", "x"] if j == 0 else ["x", "p"]
    shapes, v, ws = run_small(small_net((type_, ins, ["y"], args)), {"x": rand(2, 3, 4, 5)})
    assert shapes == {"p": dims} and (v["p"] == value).all()
    np.testing.assert_array_equal(ws.fetch("y"), ws.fetch("x"))  # identity operands leave x unchanged


@pytest.mark.parametrize("net, inputs, message", [
    (small_net(("Mul", ["p", "x"], ["y"], {"broadcast": 1})), {"x": (2, 3)}, "operand A is the larger"),
    (small_net(("Add", ["p", "q"], ["y"], {})), {}, "both operands are unknown"),
    (small_net(("Concat", ["x", "w"], ["y", "s"], {})), {"x": (2, 3)}, "no rule for this op"),
    (small_net(("Conv", ["x", "w", "b"], ["y"], {})), {"x": (1, 3, 4, 4)}, "gives no kernel size"),
    (small_net(("Conv", ["x", "w", "b"], ["y"], {"kernel": 1, "group": 2})), {"x": (1, 3, 4, 4)},
     "group 2 does not divide the 3 input channels"),
])
def test_unshapeable_parameter_names_blob_op_and_the_fix(net, inputs, message):
    with pytest.raises(ShapeError, match=message) as e:
        synth_init(net, inputs)
    assert "cannot shape parameter" in str(e.value) and "params={'" in str(e.value) and "#0" in str(e.value)


def test_params_rescue_an_op_without_rule():
    net = small_net(("Concat", ["x", "w"], ["y", "s"], {"axis": 1}))
    shapes, v, ws = run_small(net, {"x": rand(2, 3)}, params={"w": (2, 4)})
    assert shapes == {"w": (2, 4)} and ws.fetch("y").shape == (2, 7)


def test_missing_data_input_and_unknown_names():
    net = proto.load(SQUEEZE)
    with pytest.raises(ShapeError, match=r"input 'data' is made by no earlier op.*inputs=\{'data': DIMS\}"):
        synth_init(net, {})
    with pytest.raises(ArgumentError, match="'dta' is not an input of any op.*did you mean data"):
        synth_init(net, {"dta": (1, 3, 224, 224)})
    with pytest.raises(ArgumentError, match="non-negative integers"):
        synth_init(net, {"data": (1, -3, 224, 224)})
    with pytest.raises(ArgumentError, match="'conv1', but it is not a parameter.*an op makes it"):
        synth_init(net, {"data": (1, 3, 224, 224)}, params={"conv1": (1, 64, 111, 111)})


def test_op_without_shape_function_is_run_once(patched):
    net = small_net(("Relu", ["x"], ["h"], {}), ("Conv", ["h", "w", "b"], ["y"], {"kernel": 3}))
    patched("Relu", shape=None)
    shapes, _, ws = run_small(net, {"x": rand(1, 2, 5, 5)}, classes=4)
    assert shapes == {"w": (4, 2, 3, 3), "b": (4,)}


def test_op_failing_on_placeholders_is_explained(temporary_op):
    def kernel(xp, x):
        raise ShapeError("placeholder trouble")
    temporary_op("SynthTestFails", kernel, inputs=1, outputs=1)
    net = small_net(("SynthTestFails", ["x"], ["g"], {}), ("Relu", ["g"], ["h"], {}),
                    ("FC", ["h", "w", "b"], ["y"], {}))
    why = "'h' is unknown.*no shape function and failed.*placeholder trouble"
    with pytest.raises(ShapeError, match=why):
        synth_init(net, {"x": (2, 3)})


def test_fills_take_the_device_of_the_net():
    device = proto.DeviceOption(device_type=1, device_id=0)
    net = small_net(("FC", ["x", "w", "b"], ["y"], {}), device=device)
    init = synth_init(net, {"x": (2, 3)}, seed=1)
    assert all(op.device_option.device_type == 1 for op in init.op)
    assert [op.type for op in init.op] == ["GaussianFill", "ConstantFill"]
    seeded = [op.device_option.HasField("random_seed") for op in init.op]
    assert seeded == [True, False]
    ws = Workspace(gpu="emulate")
    ws.run_net_once(init)
    ws.feed("x", rand(2, 3), device_option=device)
    ws.create_net(net).run()
    assert ws.fetch("y").shape == (2, 1000)


# --------------------------------------------------------------------------------------------- data dtypes
def test_a_tensor_spec_input_gives_its_dtype_to_shape_inference():
    net = proto.NetDef(name="g")
    net.op.extend([make_op("Gather", ["x", "idx"], ["g"]), make_op("FC", ["g", "w", "b"], ["y"])])
    with pytest.raises(DTypeError, match="INDICES must be int32 or int64, got float32"):
        synth_init(net, {"x": (5, 3), "idx": (2,)})
    init = synth_init(net, {"x": (5, 3), "idx": spec((2,), np.int64)}, classes=4)
    assert shapes_of(init) == {"w": (4, 3), "b": (4,)}


def test_write_init_and_cli_run(tmp_path, capsys):
    init_path = tmp_path / "init.pbtxt"
    write_init(SQUEEZE, init_path, {"data": (1, 3, 224, 224)}, width=8)
    np.save(tmp_path / "x.npy", images(1, 224))
    assert main(["run", str(init_path), str(SQUEEZE), "--feed", f"data={tmp_path / 'x.npy'}", "-q",
                 "--save", str(tmp_path / "out.npz")]) == 0
    check_probabilities(np.load(tmp_path / "out.npz")["softmaxout"], 1)


def test_init_net_missing_parameters_is_a_missing_blob_error(tmp_path, capsys):
    init = synth_init(proto.load(SQUEEZE), {"data": (1, 3, 224, 224)}, width=8)
    dropped = ["fire4/expand3x3_b", "conv10_w"]
    kept = [op for op in init.op if op.output[0] not in dropped]
    del init.op[:]
    init.op.extend(kept)
    outputs = [n for n in init.external_output if n not in dropped]
    del init.external_output[:]
    init.external_output.extend(outputs)
    proto.save(init, tmp_path / "init.pb")
    np.save(tmp_path / "x.npy", images(1, 224))
    feed = f"data={tmp_path / 'x.npy'}"
    code = main(["--debug", "run", str(tmp_path / "init.pb"), str(SQUEEZE), "--feed", feed])
    err = capsys.readouterr().err
    assert code == 1 and "MissingBlobError" in err
    line = [ln for ln in err.splitlines() if ln.startswith("stepnet: error:")][0]
    assert line.endswith("needs blobs that neither the init net makes nor --feed gives: fire4/expand3x3_b, "
                         "conv10_w; feed them with --feed NAME=FILE.npy; for trained weights, load the checkpoint "
                         "their training run saved with --load CKPT")
