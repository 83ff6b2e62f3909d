"""Small math ops of Caffe2's neural-network toolbox: NegateGradient (identity forward, -dY backward),
SquareRootDivide (rows divided by the square root of a per-row scale), SinusoidPositionEncoding (the
Transformer's position table) and DotProductWithPadding (row dot products of rows of different widths), with
the gradient ops Caffe2 registers.

Semantics from caffe2/operators/{negate_gradient,square_root_divide,sinusoid_position_encoding}_op.{h,cc} and
distance_op.{h,cc}. NegateGradient's gradient is Negative(dY); SquareRootDivide's is SquareRootDivide(dY,
SCALE) (SCALE gets none); DotProductWithPadding's is DotProductWithPaddingGradient(X, Y, dZ) -> (dX, dY)
with pad_value and replicate passed explicitly. SinusoidPositionEncoding has none registered (its input holds
integer positions).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from .base import check_float, like, out_spec, single_gradient, size_of
from .registry import op


# --------------------------------------------------------------------------------------------- NegateGradient
def _negate_shape(specs):
    return [like(specs[0])]


@op("NegateGradient", inputs=1, outputs=1, inplace=[(0, 0)], shape=_negate_shape, shapes_from_inputs=True,
    gradient=single_gradient("Negative", ["GO0"]))
def negate_gradient(xp, x):
    """Y = X (a copy); its gradient is -dY, so the loss is maximized through it (a gradient reversal layer)."""
    return x.copy()


# --------------------------------------------------------------------------------------------- SquareRootDivide
def _srd_checks(data, scale) -> None:
    check_float("SquareRootDivide", DATA=data)
    if scale.dtype is not None and scale.dtype.name not in ("float32", "float64", "int32", "int64"):
        raise DTypeError(f"SquareRootDivide: SCALE must be float, int32 or int64, got {scale.dtype}")
    if len(data.shape) < 1 or len(scale.shape) < 1:
        raise ShapeError(f"SquareRootDivide needs DATA and SCALE of at least 1 dim (N ...), got DATA "
                         f"{tuple(data.shape)} and SCALE {tuple(scale.shape)}")
    if scale.shape[0] != data.shape[0]:
        raise ShapeError(f"SquareRootDivide: SCALE {tuple(scale.shape)} must have one value per row of DATA "
                         f"{tuple(data.shape)} (first dims {scale.shape[0]} != {data.shape[0]})")


def _srd_shape(specs):
    _srd_checks(*specs)
    return [like(specs[0])]


@op("SquareRootDivide", inputs=2, outputs=1, inplace=[(0, 0)], shape=_srd_shape, shapes_from_inputs=True,
    gradient=single_gradient("SquareRootDivide", ["GO0", "I1"]))
def square_root_divide(xp, data, scale):
    """Row i of DATA (N x ...) divided by sqrt(SCALE[i]); a row whose scale is 0 is copied unchanged. A
    negative scale is an error."""
    _srd_checks(data, scale)
    n = data.shape[0]
    s = scale.reshape(-1)[:n].astype(np.float64)
    if n and bool((s < 0).any()):
        i = int(xp.argmax(s < 0))
        raise ShapeError(f"SquareRootDivide: SCALE[{i}] = {float(s[i])} is negative; scales must be >= 0")
    with np.errstate(divide="ignore"):
        mult = xp.where(s == 0, 1.0, 1.0 / xp.sqrt(s)).astype(data.dtype)
    return data * mult.reshape((n,) + (1,) * (data.ndim - 1))


# --------------------------------------------------------------------------------------------- sinusoids
def _sinusoid_checks(positions, embedding_size, alpha) -> None:
    if positions.dtype is not None and positions.dtype.name not in ("int32", "int64"):
        raise DTypeError(f"SinusoidPositionEncoding: positions must be int32 or int64, got {positions.dtype}")
    if len(positions.shape) != 2:
        raise ShapeError(f"SinusoidPositionEncoding: positions must be 2-D (M x K), got shape "
                         f"{tuple(positions.shape)}")
    if embedding_size < 0:
        raise ArgumentError(f"SinusoidPositionEncoding argument embedding_size must be >= 0, got {embedding_size}")
    if not (math.isfinite(alpha) and alpha > 0):   # the wavelengths are alpha^(i/E): a positive base
        raise ArgumentError(f"SinusoidPositionEncoding argument alpha must be a positive number, got {alpha}")


def _sinusoid_shape(specs, *, embedding_size, alpha, amplitude):
    _sinusoid_checks(specs[0], embedding_size, alpha)
    return [out_spec((*specs[0].shape, embedding_size), np.float32)]


@op("SinusoidPositionEncoding", inputs=1, outputs=1, inplace=(), shape=_sinusoid_shape, shapes_from_inputs=True,
    grows="shapes", args={"embedding_size": 100, "alpha": 10000.0, "amplitude": 1.0})
def sinusoid_position_encoding(xp, positions, *, embedding_size, alpha, amplitude):
    """positions (M x K, int) -> float32 M x K x embedding_size: for the position p = positions[m, 0] (every
    column of a row must hold the same one), amplitude * sin(p / alpha^(i / E)) at even i and amplitude *
    cos(p / alpha^(i / E)) at odd i, E = embedding_size."""
    _sinusoid_checks(positions, embedding_size, alpha)
    m, k = positions.shape
    e = embedding_size
    pos = positions[:, :1].astype(np.float64)                                     # M x 1
    i = xp.arange(e, dtype=np.float64).reshape(1, e)
    angle = pos * xp.exp(-(i / max(e, 1)) * math.log(alpha)) + (i % 2) * (math.pi / 2)   # cos = sin + pi/2
    rows = (amplitude * xp.sin(angle)).astype(np.float32)
    return xp.ascontiguousarray(xp.broadcast_to(rows.reshape(m, 1, e), (m, k, e)))


# --------------------------------------------------------------------------------------------- padded dot
def _padded_dims(X, Y, replicate: bool) -> tuple[int, int, int]:
    """(N, DX, DY): the rows and the two row widths, checked."""
    check_float("DotProductWithPadding", X=X, Y=Y)
    if len(X.shape) != len(Y.shape) or len(X.shape) < 1:
        raise ShapeError(f"DotProductWithPadding needs X and Y of one rank >= 1, got X {tuple(X.shape)} and Y "
                         f"{tuple(Y.shape)}")
    if X.shape[0] != Y.shape[0]:
        raise ShapeError(f"DotProductWithPadding: X {tuple(X.shape)} and Y {tuple(Y.shape)} must have the same "
                         "first dim (one row each)")
    n = X.shape[0]
    if size_of(X) == 0:
        return 0, 0, 0
    dx, dy = size_of(X) // n, size_of(Y) // n
    if replicate and (min(dx, dy) == 0 or max(dx, dy) % min(dx, dy)):
        raise ShapeError(f"DotProductWithPadding with replicate: the row widths {dx} (X) and {dy} (Y) must be "
                         "positive and one must divide the other")
    return n, dx, dy


def _padded_shape(specs, *, pad_value, replicate):
    _padded_dims(*specs, replicate)
    return [out_spec((specs[0].shape[0],), specs[0].dtype)]


def _padded_gradient(g):
    g.op("DotProductWithPaddingGradient", [g.I(0), g.I(1), g.GO(0)], [g.GI(0), g.GI(1)], copy_args=False,
         pad_value=float(g.arg("pad_value", 0.0)), replicate=bool(g.arg("replicate", False)))


PAD_ARGS = {"pad_value": 0.0, "replicate": False}


@op("DotProductWithPadding", inputs=2, outputs=1, inplace=(), args=PAD_ARGS, shape=_padded_shape,
    shapes_from_inputs=True, gradient=_padded_gradient)
def dot_product_with_padding(xp, X, Y, *, pad_value, replicate):
    """Z[i] = the dot product of row i of X and of Y (rows are everything after the first dim), rows of
    different widths made equal by padding the shorter with pad_value, or with replicate by repeating it
    (the longer width must then be a multiple of the shorter)."""
    n, dx, dy = _padded_dims(X, Y, replicate)
    if n == 0:
        return xp.zeros((X.shape[0],), X.dtype)
    x, y = X.reshape(n, dx), Y.reshape(n, dy)
    d = min(dx, dy)
    if replicate:
        long_, short = (x, y) if dx > dy else (y, x)
        return (long_.reshape(n, -1, d) * short.reshape(n, 1, d)).sum(axis=(1, 2))
    out = (x[:, :d] * y[:, :d]).sum(axis=1)
    if dx != dy:
        rest = (x if dx > dy else y)[:, d:]
        out = out + rest.sum(axis=1) * X.dtype.type(pad_value)
    return out


def _padded_grad_checks(X, Y, dZ, replicate):
    n, dx, dy = _padded_dims(X, Y, replicate)
    check_float("DotProductWithPaddingGradient", X=X, dZ=dZ)
    if tuple(dZ.shape) != (X.shape[0],):
        raise ShapeError(f"DotProductWithPaddingGradient: dZ {tuple(dZ.shape)} must be 1-D with one value per row "
                         f"({X.shape[0]},)")
    return n, dx, dy


def _padded_grad_shape(specs, *, pad_value, replicate):
    _padded_grad_checks(*specs, replicate)
    return [like(specs[0]), like(specs[1])]


@op("DotProductWithPaddingGradient", inputs=3, outputs=2, inplace=(), args=PAD_ARGS, shape=_padded_grad_shape,
    shapes_from_inputs=True)
def dot_product_with_padding_gradient(xp, X, Y, dZ, *, pad_value, replicate):
    """X, Y, dZ -> dX, dY of DotProductWithPadding: each row's partner (padded or repeated) times dZ[i]; the
    padded tail of the longer row gets dZ[i] * pad_value."""
    n, dx, dy = _padded_grad_checks(X, Y, dZ, replicate)
    if n == 0:
        return xp.zeros_like(X), xp.zeros_like(Y)
    x, y, g = X.reshape(n, dx), Y.reshape(n, dy), dZ.reshape(n, 1)
    d = min(dx, dy)
    if replicate:
        long_, short = (x, y) if dx > dy else (y, x)
        d_long = xp.broadcast_to((short * g).reshape(n, 1, d), (n, max(dx, dy) // d, d)).reshape(n, -1)
        d_short = (long_.reshape(n, -1, d) * g.reshape(n, 1, 1)).sum(axis=1)
        gx, gy = (d_long, d_short) if dx > dy else (d_short, d_long)
        return xp.ascontiguousarray(gx).reshape(X.shape), xp.ascontiguousarray(gy).reshape(Y.shape)
    gx, gy = xp.zeros((n, dx), X.dtype), xp.zeros((n, dy), Y.dtype)
    gx[:, :d] = y[:, :d] * g
    gy[:, :d] = x[:, :d] * g
    if dx != dy:
        (gx if dx > dy else gy)[:, d:] = g * X.dtype.type(pad_value)
    return gx.reshape(X.shape), gy.reshape(Y.shape)
