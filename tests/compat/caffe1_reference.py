"""Helpers of the caffe_translator tests: small Caffe1 nets built with caffe_pb2 (a prototxt's NetParameter and a
.caffemodel's trained NetParameter), run once translated, and **Caffe1's** layers as float64 numpy definitions,
written from Caffe's layer sources (src/caffe/layers/*.cpp), not from the translation."""
import math

import numpy as np
from google.protobuf import text_format

from stepnet import Workspace, caffe_pb2
from stepnet.compat import caffe_translator as ct

RNG = np.random.default_rng(7)
TOL = dict(rtol=1e-5, atol=1e-5)


def rand(*shape, low=-1.0, high=1.0):
    return RNG.uniform(low, high, shape).astype(np.float32)


def prototxt(inputs: dict, body: str) -> caffe_pb2.NetParameter:
    """A NetParameter with one Input layer per input (name -> shape) and then the layers in `body`."""
    dims = {n: " ".join(f"dim: {d}" for d in s) for n, s in inputs.items()}
    text = "name: 'tiny'\n" + "".join(
        f"layer {{ name: '{n}' type: 'Input' top: '{n}' input_param {{ shape {{ {d} }} }} }}\n"
        for n, d in dims.items()) + body
    net = caffe_pb2.NetParameter()
    text_format.Merge(text, net)
    return net


def trained(weights: dict) -> caffe_pb2.NetParameter:
    """A .caffemodel's NetParameter: per layer name, its blobs (shape + data)."""
    model = caffe_pb2.NetParameter()
    for name, arrays in weights.items():
        layer = model.layer.add(name=name)
        for a in arrays:
            blob = layer.blobs.add()
            blob.shape.dim.extend(a.shape)
            blob.data.extend(a.ravel().tolist())
    return model


def run(net, feeds: dict, params) -> Workspace:
    ws = Workspace()
    for name, value in feeds.items():
        ws.feed(name, value)
    for p in params.protos:
        ws.feed(p.name, np.asarray(p.float_data, np.float32).reshape(tuple(p.dims)))
    ws.run_net_once(net)
    return ws


def translate_run(body, inputs, weights=None, is_test=True, **kw):
    caffe_net = prototxt({n: a.shape for n, a in inputs.items()}, body)
    net, params = ct.TranslateModel(caffe_net, trained(weights or {}), is_test=is_test, **kw)
    return run(net, inputs, params), net, params


# --- Caffe1's layers in float64 -------------------------------------------------------------------------------

def c1_conv(x, w, b, stride=(1, 1), pad=(0, 0), dil=(1, 1), group=1):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]))
    xp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd] = x
    oh = (h + 2 * pad[0] - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + 2 * pad[1] - (dil[1] * (kw - 1) + 1)) // stride[1] + 1
    y = np.zeros((n, o, oh, ow))
    og = o // group
    for g in range(group):
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cg:(g + 1) * cg, i * stride[0]:i * stride[0] + dil[0] * (kh - 1) + 1:dil[0],
                           j * stride[1]:j * stride[1] + dil[1] * (kw - 1) + 1:dil[1]]
                y[:, g * og:(g + 1) * og, i, j] = np.einsum("nchw,ochw->no", patch, w[g * og:(g + 1) * og])
    return y + (0 if b is None else b.astype(np.float64)[None, :, None, None])


def c1_deconv(x, w, b, stride, pad):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    _, o, k, _ = w.shape
    full = np.zeros((n, o, stride * (h - 1) + k, stride * (wd - 1) + k))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * stride:i * stride + k, j * stride:j * stride + k] += np.einsum("nc,cokl->nokl",
                                                                                        x[:, :, i, j], w)
    y = full[:, :, pad:full.shape[2] - pad, pad:full.shape[3] - pad]
    return y + b.astype(np.float64)[None, :, None, None]


def c1_pool(x, kind, k, s, p):
    """Caffe1's PoolingLayer: ceil output size, less one where the last window would start in the end pad;
    MAX over the clipped window; AVE divides by the window clipped to size + pad (padding counted)."""
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    size = []
    for dim in (h, w):
        o = int(math.ceil((dim + 2 * p - k) / s)) + 1
        if p and (o - 1) * s >= dim + p:
            o -= 1
        size.append(o)
    y = np.zeros((n, c, *size))
    for i in range(size[0]):
        for j in range(size[1]):
            hs, ws = i * s - p, j * s - p
            he, we = min(hs + k, h + p), min(ws + k, w + p)
            count = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            win = x[:, :, hs:he, ws:we]
            y[:, :, i, j] = win.max(axis=(2, 3)) if kind == "MAX" else win.sum(axis=(2, 3)) / count
    return y


def c1_lrn(x, size, alpha, beta, k):
    x = x.astype(np.float64)
    c = x.shape[1]
    pre = (size - 1) // 2
    scale = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(ch - pre, 0), min(ch - pre + size, c)
        scale[:, ch] = k + alpha / size * (x[:, lo:hi] ** 2).sum(axis=1)
    return x * scale ** -beta


def c1_inner_product(x, w, b, axis=1, transpose=False):
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    w = w.T if transpose else w                # Caffe1 stores K x N when transpose
    m = int(np.prod(x.shape[:axis]))
    y = x.reshape(m, -1) @ w.T + b
    return y.reshape(*x.shape[:axis], w.shape[0])


def c1_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def check(got, ref, **tol):
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_allclose(got, ref, **(tol or TOL))
