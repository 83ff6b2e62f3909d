"""Lengths and segment operators (stepnet/ops/segments.py) against Python-loop references, on every device;
bad inputs (also found statically), the no-gradient kinds declared with the ops, and broken kernels caught."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.ops.registry import SHOULD_NOT_DO_GRADIENT
from stepnet.testing import DEVICES, infer_alone, run_op

RNG = np.random.default_rng(11)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ints(values, dtype=np.int32):
    return np.array(values, dtype=dtype)


# --------------------------------------------------------------------------------------------- references
def segments(lengths):
    start = 0
    for length in lengths:
        yield range(start, start + length)
        start += length

def ref_segment(rows, lengths, kind, weights=None, out_dtype=np.float32):
    """Per-segment sum/mean/max of rows (a list of blocks), in float64, empty segments 0."""
    block = np.asarray(rows[0]).shape if len(rows) else ()
    out = []
    for seg in segments(lengths):
        acc = np.zeros(block)
        for n, k in enumerate(seg):
            w = 1.0 if weights is None else float(weights[k])
            v = w * np.asarray(rows[k], np.float64)
            acc = v if (kind == "max" and n == 0) else (np.maximum(acc, v) if kind == "max" else acc + v)
        if kind == "mean" and len(seg):
            acc = acc / len(seg)
        out.append(acc)
    return np.array(out, dtype=out_dtype).reshape(len(lengths), *block)

def ref_sparse(data, indices, lengths, kind, weights=None):
    out_dtype = np.float32 if data.dtype == np.float16 else data.dtype
    return ref_segment([data[i] for i in indices], lengths, kind, weights, out_dtype)

def ref_segment_ids(lengths):
    return ints([i for i, length in enumerate(lengths) for _ in range(length)])

def ref_ranges(lengths):
    out, offset = [], 0
    for length in lengths:
        out.append([offset, length])
        offset += length
    return ints(out).reshape(-1, 2)

def ref_ids_to_lengths(ids, count):
    out = [0] * count
    for i in ids:
        out[i] += 1
    return ints(out)

def ref_sparse_to_dense(indices, values, rows):
    out = np.zeros((rows,) + values.shape[1:], values.dtype)
    for k, i in enumerate(indices):
        out[i] += values[k]
    return out

def ref_lengths_tile(data, lengths):
    return np.array([data[i] for i, length in enumerate(lengths) for _ in range(length)],
                    data.dtype).reshape((sum(lengths),) + data.shape[1:])


# --------------------------------------------------------------------------------------------- the table
D43 = rand(4, 3)
D234 = rand(2, 3, 4)
I4 = np.arange(12, dtype=np.int64).reshape(4, 3)
EMB = rand(6, 2, 2)
IDX = ints([5, 0, 3, 3, 1, 2, 4])
LEN = ints([2, 0, 4, 1])
W = rand(7)
DATA8 = rand(8, 3)
LEN8 = ints([3, 0, 1, 4])
STD_I, STD_V = ints([2, 0, 2, 5]), rand(4, 3)

CASES = [
    ("lengths_to_segment_ids", "LengthsToSegmentIds", [ints([1, 3, 0, 2])], {},
     [ref_segment_ids([1, 3, 0, 2])]),
    ("lengths_to_segment_ids_empty", "LengthsToSegmentIds", [ints([])], {}, [ints([])]),
    ("lengths_to_ranges", "LengthsToRanges", [ints([1, 3, 0, 2])], {}, [ref_ranges([1, 3, 0, 2])]),
    ("lengths_to_ranges_empty", "LengthsToRanges", [ints([])], {}, [ref_ranges([])]),
    ("segment_ids_to_lengths", "SegmentIdsToLengths", [ints([0, 1, 1, 1, 3, 3])], {},
     [ref_ids_to_lengths([0, 1, 1, 1, 3, 3], 4)]),
    ("segment_ids_to_lengths_data", "SegmentIdsToLengths", [ints([1, 1, 2], np.int64), rand(5, 2)], {},
     [ref_ids_to_lengths([1, 1, 2], 5)]),
    ("segment_ids_column", "SegmentIdsToLengths", [ints([[0], [0], [2]])], {},
     [ref_ids_to_lengths([0, 0, 2], 3)]),
    ("lengths_sum", "LengthsSum", [DATA8, LEN8], {}, [ref_segment(DATA8, LEN8, "sum")]),
    ("lengths_mean", "LengthsMean", [DATA8, LEN8], {}, [ref_segment(DATA8, LEN8, "mean")]),
    ("lengths_max", "LengthsMax", [DATA8, LEN8], {}, [ref_segment(DATA8, LEN8, "max")]),
    ("lengths_sum_1d", "LengthsSum", [DATA8[:, 0].copy(), LEN8], {}, [ref_segment(DATA8[:, 0], LEN8, "sum")]),
    ("lengths_sum_3d_double", "LengthsMean", [D234.astype(np.float64), ints([0, 2])], {},
     [ref_segment(D234, [0, 2], "mean", out_dtype=np.float64)]),
    ("lengths_all_empty", "LengthsMax", [np.zeros((0, 3), np.float32), ints([0, 0])], {},
     [np.zeros((2, 3), np.float32)]),
    ("sparse_lengths_sum", "SparseLengthsSum", [EMB, IDX, LEN], {}, [ref_sparse(EMB, IDX, LEN, "sum")]),
    ("sparse_lengths_sum_i64", "SparseLengthsSum", [EMB, IDX.astype(np.int64), LEN], {},
     [ref_sparse(EMB, IDX, LEN, "sum")]),
    ("sparse_lengths_sum_fp16", "SparseLengthsSum", [EMB.astype(np.float16), IDX, LEN], {},
     [ref_sparse(EMB.astype(np.float16), IDX, LEN, "sum")]),
    ("sparse_lengths_mean", "SparseLengthsMean", [EMB, IDX, LEN], {}, [ref_sparse(EMB, IDX, LEN, "mean")]),
    ("sparse_lengths_weighted_sum", "SparseLengthsWeightedSum", [EMB, W, IDX, LEN], {},
     [ref_sparse(EMB, IDX, LEN, "sum", W)]),
    ("sparse_lengths_sum_no_indices", "SparseLengthsSum", [EMB, ints([]), ints([0, 0])], {},
     [np.zeros((2, 2, 2), np.float32)]),
    ("sparse_to_dense", "SparseToDense", [STD_I, STD_V], {}, [ref_sparse_to_dense(STD_I, STD_V, 6)]),
    ("sparse_to_dense_int_first_dim", "SparseToDense", [ints([1, 1, 0], np.int64), ints([4, 5, 6], np.int64)],
     {"output_first_dim": 4}, [ref_sparse_to_dense([1, 1, 0], ints([4, 5, 6], np.int64), 4)]),
    ("sparse_to_dense_infer", "SparseToDense", [ints([0, 0]), ints([1.5, 2.0], np.float32), rand(3, 9)], {},
     [ref_sparse_to_dense([0, 0], ints([1.5, 2.0], np.float32), 3)]),
    ("sparse_to_dense_empty", "SparseToDense", [ints([]), np.zeros((0, 2), np.float32)], {},
     [np.zeros((0, 2), np.float32)]),
    ("lengths_tile", "LengthsTile", [D43, ints([0, 1, 3, 2])], {}, [ref_lengths_tile(D43, [0, 1, 3, 2])]),
    ("lengths_tile_1d", "LengthsTile", [I4[:, 0].copy(), ints([2, 0, 0, 1])], {},
     [ref_lengths_tile(I4[:, 0], [2, 0, 0, 1])]),
]


TOL = 1e-5   # on float outputs; the others are compared exactly


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, expected = case
    check(op_type, inputs, args, expected, device, TOL)


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("LengthsToSegmentIds", [ints([1, -2])], {}, ShapeError, r"lengths\[1\] = -2"),
    ("LengthsToRanges", [ints([[1]])], {}, ShapeError, "1-D vector"),
    ("SegmentIdsToLengths", [ints([0, 2, 1])], {}, ShapeError, r"sorted .* segment_ids\[2\] = 1 follows 2"),
    ("SegmentIdsToLengths", [ints([0, 4]), rand(3)], {}, ShapeError, "go up to 4 .* only 3 rows"),
    ("LengthsSum", [DATA8, ints([3, 3])], {}, ShapeError, "LENGTHS sum to 6 but DATA has 8 rows"),
    ("LengthsMean", [I4, ints([4])], {}, DTypeError, "DATA must be a float tensor"),
    ("SparseLengthsSum", [EMB, ints([0, 6]), ints([2])], {}, ShapeError, r"INDICES\[1\] = 6 .* 0..5"),
    ("SparseLengthsSum", [EMB, IDX, ints([2, 2])], {}, ShapeError, "sum to 4 but there are 7 INDICES"),
    ("SparseLengthsWeightedSum", [EMB, W[:3], IDX, LEN], {}, ShapeError, "WEIGHTS has 3 entries"),
    ("SparseToDense", [ints([0, 3]), rand(2)], {"output_first_dim": 3}, ShapeError,
     r"INDICES\[1\] = 3 .* 0..2"),
    ("SparseToDense", [ints([0, 1]), rand(3)], {}, ShapeError, "one row per index"),
    ("SparseToDense", [ints([0]), rand(1), rand(2)], {"output_first_dim": 2}, ArgumentError, "not both"),
    ("LengthsTile", [D43, ints([1, 1])], {}, ShapeError, "LENGTHS has 2 entries but DATA has shape"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,args,error,message", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, message, device):
    outputs = 2 if op_type == "GatherRanges" else 1
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, outputs, device=device, **args)


@pytest.mark.parametrize("op_type,inputs,args,error,message", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, args, error, message):
    """The shape functions raise the kernels' errors (index values included: small int inputs carry them)."""
    outputs = 2 if op_type == "GatherRanges" else 1
    with pytest.raises(error, match=message):
        infer_alone(op_type, inputs, outputs, **args)


# --------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("kind, op_type", [
    (SHOULD_NOT_DO_GRADIENT, "LengthsToSegmentIds"), (SHOULD_NOT_DO_GRADIENT, "SegmentIdsToLengths"),
    (None, "LengthsToRanges")])
def test_no_gradient_kinds_are_caffe2s(kind, op_type):
    assert REGISTRY.get(op_type).gradient == kind


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id,wrong", [
    ("sparse_lengths_weighted_sum",   # forgets the weights
     lambda xp, data, w, idx, lens, **a: REGISTRY.get("SparseLengthsSum").kernel(xp, data, idx, lens)),
    ("lengths_mean", lambda xp, data, lens: REGISTRY.get("LengthsSum").kernel(xp, data, lens)),
    ("segment_ids_to_lengths", lambda xp, ids, *d: xp.asarray(np.array([1, 3, 2], np.int32))),
])
def test_reference_detects_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, expected = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, expected, "cpu", TOL)   # the real kernel passes ...
    broken(op_type, wrong)
    with pytest.raises(AssertionError):                  # ... the wrong one does not
        check(op_type, inputs, args, expected, "cpu", TOL)


# --------------------------------------------------------------------------------------------- positional
def test_sparse_lengths_positional_weighted_sum():
    """Weight j of every run goes to its j-th index: against a loop, and the failure modes."""
    rng = np.random.default_rng(3)
    data = rng.standard_normal((5, 2)).astype(np.float32)
    weights = rng.standard_normal(4).astype(np.float32)
    indices = np.array([4, 0, 0, 3, 1, 2], np.int64)
    lengths = np.array([3, 0, 2, 1], np.int32)
    want = np.zeros((4, 2))
    at = 0
    for i, n in enumerate(lengths.tolist()):
        for j in range(n):
            want[i] += float(weights[j]) * data[indices[at + j]].astype(np.float64)
        at += n
    for device in DEVICES:
        check("SparseLengthsPositionalWeightedSum", [data, weights, indices, lengths], {}, [want.astype(np.float32)],
              device, 1e-6)
    with pytest.raises(ShapeError, match="WEIGHT has 2 weights but a segment has 3 positions"):
        run_op("SparseLengthsPositionalWeightedSum", [data, weights[:2], indices, lengths])
    with pytest.raises(ShapeError, match=r"INDICES\[0\] = 4 is out of bounds"):
        run_op("SparseLengthsPositionalWeightedSum", [data[:4], weights, indices, lengths])
    assert REGISTRY.get("SparseLengthsPositionalWeightedSum").gradient is None     # none registered in Caffe2
