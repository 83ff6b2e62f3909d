"""The older 8-bit row-wise ops with a separate scale_bias tensor (stepnet/ops/rowwise8.py) against loop
references on every device: quantizing row by row (Eigen's round half away from zero, the flat-row case),
dequantizing, and the four embedding bags; the round trip within half a step; bad inputs (also found
statically); the no-gradient kind; broken kernels caught."""
import math

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops.registry import NO_GRADIENT
from stepnet.testing import DEVICES, infer_alone, run_op

RNG = np.random.default_rng(8)
F32 = np.float32


def ref_quantize(x):
    """(codes, scale_bias) of x read as x.shape[0] rows, value by value in float32."""
    rows = np.asarray(x, F32).reshape(x.shape[0], -1)
    codes, sb = np.zeros(rows.shape, np.uint8), np.zeros((rows.shape[0], 2), F32)
    for i, row in enumerate(rows):
        lo, hi = F32(min(row)), F32(max(row))
        if hi - lo < 1e-10:
            sb[i] = (1.0, lo)
            continue
        scale = F32((hi - lo) / F32(255))
        inverse = F32(F32(1) / scale)
        sb[i] = (scale, lo)
        for j, v in enumerate(row):
            t = float(F32(F32(v - lo) * inverse))
            codes[i, j] = math.floor(t + 0.5)          # t >= 0: half away from zero, exact in float64
    return codes.reshape(x.shape), sb


def ref_dequantize(codes, sb):
    rows = codes.reshape(codes.shape[0], -1)
    out = [[float(F32(F32(c) * sb[i, 0]) + sb[i, 1]) for c in row] for i, row in enumerate(rows)]
    return np.array(out, F32).reshape(codes.shape)


def ref_bags(codes, sb, indices, lengths, mean=False, weights=None):
    rows = ref_dequantize(codes, sb).reshape(codes.shape[0], -1).astype(np.float64)
    out, k = [], 0
    for n in lengths:
        acc = np.zeros(rows.shape[1])
        for _ in range(n):
            acc += (1.0 if weights is None else float(weights[k])) * rows[indices[k]]
            k += 1
        out.append(acc / n if mean and n else acc)
    return np.array(out, F32).reshape((len(lengths),) + codes.shape[1:])


X = RNG.uniform(-4, 4, (6, 2, 3)).astype(F32)
X[2] = 0.75                                               # a flat row: scale 1, codes 0
HALVES = np.array([[0.0, 127.5, 255.0, 0.5, 1.5]], F32)   # codes exactly halfway: round away from zero
CODES, SB = ref_quantize(X)
IDX = np.array([5, 0, 2, 2, 1, 3, 4], np.int64)
LEN = np.array([3, 0, 2, 2], np.int32)
W = RNG.uniform(-1, 2, 7).astype(F32)

CASES = [
    ("quantize", "FloatToRowwiseQuantized8Bits", [X], list(ref_quantize(X))),
    ("quantize_halfway", "FloatToRowwiseQuantized8Bits", [HALVES], list(ref_quantize(HALVES))),
    ("quantize_1d", "FloatToRowwiseQuantized8Bits", [X[:, 0, 0].copy()], list(ref_quantize(X[:, 0, 0]))),
    ("dequantize", "Rowwise8BitQuantizedToFloat", [CODES, SB], [ref_dequantize(CODES, SB)]),
    ("sum", "SparseLengthsSum8BitsRowwise", [CODES, IDX, LEN, SB], [ref_bags(CODES, SB, IDX, LEN)]),
    ("weighted_sum", "SparseLengthsWeightedSum8BitsRowwise", [CODES, W, IDX, LEN, SB],
     [ref_bags(CODES, SB, IDX, LEN, weights=W)]),
    ("mean", "SparseLengthsMean8BitsRowwise", [CODES, IDX.astype(np.int32), LEN, SB],
     [ref_bags(CODES, SB, IDX, LEN, mean=True)]),
    ("weighted_mean", "SparseLengthsWeightedMean8BitsRowwise", [CODES, W, IDX, LEN, SB],
     [ref_bags(CODES, SB, IDX, LEN, mean=True, weights=W)]),
    ("no_indices", "SparseLengthsSum8BitsRowwise", [CODES, IDX[:0], np.zeros(2, np.int32), SB],
     [np.zeros((2, 2, 3), F32)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, expected = case
    check(op_type, inputs, {}, expected, device, 1e-5)


def test_halfway_codes_round_away_from_zero():
    codes, _ = run_op("FloatToRowwiseQuantized8Bits", [HALVES], 2)
    assert codes.tolist() == [[0, 128, 255, 1, 2]]


@pytest.mark.parametrize("device", DEVICES)
def test_round_trip_is_within_half_a_step(device):
    x = RNG.uniform(-3, 7, (20, 9)).astype(F32)
    codes, sb = run_op("FloatToRowwiseQuantized8Bits", [x], 2, device=device)
    back = run_op("Rowwise8BitQuantizedToFloat", [codes, sb], device=device)
    assert (np.abs(back - x) <= sb[:, :1] / 2 * 1.001 + 1e-6).all()


@pytest.mark.parametrize("op_type", ["FloatToRowwiseQuantized8Bits", "Rowwise8BitQuantizedToFloat",
                                     "SparseLengthsSum8BitsRowwise", "SparseLengthsWeightedSum8BitsRowwise",
                                     "SparseLengthsMean8BitsRowwise", "SparseLengthsWeightedMean8BitsRowwise"])
def test_caffe2_registers_no_gradient(op_type):
    assert REGISTRY.get(op_type).gradient == NO_GRADIENT


# ------------------------------------------------------------------------------------------ bad inputs
BAD = [
    ("FloatToRowwiseQuantized8Bits", [X.astype(np.float64)], 2, DTypeError, "must be float32"),
    ("Rowwise8BitQuantizedToFloat", [CODES, SB[:5]], 1, ShapeError, r"i.e. \(6, 2\), got \(5, 2\)"),
    ("Rowwise8BitQuantizedToFloat", [CODES.astype(np.int32), SB], 1, DTypeError, "DATA must be uint8"),
    ("SparseLengthsSum8BitsRowwise", [CODES, np.array([0, 6]), np.array([2], np.int32), SB], 1, ShapeError,
     r"INDICES\[1\] = 6 is out of bounds; valid indices: 0..5 for DATA of shape \(6, 2, 3\)"),
    ("SparseLengthsSum8BitsRowwise", [CODES, IDX, np.array([3, 3], np.int32), SB], 1, ShapeError,
     "sum to 6 but there are 7 INDICES"),
    ("SparseLengthsSum8BitsRowwise", [CODES, IDX, LEN, SB.T.copy()], 1, ShapeError, "scale_bias must be a matrix"),
    ("SparseLengthsSum8BitsRowwise", [CODES, IDX, LEN, SB.astype(np.float64)], 1, DTypeError,
     "scale_bias must be float32"),
    ("SparseLengthsWeightedSum8BitsRowwise", [CODES, W[:2], IDX, LEN, SB], 1, ShapeError, "WEIGHTS has 2 entries"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,n_out,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, n_out, error, message, device):
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, n_out, device=device)


@pytest.mark.parametrize("op_type,inputs,n_out,error,message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, n_out, error, message):
    with pytest.raises(error, match=message):
        infer_alone(op_type, inputs, n_out)


# ------------------------------------------------------------------------------------------ test the tester
REAL = {t: REGISTRY.get(t).kernel for t in ("FloatToRowwiseQuantized8Bits", "SparseLengthsWeightedSum8BitsRowwise")}


@pytest.mark.parametrize("case_id, wrong", [
    ("quantize_halfway", lambda xp, x, real=REAL["FloatToRowwiseQuantized8Bits"]: (
        xp.rint((x - x.min()) / real(xp, x)[1][:, :1]).astype(np.uint8), real(xp, x)[1])),   # rounds to even
    ("weighted_mean", lambda xp, d, w, i, n, sb, real=REAL["SparseLengthsWeightedSum8BitsRowwise"]:
        real(xp, d, w, i, n, sb)),                                                          # forgets to divide
    ("dequantize", lambda xp, d, sb: d.astype(np.float32) * sb[:, :1, None]),               # forgets the bias
])
def test_reference_detects_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, expected = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, {}, expected, "cpu", 1e-5)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, {}, expected, "cpu", 1e-5)
