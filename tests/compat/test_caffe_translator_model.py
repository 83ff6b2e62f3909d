"""caffe_translator around the layers: the NetDef Caffe2's translator writes for a CaffeNet-like model and the
net-state rules, the command line's init/predict .pb files (run, and compared with float64 Caffe1 layers to rtol
1e-5, atol 1e-5), one-line errors for untrusted Caffe1 files, the legacy-pad removal on an old-style input, a
program's own translator, and the caffe.proto alias."""
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

from stepnet import Workspace, caffe_pb2
from stepnet.compat import caffe_translator as ct
from stepnet.io.proto import NetDef
from tests.compat.caffe1_reference import (
    c1_conv, c1_inner_product, c1_lrn, c1_pool, c1_softmax, check, prototxt, rand, run, trained,
    translate_run)


# --- the model around the layers ------------------------------------------------------------------------------

CAFFENET_LIKE = """
    layer { name: 'conv1' type: 'Convolution' bottom: 'data' top: 'conv1' convolution_param { num_output: 4
            kernel_size: 3 stride: 2 } }
    layer { name: 'relu1' type: 'ReLU' bottom: 'conv1' top: 'conv1' }
    layer { name: 'pool1' type: 'Pooling' bottom: 'conv1' top: 'pool1' pooling_param { pool: MAX kernel_size: 3
            stride: 2 } }
    layer { name: 'norm1' type: 'LRN' bottom: 'pool1' top: 'norm1' lrn_param { local_size: 3 alpha: 0.0001
            beta: 0.75 } }
    layer { name: 'fc' type: 'InnerProduct' bottom: 'norm1' top: 'fc' inner_product_param { num_output: 5 } }
    layer { name: 'drop' type: 'Dropout' bottom: 'fc' top: 'fc' include { phase: TRAIN } }
    layer { name: 'prob' type: 'Softmax' bottom: 'fc' top: 'prob' }
"""


def caffenet_like():
    weights = {"conv1": [rand(4, 3, 3, 3), rand(4)], "fc": [rand(5, 4 * 3 * 3), rand(5)]}
    return prototxt({"data": (2, 3, 16, 16)}, CAFFENET_LIKE), trained(weights), weights


def caffenet_like_reference(x, weights):
    y = np.maximum(c1_conv(x, *weights["conv1"], stride=(2, 2)), 0)
    y = c1_lrn(c1_pool(y, "MAX", 3, 2, 0), 3, 0.0001, 0.75, 1.0)
    return c1_softmax(c1_inner_product(y, *weights["fc"]))


def test_caffe2s_netdef_for_a_caffenet_like_model():
    """The ops, inputs, outputs and arguments Caffe2's translator writes (its code at 157ff81a), and the TRAIN-only
    Dropout left out of the default TEST state."""
    net, params = ct.TranslateModel(*caffenet_like()[:2], is_test=True)
    got = [(o.type, list(o.input), list(o.output), [a.name for a in o.arg]) for o in net.op]
    assert got == [
        ("Conv", ["data", "conv1_w", "conv1_b"], ["conv1"], ["stride", "pad", "kernel"]),
        ("Relu", ["conv1"], ["conv1"], []),
        ("MaxPool", ["conv1"], ["pool1"], ["stride", "pad", "kernel", "order", "legacy_pad"]),
        ("LRN", ["pool1"], ["norm1", "_norm1_scale"], ["size", "alpha", "beta", "bias", "order"]),
        ("FC", ["norm1", "fc_w", "fc_b"], ["fc"], []),
        ("Softmax", ["fc"], ["prob"], [])]
    assert [(p.name, list(p.dims)) for p in params.protos] == [
        ("conv1_w", [4, 3, 3, 3]), ("conv1_b", [4]), ("fc_w", [5, 36]), ("fc_b", [5])]
    state = caffe_pb2.NetState(phase=caffe_pb2.TRAIN)
    train, _ = ct.TranslateModel(*caffenet_like()[:2], net_state=state)
    assert [o.type for o in train.op] == ["Conv", "Relu", "MaxPool", "LRN", "FC", "Dropout", "Softmax"]


def test_command_line_writes_init_and_predict_nets(tmp_path):
    caffe_net, model, weights = caffenet_like()
    (tmp_path / "deploy.prototxt").write_text(text_format.MessageToString(caffe_net))
    (tmp_path / "model.caffemodel").write_bytes(model.SerializeToString())
    for extra in ([], ["--remove_legacy_pad", "--input_dims", "2", "3", "16", "16"]):
        init, predict = tmp_path / "init.pb", tmp_path / "predict.pb"
        done = subprocess.run([sys.executable, "-m", "stepnet.compat.caffe_translator", "deploy.prototxt",
                               "model.caffemodel", "--init_net", str(init), "--predict_net", str(predict), *extra],
                              cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "predict.pbtxt").read_text().startswith('name: "tiny"')
        init_net, predict_net = NetDef(), NetDef()
        init_net.ParseFromString(init.read_bytes())
        predict_net.ParseFromString(predict.read_bytes())
        assert list(predict_net.external_input) == ["data", "conv1_w", "conv1_b", "fc_w", "fc_b"]
        assert list(predict_net.external_output) == ["prob"]
        assert any(a.name == "legacy_pad" for o in predict_net.op for a in o.arg) == (not extra)
        ws = Workspace()
        ws.run_net_once(init_net)
        x = rand(2, 3, 16, 16)
        ws.feed("data", x)
        ws.run_net_once(predict_net)
        check(ws.fetch("prob"), caffenet_like_reference(x, weights))


def test_command_line_bad_files_are_one_line(tmp_path):
    (tmp_path / "deploy.prototxt").write_text("layer { name: 'x' type: 'Frobnicate' bottom: 'data' top: 'y' }")
    (tmp_path / "bad.prototxt").write_text("layer { name: ")
    (tmp_path / "model.caffemodel").write_bytes(b"")
    (tmp_path / "junk.caffemodel").write_bytes(b"\xff\xff\xff")
    for args, says in ((["deploy.prototxt", "model.caffemodel"], "layer 'x' (Frobnicate): no translator is "
                        "registered for layer type 'Frobnicate'"),
                       (["bad.prototxt", "model.caffemodel"], "bad.prototxt: not a Caffe NetParameter in text form"),
                       (["deploy.prototxt", "junk.caffemodel"], "junk.caffemodel: not a binary Caffe NetParameter"),
                       (["missing.prototxt", "model.caffemodel"], "missing.prototxt")):
        done = subprocess.run([sys.executable, "-m", "stepnet.compat.caffe_translator", *args], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 1
        lines = [line for line in done.stderr.strip().splitlines()   # Caffe2's per-layer log lines aside
                 if not line.startswith("INFO:caffe_translator:")]
        assert len(lines) == 1 and lines[0].startswith("caffe_translator: error: ") and says in lines[0], lines


def test_an_unknown_layer_type_is_a_stepnet_error_and_a_keyerror():
    caffe_net = prototxt({"data": (1, 2)}, "layer { name: 'odd' type: 'Frobnicate' bottom: 'data' top: 'y' }")
    with pytest.raises(ct.UnknownLayerError) as info:
        ct.TranslateModel(caffe_net, caffe_pb2.NetParameter())
    assert isinstance(info.value, KeyError) and isinstance(info.value, RuntimeError)
    assert str(info.value).startswith("layer 'odd' (Frobnicate): no translator is registered")


@pytest.mark.parametrize("body,weights,says", [
    ("layer { name: 'c' type: 'Convolution' bottom: 'data' top: 'y' convolution_param { num_output: 2 "
     "kernel_size: 1 } }", {}, "layer 'c' (Convolution): the trained model has 0 weight blob(s) for it"),
    ("layer { name: 'f' type: 'InnerProduct' bottom: 'data' top: 'y' inner_product_param { num_output: 2 } }",
     {"f": [np.zeros((2, 3, 4), np.float32), np.zeros(2, np.float32)]}, "layer 'f' (InnerProduct): weight of shape"),
    ("layer { name: 'bn' type: 'BatchNorm' bottom: 'data' top: 'y' }",
     {"bn": [np.zeros(2, np.float32)] * 2 + [np.zeros(1, np.float32)]}, "layer 'bn' (BatchNorm): the scale-factor "
     "blob is zero"),
    ("layer { name: 'l' type: 'LRN' bottom: 'data' top: 'y' lrn_param { norm_region: WITHIN_CHANNEL } }", {},
     "layer 'l' (LRN): norm_region WITHIN_CHANNEL is not supported"),
    ("layer { name: 'c3' type: 'Convolution3D' bottom: 'data' top: 'y' }", {}, "layer 'c3' (Convolution3D): this "
     "caffe.proto (BVLC's) has no convolution3d_param"),
    ("layer { name: 'r' type: 'ReLU' bottom: 'data' }", {}, "layer 'r' (ReLU): a ReLU layer needs a bottom and a top "
     "(it has 1 and 0)")])
def test_malformed_layers_are_one_line_errors(body, weights, says):
    with pytest.raises(ct.TranslationError) as info:
        ct.TranslateModel(prototxt({"data": (1, 2, 3, 3)}, body), trained(weights))
    assert str(info.value).startswith(says) and "\n" not in str(info.value)


def test_a_blob_whose_data_does_not_fill_its_shape():
    model = caffe_pb2.NetParameter()
    blob = model.layer.add(name="p").blobs.add()
    blob.shape.dim.extend([3])
    blob.data.extend([1.0, 2.0])
    caffe_net = prototxt({"data": (1, 3, 2, 2)}, "layer { name: 'p' type: 'PReLU' bottom: 'data' top: 'y' }")
    with pytest.raises(ct.TranslationError, match=r"^layer 'p' \(PReLU\): a weight blob of shape \[3\] holds 2"):
        ct.TranslateModel(caffe_net, model)


def test_v1_layers_are_refused():
    caffe_net = caffe_pb2.NetParameter(name="old")
    caffe_net.layers.add(name="c")
    with pytest.raises(ct.TranslationError, match="V1 `layers` field"):
        ct.TranslateModel(caffe_net, caffe_pb2.NetParameter())


def test_init_net_from_tensor_protos():
    _, params = ct.TranslateModel(*caffenet_like()[:2])
    init = ct.ConvertTensorProtosToInitNet(params, "data")
    assert [(o.type, o.output[0]) for o in init.op] == [("GivenTensorFill", p.name) for p in params.protos] + [
        ("ConstantFill", "data")]
    params.protos[0].ClearField("float_data")
    params.protos[0].int32_data.extend([1])
    with pytest.raises(RuntimeError, match="Only float tensors"):
        ct.ConvertTensorProtosToInitNet(params, "data")


def test_caffe_proto_alias(monkeypatch):
    """Caffe2's tests import Caffe1's schema as caffe.proto.caffe_pb2: with the alias installed, stepnet's."""
    from stepnet.compat import alias
    alias.install()
    try:
        from caffe.proto import caffe_pb2 as aliased
        from caffe2.python import caffe_translator as aliased_translator
        assert aliased is caffe_pb2 and aliased_translator is ct
    finally:
        alias.uninstall()


def test_old_style_net_inputs_size_the_legacy_pad_removal():
    """`input:` with `input_dim:` (the pre-Input-layer prototxt form) gives remove_legacy_pad its input shape."""
    caffe_net = caffe_pb2.NetParameter()
    text_format.Merge("input: 'data' input_dim: 1 input_dim: 2 input_dim: 8 input_dim: 7 layer { name: 'p' "
                      "type: 'Pooling' bottom: 'data' top: 'y' pooling_param { pool: MAX kernel_size: 3 stride: 2 "
                      "pad: 1 } }", caffe_net)
    net, params = ct.TranslateModel(caffe_net, caffe_pb2.NetParameter(), remove_legacy_pad=True)
    assert {a.name: a.i for a in net.op[0].arg if a.name.startswith("pad")} == {
        "pad_l": 1, "pad_t": 1, "pad_r": 1, "pad_b": 2}
    x = rand(1, 2, 8, 7)
    check(run(net, {"data": x}, params).fetch("y"), c1_pool(x, "MAX", 3, 2, 1))


def test_batch_norm_in_training_uses_the_batch_statistics():
    """is_test=False: Caffe1's TRAIN-phase BatchNorm normalizes by the batch's mean and (biased) variance."""
    x = rand(4, 3, 2, 2)
    stats = [rand(3), rand(3, low=0.5), np.ones(1, np.float32)]
    ws, net, _ = translate_run("layer { name: 'bn' type: 'BatchNorm' bottom: 'data' top: 'y' }", {"data": x},
                               {"bn": stats}, is_test=False)
    assert list(net.op[0].output) == ["y", "y_mean", "y_var", "y_saved_mean", "y_saved_var"]
    x64 = x.astype(np.float64)
    mu, var = x64.mean(axis=(0, 2, 3), keepdims=True), x64.var(axis=(0, 2, 3), keepdims=True)
    check(ws.fetch("y"), (x64 - mu) / np.sqrt(var + 1e-5))


def test_a_program_registers_its_own_layer_translator():
    """TranslatorRegistry.Register, as Caffe2 programs extend the translator for their own layer types."""
    @ct.TranslatorRegistry.Register("Doubler")
    def translate_doubler(layer, pretrained_blobs, is_test, **kwargs):
        op = ct.BaseTranslate(layer, "Scale")
        ct.AddArgument(op, "scale", 2.0)
        return op, []
    try:
        x = rand(2, 3)
        ws, _, _ = translate_run("layer { name: 'd' type: 'Doubler' bottom: 'data' top: 'y' }", {"data": x})
        check(ws.fetch("y"), 2 * x.astype(np.float64))
    finally:
        del ct.TranslatorRegistry.registry_["Doubler"]
    assert all(callable(getattr(ct, f"Translate{n}")) for n in (
        "Input", "VideoData", "Data", "ConvNd", "Conv", "Deconv", "Crop", "Relu", "Pool", "Pool3D", "LRN",
        "InnerProduct", "Dropout", "Softmax", "SoftmaxWithLoss", "Accuracy", "Concat", "TanH", "InstanceNorm",
        "BatchNorm", "ElementWise", "Scale", "Reshape", "Flatten", "Sigmoid", "ROIPooling", "PRelu", "Reduction"))


def test_input_sizes_from_a_file_are_checked_before_a_scratch_run_allocates():
    """--remove_legacy_pad runs the translated net on random inputs of the file's (or --input_dims') shape: a
    shape over the blob limit is one TranslationError, nothing allocated (80 GB asked here)."""
    caffe_net, model, _ = caffenet_like()
    with pytest.raises(ct.TranslationError, match=r"over the blob limit .*give smaller --input_dims"):
        ct.TranslateModel(caffe_net, model, is_test=True, remove_legacy_pad=True,
                          input_dims=[100000, 100000, 1, 2])
