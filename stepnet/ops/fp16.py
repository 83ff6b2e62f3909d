"""Half-precision operators: the float <-> half casts (Caffe2's half_float_ops.cc), the fp16 fills
(Float16ConstantFill there; GivenTensorFp16Fill, the literal fp16 weights real files carry), and the packed
fp16 FC of fbgemm (caffe2/quantization/server: FbGemmPack, FbGemmPackTranspose, FbFCPacked).

A packed fp16 weight is a `PackedGemmMatrixFP16` blob in Caffe2, which no file can hold; Caffe2 describes it
to other runtimes as a float16 N x K tensor (fb_fc_packed_op.cc, GetFbgemmTensorInfo), and that is the form
real files use (Glow's FbFCPacked nets fill it with GivenTensorFp16Fill). stepnet keeps packed weights in that
form: FbGemmPack rounds a float N x K weight to float16, and FbFCPacked reads a float16 N x K weight. The FC is
fbgemm's fp16 GEMM: X stays float32, the float16 weights are widened to float32 and every product is summed in
float32, then the float32 bias is added.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..io.proto import DataType
from .base import check_float, like, out_spec, single_gradient
from .fill import FILL_ARGS, fill_shape, fill_spec, typed_values
from .math import canonical_axis, view2d_shape
from .registry import NO_GRADIENT, Arg, op

FP16_MAX = 65504.0


def _require(x, dtype, op_type: str, what: str) -> None:
    if x.dtype is not None and np.dtype(x.dtype) != np.dtype(dtype):
        raise DTypeError(f"{op_type}: {what} must be {np.dtype(dtype).name}, got {x.dtype} (shape "
                         f"{tuple(x.shape)})")


# --------------------------------------------------------------------------------------------- casts
def _to_half_shape(specs, clip=False):
    _require(specs[0], np.float32, "FloatToHalf", "X")
    return [like(specs[0], np.float16)]


@op("FloatToHalf", inputs=1, outputs=1, args={"clip": Arg("bool", False, "clamp to +-65504 instead of inf")},
    shape=_to_half_shape, gradient=single_gradient("HalfToFloat", ["GO0"], ["GI0"]))
def float_to_half(xp, x, clip=False):
    """float32 -> float16, rounding to nearest even; values beyond the half range become +-inf, or with
    clip=1 the largest half (+-65504)."""
    _require(x, np.float32, "FloatToHalf", "X")
    if clip:
        x = xp.clip(x, -FP16_MAX, FP16_MAX)
    with np.errstate(over="ignore"):
        return x.astype(np.float16)


def _half_to_float_maker(g):
    """HalfToFloat -> FloatToHalf(dY) -> dX (Caffe2's GetHalfToFloatGradient)."""
    g.op("FloatToHalf", [g.GO(0)], [g.GI(0)])


def _to_float_shape(specs):
    _require(specs[0], np.float16, "HalfToFloat", "X")
    return [like(specs[0], np.float32)]


@op("HalfToFloat", inputs=1, outputs=1, shape=_to_float_shape, gradient=_half_to_float_maker)
def half_to_float(xp, x):
    """float16 -> float32 (exact)."""
    _require(x, np.float16, "HalfToFloat", "X")
    return x.astype(np.float32)


# --------------------------------------------------------------------------------------------- fills
def _fp16_fill_plan(inputs, shape, extra_shape, input_as_shape, values):
    """(output shape, the float16 tensor or None while the shape is unknown) of GivenTensorFp16Fill."""
    out_shape = fill_shape(inputs, shape, extra_shape, input_as_shape)
    host = typed_values(values, DataType.FLOAT, "GivenTensorFp16Fill 'values'")
    if any(d is None for d in out_shape):
        return out_shape, None
    if host.size != math.prod(out_shape):
        raise ArgumentError(f"the output shape {list(out_shape)} needs {math.prod(out_shape)} values but "
                            f"'values' holds {host.size}; make 'shape' and 'values' agree")
    with np.errstate(over="ignore"):
        return out_shape, host.astype(np.float16).reshape(out_shape)


@op("GivenTensorFp16Fill", inputs=(0, 1), inplace=[(0, 0)], devices="any", gradient=NO_GRADIENT,
    args={**FILL_ARGS, "values": Arg("floats", [], "the elements, row-major, rounded to float16")},
    shape=lambda specs, **a: [fill_spec(_fp16_fill_plan(specs, **a)[0], np.float16)])
def given_tensor_fp16_fill(xp, *inputs, shape, extra_shape, input_as_shape, values):
    """A literal float16 tensor of `shape` from the floats in `values` (each rounded to the nearest half)."""
    return xp.asarray(_fp16_fill_plan(inputs, shape, extra_shape, input_as_shape, values)[1])


def _constant_fp16(value, shape):
    if any(d < 0 for d in shape):
        raise ArgumentError(f"'shape' {list(shape)} has a negative dimension; every dim must be >= 0")
    return tuple(shape), np.float16(value)


@op("Float16ConstantFill", inputs=0, outputs=1, gradient=NO_GRADIENT,
    args={"value": Arg("float", 0.0, "the fill value"), "shape": Arg("ints", [], "output shape")},
    shape=lambda specs, value, shape: [out_spec(_constant_fp16(value, shape)[0], np.float16)],
    alloc=lambda value, shape: [(0, _constant_fp16(value, shape)[0], np.float16)])
def float16_constant_fill(xp, value, shape):
    """A float16 tensor of `shape` holding `value` (rounded to half)."""
    dims, v = _constant_fp16(value, shape)
    return xp.full(dims, v, dtype=np.float16)


# --------------------------------------------------------------------------------------------- packed FC
def _pack_geometry(W, axis_w, op_type):
    """(N, K) of the packed matrix: FbGemmPack reads W as N x K, FbGemmPackTranspose as K x N."""
    _require(W, np.float32, op_type, "the weight")
    rows, cols, _ = view2d_shape(tuple(W.shape), axis_w, "axis_w")
    return (rows, cols) if op_type == "FbGemmPack" else (cols, rows)


def _pack(op_type):
    def kernel(xp, W, axis_w=1, no_packing=0):
        n, k = _pack_geometry(W, axis_w, op_type)
        W2 = W.reshape(k, n).T if op_type == "FbGemmPackTranspose" else W.reshape(n, k)
        with np.errstate(over="ignore"):
            return xp.ascontiguousarray(W2.astype(np.float16))

    def shape(specs, axis_w=1, no_packing=0):
        return [out_spec(_pack_geometry(specs[0], axis_w, op_type), np.float16)]
    return kernel, shape


for _type, _doc in (("FbGemmPack", "An N x K float weight (flattened at axis_w) packed for FbFCPacked: rounded "
                                   "to float16, N x K."),
                    ("FbGemmPackTranspose", "A K x N float weight (flattened at axis_w) packed for FbFCPacked: "
                                            "transposed and rounded to float16, N x K.")):
    _kernel, _shape = _pack(_type)
    _kernel.__name__ = _kernel.__qualname__ = _type
    op(_type, inputs=1, outputs=1, inplace=[(0, 0)], shape=_shape, doc=_doc,
       args={"axis_w": 1, "no_packing": Arg("int", 0, "testing aid of fbgemm; no effect here")})(_kernel)


def fb_fc_shape(X, W, b, axis, axis_w) -> tuple[int, ...]:
    """FbFCPacked's checks (arrays or TensorSpecs); the output shape X.shape[:axis] + (N,)."""
    _require(W, np.float16, "FbFCPacked", "the packed weight W (make it with FbGemmPack or GivenTensorFp16Fill)")
    check_float("FbFCPacked", X=X, b=b)
    _require(X, np.float32, "FbFCPacked", "X")
    if len(b.shape) != 1:
        raise ShapeError(f"FbFCPacked: b must be 1-D with N elements, got b {tuple(b.shape)}")
    M, K, a = view2d_shape(tuple(X.shape), axis)
    aw = canonical_axis(axis_w, len(W.shape), "axis_w")
    N, Kw = math.prod(W.shape[:aw]), math.prod(W.shape[aw:])
    if Kw != K or b.shape[0] != N:
        raise ShapeError(f"FbFCPacked: X {tuple(X.shape)} at axis={axis} is M x K = {M} x {K}; the packed weight "
                         f"W {tuple(W.shape)} is N x K = {N} x {Kw}; b {tuple(b.shape)} must have N = {N} "
                         "elements and the K's must match")
    return tuple(X.shape[:a]) + (N,)


@op("FbFCPacked", inputs=3, outputs=1, inplace=(), args={"axis": 1, "axis_w": 1},
    shape=lambda s, axis, axis_w: [out_spec(fb_fc_shape(*s, axis, axis_w), np.float32)])
def fb_fc_packed(xp, X, W, b, axis=1, axis_w=1):
    """FC with a packed fp16 weight: Y = X·float(W)ᵀ + b in float32, X (float32) read as M x K at axis, W
    (float16) as N x K at axis_w; Y has shape X.shape[:axis] + [N]."""
    out_shape = fb_fc_shape(X, W, b, axis, axis_w)
    M, K, _ = view2d_shape(tuple(X.shape), axis)
    Y = xp.matmul(X.reshape(M, K), W.reshape(out_shape[-1], K).astype(np.float32).T)
    Y += b
    return Y.reshape(out_shape)
