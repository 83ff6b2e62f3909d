"""Shape operators (Concat, Split, Slice, Tile, PrependDim, MergeDim, LengthsToShape) against element-by-element
Python references, on every device. The layout operators are in test_layout.py."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, ArityError, DTypeError, ShapeError
from stepnet.testing import DEVICES, infer_alone, make_op, run_op
from stepnet.runtime.workspace import Workspace

RNG = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ints(values, dtype=np.int32):
    return np.array(values, dtype=dtype)


# --------------------------------------------------------------------------------------------- references
def ref_concat(xs, axis):
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = np.empty(shape, xs[0].dtype)
    for idx in np.ndindex(*shape):
        k, i = idx[axis], 0
        while k >= xs[i].shape[axis]:
            k, i = k - xs[i].shape[axis], i + 1
        out[idx] = xs[i][idx[:axis] + (k,) + idx[axis + 1:]]
    return [out, ints([x.shape[axis] for x in xs])]


def ref_stack(xs, axis):
    shape = list(xs[0].shape)
    shape.insert(axis, len(xs))
    out = np.empty(shape, xs[0].dtype)
    for idx in np.ndindex(*shape):
        out[idx] = xs[idx[axis]][idx[:axis] + idx[axis + 1:]]
    return [out, ints([1] * len(xs))]


def ref_split(x, sizes, axis):
    parts, offset = [], 0
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        part = np.empty(shape, x.dtype)
        for idx in np.ndindex(*shape):
            part[idx] = x[idx[:axis] + (idx[axis] + offset,) + idx[axis + 1:]]
        parts.append(part)
        offset += s
    return parts


def ref_unstack(x, axis):
    parts = []
    for k in range(x.shape[axis]):
        shape = x.shape[:axis] + x.shape[axis + 1:]
        part = np.empty(shape, x.dtype)
        for idx in np.ndindex(*shape):
            part[idx] = x[idx[:axis] + (k,) + idx[axis:]]
        parts.append(part)
    return parts


def ref_window(x, ranges):
    """x restricted to [lo, hi) per dimension (ranges worked out by hand from Caffe2's rule)."""
    ranges = list(ranges) + [(0, d) for d in x.shape[len(ranges):]]
    shape = [hi - lo for lo, hi in ranges]
    out = np.empty(shape, x.dtype)
    for idx in np.ndindex(*shape):
        out[idx] = x[tuple(lo + i for (lo, _), i in zip(ranges, idx, strict=True))]
    return out


def ref_tile(x, tiles, axis):
    shape = list(x.shape)
    shape[axis] *= tiles
    out = np.empty(shape, x.dtype)
    for idx in np.ndindex(*shape):
        out[idx] = x[idx[:axis] + (idx[axis] % x.shape[axis],) + idx[axis + 1:]]
    return out


# --------------------------------------------------------------------------------------------- the table
X234 = rand(2, 3, 4)
A, B, C = rand(2, 3), rand(2, 1), rand(2, 2)
I6 = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
NCHW = rand(2, 3, 2, 2)

CASES = [
    # (id, op, inputs, args, reference outputs)
    ("concat_axis1", "Concat", [A, B, C], {"axis": 1}, ref_concat([A, B, C], 1)),
    ("concat_default_order", "Concat", [A, B], {}, ref_concat([A, B], 1)),
    ("concat_axis0_int", "Concat", [I6, I6[:1]], {"axis": 0}, ref_concat([I6, I6[:1]], 0)),
    ("concat_negative_axis", "Concat", [X234, X234[:, :, :2]], {"axis": -1},
     ref_concat([X234, X234[:, :, :2]], 2)),
    ("concat_nhwc", "Concat", [NCHW, NCHW[..., :1]], {"order": "NHWC"}, ref_concat([NCHW, NCHW[..., :1]], 3)),
    ("concat_stack", "Concat", [A, A * 2, A * 3], {"axis": 1, "add_axis": 1},
     ref_stack([A, A * 2, A * 3], 1)),
    ("concat_stack_end", "Concat", [A, C[:, :1].repeat(3, 1)], {"axis": -1, "add_axis": 1},
     ref_stack([A, C[:, :1].repeat(3, 1)], 2)),
    ("split_arg", "Split", [X234], {"axis": 2, "split": [1, 3]}, ref_split(X234, [1, 3], 2)),
    ("split_equal", "Split", [X234], {"axis": 2}, ref_split(X234, [2, 2], 2)),
    ("split_default_axis", "Split", [X234], {"split": [2, 0, 1]}, ref_split(X234, [2, 0, 1], 1)),
    ("split_input", "Split", [X234, ints([1, 1, 1])], {"axis": 1}, ref_split(X234, [1, 1, 1], 1)),
    ("split_add_axis", "Split", [X234], {"axis": 1, "add_axis": 1}, ref_unstack(X234, 1)),
    ("slice_doc", "Slice", [ints([[1, 2, 3, 4], [5, 6, 7, 8]])], {"starts": [0, 1], "ends": [-1, 3]},
     [ints([[2, 3], [6, 7]])]),
    ("slice_leading", "Slice", [X234], {"starts": [1], "ends": [2]}, [ref_window(X234, [(1, 2)])]),
    ("slice_negative", "Slice", [X234], {"starts": [0, -3, 1], "ends": [-1, -1, -2]},
     [ref_window(X234, [(0, 2), (1, 3), (1, 3)])]),
    ("slice_clipped", "Slice", [X234], {"starts": [0, 0, 2], "ends": [5, 9, 9]},
     [ref_window(X234, [(0, 2), (0, 3), (2, 4)])]),
    ("slice_inputs", "Slice", [X234, ints([0, 1], np.int64), ints([2, 3], np.int64)], {},
     [ref_window(X234, [(0, 2), (1, 3)])]),
    ("tile_axis1", "Tile", [X234], {"tiles": 3, "axis": 1}, [ref_tile(X234, 3, 1)]),
    ("tile_axis0", "Tile", [A], {"tiles": 2, "axis": 0}, [ref_tile(A, 2, 0)]),
    ("tile_inputs", "Tile", [X234, ints([2]), ints([-1])], {}, [ref_tile(X234, 2, 2)]),
    ("tile_input_tiles", "Tile", [I6, ints([2], np.int64)], {"axis": 0}, [ref_tile(I6, 2, 0)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, expected = case
    check(op_type, inputs, args, expected, device)


# --------------------------------------------------------------------------------------------- storage rules
def _run_in_ws(op_type, out="Y", **args):
    ws = Workspace()
    ws.feed("X", X234)
    ws.run_operator_once(make_op(op_type, ["X"], [out], **args))
    return ws.get_blob("X").value, ws.get_blob(out).value


@pytest.mark.parametrize("op_type,args", [("Slice", {"starts": [0], "ends": [-1]}), ("Tile",
                                           {"tiles": 1, "axis": 0})])
def test_outputs_are_fresh(op_type, args):
    x, y = _run_in_ws(op_type, **args)
    assert not np.shares_memory(x, y), f"{op_type} returned a view of its input"


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("Concat", [A, rand(3, 3)], {"axis": 1}, ShapeError, r"input 1 has shape \(3, 3\).*\(2, 3\)"),
    ("Concat", [A, A.astype(np.float64)], {"axis": 0}, DTypeError, "same type"),
    ("Concat", [A], {"axis": 1, "order": "NCHW"}, ArgumentError, "either 'axis' or 'order'"),
    ("Concat", [A], {"axis": 2}, ArgumentError, "axis=2 is out of range"),
    ("Split", [X234], {"axis": 2, "split": [1, 2]}, ShapeError, r"sum to dimension 2 of X \(4\)"),
    ("Split", [X234, ints([1, 2])], {"axis": 1, "split": [1, 2]}, ArgumentError, "do not also pass"),
    ("Split", [X234, ints([1.0, 2.0], np.float32)], {"axis": 1}, DTypeError, "must hold integers"),
    ("Slice", [X234], {"starts": [0, 2], "ends": [1, 1]}, ShapeError, r"dimension 1.*reversed"),
    ("Slice", [X234], {"starts": [0]}, ArgumentError, "needs 'starts' and 'ends'"),
    ("Slice", [X234], {"starts": [0, 0, 0, 0], "ends": [1, 1, 1, 1]}, ShapeError, "only 3"),
    ("Slice", [X234, ints([0])], {}, ArityError, "starts and ends"),
    ("Tile", [A], {"tiles": 2}, ArgumentError, "'axis' is missing"),
    ("Tile", [A, ints([[2]])], {"axis": 0}, ShapeError, "vector of size 1"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,args,error,message", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, message, device):
    outputs = 2 if op_type in ("Split", "Reshape", "Concat") else 1
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, outputs, device=device, **args)


@pytest.mark.parametrize("op_type,inputs,args,error,message", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, args, error, message):
    """The shape functions raise the kernels' errors, before anything runs."""
    outputs = 2 if op_type in ("Split", "Reshape", "Concat") else 1
    with pytest.raises(error, match=message):
        infer_alone(op_type, inputs, outputs, **args)


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("op_type,wrong", [
    ("Concat", lambda xp, *xs, axis, order, add_axis, **_: (xp.concatenate(xs[::-1], axis=1),
                                                            xp.asarray(np.array([3, 1, 2], np.int32)))),
    ("Slice", lambda xp, x, *b, starts, ends: x[1:2].copy()),          # off by one on the start
])
def test_reference_detects_broken_kernel(op_type, wrong, broken):
    case = {"Concat": "concat_axis1", "Slice": "slice_doc"}[op_type]
    _, _, inputs, args, expected = CASES[[c[0] for c in CASES].index(case)]
    check(op_type, inputs, args, expected, "cpu")   # the real kernel passes ...
    broken(op_type, wrong)
    with pytest.raises(AssertionError):             # ... the wrong one does not
        check(op_type, inputs, args, expected, "cpu")


# --------------------------------------------------------------------------------------------- leading dims
def ref_prepend(x, k):
    """Element (a, b, rest...) of the result is X[a * (d0 / k) + b, rest...]."""
    out = np.empty((k, x.shape[0] // k) + x.shape[1:], x.dtype)
    for idx in np.ndindex(*out.shape):
        out[idx] = x[(idx[0] * out.shape[1] + idx[1],) + idx[2:]]
    return out


def ref_merge(x):
    out = np.empty((x.shape[0] * x.shape[1],) + x.shape[2:], x.dtype)
    for idx in np.ndindex(*x.shape):
        out[(idx[0] * x.shape[1] + idx[1],) + idx[2:]] = x[idx]
    return out


X64 = rand(6, 2, 2)
DIM_CASES = [
    ("prepend", "PrependDim", [X64], {"dim_size": 3}, [ref_prepend(X64, 3)]),
    ("prepend_int", "PrependDim", [I6], {"dim_size": 2}, [ref_prepend(I6, 2)]),
    ("merge", "MergeDim", [X234], {}, [ref_merge(X234)]),
    ("merge_2d", "MergeDim", [A], {}, [ref_merge(A)]),
    ("lengths_to_shape", "LengthsToShape", [ints([200, 200, 200])], {}, [ints([3, 200])]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", DIM_CASES, ids=[c[0] for c in DIM_CASES])
def test_leading_dims_against_reference(case, device):
    _, op_type, inputs, args, expected = case
    check(op_type, inputs, args, expected, device)


def test_prepend_dim_gradient_is_merge_dim():
    from stepnet.passes.gradients import backward_ops
    from stepnet.testing import check_gradient
    ops, _ = backward_ops([make_op("PrependDim", ["x"], ["y"], dim_size=3)], {"y": "y_grad"})
    assert [(o.type, list(o.input), list(o.output), len(o.arg)) for o in ops] == \
        [("MergeDim", ["y_grad"], ["x_grad"], 0)]                 # Caffe2 copies no arguments to it
    check_gradient("PrependDim", [X64.astype(np.float64)], dim_size=2)


DIM_BAD = [
    ("PrependDim", [X64], {"dim_size": 4}, ShapeError, "not a multiple of dim_size 4"),
    ("PrependDim", [X64], {}, ArgumentError, "dim_size must be > 0"),
    ("PrependDim", [np.float32(1)], {"dim_size": 1}, ShapeError, "at least 1-D"),
    ("MergeDim", [I6[0, 0]], {}, ShapeError, "at least 2-D"),
    ("LengthsToShape", [ints([2, 3])], {}, ShapeError, "all lengths must be equal"),
    ("LengthsToShape", [ints([], np.int32)], {}, ShapeError, "non-empty vector"),
    ("LengthsToShape", [ints([2, 2], np.int64)], {}, DTypeError, "int32"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,args,error,message", DIM_BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(DIM_BAD)])
def test_leading_dims_bad_inputs(op_type, inputs, args, error, message, device):
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, device=device, **args)
    with pytest.raises(error, match=message):
        infer_alone(op_type, inputs, **args)


@pytest.mark.parametrize("case_id,wrong", [
    ("prepend", lambda xp, x, *, dim_size: xp.transpose(x.reshape(x.shape[0] // dim_size, dim_size, *x.shape[1:]),
                                                        (1, 0, 2, 3)).copy()),
    ("lengths_to_shape", lambda xp, lengths: xp.asarray(np.array([lengths[0], len(lengths)], np.int32))),
])
def test_leading_dims_reference_detects_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, expected = DIM_CASES[[c[0] for c in DIM_CASES].index(case_id)]
    check(op_type, inputs, args, expected, "cpu")
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, expected, "cpu")
