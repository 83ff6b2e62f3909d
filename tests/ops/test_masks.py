"""BooleanMask (+ its gradient), BooleanMaskLengths, BooleanUnmask, Where and IsMemberOf (stepnet/ops/masks.py)
against loop references written here from Caffe2's docs, on every device; BooleanMask's gradient against
float64 finite differences; statically known masks give exact output shapes; bad inputs; broken kernels."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.io.proto import DataType
from stepnet.ops import REGISTRY
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, check_gradient, infer_alone, infer_static, make_op, run_op

rng = np.random.default_rng(5)


# --------------------------------------------------------------------------------------------- references
def ref_mask(data, mask):
    rows = [i for i in range(len(mask)) if mask[i]]
    out = np.zeros((len(rows),) + data.shape[1:], data.dtype)
    for r, i in enumerate(rows):
        out[r] = data[i]
    return [out, np.array(rows, np.int64)]


def ref_mask_grad(mask, dy):
    out, r = np.zeros((len(mask),) + dy.shape[1:], dy.dtype), 0
    for i, flag in enumerate(mask):
        if flag:
            out[i], r = dy[r], r + 1
    return out


def ref_lengths(lengths, mask):
    out, p = [], 0
    for n in lengths:
        out.append(sum(1 for j in range(p, p + n) if mask[j]))
        p += n
    return np.array(out, lengths.dtype)


def ref_unmask(*pairs):
    masks, values = pairs[0::2], pairs[1::2]
    used = [0] * len(masks)
    out = []
    for i in range(len(masks[0])):
        k = next(k for k, m in enumerate(masks) if m[i])
        out.append(values[k][used[k]])
        used[k] += 1
    return np.array(out, values[0].dtype)


def ref_where(c, x, y, rows=False):
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape):
        out[idx] = x[idx] if (c[idx[0]] if rows else c[idx]) else y[idx]
    return out


def ref_member(x, values):
    return np.array([v in set(values) for v in x.reshape(-1).tolist()], bool).reshape(x.shape)


D = rng.uniform(-2, 2, (5, 2, 3)).astype(np.float32)
M = np.array([True, False, True, True, False])
L = np.array([2, 0, 3], np.int32)
C = np.array([[True, False, True], [False, False, True]])
X = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
Y = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
U = [np.array([True, False, True, False, False]), np.array([1.5, 3.5], np.float32),
     np.array([False, True, False, False, True]), np.array([2.5, 5.5], np.float32),
     np.array([True, True, False, True, True]), np.array([4.5], np.float32)]
I64 = np.array([[0, 3, 7], [4, 4, 9]], np.int64)

CASES = [   # (id, op, inputs, args, expected outputs)
    ("mask", "BooleanMask", [D, M], {}, ref_mask(D, M)),
    ("mask_1d_int", "BooleanMask", [np.arange(5, dtype=np.int32), M], {}, ref_mask(np.arange(5, dtype=np.int32), M)),
    ("mask_none", "BooleanMask", [D, np.zeros(5, bool)], {}, ref_mask(D, np.zeros(5, bool))),
    ("mask_grad", "BooleanMaskGradient", [M, D[:3]], {}, [ref_mask_grad(M, D[:3])]),
    ("mask_lengths", "BooleanMaskLengths", [L, M], {}, [ref_lengths(L, M)]),
    ("mask_lengths_int64", "BooleanMaskLengths", [L.astype(np.int64), M], {}, [ref_lengths(L.astype(np.int64), M)]),
    ("unmask", "BooleanUnmask", U, {}, [ref_unmask(*U)]),
    ("unmask_one_pair", "BooleanUnmask", [np.ones(3, bool), np.arange(3, dtype=np.int64)], {},
     [np.arange(3, dtype=np.int64)]),
    ("where", "Where", [C, X, Y], {}, [ref_where(C, X, Y)]),
    ("where_rows", "Where", [C[:, 0], X, Y], {"broadcast_on_rows": True}, [ref_where(C[:, 0], X, Y, True)]),
    ("where_rows_1d", "Where", [C[0], X[0], Y[0]], {"broadcast_on_rows": True}, [ref_where(C[0], X[0], Y[0], True)]),
    ("where_int", "Where", [C, I64, -I64], {}, [ref_where(C, I64, -I64)]),
    ("member", "IsMemberOf", [I64], {"value": [3, 4, 8]}, [ref_member(I64, [3, 4, 8])]),
    ("member_int32", "IsMemberOf", [I64.astype(np.int32)], {"value": [0, 9], "dtype": DataType.INT32},
     [ref_member(I64, [0, 9])]),
    ("member_bool", "IsMemberOf", [M], {"value": [1]}, [M.copy()]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device, 0.0)


def test_hand_computed_cases():
    assert run_op("BooleanMaskLengths", [np.array([1, 3, 2], np.int32),
                                         np.array([False, True, True, False, True, True])]).tolist() == [0, 2, 2]
    got = run_op("BooleanUnmask", [np.array([True, False]), np.array([1.0], np.float32),
                                   np.array([True, True]), np.array([2.0], np.float32)])
    assert got.tolist() == [1.0, 2.0]           # the second mask's first true position is taken already
    assert run_op("BooleanMask", [np.array([1, 2, 3, 4, 5, 6]), np.array([1, 0, 0, 1, 1, 0], bool)], 2)[1].tolist() \
        == [0, 3, 4]


def test_strings():
    words = np.array([b"a", b"bb", b"c"], dtype=object)
    assert run_op("IsMemberOf", [words], value=["bb", "c"]).tolist() == [False, True, True]
    out = run_op("Where", [np.array([True, False, False]), words, np.array([b"x"] * 3, dtype=object)])
    assert out.tolist() == [b"a", b"x", b"x"]
    assert run_op("BooleanMask", [words, np.array([False, True, True])]).tolist() == [b"bb", b"c"]
    assert run_op("BooleanUnmask", [np.array([True, False, True]), words[:2],
                                    np.array([False, True, False]), words[2:]]).tolist() == [b"a", b"c", b"bb"]


# --------------------------------------------------------------------------------------------- static shapes
def test_a_known_mask_gives_exact_shapes():
    known = infer_alone("BooleanMask", {"d": D, "m": M}, ["y", "i"])
    assert known["y"].shape == (3, 2, 3) and known["i"].shape == (3,)
    assert known["i"].value.tolist() == [0, 2, 3]
    d = infer_static("BooleanMask", [D, M.astype(np.float32) > 0])[0]
    assert d.dtype == np.float32


# --------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(5,), (5, 2, 3)])
def test_mask_gradient_matches_finite_differences(shape, device):
    check_gradient("BooleanMask", [rng.standard_normal(shape), M], 1, wrt=[0], device=device)


def test_makers():
    ops, grads = backward_ops([make_op("BooleanMask", ["d", "m"], ["y", "i"])], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("BooleanMaskGradient", ["m", "y_grad"],
                                                                       ["d_grad"])]
    assert grads["d"] == "d_grad"
    for op_type in ("BooleanMaskLengths", "BooleanUnmask"):
        assert REGISTRY.get(op_type).gradient == "no_gradient"
    for op_type in ("Where", "IsMemberOf"):
        assert REGISTRY.get(op_type).gradient == "should_not_do_gradient"


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("BooleanMask", [D, M[:4]], {}, ShapeError, "MASK has 4 entries but DATA"),
    ("BooleanMask", [D, M.astype(np.int32)], {}, DTypeError, "MASK must be a bool tensor"),
    ("BooleanMask", [D, C], {}, ShapeError, "MASK must be a 1-D vector"),
    ("BooleanMask", [np.float32(1), M[:1]], {}, ShapeError, "at least 1-D"),
    ("BooleanMaskGradient", [M, D[:2]], {}, ShapeError, "3 true entries but dY"),
    ("BooleanMaskLengths", [L[:2], M], {}, ShapeError, "sum to 2 but the mask has 5"),
    ("BooleanMaskLengths", [np.array([6, -1], np.int32), M], {}, ShapeError, "lengths must be >= 0"),
    ("BooleanMaskLengths", [L.astype(np.float32), M], {}, DTypeError, "int32 or int64"),
    ("BooleanUnmask", U[:3], {}, ArityError, "odd number"),
    ("BooleanUnmask", U[:2] + [U[2][:4], U[3]], {}, ShapeError, "mask input 2 has 4 entries"),
    ("BooleanUnmask", U[:4], {}, ShapeError, "every mask is false at position 3"),
    ("BooleanUnmask", U[:2] + [U[2], U[3][:1]], {}, ShapeError, "first true mask at 2 positions but values input 3"),
    ("BooleanUnmask", U[:2] + [U[2], U[3].astype(np.float64)], {}, DTypeError, "must share one type"),
    ("Where", [C, X, Y.astype(np.float64)], {}, DTypeError, "must share one type"),
    ("Where", [C[:, :2], X, Y], {}, ShapeError, "must have the shape of X and Y"),
    ("Where", [C, X, Y], {"broadcast_on_rows": True}, ShapeError, "one entry per row"),
    ("Where", [C.astype(np.int32), X, Y], {}, DTypeError, "C must be a bool tensor"),
    ("IsMemberOf", [X], {"value": [1]}, DTypeError, "int32, int64, bool or string"),
    ("IsMemberOf", [I64], {"value": [1.5]}, ArgumentError, "must hold integers"),
    ("IsMemberOf", [I64], {"value": [1], "dtype": DataType.INT32}, DTypeError, "'dtype' is INT32 but X is int64"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, match, device):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, device=device, **args)


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id, wrong", [
    ("mask", lambda xp, d, m: (d[:3], xp.arange(3, dtype=np.int64))),
    ("mask_lengths", lambda xp, lengths, m: lengths),
    ("unmask", lambda xp, *p: xp.concatenate(p[1::2])),
    ("where_rows", lambda xp, c, x, y, *, broadcast_on_rows: xp.where(c[:, None] == 0, x, y)),
    ("member", lambda xp, x, *, value, dtype: x > 3),
])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu", 0.0)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu", 0.0)


def test_check_gradient_catches_a_broken_mask_gradient(broken):
    good = REGISTRY.get("BooleanMaskGradient").kernel
    broken("BooleanMaskGradient", lambda xp, m, dy: good(xp, m[::-1].copy(), dy))
    with pytest.raises(AssertionError, match="BooleanMask: gradient of input 0"):
        check_gradient("BooleanMask", [rng.standard_normal((5, 2)), M], 1, wrt=[0])


@pytest.mark.parametrize("index", range(len(BAD)), ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(index):
    """The shape functions raise the kernels' errors before anything runs (the inputs' values are known)."""
    op_type, inputs, *args, error, match = BAD[index]
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs, **(args[0] if args else {}))
