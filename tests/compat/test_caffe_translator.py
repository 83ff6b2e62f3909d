"""caffe_translator, layer by layer: small Caffe1 nets (a prototxt built with caffe_pb2's text form, a trained
NetParameter with random weights in each layer's blobs) are translated, run on stepnet, and compared with float64
numpy definitions of **Caffe1's** layers (caffe1_reference.py: pooling's ceil output size with the last window
clipped, LRN across channels, InnerProduct's axis, Eltwise's coefficients, BatchNorm's scale-factor blob, Scale
with bias, Crop's offsets, ...). The nets run in float32: results agree to rtol 1e-5, atol 1e-5."""
import numpy as np
import pytest
from google.protobuf import text_format

from stepnet import caffe_pb2
from stepnet.compat import caffe_translator as ct
from tests.compat.caffe1_reference import (
    c1_conv, c1_deconv, c1_inner_product, c1_lrn, c1_pool, c1_softmax, check, prototxt, rand, run, translate_run)


# --- the layers -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("conv", [
    "kernel_size: 3 pad: 1 stride: 2", "kernel_size: 3 kernel_size: 2 pad: 1 pad: 0 stride: 1 stride: 2",
    "kernel_h: 3 kernel_w: 1 pad_h: 2 pad_w: 1 stride_h: 2 stride_w: 1", "kernel_size: 3 dilation: 2 group: 2",
    "kernel_size: 2 bias_term: false"])
def test_convolution(conv):
    x = rand(2, 4, 7, 6)
    p = caffe_pb2.ConvolutionParameter()
    text_format.Merge(conv, p)
    kh = p.kernel_h or p.kernel_size[0]
    kw = p.kernel_w or p.kernel_size[-1]
    w = rand(6, 4 // p.group, kh, kw)
    b = rand(6) if p.bias_term else None
    ws, net, _ = translate_run(f"layer {{ name: 'c' type: 'Convolution' bottom: 'data' top: 'y' convolution_param "
                               f"{{ num_output: 6 {conv} }} }}", {"data": x}, {"c": [w] if b is None else [w, b]})
    stride = (p.stride_h, p.stride_w) if p.HasField("stride_h") else (p.stride[0] if p.stride else 1,
                                                                       p.stride[-1] if p.stride else 1)
    pad = (p.pad_h, p.pad_w) if p.HasField("pad_h") else (p.pad[0] if p.pad else 0, p.pad[-1] if p.pad else 0)
    dil = (p.dilation[0],) * 2 if p.dilation else (1, 1)
    check(ws.fetch("y"), c1_conv(x, w, b, stride, pad, dil, p.group))
    assert list(net.op[0].input) == ["data", "y_w"] + (["y_b"] if b is not None else [])


def test_deconvolution():
    x, w, b = rand(2, 3, 4, 5), rand(3, 2, 3, 3), rand(2)
    ws, net, _ = translate_run("layer { name: 'd' type: 'Deconvolution' bottom: 'data' top: 'y' convolution_param { "
                               "num_output: 2 kernel_size: 3 stride: 2 pad: 1 } }", {"data": x}, {"d": [w, b]})
    check(ws.fetch("y"), c1_deconv(x, w, b, 2, 1))
    assert net.op[0].type == "ConvTranspose"


POOLS = [("MAX", 3, 2, 0, 6), ("MAX", 3, 2, 1, 8), ("MAX", 2, 3, 1, 7), ("MAX", 3, 3, 0, 10), ("AVE", 3, 2, 0, 6),
         ("AVE", 2, 2, 0, 7), ("AVE", 3, 1, 0, 5)]


@pytest.mark.parametrize("kind,k,s,p,size", POOLS)
@pytest.mark.parametrize("remove", [False, True])
def test_pooling_rounds_up_as_caffe1(kind, k, s, p, size, remove):
    """Caffe1's output size is ceil((size + 2 pad - kernel) / stride) + 1; Caffe2's floor. The translation keeps
    Caffe1's through legacy_pad, or through explicit end pads with remove_legacy_pad."""
    x = rand(2, 3, size, size + 1)
    ws, net, _ = translate_run(f"layer {{ name: 'p' type: 'Pooling' bottom: 'data' top: 'y' pooling_param {{ pool: "
                               f"{kind} kernel_size: {k} stride: {s} pad: {p} }} }}", {"data": x},
                               remove_legacy_pad=remove)
    check(ws.fetch("y"), c1_pool(x, kind, k, s, p))
    assert any(a.name == "legacy_pad" for a in net.op[0].arg) != remove


def test_average_pooling_with_pad_differs_from_caffe1_at_the_border_only():
    """Caffe1's AVE counts the padding in a window's divisor, Caffe2's AveragePool does not (Caffe2's translator
    maps one to the other all the same): inside the image they agree, at the padded border they differ."""
    x = rand(1, 2, 7, 7, low=0.5, high=1.0)
    ws, _, _ = translate_run("layer { name: 'p' type: 'Pooling' bottom: 'data' top: 'y' pooling_param { pool: AVE "
                             "kernel_size: 3 stride: 2 pad: 1 } }", {"data": x})
    got, ref = ws.fetch("y"), c1_pool(x, "AVE", 3, 2, 1)
    assert got.shape == ref.shape
    check(got[:, :, 1:-1, 1:-1], ref[:, :, 1:-1, 1:-1])
    assert np.all(got[:, :, 0, :] > ref[:, :, 0, :] + 1e-3)


def test_global_pooling():
    x = rand(2, 3, 5, 4)
    ws, _, _ = translate_run("layer { name: 'p' type: 'Pooling' bottom: 'data' top: 'y' pooling_param { pool: MAX "
                             "global_pooling: true } }", {"data": x})
    check(ws.fetch("y"), x.astype(np.float64).max(axis=(2, 3), keepdims=True))


def test_lrn():
    x = rand(2, 7, 3, 3)
    ws, _, _ = translate_run("layer { name: 'n' type: 'LRN' bottom: 'data' top: 'y' lrn_param { local_size: 5 "
                             "alpha: 0.5 beta: 0.75 k: 2 } }", {"data": x})
    check(ws.fetch("y"), c1_lrn(x, 5, 0.5, 0.75, 2.0))


@pytest.mark.parametrize("axis,transpose,bias", [(1, False, True), (2, False, True), (1, True, False),
                                                 (-1, False, True)])
def test_inner_product(axis, transpose, bias):
    x = rand(2, 3, 4, 5)
    k = int(np.prod(x.shape[axis:]))
    w = rand(k, 6) if transpose else rand(6, k)
    b = rand(6)
    ws, _, _ = translate_run(f"layer {{ name: 'f' type: 'InnerProduct' bottom: 'data' top: 'y' inner_product_param "
                             f"{{ num_output: 6 axis: {axis} transpose: {str(transpose).lower()} bias_term: "
                             f"{str(bias).lower()} }} }}", {"data": x}, {"f": [w, b] if bias else [w]})
    check(ws.fetch("y"), c1_inner_product(x, w, b if bias else 0.0, axis % 4, transpose))


def test_inner_product_old_style_4d_weights():
    x, w, b = rand(3, 10), rand(1, 1, 4, 10), rand(1, 1, 1, 4)
    model = caffe_pb2.NetParameter()
    layer = model.layer.add(name="f")
    for a in (w, b):          # the legacy num/channels/height/width blob shape
        blob = layer.blobs.add(num=a.shape[0], channels=a.shape[1], height=a.shape[2], width=a.shape[3])
        blob.data.extend(a.ravel().tolist())
    net, params = ct.TranslateModel(prototxt({"data": x.shape}, "layer { name: 'f' type: 'InnerProduct' bottom: "
                                             "'data' top: 'y' inner_product_param { num_output: 4 } }"), model)
    check(run(net, {"data": x}, params).fetch("y"), c1_inner_product(x, w[0, 0], b.ravel()))


@pytest.mark.parametrize("slope", [0.0, 0.1])
def test_elementwise_activations(slope):
    x = rand(3, 5)
    ws, _, _ = translate_run(f"""
        layer {{ name: 'r' type: 'ReLU' bottom: 'data' top: 'r' relu_param {{ negative_slope: {slope} }} }}
        layer {{ name: 't' type: 'TanH' bottom: 'data' top: 't' }}
        layer {{ name: 's' type: 'Sigmoid' bottom: 'data' top: 's' }}
        layer {{ name: 'sm' type: 'Softmax' bottom: 'data' top: 'sm' }}
        layer {{ name: 'd' type: 'Dropout' bottom: 'data' top: 'd' dropout_param {{ dropout_ratio: 0.3 }} }}
        """, {"data": x})
    x64 = x.astype(np.float64)
    check(ws.fetch("r"), np.where(x64 > 0, x64, slope * x64))
    check(ws.fetch("t"), np.tanh(x64))
    check(ws.fetch("s"), 1 / (1 + np.exp(-x64)))
    check(ws.fetch("sm"), c1_softmax(x64))
    check(ws.fetch("d"), x64)       # Caffe1's Dropout at TEST: identity


def test_relu_in_place_keeps_caffe2s_ops():
    caffe_net = prototxt({"data": (2, 3)}, "layer { name: 'r' type: 'ReLU' bottom: 'data' top: 'data' }")
    net, _ = ct.TranslateModel(caffe_net, caffe_pb2.NetParameter())
    assert [(o.type, list(o.input), list(o.output)) for o in net.op] == [("Relu", ["data"], ["data"])]


def test_softmax_with_loss_and_accuracy():
    x = rand(6, 5)
    label = np.array([0, 4, 2, 2, 1, 3], np.int32)
    ws, _, _ = translate_run("""
        layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'data' bottom: 'label' top: 'loss' }
        layer { name: 'acc' type: 'Accuracy' bottom: 'data' bottom: 'label' top: 'acc' accuracy_param { top_k: 2 } }
        """, {"data": x, "label": label})
    p = c1_softmax(x.astype(np.float64))
    check(ws.fetch("loss"), np.float64(-np.log(p[np.arange(6), label]).mean()))
    top2 = np.argsort(-x, axis=1)[:, :2]
    check(ws.fetch("acc"), np.float64(np.mean([label[i] in top2[i] for i in range(6)])))


@pytest.mark.parametrize("axis", [1, 2])
def test_concat(axis):
    a, b = rand(2, 3, 4), rand(2, 3, 4)
    ws, _, _ = translate_run(f"layer {{ name: 'c' type: 'Concat' bottom: 'a' bottom: 'b' top: 'y' concat_param "
                             f"{{ axis: {axis} }} }}", {"a": a, "b": b})
    check(ws.fetch("y"), np.concatenate([a, b], axis=axis).astype(np.float64))


def test_batch_norm_divides_by_the_scale_factor_blob():
    x, mean, var = rand(2, 3, 4, 4), rand(3), rand(3, low=0.5, high=2.0)
    factor = np.float32(0.25)     # Caffe1 stores mean and variance times the moving-average factor
    ws, _, _ = translate_run("layer { name: 'bn' type: 'BatchNorm' bottom: 'data' top: 'y' batch_norm_param "
                             "{ eps: 0.001 } }", {"data": x},
                             {"bn": [mean * factor, var * factor, np.array([factor], np.float32)]})
    m = (mean * factor).astype(np.float64) / np.float64(factor)
    v = (var * factor).astype(np.float64) / np.float64(factor)
    ref = (x - m[None, :, None, None]) / np.sqrt(v[None, :, None, None] + 1e-3)
    check(ws.fetch("y"), ref)


@pytest.mark.parametrize("bias", [False, True])
def test_scale(bias):
    x, s, b = rand(2, 3, 4), rand(3), rand(3)
    ws, net, _ = translate_run(f"layer {{ name: 's' type: 'Scale' bottom: 'data' top: 'y' scale_param {{ bias_term: "
                               f"{str(bias).lower()} }} }}", {"data": x}, {"s": [s, b] if bias else [s]})
    ref = x.astype(np.float64) * s[None, :, None] + (b[None, :, None] if bias else 0)
    check(ws.fetch("y"), ref)
    assert [o.type for o in net.op] == (["Mul", "Add"] if bias else ["Mul"])


@pytest.mark.parametrize("op,coeff", [("SUM", ""), ("SUM", "coeff: 1 coeff: -0.5 coeff: 2"), ("PROD", ""),
                                      ("MAX", "")])
def test_eltwise(op, coeff):
    a, b, c = rand(2, 3, 4), rand(2, 3, 4), rand(2, 3, 4)
    ws, _, _ = translate_run(f"layer {{ name: 'e' type: 'Eltwise' bottom: 'a' bottom: 'b' bottom: 'c' top: 'y' "
                             f"eltwise_param {{ operation: {op} {coeff} }} }}", {"a": a, "b": b, "c": c})
    xs = [v.astype(np.float64) for v in (a, b, c)]
    ref = {"SUM": lambda: sum(k * v for k, v in zip([1, -0.5, 2] if coeff else [1, 1, 1], xs)),
           "PROD": lambda: xs[0] * xs[1] * xs[2], "MAX": lambda: np.maximum(np.maximum(xs[0], xs[1]), xs[2])}[op]()
    check(ws.fetch("y"), ref)


def test_instance_norm():
    x, s, b = rand(2, 3, 4, 5), rand(3), rand(3)
    ws, _, _ = translate_run("layer { name: 'i' type: 'InstanceNorm' bottom: 'data' top: 'y' }", {"data": x},
                             {"i": [s, b]})
    x64 = x.astype(np.float64)
    mu, var = x64.mean(axis=(2, 3), keepdims=True), x64.var(axis=(2, 3), keepdims=True)
    check(ws.fetch("y"), (x64 - mu) / np.sqrt(var + 1e-5) * s[None, :, None, None] + b[None, :, None, None])


@pytest.mark.parametrize("shared", [False, True])
def test_prelu(shared):
    x = rand(2, 3, 4, 4)
    slope = rand(1 if shared else 3)
    ws, _, _ = translate_run(f"layer {{ name: 'p' type: 'PReLU' bottom: 'data' top: 'y' prelu_param {{ "
                             f"channel_shared: {str(shared).lower()} }} }}", {"data": x}, {"p": [slope]})
    x64 = x.astype(np.float64)
    a = np.broadcast_to(slope.astype(np.float64), (3,))[None, :, None, None]
    check(ws.fetch("y"), np.maximum(x64, 0) + a * np.minimum(x64, 0))


@pytest.mark.parametrize("op,axis,coeff", [("SUM", -2, 1.0), ("MEAN", -1, 1.0), ("SUM", 0, 1.0), ("MEAN", 0, 3.0),
                                           ("SUM", -1, -2.0)])
def test_reduction(op, axis, coeff):
    """Caffe1 reduces every axis from `axis` on (axis 0: all of them, to a scalar), then multiplies by coeff."""
    x = rand(2, 3, 4)
    ws, _, _ = translate_run(f"layer {{ name: 'r' type: 'Reduction' bottom: 'data' top: 'y' reduction_param {{ "
                             f"operation: {op} axis: {axis} coeff: {coeff} }} }}", {"data": x})
    start = axis % 3 if axis < 0 else axis
    flat = x.astype(np.float64).reshape(*x.shape[:start], -1)
    ref = (flat.sum(axis=-1) if op == "SUM" else flat.mean(axis=-1)) * coeff
    check(ws.fetch("y"), np.asarray(ref))


@pytest.mark.parametrize("param,ref_of", [
    ("", lambda x: x[:, :, 0:3, 0:2]),
    ("axis: 2 offset: 1", lambda x: x[:, :, 1:4, 1:3]),
    ("axis: 1 offset: 1 offset: 2 offset: 0", lambda x: x[:, 1:3, 2:5, 0:2]),
    ("axis: -1 offset: 3", lambda x: x[:, :, :, 3:5])])
def test_crop_offsets(param, ref_of):
    """Crop from `axis` on to the shape of bottom 1 (here the output of a conv, whose shape the translator finds
    by running the net so far), starting at the offsets."""
    x, w = rand(2, 4, 6, 5), rand(2, 4, 4, 4)
    ws, _, _ = translate_run(f"""
        layer {{ name: 'c' type: 'Convolution' bottom: 'data' top: 'ref' convolution_param {{ num_output: 2
                 kernel_size: 4 bias_term: false }} }}
        layer {{ name: 'crop' type: 'Crop' bottom: 'data' bottom: 'ref' top: 'y' crop_param {{ {param} }} }}
        """, {"data": x}, {"c": [w]})
    ref = ref_of(x.astype(np.float64))
    if param.startswith("axis: 1"):   # cropped to (2, 2, 3, 2): the conv's 2 channels too
        assert ref.shape == (2, 2, 3, 2)
    check(ws.fetch("y"), ref)


def test_reshape_and_flatten():
    x = rand(2, 3, 4)
    ws, _, _ = translate_run("""
        layer { name: 'r' type: 'Reshape' bottom: 'data' top: 'r' reshape_param { shape { dim: 0 dim: -1 dim: 2 } } }
        layer { name: 'f' type: 'Flatten' bottom: 'data' top: 'f' }
        layer { name: 'v' type: 'Flatten' bottom: 'data' top: 'v' flatten_param { axis: 0 } }
        """, {"data": x})
    check(ws.fetch("r"), x.reshape(2, 6, 2).astype(np.float64))
    check(ws.fetch("f"), x.reshape(2, 12).astype(np.float64))
    check(ws.fetch("v"), x.reshape(24).astype(np.float64))


def test_roi_pooling_with_its_defaults():
    """BVLC's caffe.proto has no roi_pooling_param (py-faster-rcnn's field): the op's defaults, a 1x1 max over each
    region of interest (rows: batch index, x1, y1, x2, y2, inclusive)."""
    x = rand(2, 3, 6, 7)
    rois = np.array([[0, 1, 0, 4, 3], [1, 0, 2, 6, 5]], np.float32)
    ws, _, _ = translate_run("layer { name: 'roi' type: 'ROIPooling' bottom: 'data' bottom: 'rois' top: 'y' }",
                             {"data": x, "rois": rois})
    ref = np.stack([x[int(r[0]), :, int(r[2]):int(r[4]) + 1, int(r[1]):int(r[3]) + 1].max(axis=(1, 2)) for r in rois])
    check(ws.fetch("y"), ref[:, :, None, None].astype(np.float64))
