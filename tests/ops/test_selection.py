"""TopK, TopKGradient, FlexibleTopK (+ gradient), RowWiseArgMax and FillExamplesWithIndicator
(stepnet/ops/selection.py) against loop references written here (Caffe2's operator_test/top_k_test.py and
flexible_top_k_test.py sort each row by value, ties by index, the same way) on every device; k given as an
input makes the output shapes depend on its value (static inference then leaves them unknown, unless the value
is known); the gradients against float64 finite differences; bad inputs; broken kernels caught."""
import math

import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.io.proto import NetDef, argument_value
from stepnet.core.spec import TensorSpec
from stepnet.passes.shapes import infer_net
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

rng = np.random.default_rng(41)


# --------------------------------------------------------------------------------------------- references
def ref_topk(x, k, axis=-1):
    """For every line of x along `axis`: the positions sorted by (-value, position), the first k kept, padded
    with value 0 / index -1; and each pick's index into x flattened (-1 for padding)."""
    axis %= x.ndim
    out_shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    values, indices, flat = np.zeros(out_shape, x.dtype), np.full(out_shape, -1, np.int64), \
        np.full(out_shape, -1, np.int64)
    for outer in np.ndindex(*x.shape[:axis]):
        for inner in np.ndindex(*x.shape[axis + 1:]):
            line = [float(x[outer + (i,) + inner]) for i in range(x.shape[axis])]
            order = sorted(range(len(line)), key=lambda i: (-line[i], i))[:k]
            for r, i in enumerate(order):
                at = outer + (r,) + inner
                values[at], indices[at] = line[i], i
                flat[at] = np.ravel_multi_index(outer + (i,) + inner, x.shape)
    return [values, indices, flat.reshape(-1)]


def ref_topk_grad(dvalues, indices, x_shape, axis=-1):
    axis %= len(x_shape)
    out = np.zeros(x_shape, dvalues.dtype)
    for at in np.ndindex(*dvalues.shape):
        i = int(indices[at])
        if i >= 0:
            out[at[:axis] + (i,) + at[axis + 1:]] = dvalues[at]
    return out


def ref_fill(data, indicator):
    out, row = np.zeros((len(indicator),) + data.shape[1:], data.dtype), 0
    for i, flag in enumerate(indicator.tolist()):
        if flag:
            out[i] = data[row]
            row += 1
    return out


TIES = np.array([[3, 1, 3, 2, 3], [0, 5, 5, -1, 5]], np.float32)
X = rng.uniform(-3, 3, (3, 4, 5)).astype(np.float32)
K2 = np.array([2], np.int64)
DATA = rng.uniform(-3, 3, (3, 2, 2)).astype(np.float32)
IND = np.array([0, 1, 1, 0, 0, 1], np.int32)

CASES = [   # (id, op, inputs, args, expected outputs)
    ("topk", "TopK", [X], {"k": 3}, ref_topk(X, 3)),
    ("topk_ties", "TopK", [TIES], {"k": 4}, ref_topk(TIES, 4)),
    ("topk_k_past_the_end", "TopK", [TIES], {"k": 7}, ref_topk(TIES, 7)),
    ("topk_axis0", "TopK", [X], {"k": 2, "axis": 0}, ref_topk(X, 2, 0)),
    ("topk_axis1_double", "TopK", [X.astype(np.float64)], {"k": 1, "axis": 1}, ref_topk(X.astype(np.float64), 1, 1)),
    ("topk_k_input", "TopK", [X, K2], {}, ref_topk(X, 2)),
    ("topk_k_input_int32", "TopK", [TIES, np.array([1], np.int32)], {}, ref_topk(TIES, 1)),
    ("topk_1d", "TopK", [X[0, 0]], {"k": 5}, ref_topk(X[0, 0], 5)),
    ("topk_empty_axis", "TopK", [np.zeros((2, 0), np.float32)], {"k": 2}, ref_topk(np.zeros((2, 0), np.float32), 2)),
    ("topk_grad", "TopKGradient", [TIES[:, :3] * 10, ref_topk(TIES, 3)[1], TIES], {},
     [ref_topk_grad(TIES[:, :3] * 10, ref_topk(TIES, 3)[1], TIES.shape)]),
    ("topk_grad_padded", "TopKGradient", [np.ones((2, 7), np.float32), ref_topk(TIES, 7)[1], TIES], {"k": 7},
     [ref_topk_grad(np.ones((2, 7), np.float32), ref_topk(TIES, 7)[1], TIES.shape)]),
    ("topk_grad_axis0", "TopKGradient", [ref_topk(X, 2, 0)[0], ref_topk(X, 2, 0)[1], X], {"axis": 0},
     [ref_topk_grad(ref_topk(X, 2, 0)[0], ref_topk(X, 2, 0)[1], X.shape, 0)]),
    ("fill", "FillExamplesWithIndicator", [DATA, IND], {}, [ref_fill(DATA, IND)]),
    ("fill_bool_1d", "FillExamplesWithIndicator", [np.array([1, 2], np.int64), np.array([True, False, True])], {},
     [ref_fill(np.array([1, 2], np.int64), np.array([True, False, True]))]),
    ("fill_none", "FillExamplesWithIndicator", [DATA[:0], np.zeros(4, np.int64)], {},
     [np.zeros((4, 2, 2), np.float32)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device, 0.0)


def test_two_outputs_leave_out_the_flat_indices():
    values, indices = run_op("TopK", [TIES], 2, k=2)
    want = ref_topk(TIES, 2)
    np.testing.assert_array_equal(values, want[0])
    np.testing.assert_array_equal(indices, want[1])


# --------------------------------------------------------------------------------------------- static shapes
def infer(op_type, specs, outputs, **args):
    net = NetDef(name="static")
    net.op.append(make_op(op_type, list(specs), outputs, **args))
    return infer_net(net, specs)


def test_k_from_an_input_of_unknown_value_makes_the_shapes_unknown():
    """TopK's outputs depend on the value of k when it is an input; inference says so, and knows them when k
    is an argument or a known constant."""
    x = TensorSpec((3, 4, 5), np.dtype(np.float32))
    unknown = infer("TopK", {"x": x, "k": TensorSpec((1,), np.dtype(np.int64))}, ["v", "i", "f"])
    assert [unknown[n].shape for n in "vif"] == [None, None, None]
    assert (unknown["v"].dtype, unknown["i"].dtype) == (np.float32, np.int64)
    known = infer("TopK", {"x": x, "k": TensorSpec((1,), np.dtype(np.int64), np.array([2]))}, ["v", "i", "f"])
    assert [known[n].shape for n in "vif"] == [(3, 4, 2), (3, 4, 2), (24,)]
    by_arg = infer("TopK", {"x": x}, ["v", "i"], k=3, axis=1)
    assert by_arg["v"].shape == (3, 3, 5) and by_arg["i"].dtype == np.int64


# --------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, args", [((3, 5), {"k": 2}), ((2, 4, 3), {"k": 6, "axis": 1}), ((6,), {"k": 6})])
def test_gradient_matches_finite_differences(shape, args, device):
    x = rng.permutation(math.prod(shape)).reshape(shape) * 0.37 + rng.uniform(0, 0.01, shape)   # no ties
    check_gradient("TopK", [x], 2, outputs_with_grads=[0], device=device, **args)


def test_gradient_with_k_as_an_input():
    x = rng.permutation(12).reshape(3, 4) * 1.0
    check_gradient("TopK", [x, K2], 3, outputs_with_grads=[0], wrt=[0])


def test_maker_emits_caffe2s_op():
    ops, grads = backward_ops([make_op("TopK", ["x"], ["v", "i"], k=2)], {"v": "v_grad"})
    assert [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops] == \
        [("TopKGradient", ["v_grad", "i", "x"], ["x_grad"], {"k": 2})]
    assert grads["x"] == "x_grad"
    assert REGISTRY.get("FillExamplesWithIndicator").gradient is None   # not registered in open Caffe2


# --------------------------------------------------------------------------------------------- bad inputs
BAD = [
    ("TopK", [X], {}, ArgumentError, "TopK needs k >= 1, got -1"),
    ("TopK", [X], {"k": 0}, ArgumentError, "k >= 1, got 0"),
    ("TopK", [X, np.array([0], np.int64)], {}, ArgumentError, r"k >= 1, got 0 .*input 1"),
    ("TopK", [X, np.array([1.5])], {}, DTypeError, "input 1 .* integer"),
    ("TopK", [X], {"k": 2, "axis": 3}, ArgumentError, "axis=3 is out of range"),
    ("TopK", [X.astype(np.int32)], {"k": 2}, DTypeError, "TopK needs floating-point"),
    ("TopK", [np.float32(2.0)], {"k": 1}, ShapeError, "at least 1 dimension"),
    ("TopKGradient", [TIES[:, :2], ref_topk(TIES, 3)[1], TIES], {}, ShapeError, "must agree except on axis"),
    ("TopKGradient", [TIES[:, :2], np.full((2, 2), 9, np.int64), TIES], {}, ShapeError, r"outside -1..4"),
    ("TopKGradient", [TIES[:, :2], TIES[:, :2], TIES], {}, DTypeError, "Indices must be int64"),
    ("FillExamplesWithIndicator", [DATA, IND[:5]], {}, ShapeError, "2 non-zero entries but DATA .* 3 rows"),
    ("FillExamplesWithIndicator", [DATA, IND.reshape(2, 3)], {}, ShapeError, "1-D vector"),
    ("FillExamplesWithIndicator", [DATA, IND.astype(np.float32)], {}, DTypeError, "int32, int64 or bool"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, match, device):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, 2 if op_type == "TopK" else 1, device=device, **args)


@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_found_statically(op_type, inputs, args, error, match):
    with pytest.raises(error, match=match):
        infer_alone(op_type, inputs, 2 if op_type == "TopK" else 1, **args)


# ------------------------------------------------------------------------------------------ test the tester
GOOD_TOPK = REGISTRY.get("TopK").kernel


def ties_by_last_index(xp, x, *k_in, k, axis):
    """TopK over the reversed last axis, indices mapped back: equal values come out last index first."""
    v, i, f = GOOD_TOPK(xp, x[..., ::-1].copy(), *k_in, k=k, axis=axis)
    return v, xp.where(i >= 0, x.shape[-1] - 1 - i, i), f


def pads_with_zero(xp, x, *k_in, k, axis):
    v, i, f = GOOD_TOPK(xp, x, *k_in, k=k, axis=axis)
    return v, xp.maximum(i, 0), f


@pytest.mark.parametrize("case_id, wrong", [
    ("topk_ties", ties_by_last_index),
    ("topk_k_past_the_end", pads_with_zero),
    ("topk_grad", lambda xp, v, i, x, *, axis, k: xp.zeros_like(x)),
    ("fill", lambda xp, data, ind: xp.concatenate([data, xp.zeros((3, 2, 2), data.dtype)])),
])
def test_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu", 0.0)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu", 0.0)


def test_check_gradient_catches_a_broken_topk_gradient(broken):
    x = rng.permutation(15).reshape(3, 5) * 1.0
    check_gradient("TopK", [x], 2, outputs_with_grads=[0], k=2)
    good = REGISTRY.get("TopKGradient").kernel
    broken("TopKGradient", lambda xp, v, i, x, *, axis, k: good(xp, v, xp.zeros_like(i), x, axis=axis, k=k))
    with pytest.raises(AssertionError, match="TopK: gradient of input 0"):
        check_gradient("TopK", [x], 2, outputs_with_grads=[0], k=2)


# --------------------------------------------------------------------------------------------- FlexibleTopK
def ref_flexible(x, ks):
    """Per row of x's last dimension: positions sorted by (-value, position), the first k kept; all rows'
    values and positions concatenated."""
    rows = x.reshape(-1, x.shape[-1])
    values, indices = [], []
    for row, k in zip(rows, ks):
        order = sorted(range(len(row)), key=lambda j: (-float(row[j]), j))[:k]
        values += [row[j] for j in order]
        indices += order
    return [np.array(values, x.dtype), np.array(indices, np.int64)]


def ref_flexible_grad(x, ks, dvalues, indices):
    out, p = np.zeros(x.shape[:-1] + (x.shape[-1],), dvalues.dtype).reshape(-1, x.shape[-1]), 0
    for i, k in enumerate(ks):
        for j in range(k):
            out[i, indices[p + j]] = dvalues[p + j]
        p += k
    return out.reshape(x.shape)


def ref_rowwise_argmax(x):
    return np.array([[max(range(x.shape[1]), key=lambda j: (x[i, j], -j))] for i in range(x.shape[0])], np.int32)


KS = np.array([1, 3, 5, 2], np.int64)
XF = rng.uniform(-3, 3, (2, 2, 5)).astype(np.float32)
XF[0, 1, 3] = XF[0, 1, 0]                                    # a tie
FLEX = ref_flexible(XF, KS)
ROWS = np.array([[4.2, 6, 3.1], [10, 20, 40.4], [100.01, 25, 3], [2, 2, 1]], np.float32)

FLEX_CASES = [
    ("flexible", "FlexibleTopK", [XF, KS], {}, FLEX),
    ("flexible_ties", "FlexibleTopK", [TIES, np.array([4, 5], np.int64)], {}, ref_flexible(TIES, [4, 5])),
    ("flexible_1d", "FlexibleTopK", [XF[0, 0], np.array([2], np.int64)], {}, ref_flexible(XF[0, 0], [2])),
    ("flexible_grad", "FlexibleTopKGradient", [XF, KS, FLEX[0] * 3, FLEX[1]], {},
     [ref_flexible_grad(XF, KS, FLEX[0] * 3, FLEX[1])]),
    ("rowwise_argmax", "RowWiseArgMax", [ROWS], {}, [ref_rowwise_argmax(ROWS)]),
    ("rowwise_argmax_1x1", "RowWiseArgMax", [np.ones((1, 1), np.float32)], {}, [np.zeros((1, 1), np.int32)]),
    ("rowwise_argmax_empty", "RowWiseArgMax", [np.ones((0, 3), np.float32)], {}, [np.zeros((0, 1), np.int32)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FLEX_CASES, ids=[c[0] for c in FLEX_CASES])
def test_flexible_and_rowwise_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device, 0.0)


def test_rowwise_argmax_passes_over_nan_as_caffe2_scans():
    x = np.array([[1, np.nan, 3], [np.nan, 5, 6], [2, np.nan, -1]], np.float32)
    assert run_op("RowWiseArgMax", [x]).reshape(-1).tolist() == [2, 0, 0]


def test_flexible_shapes_follow_known_k():
    specs = infer_alone("FlexibleTopK", {"x": XF, "k": KS}, ["v", "i"])
    assert specs["v"].shape == (11,) and specs["i"].dtype == np.int64
    x = TensorSpec((4, 5), np.dtype(np.float32))
    unknown = infer("FlexibleTopK", {"x": x, "k": TensorSpec((4,), np.dtype(np.int64))}, ["v", "i"])
    assert unknown["v"].shape is None and unknown["v"].dtype == np.float32


@pytest.mark.parametrize("device", DEVICES)
def test_flexible_gradient_matches_finite_differences(device):
    x = rng.permutation(20).reshape(2, 2, 5) * 0.37            # no ties
    check_gradient("FlexibleTopK", [x, KS], 2, outputs_with_grads=[0], wrt=[0], device=device)


def test_flexible_maker_emits_caffe2s_op():
    ops, grads = backward_ops([make_op("FlexibleTopK", ["x", "k"], ["v", "i"])], {"v": "v_grad"})
    assert [(o.type, list(o.input), list(o.output)) for o in ops] == \
        [("FlexibleTopKGradient", ["x", "k", "v_grad", "i"], ["x_grad"])]
    assert REGISTRY.get("RowWiseArgMax").gradient == "no_gradient"


FLEX_BAD = [
    ("FlexibleTopK", [XF, KS[:3]], ShapeError, "K has 3 elements but X"),
    ("FlexibleTopK", [XF, np.array([1, 0, 1, 1], np.int64)], ArgumentError, r"K\[1\] = 0, but every k must be in 1..5"),
    ("FlexibleTopK", [XF, np.array([1, 6, 1, 1], np.int64)], ArgumentError, r"K\[1\] = 6"),
    ("FlexibleTopK", [XF, KS.astype(np.int32)], DTypeError, "K must be int64"),
    ("FlexibleTopK", [XF.astype(np.int32), KS], DTypeError, "floating-point"),
    ("FlexibleTopKGradient", [XF, KS, FLEX[0][:10], FLEX[1][:10]], ShapeError, "K sums to 11 but dValues has 10"),
    ("FlexibleTopKGradient", [XF, KS, FLEX[0], FLEX[1] + 5], ShapeError, "outside 0..4"),
    ("RowWiseArgMax", [XF], ShapeError, "2-D"),
    ("RowWiseArgMax", [ROWS.astype(np.float64)], DTypeError, "float32"),
    ("RowWiseArgMax", [np.ones((2, 0), np.float32)], ShapeError, "empty rows"),
]


@pytest.mark.parametrize("op_type, inputs, error, match", FLEX_BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(FLEX_BAD)])
def test_flexible_and_rowwise_bad_inputs(op_type, inputs, error, match):
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, 2 if op_type == "FlexibleTopK" else 1)


@pytest.mark.parametrize("case_id, wrong", [
    ("flexible_ties", lambda xp, x, k: tuple(o[::-1].copy() for o in GOOD_FLEX(xp, x, k))),
    ("rowwise_argmax", lambda xp, x: xp.argmin(x, axis=1).astype(np.int32).reshape(-1, 1)),
])
def test_flexible_reference_catches_a_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, want = FLEX_CASES[[c[0] for c in FLEX_CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu", 0.0)
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu", 0.0)


GOOD_FLEX = REGISTRY.get("FlexibleTopK").kernel


def test_check_gradient_catches_a_broken_flexible_gradient(broken):
    good = REGISTRY.get("FlexibleTopKGradient").kernel
    broken("FlexibleTopKGradient", lambda xp, x, k, v, i: good(xp, x, k, -v, i))
    with pytest.raises(AssertionError, match="FlexibleTopK: gradient of input 0"):
        check_gradient("FlexibleTopK", [rng.permutation(20).reshape(4, 5) * 1.0, KS], 2, outputs_with_grads=[0],
                       wrt=[0])


def test_top_k_with_a_k_no_array_can_have_is_refused_before_allocating():
    """TopK pads past the axis as Caffe2 does, but a k whose outputs no array can have (the hostile campaign's
    k = 2**63 - 1 on an empty input) is an ArgumentError naming k, from the shape function and the kernel alike."""
    from stepnet import Workspace
    from stepnet.core.errors import ArgumentError
    from stepnet.passes.shapes import infer_net
    from stepnet.core.spec import spec
    from stepnet.io.proto import NetDef, make_argument

    net = NetDef(name="n")
    net.op.add(type="TopK", input=["x"], output=["v", "i"], arg=[make_argument("k", 2**63 - 1),
                                                                  make_argument("axis", 0)])
    ws = Workspace()
    ws.feed("x", np.zeros((3, 8, 0), np.float32))
    with pytest.raises(ArgumentError, match=r"TopK's outputs for k=9223372036854775807: shape "
                                            r"\[9223372036854775807, 8, 0\]: its nonzero dims multiply"):
        ws.run_net_once(net)
    with pytest.raises(ArgumentError, match="TopK's outputs for k=9223372036854775807"):
        infer_net(net, {"x": spec((3, 8, 0), np.float32)})
    net.op[0].arg[0].i = 5      # a k past the axis is padding, as in Caffe2
    ws.feed("x", np.array([[1.0], [3.0]], np.float32))
    ws.run_net_once(net)
    assert ws.fetch("v").reshape(-1).tolist() == [3.0, 1.0, 0.0, 0.0, 0.0]
