"""Indexing operators (gathers, one-hot encodings, arg-max/min, GatherRanges) against Python-loop references,
on every device. The lengths and segment operators are tested in test_segments.py."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.testing import DEVICES, infer_alone, run_op

RNG = np.random.default_rng(11)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ints(values, dtype=np.int32):
    return np.array(values, dtype=dtype)


# --------------------------------------------------------------------------------------------- references
def ref_gather(data, indices, axis=0):
    """out[pre, idx, post] = data[pre, indices[idx] (negatives from the end), post]."""
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    out = np.empty(shape, data.dtype)
    q = indices.ndim
    for idx in np.ndindex(*shape):
        k = int(indices[idx[axis:axis + q]])
        k = k + data.shape[axis] if k < 0 else k
        out[idx] = data[idx[:axis] + (k,) + idx[axis + q:]]
    return out


def ref_gather_match_outer(data, indices, axis):
    shape = data.shape[:axis] + indices.shape[axis:] + data.shape[axis + 1:]
    out = np.empty(shape, data.dtype)
    q = indices.ndim - axis
    for idx in np.ndindex(*shape):
        k = int(indices[idx[:axis] + idx[axis:axis + q]])
        out[idx] = data[idx[:axis] + (k,) + idx[axis + q:]]
    return out


def ref_one_hot(indices, size):
    out = np.zeros((len(indices), size), np.float32)
    for i, k in enumerate(indices):
        out[i, k] = 1.0
    return out


def ref_batch_one_hot(data, lengths, values):
    n = data.shape[0]
    cols = data.reshape(n, -1)
    out = np.zeros((n, sum(lengths)), data.dtype)
    for i in range(n):
        p = 0
        for j, length in enumerate(lengths):
            for _ in range(length):
                out[i, p] = 1 if cols[i, j] == values[p] else 0
                p += 1
    return out


def ref_arg(x, axis, keepdims, better):
    """Index of the first extreme along axis, found by scanning."""
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], np.int64)
    for idx in np.ndindex(*out.shape):
        row = moved[idx]
        best = 0
        for k in range(1, len(row)):
            if better(row[k], row[best]):
                best = k
        out[idx] = best
    return np.expand_dims(out, axis) if keepdims else out


def ref_gather_ranges(data, ranges):
    out, lengths = [], []
    for example in ranges:
        total = 0
        for start, length in example:
            out.extend(data[start:start + length].tolist())
            total += length
        lengths.append(total)
    return [np.array(out, data.dtype), ints(lengths)]


# --------------------------------------------------------------------------------------------- the table
D43 = rand(4, 3)
D234 = rand(2, 3, 4)
I4 = np.arange(12, dtype=np.int64).reshape(4, 3)
W = rand(7)
TIE = ints([[1, 3, 3, 0], [2, 2, 1, 2]], np.float32)

CASES = [
    ("gather_2d_idx", "Gather", [D43, ints([[3, 1], [0, 3]])], {}, [ref_gather(D43, ints([[3, 1], [0, 3]]))]),
    ("gather_int64_data", "Gather", [I4, ints([2, 2, 0], np.int64)], {}, [ref_gather(I4, ints([2, 2, 0]))]),
    ("gather_wrap", "Gather", [D43, ints([-1, 0, -4])], {}, [ref_gather(D43, ints([-1, 0, -4]))]),
    ("gather_axis1", "Gather", [D234, ints([2, 0])], {"axis": 1}, [ref_gather(D234, ints([2, 0]), 1)]),
    ("gather_axis_neg", "Gather", [D234, ints([[3], [1]])], {"axis": -1},
     [ref_gather(D234, ints([[3], [1]]), 2)]),
    ("gather_scalar_idx", "Gather", [D43, np.int64(2)], {}, [ref_gather(D43, np.array(2))]),
    ("gather_empty_dim", "Gather", [np.zeros((0, 3), np.float32), ints([1])], {},
     [np.zeros((0, 3), np.float32)]),
    ("gather_match_outer", "Gather", [D234, ints([[0, 2, 2], [1, 0, 1]])], {"axis": 1, "match_outer": 1},
     [ref_gather_match_outer(D234, ints([[0, 2, 2], [1, 0, 1]]), 1)]),
    ("batch_gather", "BatchGather", [D234, ints([2, 0, 2])], {}, [ref_gather(D234, ints([2, 0, 2]), 1)]),
    ("batch_gather_2d", "BatchGather", [D43, ints([[1], [0]], np.int64)], {},
     [ref_gather(D43, ints([[1], [0]]), 1)]),
    ("one_hot", "OneHot", [ints([2, 0, 4, 2], np.int64), ints([5], np.int64)], {},
     [ref_one_hot([2, 0, 4, 2], 5)]),
    ("one_hot_scalar_size", "OneHot", [ints([1], np.int64), np.int64(3)], {}, [ref_one_hot([1], 3)]),
    ("one_hot_empty", "OneHot", [ints([], np.int64), ints([3], np.int64)], {},
     [np.zeros((0, 3), np.float32)]),
    ("batch_one_hot_doc", "BatchOneHot",
     [ints([[2, 3], [4, 1], [2, 5]]), ints([2, 3]), ints([2, 4, 1, 3, 5])], {},
     [ints([[1, 0, 0, 1, 0], [0, 1, 1, 0, 0], [1, 0, 0, 0, 1]])]),
    ("batch_one_hot_int64", "BatchOneHot",
     [ints([[7, 1, 1]], np.int64), ints([1, 0, 2]), ints([7, 1, 2], np.int64)],
     {}, [ref_batch_one_hot(ints([[7, 1, 1]], np.int64), [1, 0, 2], [7, 1, 2])]),
    ("argmax_last", "ArgMax", [D234], {}, [ref_arg(D234, 2, True, lambda a, b: a > b)]),
    ("argmax_axis0_flat", "ArgMax", [D234], {"axis": 0, "keepdims": False},
     [ref_arg(D234, 0, False, lambda a, b: a > b)]),
    ("argmax_ties", "ArgMax", [TIE], {"axis": 1}, [ref_arg(TIE, 1, True, lambda a, b: a > b)]),
    ("argmin_ties", "ArgMin", [TIE], {"axis": 1, "keepdims": False},
     [ref_arg(TIE, 1, False, lambda a, b: a < b)]),
    ("argmin_int", "ArgMin", [I4[::-1].copy()], {"axis": 0},
     [ref_arg(I4[::-1], 0, True, lambda a, b: a < b)]),
    ("gather_ranges_doc", "GatherRanges",
     [ints([1, 2, 3, 4, 5, 6]), ints([[[0, 1], [2, 2]], [[4, 1], [5, 1]]])], {},
     [ints([1, 3, 4, 5, 6]), ints([3, 2])]),
    ("gather_ranges_float", "GatherRanges",
     [W, ints([[[6, 1], [0, 0]], [[1, 3], [4, 2]], [[0, 0], [0, 0]]], np.int64)],
     {}, ref_gather_ranges(W, [[[6, 1], [0, 0]], [[1, 3], [4, 2]], [[0, 0], [0, 0]]])),
]


TOL = 1e-5   # on float outputs; the others are compared exactly


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, expected = case
    check(op_type, inputs, args, expected, device, TOL)


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("Gather", [D43, ints([0, 4])], {}, ShapeError,
     r"INDICES\[1\] = 4 is out of bounds; valid indices: -4..3"),
    ("Gather", [D43, ints([-5])], {}, ShapeError,
     r"INDICES\[0\] = -5 is out of bounds; valid indices: -4..3"),
    ("Gather", [D234, ints([-1])], {"axis": 1}, ShapeError, r"INDICES\[0\] = -1 .* 0..2 along axis 1"),
    ("Gather", [D43, ints([0, 1], np.float32)], {}, DTypeError, "INDICES must be int32 or int64"),
    ("Gather", [D43, ints([0])], {"axis": 2}, ArgumentError, "axis=2 is out of range"),
    ("Gather", [D234, ints([[0], [1], [0]])], {"axis": 1, "match_outer": 1}, ShapeError, "match_outer"),
    ("BatchGather", [ints([1.0, 2.0], np.float32), ints([0])], {}, ShapeError, "at least 2-D"),
    ("BatchGather", [D43, ints([3])], {}, ShapeError, r"INDICES\[0\] = 3 .* 0..2"),
    ("OneHot", [ints([0, 3], np.int64), ints([3], np.int64)], {}, ShapeError, r"indices\[1\] = 3 .* 0..2"),
    ("OneHot", [ints([[0]], np.int64), ints([3], np.int64)], {}, ShapeError, "1-D vector"),
    ("OneHot", [ints([0], np.int64), ints([3, 4], np.int64)], {}, ShapeError,
     "index_size must hold one value"),
    ("BatchOneHot", [ints([[1, 2]]), ints([1]), ints([1])], {}, ShapeError,
     "lengths has 1 entries but data has 2"),
    ("BatchOneHot", [ints([[1, 2]]), ints([1, 1]), ints([1])], {}, ShapeError, "values has 1 entries"),
    ("BatchOneHot", [D43, ints([1, 1, 1]), ints([1, 1, 1])], {}, DTypeError, "data must be int32 or int64"),
    ("ArgMax", [D43], {"axis": 2}, ArgumentError, "axis=2 is out of range"),
    ("ArgMax", [np.array([True, False])], {}, DTypeError, "int32, int64, float"),
    ("GatherRanges", [W, ints([[[5, 3]]])], {}, ShapeError, r"RANGES\[0, 0\] = \(start 5, length 3\)"),
    ("GatherRanges", [W, ints([[0, 1]])], {}, ShapeError, r"\(N, M>=1, 2\)"),
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


# ------------------------------------------------------------------------------------------ test the tester
def _last_max(xp, x):
    """A broken ArgMax: the last maximum of each row instead of the first."""
    return (x.shape[1] - 1 - xp.argmax(x[:, ::-1], axis=1))[:, None].astype(np.int64)


@pytest.mark.parametrize("case_id,wrong", [
    ("gather_wrap", lambda xp, data, indices, **a: xp.take(data, xp.abs(indices) % 4, axis=0)),
    ("argmax_ties", lambda xp, x, axis, keepdims: _last_max(xp, x)),
])
def test_reference_detects_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, expected = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, expected, "cpu", TOL)   # the real kernel passes ...
    broken(op_type, wrong)
    with pytest.raises(AssertionError):                  # ... the wrong one does not
        check(op_type, inputs, args, expected, "cpu", TOL)
