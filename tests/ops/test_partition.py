"""Partition, LengthsPartition, GatherByKey and KeySplit (stepnet/ops/partition.py) against loop references
written here (walk the keys, append each row to the list of its shard, key mod P in Python's sense) and
hand-computed cases, on every device; GatherByKey undoes Partition; bad inputs; broken kernels caught."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.testing import DEVICES, run_op

rng = np.random.default_rng(5)
KEYS = np.array([7, -3, 4, 0, -8, 5, 2], np.int64)
EXTRA = rng.standard_normal((7, 2)).astype(np.float32)


def ref_partition(keys, extras, parts, pack=False):
    """Outputs in Caffe2's order: for each shard j, the keys then each extra's rows with key mod parts == j."""
    out = []
    for j in range(parts):
        picked = [k for k in keys.reshape(-1).tolist() if k % parts == j]
        out.append(np.array([k // parts if pack else k for k in picked], keys.dtype))
        for x in extras:
            flat = x.reshape((keys.size,) + x.shape[keys.ndim:])
            rows = [flat[i] for i, k in enumerate(keys.reshape(-1).tolist()) if k % parts == j]
            out.append(np.array(rows, x.dtype).reshape((len(rows),) + x.shape[keys.ndim:]))
    return out


def ref_lengths_partition(lengths, keys, extras, parts):
    out, run = [], np.repeat(np.arange(len(lengths)), lengths)
    split = ref_partition(keys, extras, parts)
    for j in range(parts):
        counts = [sum(1 for i, k in enumerate(keys.tolist()) if k % parts == j and run[i] == r)
                  for r in range(len(lengths))]
        out += [np.array(counts, np.int32)] + split[j * (1 + len(extras)):(j + 1) * (1 + len(extras))]
    return out


CASES = [
    ("partition_3", "Partition", [KEYS, EXTRA], 6, {}, ref_partition(KEYS, [EXTRA], 3)),
    ("partition_pack", "Partition", [KEYS.astype(np.int32)], 2, {"pack_first_input": 1},
     ref_partition(KEYS.astype(np.int32), [], 2, True)),
    ("partition_2d", "Partition", [KEYS[:6].reshape(2, 3), EXTRA[:6].reshape(2, 3, 2)], 4, {},
     ref_partition(KEYS[:6].reshape(2, 3), [EXTRA[:6].reshape(2, 3, 2)], 2)),
    ("partition_hand", "Partition", [KEYS], 2, {}, [np.array([4, 0, -8, 2]), np.array([7, -3, 5])]),
    ("lengths_partition", "LengthsPartition", [np.array([3, 0, 4], np.int32), KEYS, EXTRA], 6, {},
     ref_lengths_partition([3, 0, 4], KEYS, [EXTRA], 2)),
    ("gather_by_key", "GatherByKey", [KEYS] + ref_partition(KEYS, [EXTRA], 3)[1::2], 1, {}, [EXTRA]),
    ("key_split", "KeySplit", [np.array([2, 0, 2, 1, 0], np.int64)], 3, {"categorical_limit": 3},
     [np.array([1, 4], np.int32), np.array([3], np.int32), np.array([0, 2], np.int32)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, n_out, args, want = case
    got = run_op(op_type, inputs, n_out, device=device, **args)
    got = got if isinstance(got, list) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


BAD = [
    ("Partition", [KEYS, EXTRA], 3, {}, ArgumentError, "multiple of the inputs"),
    ("Partition", [KEYS, EXTRA[:5]], 2, {}, ShapeError, "must start with the keys' shape"),
    ("Partition", [KEYS.astype(np.float32)], 2, {}, DTypeError, "int32 or int64"),
    ("LengthsPartition", [np.array([3, 3], np.int32), KEYS], 2, {}, ShapeError, "sum to 6 but there are 7"),
    ("GatherByKey", [KEYS, EXTRA[:3], EXTRA[3:]], 1, {}, ShapeError, "falls? in its shard|keys fall"),
    ("KeySplit", [np.array([0, 3], np.int64)], 2, {"categorical_limit": 2}, ShapeError, r"keys\[1\] = 3"),
    ("KeySplit", [np.array([0, 1], np.int64)], 1, {"categorical_limit": 2}, ArgumentError, "one output per"),
    ("KeySplit", [np.array([0, 1], np.int32)], 2, {"categorical_limit": 2}, DTypeError, "int64"),
]


@pytest.mark.parametrize("op_type, inputs, n_out, args, error, match", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, n_out, args, error, match):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, n_out, **args)


@pytest.mark.parametrize("case_id, op_type, wrong", [
    ("partition_3", "Partition",         # C's remainder: negative keys in no shard's place
     lambda ctx, xp, keys, x, *, pack_first_input: tuple(
         v for j in range(3) for v in (keys[np.fmod(keys, 3) == j], x[np.fmod(keys, 3) == j]))),
    ("gather_by_key", "GatherByKey", lambda xp, keys, *shards: xp.concatenate(shards)),
])
def test_reference_catches_a_broken_kernel(case_id, op_type, wrong, broken):
    case = CASES[[c[0] for c in CASES].index(case_id)]
    test_against_reference(case, "cpu")
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        test_against_reference(case, "cpu")
