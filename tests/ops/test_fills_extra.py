"""DiagonalFill, Range, UniqueUniformFill, WeightedMultiSampling and ExtendTensor (stepnet/ops/fills_extra.py):
the deterministic ones against references written here (index loops, numpy's arange and fill_diagonal, Caffe2's
length rule for Range spelled out), the random ones by the properties Caffe2 promises (range, distinctness,
avoided values, where the mass is) and the same draws on every device; bad inputs; broken kernels caught."""
import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.io.proto import DataType
from stepnet.ops import REGISTRY
from stepnet.runtime.workspace import Workspace
from stepnet.testing import DEVICES, GPU_MODE, infer_alone, run_op

rng = np.random.default_rng(9)


def ref_diagonal(shape, value, dtype):
    out = np.zeros(shape, dtype)
    if len(shape) == 2:
        np.fill_diagonal(out, value, wrap=True)
    else:
        for i in range(shape[0]):
            out[(i,) * len(shape)] = value
    return out


def ref_extend(tensor, indices):
    rows = max(0, int(indices.max()) + 1 - tensor.size)
    return np.concatenate([tensor, np.zeros((rows,) + tensor.shape[1:], tensor.dtype)])


def scalar(v, dtype):
    return np.array(v, dtype)


CASES = [
    ("diag_2d", "DiagonalFill", [], {"shape": [3, 4], "value": 2.5}, [ref_diagonal((3, 4), 2.5, np.float32)]),
    ("diag_tall_wraps", "DiagonalFill", [], {"shape": [7, 3], "value": 1.0}, [ref_diagonal((7, 3), 1.0, np.float32)]),
    ("diag_3d_int", "DiagonalFill", [], {"shape": [3, 3, 3], "value": 4, "dtype": DataType.INT32},
     [ref_diagonal((3, 3, 3), 4, np.int32)]),
    ("diag_int64_from_value", "DiagonalFill", [], {"shape": [2, 2], "value": 7}, [ref_diagonal((2, 2), 7, np.int64)]),
    ("diag_like_input", "DiagonalFill", [np.zeros((4, 4), np.float64)], {"value": 1.5, "dtype": DataType.DOUBLE},
     [ref_diagonal((4, 4), 1.5, np.float64)]),
    ("range_stop", "Range", [scalar(5, np.int64)], {}, [np.arange(5, dtype=np.int64)]),
    ("range_float", "Range", [scalar(10, np.float32), scalar(5, np.float32), scalar(-1.5, np.float32)], {},
     [np.arange(10, 5, -1.5, dtype=np.float32)]),
    ("range_int32_step", "Range", [scalar([2], np.int32), scalar([11], np.int32), scalar([3], np.int32)], {},
     [np.arange(2, 11, 3, dtype=np.int32)]),
    ("range_empty", "Range", [scalar(2, np.int64), scalar(10, np.int64), scalar(-1, np.int64)], {},
     [np.zeros(0, np.int64)]),
    ("range_caffe2_negative_step", "Range", [scalar(5, np.int64), scalar(0, np.int64), scalar(-2, np.int64)], {},
     [np.array([5, 3], np.int64)]),     # trunc(-5 / -2) = 2 and 2 * -2 >= -5: no third element, unlike numpy
    ("extend", "ExtendTensor", [np.arange(1, 7, dtype=np.int32), np.array([0, 5, 8, 2], np.int32)], {},
     [ref_extend(np.arange(1, 7, dtype=np.int32), np.array([0, 5, 8, 2]))]),
    ("extend_rows", "ExtendTensor", [np.ones((2, 3), np.float32), np.array([[1, 8]], np.int32)], {},
     [ref_extend(np.ones((2, 3), np.float32), np.array([8]))]),
    ("extend_nothing", "ExtendTensor", [np.ones(4, np.float32), np.array([3, 0], np.int32)], {},
     [np.ones(4, np.float32)]),
]


def run_case(op_type, inputs, args, device):
    if op_type == "ExtendTensor":       # in place by definition: the output is input 0
        return [run_op(op_type, {"t": inputs[0], "i": inputs[1]}, ["t"], device=device, **args)]
    return [run_op(op_type, inputs, device=device, **args)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    got = run_case(op_type, inputs, args, device)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_range_matches_numpy_where_caffe2_does():
    for bounds in [(10,), (0,), (0, 0), (2, 10000), (2, 10000, 20000), (2, 10000, -1), (-3, 7, 2), (7, -3, -2)]:
        got = run_op("Range", [np.array(b) for b in bounds])
        np.testing.assert_array_equal(got, np.arange(*bounds))


def test_extend_strings_with_empty_strings():
    got = run_op("ExtendTensor", {"t": np.array([b"a"], dtype=object), "i": np.array([2], np.int32)}, ["t"])
    assert got.tolist() == [b"a", b"", b""]


# --------------------------------------------------------------------------------------------- random
@pytest.mark.parametrize("lo, hi, n, avoid, dtype", [
    (1, 40, 30, [3, 9, 27], DataType.INT32), (1, 40, 30, [3, 9, 27], DataType.INT64), (0, 9, 10, [], DataType.INT32),
    (10, 2 ** 40, 500, [11, 12], DataType.INT64), (-2 ** 31, 2 ** 31 - 1, 300, [0], DataType.INT32)])
def test_unique_uniform_fill(lo, hi, n, avoid, dtype):
    np_dtype = np.int32 if dtype == DataType.INT32 else np.int64
    y = run_op("UniqueUniformFill", [np.array([n], np.int64), np.array(avoid, np_dtype)], min=lo, max=hi,
               input_as_shape=True, dtype=dtype)
    assert y.dtype == np_dtype and y.shape == (n,)
    assert len(set(y.tolist())) == n and not set(y.tolist()) & set(avoid)
    assert lo <= y.min() and y.max() <= hi


def test_unique_uniform_fill_covers_its_range():
    assert set(run_op("UniqueUniformFill", [], shape=[6], min=0, max=5).tolist()) == set(range(6))
    counts = np.bincount(run_op("UniqueUniformFill", [], shape=[2000], min=0, max=3999), minlength=4000)
    assert counts[:2000].sum() > 900 and counts[2000:].sum() > 900      # both halves drawn from


def test_weighted_multi_sampling():
    cdf = np.array([0, 0, 0.2, 0.2, 1.0], np.float32)
    y = run_op("WeightedMultiSampling", [cdf], num_samples=4000)
    assert y.dtype == np.int32 and y.shape == (4000,)
    counts = np.bincount(y, minlength=5)
    assert counts[[0, 1, 3]].sum() == 0 and 600 < counts[2] < 1000      # mass 0.2 / 1.0 on index 2
    shaped = run_op("WeightedMultiSampling", [cdf, np.zeros((3, 2))])
    assert shaped.shape == (3, 2) and set(shaped.ravel().tolist()) <= {2, 4}
    assert run_op("WeightedMultiSampling", [cdf[:0]], num_samples=5).shape == (0,)


@pytest.mark.parametrize("op_type, inputs, args", [
    ("WeightedMultiSampling", [np.cumsum(rng.uniform(0, 1, 9)).astype(np.float32)], {"num_samples": 50}),
    ("UniqueUniformFill", [], {"shape": [20], "min": 0, "max": 100}),
])
def test_random_draws_agree_across_devices(op_type, inputs, args):
    outs = [run_op(op_type, inputs, device=d, ws=Workspace(seed=4, gpu=GPU_MODE[d]), **args) for d in DEVICES]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_static_shapes_and_gradients():
    assert infer_alone("DiagonalFill", {}, ["y"], shape=[3, 3], value=1)["y"].dtype == np.int64
    assert infer_alone("Range", {"a": np.array(2), "b": np.array(9)}, ["y"])["y"].shape == (7,)
    assert infer_alone("WeightedMultiSampling", {"w": np.ones(3, np.float32)}, ["y"], num_samples=6)["y"].shape == (6,)
    for op_type in ("DiagonalFill", "Range", "UniqueUniformFill"):
        assert REGISTRY.get(op_type).gradient == "no_gradient"
    for op_type in ("WeightedMultiSampling", "ExtendTensor"):
        assert REGISTRY.get(op_type).gradient is None


BAD = [
    ("DiagonalFill", [], {"shape": [3], "value": 1.0}, ShapeError, "at least 2 dims"),
    ("DiagonalFill", [], {"shape": [3, 3, 4], "value": 1.0}, ShapeError, "every dim must be equal"),
    ("DiagonalFill", [], {"shape": [3, 3], "value": 1.0, "dtype": DataType.STRING}, ArgumentError,
     r"'dtype' STRING \(4\)"),
    ("DiagonalFill", [], {"shape": [3, 3], "value": 2, "dtype": DataType.FLOAT}, ArgumentError, "stored as floats"),
    ("Range", [scalar(0, np.int64), scalar(10, np.int64), scalar(0, np.int64)], {}, ArgumentError,
     "Step size cannot be 0"),
    ("Range", [scalar(0, np.int64), scalar(10, np.int32)], {}, DTypeError, "share one type"),
    ("Range", [np.arange(2)], {}, ShapeError, "one element"),
    ("Range", [scalar(1, np.uint8)], {}, DTypeError, "int32, int64, float32 or float64"),
    ("UniqueUniformFill", [], {"shape": [5], "min": 0}, ArgumentError, "both 'min' and 'max'"),
    ("UniqueUniformFill", [], {"shape": [5], "min": 3, "max": 3}, ArgumentError, "min < max"),
    ("UniqueUniformFill", [], {"shape": [5], "min": 0, "max": 3}, ArgumentError, "cannot draw 5 distinct"),
    ("UniqueUniformFill", [np.array([2], np.int64), np.array([1, 1], np.int32)], {"min": 0, "max": 9,
     "input_as_shape": True}, ArgumentError, "repeated values"),
    ("UniqueUniformFill", [np.array([2], np.int64), np.array([1], np.int64)], {"min": 0, "max": 9,
     "input_as_shape": True}, DTypeError, "must be int32"),
    ("UniqueUniformFill", [], {"shape": [5], "min": 0, "max": 9, "dtype": DataType.FLOAT}, ArgumentError, "INT32"),
    ("WeightedMultiSampling", [np.ones((2, 2), np.float32)], {"num_samples": 2}, ShapeError, "1-D vector"),
    ("WeightedMultiSampling", [np.ones(2)], {"num_samples": 2}, DTypeError, "float32"),
    ("WeightedMultiSampling", [np.ones(2, np.float32), np.ones(3)], {"num_samples": 2}, ArgumentError,
     "do not also pass"),
    ("WeightedMultiSampling", [np.array([0.5, -1], np.float32)], {"num_samples": 2}, ArgumentError, ">= 0"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, match, device):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("device", DEVICES)
def test_extend_tensor_bad_inputs(device):
    with pytest.raises(DTypeError, match="new_indices must be int32"):
        run_op("ExtendTensor", {"t": np.ones(3), "i": np.array([4])}, ["t"], device=device)
    with pytest.raises(ShapeError, match="same number of dims"):
        run_op("ExtendTensor", {"t": np.ones((3, 1)), "i": np.array([4], np.int32)}, ["t"], device=device)


@pytest.mark.parametrize("case_id, wrong", [
    ("diag_tall_wraps", lambda xp, *i, shape, extra_shape, input_as_shape, value, dtype: xp.asarray(
        np.eye(*shape, dtype=np.float32))),
    ("range_caffe2_negative_step", lambda xp, *b: xp.arange(5, 0, -2, dtype=np.int64)),
    ("extend_rows", lambda xp, t, i, *, growthPct: xp.concatenate([t, xp.zeros((6, 3), t.dtype)])),
])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check_case = lambda: np.testing.assert_array_equal(run_case(op_type, inputs, args, "cpu")[0], want[0])  # noqa: E731
    check_case()
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check_case()


def test_property_checks_catch_a_broken_sampler(broken):
    broken("UniqueUniformFill", lambda xp, *i, shape, extra_shape, input_as_shape, min, max, dtype, rng:
           xp.full(shape, min, dtype=np.int32))
    with pytest.raises(AssertionError):
        test_unique_uniform_fill(1, 40, 30, [3], DataType.INT32)


@pytest.mark.parametrize("index", range(len(BAD)), ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(index):
    """The shape functions raise the kernels' errors before anything runs (the inputs' values are known, except
    those of float tensors)."""
    op_type, inputs, *args, error, match = BAD[index]
    if f"{op_type}-{index}" == "WeightedMultiSampling-17":
        pytest.skip("found from float values, known only at run time")
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs, **(args[0] if args else {}))
