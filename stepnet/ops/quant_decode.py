"""QuantDecode and QuantDecodeGradient: a codebook of float values looked up by integer codes, after
caffe2/operators/quant_decode_op.{h,cc} (the codebooks come from Caffe2's model_quantize.py).

QuantDecode(codebook, codes_0, ..., codes_{n-1}) -> decoded_0, ..., decoded_{n-1}, one output per code
tensor (Caffe2's schema: inputs = outputs + 1): decoded_i has codes_i's shape and the codebook's type, and
decoded_i[k] = codebook.flat[codes_i[k]]. Caffe2 registers it for a float32 codebook (any shape, read flat) and
uint8, uint16 or int32 codes; here the codebook may be any float type. Every code must lie in [0, codebook size):
Caffe2 only DCHECKs it (off by one, and not at all in release builds), here a code outside that range is a
ShapeError naming the op, the code tensor and its position, before anything is read.

Its gradient (GetQuantDecodeGradient) is one QuantDecodeGradient(codebook, codes_0..n-1, dY_0..n-1) -> the
codebook's gradient: zeros shaped like the codebook, plus every dY_i[k] added at codes_i[k]. dY_i must have as
many elements as codes_i (Caffe2 compares the counts, not the shapes) and the codebook's type. Neither op may
run in place (their schemas allow none); QuantDecodeGradient has no gradient. MPSCNNQuantDecode, the run-once
form of Caffe2's iOS Metal builds, is not registered.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArityError, DTypeError, GradientError, ShapeError
from .base import GradientContext, check_float, dtype_name, like, out_spec, size_of
from .index import check_bounds, spec_value
from .registry import op

CODE_TYPES = ("uint8", "uint16", "int32")   # the (codebook, codes) pairs Caffe2's decoder table holds


def _check_codes(op_type: str, codebook, codes, name: str, xp, value) -> None:
    """codes of one of Caffe2's code types, and (where their value is known: an array of module xp) every one
    inside the codebook."""
    if codes.dtype is not None and dtype_name(codes.dtype) not in CODE_TYPES:
        raise DTypeError(f"{op_type}: {name} must hold uint8, uint16 or int32 codes, got {codes.dtype} "
                         "(Cast to=6: uint8, to=2: int32)")
    if value is not None:
        check_bounds(xp, value, size_of(codebook), f"{op_type}: {name}",
                     f" (codes index the {size_of(codebook)} values of the codebook)")


def _decode_checks(codebook, codes, xp, values) -> None:
    """QuantDecode's checks on arrays or specs; values: the codes' values (arrays of module xp, or None where
    unknown) for the bounds check."""
    check_float("QuantDecode", codebook=codebook)
    for i, (c, value) in enumerate(zip(codes, values)):
        _check_codes("QuantDecode", codebook, c, f"codes_{i}", xp, value)


def _decode_shape(specs):
    codebook, *codes = specs
    _decode_checks(codebook, codes, np, [spec_value(c) for c in codes])
    return [out_spec(c.shape, codebook.dtype) for c in codes]


def _quant_decode_gradient(g: GradientContext) -> None:
    """QuantDecodeGradient(codebook, codes_0..n-1, dY_0..n-1) -> dcodebook, as Caffe2's maker wires it."""
    if g.n_inputs != g.n_outputs + 1:
        raise GradientError(f"QuantDecode has {g.n_inputs} inputs and {g.n_outputs} outputs; its gradient needs "
                            "one output per code tensor (inputs = outputs + 1)", at=g.label)
    g.op("QuantDecodeGradient", [g.I(i) for i in range(g.n_inputs)] + [g.GO(i) for i in range(g.n_outputs)],
         [g.GI(0)])


@op("QuantDecode", inputs=(2, None), outputs=(1, None), inplace=(), context="structure", shape=_decode_shape,
    shapes_from_inputs=True, grows="shapes", gradient=_quant_decode_gradient)
def quant_decode(ctx, xp, codebook, *codes):
    """codebook (float, read flat), codes_0..codes_{n-1} (uint8/uint16/int32) -> decoded_i = codebook[codes_i],
    shaped like codes_i, of the codebook's type; one output per code tensor."""
    if len(ctx.outputs) != len(codes):
        raise ArityError(f"QuantDecode writes one output per code tensor: {len(codes)} code tensor(s) need "
                         f"{len(codes)} output(s), got {len(ctx.outputs)}")
    _decode_checks(codebook, codes, xp, codes)
    flat = xp.reshape(codebook, (-1,))
    return tuple(xp.reshape(xp.take(flat, xp.reshape(c, (-1,))), c.shape) for c in codes)   # (0-D codes too)


def _gradient_checks(codebook, rest, xp, values) -> int:
    """QuantDecodeGradient's checks on arrays or specs (values: the codes' values, as for QuantDecode); the
    number of code tensors."""
    if len(rest) % 2:
        raise ArityError(f"QuantDecodeGradient takes the codebook, n code tensors and their n gradients (an odd "
                         f"number of inputs, at least 3), got {len(rest) + 1}")
    n = len(rest) // 2
    for i in range(n):
        codes, grad = rest[i], rest[n + i]
        check_float("QuantDecodeGradient", codebook=codebook, **{f"dY_{i}": grad})
        _check_codes("QuantDecodeGradient", codebook, codes, f"codes_{i}", xp, values[i])
        if size_of(codes) != size_of(grad):
            raise ShapeError(f"QuantDecodeGradient: codes_{i} {tuple(codes.shape)} has {size_of(codes)} elements "
                             f"but its gradient dY_{i} {tuple(grad.shape)} has {size_of(grad)}; they must match")
    return n


def _gradient_shape(specs):
    codebook, *rest = specs
    _gradient_checks(codebook, rest, np, [spec_value(c) for c in rest[:len(rest) // 2]])
    return [like(codebook)]


@op("QuantDecodeGradient", inputs=(3, None), outputs=1, inplace=(), shape=_gradient_shape,
    shapes_from_inputs=True)
def quant_decode_gradient(xp, codebook, *rest):
    """codebook, codes_0..n-1, dY_0..n-1 -> dcodebook (the codebook's shape and type): zeros, plus each dY_i[k]
    added at codes_i[k] (summed in float64)."""
    n = _gradient_checks(codebook, rest, xp, rest[:len(rest) // 2])
    size = size_of(codebook)
    total = xp.zeros((size,), dtype=np.float64)
    for codes, grad in zip(rest[:n], rest[n:]):
        total += xp.bincount(xp.reshape(codes, (-1,)), weights=xp.reshape(grad, (-1,)), minlength=size)
    return xp.reshape(total.astype(codebook.dtype), codebook.shape)
