"""MergeIdLists, IndexHash, NGramFromCategorical, FindDuplicateElements, BatchBucketOneHot and SegmentOneHot
(stepnet/ops/sparse_ids.py) against hand-computed cases and references written here (IndexHash: the byte loop
on Python ints, wrapped to the index type's width, as Caffe2's C++ computes it), on every device; bad inputs;
broken kernels caught."""
import bisect

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.testing import DEVICES, infer_static, run_op


def ref_hash(values, seed, modulo, bits):
    """Caffe2's IndexHash on Python ints: signed wrap to `bits` after every step, bytes little-endian, signed."""
    def wrap(v):
        v &= (1 << bits) - 1
        return v - (1 << bits) if v >> (bits - 1) else v
    out = []
    for v in values:
        h = wrap(seed * 0xDEADBEEF)
        for b in int(v).to_bytes(bits // 8, "little", signed=True):
            h = wrap(h * 65537 + (b - 256 if b > 127 else b))
        out.append(h % modulo)
    return out


def ref_bucket(x, lens, bounds):
    out, at = np.zeros((x.shape[0], sum(lens) + len(lens)), np.float32), 0
    for i in range(x.shape[0]):
        at, offset = 0, 0
        for j, n in enumerate(lens):
            out[i, offset + bisect.bisect_left(bounds[at:at + n].tolist(), x[i, j])] = 1
            at, offset = at + n, offset + n + 1
    return out


IDS64 = np.array([0, 1, -1, 123456789012, -(2 ** 40), 2 ** 62], np.int64)
IDS32 = np.array([0, 1, -1, 2 ** 31 - 1, -(2 ** 31), 77], np.int32)
BOUNDS = np.array([0.1, 2.5, 1, 3.1, 4.5], np.float32)

CASES = [
    ("merge", "MergeIdLists",
     [np.array([3, 0, 2], np.int32), np.array([5, 1, 5, 9, 2], np.int64),
      np.array([1, 2, 0], np.int32), np.array([1, 7, 4], np.int64)], {},
     [np.array([2, 2, 2], np.int32), np.array([1, 5, 4, 7, 2, 9], np.int64)]),
    ("hash64", "IndexHash", [IDS64], {"seed": 3, "modulo": 100003}, [np.array(ref_hash(IDS64, 3, 100003, 64))]),
    ("hash32", "IndexHash", [IDS32], {"seed": 1, "modulo": 7919},
     [np.array(ref_hash(IDS32, 1, 7919, 32), np.int32)]),
    ("ngram", "NGramFromCategorical",
     [np.array([[4.4, 9.0, 2.5], [7.0, -1.0, -2.5], [5.0, 9.0, 0.0]], np.float32)],
     {"col_ids": [0, 2], "categorical_limits": [3, 2], "vals": [4, 7, 5, 3, -3]},
     [np.array([0 + 3 * 0, 1 + 3 * 1, 2 + 0], np.int64)]),    # 2.5 -> 3 and -2.5 -> -3 (half away from 0)
    ("duplicates", "FindDuplicateElements", [np.array([3, 1, 3, 3, 2, 1], np.int32)], {},
     [np.array([2, 3, 5], np.int64)]),
    # Caffe2's doc example (each bucket right-inclusive)
    ("bucket_doc", "BatchBucketOneHot", [np.array([[2, 3], [4, 1], [2, 5]], np.float32), np.array([2, 3], np.int32),
                                         BOUNDS], {},
     [np.array([[0, 1, 0, 0, 1, 0, 0], [0, 0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0, 1]], np.float32)]),
    ("bucket_edges", "BatchBucketOneHot", [np.array([[2.5, 3.1], [0.1, 4.6]], np.float32), np.array([2, 3], np.int32),
                                           BOUNDS], {},
     [ref_bucket(np.array([[2.5, 3.1], [0.1, 4.6]], np.float32), [2, 3], BOUNDS)]),
    ("segment_one_hot", "SegmentOneHot", [np.array([2, 0, 3], np.int32), np.array([1, 4, 0, 0, 2], np.int64),
                                          np.array(5, np.int64)], {},
     [np.array([[0, 1, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]], np.float32)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device)


def test_duplicates_of_strings():
    got = run_op("FindDuplicateElements", [np.array([b"a", b"b", b"a"], dtype=object)])
    assert got.tolist() == [2] and got.dtype == np.int64


def test_index_hash_keeps_the_shape_without_a_modulo_statically():
    """Caffe2's InferShapesAndTypes gives IndexHash's shape without checking modulo (it is checked when run)."""
    spec = infer_static("IndexHash", [np.zeros((2, 3), np.int32)])[0]
    assert spec.shape == (2, 3) and spec.dtype == np.int32
    with pytest.raises(ArgumentError, match="modulo = 0 must be > 0"):
        run_op("IndexHash", [np.zeros(3, np.int32)])


BAD = [
    ("MergeIdLists", [np.array([1], np.int32), np.array([1, 2], np.int64)], {}, ShapeError, "sum to 1"),
    ("MergeIdLists", [np.array([1], np.int32), np.array([1], np.int64), np.array([1], np.int32),
                      np.array([1], np.int32)], {}, DTypeError, "one type"),
    ("IndexHash", [IDS32], {"modulo": 2 ** 40}, ArgumentError, "larger than int32"),
    ("NGramFromCategorical", [np.zeros((2, 2), np.float32)],
     {"col_ids": [2], "categorical_limits": [1], "vals": [0]}, ShapeError, "has 2 columns"),
    ("NGramFromCategorical", [np.zeros((2, 2), np.float32)],
     {"col_ids": [0], "categorical_limits": [2], "vals": [0]}, ArgumentError, "sum to 2"),
    ("BatchBucketOneHot", [np.zeros((2, 2), np.float32), np.array([2, 2], np.int32), BOUNDS], {}, ShapeError,
     "sum to 4 but there are 5"),
    ("SegmentOneHot", [np.array([2], np.int32), np.array([1, 5], np.int64), np.array(5, np.int64)], {}, ShapeError,
     r"indices\[1\] = 5 is out of range 0..4"),
]


@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, match):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, 2 if op_type == "MergeIdLists" else 1, **args)


@pytest.mark.parametrize("case_id, op_type, wrong", [
    ("hash32", "IndexHash", lambda xp, x, *, seed, modulo: xp.mod(x.astype(np.int64) * 65537 + seed, modulo)
     .astype(x.dtype)),
    ("ngram", "NGramFromCategorical",            # numpy's round: half to even
     lambda xp, f, *, col_ids, categorical_limits, vals: xp.asarray(np.array([0, 1, 2], np.int64))),
    ("bucket_edges", "BatchBucketOneHot", lambda xp, x, lens, b: xp.asarray(ref_bucket(x + 1e-3, [2, 3], b))),
])
def test_reference_catches_a_broken_kernel(case_id, op_type, wrong, broken):
    _, _, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu")
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu")
