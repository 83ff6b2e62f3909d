"""Public names of Caffe2's Python modules that stepnet.compat gained late, by module: each checked against
Caffe2's documented names, formats and behaviour, or against an independent reference (numpy in float64,
np.add.at, onnx.helper, onnxruntime)."""
import shutil
import sys

import warnings

import numpy as np
import pytest

from stepnet.compat import brew, context, core, dataset, model_helper, net_drawer, optimizer, schema, workspace
from stepnet.compat.modeling.parameter_info import ParameterInfo
from stepnet.compat.optimizer_context import UseOptimizer
from stepnet.core.errors import StepnetWarning
from stepnet.ops.base import GradientSlice


def run(model):
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)


# ------------------------------------------------------------------------------------------------ optimizer
def test_optimizer_blob_names_have_caffe2s_format():
    first, second = optimizer.SgdOptimizer(), optimizer.SgdOptimizer()
    assert first.get_cpu_blob_name("lr") == "SgdOptimizer_0_lr_cpu"
    assert second.get_cpu_blob_name("lr", "node_a") == "SgdOptimizer_1_lrnode_a_cpu"
    assert second.get_gpu_blob_name("lr", 3, "") == "SgdOptimizer_1_lr_gpu3"
    assert optimizer.AdamOptimizer().get_gpu_blob_name("m", 0, "n1") == "AdamOptimizer_0_mn1_gpu0"
    assert first.make_unique_blob_name("lr") == "SgdOptimizer_0_lr_cpu"
    with core.DeviceScope(core.DeviceOption(1, 2)):
        assert first.make_unique_blob_name("lr") == "SgdOptimizer_0_lr_gpu2"
    cpu = core.DeviceOption(0)
    cpu.node_name = "host7"
    with core.DeviceScope(cpu):
        assert first.make_unique_blob_name("lr") == "SgdOptimizer_0_lrhost7_cpu"


def test_scale_learning_rate_is_each_optimizers_own():
    with pytest.raises(NotImplementedError, match="scale_learning_rate"):
        optimizer.Optimizer().scale_learning_rate(2.0)
    with pytest.raises(NotImplementedError):
        optimizer.WeightDecayBuilder(1e-4).scale_learning_rate(2.0)


def dense_model(x):
    """loss = sum(w * x), so d loss / d w = x."""
    model = model_helper.ModelHelper(name="dense")
    w = model.param_init_net.ConstantFill([], "w", shape=list(x.shape), value=1.0)
    model.AddParameter(w)
    loss = model.net.SumElements(model.net.Mul([w, "x"], "wx"), "loss")
    model.AddGradientOperators([loss])
    workspace.FeedBlob("x", x)
    return model


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_scale_learning_rate_changes_the_rate_a_step_uses(kind):
    x = np.array([[0.5, -2.0, 3.0]], dtype=np.float32)
    model = dense_model(x)
    opt = {"sgd": optimizer.SgdOptimizer(base_learning_rate=0.2), "adagrad": optimizer.AdagradOptimizer(alpha=0.2),
           "adam": optimizer.AdamOptimizer(alpha=0.2)}[kind]
    opt.scale_learning_rate(0.25)
    optimizer._build(model, opt)
    run(model)
    g, lr = x.astype(np.float64), 0.2 * 0.25
    if kind == "sgd":
        step = lr * g
    elif kind == "adagrad":
        step = lr * g / (np.sqrt(g * g) + 1e-4)
    else:   # one Adam step: m = (1-b1) g, v = (1-b2) g², rate lr sqrt(1-b2^t)/(1-b1^t) with Caffe2's t =
        # iteration + 1 = 2 (adam_op.h; AtomicIter has made the iteration 1)
        m, v, t = 0.1 * g, 0.001 * g * g, 2
        step = lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-8)
    np.testing.assert_allclose(workspace.FetchBlob("w"), 1.0 - step, rtol=1e-5)


def test_dedup_sums_or_averages_the_rows_of_each_index():
    indices = np.array([3, 0, 3, 1, 0, 3], dtype=np.int64)
    values = np.arange(18, dtype=np.float32).reshape(6, 3) / 7
    workspace.FeedBlob("ids", indices)
    workspace.FeedBlob("vals", values)
    for aggregator in ("sum", "mean", "SUM"):
        net = core.Net("dedup_" + aggregator.lower())
        grad = optimizer.Optimizer.dedup(net, aggregator, GradientSlice("ids", "vals"))
        assert [op.type for op in net.Proto().op] == ["Unique", "Unsorted" + ("Segment" + aggregator.title())]
        workspace.RunNetOnce(net)
        ids, rows = workspace.FetchBlob(str(grad.indices)), workspace.FetchBlob(str(grad.values))
        expected = np.zeros((4, 3))
        np.add.at(expected, indices, values.astype(np.float64))
        if aggregator == "mean":
            expected /= np.maximum(np.bincount(indices, minlength=4), 1)[:, None]
        assert sorted(ids.tolist()) == [0, 1, 3]
        np.testing.assert_allclose(rows, expected[ids], rtol=1e-6)


def test_dedup_without_an_aggregator_and_its_misuses():
    net = core.Net("d")
    grad = GradientSlice("ids", "vals")
    assert optimizer.Optimizer.dedup(net, None, grad) is grad and not net.Proto().op
    with pytest.raises(AssertionError, match="sparse gradient"):
        optimizer.Optimizer.dedup(net, "sum", core.BlobReference("dense_grad"))
    with pytest.raises(ValueError, match="max is not supported"):
        optimizer.Optimizer.dedup(net, "max", grad)


def gather_model():
    """loss = sum(scale * Gather(w, ids)): the gradient of w is a slice whose indices repeat."""
    model = model_helper.ModelHelper(name="m")
    w = model.param_init_net.ConstantFill([], "w", shape=[5, 2], value=1.0)
    model.AddParameter(w)
    rows = model.net.Gather([w, "ids"], "rows")
    loss = model.net.SumElements(model.net.Mul([rows, "scale"], "scaled"), "loss")
    model.AddGradientOperators([loss])
    return model


@pytest.mark.parametrize("dedup", [None, "sum"])
def test_sparse_adagrad_with_dedup_updates_each_row_once_with_its_summed_gradient(dedup):
    ids = np.array([1, 3, 1, 1], dtype=np.int32)
    scale = np.array([[1.0, -2.0], [0.5, 0.5], [3.0, 1.0], [-1.0, 4.0]], dtype=np.float32)
    workspace.FeedBlob("ids", ids)
    workspace.FeedBlob("scale", scale)
    model = gather_model()
    optimizer.build_adagrad(model, 0.3, sparse_dedup_aggregator=dedup)
    kinds = [op.type for op in model.net.Proto().op]
    assert ("Unique" in kinds and "UnsortedSegmentSum" in kinds) == (dedup is not None)
    run(model)
    w, h = np.ones((5, 2)), np.zeros((5, 2))
    if dedup:   # one Adagrad step per row with the summed gradient
        g = np.zeros((5, 2))
        np.add.at(g, ids, scale.astype(np.float64))
        for r in np.unique(ids):
            h[r] += g[r] ** 2
            w[r] -= 0.3 * g[r] / (np.sqrt(h[r]) + 1e-4)
    else:       # a step per occurrence, in order
        for r, gr in zip(ids, scale.astype(np.float64)):
            h[r] += gr ** 2
            w[r] -= 0.3 * gr / (np.sqrt(h[r]) + 1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("w"), w, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("w_squared_sum"), h, rtol=1e-5)


@pytest.mark.parametrize("build", [optimizer.build_sgd, optimizer.build_adam, optimizer.build_ftrl])
def test_every_sparse_optimizer_dedups_its_slices(build):
    workspace.FeedBlob("ids", np.array([0, 2, 0], dtype=np.int32))
    workspace.FeedBlob("scale", np.ones((3, 2), dtype=np.float32))
    model = gather_model()
    kwargs = ({"lambda1": 0.0, "lambda2": 0.0} if build is optimizer.build_ftrl   # (Caffe2's int 0 defaults
              else {"base_learning_rate": 0.1})                                    # are refused by its op too)
    build(model, sparse_dedup_aggregator="mean", **kwargs)
    kinds = [op.type for op in model.net.Proto().op]
    assert "Unique" in kinds and "UnsortedSegmentMean" in kinds
    run(model)


# ------------------------------------------------------------------------------------------------ model_helper
def test_add_param_deprecated_records_a_blob_with_its_init_shape():
    model = model_helper.ModelHelper()
    w = model.param_init_net.XavierFill([], "w", shape=[3, 4])
    b = model.param_init_net.ConstantFill([], "b", shape=[3])
    info = model.add_param_DEPRECATED(w)
    assert isinstance(info, ParameterInfo) and (info.param_id, info.name, info.shape, info.size) == (0, "w", [3, 4], 12)
    info = model.add_param_DEPRECATED(b, shape=[7], length=3)
    assert (info.param_id, info.shape, info.length) == (1, [7], 3)
    assert [str(p) for p in model.params] == ["w", "b"]
    with pytest.raises(ValueError, match="must be a BlobReference"):
        model.add_param_DEPRECATED("plain_string")
    assert [str(p) for p in model.params] == ["w", "b"]


def test_param_info_lists_every_parameter_by_position_with_its_gradient():
    workspace.FeedBlob("ids", np.array([0, 1], dtype=np.int32))
    workspace.FeedBlob("scale", np.ones((2, 2), dtype=np.float32))
    model = gather_model()                       # w: a sparse gradient
    fc = brew.fc(model, "scaled", "fc", 2, 3)    # fc_w, fc_b: created after AddGradientOperators, no gradient
    infos = model.param_info()
    assert [(i.param_id, i.name, i.shape) for i in infos] == [(0, "w", [5, 2]), (1, "fc_w", [3, 2]),
                                                              (2, "fc_b", [3])]
    assert isinstance(infos[0].grad, GradientSlice) and infos[1].grad is None
    assert model.param_info(grad_type="sparse") == [infos[0]] and model.param_info(grad_type="dense") == []
    assert model.param_info(id=2) is infos[2] and str(fc) == "fc"
    with pytest.raises(AssertionError):
        model.param_info(grad_type="dense", id=0)


def test_parameter_info_optimizer_is_set_once():
    info = ParameterInfo(param_id=None, param=core.BlobReference("p"))
    assert info.optimizer is None
    opt = optimizer.SgdOptimizer()
    info.optimizer = opt
    assert info.optimizer is opt
    with pytest.raises(AssertionError, match="already been set"):
        info.optimizer = optimizer.SgdOptimizer()


def test_use_optimizer_gives_the_parameters_made_in_it_their_optimizer():
    # Caffe2's optimizer_test.TestOptimizerContext, with every learning rate it expects required to exist
    model = model_helper.ModelHelper(name="test", arg_scope={"order": "NCHW"})
    cnv_optim, weight_optim, bias_optim = (optimizer.SgdOptimizer(0.15), optimizer.SgdOptimizer(0.2),
                                           optimizer.SgdOptimizer(0.1))
    with UseOptimizer(cnv_optim):
        cnv = brew.conv(model, "data", "cnv", 32, 32, 4)
    with UseOptimizer({"WEIGHT": weight_optim, "BIAS": bias_optim}):
        a = brew.fc(model, cnv, "a", 100, 200)
    pred = brew.fc(model, a, "b", 200, 5)
    assert model.get_param_info(core.BlobReference("cnv_b")).optimizer is cnv_optim
    assert model.get_param_info(core.BlobReference("a_w")).optimizer is weight_optim
    assert model.get_param_info(core.BlobReference("a_b")).optimizer is bias_optim
    assert model.get_param_info(core.BlobReference("b_w")).optimizer is None
    _, loss = model.SoftmaxWithLoss([pred, "label"], ["softmax", "loss"])
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, 0.11)
    rates = {op.output[0]: op.arg[0].f for op in model.net.Proto().op if op.type == "LearningRate"}
    assert rates == pytest.approx({"SgdOptimizer_0_lr_cpu": -0.15, "SgdOptimizer_1_lr_cpu": -0.2,
                                   "SgdOptimizer_2_lr_cpu": -0.1, "SgdOptimizer_3_lr_cpu": -0.11})


# ------------------------------------------------------------------------------------------------ dataset
def test_dataset_field_types_are_the_schemas_dtypes():
    fields = schema.Struct(("label", schema.Scalar(np.int32)),
                           ("feats", schema.List(schema.Scalar(np.float32))),
                           ("name", schema.Scalar(str)))
    ds = dataset.Dataset(fields)
    assert ds.field_names() == ["label", "feats:lengths", "feats:values", "name"]
    assert ds.field_types == [np.dtype(np.int32), np.dtype(np.int32), np.dtype(np.float32), np.dtype(str)]
    assert dataset.Dataset.field_types(ds) is ds.field_types   # the method Caffe2's attribute hides
    assert dataset.Dataset(["a", "b:c"]).field_types == [np.dtype(np.void)] * 2


# ------------------------------------------------------------------------------------------------ brew
def test_brew_registry_is_a_helper_wrapper():
    assert isinstance(brew.HelperWrapper._registry, dict) and "fc" in brew.HelperWrapper._registry
    wrapper = brew.HelperWrapper(None)
    for name in ("group_conv_deprecated", "max_pool_with_index", "arg_scope", "fc", "db_input"):
        assert wrapper.has_helper(name) and brew.has_helper(name)
    with pytest.raises(AttributeError, match="Helper function no_such_helper not registered"):
        wrapper.no_such_helper    # noqa: B018
    model = model_helper.ModelHelper(arg_scope={"order": "NHWC"})
    with brew.arg_scope([brew.fc], axis=1):
        y = wrapper.fc(model, "x", "y", 4, 2)
    assert str(y) == "y" and wrapper.fc.__name__ == "fc"
    args = {a.name: a for a in model.net.Proto().op[-1].arg}
    assert args["axis"].i == 1 and args["order"].s == b"NHWC"   # fc takes **kwargs: the whole arg_scope


def test_brew_register_goes_through_the_wrapper():
    def scaled_relu(model, blob_in, blob_out, order="NCHW"):
        return model.net.Relu(blob_in, blob_out, order=order)
    assert not brew.has_helper(scaled_relu)
    brew.Register(scaled_relu)
    try:
        assert brew.has_helper("scaled_relu") and brew.HelperWrapper._registry["scaled_relu"] is scaled_relu
        model = model_helper.ModelHelper(arg_scope={"order": "NHWC"})
        brew.scaled_relu(model, "x", "y")
        args = model.net.Proto().op[-1].arg   # the model's arg_scope, filtered to the helper's parameters
        assert [(a.name, a.s) for a in args] == [("order", b"NHWC")]
        with pytest.raises(AttributeError, match="already exists"):
            brew.Register(scaled_relu)
        with pytest.raises(RuntimeError, match="first input of helper function should be model"):
            brew.scaled_relu("x", "y")
    finally:
        del brew.HelperWrapper._registry["scaled_relu"]
        delattr(brew, "scaled_relu")


# ------------------------------------------------------------------------------------------------ context
def test_context_current_is_the_classmethod_define_context_installs():
    assert isinstance(context.current, classmethod)

    @context.define_context()
    class Block:
        pass
    assert Block.current(required=False) is None
    with Block() as outer:
        assert Block.current() is outer and context.current.__func__(Block) is outer
        with Block() as inner:
            assert Block.current() is inner
        other = Block()
        assert Block.current(other) is other
    with pytest.raises(AssertionError, match="required but none is active"):
        Block.current()


# ------------------------------------------------------------------------------------------------ net_drawer
def draw(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["net_drawer.py", *argv])
    net_drawer.main()


def test_net_drawer_main_writes_each_net_as_dot_and_pdf(tmp_path, monkeypatch, capsys):
    net = core.Net("tiny")
    net.FC(["x", "w", "b"], "y")
    net.Relu("y", "y")
    (tmp_path / "tiny.pb").write_bytes(net.Proto().SerializeToString())
    draw(monkeypatch, "--input", str(tmp_path / "tiny.pb"), "--output_prefix", str(tmp_path / "out_"),
         "--rankdir", "TB", "--append_output")
    text = (tmp_path / "out_tiny.dot").read_text()
    assert text.startswith('digraph "tiny" {\n  rankdir="TB";')
    assert '"FC (op#0)\\ny" -> "y0";' in text and '"y0" -> "Relu (op#1)\\ny";' in text
    if shutil.which("dot"):
        assert (tmp_path / "out_tiny.pdf").read_bytes().startswith(b"%PDF")
    else:
        assert "We have generated the .dot file" in capsys.readouterr().out


def test_net_drawer_main_minimal_plans_and_no_graphviz(tmp_path, monkeypatch, capsys):
    net = core.Net("chain")
    net.Relu("x", "a")
    net.Sigmoid("a", "b")
    net.Add(["a", "b"], "c")
    plan = core.Plan("p")
    plan.AddStep(core.execution_step("s", net))
    (tmp_path / "plan.pbtxt").write_text(str(plan.Proto()))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    draw(monkeypatch, "--input", str(tmp_path / "plan.pbtxt"), "--output_prefix", str(tmp_path) + "/",
         "--minimal", "--minimal_dependency")
    assert "will not be able to generate pdf" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p_chain.dot", "plan.pbtxt"]
    text = (tmp_path / "p_chain.dot").read_text()
    assert '"Relu (op#0)" -> "Sigmoid (op#1)";' in text and '"Sigmoid (op#1)" -> "Add (op#2)";' in text
    assert '"Relu (op#0)" -> "Add (op#2)"' not in text   # implied by the other two
    with pytest.raises(SystemExit) as stop:
        draw(monkeypatch, "--input", str(tmp_path / "missing.pb"))
    assert stop.value.code == 1 and "missing.pb" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        draw(monkeypatch)
    assert stop.value.code == 2 and "--input" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ helpers
def grouped_conv(x, w, b, group, pad):
    """NCHW cross-correlation of groups, stride 1, in float64: output channel o reads input channels of its group."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    o, cg, k, _ = w.shape
    out = np.zeros((n, o, h - k + 1, wd - k + 1))
    per_group = o // group
    for oc in range(o):
        g = oc // per_group
        for i in range(out.shape[2]):
            for j in range(out.shape[3]):
                patch = x[:, g * cg:(g + 1) * cg, i:i + k, j:j + k]
                out[:, oc, i, j] = (patch * w[oc]).sum(axis=(1, 2, 3)) + b[oc]
    return out


def test_group_conv_deprecated_builds_caffe2s_split_conv_concat_and_convolves_by_groups():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    workspace.FeedBlob("x", x)
    model = model_helper.ModelHelper(name="g")
    y = brew.group_conv_deprecated(model, "x", "y", dim_in=4, dim_out=6, kernel=3, group=2, pad=1,
                                   bias_init=("GaussianFill", {"std": 1.0}))
    ops = model.net.Proto().op
    assert [op.type for op in ops] == ["DepthSplit", "Conv", "Conv", "Concat"]
    assert list(ops[0].output) == ["_y_gconv_split_0", "_y_gconv_split_1"]
    assert [list(op.input) for op in ops[1:3]] == [["_y_gconv_split_0", "y_gconv_0_w", "y_gconv_0_b"],
                                                   ["_y_gconv_split_1", "y_gconv_1_w", "y_gconv_1_b"]]
    assert list(ops[3].output) == ["y", "_y_concat_dims"] and str(y) == "y"
    assert [str(p) for p in model.params] == ["y_gconv_0_w", "y_gconv_0_b", "y_gconv_1_w", "y_gconv_1_b"]
    assert [str(p) for p in model.weights] == ["y_gconv_0_w", "y_gconv_1_w"]
    assert list(ops[0].arg[0].ints) == [2, 2]   # Caffe2's SplitOp ignores `dimensions` too: the parts are even
    with warnings.catch_warnings():      # `dimensions` is a declared, ignored argument, as in Caffe2: no warning
        warnings.simplefilter("error", StepnetWarning)
        run(model)
    w = np.concatenate([workspace.FetchBlob(f"y_gconv_{i}_w") for i in range(2)])
    b = np.concatenate([workspace.FetchBlob(f"y_gconv_{i}_b") for i in range(2)])
    assert w.shape == (6, 2, 3, 3) and b.shape == (6,)
    np.testing.assert_allclose(workspace.FetchBlob("y"), grouped_conv(x, w, b, 2, 1), rtol=1e-5, atol=1e-5)


def test_group_conv_deprecated_nhwc_without_bias():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 4, 6)).astype(np.float32)   # NHWC, 6 channels
    workspace.FeedBlob("x", x)
    model = model_helper.ModelHelper(name="g", arg_scope={"order": "NHWC"})
    brew.group_conv_deprecated(model, "x", "y", dim_in=6, dim_out=3, kernel=2, group=3, no_bias=True)
    assert [str(p) for p in model.params] == ["y_gconv_0_w", "y_gconv_1_w", "y_gconv_2_w"]
    assert all(len(op.input) == 2 for op in model.net.Proto().op if op.type == "Conv")
    with warnings.catch_warnings():      # `dimensions` is a declared, ignored argument, as in Caffe2: no warning
        warnings.simplefilter("error", StepnetWarning)
        run(model)
    w = np.concatenate([workspace.FetchBlob(f"y_gconv_{i}_w") for i in range(3)])   # O x k x k x C/g
    assert w.shape == (3, 2, 2, 2)
    expected = grouped_conv(x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), np.zeros(3), 3, 0)
    np.testing.assert_allclose(workspace.FetchBlob("y"), expected.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="dim_out should be divisible by group"):
        brew.group_conv_deprecated(model, "x", "z", dim_in=6, dim_out=4, kernel=2, group=3)


def test_max_pool_with_index_makes_caffe2s_op_which_runs_here():
    model = model_helper.ModelHelper(name="p", arg_scope={"order": "NCHW", "use_cudnn": False})
    with core.NameScope("s"):
        y = brew.max_pool_with_index(model, "x", "y", kernel=2, stride=2)
    op = model.net.Proto().op[0]
    assert (op.type, list(op.input), list(op.output), str(y)) == ("MaxPoolWithIndex", ["s/x"], ["s/y", "s/y_index"],
                                                                    "s/y")
    assert {a.name: a.i if a.HasField("i") else a.s for a in op.arg} == {
        "order": b"NCHW", "use_cudnn": 0, "cudnn_exhaustive_search": 0, "kernel": 2, "stride": 2}
    assert list(model.net.Proto().external_input) == ["s/x"]
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)[..., ::-1].copy()
    workspace.FeedBlob("s/x", x)
    workspace.RunNetOnce(model.net)     # (CUDA-only in Caffe2; tests/ops/test_pool_index.py checks its values)
    np.testing.assert_array_equal(workspace.FetchBlob("s/y"), [[[[7, 5], [15, 13]]]])
    np.testing.assert_array_equal(workspace.FetchBlob("s/y_index"), [4, 6, 12, 14])


def test_packed_fc_makes_caffe2s_parameters_and_computes_fc():
    model = model_helper.ModelHelper(name="pfc")
    brew.packed_fc(model, "x", "y", dim_in=3, dim_out=2)
    op = model.net.Proto().op[0]
    assert (op.type, list(op.input), list(op.output)) == ("PackedFC", ["x", "y_w", "y_b"], ["y"])
    workspace.RunNetOnce(model.param_init_net)
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(model.net)
    w, b = workspace.FetchBlob("y_w").astype(np.float64), workspace.FetchBlob("y_b").astype(np.float64)
    assert w.shape == (2, 3) and b.shape == (2,)
    np.testing.assert_allclose(workspace.FetchBlob("y"), x.astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ onnx
onnx = pytest.importorskip("onnx")
from onnx import helper as onnx_helper  # noqa: E402

from stepnet.compat.onnx import backend as onnx_backend  # noqa: E402
from stepnet.compat.onnx.frontend import Caffe2Frontend  # noqa: E402


@pytest.mark.parametrize("value", [2.5, -7, b"NCHW", [1.0, -0.5], [3, 1, 4], [b"a", b"bc"]])
def test_convert_attribute_proto_round_trips_make_attribute(value):
    got = onnx_backend.convertAttributeProto(onnx_helper.make_attribute("k", value))
    assert got == value and type(got) is type(value)


def test_convert_attribute_proto_tensor_and_refusals():
    tensor = onnx_helper.make_tensor("t", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    assert onnx_backend.convertAttributeProto(onnx_helper.make_attribute("t", tensor)) == tensor
    graph = onnx_helper.make_graph([], "g", [], [])
    with pytest.raises(ValueError, match="Unsupported ONNX attribute"):
        onnx_backend.convertAttributeProto(onnx_helper.make_attribute("body", graph))
    with pytest.raises(ValueError, match="Unsupported ONNX attribute"):
        onnx_backend.convertAttributeProto(onnx.AttributeProto(name="empty"))


def test_onnx_attributes_and_their_caffe2_arguments():
    node = onnx_helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2)
    attrs = onnx_backend.OnnxAttributes.from_onnx(node.attribute)
    assert isinstance(attrs, dict) and attrs == {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 2}
    assert isinstance(onnx_backend.OnnxNode(node).attrs, onnx_backend.OnnxAttributes)
    args = list(attrs.caffe2(kmap=lambda k: {"kernel_shape": "kernels", "group": ""}.get(k, k)))
    assert [(a.name, list(a.ints)) for a in args] == [("kernels", [3, 3]), ("pads", [1, 1, 1, 1])]


def test_caffe2_arg_to_onnx_attr_renames_and_drops_as_caffe2():
    def attr(op_type, **kwargs):
        op = core.CreateOperator(op_type, ["x"], ["y"], **kwargs)
        return Caffe2Frontend.caffe2_arg_to_onnx_attr(op, op.arg[0])
    assert attr("Conv", kernels=[3, 3]) == onnx_helper.make_attribute("kernel_shape", [3, 3])
    assert attr("Squeeze", dims=[0, 2]) == onnx_helper.make_attribute("axes", [0, 2])
    assert attr("Transpose", axes=[1, 0]) == onnx_helper.make_attribute("perm", [1, 0])
    assert attr("Transpose", kernels=[2]) == onnx_helper.make_attribute("kernels", [2])   # only its own renames
    assert attr("Elu", alpha=0.5) == onnx_helper.make_attribute("alpha", 0.5)
    assert attr("Conv", order="NCHW") is None and attr("Conv", use_cudnn=1) is None
    with pytest.raises(AssertionError):
        attr("Conv", order="NHWC")


def ort_run(nodes, consts, feeds, outputs):
    ort = pytest.importorskip("onnxruntime")
    inputs = [onnx_helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, list(v.shape)) for k, v in feeds.items()]
    outs = [onnx_helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in outputs]
    graph = onnx_helper.make_graph(nodes, "one_op", inputs, outs, initializer=consts)
    model = onnx_helper.make_model(graph, opset_imports=[onnx_helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("case", ["conv", "softmax", "reshape", "transpose", "relu"])
def test_caffe2_op_to_onnx_node_runs_in_onnxruntime(case, monkeypatch):
    monkeypatch.setattr(Caffe2Frontend, "target_opset_version", 13)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    feeds, x64 = {"x": x}, x.astype(np.float64)
    if case == "conv":
        w, b = rng.standard_normal((6, 2, 3, 3)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
        feeds.update(w=w, b=b)
        op = core.CreateOperator("Conv", ["x", "w", "b"], ["y"], kernel=3, pad=1, group=2, order="NCHW")
        expected = grouped_conv(x, w.astype(np.float64), b.astype(np.float64), 2, 1)
    elif case == "softmax":
        feeds["x"] = x = x.reshape(2, 36)
        op = core.CreateOperator("Softmax", ["x"], ["y"])
        expected = softmax(x.astype(np.float64))
    elif case == "reshape":
        op = core.CreateOperator("Reshape", ["x"], ["y", "old_shape"], shape=[6, -1])
        expected = x64.reshape(6, -1)
    elif case == "transpose":
        op = core.CreateOperator("Transpose", ["x"], ["y"], axes=[0, 2, 3, 1])
        expected = x64.transpose(0, 2, 3, 1)
    else:
        op = core.CreateOperator("Relu", ["x"], ["y"])
        expected = np.maximum(x64, 0)
    nodes, consts = Caffe2Frontend.caffe2_op_to_onnx_node(op, {k: v.shape for k, v in feeds.items()})
    assert all(isinstance(n, onnx.NodeProto) for n in nodes) and all(isinstance(t, onnx.TensorProto) for t in consts)
    assert set(nodes[0].input) <= set(feeds) | {t.name for t in consts}
    (y,) = ort_run(nodes, consts, feeds, ["y"])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_caffe2_op_to_onnx_node_needs_the_inputs_shapes():
    op = core.CreateOperator("Relu", ["x"], ["y"])
    with pytest.raises(RuntimeError, match="no shape given for its inputs x"):
        Caffe2Frontend.caffe2_op_to_onnx_node(op, {"y": (2,)})
    nodes, _ = Caffe2Frontend.caffe2_op_to_onnx_node(
        core.CreateOperator("Gather", ["data", "ids"], ["rows"]),
        {"data": (5, 2), "ids": np.zeros(3, dtype=np.int64)})   # an array: an int64 input
    assert [n.op_type for n in nodes] == ["Gather"]
