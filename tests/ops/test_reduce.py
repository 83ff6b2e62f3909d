"""ReduceSum/Mean/Max/Min/L1/L2, ReduceFront*/ReduceBack* (with lengths), SumElements, SumElementsInt,
SumSqrElements, RowwiseMax and ColwiseMax against loop references in Python numbers, on every device."""
import math

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.testing import DEVICES, infer_static, run_op

rng = np.random.default_rng(5)
F32_LOW, F32_HIGH = float(np.finfo(np.float32).min), float(np.finfo(np.float32).max)


def f32(*shape):
    return rng.uniform(-3, 3, size=shape).astype(np.float32)


def i32(*shape, dtype=np.int32):
    return rng.integers(-20, 20, size=shape).astype(dtype)


def c_div(total, n):
    """C++ integer division: truncation toward zero."""
    q = abs(total) // n
    return q if total >= 0 else -q


def lowest(dtype):
    d = np.dtype(dtype)
    return float(np.finfo(d).min) if d.kind == "f" else int(np.iinfo(d).min)


def highest(dtype):
    d = np.dtype(dtype)
    return float(np.finfo(d).max) if d.kind == "f" else int(np.iinfo(d).max)


REDUCERS = {
    "ReduceSum": lambda v, dt: sum(v),
    "ReduceMean": lambda v, dt: sum(v) / len(v) if v else 0.0,
    "ReduceMax": lambda v, dt: max(v) if v else lowest(dt),
    "ReduceMin": lambda v, dt: min(v) if v else highest(dt),
    "ReduceL1": lambda v, dt: sum(abs(x) for x in v),
    "ReduceL2": lambda v, dt: math.sqrt(sum(x * x for x in v)),
}


def ref_reduce(op_type, X, axes=(), keepdims=1):
    """Bucket every element by its index on the kept axes, then reduce each bucket."""
    nd = X.ndim
    ax = sorted({a % nd for a in axes}) if axes else list(range(nd))
    kept = tuple(1 if i in ax else d for i, d in enumerate(X.shape))
    buckets = {}
    for idx in np.ndindex(*X.shape):
        key = tuple(0 if i in ax else idx[i] for i in range(nd))
        buckets.setdefault(key, []).append(X[idx].item())
    out = np.empty(kept, dtype=np.float64)
    for key in np.ndindex(*kept):
        out[key] = REDUCERS[op_type](buckets.get(key, []), X.dtype)
    return out if keepdims else out.reshape(tuple(d for i, d in enumerate(X.shape) if i not in ax))


def ref_front_back(op_type, X, n=1, lengths=None):
    front = "Front" in op_type
    split = n if front else X.ndim - n
    out_shape = X.shape[split:] if front else X.shape[:split]
    rows, cols = math.prod(X.shape[:split]), math.prod(X.shape[split:])
    if rows == 0 or cols == 0:
        return np.zeros(out_shape)
    flat = [v.item() for v in X.ravel()]
    out = []
    for g in range(cols if front else rows):
        size = rows if front else cols
        count = size if lengths is None else int(lengths.ravel()[g])
        vals = [flat[i * cols + g] if front else flat[g * cols + i] for i in range(count)]
        if op_type.endswith("Sum"):
            out.append(sum(vals))
        elif op_type.endswith("Max"):
            out.append(max(vals) if vals else lowest(X.dtype))
        elif X.dtype.kind == "f":
            out.append(sum(vals) / count if count else math.nan)
        else:
            out.append(c_div(sum(vals), count))
    return np.array(out, dtype=np.float64).reshape(out_shape)


def ref_scalar(op_type, X, average=0):
    vals = [v.item() for v in X.ravel()]
    total = sum(v * v for v in vals) if op_type == "SumSqrElements" else sum(vals)
    return np.array(total / len(vals) if average and vals else total, dtype=np.float64)


def ref_max3d(X, axis):
    B, M, N = X.shape
    if axis == 2:
        return np.array([[max(X[b, m, n].item() for n in range(N)) for m in range(M)] for b in range(B)])
    return np.array([[max(X[b, m, n].item() for m in range(M)) for n in range(N)] for b in range(B)])


# --------------------------------------------------------------------------------------------- cases
X = f32(2, 3, 4)
XI, XL = i32(2, 3, 4), i32(3, 5, dtype=np.int64)
CASES = []
for _op in REDUCERS:
    CASES += [
        (f"{_op}-axis1", _op, [X], {"axes": [1]}, lambda o=_op: ref_reduce(o, X, [1])),
        (f"{_op}-axes02-flat", _op, [X], {"axes": [0, 2], "keepdims": 0},
         lambda o=_op: ref_reduce(o, X, [0, 2], 0)),
        (f"{_op}-neg-dup", _op, [X], {"axes": [-1, 2, 0]}, lambda o=_op: ref_reduce(o, X, [-1, 2, 0])),
        (f"{_op}-all", _op, [X], {}, lambda o=_op: ref_reduce(o, X)),
        (f"{_op}-all-0d", _op, [X], {"keepdims": 0}, lambda o=_op: ref_reduce(o, X, (), 0)),
        (f"{_op}-f64", _op, [X.astype(np.float64)], {"axes": [1]},
         lambda o=_op: ref_reduce(o, X.astype(np.float64), [1])),
        (f"{_op}-empty", _op, [np.zeros((0, 3), np.float32)], {"axes": [0]},
         lambda o=_op: ref_reduce(o, np.zeros((0, 3), np.float32), [0])),
        (f"{_op}-0d-input", _op, [np.array(2.5, np.float32)], {}, lambda o=_op: ref_reduce(o, np.array(2.5))),
    ]
for _op in ("ReduceSum", "ReduceMax", "ReduceMin"):
    CASES += [
        (f"{_op}-int32", _op, [XI], {"axes": [2]}, lambda o=_op: ref_reduce(o, XI, [2])),
        (f"{_op}-int64-flat", _op, [XL], {"axes": [0], "keepdims": 0},
         lambda o=_op: ref_reduce(o, XL, [0], 0)),
    ]
CASES.append(("ReduceMax-int-empty", "ReduceMax", [np.zeros((2, 0), np.int32)], {"axes": [1]},
              lambda: ref_reduce("ReduceMax", np.zeros((2, 0), np.int32), [1])))

LF = rng.integers(0, 3, 12).astype(np.int32)            # per column of X's 2 x 12 view (front)
LB = np.array([4, 0, 1, 3, 2, 4], np.int32)             # per row of X's 6 x 4 view (back)
FB = ("ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean", "ReduceFrontMax",
      "ReduceBackMax")
for _op in FB:
    L = LF if "Front" in _op else LB
    CASES += [(f"{_op}-n{n}", _op, [X], {"num_reduce_dim": n}, lambda o=_op, n=n: ref_front_back(o, X, n))
              for n in (0, 1, 2, 3)]
    CASES += [
        (f"{_op}-default", _op, [X], {}, lambda o=_op: ref_front_back(o, X)),
        (f"{_op}-lengths", _op, [X, L], {}, lambda o=_op, L=L: ref_front_back(o, X, 1, L)),
        (f"{_op}-empty", _op, [np.zeros((0, 3), np.float32)], {},
         lambda o=_op: ref_front_back(o, np.zeros((0, 3)))),
        (f"{_op}-f64", _op, [X.astype(np.float64)], {"num_reduce_dim": 2},
         lambda o=_op: ref_front_back(o, X.astype(np.float64), 2)),
    ]
for _op in FB[:4]:
    L = LF if "Front" in _op else LB
    CASES += [
        (f"{_op}-int", _op, [XI], {"num_reduce_dim": 2}, lambda o=_op: ref_front_back(o, XI, 2)),
        (f"{_op}-int-lengths", _op, [XI, np.maximum(L, 1)], {},
         lambda o=_op, L=L: ref_front_back(o, XI, 1, np.maximum(L, 1))),
    ]
for _op in ("SumElements", "SumSqrElements"):
    CASES += [
        (f"{_op}", _op, [X], {}, lambda o=_op: ref_scalar(o, X)),
        (f"{_op}-avg", _op, [X], {"average": 1}, lambda o=_op: ref_scalar(o, X, 1)),
        (f"{_op}-empty-avg", _op, [np.zeros((0, 2), np.float32)], {"average": 1},
         lambda o=_op: ref_scalar(o, np.zeros((0, 2)), 1)),
        (f"{_op}-f64", _op, [X.astype(np.float64)], {"average": 1}, lambda o=_op: ref_scalar(o, X, 1)),
    ]
CASES += [
    ("SumElementsInt", "SumElementsInt", [XI], {}, lambda: ref_scalar("SumElementsInt", XI)),
    ("RowwiseMax", "RowwiseMax", [X], {}, lambda: ref_max3d(X, 2)),
    ("ColwiseMax", "ColwiseMax", [X], {}, lambda: ref_max3d(X, 1)),
    ("RowwiseMax-empty-batch", "RowwiseMax", [np.zeros((0, 2, 3), np.float32)], {}, lambda: np.zeros((0, 2))),
]


def check(op_type, inputs, args, ref, device):
    got = run_op(op_type, inputs, device=device, **args)
    want = ref()
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == inputs[0].dtype, f"dtype {got.dtype} != {inputs[0].dtype}"
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))
    else:
        tol = 1e-12 if got.dtype == np.float64 else 2e-6
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, ref = case
    check(op_type, inputs, args, ref, device)


def test_zero_lengths_give_identities():
    x = f32(3, 2)
    lengths = np.array([0, 2], np.int32)
    assert list(run_op("ReduceFrontSum", [x, lengths])) == [0.0, pytest.approx(float(x[0, 1] + x[1, 1]))]
    assert np.isnan(run_op("ReduceFrontMean", [x, lengths])[0])
    assert run_op("ReduceFrontMax", [x, lengths])[0] == F32_LOW


# --------------------------------------------------------------------------------------------- bad input
BAD = [
    ("ReduceSum", [X], {"axes": [3]}, ArgumentError, r"axes \[3\] out of range for a 3-D input"),
    ("ReduceMax", [X], {"axes": [-4]}, ArgumentError, r"out of range"),
    ("ReduceMean", [XI], {}, DTypeError, r"ReduceMean needs floating-point input, got int32"),
    ("ReduceL2", [XI], {}, DTypeError, r"floating-point"),
    ("ReduceSum", [X.astype(np.uint8)], {}, DTypeError, r"int32, int64 or floating-point"),
    ("ReduceFrontSum", [X], {"num_reduce_dim": 4}, ArgumentError, r"num_reduce_dim=4 must be in \[0, 3\]"),
    ("ReduceBackMean", [X], {"num_reduce_dim": -1}, ArgumentError, r"num_reduce_dim=-1"),
    ("ReduceBackSum", [X, np.ones(3, np.int32)], {"num_reduce_dim": 2}, ArgumentError, r"must be 1"),
    ("ReduceBackSum", [X, np.ones(5, np.int32)], {}, ShapeError, r"lengths \(5,\).*\(6\)"),
    ("ReduceFrontMax", [X, np.ones(12, np.float32)], {}, DTypeError, r"integer"),
    ("ReduceBackMax", [X, np.full(6, 5, np.int32)], {}, ShapeError, r"in \[0, 4\]"),
    ("ReduceBackSum", [X, np.full(6, -1, np.int32)], {}, ShapeError, r"in \[0, 4\]"),
    ("ReduceBackMean", [XI, np.zeros(6, np.int32)], {}, ArgumentError, r"integer mean"),
    ("ReduceFrontMax", [XI], {}, DTypeError, r"floating-point"),
    ("SumElements", [XI], {}, DTypeError, r"SumElements needs floating-point"),
    ("SumElementsInt", [X], {}, DTypeError, r"integer"),
    ("RowwiseMax", [f32(2, 3)], {}, ShapeError, r"3-D input"),
    ("ColwiseMax", [np.zeros((2, 0, 3), np.float32)], {}, ShapeError, r"empty dimension"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, pattern", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(op_type, inputs, args, error, pattern, device):
    with pytest.raises(error, match=pattern):
        run_op(op_type, inputs, device=device, **args)


@pytest.mark.parametrize("op_type, inputs, args, error, pattern", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_caught_statically(op_type, inputs, args, error, pattern):
    """Every bad input is refused by the shape function too, with the kernel's error, before anything runs.
    (The range of the lengths is a value check: it is made statically because small int tensors carry
    their values.)"""
    with pytest.raises(error, match=pattern):
        infer_static(op_type, inputs, **args)


def test_static_lengths_range_needs_values():
    """Lengths too long to carry their values: the range check waits for the run, the shape is still known."""
    x, lengths = np.zeros((70, 3), np.float32), np.full(70, 9, np.int32)
    (spec,) = infer_static("ReduceBackSum", [x, lengths])
    assert spec.shape == (70,) and spec.dtype == np.float32
    with pytest.raises(ShapeError, match=r"in \[0, 3\]"):
        run_op("ReduceBackSum", [x, lengths])
    (total,) = infer_static("SumElementsInt", [np.array([[1, 2], [3, 4]], np.int32)])
    assert total.shape == () and total.dtype == np.int32 and total.value.tolist() == 10


@pytest.mark.parametrize("op_type", ["ReduceSum", "ReduceFrontSum", "SumElements", "RowwiseMax"])
def test_in_place_refused(op_type):
    with pytest.raises(ArgumentError, match="in place"):
        run_op(op_type, {"x": X}, ["x"])


# --------------------------------------------------------------------------------------------- the tester
@pytest.mark.parametrize("wrong, case", [
    # ReduceSum that ignores the axes, ReduceBackMean that ignores lengths, SumElements that forgets to
    # average, ReduceMin computing a max: each must fail the comparison the table uses.
    (lambda xp, X, **a: X.sum(axis=0, keepdims=True),
     ("ReduceSum", [X], {"axes": [1]}, lambda: ref_reduce("ReduceSum", X, [1]))),
    (lambda xp, X, lengths=None, **a: X.reshape(6, 4).mean(axis=1).reshape(2, 3),
     ("ReduceBackMean", [X, LB], {}, lambda: ref_front_back("ReduceBackMean", X, 1, LB))),
    (lambda xp, X, **a: X.sum(keepdims=True).reshape(()),
     ("SumElements", [X], {"average": 1}, lambda: ref_scalar("SumElements", X, 1))),
    (lambda xp, X, **a: X.max(axis=(1,), keepdims=True),
     ("ReduceMin", [X], {"axes": [1]}, lambda: ref_reduce("ReduceMin", X, [1]))),
], ids=["ReduceSum-ignores-axes", "ReduceBackMean-ignores-lengths", "SumElements-no-average", "ReduceMin-max"])
def test_reference_catches_broken_kernels(wrong, case, broken):
    check(*case, device="cpu")
    broken(case[0], wrong)
    with pytest.raises(AssertionError):
        check(*case, device="cpu")
