"""Embedding bags over fused quantized tables (stepnet/ops/fused_sls.py) against loop references on every
device: the table dequantized row by row (fused_reference.py), then summed segment by segment in float64; and,
as Caffe2's test does, against the float embedding bag of the table the rows came from, within the
quantization error. Bad inputs (out-of-range indices, lengths that do not sum to the index count, rows too short
for the format), also found statically; the no-gradient kind; broken kernels caught."""
import numpy as np
import pytest
from fused_reference import dequantize, quantize, scale_bias
from reference_check import check

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops.registry import NO_GRADIENT
from stepnet.testing import DEVICES, infer_alone, run_op

RNG = np.random.default_rng(31)
F32 = np.float32
FORMATS = {8: False, 4: True, 2: True}   # bits -> float16 scale and bias


def table(rows, width, bits):
    return quantize(RNG.uniform(-2, 3, (rows, width)).astype(F32), bits, FORMATS[bits])


def ref_bags(rows, indices, lengths, kind="sum", weights=None):
    """Per segment: sum (or mean of a non-empty one) of w_k * rows[indices[k]], by loops in float64."""
    out, k = [], 0
    for n in lengths:
        acc = np.zeros(rows.shape[1])
        for _ in range(n):
            w = 1.0 if weights is None else float(weights[k])
            acc = acc + w * rows[indices[k]].astype(np.float64)
            k += 1
        out.append(acc / n if kind == "mean" and n else acc)
    return np.array(out, F32).reshape(len(lengths), rows.shape[1])


def op_name(kind, bits, weighted):
    return f"SparseLengths{'WeightedSum' if weighted else kind.capitalize()}Fused{bits}BitRowwise"


IDX = np.array([4, 0, 2, 2, 5, 1, 3], np.int32)
LEN = np.array([2, 0, 4, 1], np.int32)
W = RNG.uniform(-1, 2, 7).astype(F32)
CASES = []
for _bits in (8, 4, 2):
    _t = table(6, 8, _bits)
    _rows = dequantize(_t, _bits, FORMATS[_bits])
    CASES += [(f"sum{_bits}", op_name("sum", _bits, False), [_t, IDX, LEN], [ref_bags(_rows, IDX, LEN)]),
              (f"sum{_bits}_i64", op_name("sum", _bits, False), [_t, IDX.astype(np.int64), LEN.astype(np.int64)],
               [ref_bags(_rows, IDX, LEN)]),
              (f"weighted{_bits}", op_name("sum", _bits, True), [_t, W, IDX, LEN],
               [ref_bags(_rows, IDX, LEN, weights=W)]),
              (f"mean{_bits}", op_name("mean", _bits, False), [_t, IDX, LEN], [ref_bags(_rows, IDX, LEN, "mean")]),
              (f"no_indices{_bits}", op_name("sum", _bits, False), [_t, IDX[:0], np.zeros(3, np.int32)],
               [np.zeros((3, _rows.shape[1]), F32)])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, expected = case
    check(op_type, inputs, {}, expected, device, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_close_to_the_float_bag_of_the_unquantized_table(bits, weighted, device):
    """The fused bag minus the float bag of the original rows is at most sum_k |w_k| * (the row's error
    bound, Caffe2's ErrorThresholdRow: half a step, or the clipping at the row's float16-rounded ends)."""
    x = RNG.uniform(-2, 3, (10, 16)).astype(F32)
    q = quantize(x, bits, FORMATS[bits])
    idx = RNG.integers(0, 10, 12).astype(np.int64)
    lens = np.array([3, 0, 5, 4], np.int32)
    w = RNG.uniform(-1, 1, 12).astype(F32) if weighted else np.ones(12, F32)
    got = run_op(op_name("sum", bits, weighted), [q, w, idx, lens] if weighted else [q, idx, lens], device=device)
    sb = scale_bias(q, FORMATS[bits])
    top = sb[:, 0] * ((1 << bits) - 1) + sb[:, 1]
    row_bound = np.maximum.reduce([sb[:, 0] / 2, np.abs(x.min(axis=1) - sb[:, 1]), np.abs(top - x.max(axis=1))])
    row_bound = row_bound + 1e-5
    err_bound, want = ref_bags(row_bound[:, None], idx, lens, weights=np.abs(w)), ref_bags(x, idx, lens, weights=w)
    assert (np.abs(got - want) <= err_bound * 1.1).all()


@pytest.mark.parametrize("op_type", [op_name(k, b, w) for b in (8, 4, 2) for k, w in
                                     (("sum", False), ("sum", True), ("mean", False))])
def test_caffe2_registers_no_gradient(op_type):
    assert REGISTRY.get(op_type).gradient == NO_GRADIENT


# ------------------------------------------------------------------------------------------ bad inputs
T8, T4 = table(6, 8, 8), table(6, 8, 4)
BAD = [
    ("SparseLengthsSumFused8BitRowwise", [T8, np.array([0, 6], np.int64), np.array([2], np.int32)], ShapeError,
     r"INDICES\[1\] = 6 is out of bounds; valid indices: 0..5 for DATA of shape \(6, 16\)"),
    ("SparseLengthsSumFused4BitRowwise", [T4, np.array([-1, 0], np.int32), np.array([2], np.int32)], ShapeError,
     r"INDICES\[0\] = -1 is out of bounds"),
    ("SparseLengthsMeanFused2BitRowwise", [table(6, 8, 2), IDX, np.array([2, 2], np.int32)], ShapeError,
     r"LENGTHS \(2,\) sum to 4 but there are 7 INDICES"),
    ("SparseLengthsSumFused8BitRowwise", [T8[:, 8:], IDX, LEN], ShapeError,
     r"DATA \(6, 8\) has 8 bytes per row, .* float32 scale and bias \(8 bytes\), so it needs more than 8"),
    ("SparseLengthsSumFused4BitRowwise", [T4[:, :4], IDX, LEN], ShapeError, "needs more than 4"),
    ("SparseLengthsSumFused8BitRowwise", [dequantize(T8, 8, False), IDX, LEN], DTypeError, "must be a uint8 tensor"),
    ("SparseLengthsSumFused8BitRowwise", [T8.reshape(-1), IDX, LEN], ShapeError, "must be a matrix of fused rows"),
    ("SparseLengthsWeightedSumFused8BitRowwise", [T8, W[:3], IDX, LEN], ShapeError, "WEIGHTS has 3 entries"),
    ("SparseLengthsWeightedSumFused4BitRowwise", [T4, W.astype(np.float64), IDX, LEN], DTypeError,
     "WEIGHTS must be float32"),
    ("SparseLengthsSumFused8BitRowwise", [T8, IDX.astype(F32), LEN], DTypeError, "INDICES must be int32 or int64"),
    ("SparseLengthsSumFused8BitRowwise", [T8, IDX.reshape(7, 1), LEN], ShapeError, "INDICES must be a 1-D vector"),
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
SUM4 = REGISTRY.get("SparseLengthsSumFused4BitRowwise").kernel   # the kernel before a test breaks it


def _case(case_id):
    return CASES[[c[0] for c in CASES].index(case_id)]


@pytest.mark.parametrize("case_id, wrong", [
    ("weighted8", lambda xp, data, w, idx, lens: REGISTRY.get("SparseLengthsSumFused8BitRowwise").kernel(
        xp, data, idx, lens)),                                                    # forgets the weights
    ("mean4", lambda xp, data, idx, lens, real=SUM4: real(
        xp, data, idx, lens)),                                                    # sums instead of averaging
    ("sum2", lambda xp, data, idx, lens, real=SUM4: real(
        xp, data, idx, lens)[:, ::2]),                                            # reads 2-bit rows as 4-bit
])
def test_reference_detects_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, expected = _case(case_id)
    check(op_type, inputs, {}, expected, "cpu", 1e-5)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, {}, expected, "cpu", 1e-5)
