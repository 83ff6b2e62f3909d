"""Shared by the tests of the Int8 families: making Int8 inputs, and comparing an op's Int8 output with a float
reference written in the test (dequantize the inputs, compute in float64, quantize with the output's
parameters).

The quantization here is the plain definition, round(x / scale) + zero_point clamped to [0, 255] in float64;
an op's integer arithmetic (QNNPACK's fixed-point requantization, float32 scales, its own tie rule) may land
one code away from it, never more: `check_close` allows one quantization step and no more.
"""
import numpy as np

from stepnet import Int8Tensor
from stepnet.core import backend

F32 = np.float32


def codes(t) -> np.ndarray:
    """The host codes of an Int8Tensor."""
    return np.asarray(backend.to_host(t.data))


def real(t) -> np.ndarray:
    """The float64 values an Int8Tensor stands for."""
    return (codes(t).astype(np.float64) - t.zero_point) * t.scale


def quantize(x, scale, zero_point) -> np.ndarray:
    """round(x / scale) + zero_point, clamped to the uint8 range, in float64."""
    return np.clip(np.rint(np.asarray(x, np.float64) / float(np.float32(scale))) + zero_point, 0, 255)


def random_int8(rng, shape, scale, zero_point, lo=0, hi=255) -> Int8Tensor:
    return Int8Tensor(rng.integers(lo, hi + 1, size=shape).astype(np.uint8), scale, zero_point)


def bias_for(rng, n, x_scale, w_scale, spread=400) -> Int8Tensor:
    """An int32 bias in QNNPACK's convention: codes with scale x_scale * w_scale and zero point 0."""
    return Int8Tensor(rng.integers(-spread, spread + 1, size=n).astype(np.int32), F32(x_scale) * F32(w_scale), 0)


def check_close(got, want, scale, zero_point, what="output"):
    """got is an Int8Tensor with the output quantization, its codes within one step of quantize(want)."""
    assert isinstance(got, Int8Tensor), f"{what}: expected an Int8Tensor, got {type(got).__name__}"
    assert got.dtype == np.uint8, f"{what}: codes are {got.dtype}, expected uint8"
    assert (got.scale, got.zero_point) == (float(F32(scale)), zero_point), (
        f"{what}: quantization ({got.scale}, {got.zero_point}), expected ({float(F32(scale))}, {zero_point})")
    want_codes = quantize(want, scale, zero_point)
    assert got.shape == want_codes.shape, f"{what}: shape {got.shape}, expected {want_codes.shape}"
    diff = np.abs(codes(got).astype(np.int64) - want_codes)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    assert not diff.size or diff.max() <= 1, (
        f"{what}: code {codes(got)[worst]} at {worst} is {int(diff.max())} steps from the reference "
        f"{want_codes[worst]:.0f} (real {np.asarray(want)[worst]:.6g})")


def check_exact(got, want_codes, scale, zero_point, what="output"):
    """got is an Int8Tensor equal to these codes and this quantization."""
    want_codes = np.asarray(want_codes)
    assert isinstance(got, Int8Tensor), f"{what}: expected an Int8Tensor, got {type(got).__name__}"
    assert (got.scale, got.zero_point) == (float(F32(scale)), zero_point), (
        f"{what}: quantization ({got.scale}, {got.zero_point}), expected ({float(F32(scale))}, {zero_point})")
    assert got.dtype == want_codes.dtype and got.shape == want_codes.shape, (
        f"{what}: {got.shape} {got.dtype}, expected {want_codes.shape} {want_codes.dtype}")
    np.testing.assert_array_equal(codes(got), want_codes, err_msg=what)
