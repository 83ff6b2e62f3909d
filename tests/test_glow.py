"""Glow's Caffe2 importer test nets (tests/data/glow, from pytorch/glow tests/models/caffe2Models) in stepnet.

Inputs have the shapes that Glow's tests/unittests/Caffe2ImporterTest.cpp gives them (random ones seeded
here); every expected output is computed in this file from loops or definitions, and checked against the
literal numbers Glow publishes where it has them. Where Glow's importer reads a net differently from Caffe2
(NHWC filter layout, AveragePool padding, LayerNorm/Reshape/Copy arity, BatchMatMul broadcasting), the
Caffe2 behaviour is expected and the Caffe2 source that says so is named at the test.
"""
from __future__ import annotations

import contextlib
import math
import struct
from pathlib import Path

import numpy as np
import pytest

import stepnet
from stepnet import Workspace
from stepnet.cli.run import unsupported_ops
from stepnet.core.errors import (
    ArgumentError, ArityError, DTypeError, NetError, ShapeError, StepnetError, StepnetWarning)
from stepnet.ops import REGISTRY
from stepnet.io.proto import DeviceOption, make_argument
from stepnet.testing import DEVICES
from test_glow_int8 import GLOW_INT8_FILES

GLOW = Path(__file__).resolve().parent / "data" / "glow"
F32, I32, I64 = np.float32, np.int32, np.int64


def load(name: str):
    return stepnet.load(GLOW / name, kind="net")


def run(device, predict, init=None, feeds=None, outputs=None, edit=None, ws=None):
    """Run init (if any), feed (overriding init blobs), run predict; all on `device`. Returns host arrays."""
    if ws is None:
        ws = Workspace(gpu="emulate" if device == "emulated" else None, seed=0)
    do = DeviceOption(device_type=1) if device != "cpu" else None
    if init:
        net = load(init)
        if do:
            net.device_option.CopyFrom(do)
        ws.run_net_once(net)
    for name, value in (feeds or {}).items():
        ws.feed(name, value, device_option=do)
    net = load(predict)
    if edit:
        edit(net)
    if do:
        net.device_option.CopyFrom(do)
    ws.run_net_once(net)
    return {o: ws.fetch(o) for o in (net.external_output if outputs is None else outputs)}


def close(got, want, rtol=1e-5, atol=1e-5, name="output"):
    want = np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def uniform(rng, lo, hi, *shape):
    return rng.uniform(lo, hi, shape).astype(F32)


# ---------------------------------------------------------------------- loop references
def conv_ref(x, w, b, pad, dil=1, stride=1):
    """NCHW conv, group 1: y[n,m,i,j] = b[m] + sum_{c,p,q} x[n,c,i*s-pad+p*dil, j*s-pad+q*dil]*w[m,c,p,q]."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    Ho = (H + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    Wo = (W + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    y = np.zeros((N, M, Ho, Wo))
    for n, m, i, j in np.ndindex(N, M, Ho, Wo):
        acc = float(b[m])
        for c, p, q in np.ndindex(C, kh, kw):
            r, t = i * stride - pad + p * dil, j * stride - pad + q * dil
            if 0 <= r < H and 0 <= t < W:
                acc += float(x[n, c, r, t]) * float(w[m, c, p, q])
        y[n, m, i, j] = acc
    return y.astype(F32)


def deconv_ref(x, w, b, pad, stride=1):
    """NCHW ConvTranspose, filter (C, M, kh, kw): scatter each input pixel, crop `pad` each side, add bias."""
    N, C, H, W = x.shape
    _, M, kh, kw = w.shape
    full = np.zeros((N, M, (H - 1) * stride + kh, (W - 1) * stride + kw))
    for n, c, i, j, m, p, q in np.ndindex(N, C, H, W, M, kh, kw):
        full[n, m, i * stride + p, j * stride + q] += float(x[n, c, i, j]) * float(w[c, m, p, q])
    out = full[:, :, pad:full.shape[2] - pad, pad:full.shape[3] - pad]
    return (out + np.asarray(b, float).reshape(1, -1, 1, 1)).astype(F32)


def pool_ref(x, k, s, p, kind, include_pad=False, legacy=False):
    """NCHW Max/AveragePool over windows clipped to the image (Caffe2 pool_op: padding never wins a max)."""
    def size(n):
        if not legacy:
            return (n + 2 * p - k) // s + 1
        o = math.ceil((n + 2 * p - k) / s) + 1  # CAFFE_LEGACY_POOLING: ceil, last window must start inside
        return o - 1 if p > 0 and (o - 1) * s >= n + p else o
    N, C, H, W = x.shape
    y = np.zeros((N, C, size(H), size(W)))
    for n, c, i, j in np.ndindex(*y.shape):
        vals = [float(x[n, c, r, q]) for r in range(i * s - p, i * s - p + k)
                for q in range(j * s - p, j * s - p + k) if 0 <= r < H and 0 <= q < W]
        count = k * k if include_pad else len(vals)
        y[n, c, i, j] = max(vals) if kind == "max" else math.fsum(vals) / count
    return y.astype(F32)


def nhwc(fn, x, *args, **kw):
    return fn(x.transpose(0, 3, 1, 2), *args, **kw).transpose(0, 2, 3, 1)


def fc_ref(x, W, b, axis=1):
    """FC: rows of x flattened at axis, y[i, j] = sum_k row_i[k] * W[j, k] + b[j] (W is out x in)."""
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
    y = [[math.fsum(float(r[k]) * float(W[j][k]) for k in range(len(r))) + float(b[j]) for j in range(len(b))]
         for r in rows]
    return np.array(y, F32).reshape(x.shape[:axis] + (len(b),))


def matmul_ref(a, b):
    """Leading dims equal (or b 2-D); last two dims multiplied by explicit sums."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    out = np.zeros(a.shape[:-1] + (b.shape[-1],))
    for idx in np.ndindex(*a.shape[:-2]):
        A, B = a[idx], (b[idx] if b.ndim == a.ndim else b)
        for i, j in np.ndindex(A.shape[0], B.shape[1]):
            out[idx + (i, j)] = math.fsum(A[i, k] * B[k, j] for k in range(A.shape[1]))
    return out.astype(F32)


def layer_norm_ref(x, axis, eps):
    """Rows of x flattened at axis: (x - mean) / sqrt(var + eps); returns Y, mean and std shaped (..., 1)."""
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(float)
    mean = np.array([math.fsum(r) / len(r) for r in rows])
    var = [math.fsum((v - m) ** 2 for v in r) / len(r) for r, m in zip(rows, mean, strict=True)]
    std = np.sqrt(np.array(var) + eps)
    y = (rows - mean[:, None]) / std[:, None]
    stats = x.shape[:axis] + (1,)
    return y.reshape(x.shape).astype(F32), mean.reshape(stats).astype(F32), std.reshape(stats).astype(F32)


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def elementwise(fn, x, dtype=F32):
    return np.array([fn(float(v)) for v in x.ravel()], dtype).reshape(x.shape)


# ---------------------------------------------------------------------- numeric cases
# name -> (predict, init, case(rng) -> (feeds, {output: expected}), rtol)
CASES = {}


def case(name, predict, init=None, rtol=1e-5):
    def register(fn):
        CASES[name] = (predict, init, fn, rtol)
        return fn
    return register


@case("conv_dilated", "predict_net.pbtxt", "init_net.pbtxt")
def _(rng):  # importConv: data 0..8 (getNCHWData), kernel 2, pad 1, dilations [2, 2], W ones, b 2
    x = np.arange(9, dtype=F32).reshape(1, 1, 3, 3)
    want = conv_ref(x, np.ones((1, 1, 2, 2)), [2.0], pad=1, dil=2)
    np.testing.assert_array_equal(want.ravel(), [6, 10, 6, 10, 18, 10, 6, 10, 6])  # Glow's numbers
    return {"gpu_0/data_0": x}, {"conv_out": want}


DECONV_X = np.array([2, 3, 4, 5], F32).reshape(1, 1, 2, 2)
DECONV_W = np.arange(2, 11, dtype=F32).reshape(1, 1, 3, 3)


@case("convtranspose", "convtranspose.pbtxt", "convtranspose_init.pbtxt")
def _(rng):
    want = deconv_ref(DECONV_X, DECONV_W, [1.0], pad=0)
    np.testing.assert_array_equal(want.ravel(),
                                  [5, 13, 18, 13, 19, 50, 64, 42, 37, 92, 106, 66, 33, 77, 86, 51])
    return {"gpu_0/data_0": DECONV_X}, {"convTranspose_out": want}


@case("convtranspose_pads", "convtranspose_pads.pbtxt", "convtranspose_init.pbtxt")
def _(rng):
    want = deconv_ref(DECONV_X, DECONV_W, [1.0], pad=1)
    np.testing.assert_array_equal(want.ravel(), [50, 64, 92, 106])
    return {"gpu_0/data_0": DECONV_X}, {"convTranspose_out": want}


@case("convtranspose_net", "convtranspose_net.pbtxt")  # Glow has no test or init for it: weights fed here
def _(rng):
    x, w, b = uniform(rng, -3, 3, 2, 2, 4, 5), uniform(rng, -1, 1, 2, 3, 2, 2), uniform(rng, -1, 1, 3)
    return ({"gpu_0/data_0": x, "convTranspose_w": w, "convTranspose_b": b},
            {"convTranspose_out": deconv_ref(x, w, b, pad=1)})


for _name, _order, _legacy in [("maxpool_predict_net", "NCHW", False),
                               ("maxpool_nhwc_predict_net", "NHWC", False),
                               ("maxpool_legacy_padding_predict_net", "NCHW", True)]:
    @case(_name, _name + ".pbtxt")
    def _(rng, order=_order, legacy=_legacy):  # Glow feeds {1, 3, 3, 1} to every pooling net
        x = uniform(rng, -3, 3, 1, 3, 3, 1)
        ref = (lambda v: nhwc(pool_ref, v, 2, 1, 1, "max")) if order == "NHWC" else \
            (lambda v: pool_ref(v, 2, 1, 1, "max", legacy=legacy))
        return {"inputs": x}, {"output": ref(x)}


@case("avgpool_predict_net", "avgpool_predict_net.pbtxt")
def _(rng):  # Caffe2 pool_op.h AveragePoolFunctor: count_include_pad defaults to false (Glow assumes true)
    x = uniform(rng, -3, 3, 1, 3, 3, 1)
    return {"inputs": x}, {"output": pool_ref(x, 2, 1, 1, "avg", include_pad=False)}


@case("avgpool_nhwc_predict_net", "avgpool_nhwc_predict_net.pbtxt")
def _(rng):
    x = uniform(rng, -3, 3, 1, 3, 3, 1)
    return {"inputs": x}, {"output": nhwc(pool_ref, x, 2, 1, 1, "avg", include_pad=False)}


@case("NCHW2NHWC", "NCHW2NHWC_predict_net.pbtxt")
def _(rng):
    x = uniform(rng, -3, 3, 1, 2, 3, 4)
    y = np.zeros((1, 3, 4, 2), F32)
    for n, c, h, w in np.ndindex(*x.shape):
        y[n, h, w, c] = x[n, c, h, w]
    return {"inputs": x}, {"output": y}


@case("resize_nearest", "resize_nearest_op_net.pbtxt")
def _(rng):  # Caffe2 resize_op.cc: out = int(in * scale), source index min(int(o / scale), in - 1)
    x = uniform(rng, -3, 3, 1, 2, 2, 1)
    y = np.zeros((1, int(2 * 2.0), int(2 * 1.5), 1), F32)
    for i, j in np.ndindex(y.shape[1], y.shape[2]):
        y[0, i, j, 0] = x[0, min(int(i / 2.0), 1), min(int(j / 1.5), 1), 0]
    return {"input_0": x}, {"resize_nearest_test_output": y}


def concat_case(shapes, axis, add_axis):
    def make(rng):
        xs = [uniform(rng, -3, 3, *s) for s in shapes]
        if add_axis:  # result[..., i, ...] = input i, a new axis inserted at `axis`
            y = np.zeros(shapes[0][:axis] + (len(xs),) + shapes[0][axis:], F32)
            for i, x in enumerate(xs):
                for idx in np.ndindex(*x.shape):
                    y[idx[:axis] + (i,) + idx[axis:]] = x[idx]
        else:
            y = np.zeros((shapes[0][0], sum(s[1] for s in shapes)), F32)
            col = 0
            for x in xs:
                for r, c in np.ndindex(*x.shape):
                    y[r, col + c] = x[r, c]
                col += x.shape[1]
        split = np.array([1] * len(xs) if add_axis else [s[axis] for s in shapes], I32)  # second output
        return {f"inputs_{i}": x for i, x in enumerate(xs)}, {"concat_result": y, "split_info": split}
    return make


case("concat", "concat_predict_net.pbtxt")(concat_case([(10, 7), (10, 12), (10, 5)], 1, False))
case("concat_add_axis", "concat_add_axis_predict_net.pbtxt")(concat_case([(10, 7)] * 3, 1, True))
case("concat_add_axis_at_edge", "concat_add_axis_at_edge.pbtxt")(concat_case([(7, 11, 13, 5)] * 3, 4, True))


@case("fc", "fc_predict_net.pbtxt", "fc_init_net.pbtxt")
def _(rng):  # W = 1..12 as 4x3, b = 0.1..0.4, inputs 1..6 as 2x3
    x = np.arange(1, 7, dtype=F32).reshape(2, 3)
    return {"inputs": x}, {"fc_result": fc_ref(x, np.arange(1, 13).reshape(4, 3), [0.1, 0.2, 0.3, 0.4])}


@case("fcTransposed", "fcTransposed_predict_net.pbtxt", "fcTransposed_init_net.pbtxt")
def _(rng):  # the same weights stored in x out order (3x4): y = x . W + b
    x = np.arange(1, 7, dtype=F32).reshape(2, 3)
    return {"inputs": x}, {"fc_result": fc_ref(x, np.arange(1, 13).reshape(4, 3), [0.1, 0.2, 0.3, 0.4])}


@case("fc_3d_second_axis", "fc_3d_second_axis_predict.pbtxt", "fc_3d_second_axis_init.pbtxt")
def _(rng):
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    want = fc_ref(x, np.arange(20).reshape(5, 4), np.arange(5), axis=2)
    glow = [[[14, 39, 64, 89, 114], [38, 127, 216, 305, 394], [62, 215, 368, 521, 674]],
            [[86, 303, 520, 737, 954], [110, 391, 672, 953, 1234], [134, 479, 824, 1169, 1514]]]
    np.testing.assert_array_equal(want, glow)  # Glow: "Data is based on Caffe2 results"
    return {"input": x}, {"output": want}


@case("fc_4d_first_axis", "fc_4d_first_axis_predict_net.pbtxt", "fc_4d_first_axis_init_net.pbtxt")
def _(rng):  # ConstantFill without value: zeros, so the output is zeros of (1, 3)
    return {"inputs": uniform(rng, -3, 3, 1, 5, 1, 1)}, {"fc_result": np.zeros((1, 3), F32)}


@case("fc_4d_first_axis_params", "fc_4d_first_axis_predict_net.pbtxt", "fc_4d_first_axis_init_net.pbtxt")
def _(rng):  # the same net with weights fed over the init's zeros
    x, W, b = uniform(rng, -3, 3, 1, 5, 1, 1), uniform(rng, -1, 1, 3, 5), uniform(rng, -1, 1, 3)
    return {"inputs": x, "weights": W, "bias": b}, {"fc_result": fc_ref(x, W, b, axis=1)}


def selector_fc_case(transposed):
    """fc_4d / fcTransposed_4d (2048 -> 9190): W picks input j % 2048 for output j; bias is a ramp."""
    def make(rng):
        x = uniform(rng, -3, 3, 1, 1, 1, 2048)
        W = np.zeros((2048, 9190) if transposed else (9190, 2048), F32)  # K x N for FCTransposed
        out, picked = np.arange(9190), np.arange(9190) % 2048
        W[(picked, out) if transposed else (out, picked)] = 1.0
        b = (np.arange(9190) * 1e-3).astype(F32)
        want = np.array([x[0, 0, 0, j % 2048] + b[j] for j in range(9190)], F32).reshape(1, 1, 1, 9190)
        return {"inputs": x, "weights": W, "bias": b}, {"fc_result": want}
    return make


case("fc_4d", "fc_4d_predict_net.pbtxt", "fc_4d_init_net.pbtxt")(selector_fc_case(False))
case("fcTransposed_4d", "fcTransposed_4d_predict_net.pbtxt", "fcTransposed_4d_init_net.pbtxt")(
    selector_fc_case(True))


@case("parallel_matmul", "parallel_matmul_predict_net.pbtxt")
def _(rng):
    a, b = uniform(rng, -3, 3, 3, 10, 7), uniform(rng, -3, 3, 3, 7, 10)
    return {"inputs_0": a, "inputs_1": b}, {"output": matmul_ref(a, b)}


@case("batched_matmul", "batched_matmul.pbtxt")
def _(rng):  # Glow's first shape case, lhs 0.. and rhs 10.. (iota); equal batch dims need no broadcast
    a = np.arange(48, dtype=F32).reshape(2, 2, 3, 4)
    b = np.arange(10, 90, dtype=F32).reshape(2, 2, 4, 5)
    return {"lhs": a, "rhs": b}, {"result": matmul_ref(a, b)}


@case("elementwise_linear_axis0", "elementwise_linear_net.pbtxt")
def _(rng):  # Caffe2 elementwise_linear_op.cc: D = X.size_from_dim(axis); axis=0 takes all 50 elements
    X, w, b = uniform(rng, -3, 3, 10, 5), uniform(rng, -3, 3, 50), uniform(rng, -3, 3, 50)
    y = np.array([[X[i, j] * w[5 * i + j] + b[5 * i + j] for j in range(5)] for i in range(10)], F32)
    return {"X": X, "w": w, "b": b}, {"el_result": y}


for _name in ["elementwise_linear_default_net", "elementwise_linear_broadcast_net"]:
    @case(_name, _name + ".pbtxt")
    def _(rng):  # axis 1 (default) / Mul then Add broadcasting w and b over the rows
        X, w, b = uniform(rng, -3, 3, 5, 10), uniform(rng, -3, 3, 10), uniform(rng, -3, 3, 10)
        y = np.array([[X[i, j] * w[j] + b[j] for j in range(10)] for i in range(5)], F32)
        return {"X": X, "w": w, "b": b}, {"el_result": y}


for _shape in [(10,), (10, 20)]:  # Glow's dotProduct1D and dotProduct2D
    @case(f"dot_product{_shape}", "dot_product_predict_net.pbtxt")
    def _(rng, shape=_shape):  # Caffe2 distance_op.cc: one dot per dim-0 row, so 1-D inputs multiply
        x, y = uniform(rng, -3, 3, *shape), uniform(rng, -3, 3, *shape)
        rows = [math.fsum(a * b for a, b in zip(np.atleast_1d(xr).tolist(), np.atleast_1d(yr).tolist(),
                                                  strict=True)) for xr, yr in zip(x, y, strict=True)]
        return {"X": x, "Y": y}, {"dot_product": np.array(rows, F32)}


@case("multiple_inputs_graph", "multiple_inputs_graph.pbtxt")
def _(rng):
    a, b = uniform(rng, -3, 3, 3, 4), uniform(rng, -3, 3, 3, 4)
    return {"input1": a, "input2": b}, {"output": elementwise(float, a) + elementwise(float, b)}


def unary(name, predict, inp, out, shape, lo, hi, fn, dtype=F32, rtol=1e-5, special=()):
    def make(rng):
        x = uniform(rng, lo, hi, *shape)
        x.ravel()[:len(special)] = special
        return {inp: x}, {out: elementwise(fn, x, dtype)}
    case(name, predict, rtol=rtol)(make)


unary("exp", "exp_op_net.pbtxt", "data", "result", (1, 2, 4, 3), -10, 10, math.exp, rtol=2e-6)
unary("sigmoid", "sigmoid.pbtxt", "sigmoid_test_input", "sigmoid_test_output", (6,), -10, 10, sigmoid)
unary("swish", "swish_op_net.pbtxt", "input", "swish_result", (10,), -10, 10, lambda v: v * sigmoid(v))
unary("softplus", "softplus.pbtxt", "input", "output", (20, 50), -3, 3, lambda v: math.log(math.exp(v) + 1))
unary("sign", "sign.pbtxt", "input", "output", (20, 50), -3, 3, lambda v: (v > 0) - (v < 0),
      special=(0.0, -0.0))
unary("negative", "negative.pbtxt", "input", "output", (5, 6), -3, 3, lambda v: -v)
unary("scale", "scale.pbtxt", "input", "output", (10, 30), -10, 10, lambda v: 2 * v)
unary("clip", "clip_op_net.pbtxt", "inputs_0", "clip_result", (5, 5), 0, 80,
      lambda v: min(max(v, 20.0), 60.0))
# Clip's defaults are the float limits (Glow importClipDefault), so infinities clamp to them
unary("clip_default", "clip_op_default_net.pbtxt", "inputs_0", "clip_result", (5, 5), -3e38, 3e38,
      lambda v: min(max(v, float(np.finfo(F32).min)), float(np.finfo(F32).max)), special=(np.inf, -np.inf))


def logit(v):
    """Caffe2 Logit, eps 1e-6: clamp x to [eps, 1 - eps] (float32 bounds), then log(x / (1 - x))."""
    eps = float(F32(1e-6))
    v = min(max(v, eps), float(F32(1 - eps)))
    return math.log(v / (1 - v))


unary("logit", "logit_op_net.pbtxt", "inputs_0", "logit_result", (10,), -0.2, 1.2, logit, rtol=1e-4,
      special=(0.0, 1.0, 0.5))


@case("alias", "alias_op_net.pbtxt")
def _(rng):
    x = uniform(rng, -3, 3, 1, 2, 3, 4)
    return {"X": x}, {"Y": x.copy()}


@case("cast_int64_to_int64", "cast_int64_to_int64.pbtxt")
def _(rng):
    x = np.arange(1, 13, dtype=I64).reshape(3, 4)
    return {"input": x}, {"output": x.copy()}


@case("argmin", "argmin.pbtxt")
def _(rng):  # axis 1, keepdims 0: int64 index of the smallest element of the row
    x = uniform(rng, -3, 3, 1, 50)
    return {"input": x}, {"output": np.array([min(range(50), key=lambda i: x[0, i])], I64)}


@case("eq", "eq_op_net.pbtxt")
def _(rng):
    x = uniform(rng, -3, 3, 10)
    y = np.where(np.arange(10) % 3 == 0, x, x + 1).astype(F32)
    return {"X": x, "Y": y}, {"eq": np.array([x[i] == y[i] for i in range(10)], bool)}


@case("prelu", "prelu.pbtxt")
def _(rng):  # Glow's data and slopes; slope per channel (NCHW)
    x = np.array([-2, -0.5, 0, 1, 2, 3, 4, 5, 6, -1.5, -2.5, 7, 8, 9, 10, 11, 12, 13], F32)
    want = np.array([-0.2, -0.05, 0, 1, 2, 3, 4, 5, 6, -0.3, -0.5, 7, 8, 9, 10, 11, 12, 13], F32)
    x, want = x.reshape(1, 2, 3, 3), want.reshape(1, 2, 3, 3)
    return {"prelu_test_input": x, "slope": np.array([0.1, 0.2], F32)}, {"prelu_test_output": want}


for _shape in [(3, 2), (64, 64, 11), (2, 3, 4, 5), (11, 13, 17)]:
    @case(f"reduce_back_sum{_shape}", "reduce_back_sum.pbtxt", rtol=1e-4)
    def _(rng, shape=_shape):
        x = uniform(rng, -3, 3, *shape)
        rows = x.reshape(-1, shape[-1]).astype(float)
        y = np.array([math.fsum(row) for row in rows], F32).reshape(shape[:-1])
        return {"inputs_0": x}, {"result": y}


@case("reducebackmean", "reducebackmean.pbtxt")
def _(rng):
    x = np.arange(1, 13, dtype=F32).reshape(3, 4)
    return {"input": x}, {"output": np.array([2.5, 6.5, 10.5], F32)}


@case("lengths_sum", "lengths_sum.pbtxt")
def _(rng):
    x, lengths = uniform(rng, -3, 3, 10, 2, 3), np.array([2, 0, 3, 1, 4], I32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    y = np.zeros((5, 2, 3), F32)
    for s, (a, n) in enumerate(zip(starts, lengths, strict=True)):
        for r in range(a, a + n):
            y[s] += x[r]
    return {"data": x, "lengths": lengths}, {"result": y}


@case("lengths_to_ranges", "lengths_to_ranges.pbtxt", "lengths_to_ranges_init_net.pbtxt")
def _(rng):  # lengths 1, 3, 0, 2 from the init net -> (offset, length) pairs
    return {}, {"output": np.array([[0, 1], [1, 3], [4, 0], [4, 2]], I32)}


@case("sparse_to_dense", "sparse_to_dense.pbtxt", rtol=1e-4)
def _(rng):  # Glow's sparseToDense_indices1D: 40 indices below 20, repeated indices accumulate
    idx, vals = rng.integers(0, 20, 40).astype(I64), uniform(rng, -3, 3, 40, 10, 5)
    y = np.zeros((20, 10, 5), F32)
    for i in range(40):
        y[idx[i]] += vals[i]
    return {"indices": idx, "values": vals, "dataToInferDim": uniform(rng, 0, 1, 20)}, {"dense_result": y}


def sls_ref(rows, indices, lengths, weights=None):
    """Per segment, the sum of weights[k] * rows[indices[k]] by explicit loops (float64)."""
    out, k = [], 0
    for n in lengths:
        acc = [0.0] * len(rows[0])
        for _ in range(n):
            w = 1.0 if weights is None else float(weights[k])
            acc = [a + w * float(v) for a, v in zip(acc, rows[indices[k]], strict=True)]
            k += 1
        out.append(acc)
    return np.array(out, F32)


@case("fbfcpacked_3d_second_axis", "fbfcpacked_3d_second_axis_predict.pbtxt", "fbfcpacked_3d_second_axis_init.pbtxt")
def _(rng):  # the fp16 weights 0..19 are exact in half: the same numbers as fc_3d_second_axis
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    want = fc_ref(x, np.arange(20).reshape(5, 4), np.arange(5), axis=2)
    np.testing.assert_array_equal(want[1, 2], [134, 479, 824, 1169, 1514])   # Glow's numbers ("from Caffe2")
    return {"input": x}, {"output": want}


@case("fbfcpacked_4d_first_axis", "fbfcpacked_4d_first_axis_predict_net.pbtxt",
      "fbfcpacked_4d_first_axis_init_net.pbtxt")
def _(rng):  # W 0..14 as 3 x 5 (float16), b 0, 1, 2; Glow checks the (1, 3) shape only
    x = uniform(rng, -3, 3, 1, 5, 1, 1)
    return {"input": x}, {"output": fc_ref(x, np.arange(15).reshape(3, 5), [0, 1, 2], axis=1)}


@case("halftofloat", "halftofloat_op_net.pbtxt")
def _(rng):  # Glow's input: float16 (1, 2, 3, 4)
    x = uniform(rng, -100, 100, 1, 2, 3, 4).astype(np.float16)
    return {"X": x}, {"Y": elementwise(float, x)}


@case("batch_sparse_to_dense_last_dim_1", "batch_sparse_to_dense_last_dim_1.pbtxt")
def _(rng):  # Glow's batchSparseToDense_lastdim1: 100 lengths of 0 or 1, every index 0
    lengths = rng.integers(0, 2, 100).astype(I32)
    values = uniform(rng, -3, 3, int(lengths.sum()))
    want, v = np.zeros((100, 1), F32), iter(values.tolist())
    for d in range(100):
        if lengths[d] == 1:
            want[d, 0] = next(v)
    return {"lengths": lengths, "indices": np.zeros(values.size, I64), "values": values}, {"output": want}


@case("sparse_to_dense_mask", "sparse_to_dense_mask_op_net.pbtxt")
def _(rng):  # Glow's shapes: indices (4,), values (4, 10, 20, 30), default (10, 20, 30); mask 42 100 300 1 0 312
    mask = [42, 100, 300, 1, 0, 312]
    idx = np.array([300, 7, 0, 42], I64)                 # 7 is not in the mask
    values, default = uniform(rng, -3, 3, 4, 10, 20, 30), uniform(rng, -3, 3, 10, 20, 30)
    want = np.empty((6, 10, 20, 30), F32)
    for j, m in enumerate(mask):
        want[j] = default
        for k in range(4):
            if idx[k] == m:
                want[j] = values[k]
    return {"indices": idx, "values": values, "defaultValue": default}, {"output": want}


GLOW_SLWS = {"indices": np.array([1, 0, 2, 0, 1, 2, 2, 0], I64), "lengths": np.array([3, 0, 3, 2], I32)}


@case("rowwise_quantized_sparse_lengths_weighted_sum",
      "rowwise_quantized_sparse_lengths_weighted_sum_predict_net.pbtxt",
      "rowwise_quantized_sparse_lengths_weighted_sum_init_net.pbtxt")
def _(rng):  # codes 0 with (scale 1, bias b) rows: DATA = [[2.0], [-0.5], [13.0]]
    want = sls_ref(GLOW_WEIGHTED, GLOW_SLWS["indices"], GLOW_SLWS["lengths"], GLOW_WEIGHTS)
    np.testing.assert_allclose(want.ravel(), [0.5, 0, 0, 25], atol=0.03)   # Glow's expected output
    return dict(GLOW_SLWS), {"result": want}


@case("fused_rowwise_quantized_sparse_lengths_weighted_sum",
      "fused_rowwise_quantized_sparse_lengths_weighted_sum_predict_net.pbtxt",
      "fused_rowwise_quantized_sparse_lengths_weighted_sum_init_net.pbtxt")
def _(rng):  # the same table fused: codes 0, float32 scale 0 and bias 2.0, -0.5, 13.0
    want = sls_ref(GLOW_WEIGHTED, GLOW_SLWS["indices"], GLOW_SLWS["lengths"], GLOW_WEIGHTS)
    np.testing.assert_allclose(want.ravel(), [0.5, 0, 0, 25], atol=0.02)
    return dict(GLOW_SLWS), {"result": want}


for _name, _shape, _source in [("constant_fill_use_provided_shape", (7, 11, 13, 17), None),
                               ("constant_fill_input_as_shape", (17, 23, 29, 31), "init"),
                               ("constant_fill_use_input_shape", (7, 11, 13, 17), "feed")]:
    @case(_name, _name + ".pbtxt", (_name + "_init.pbtxt") if _source == "init" else None)
    def _(rng, shape=_shape, source=_source):
        feeds = {"inputs_0": uniform(rng, -3, 3, *shape)} if source == "feed" else {}
        return feeds, {"result": np.full(shape, 3.0, F32)}


# ---------------------------------------------------------------------- later Caffe2 ops (pointwise, selection, ...)
@case("convrelu", "convrelu_pred_net.pbtxt", "convrelu_init_net.pbtxt")
def _(rng):  # importConvRelu: Glow's importConv data and weights (all outputs positive), then max(0, .)
    x = np.arange(9, dtype=F32).reshape(1, 1, 3, 3)
    want = np.maximum(conv_ref(x, np.ones((1, 1, 2, 2)), [2.0], pad=1), 0)
    np.testing.assert_array_equal(want.ravel(), [2, 3, 5, 4, 5, 10, 14, 9, 11, 22, 26, 15, 8, 15, 17, 10])
    return {"gpu_0/data_0": x}, {"conv_out": want}


@case("convrelu_negative", "convrelu_pred_net.pbtxt", "convrelu_init_net.pbtxt")
def _(rng):  # the same net where the Relu clips
    x = uniform(rng, -3, 1, 1, 1, 3, 3)
    return {"gpu_0/data_0": x}, {"conv_out": np.maximum(conv_ref(x, np.ones((1, 1, 2, 2)), [2.0], pad=1), 0)}


@case("bucketize", "bucketize_op_net.pbtxt")
def _(rng):  # boundaries [0.1, 2.5]: std::lower_bound over the float32 boundaries
    x = uniform(rng, -3, 3, 3, 2)
    x.ravel()[:2] = [0.1, 2.5]
    edges = [float(F32(0.1)), float(F32(2.5))]
    return {"input_0": x}, {"bucketize_test_output": elementwise(
        lambda v: sum(1 for e in edges if e < v), x, I32)}


@case("replace_nan", "replace_nan_predict_net.pbtxt")
def _(rng):  # value 1
    x = uniform(rng, -3, 3, 10, 10)
    x.ravel()[::7] = np.nan
    return {"input": x}, {"replace_nan_result": elementwise(lambda v: 1.0 if math.isnan(v) else v, x)}


@case("batch_box_cox", "batch_box_cox_predict_net.pbtxt", rtol=1e-5)
def _(rng):  # kRows 10, kCols 5; Caffe2 batch_box_cox_op.cc: t = max(x + l2, 1e-6), log t or (t^l1 - 1) / l1
    data, l1, l2 = uniform(rng, 0, 4, 10, 5), np.array([0, 0.5, -1, 2, 0], F32), uniform(rng, -0.5, 0.5, 5)
    want = [[math.log(max(float(data[i, j]) + float(l2[j]), 1e-6)) if l1[j] == 0 else
             (max(float(data[i, j]) + float(l2[j]), 1e-6) ** float(l1[j]) - 1) / float(l1[j]) for j in range(5)]
            for i in range(10)]
    return {"data": data, "lambda1": l1, "lambda2": l2}, {"batch_box_cox": np.array(want, F32)}


@case("fill_examples_with_indicator", "fill_examples_with_indicator.pbtxt")
def _(rng):  # n 20, d1 3, d2 4: the data rows go, in order, where the int32 indicator is set
    indicator = rng.integers(0, 2, 20).astype(I32)
    data = uniform(rng, -3, 3, int(indicator.sum()), 3, 4)
    want, row = np.zeros((20, 3, 4), F32), 0
    for i in range(20):
        if indicator[i]:
            want[i], row = data[row], row + 1
    return {"data": data, "indicator": indicator}, {"output": want}


@case("modulo", "modulo_op_net.pbtxt", "fill_test_init_net.pbtxt")
def _(rng):  # Glow's Modulo test: int64 data of 7, divisor 2, sign_follow_divisor 0 (C++ %: sign of the dividend)
    x = np.array([-7, -4, -1, 0, 1, 6, 9], I64)
    return {"data": x}, {"output": np.array([int(math.fmod(v, 2)) for v in x.tolist()], I64)}


@case("rmsnorm", "rmsnorm.pbtxt")
def _(rng):  # eps 1; x 1..12, gamma = beta = 1..4: Glow's numbers ("based on Caffe2 implementation")
    x, g = np.arange(1, 13, dtype=F32).reshape(3, 4), np.arange(1, 5, dtype=F32)
    rrms = [1 / math.sqrt(math.fsum(float(v) ** 2 for v in row) / 4 + 1) for row in x]
    y = np.array([[float(x[i, k]) * rrms[i] * float(g[k]) + float(g[k]) for k in range(4)] for i in range(3)], F32)
    np.testing.assert_allclose(y, [[1.3429972, 3.3719888, 6.0869746, 9.487955],
                                   [1.7495317, 3.798876, 6.148033, 8.797003],
                                   [1.8485281, 3.8856182, 6.11127, 8.525484]], atol=1e-5)
    return {"x": x, "gamma": g, "beta": g}, {"y": y, "rrms": np.array(rrms, F32)}


@case("mean_3inputs", "mean_3inputs.pbtxt")
def _(rng):
    a, b, c = (uniform(rng, -3, 3, 5, 6) for _ in range(3))
    want = np.array([[math.fsum((float(a[i, j]), float(b[i, j]), float(c[i, j]))) / 3 for j in range(6)]
                     for i in range(5)], F32)
    return {"input1": a, "input2": b, "input3": c}, {"output": want}


@case("topk_k2", "topk_k2.pbtxt")
def _(rng):  # k 2 over (20, 50): the two largest of each row, largest first; Caffe2's indices are int64
    x = uniform(rng, -3, 3, 20, 50)
    order = [sorted(range(50), key=lambda j, r=r: (-float(x[r, j]), j))[:2] for r in range(20)]
    return {"input": x}, {"values": np.array([[x[r, j] for j in row] for r, row in enumerate(order)], F32),
                          "indices": np.array(order, I64)}


@case("log1p", "log1p.pbtxt")
def _(rng):  # Glow's values
    x = np.array([0.5, 0.1, 0.01, 1, 2, 3, 10, 20, 30, 1.1, 1.01, 1.001], F32).reshape(3, 4)
    return {"input": x}, {"output": elementwise(math.log1p, x)}


@case("gelu", "gelu.pbtxt")
def _(rng):  # (10, 30) in [-10, 10]; Caffe2's default is the exact x * Phi(x), within Glow's 1e-3 of its tanh form
    x = uniform(rng, -10, 10, 10, 30)
    want = elementwise(lambda v: v * 0.5 * math.erfc(-v / math.sqrt(2)), x)
    glow = elementwise(lambda v: 0.5 * v * (1 + math.tanh(0.797885 * v + 0.035677 * v ** 3)), x)
    np.testing.assert_allclose(want, glow, atol=1e-3)
    return {"input": x}, {"output": want}


def check_case(name, device):
    predict, init, make, rtol = CASES[name]
    feeds, want = make(np.random.default_rng(sum(map(ord, name))))
    got = run(device, predict, init, feeds, outputs=list(want))
    for out, value in want.items():
        close(got[out], value, rtol=rtol, atol=rtol, name=f"{predict}:{out}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_glow_net(name, device):
    check_case(name, device)


# ---------------------------------------------------------------------- Glow-only arguments
@pytest.mark.parametrize("device", DEVICES)
def test_gather_ranges_warns_about_max_output_size(device):
    """`maxOutputSize` is a Glow-only static bound: stepnet says it ignores it. Glow's gatherRanges shapes."""
    data = uniform(np.random.default_rng(1), -3, 3, 6)
    ranges = np.array([[[0, 1], [2, 2]], [[4, 1], [5, 1]]], I32)  # (start, length) pairs, 5 elements in all
    with pytest.warns(StepnetWarning, match="maxOutputSize"):
        got = run(device, "gather_ranges.pbtxt", feeds={"data": data, "ranges": ranges})
    want = [data[s + k] for example in ranges for s, n in example for k in range(n)]
    close(got["output"], np.array(want, F32))
    close(got["lengths"], np.array([sum(n for _, n in example) for example in ranges], I32))


@pytest.mark.parametrize("device", DEVICES)
def test_lengths_range_fill_warns_about_max_output_size(device):
    with pytest.warns(StepnetWarning, match="maxOutputSize"):
        got = run(device, "lengths_range_fill_predict_net.pbtxt", feeds={"lengths": np.array([1, 3, 4], I32)})
    close(got["result"], np.array([k for n in (1, 3, 4) for k in range(n)], I32))


# ---------------------------------------------------------------------- nets Caffe2 rejects
X3311 = np.arange(9, dtype=F32).reshape(1, 3, 3, 1)
ERRORS = [
    # caffe2/core/net.cc: with external_input declared, every op input needs a source ("input" vs "inputs")
    ("sqr_predict_net.pbtxt", None, {"input": X3311.reshape(9)}, NetError,
     "source for input 'input' is unknown"),
    # net.cc also enforces, unconditionally, that every external_output is produced
    ("empty_predict_net.pbtxt", "empty_init_net.pbtxt", {}, NetError, "unused_output"),
    # layer_norm_op.cc: NumOutputs(3) (Y, mean, std); Glow's nets name only Y
    ("layernorm_pred_net.pbtxt", None, {"input": np.zeros((4, 2, 5, 5), F32)}, ArityError,
     "LayerNorm takes 3"),
    ("layernorm_neg_axis_pred_net.pbtxt", None, {"input": np.zeros((4, 2, 5, 5), F32)}, ArityError,
     "LayerNorm takes 3"),
    # ... and this one also reads weight and bias without declaring them as external inputs (net.cc)
    ("layernorm_weight_bias_pred_net.pbtxt", "layernorm_weight_bias_init_net.pbtxt",
     {"input": np.zeros((5, 4, 3), F32)}, NetError, "source for input 'weight' is unknown"),
    # reshape_op.cc: NumOutputs(2) (reshaped, old_shape)
    ("gather_const_fold.pbtxt", "gather_const_fold_init.pbtxt", {"data": np.zeros((1, 2, 4, 3), F32)},
     ArityError, "Reshape takes 2 outputs"),
    # copy_op.cc: NumInputs(1); net.cc: node_name must be empty at execution time
    ("pre_partitioned_fill_test_predict_net.pbtxt", "fill_test_init_net.pbtxt", {}, StepnetError,
     r"Copy takes 1 input|node_name"),
    ("pre_partitioned_multi_op_predict_net.pbtxt", None,
     {k: np.eye(10, dtype=F32) for k in ("mm0_in", "mm1_in", "add_in")}, StepnetError, "node_name"),
    # dropout_op.cc: is_test defaults to 0 and training mode writes the mask to Output(1), which is absent
    ("dropout.pbtxt", None, {"input": np.zeros((20, 50), F32)}, ArgumentError, "2 outputs"),
    # conv_op_impl.h: an NHWC filter is M x kH x kW x C/G; Glow's (1, 1, 2, 2) is an NCHW filter
    ("conv_nhwc_predict_net.pbtxt", "conv_nhwc_init_net.pbtxt", {"inputs": X3311}, ShapeError, "NCHW layout"),
    ("dce_test_predict_net.pbtxt", "dce_test_init_net.pbtxt",
     {"fc_inputs": np.zeros((2, 3), F32), "conv_inputs": X3311}, ShapeError, "NCHW layout"),
    # conv_transpose_op_impl.h: an NHWC filter is C x kH x kW x M: kernel 1 x 3 (not 3 x 3), 3 outputs (not 1)
    ("convtranspose_nhwc.pbtxt", "convtranspose_nhwc_init.pbtxt", {"inputs": DECONV_X.reshape(1, 2, 2, 1)},
     ShapeError, r"3 output channels|kernel"),
    # batch_matmul_op.h: batch dims that differ (ranks padded with 1s) need broadcast=1
    ("matmul_trans_RHS_predict_net.pbtxt", None,
     {"inputs_0": np.zeros((3, 10, 7), F32), "inputs_1": np.zeros((10, 7), F32)}, ShapeError, "broadcast=1"),
    # elementwise_linear_op.cc: axis=0 makes D = 50 for X (10, 5), so Glow's w and b of 10 do not fit
    ("elementwise_linear_net.pbtxt", None, {"X": np.zeros((10, 5), F32), "w": np.zeros(10, F32),
                                            "b": np.zeros(10, F32)}, ShapeError, "length 50"),
    # elementwise_ops.cc: EQ on the CPU takes bool, int32, int64, float, double, not uint8
    ("fill_test_predict_net.pbtxt", "fill_test_init_net.pbtxt", {}, DTypeError, "uint8"),
]
ERRORS += [("batched_matmul.pbtxt", None, {"lhs": np.zeros(a, F32), "rhs": np.zeros(b, F32)}, ShapeError,
            "broadcast=1")
           for a, b in [((2, 2, 3, 4), (2, 1, 4, 5)), ((2, 2, 3, 4), (2, 2, 2, 4, 5)),
                        ((2, 2, 2, 3, 4), (3, 1, 2, 2, 4, 5)), ((2, 4, 5), (3, 2, 5, 6))]]
# net.cc again: these embedding-bag nets declare indices and lengths but not the table their init net makes
GLOW_SLS = {"indices": np.array([2, 0, 1, 2, 0, 0, 0, 0], I64), "lengths": np.array([2, 0, 2, 1, 3], I32)}
GLOW_SLS_LENGTH1 = {"indices": np.array([2, 0, 1, 2, 0], I64), "lengths": np.ones(5, I32)}
QUANTIZED_SLS = [
    ("fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt",
     "fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt", GLOW_SLS, "data"),
    ("fused_rowwise_quantized_sparse_lengths_sum_predict_net_length1.pbtxt",
     "fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt", GLOW_SLS_LENGTH1, "data"),
    ("4bit_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt",
     "4bit_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt", GLOW_SLS, "data"),
    ("rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt", "rowwise_quantized_sparse_lengths_sum_init_net.pbtxt",
     GLOW_SLS, "data")]
ERRORS += [(p, i, feeds, NetError, f"source for input '{blob}' is unknown") for p, i, feeds, blob in QUANTIZED_SLS]


@pytest.mark.parametrize("predict, init, feeds, error, match", ERRORS,
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_net_that_caffe2_rejects(predict, init, feeds, error, match):
    with pytest.raises(error, match=match):
        run("cpu", predict, init, feeds, outputs=[])


# ---------------------------------------------------------------------- those nets, repaired
def add_outputs(*names):
    """Name the extra outputs Caffe2 requires of the last op (and declare undeclared external inputs)."""
    def edit(net):
        net.op[-1].output.extend(names)
        if net.external_input:
            missing = [i for op in net.op for i in op.input if i not in net.external_input]
            net.external_input.extend(dict.fromkeys(missing))
    return edit


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("predict, init, shape, axis, eps", [
    ("layernorm_pred_net.pbtxt", None, (4, 2, 5, 5), 2, 0.05),
    ("layernorm_neg_axis_pred_net.pbtxt", None, (4, 2, 5, 5), 2, 0.05),
    # axis 1 and Caffe2's epsilon default 1e-5 (layer_norm_op.h; Glow assumes 1e-3). Without
    # elementwise_affine Caffe2 leaves gamma and beta unread (Glow applies them)
    ("layernorm_weight_bias_pred_net.pbtxt", "layernorm_weight_bias_init_net.pbtxt", (5, 4, 3), 1, 1e-5)])
def test_layer_norm_with_its_statistics_outputs(predict, init, shape, axis, eps, device):
    x = uniform(np.random.default_rng(2), -3, 3, *shape)
    got = run(device, predict, init, {"input": x}, outputs=["result", "mean", "std"],
              edit=add_outputs("mean", "std"))
    for name, want in zip(("result", "mean", "std"), layer_norm_ref(x, axis, eps), strict=True):
        close(got[name], want, rtol=1e-4, atol=1e-5, name=name)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_weight_bias_with_elementwise_affine(device):
    """With elementwise_affine=1 the init net's weight (1..12) and bias (-1..-12) scale and shift each row."""
    x = uniform(np.random.default_rng(3), -3, 3, 5, 4, 3)
    got = run(device, "layernorm_weight_bias_pred_net.pbtxt", "layernorm_weight_bias_init_net.pbtxt",
              {"input": x}, edit=lambda net: (add_outputs("mean", "std")(net),
                                net.op[0].arg.append(make_argument("elementwise_affine", 1))))
    y = layer_norm_ref(x, 1, 1e-5)[0].reshape(5, 12).astype(float)
    want = np.array([[y[i, k] * (k + 1) - (k + 1) for k in range(12)] for i in range(5)], F32)
    want = want.reshape(5, 4, 3)
    close(got["result"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_const_fold_with_old_shape_output(device):
    """Shape -> Gather(index 0, 2, 3, 1) -> Reshape: data (1, 2, 4, 3) becomes (1, 4, 3, 2), order kept."""
    x = uniform(np.random.default_rng(4), -3, 3, 1, 2, 4, 3)
    got = run(device, "gather_const_fold.pbtxt", "gather_const_fold_init.pbtxt", {"data": x},
              outputs=["result", "gather_x", "old_shape"], edit=add_outputs("old_shape"))
    close(got["gather_x"], np.array([1, 4, 3, 2], I64))
    close(got["old_shape"], np.array([1, 2, 4, 3], I64))
    close(got["result"], np.array(list(x.ravel()), F32).reshape(1, 4, 3, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_pre_partitioned_multi_op_without_node_names(device):
    """res = mm0 * (mm0 @ mm1) - ((mm0 @ mm1) + add_in), once the Glow partition hints are removed."""
    rng = np.random.default_rng(5)
    a, b, c = (uniform(rng, -3, 3, 10, 10) for _ in range(3))
    got = run(device, "pre_partitioned_multi_op_predict_net.pbtxt", None,
              {"mm0_in": a, "mm1_in": b, "add_in": c},
              edit=lambda net: [op.ClearField("device_option") for op in net.op])
    mm = matmul_ref(a, b)
    close(got["res"], np.array([[a[i, j] * mm[i, j] - (mm[i, j] + c[i, j]) for j in range(10)]
                                for i in range(10)], F32), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_in_test_mode_is_a_copy(device):
    x = uniform(np.random.default_rng(6), -3, 3, 20, 50)
    got = run(device, "dropout.pbtxt", None, {"input": x}, edit=lambda net: net.op[0].arg.append(
        make_argument("is_test", 1)))
    close(got["output"], x.copy())


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_trans_rhs_with_broadcast(device):
    rng = np.random.default_rng(7)
    a, b = uniform(rng, -3, 3, 3, 10, 7), uniform(rng, -3, 3, 10, 7)
    got = run(device, "matmul_trans_RHS_predict_net.pbtxt", None, {"inputs_0": a, "inputs_1": b},
              edit=lambda net: net.op[0].arg[0].CopyFrom(make_argument("broadcast", 1)))
    close(got["output"], matmul_ref(a, b.T))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("predict, init", [("conv_nhwc_predict_net.pbtxt", "conv_nhwc_init_net.pbtxt"),
                                           ("dce_test_predict_net.pbtxt", "dce_test_init_net.pbtxt")])
def test_conv_nhwc_with_the_filter_in_nhwc_layout(predict, init, device):
    """Glow reads the (1, 1, 2, 2) filter as NCHW and transposes it; fed as (1, 2, 2, 1) Caffe2 agrees.
    Data 0..8, kernel 2, pad 1, W ones, b 2: Glow's first importConv numbers."""
    w = np.ones((1, 2, 2, 1), F32)
    fc_x = np.arange(1, 7, dtype=F32).reshape(2, 3)
    feeds = {"inputs": X3311, "conv_inputs": X3311, "conv_w": w, "fc_inputs": fc_x}
    dce = predict.startswith("dce")
    got = run(device, predict, init, feeds if dce else {"inputs": X3311, "conv_w": w},
              outputs=["conv_result", "fc_result"] if dce else ["conv_out"])
    want = nhwc(conv_ref, X3311, w.transpose(0, 3, 1, 2), [2.0], pad=1)
    np.testing.assert_array_equal(want.ravel(), [2, 3, 5, 4, 5, 10, 14, 9, 11, 22, 26, 15, 8, 15, 17, 10])
    close(got["conv_result" if dce else "conv_out"], want)
    if dce:
        close(got["fc_result"], fc_ref(fc_x, np.arange(1, 13).reshape(4, 3), [0.1, 0.2, 0.3, 0.4]))


@pytest.mark.parametrize("device", DEVICES)
def test_convtranspose_nhwc_with_the_filter_in_nhwc_layout(device):
    w = DECONV_W.transpose(0, 2, 3, 1)  # C x kH x kW x M
    got = run(device, "convtranspose_nhwc.pbtxt", "convtranspose_nhwc_init.pbtxt",
              {"inputs": DECONV_X.reshape(1, 2, 2, 1), "convTranspose_w": w})
    want = nhwc(deconv_ref, DECONV_X.reshape(1, 2, 2, 1), DECONV_W, [1.0], pad=1)
    np.testing.assert_array_equal(want.ravel(), [50, 64, 92, 106])
    close(got["convTranspose_out"], want)


def test_fill_test_net_runs_up_to_the_uint8_compare():
    """Glow's tensorFillsTest: every fill is 2x2 holding 0..3 (the byte string holds 128..131)."""
    ws = Workspace()
    with pytest.raises(DTypeError, match=r"op #3 \(EQ\)"):
        run("cpu", "fill_test_predict_net.pbtxt", "fill_test_init_net.pbtxt", ws=ws)
    for name, dtype, base in [("tensor_fill_float", F32, 0), ("tensor_int_fill", I32, 0),
                              ("tensor_int64_fill", I64, 0), ("tensor_string_to_uint8_fill", np.uint8, 128)]:
        close(ws.fetch(name), np.array([[base, base + 1], [base + 2, base + 3]], dtype), name=name)
    for name in ("tensor_fill_float_eq", "tensor_int_fill_eq", "tensor_int64_fill_eq"):
        close(ws.fetch(name), np.ones((2, 2), bool), name=name)


def fused4_rows(data):
    """4-bit fused rows: two codes per byte (low nibble first), then a float16 scale and bias, dequantized."""
    out = []
    for row in data.tolist():
        scale, bias = struct.unpack("<ee", bytes(row[-4:]))
        out.append([(byte >> shift & 15) * scale + bias for byte in row[:-4] for shift in (0, 4)])
    return np.array(out, F32)


def table_rows(init, device):
    """The init net's embedding table, dequantized by loops over its bytes (or its separate scale_bias)."""
    if init.startswith("rowwise"):
        got = run(device, init, outputs=["data", "scales_bias"])
        sb = got["scales_bias"].astype(float)
        return np.array([[q * sb[i, 0] + sb[i, 1] for q in row] for i, row in enumerate(got["data"].tolist())], F32)
    data = run(device, init, outputs=["data"])["data"]
    return fused4_rows(data) if init.startswith("4bit") else fused_rows(data, data.shape[1] - 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("predict, init, feeds, blob", QUANTIZED_SLS, ids=[q[0] for q in QUANTIZED_SLS])
def test_quantized_embedding_bags_with_their_table_declared(predict, init, feeds, blob, device):
    """Declared as an external input, the table runs: each bag is the loop sum of its dequantized rows (and,
    for the 8-bit tables, within 0.02 of Glow's sums of its documented float rows). `length1` is a Glow-only
    hint, ignored with a warning."""
    hint = pytest.warns(StepnetWarning, match="length1") if "length1" in predict else contextlib.nullcontext()
    with hint:
        got = run(device, predict, init, feeds, edit=add_outputs())["result"]
    want = sls_ref(table_rows(init, device), feeds["indices"], feeds["lengths"])
    close(got, want, rtol=1e-5, atol=1e-5)
    if not predict.startswith("4bit"):
        close(got, sls_ref(GLOW_DATA, feeds["indices"], feeds["lengths"]), rtol=0, atol=0.02)
    else:   # rows 2.0, -1.75 and 2.65625 (float16 biases, scale 0): Glow checks the (5, 10) shape only
        assert got.shape == (5, 10)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_weighted_sum_warns_about_average_lookup_length(device):
    """`average_lookup_length` is a Glow-only hint: ignored with a warning, the sums are those without it."""
    with pytest.warns(StepnetWarning, match="average_lookup_length"):
        got = run(device, "fused_rowwise_quantized_sparse_lengths_weighted_sum_avg_length_predict_net.pbtxt",
                  "fused_rowwise_quantized_sparse_lengths_weighted_sum_init_net.pbtxt", dict(GLOW_SLWS))
    close(got["result"], sls_ref(GLOW_WEIGHTED, GLOW_SLWS["indices"], GLOW_SLWS["lengths"], GLOW_WEIGHTS))


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_label_split_warns_about_keep_gradient_offset_map(device):
    """Glow's sparseLabelSplit data and numbers; Caffe2 keeps the offset map when the op has a (2n+1)-th output,
    so Glow's `keep_gradient_offset_map` is ignored with a warning."""
    lengths, labels = np.array([1, 3, 2, 2], I32), np.array([3, 1, 2, 0, 0, 2, 1, 3], I64)
    values = np.array([1.2, 2.3, 3.1, 6.7, 8.3, 9.0, 3.7, 8.8], F32)
    with pytest.warns(StepnetWarning, match="keep_gradient_offset_map"):
        got = run(device, "sparselabelsplit.pbtxt", feeds={"lengths": lengths, "indices": labels, "values": values})
    rows = [r for r, n in enumerate(lengths) for _ in range(n)]
    for j in range(4):
        picked = [k for k in range(8) if labels[k] == j]
        close(got[f"label_values_{j}"], values[picked])
        close(got[f"example_ids_{j}"], np.array([rows[k] for k in picked], I32))
    close(got["gradient_offset_map"], np.array([sum(labels[:k] == labels[k]) for k in range(8)], I32))
    glow = [[6.7, 8.3], [2.3, 3.7], [3.1, 9.0], [1.2, 8.8]]
    for j in range(4):
        np.testing.assert_allclose(got[f"label_values_{j}"], glow[j], atol=1e-3)
    assert [got[f"example_ids_{j}"].tolist() for j in range(4)] == [[1, 2], [1, 3], [1, 2], [0, 3]]
    assert got["gradient_offset_map"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


# ---------------------------------------------------------------------- random fills
SHAPE_INIT = "gaussian_fill_input_as_shape_init.pbtxt"  # int64 values 4, 5, 6, 7
FILLS = [("gaussian_fill_use_provided_shape.pbtxt", None, None, (4, 5, 6, 7)),
         ("gaussian_fill_input_as_shape.pbtxt", SHAPE_INIT, None, (4, 5, 6, 7)),
         ("gaussian_fill_use_input_shape.pbtxt", None, (4, 5, 6, 7), (4, 5, 6, 7)),
         ("gaussian_fill_use_input_shape_with_extra_shape.pbtxt", None, (4, 5, 6, 7), (4, 5, 6, 7, 2, 3)),
         ("uniform_fill_input_as_shape.pbtxt", SHAPE_INIT, None, (4, 5, 6, 7)),
         ("uniform_fill_use_input_shape.pbtxt", None, (4, 5, 6, 7), (4, 5, 6, 7))]


@pytest.mark.parametrize("predict, init, in_shape, shape", FILLS, ids=[f[0] for f in FILLS])
def test_random_fill(predict, init, in_shape, shape):
    """Shape from the argument, the init net's int64 values or the int64 input; N(0, 1) or U[0, 10).
    Random ops draw on the host, so the emulated device gives the same numbers."""
    feeds = {"inputs_0": np.random.default_rng(8).integers(-10, 10, in_shape)} if in_shape else {}
    cpu, gpu = (run(d, predict, init, feeds)["result"] for d in DEVICES)
    assert cpu.shape == shape and cpu.dtype == F32
    np.testing.assert_array_equal(cpu, gpu)
    values = [float(v) for v in cpu.ravel()]
    mean = math.fsum(values) / len(values)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    if predict.startswith("gaussian"):
        assert abs(mean) < 0.2 and 0.85 < spread < 1.15, (mean, spread)
    else:
        assert min(values) >= 0 and max(values) < 10 and abs(mean - 5) < 0.6, (min(values), max(values), mean)


# ---------------------------------------------------------------------- init nets alone
GLOW_DATA = [[1.0, 1.2], [2.3, 3.4], [4.5, 5.7]]  # Glow's documented rows for the (fused) rowwise SLS tests
GLOW_WEIGHTED = [[2.0], [-0.5], [13.0]]           # ... and for the weighted-sum tests
GLOW_WEIGHTS = np.array([3, 1, 0, 0, 0, 0, 2, -0.5], F32)


def fused_rows(data, n):
    """Rows of n uint8 codes followed by a little-endian float32 scale and bias, dequantized."""
    out = []
    for row in data:
        scale, bias = struct.unpack("<ff", bytes(row[n:n + 8].tolist()))
        out.append([q * scale + bias for q in row[:n].tolist()])
    return np.array(out, F32)


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_init_nets_hold_glows_data(device):
    """The init nets of the rowwise-quantized SLS nets: byte strings become uint8 tensors."""
    got = run(device, "rowwise_quantized_sparse_lengths_sum_init_net.pbtxt", outputs=["data", "scales_bias"])
    assert got["data"].dtype == np.uint8 and got["data"].shape == (3, 2)
    sb = got["scales_bias"].astype(float)
    rows = [[q * sb[i, 0] + sb[i, 1] for q in row] for i, row in enumerate(got["data"].tolist())]
    close(np.array(rows, F32), np.array(GLOW_DATA, F32), atol=1e-4)
    got = run(device, "rowwise_quantized_sparse_lengths_weighted_sum_init_net.pbtxt",
              outputs=["data", "scale_bias", "weights"])
    close(got["data"], np.zeros((3, 1), np.uint8))
    close(got["scale_bias"][:, 1:], np.array(GLOW_WEIGHTED, F32))
    close(got["weights"], GLOW_WEIGHTS)
    data = run(device, "fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt", outputs=["data"])["data"]
    assert data.dtype == np.uint8 and data.shape == (3, 10)
    close(fused_rows(data, 2), np.array(GLOW_DATA, F32), atol=1e-4)
    got = run(device, "fused_rowwise_quantized_sparse_lengths_weighted_sum_init_net.pbtxt",
              outputs=["data", "weights"])
    close(fused_rows(got["data"], 1), np.array(GLOW_WEIGHTED, F32))
    close(got["weights"], GLOW_WEIGHTS)
    data = run(device, "4bit_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt", outputs=["data"])
    data = data["data"]
    raw = b"\0" * 8 + b"\x40" + b"\0" * 8 + b"\xbf" + b"\0" * 7 + b"\x50\x41"  # the file's octal escapes
    close(data, np.array(list(raw), np.uint8).reshape(3, 9))
    got = run(device, "convrelu_init_net.pbtxt", outputs=["conv_w", "conv_b"])
    close(got["conv_w"], np.ones((1, 1, 2, 2), F32))
    close(got["conv_b"], np.array([2.0], F32))


def test_empty_init_net_is_an_empty_netdef():
    assert (GLOW / "empty_init_net.pbtxt").stat().st_size == 0
    net = load("empty_init_net.pbtxt")
    assert isinstance(net, stepnet.NetDef) and len(net.op) == 0 and net.ByteSize() == 0
    ws = Workspace()
    ws.run_net_once(net)
    assert ws.blobs() == []


# ---------------------------------------------------------------------- unsupported, coverage
UNSUPPORTED = {name: set(types.split()) for name, types in [
]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [1, 2])
def test_lpnorm(device, p):
    """LpNorm with average=0: sum |x| (p=1) or sum x^2 (p=2; Caffe2's LpNorm returns the p-th power)."""
    x = uniform(np.random.default_rng(7), -3, 3, 4, 5)
    got = run(device, f"lpnorm_p{p}.pbtxt", None, {"input": x})
    want = sum(abs(float(v)) ** p for v in x.ravel())
    close(got["output"], np.array([want], F32), rtol=1e-5, atol=1e-4)


def test_unsupported_op_types_are_exactly_these():
    """Each net here needs op types stepnet lacks; an op added to stepnet makes this fail, so its net can move
    to the tests above."""
    found = {name: set(unsupported_ops([load(name + ".pbtxt")])) for name in UNSUPPORTED}
    assert found == UNSUPPORTED
    assert not any(t in REGISTRY for types in UNSUPPORTED.values() for t in types)


def test_every_glow_file_is_covered(data_dir):
    """All 140 files: each supported one is run by a test above, each other one is listed as unsupported."""
    files = {p.name for p in (data_dir / "glow").glob("*.pbtxt")}
    assert len(files) == 140
    used = {n for p, i, *_ in CASES.values() for n in (p, i)} | {n for p, i, *_ in ERRORS for n in (p, i)}
    used |= {f[0] for f in FILLS} | {f[1] for f in FILLS} | {
        "gather_ranges.pbtxt", "lengths_range_fill_predict_net.pbtxt", "convrelu_init_net.pbtxt",
        "lpnorm_p1.pbtxt", "lpnorm_p2.pbtxt", "sparselabelsplit.pbtxt",
        "fused_rowwise_quantized_sparse_lengths_weighted_sum_avg_length_predict_net.pbtxt",
        "rowwise_quantized_sparse_lengths_sum_init_net.pbtxt", "empty_init_net.pbtxt",
        "rowwise_quantized_sparse_lengths_weighted_sum_init_net.pbtxt",
        "fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt",
        "fused_rowwise_quantized_sparse_lengths_weighted_sum_init_net.pbtxt",
        "4bit_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt"}
    used |= GLOW_INT8_FILES   # run in test_glow_int8.py
    used.discard(None)
    unsupported = {name + ".pbtxt" for name in UNSUPPORTED}
    assert used | unsupported == files and not used & unsupported
    assert all(not unsupported_ops([load(name)]) for name in used)


# ---------------------------------------------------------------------- testing the tester
@pytest.mark.parametrize("op_type, name, wrong", [
    ("FC", "fc", lambda kernel: lambda xp, *a, **k: kernel(xp, *a, **k) + 1e-3),
    ("FbFCPacked", "fbfcpacked_3d_second_axis", lambda kernel: lambda xp, x, w, b, **k: kernel(xp, x, w, b * 2, **k)),
    ("MaxPool", "maxpool_predict_net", lambda kernel: lambda xp, x, **k: kernel(xp, x[..., ::-1, :], **k)),
    ("ConvTranspose", "convtranspose_pads",
     lambda kernel: lambda xp, x, w, b, **k: kernel(xp, x, w[..., ::-1], b, **k)),
    ("ElementwiseLinear", "elementwise_linear_axis0", lambda kernel: lambda xp, x, w, b, **k: kernel(
        xp, x, w, b * 0, **k)),
    ("Gelu", "gelu", lambda kernel: lambda xp, x, **k: kernel(xp, x, fast_gelu=True)),
    ("TopK", "topk_k2", lambda kernel: lambda xp, x, **k: kernel(xp, x[:, ::-1].copy(), **k)),
    ("RMSNorm", "rmsnorm", lambda kernel: lambda xp, x, g, b, **k: kernel(xp, x, g, b, axis=1, eps=0.0))])
def test_broken_kernels_are_caught(op_type, name, wrong, broken):
    check_case(name, "cpu")
    broken(op_type, wrong(REGISTRY.get(op_type).kernel))
    with pytest.raises(AssertionError):
        check_case(name, "cpu")
