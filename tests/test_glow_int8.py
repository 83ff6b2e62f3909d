"""Glow's Caffe2 importer test nets that use Int8 ops (tests/data/glow; Glow's tests are
tests/unittests/Caffe2ImporterTest.cpp), run with Caffe2's QNNPACK semantics.

Glow reads these nets its own way (its int8 is signed, it honours Int8FC's `axis` and DNNLOWP arguments such as
`dequantize_output` and `quantize_groupwise`, and it takes float or fp16 inputs and float biases). Caffe2's
Int8 ops take uint8 Int8 tensors and int32 biases, flatten Int8FC's input from axis 1, run NHWC only and need
a requantization scale below 1; the nets Caffe2 would refuse as they stand are refused here with the error
Caffe2's checks give, and then run with the smallest change that makes them valid Caffe2 (fed Int8 inputs
and int32 biases, an NHWC layout), checked against float64 references computed here and, where Glow publishes
numbers (Int8FC3DSecondAxis, Int8FCDynamicQuantized), against those.
"""
from pathlib import Path

import numpy as np
import pytest

import stepnet
from stepnet import Int8Tensor, Workspace
from stepnet.core.errors import ArgumentError, DTypeError, ShapeError, StepnetWarning
from stepnet.io.proto import DeviceOption, make_argument
from stepnet.testing import DEVICES

GLOW = Path(__file__).resolve().parent / "data" / "glow"
F32 = np.float32

# Every Glow file whose nets hold Int8 ops (test_glow.py counts them as covered here).
GLOW_INT8_FILES = {f"{name}.pbtxt" for name in (
    "conv_group_quantized_init_net", "conv_group_quantized_pred_net", "dynamic_quantized_fc_init",
    "dynamic_quantized_fc_predict_net", "int8convrelu_init_net", "int8convrelu_pred_net",
    "int8fc_3d_second_axis_init", "int8fc_3d_second_axis_predict", "int8fc_4d_first_axis_init_net",
    "int8fc_4d_first_axis_predict_net", "int8sumrelu_init_net", "int8sumrelu_pred_net",
    "int8sumrelu_large_range_init_net", "int8sumrelu_large_range_pred_net", "int8sumrelu_tiny_scale_init_net",
    "int8sumrelu_tiny_scale_pred_net")}


def run(device, predict, init, feeds, edit=None):
    """Run init, feed (overriding init blobs), run predict, all on `device`; returns the workspace."""
    ws = Workspace(gpu="emulate" if device == "emulated" else None)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    nets = []
    for name in (init, predict):
        net = stepnet.load(GLOW / name, kind="net")
        if do:
            net.device_option.CopyFrom(do)
        nets.append(net)
    ws.run_net_once(nets[0])
    for name, value in feeds.items():
        value = value(ws) if callable(value) else value
        ws.feed(name, value, device_option=do)
    if edit:
        edit(nets[1])
    ws.run_net_once(nets[1])
    return ws


def real(t):
    return (t.data.astype(np.float64) - t.zero_point) * t.scale


def quantize(x, scale, zero_point):
    return np.clip(np.rint(np.asarray(x, np.float64) / float(F32(scale))) + zero_point, 0, 255)


def close_codes(got, want, scale, zero_point):
    """got (an Int8Tensor) has the output quantization and is within one step of quantize(want)."""
    assert (got.scale, got.zero_point) == (float(F32(scale)), zero_point)
    want = quantize(want, scale, zero_point)
    assert got.shape == want.shape
    assert np.abs(got.data.astype(np.int64) - want).max() <= 1, (got.data, want)


def int8(rng, shape, scale, zero_point):
    return Int8Tensor(rng.integers(0, 256, size=shape).astype(np.uint8), scale, zero_point)


def bias(values, scale):
    """An int32 bias holding `values` in QNNPACK's convention (scale X.scale * W.scale, zero point 0)."""
    return Int8Tensor(np.rint(np.asarray(values, np.float64) / scale).astype(np.int32), scale, 0)


# ----------------------------------------------------------------------------------------------- Int8SumRelu
@pytest.mark.parametrize("device", DEVICES)
def test_int8sumrelu(device):
    """importInt8SumRelu: data 4 x 2 (Glow: int8 scale 1 offset 0, i.e. uint8 zero point 128) + rhs (codes 1,
    scale 1, zero point 0: ones), ReLU, output scale 1 zero point 0."""
    x = int8(np.random.default_rng(0), (4, 2), 1.0, 128)
    ws = run(device, "int8sumrelu_pred_net.pbtxt", "int8sumrelu_init_net.pbtxt", {"gpu_0/data_0": x})
    close_codes(ws.fetch("out"), np.maximum(real(x) + 1.0, 0), 1.0, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_int8sumrelu_large_range(device):
    """ClipLargeQRangeToFP16: float data quantized with scale 1, plus rhs (codes 1, scale 600, zero point 127:
    -75600 each), ReLU, output scale 575 zero point 120."""
    x = np.random.default_rng(1).uniform(-50, 400, (4, 2)).astype(F32)
    ws = run(device, "int8sumrelu_large_range_pred_net.pbtxt", "int8sumrelu_large_range_init_net.pbtxt",
             {"gpu_0/data_0": x})
    q = np.clip(np.rint(x), 0, 255)
    np.testing.assert_array_equal(ws.fetch("qout").data, q)
    close_codes(ws.fetch("out"), np.maximum(q + (1 - 127) * 600.0, 0), 575.0, 120)


@pytest.mark.parametrize("device", DEVICES)
def test_int8sumrelu_tiny_scale(device):
    """ClipZeroScaleFP16QuantOpt: rhs scale 7e-10, output scale 1e-11. With Glow's input scale 1 the
    input-to-output ratio 1e11 is beyond QNNPACK's add (below 2^8), so Caffe2 refuses it; with an input
    scale of 1e-10 it runs."""
    with pytest.raises(ArgumentError, match="ratio in \\[2\\^-14, 2\\^8\\)"):
        run(device, "int8sumrelu_tiny_scale_pred_net.pbtxt", "int8sumrelu_tiny_scale_init_net.pbtxt",
            {"gpu_0/data_0": Int8Tensor(np.zeros((4, 2), np.uint8), 1.0, 128)})
    x = int8(np.random.default_rng(2), (4, 2), 1e-10, 128)
    ws = run(device, "int8sumrelu_tiny_scale_pred_net.pbtxt", "int8sumrelu_tiny_scale_init_net.pbtxt",
             {"gpu_0/data_0": x})
    rhs = (1 - 13) * float(F32(7e-10))
    close_codes(ws.fetch("out"), np.maximum(real(x) + rhs, 0), 1e-11, 5)


# ----------------------------------------------------------------------------------------------- Int8ConvRelu
def conv_nchw(x, w, b, pad):
    """NCHW conv, stride 1, group 1, in float64 loops."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    y = np.zeros((n, m, h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1)) + np.asarray(b).reshape(1, -1, 1, 1)
    for i, j, p, q in np.ndindex(y.shape[2], y.shape[3], kh, kw):
        r, s = i - pad + p, j - pad + q
        if 0 <= r < h and 0 <= s < wd:
            y[:, :, i, j] += x[:, :, r, s] @ w[:, :, p, q].T
    return y


@pytest.mark.parametrize("device", DEVICES)
def test_int8convrelu(device):
    """importInt8ConvRelu: an NCHW net (no order argument; Glow transposes around its conv). Caffe2's Int8Conv is
    NHWC only and refuses it. In NHWC form (order="NHWC", the 1 x 1 x 2 x 2 filter laid out M x KH x KW x C, the
    1 x 1 x 3 x 3 image fed 1 x 3 x 3 x 1, input scale 0.5 so that X.scale * W.scale / Y_scale = 2/3 < 1) it
    runs. The int32 bias (code 2) counts as 2 * X.scale * W.scale, as in QNNPACK; its own scale 10 and zero
    point 4 are not read."""
    x = int8(np.random.default_rng(3), (1, 1, 3, 3), 0.5, 128)
    with pytest.raises(ArgumentError, match="Int8ConvRelu supports only order=\"NHWC\""):
        run(device, "int8convrelu_pred_net.pbtxt", "int8convrelu_init_net.pbtxt", {"gpu_0/data_0": x})

    def nhwc_filter(ws):
        w = ws.fetch("conv_w")
        return Int8Tensor(np.ascontiguousarray(w.data.transpose(0, 2, 3, 1)), w.scale, w.zero_point)

    x_nhwc = Int8Tensor(np.ascontiguousarray(x.data.transpose(0, 2, 3, 1)), x.scale, x.zero_point)
    ws = run(device, "int8convrelu_pred_net.pbtxt", "int8convrelu_init_net.pbtxt",
             {"gpu_0/data_0": x_nhwc, "conv_w": nhwc_filter},
             edit=lambda net: net.op[0].arg.append(make_argument("order", "NHWC")))
    w = np.full((1, 1, 2, 2), (1 - 10) * 2.0)
    want = np.maximum(conv_nchw(real(x), w, [2 * 0.5 * 2.0], pad=1), 0).transpose(0, 2, 3, 1)
    close_codes(ws.fetch("conv_out"), want, 1.5, 7)


# ----------------------------------------------------------------------------------------------- Int8Conv, groups
@pytest.mark.parametrize("device", DEVICES)
def test_conv_group_quantized(device):
    """convGroupQuantized: NHWC 1 x 1 x 1 x 4 input, 1x1 kernel, pad 1, group 2, filter 4 x 1 x 1 x 2 (codes 128,
    129, scale 1), a float bias of 7s. Caffe2's Int8Conv needs an int32 Int8 bias and ignores the DNNLOWP
    argument quantize_groupwise (and the loaded per-channel scales and offsets); fed an int32 bias of 7s it
    runs."""
    x = int8(np.random.default_rng(4), (1, 1, 1, 4), 0.5, 128)
    with pytest.warns(StepnetWarning, match="quantize_groupwise"), \
            pytest.raises(DTypeError, match="bias as an Int8 tensor .* got a plain float32 tensor"):
        run(device, "conv_group_quantized_pred_net.pbtxt", "conv_group_quantized_init_net.pbtxt", {"input": x})
    with pytest.warns(StepnetWarning, match="quantize_groupwise"):
        ws = run(device, "conv_group_quantized_pred_net.pbtxt", "conv_group_quantized_init_net.pbtxt",
                 {"input": x, "conv_b": bias([7.0] * 4, 0.5)})
    w = np.array([128, 129] * 4, np.float64).reshape(4, 2)
    want = np.full((1, 3, 3, 4), 7.0)
    xs = real(x).reshape(4)
    want[0, 1, 1] += [xs[:2] @ w[0], xs[:2] @ w[1], xs[2:] @ w[2], xs[2:] @ w[3]]
    close_codes(ws.fetch("conv_out"), want, 3.14, 5)


# ----------------------------------------------------------------------------------------------- Int8FC
W3 = np.arange(6, dtype=np.float64).reshape(2, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_int8fc_3d_second_axis(device):
    """Int8FC3DSecondAxis: input 2 x 2 x 3 = 0..11 (int8, scale 1), axis=2, W 2 x 3 = 0..5, bias (0, 1) as uint8.
    Caffe2's Int8FC has no axis argument: it flattens from axis 1 (K = 6, W has 3 columns) and refuses the
    net. Fed as Caffe2 runs an FC over the last axis (input 4 x 3 holding the same values with scale 0.5, the
    bias as int32) it gives Glow's published numbers."""
    feeds = {"input": Int8Tensor(np.arange(12, dtype=np.uint8).reshape(2, 2, 3), 1.0, 0)}
    with pytest.warns(StepnetWarning, match="'axis'"), pytest.raises(ShapeError, match="no axis argument"):
        run(device, "int8fc_3d_second_axis_predict.pbtxt", "int8fc_3d_second_axis_init.pbtxt", feeds)
    feeds = {"input": Int8Tensor(2 * np.arange(12, dtype=np.uint8).reshape(4, 3), 0.5, 0),
             "bias": bias([0.0, 1.0], 0.5)}
    with pytest.warns(StepnetWarning, match="'axis'"):
        ws = run(device, "int8fc_3d_second_axis_predict.pbtxt", "int8fc_3d_second_axis_init.pbtxt", feeds)
    got = ws.fetch("output")
    want = np.arange(12.0).reshape(4, 3) @ W3.T + [0.0, 1.0]
    np.testing.assert_array_equal(got, want.astype(F32))
    glow = [[[4.956894, 14.890197], [14.003877, 51.125492]], [[22.921618, 86.84314], [31.9686, 123.07844]]]
    np.testing.assert_allclose(got.reshape(2, 2, 2), glow, atol=0.2)


@pytest.mark.parametrize("device", DEVICES)
def test_int8fc_4d_first_axis(device):
    """Int8FC4DFirstAxis: input 1 x 5 x 1 x 1 (float in Glow), W 3 x 5 = 0..14, bias (0, 1, 2) as uint8; Glow
    checks the output shape 1 x 3. Caffe2 needs an Int8 input (refused as a float one) and an int32 bias."""
    with pytest.warns(StepnetWarning, match="'axis'"), pytest.raises(DTypeError, match="X as an Int8 tensor"):
        run(device, "int8fc_4d_first_axis_predict_net.pbtxt", "int8fc_4d_first_axis_init_net.pbtxt",
            {"input": np.zeros((1, 5, 1, 1), F32)})
    x = int8(np.random.default_rng(5), (1, 5, 1, 1), 0.1, 0)
    with pytest.warns(StepnetWarning, match="'axis'"):
        ws = run(device, "int8fc_4d_first_axis_predict_net.pbtxt", "int8fc_4d_first_axis_init_net.pbtxt",
                 {"input": x, "bias": bias([0.0, 1.0, 2.0], 0.1)})
    got = ws.fetch("output")
    assert got.shape == (1, 3) and got.dtype == F32
    want = real(x).reshape(1, 5) @ np.arange(15.0).reshape(3, 5).T + [0.0, 1.0, 2.0]
    np.testing.assert_allclose(got, np.clip(np.rint(want), 0, 255), atol=1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_quantized_fc(device):
    """Int8FCDynamicQuantized: fp16 input 2 x 3 = 1..6, W 4 x 3 = 0..11, a float bias 0..3, dequantize_output=1 (a
    DNNLOWP argument). Caffe2's QNNPACK Int8FC takes neither float inputs nor float biases and returns an Int8
    tensor; fed the input quantized (scale 0.5) and the bias as int32 it gives Glow's published numbers."""
    with pytest.warns(StepnetWarning) as warned, pytest.raises(DTypeError, match="X as an Int8"):
        run(device, "dynamic_quantized_fc_predict_net.pbtxt", "dynamic_quantized_fc_init.pbtxt",
            {"input": np.arange(1, 7, dtype=np.float16).reshape(2, 3)})
    assert all(any(f"argument {arg!r} is not used" in str(w.message) for w in warned)
               for arg in ("axis", "dequantize_output"))
    feeds = {"input": Int8Tensor(2 * np.arange(1, 7, dtype=np.uint8).reshape(2, 3), 0.5, 0),
             "bias": bias([0.0, 1.0, 2.0, 3.0], 0.5)}
    with pytest.warns(StepnetWarning, match="dequantize_output"), pytest.warns(StepnetWarning, match="'axis'"):
        ws = run(device, "dynamic_quantized_fc_predict_net.pbtxt", "dynamic_quantized_fc_init.pbtxt", feeds)
    got = ws.fetch("output")
    want = np.arange(1.0, 7.0).reshape(2, 3) @ np.arange(12.0).reshape(4, 3).T + [0.0, 1.0, 2.0, 3.0]
    np.testing.assert_array_equal(want, [[8, 27, 46, 65], [17, 63, 109, 155]])    # Glow's numbers
    np.testing.assert_array_equal(got.dequantize(), want.astype(F32))


def test_every_int8_glow_net_is_here():
    files = {p.name for p in GLOW.glob("*.pbtxt")}
    with_int8 = {name for name in files
                 if any(op.type.startswith("Int8") for op in stepnet.load(GLOW / name, kind="net").op)}
    assert with_int8 == GLOW_INT8_FILES


def _plus_two(kernel):
    def wrong(xp, *xs, **args):
        y = kernel(xp, *xs, **args)
        return Int8Tensor(xp.minimum(y.data, 253) + 2, y.scale, y.zero_point)
    return wrong


@pytest.mark.parametrize("op_type, check", [("Int8SumRelu", lambda: test_int8sumrelu("cpu")),
                                            ("Int8ConvRelu", lambda: test_int8convrelu("cpu")),
                                            ("Int8Conv", lambda: test_conv_group_quantized("cpu")),
                                            ("Int8FC", lambda: test_dynamic_quantized_fc("cpu"))])
def test_broken_kernels_are_caught(op_type, check, broken):
    from stepnet.ops import REGISTRY

    check()
    broken(op_type, _plus_two(REGISTRY.get(op_type).kernel))
    with pytest.raises(AssertionError):
        check()
