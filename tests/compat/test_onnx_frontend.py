"""compat.onnx.frontend: Caffe2's Caffe2Frontend on stepnet's ONNX exporter. The model onnxruntime runs gives
what a float64 numpy definition of the net and stepnet give; Caffe2's rules for placeholders and missing inputs;
a training net's forward part; nothing the caller passed is changed."""
import copy

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, numpy_helper  # noqa: E402

from stepnet.compat import alias, core, workspace  # noqa: E402
from stepnet.compat.onnx import frontend  # noqa: E402
from stepnet.compat.onnx.frontend import Caffe2Frontend  # noqa: E402

RNG = np.random.default_rng(3)
VALUES = {
    "table": RNG.uniform(-1, 1, (5, 3)).astype(np.float32),
    "idx": np.array([0, 4, 4, 1, 2], np.int32),
    "lengths": np.array([2, 0, 3], np.int32),          # bags {0, 4}, {}, {4, 1, 2}
    "dense": RNG.uniform(-1, 1, (3, 2)).astype(np.float32),
    "w1": RNG.uniform(-1, 1, (4, 5)).astype(np.float32),
    "b1": RNG.uniform(0, 1, 4).astype(np.float32),
    "w2": RNG.uniform(-1, 1, (1, 4)).astype(np.float32),
    "b2": np.array([0.25], np.float32),
}
ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}


def info(values: dict) -> dict:
    """Caffe2's value_info: {blob: (ONNX element type, shape)}."""
    return {k: (ONNX_TYPE[v.dtype], v.shape) for k, v in values.items()}


def dlrm_like_net(name="predict"):
    """An embedding bag beside dense features, then a two-layer MLP with a sigmoid (DLRM's shape, small)."""
    net = core.Net(name)
    net.SparseLengthsSum(["table", "idx", "lengths"], "emb")
    net.Concat(["dense", "emb"], ["cat", "cat_info"], axis=1)
    net.FC(["cat", "w1", "b1"], "h")
    net.Relu("h", "h")
    net.FC(["h", "w2", "b2"], "y")
    net.Sigmoid("y", "prob")
    return net


def reference(v: dict) -> np.ndarray:
    """The net in float64 numpy, from the ops' definitions."""
    f = {k: x.astype(np.float64) for k, x in v.items()}
    starts = np.r_[0, np.cumsum(v["lengths"])]
    emb = np.stack([f["table"][v["idx"][a:b]].sum(axis=0) for a, b in zip(starts[:-1], starts[1:])])
    h = np.maximum(np.concatenate([f["dense"], emb], axis=1) @ f["w1"].T + f["b1"], 0)
    return 1 / (1 + np.exp(-(h @ f["w2"].T + f["b2"])))


def run_onnx(model, feeds: dict) -> dict:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def feed_all(values: dict) -> None:
    for k, v in values.items():
        workspace.FeedBlob(k, v)


def test_the_model_gives_what_the_net_gives():
    """onnxruntime's result agrees with the float64 definition to 1e-6 and with stepnet's to float32 rounding
    (onnxruntime's GEMM sums in an order of its own: a few ulps). The net declares no outputs, so the blobs it
    writes and never reads are the graph's outputs (Caffe2's frontend would make a graph without any)."""
    net = dlrm_like_net()
    model = Caffe2Frontend.caffe2_net_to_onnx_model(net.Proto(), None, info(VALUES))
    assert [i.name for i in model.graph.input] == list(VALUES)
    assert [o.name for o in model.graph.output] == ["cat_info", "prob"]
    got = run_onnx(model, VALUES)
    feed_all(VALUES)
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(got["prob"], reference(VALUES), rtol=1e-6)
    np.testing.assert_allclose(got["prob"], workspace.FetchBlob("prob"), rtol=3e-7)
    np.testing.assert_array_equal(got["cat_info"], [2, 3])
    assert 0.05 < got["prob"].std()            # (the rows differ: a check that can fail)


def test_declared_outputs_are_the_graph_outputs_and_the_graph_is_the_models():
    net = dlrm_like_net()
    net.AddExternalOutput("prob")
    graph = frontend.caffe2_net_to_onnx_graph(net.Proto(), value_info=info(VALUES))
    assert [o.name for o in graph.output] == ["prob"]
    assert graph == frontend.caffe2_net_to_onnx_model(net.Proto(), value_info=info(VALUES)).graph


def test_init_values_are_initializers_and_placeholder_fills_are_inputs():
    """As in Caffe2, an init-net GivenTensor*Fill or ConstantFill of a blob value_info names is a placeholder:
    the blob is a graph input. Other values the init net makes are initializers (stepnet runs the init net, so a
    ConstantFill converts too, where Caffe2's frontend takes GivenTensor*Fill only), and graph inputs as well, in
    the predict net's order, as Caffe2's frontend (ONNX IR 3) listed them."""
    init = core.Net("init")
    init.GivenTensorFill([], "w1", shape=[4, 5], values=VALUES["w1"].ravel().tolist())
    init.ConstantFill([], "b1", shape=[4], value=0.5)
    init.ConstantFill([], "b2", shape=[1], value=-3.0)          # described in value_info: a placeholder
    values = {k: v for k, v in VALUES.items() if k not in ("w1", "b1")}
    model = Caffe2Frontend.caffe2_net_to_onnx_model(dlrm_like_net().Proto(), init.Proto(), info(values))
    assert [i.name for i in model.graph.input] == list(VALUES)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(inits["w1"], VALUES["w1"])
    np.testing.assert_array_equal(inits["b1"], np.full(4, 0.5, np.float32))
    assert "b2" not in inits
    got = run_onnx(model, values)["prob"]
    np.testing.assert_allclose(got, reference({**VALUES, "b1": np.full(4, 0.5, np.float32)}), rtol=1e-6)


def test_init_net_to_initializer_converts_every_fill_in_op_order():
    init = core.Net("init")
    init.ConstantFill([], "c", shape=[2], value=7, dtype=core.DataType.INT64)
    init.GivenTensorFill([], "g", shape=[2], values=[1.5, -2.0])
    tensors = frontend.caffe2_init_net_to_initializer(init.Proto())
    assert [t.name for t in tensors] == ["c", "g"]
    np.testing.assert_array_equal(numpy_helper.to_array(tensors[0]), np.array([7, 7], np.int64))
    np.testing.assert_array_equal(numpy_helper.to_array(tensors[1]), np.array([1.5, -2.0], np.float32))


def test_an_input_without_value_info_is_caffe2s_runtime_error():
    values = {k: v for k, v in VALUES.items() if k != "dense"}
    with pytest.raises(RuntimeError, match="^Could not find value info of inputs: dense$"):
        Caffe2Frontend.caffe2_net_to_onnx_model(dlrm_like_net().Proto(), None, info(values))
    with pytest.raises(ValueError, match="name -> \\(type, shape\\) dictionary"):
        Caffe2Frontend.caffe2_net_to_onnx_model(dlrm_like_net().Proto(), None, list(info(VALUES).items()))
    with pytest.raises(ValueError, match="'dense'.*not an \\(ONNX element type, shape\\) pair"):
        Caffe2Frontend.caffe2_net_to_onnx_model(dlrm_like_net().Proto(), None, {**info(VALUES), "dense": (1,)})


def test_a_training_net_exports_its_forward_part(caplog):
    """The backward ops and the SGD update are left out (and named in a logged warning); the loss onnxruntime
    computes is stepnet's, before the update."""
    net = dlrm_like_net("train")
    net.SquaredL2Distance(["prob", "target"], "sd")
    net.AveragedLoss("sd", "loss")
    grads = net.AddGradientOperators(["loss"])
    net.WeightedSum(["w2", "one", grads["w2"], "minus_lr"], "w2")
    values = {**VALUES, "target": np.array([[0.0], [1.0], [1.0]], np.float32),
              "one": np.ones(1, np.float32), "minus_lr": np.full(1, -0.1, np.float32)}
    with caplog.at_level("WARNING", logger=frontend.__name__):
        model = Caffe2Frontend.caffe2_net_to_onnx_model(net.Proto(), None, info(values))
    assert any("has a training part" in r.getMessage() and "WeightedSum×1" in r.getMessage() for r in caplog.records)
    assert [i.name for i in model.graph.input] == [*VALUES, "target"]      # (one, minus_lr: training part only)
    assert [o.name for o in model.graph.output] == ["cat_info", "loss"]
    got = run_onnx(model, {k: v for k, v in values.items() if k not in ("one", "minus_lr")})["loss"]
    feed_all(values)
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(got, workspace.FetchBlob("loss"), rtol=1e-6)
    assert not np.array_equal(workspace.FetchBlob("w2"), VALUES["w2"])      # (the update ran after the loss)


def test_what_the_caller_passed_is_left_unchanged():
    """Caffe2's frontend rewrote the nets (SSA names) and value_info in place; stepnet's changes neither."""
    predict, init = dlrm_like_net().Proto(), core.Net("init").Proto()
    init.op.extend([core.CreateOperator("ConstantFill", [], ["b2"], shape=[1], value=1.0)])
    value_info = info(VALUES)
    before = (copy.deepcopy(predict), copy.deepcopy(init), copy.deepcopy(value_info))
    Caffe2Frontend.caffe2_net_to_onnx_model(predict, init, value_info)
    assert (predict, init, value_info) == before


def test_the_opset_is_stepnets_unless_set(monkeypatch):
    from stepnet.export.onnx import default_opset
    model = Caffe2Frontend.caffe2_net_to_onnx_model(dlrm_like_net().Proto(), None, info(VALUES))
    assert [o.version for o in model.opset_import] == [default_opset()]
    monkeypatch.setattr(Caffe2Frontend, "target_opset_version", 9)          # Caffe2's own was 6, later 9
    with pytest.raises(RuntimeError, match="opset 9 is outside what the exporter writes"):
        Caffe2Frontend.caffe2_net_to_onnx_model(dlrm_like_net().Proto(), None, info(VALUES))


def test_caffe2s_module_name_is_this_module():
    alias.install()
    try:
        import caffe2.python.onnx.frontend as c2frontend
        assert c2frontend is frontend and c2frontend.Caffe2Frontend is Caffe2Frontend
    finally:
        alias.uninstall()
