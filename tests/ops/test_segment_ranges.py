"""SortedSegmentSum, UnsortedSegmentSum and SortedSegmentRange{Sum,LogSumExp,LogMeanExp,Mean,Max} with their gradient
ops (stepnet/ops/segment_ranges.py; the first two are segment_reducers.py's, tested here too) against loop references
written here (group the rows by id, then reduce with math.fsum / max / exp and log, as Caffe2's segment_ops_test.py
references do) on every device; the gradients against float64 finite differences and derivative loops; the output
rows depend on the id values (unknown statically unless known); bad ids; broken kernels caught."""
import math

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import argument_value
from stepnet.testing import DEVICES, check_gradient, infer_alone, infer_static, make_op, run_op

rng = np.random.default_rng(43)
REDUCERS = {
    "Sum": math.fsum,
    "Mean": lambda v: math.fsum(v) / len(v),
    "Max": max,
    "LogSumExp": lambda v: math.log(math.fsum(math.exp(a) for a in v)),
    "LogMeanExp": lambda v: math.log(math.fsum(math.exp(a) for a in v) / len(v)),
}


def ref_segments(data, ids, reduce, count=None):
    """Row s of the output: `reduce` over the DATA rows with id s, element by element (0 for no rows)."""
    count = max(ids.tolist(), default=-1) + 1 if count is None else count
    out = np.zeros((count,) + data.shape[1:])
    for s in range(count):
        rows = [data[i] for i in range(len(ids)) if ids[i] == s]
        for at in np.ndindex(*data.shape[1:]):
            if rows:
                out[(s,) + at] = reduce([float(r[at]) for r in rows])
    return out.astype(data.dtype)


def ref_range_grad(kind, data, ids, y, dy):
    """dDATA row i from its segment s = ids[i]: d reduce / d x_i times dY[s]."""
    out = np.zeros(data.shape)
    for i, s in enumerate(ids.tolist()):
        n = int((ids == s).sum())
        for at in np.ndindex(*data.shape[1:]):
            x, g, top = float(data[(i,) + at]), float(dy[(s,) + at]), float(y[(s,) + at])
            out[(i,) + at] = g * {"Sum": 1.0, "Mean": 1.0 / n, "LogSumExp": math.exp(x - top),
                                  "LogMeanExp": math.exp(x - top) / n, "Max": float(x == top)}[kind]
    return out.astype(dy.dtype)


IDS = np.array([0, 0, 1, 2, 2, 2, 3], np.int32)
D = rng.uniform(-3, 3, (7, 2, 3)).astype(np.float32)
D1 = rng.uniform(-3, 3, 7)
MAXED = np.array([[1.0, 5.0], [5.0, 5.0], [3.0, 0.0], [3.0, 0.0]], np.float32)   # ties in a max
UIDS = np.array([4, 1, 4, 0, 1, 4, 6], np.int64)

CASES = [(f"range_{k.lower()}", f"SortedSegmentRange{k}", [D, IDS], {}, [ref_segments(D, IDS, f)])
         for k, f in REDUCERS.items()]
CASES += [
    ("range_max_ties", "SortedSegmentRangeMax", [MAXED, np.array([0, 0, 1, 1], np.int32)], {},
     [ref_segments(MAXED, np.array([0, 0, 1, 1]), max)]),
    ("range_logsumexp_1d_double", "SortedSegmentRangeLogSumExp", [D1, IDS.astype(np.int64)], {},
     [ref_segments(D1, IDS, REDUCERS["LogSumExp"])]),
    ("sorted_sum", "SortedSegmentSum", [D, IDS], {}, [ref_segments(D, IDS, math.fsum)]),
    ("sorted_sum_one_segment", "SortedSegmentSum", [D1, np.zeros(7, np.int32)], {},
     [ref_segments(D1, np.zeros(7, np.int32), math.fsum)]),
    ("sorted_sum_empty", "SortedSegmentSum", [D[:0], IDS[:0]], {}, [np.zeros((0, 2, 3), np.float32)]),
    ("unsorted_sum", "UnsortedSegmentSum", [D, UIDS], {}, [ref_segments(D, UIDS, math.fsum)]),
    ("unsorted_sum_num_segments", "UnsortedSegmentSum", [D1, UIDS], {"num_segments": 9},
     [ref_segments(D1, UIDS, math.fsum, 9)]),
    ("unsorted_sum_empty", "UnsortedSegmentSum", [D[:0], UIDS[:0]], {"num_segments": 2},
     [np.zeros((2, 2, 3), np.float32)]),
    ("sorted_sum_grad", "SortedSegmentSumGradient", [D[:4, 0], IDS], {},
     [np.array([D[s, 0] for s in IDS.tolist()])]),
    ("unsorted_sum_grad", "UnsortedSegmentSumGradient", [D[:7, 0], UIDS], {"num_segments": 7},
     [np.array([D[s, 0] for s in UIDS.tolist()])]),
]
Y = {k: ref_segments(D, IDS, f) for k, f in REDUCERS.items()}
DY = rng.standard_normal((4, 2, 3)).astype(np.float32)
CASES += [(f"range_{k.lower()}_grad", f"SortedSegmentRange{k}Gradient", [D, Y[k], DY, IDS], {},
           [ref_range_grad(k, D, IDS, Y[k], DY)]) for k in REDUCERS]
CASES += [("range_max_grad_ties", "SortedSegmentRangeMaxGradient",
           [MAXED, ref_segments(MAXED, np.array([0, 0, 1, 1]), max), np.ones((2, 2), np.float32),
            np.array([0, 0, 1, 1], np.int32)], {},
           [ref_range_grad("Max", MAXED, np.array([0, 0, 1, 1]), ref_segments(MAXED, np.array([0, 0, 1, 1]), max),
                           np.ones((2, 2), np.float32))])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device, 1e-5)


def test_every_tie_of_a_max_gets_the_gradient():
    """Caffe2's MaxRangeReducerGradient gives dY to every element equal to the max (not only the first)."""
    got = run_op("SortedSegmentRangeMaxGradient", CASES[[c[0] for c in CASES].index("range_max_grad_ties")][2])
    assert got.tolist() == [[0.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]


def test_output_rows_follow_the_id_values():
    assert infer_static("SortedSegmentSum", [D, IDS])[0].shape == (4, 2, 3)          # small ids: known values
    assert infer_static("UnsortedSegmentSum", [D1, UIDS], num_segments=8)[0].shape == (8,)
    from stepnet.core.spec import TensorSpec
    from stepnet.passes.shapes import infer_net
    from stepnet.io.proto import NetDef
    net = NetDef(name="s")
    net.op.append(make_op("SortedSegmentRangeMean", ["d", "ids"], ["y"]))
    specs = infer_net(net, {"d": TensorSpec((7, 3), np.dtype(np.float32)), "ids": TensorSpec((7,), np.dtype(np.int32))})
    assert specs["y"].shape is None and specs["y"].dtype == np.float32


# --------------------------------------------------------------------------------------------- gradients
GRADS = [(f"SortedSegmentRange{k}", [rng.uniform(-2, 2, (7, 2)), IDS], {}) for k in REDUCERS]
GRADS += [("SortedSegmentSum", [rng.uniform(-2, 2, (7, 3)), IDS], {}),
          ("UnsortedSegmentSum", [rng.uniform(-2, 2, (7, 3)), UIDS], {}),
          ("UnsortedSegmentSum", [rng.uniform(-2, 2, 7), UIDS], {"num_segments": 10})]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args", GRADS, ids=[f"{g[0]}-{i}" for i, g in enumerate(GRADS)])
def test_gradients_match_finite_differences(op_type, inputs, args, device):
    check_gradient(op_type, inputs, wrt=[0], device=device, **args)


@pytest.mark.parametrize("forward, want_inputs", [
    ("SortedSegmentSum", ["y_grad", "ids"]), ("UnsortedSegmentSum", ["y_grad", "ids"]),
    *[(f"SortedSegmentRange{k}", ["d", "y", "y_grad", "ids"]) for k in REDUCERS]])
def test_makers_emit_caffe2s_ops(forward, want_inputs):
    ops, grads = backward_ops([make_op(forward, ["d", "ids"], ["y"])], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops] == \
        [(forward + "Gradient", want_inputs, ["d_grad"], {})]
    assert grads["d"] == "d_grad" and "ids" not in grads


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("SortedSegmentSum", [D, np.array([0, 0, 2, 2, 2, 3, 3], np.int32)], ShapeError,
     r"sorted and without gaps: SEGMENT_IDS\[2\] = 2 follows 0"),
    ("SortedSegmentRangeSum", [D, np.array([1, 1, 1, 2, 2, 2, 3], np.int32)], ShapeError, "the first is 1"),
    ("SortedSegmentRangeMax", [D, np.array([0, 1, 0, 1, 2, 2, 3], np.int32)], ShapeError, r"\[2\] = 0 follows 1"),
    ("SortedSegmentRangeMean", [D, IDS[:5]], ShapeError, "5 ids but DATA has 7 rows"),
    ("SortedSegmentRangeMean", [D, IDS.astype(np.float32)], DTypeError, "SEGMENT_IDS must be int32 or int64"),
    ("SortedSegmentRangeLogSumExp", [D.astype(np.int32), IDS], DTypeError, "floating-point"),
    ("UnsortedSegmentSum", [D, np.array([0, 1, 2, -1, 0, 0, 0])], ShapeError, r"SEGMENT_IDS\[3\] = -1 is out of range"),
    ("UnsortedSegmentSum", [D, UIDS], ShapeError, r"\[6\] = 6 is out of range 0..4 \(num_segments=5\)"),
    ("UnsortedSegmentSum", [D, IDS.reshape(7, 1)], ShapeError, "must be a vector"),
    ("SortedSegmentSumGradient", [D[:3], IDS], ShapeError, "3 rows but the segment ids make 4 segments"),
    ("SortedSegmentRangeSumGradient", [D[:5], Y["Sum"], DY, IDS], ShapeError, "do not fit 7 segment ids"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, error, match, device):
    args = {"num_segments": 5} if "num_segments" in match else {}
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("op_type, inputs, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, error, match):
    args = {"num_segments": 5} if "num_segments" in match else {}
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs, **args)


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id, wrong", [
    ("range_logmeanexp", lambda xp, d, ids: REGISTRY.get("SortedSegmentRangeLogSumExp").kernel(xp, d, ids)),
    ("range_max", lambda xp, d, ids: REGISTRY.get("SortedSegmentRangeMean").kernel(xp, d, ids)),
    ("unsorted_sum", lambda xp, d, ids, *, num_segments: d.copy()),     # sorted ids assumed: no grouping
    ("range_max_grad_ties", lambda xp, x, y, dy, ids: xp.take(dy, ids.astype(np.int64), axis=0)),
])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu", 1e-5)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu", 1e-5)


def test_check_gradient_catches_a_logsumexp_gradient_without_the_weights(broken):
    inputs = [rng.uniform(-2, 2, (7, 2)), IDS]
    check_gradient("SortedSegmentRangeLogSumExp", inputs, wrt=[0])
    broken("SortedSegmentRangeLogSumExpGradient", lambda xp, x, y, dy, ids: xp.take(dy, ids.astype(np.int64), axis=0))
    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradient("SortedSegmentRangeLogSumExp", inputs, wrt=[0])
