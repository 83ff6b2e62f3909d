"""{Sparse}{Sorted,Unsorted}Segment{Sum,Mean,WeightedSum} and their gradient ops (stepnet/ops/segment_reducers.py)
against loop references written here (walk the ids, add each picked row, scaled, into its segment; divide by
the count for Mean) on every device; the gradients against float64 finite differences; Caffe2's gradient ops
from the makers (a sparse slice for the Sparse forms); bad inputs; broken kernels caught."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import DTypeError, GradientError, ShapeError
from stepnet.io.proto import argument_value
from stepnet.passes.gradients import GradientSlice, backward_ops
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

rng = np.random.default_rng(7)
D = rng.uniform(-2, 2, (6, 2, 3)).astype(np.float32)
SORTED = np.array([0, 0, 1, 2, 2, 2], np.int32)
UNSORTED = np.array([3, 0, 3, 1, 0, 3], np.int64)
W = rng.uniform(0.5, 2, 6).astype(np.float32)
IDX = np.array([5, 0, 0, 2, 4, 1, 3], np.int64)           # sparse: 7 picks of the 6 rows
SIDS = np.array([0, 1, 1, 1, 2, 2, 3], np.int32)
UIDS = np.array([2, 0, 2, 2, 0, 1, 0], np.int32)
SW = rng.uniform(0.5, 2, 7).astype(np.float32)


def ref(data, ids, kind, count=None, weights=None, indices=None):
    """Row s: the reduction of the picked rows with id s (Sum / Mean / WeightedSum), 0 for none."""
    count = max(ids.tolist(), default=-1) + 1 if count is None else count
    out = np.zeros((count,) + data.shape[1:])
    n = np.zeros(count)
    for k, s in enumerate(ids.tolist()):
        row = data[k if indices is None else indices[k]].astype(np.float64)
        out[s] += row * (1.0 if weights is None else float(weights[k]))
        n[s] += 1
    if kind == "Mean":
        for s in range(count):
            out[s] = out[s] / n[s] if n[s] else 0.0
    return out.astype(data.dtype)


def ref_grad(dy, ids, kind, weights=None):
    """Row k: dY of its segment (/ the segment's length for Mean, * weight k for WeightedSum)."""
    counts = np.bincount(ids, minlength=dy.shape[0])
    out = np.zeros((len(ids),) + dy.shape[1:])
    for k, s in enumerate(ids.tolist()):
        scale = 1.0 / counts[s] if kind == "Mean" else float(weights[k]) if kind == "WeightedSum" else 1.0
        out[k] = dy[s].astype(np.float64) * scale
    return out.astype(dy.dtype)


def inputs_of(kind, sparse, ids, weights):
    return [D] + ([weights] if kind == "WeightedSum" else []) + ([IDX] if sparse else []) + [ids]


CASES = []
for kind in ("Sum", "Mean", "WeightedSum"):
    CASES += [
        (f"sorted_{kind}", f"SortedSegment{kind}", inputs_of(kind, False, SORTED, W), {},
         ref(D, SORTED, kind, weights=W if kind == "WeightedSum" else None)),
        (f"unsorted_{kind}", f"UnsortedSegment{kind}", inputs_of(kind, False, UNSORTED, W), {"num_segments": 5},
         ref(D, UNSORTED, kind, 5, W if kind == "WeightedSum" else None)),
        (f"sparse_sorted_{kind}", f"SparseSortedSegment{kind}", inputs_of(kind, True, SIDS, SW), {},
         ref(D, SIDS, kind, None, SW if kind == "WeightedSum" else None, IDX)),
        (f"sparse_unsorted_{kind}", f"SparseUnsortedSegment{kind}", inputs_of(kind, True, UIDS, SW), {},
         ref(D, UIDS, kind, None, SW if kind == "WeightedSum" else None, IDX)),
    ]
DY = rng.standard_normal((4, 2, 3)).astype(np.float32)
CASES += [
    ("mean_empty_segment", "UnsortedSegmentMean", [D, UNSORTED], {}, ref(D, UNSORTED, "Mean")),
    ("sorted_mean_no_ids", "SortedSegmentMean", [D[:0], SORTED[:0]], {}, np.zeros((0, 2, 3), np.float32)),
    ("sorted_mean_grad", "SortedSegmentMeanGradient", [DY[:3], SORTED], {}, ref_grad(DY[:3], SORTED, "Mean")),
    ("unsorted_mean_grad", "UnsortedSegmentMeanGradient", [DY, UNSORTED], {}, ref_grad(DY, UNSORTED, "Mean")),
    ("unsorted_ws_grad", "UnsortedSegmentWeightedSumGradient", [W, DY, UNSORTED], {},
     ref_grad(DY, UNSORTED, "WeightedSum", W)),
    ("sorted_sum_grad", "SortedSegmentSumGradient", [DY[:3], SORTED], {}, ref_grad(DY[:3], SORTED, "Sum")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, [want], device, 1e-5)


def test_output_rows_follow_the_ids():
    specs = infer_alone("SparseUnsortedSegmentMean", [D, IDX, UIDS], num_segments=4)
    assert specs["out0"].shape == (4, 2, 3)
    assert infer_alone("SortedSegmentWeightedSum", [D, W, SORTED])["out0"].shape == (3, 2, 3)


# --------------------------------------------------------------------------------------------- gradients
GRADS = [(f"{p}Segment{k}", inputs_of(k, "Sparse" in p, ids, w), args)
         for k in ("Sum", "Mean", "WeightedSum")
         for p, ids, w, args in (("Sorted", SORTED, W, {}), ("Unsorted", UNSORTED, W, {"num_segments": 5}),
                                 ("SparseSorted", SIDS, SW, {}), ("SparseUnsorted", UIDS, SW, {}))]


@pytest.mark.parametrize("op_type, inputs, args", GRADS, ids=[g[0] for g in GRADS])
def test_gradients_match_finite_differences(op_type, inputs, args):
    check_gradient(op_type, [x.astype(np.float64) if x.dtype == np.float32 else x for x in inputs], wrt=[0],
                   **args)


@pytest.mark.parametrize("forward, inputs, want", [
    ("SortedSegmentMean", ["d", "ids"], ("SortedSegmentMeanGradient", ["y_grad", "ids"], "d_grad")),
    ("UnsortedSegmentWeightedSum", ["d", "w", "ids"],
     ("UnsortedSegmentWeightedSumGradient", ["w", "y_grad", "ids"], "d_grad")),
    ("SparseSortedSegmentWeightedSum", ["d", "w", "i", "ids"],
     ("SortedSegmentWeightedSumGradient", ["w", "y_grad", "ids"], "d_grad_values")),
    ("SparseUnsortedSegmentSum", ["d", "i", "ids"], ("UnsortedSegmentSumGradient", ["y_grad", "ids"], "d_grad_values")),
])
def test_makers_emit_caffe2s_ops(forward, inputs, want):
    ops, grads = backward_ops([make_op(forward, inputs, ["y"])], {"y": "y_grad"})
    assert [(o.type, list(o.input), o.output[0]) for o in ops] == [want]
    sparse = forward.startswith("Sparse")
    assert grads["d"] == (GradientSlice("i", "d_grad_values") if sparse else "d_grad")
    assert not {a.name: argument_value(a) for a in ops[0].arg}


def test_gradient_on_weights_is_refused():
    with pytest.raises(GradientError, match="grad_on_weights"):
        backward_ops([make_op("SortedSegmentWeightedSum", ["d", "w", "ids"], ["y"], grad_on_weights=1)],
                     {"y": "y_grad"})


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("SortedSegmentMean", [D, np.array([0, 0, 2, 2, 2, 3], np.int32)], ShapeError, "without gaps"),
    ("UnsortedSegmentMean", [D, UNSORTED[:5]], ShapeError, "5 ids but DATA has 6 rows"),
    ("UnsortedSegmentSum", [D, np.array([0, 1, -1, 0, 0, 0])], ShapeError, r"SEGMENT_IDS\[2\] = -1 is out of range"),
    ("SparseSortedSegmentSum", [D, np.array([0, 6, 1], np.int64), SORTED[:3]], ShapeError, r"INDICES\[1\] = 6"),
    ("SparseUnsortedSegmentMean", [D, IDX[:3], UIDS], ShapeError, "7 ids but DATA has 3 rows"),
    ("SortedSegmentWeightedSum", [D, W[:4], SORTED], ShapeError, "one weight per segment id"),
    ("UnsortedSegmentWeightedSum", [D, W.astype(np.float64), UNSORTED], DTypeError, "one dtype"),
    ("SortedSegmentMean", [D.astype(np.int32), SORTED], DTypeError, "floating-point"),
    ("UnsortedSegmentMeanGradient", [DY[:2], UNSORTED], ShapeError, r"\[0\] = 3 is out of range 0..1"),
]


@pytest.mark.parametrize("op_type, inputs, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, error, match):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs)
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs)


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id, op_type, wrong", [
    ("unsorted_Mean", "UnsortedSegmentMean", lambda xp, d, ids, **a: run_op("UnsortedSegmentSum", [d, ids], **a)),
    ("sparse_sorted_Sum", "SparseSortedSegmentSum",
     lambda xp, d, i, ids: run_op("SortedSegmentSum", [d[np.arange(len(ids)) % len(d)], ids])),   # no indices
])
def test_reference_catches_a_broken_kernel(case_id, op_type, wrong, broken):
    _, _, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, [want], "cpu", 1e-5)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, [want], "cpu", 1e-5)


def test_check_gradient_catches_a_mean_gradient_without_the_length(broken):
    inputs = [D.astype(np.float64), UNSORTED]
    check_gradient("UnsortedSegmentMean", inputs, wrt=[0])
    broken("UnsortedSegmentMeanGradient", lambda xp, dy, ids, **_: xp.take(dy, ids.astype(np.int64), axis=0))
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("UnsortedSegmentMean", inputs, wrt=[0])

