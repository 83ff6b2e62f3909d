"""compat.model_helper and compat.brew: parameters and their tags, name scopes, the arg scopes helpers get,
gradients, op forwarding, param_model sharing, initializers, and a small model that trains."""
import logging

import numpy as np
import pytest

from stepnet.compat import brew, core, model_helper, optimizer, workspace
from stepnet.compat.modeling.initializers import ExternalInitializer, Initializer
from stepnet.compat.modeling.parameter_info import ParameterTags
from stepnet.core.errors import ShapeError, StepnetError
from stepnet.io.proto import arguments


def init_ops(model):
    return {op.output[0]: (op.type, arguments(op.arg)) for op in model.param_init_net.Proto().op}


def test_layer_helpers_create_tagged_parameters():
    model = model_helper.ModelHelper(name="layers")
    fc = brew.fc(model, "data", "fc", dim_in=4, dim_out=3)
    conv = brew.conv(model, "img", "conv", 2, 5, 3, pad=1)
    bn = brew.spatial_bn(model, conv, "bn", 5, epsilon=1e-3)
    assert (fc, conv, bn) == ("fc", "conv", "bn") and isinstance(fc, core.BlobReference)
    assert model.params == ["fc_w", "fc_b", "conv_w", "conv_b", "bn_s", "bn_b"]
    assert model.GetComputedParams() == ["bn_rm", "bn_riv"] and model.GetAllParams()[-2:] == ["bn_rm", "bn_riv"]
    assert model.weights == ["fc_w", "conv_w", "bn_s"] and model.biases == ["fc_b", "conv_b", "bn_b"]
    inits = init_ops(model)
    assert inits["fc_w"] == ("XavierFill", {"shape": [3, 4]})
    assert inits["fc_b"] == ("ConstantFill", {"shape": [3]})
    assert inits["conv_w"] == ("XavierFill", {"shape": [5, 2, 3, 3]})
    assert inits["bn_riv"] == ("ConstantFill", {"shape": [5], "value": 1.0})
    bn_op = model.net.Proto().op[-1]
    assert list(bn_op.output) == ["bn", "bn_rm", "bn_riv", "bn_sm", "bn_siv"]
    conv_args = arguments(model.net.Proto().op[1].arg)
    assert conv_args["kernel"] == 3 and conv_args["order"] == "NCHW" and conv_args["pad"] == 1
    assert model.net.Proto().op[1].engine == "CUDNN"      # use_cudnn=True is in ModelHelper's default arg scope


def test_parameters_get_the_name_scope_and_are_found_by_it():
    model = model_helper.ModelHelper(name="scoped")
    with core.NameScope("enc"):
        h = brew.fc(model, "x", "h", 2, 2)
        with core.NameScope("inner"):
            brew.fc(model, h, "g", 2, 2)          # a reference keeps its name; strings get the scope
    brew.fc(model, core.BlobReference("enc/g"), "out", 2, 1)
    assert model.params == ["enc/h_w", "enc/h_b", "enc/inner/g_w", "enc/inner/g_b", "out_w", "out_b"]
    assert model.GetParams("enc") == model.params[:4] and model.GetParams("enc/inner/") == model.params[2:4]
    with core.NameScope("enc"):
        assert model.GetParams() == model.params[:4]
    assert model.GetParams("") == model.params
    assert [list(op.input)[0] for op in model.net.Proto().op] == ["enc/x", "enc/h", "enc/g"]
    assert [op.output[0] for op in model.net.Proto().op] == ["enc/h", "enc/inner/g", "out"]


def test_create_param_returns_an_existing_parameter():
    model = model_helper.ModelHelper(name="params")
    w = model.create_param("w", [2, 3], Initializer("GaussianFill", std=0.1), tags=ParameterTags.WEIGHT)
    assert model.create_param("w", [2, 3], Initializer("XavierFill")) is w
    with pytest.raises(ShapeError, match="exists with shape \\[2, 3\\]"):
        model.create_param("w", [3, 3], Initializer("XavierFill"))
    model.create_param(core.BlobReference("raw"), [1], ("ConstantFill", {"value": 2.0}))   # a stepnet pair
    assert init_ops(model) == {"w": ("GaussianFill", {"shape": [2, 3], "std": pytest.approx(0.1)}),
                               "raw": ("ConstantFill", {"shape": [1], "value": 2.0})}
    assert model.get_param_info("w").shape == [2, 3] and model.weights == ["w"]


def test_external_initializers_make_no_init_ops():
    model = model_helper.ModelHelper(name="ext", init_params=False)
    brew.fc(model, "x", "fc", 2, 2)
    brew.spatial_bn(model, "fc", "bn", 2, is_test=1)
    assert list(model.param_init_net.Proto().op) == [] and model.params == ["fc_w", "fc_b", "bn_s", "bn_b"]
    assert ExternalInitializer().create_param("p", model.param_init_net, [1]).blob == "p"


def test_model_arg_scope_and_brew_arg_scope():
    model = model_helper.ModelHelper(name="args", arg_scope={"order": "NHWC", "use_cudnn": False})
    brew.conv(model, "x", "c1", 3, 4, 3)
    with brew.arg_scope([brew.conv, brew.max_pool], stride=2):
        brew.conv(model, "c1", "c2", 4, 4, 3)
        brew.max_pool(model, "c2", "p", kernel=2, stride=1)       # its own keywords win
        with brew.arg_scope(brew.conv, pad=1):
            brew.conv(model, "p", "c3", 4, 4, 3)
        brew.conv(model, "c3", "c4", 4, 4, 3)
    brew.conv(model, "c4", "c5", 4, 4, 3)
    args = [arguments(op.arg) for op in model.net.Proto().op]
    assert [a.get("stride") for a in args] == [None, 2, 1, 2, 2, None]
    assert [a.get("pad") for a in args] == [None, None, None, 1, None, None]
    assert all(a["order"] == "NHWC" for a in args) and model.net.Proto().op[0].engine == ""
    assert init_ops(model)["c1_w"][1]["shape"] == [4, 3, 3, 3]            # NHWC weight: out x k x k x in


def test_helpers_without_kwargs_get_only_their_own_arguments():
    model = model_helper.ModelHelper(name="filter", arg_scope={"not_for_relu": 5})
    brew.layer_norm(model, "x", "ln", 4)                 # takes no **kwargs: order/use_cudnn are not passed
    brew.relu(model, "x", "r")                           # takes **kwargs: gets them all (hints Relu accepts)
    assert "not_for_relu" in arguments(model.net.Proto().op[-1].arg)
    with pytest.raises(RuntimeError, match="first input of helper function should be model"):
        brew.fc("x", "y", 1, 1)


def test_more_helpers():
    model = model_helper.ModelHelper(name="more")
    d = brew.dropout(model, "x", "d", ratio=0.3, is_test=0)
    with pytest.raises(ValueError, match="is_test"):
        brew.dropout(model, "x", "d2")
    brew.concat(model, ["a", "b"], "cat", axis=1)
    brew.sum(model, ["a", "b"], "s")
    brew.prelu(model, "s", "pr", num_channels=2)
    brew.softmax(model, "pr", "sm")
    brew.average_pool(model, "x", "ap", kernel=2)
    brew.tanh(model, "x", "t")
    brew.transpose(model, "t", "tt", axes=[1, 0])
    brew.elementwise_linear(model, "tt", "el", 3)
    brew.accuracy(model, ["sm", "label"], "acc", top_k=2)
    it = brew.iter(model, "iter")
    types = [op.type for op in model.net.Proto().op]
    assert types == ["Dropout", "Concat", "Sum", "PRelu", "Softmax", "AveragePool", "Tanh", "Transpose",
                     "ElementwiseLinear", "Accuracy", "Iter"]
    assert list(model.net.Proto().op[0].output) == ["d", "_d_mask"] and d == "d"
    assert arguments(model.net.Proto().op[-2].arg)["top_k"] == 2 and it == "iter"
    assert init_ops(model)["iter"][0] == "ConstantFill" and model.params == ["pr_slope", "el_w", "el_b"]
    assert brew.has_helper("fc") and brew.has_helper(brew.conv) and not brew.has_helper("nope")


def test_register_a_helper():
    def scaled(model, blob_in, blob_out, factor=1.0, **kwargs):
        return model.net.Scale(blob_in, blob_out, scale=factor)
    brew.Register(scaled)
    try:
        with pytest.raises(AttributeError, match="already exists"):
            brew.Register(scaled)
        model = model_helper.ModelHelper(name="reg")
        with brew.arg_scope(brew.scaled, factor=3.0):
            brew.scaled(model, "x", "y")
        assert arguments(model.net.Proto().op[0].arg) == {"scale": 3.0}
    finally:
        brew._registry.pop("scaled")
        delattr(brew, "scaled")


def test_gradients_and_param_to_grad():
    model = model_helper.ModelHelper(name="grads")
    h = brew.fc(model, "x", "h", 3, 4)
    brew.spatial_bn(model, model.net.Reshape(h, ["h4", "old"], shape=[2, 4, 1, 1])[0], "bn", 4)
    loss = model.net.AveragedLoss(model.net.SumElements("bn", "total"), "loss")
    grad_map = model.AddGradientOperators([loss])
    assert model.param_to_grad == {"h_w": "h_w_grad", "h_b": "h_b_grad", "bn_s": "bn_s_grad", "bn_b": "bn_b_grad"}
    assert all(isinstance(k, core.BlobReference) for k in model.param_to_grad) and grad_map["x"] == "x_grad"
    assert [i.name for i in model.GetOptimizationParamInfo()] == ["h_w", "h_b", "bn_s", "bn_b"]
    assert model.get_param_info("h_w").grad == "h_w_grad"
    assert list(model.get_param_to_grad(["bn_s"])) == ["bn_s"]
    with pytest.raises(RuntimeError, match="twice"):
        model.AddGradientOperators([loss])
    with pytest.raises(RuntimeError, match="AddGradientOperators first"):
        model_helper.ModelHelper(name="none").GetOptimizationParamInfo()


def test_ops_are_forwarded_to_the_net(caplog):
    model = model_helper.ModelHelper(name="fwd")
    flat = model.Flatten("x", "flat")
    assert flat == "flat" and model.net.Proto().op[0].type == "Flatten" and model.Proto() is model.net.Proto()
    with caplog.at_level(logging.WARNING):
        model.Relu("flat", "r")
    assert "does not recognize: Relu" in caplog.text
    strict = model_helper.ModelHelper(name="strict", allow_not_known_ops=False)
    with pytest.raises(AttributeError, match="not known to be safe"):
        getattr(strict, "Relu")  # noqa: B009
    with pytest.raises(AttributeError, match="not a registered operator"):
        getattr(model, "NoSuchOp")  # noqa: B009
    assert "Flatten" in dir(model) and model.InitProto() is model.param_init_net.Proto()


def test_param_model_shares_the_parameters():
    train = model_helper.ModelHelper(name="train")
    brew.fc(train, "x", "fc", 2, 2)
    test = model_helper.ModelHelper(name="test", param_model=train)
    brew.fc(test, "x", "fc", 2, 2)          # the same parameters: nothing new in the shared init net
    assert test.params is train.params and train.params == ["fc_w", "fc_b"]
    assert len(train.param_init_net.Proto().op) == 2 and test.net.Name() == "test"


def test_duplicate_parameters_are_refused():
    model = model_helper.ModelHelper(name="dupes")
    model.AddParameter(core.BlobReference("p"))
    model.AddParameter("p")
    with pytest.raises(StepnetError, match="Duplicate params: \\['p'\\]"):
        model.Validate()


def test_db_input_helpers(tmp_path, monkeypatch):
    model = model_helper.ModelHelper(name="db")
    data, label = model.TensorProtosDBInput([], ["data", "label"], batch_size=4, db="train.minidb", db_type="minidb")
    assert (data, label) == ("data", "label")
    assert model.param_init_net.Proto().op[0].type == "CreateDB"
    assert model.CreateDB("reader", db="x.minidb", db_type="minidb") == "reader"


def test_a_small_model_trains():
    """Two-class data through brew.fc + relu + fc + softmax, LabelCrossEntropy, build_sgd: the loss falls."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 2)).astype(np.float32)
    y = (x[:, 0] * x[:, 1] > 0).astype(np.int32)
    model = model_helper.ModelHelper(name="xor")
    h = brew.relu(model, brew.fc(model, "x", "h", 2, 16), "h_relu")
    probs = brew.softmax(model, brew.fc(model, h, "out", 16, 2), "probs")
    loss = model.AveragedLoss(model.LabelCrossEntropy([probs, "y"], "xent"), "loss")
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=0.5, momentum=0.9)
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("y", y)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    losses = []
    for _ in range(150):
        workspace.RunNet(model.net)
        losses.append(float(workspace.FetchBlob("loss")))
    assert losses[-1] < 0.5 * losses[0]
