"""Find and GatherFused8BitRowwise (stepnet/ops/lookup.py) against references written here: Find by a loop over
the index (Caffe2's find_op_test.py reference), the fused gather by decoding each row's bytes by hand (uint8
codes, then a little-endian float32 scale and bias), on every device; bad inputs; broken kernels caught."""
import struct

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, infer_alone, infer_static, run_op

rng = np.random.default_rng(11)


def ref_find(index, query, missing=-1):
    out = []
    for q in query.reshape(-1).tolist():
        hits = [j for j, v in enumerate(index.tolist()) if v == q]
        out.append(hits[-1] if hits else missing)
    return np.array(out, index.dtype).reshape(query.shape)


def fused_rows(codes, scales, biases):
    """uint8 fused rows built byte by byte: the codes, then the scale and bias as little-endian float32."""
    rows = [bytes(c) + struct.pack("<ff", s, b) for c, s, b in zip(codes.tolist(), scales, biases)]
    return np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), -1).copy()


def ref_gather_fused(codes, scales, biases, indices):
    out = np.zeros((len(indices), codes.shape[1]), np.float32)
    for r, i in enumerate(indices.tolist()):
        for j in range(codes.shape[1]):
            out[r, j] = np.float32(codes[i, j]) * np.float32(scales[i]) + np.float32(biases[i])
    return out


IDX = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5], np.int32)
QUERY = np.array([[1, 5, 7], [9, 3, 0]], np.int32)
CODES = rng.integers(0, 256, (6, 5)).astype(np.uint8)
SCALES, BIASES = [0.5, 0.25, 1.5, 0.01, 2.0, 0.125], [-1.0, 0.5, 3.0, 0.0, -7.5, 1.0]
FUSED = fused_rows(CODES, SCALES, BIASES)
PICK = np.array([5, 0, 0, 3], np.int64)

CASES = [
    ("find", "Find", [IDX, QUERY], {}, [ref_find(IDX, QUERY)]),
    ("find_int64_missing", "Find", [IDX.astype(np.int64), QUERY.astype(np.int64)], {"missing_value": -7},
     [ref_find(IDX.astype(np.int64), QUERY.astype(np.int64), -7)]),
    ("find_many", "Find", [IDX, np.arange(20, dtype=np.int32) % 11], {},
     [ref_find(IDX, np.arange(20, dtype=np.int32) % 11)]),
    ("find_empty_index", "Find", [IDX[:0], QUERY], {}, [np.full((2, 3), -1, np.int32)]),
    ("gather_fused", "GatherFused8BitRowwise", [FUSED, PICK], {}, [ref_gather_fused(CODES, SCALES, BIASES, PICK)]),
    ("gather_fused_int32_none", "GatherFused8BitRowwise", [FUSED, PICK[:0].astype(np.int32)], {},
     [np.zeros((0, 5), np.float32)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device, 0.0)


def test_find_gives_the_last_position():
    assert run_op("Find", [np.array([7, 7, 2, 7], np.int64), np.array([7, 2, 3], np.int64)]).tolist() == [3, 2, -1]


def test_gather_fused_matches_the_quantizer_round_trip():
    data = rng.uniform(-4, 4, (7, 9)).astype(np.float32)
    fused = run_op("FloatToFused8BitRowwiseQuantized", [data])
    back = run_op("Fused8BitRowwiseQuantizedToFloat", [fused])
    np.testing.assert_array_equal(run_op("GatherFused8BitRowwise", [fused, PICK]), back[PICK])
    assert infer_static("GatherFused8BitRowwise", [fused, PICK])[0].shape == (4, 9)


def test_no_gradients_registered():
    assert REGISTRY.get("Find").gradient is None
    assert REGISTRY.get("GatherFused8BitRowwise").gradient is None


BAD = [
    ("Find", [IDX, QUERY.astype(np.int64)], DTypeError, "must share one type"),
    ("Find", [IDX.astype(np.float32), QUERY], DTypeError, "INDEX must be int32 or int64"),
    ("GatherFused8BitRowwise", [FUSED, np.array([6], np.int64)], ShapeError, r"INDICES\[0\] = 6 is out of bounds"),
    ("GatherFused8BitRowwise", [FUSED[:, :8], PICK], ShapeError, "more than 8"),
    ("GatherFused8BitRowwise", [FUSED.astype(np.int32), PICK], DTypeError, "uint8"),
    ("GatherFused8BitRowwise", [FUSED[None], PICK], ShapeError, "matrix"),
    ("GatherFused8BitRowwise", [FUSED, PICK.reshape(2, 2)], ShapeError, "1-D vector"),
    ("GatherFused8BitRowwise", [FUSED, PICK.astype(np.float32)], DTypeError, "int32 or int64"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, error, match, device):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, device=device)


@pytest.mark.parametrize("case_id, wrong", [
    ("find", lambda xp, index, query, *, missing_value: xp.zeros_like(query)),
    ("find_many", lambda xp, index, query, *, missing_value: GOOD_FIND(xp, index[::-1].copy(), query,
                                                                        missing_value=missing_value)),
    ("gather_fused", lambda xp, data, idx: GOOD_GATHER(xp, data, idx) + np.float32(1e-3)),
])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu", 0.0)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu", 0.0)


GOOD_FIND = REGISTRY.get("Find").kernel
GOOD_GATHER = REGISTRY.get("GatherFused8BitRowwise").kernel


@pytest.mark.parametrize("index", range(len(BAD)), ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(index):
    """The shape functions raise the kernels' errors before anything runs (the inputs' values are known)."""
    op_type, inputs, *args, error, match = BAD[index]
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs, **(args[0] if args else {}))
