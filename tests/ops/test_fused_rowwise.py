"""Fused row-wise quantization (stepnet/ops/fused_rowwise.py) against the loop references of fused_reference.py
on every device: codes and scale/bias bytes exactly, dequantized values within float32 rounding, and the
round trip within the quantization error Caffe2's tests allow; bad inputs (also found statically), the
no-gradient kind, and broken kernels caught."""
import numpy as np
import pytest
from fused_reference import dequantize, quantize, scale_bias
from reference_check import check

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops.registry import NO_GRADIENT
from stepnet.testing import DEVICES, infer_alone, run_op

RNG = np.random.default_rng(27)
F32, F16 = np.float32, np.float16

# (quantizer, input dtype, bits, float16 scale/bias) and (dequantizer, bits, float16 scale/bias, output dtype)
QUANTIZERS = [("FloatToFused8BitRowwiseQuantized", F32, 8, False),
              ("HalfFloatToFused8BitRowwiseQuantized", F16, 8, False),
              ("FloatToFused8BitRowwiseQuantizedHalfScaleBias", F32, 8, True),
              ("HalfFloatToFused8BitRowwiseQuantizedHalfScaleBias", F16, 8, True),
              ("FloatToFused4BitRowwiseQuantized", F32, 4, True),
              ("HalfToFused4BitRowwiseQuantized", F16, 4, True),
              ("FloatToFused2BitRowwiseQuantized", F32, 2, True),
              ("HalfToFused2BitRowwiseQuantized", F16, 2, True)]
DEQUANTIZERS = [("Fused8BitRowwiseQuantizedToFloat", 8, False, F32),
                ("Fused8BitRowwiseQuantizedToHalfFloat", 8, False, F16),
                ("Fused8BitRowwiseQuantizedHalfScaleBiasToFloat", 8, True, F32),
                ("Fused8BitRowwiseQuantizedHalfScaleBiasToHalfFloat", 8, True, F32),   # float32, as in Caffe2
                ("Fused4BitRowwiseQuantizedToFloat", 4, True, F32),
                ("Fused4BitRowwiseQuantizedToHalf", 4, True, F16),
                ("Fused2BitRowwiseQuantizedToFloat", 2, True, F32),
                ("Fused2BitRowwiseQuantizedToHalf", 2, True, F16)]
ROUND_TRIP = {8: ("Fused8BitRowwiseQuantizedToFloat", "Fused8BitRowwiseQuantizedHalfScaleBiasToFloat"),
              4: "Fused4BitRowwiseQuantizedToFloat", 2: "Fused2BitRowwiseQuantizedToFloat"}


def data(*shape, dtype=F32):
    x = RNG.uniform(-3, 5, shape).astype(dtype)
    if x.ndim >= 2 and x.shape[-2] > 1:
        x[..., 1, :] = dtype(1.25)         # a constant row (range 0)
    return x


SHAPES = [(5, 8), (2, 3, 4), (4,), (0, 8), (3, 12)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op_type, dtype, bits, half_sb", QUANTIZERS, ids=[q[0] for q in QUANTIZERS])
def test_quantizers_against_reference(op_type, dtype, bits, half_sb, shape, device):
    x = data(*shape, dtype=dtype)
    check(op_type, [x], {}, [quantize(x.astype(F32), bits, half_sb)], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, bits, half_sb, out", DEQUANTIZERS, ids=[d[0] for d in DEQUANTIZERS])
def test_dequantizers_against_reference(op_type, bits, half_sb, out, device):
    q = RNG.integers(0, 256, (2, 3, 6 + (4 if half_sb else 8)), dtype=np.uint8)
    q[..., -4 if half_sb else -8:] = quantize(data(6, 8), bits, half_sb)[:, -4 if half_sb else -8:].reshape(
        2, 3, -1)                                               # sane scales and biases
    want = dequantize(q, bits, half_sb).astype(out)
    got = run_op(op_type, [q], device=device)
    assert got.dtype == out and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3 if out == F16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits, half_sb", [(8, False), (8, True), (4, True), (2, True)])
def test_round_trip_is_within_the_quantization_error(bits, half_sb, device):
    """Caffe2's bound (ErrorThresholdRow of its n-bit test): half a step plus the float16 rounding of the bias
    and scale, with a 10 % margin; for 8 bits with float32 scale, half a step."""
    x = data(40, 16)
    quant = next(q[0] for q in QUANTIZERS if q[1] == F32 and q[2] == bits and q[3] == half_sb)
    dequant = ROUND_TRIP[bits][half_sb] if bits == 8 else ROUND_TRIP[bits]
    q = run_op(quant, [x], device=device)
    back = run_op(dequant, [q], device=device)
    sb = scale_bias(q, half_sb)
    lo, hi = x.min(axis=1).astype(np.float64), x.max(axis=1).astype(np.float64)
    clip = np.maximum(np.abs(lo - sb[:, 1]), np.abs(sb[:, 0] * ((1 << bits) - 1) + sb[:, 1] - hi))
    bound = np.maximum(sb[:, 0] / 2, clip) * 1.1 + 1e-6
    err = np.abs(back.astype(np.float64) - x)
    assert (err <= bound[:, None]).all(), float((err - bound[:, None]).max())


def test_constant_rows_come_back_exactly():
    x = np.full((3, 4), -2.5, F32)
    for quant, dequant in [("FloatToFused8BitRowwiseQuantized", "Fused8BitRowwiseQuantizedToFloat"),
                           ("FloatToFused4BitRowwiseQuantized", "Fused4BitRowwiseQuantizedToFloat")]:
        np.testing.assert_array_equal(run_op(dequant, [run_op(quant, [x])]), x)


def test_the_layout_of_a_4bit_row():
    """Value k sits in byte k // 2 at bit 4 * (k % 2); the float16 scale then bias close the row."""
    q = run_op("FloatToFused4BitRowwiseQuantized", [np.array([[0, 15, 1, 2]], F32)])
    assert q.tolist() == [[0xF0, 0x21, 0x00, 0x3C, 0x00, 0x00]]   # codes 0,15,1,2; scale 1.0 (0x3C00); bias 0


@pytest.mark.parametrize("op_type", [q[0] for q in QUANTIZERS] + [d[0] for d in DEQUANTIZERS])
def test_caffe2_registers_no_gradient(op_type):
    assert REGISTRY.get(op_type).gradient == NO_GRADIENT


# ------------------------------------------------------------------------------------------ bad inputs
U8 = np.zeros((3, 5), np.uint8)
BAD = [
    ("FloatToFused8BitRowwiseQuantized", [data(2, 3).astype(np.float64)], DTypeError, "must be float32, got float64"),
    ("HalfFloatToFused8BitRowwiseQuantized", [data(2, 3)], DTypeError, "must be float16, got float32"),
    ("FloatToFused4BitRowwiseQuantized", [data(2, 3)], ShapeError, r"3 values per row; .* multiple of 2"),
    ("FloatToFused2BitRowwiseQuantized", [data(2, 6)], ShapeError, "multiple of 4"),
    ("FloatToFused8BitRowwiseQuantized", [np.zeros((2, 0), F32)], ShapeError, "rows of no values"),
    ("FloatToFused8BitRowwiseQuantized", [np.float32(1)], ShapeError, "at least 1-D"),
    ("Fused8BitRowwiseQuantizedToFloat", [U8], ShapeError,
     r"\(3, 5\) has 5 bytes per row, .* float32 scale and bias \(8 bytes\), so it needs at least 8"),
    ("Fused4BitRowwiseQuantizedToFloat", [U8[:, :3]], ShapeError, "float16 scale and bias \\(4 bytes\\)"),
    ("Fused8BitRowwiseQuantizedToFloat", [np.zeros((3, 9), np.int8)], DTypeError, "must be a uint8 tensor"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, error, message, device):
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, device=device)


@pytest.mark.parametrize("op_type,inputs,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, error, message):
    with pytest.raises(error, match=message):
        infer_alone(op_type, inputs)


# ------------------------------------------------------------------------------------------ test the tester
X58 = data(5, 8)
REAL_4BIT = REGISTRY.get("FloatToFused4BitRowwiseQuantized").kernel   # the kernel before a test breaks it


@pytest.mark.parametrize("op_type, inputs, expected, wrong", [
    ("FloatToFused8BitRowwiseQuantized", [X58], quantize(X58, 8, False),            # floor instead of rounding
     lambda xp, x: xp.concatenate([xp.floor((x - x.min(1, keepdims=True)) * 255 / (x.max(1, keepdims=True)
                                   - x.min(1, keepdims=True) + 1e-8)).astype(np.uint8),
                                   quantize(X58, 8, False)[:, 8:]], axis=1)),
    ("FloatToFused4BitRowwiseQuantized", [X58], quantize(X58, 4, True),            # nibbles swapped
     lambda xp, x, real=REAL_4BIT: (
         lambda q: xp.concatenate([(q[:, :4] >> 4) | (q[:, :4] << 4), q[:, 4:]], axis=1))(real(xp, x))),
    ("Fused8BitRowwiseQuantizedToFloat", [quantize(X58, 8, False)],                # forgets the bias
     dequantize(quantize(X58, 8, False), 8, False),
     lambda xp, q: q[:, :8].astype(np.float32) * q[:, 8:12].copy().view(np.float32)),
])
def test_reference_detects_broken_kernel(op_type, inputs, expected, wrong, broken):
    check(op_type, inputs, {}, [expected], "cpu", 1e-6)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, {}, [expected], "cpu", 1e-6)
