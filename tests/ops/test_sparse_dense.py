"""Sparse <-> dense operators (stepnet/ops/sparse_dense.py) against loop references on every device;
gradients by float64 finite differences and the gradient ops Caffe2's makers emit; bad inputs (also found
statically where the shapes and small index values show them); broken kernels caught."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, GradientError, ShapeError, StepnetWarning
from stepnet.passes.gradients import backward_ops
from stepnet.io.proto import argument_value
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

RNG = np.random.default_rng(44)
F32 = np.float32
# The mask cases hold a negative id on purpose (skipped with a warning, which
# test_negative_ids_are_skipped_with_a_warning checks)
pytestmark = pytest.mark.filterwarnings("ignore:SparseToDenseMask. skipped")


def i32(*v):
    return np.array(v, np.int32)


def i64(*v):
    return np.array(v, np.int64)


def f32(*shape):
    return RNG.standard_normal(shape).astype(F32)


# ------------------------------------------------------------------------------------------ references
def rows_of(lengths):
    return [r for r, n in enumerate(lengths) for _ in range(n)]


def ref_batch_sparse_to_dense(lengths, indices, values, width, default=0.0):
    out = np.full((len(lengths), width), default, values.dtype)
    for k, r in enumerate(rows_of(lengths)):
        out[r, indices[k]] = values[k]           # in order: a repeated index keeps the last value
    return out


def ref_batch_dense_to_sparse(lengths, indices, dense):
    return np.array([dense[r, indices[k]] for k, r in enumerate(rows_of(lengths))], dense.dtype)


def ref_mask(indices, values, default, mask, lengths=None):
    rows = [len(indices)] if lengths is None else list(lengths)
    out = np.empty((len(rows), len(mask)) + default.shape, values.dtype)
    out[...] = default
    present = np.zeros((len(rows), len(mask)), bool)
    for k, r in enumerate(rows_of(rows)):
        if indices[k] in mask:
            out[r, mask.index(indices[k])] = values[k]
            present[r, mask.index(indices[k])] = True
    return (out[0], present[0]) if lengths is None else (out, present)


def ref_mask_gradient(indices, grad, mask, lengths=None):
    rows = [len(indices)] if lengths is None else list(lengths)
    g = grad[None] if lengths is None else grad
    out = np.zeros((len(indices),) + g.shape[2:], grad.dtype)
    start = 0
    for r, n in enumerate(rows):
        used = set()
        for k in reversed(range(start, start + n)):   # the last entry of an id in its row filled the cell
            if indices[k] in mask and indices[k] not in used:
                used.add(indices[k])
                out[k] = g[r, mask.index(indices[k])]
        start += n
    return out


def ref_label_split(lengths, labels, values, n):
    vals, ids, offsets = [[] for _ in range(n)], [[] for _ in range(n)], []
    for k, r in enumerate(rows_of(lengths)):
        offsets.append(len(vals[labels[k]]))
        vals[labels[k]].append(values[k])
        ids[labels[k]].append(r)
    return ([np.array(v, values.dtype) for v in vals] + [np.array(i, np.int32) for i in ids]
            + [np.array(offsets, np.int32)])


def ref_label_split_gradient(labels, grads):
    seen = {}
    out = []
    for lab in labels:
        out.append(grads[lab][seen.get(lab, 0)])
        seen[lab] = seen.get(lab, 0) + 1
    return np.array(out, grads[0].dtype)


# ------------------------------------------------------------------------------------------ the table
BL, BI, BV = i32(2, 0, 3, 1), i64(4, 0, 1, 4, 2, 0), f32(6)
DENSE = f32(4, 5)
MI, MV, MD = i64(7, 300, 42, 7, -1, 1, 42), f32(7, 2, 3), f32(2, 3)
MASK = [42, 100, 300, 1, 7]
ML = i32(4, 0, 3)
LL, LI, LV = i32(1, 3, 2, 2), i64(3, 1, 2, 0, 0, 2, 1, 3), f32(8)
G = [f32(2), f32(2), f32(2), f32(2)]
RV, MG, MGL = f32(3), f32(5, 2, 3), f32(3, 5, 2, 3)

CASES = [
    ("batch_s2d", "BatchSparseToDense", [BL, BI, BV], {"dense_last_dim": 5},
     [ref_batch_sparse_to_dense(BL, BI, BV, 5)]),
    ("batch_s2d_default", "BatchSparseToDense", [BL.astype(np.int64), BI.astype(np.int32), BV], {
        "dense_last_dim": 6, "default_value": -1.5}, [ref_batch_sparse_to_dense(BL, BI, BV, 6, -1.5)]),
    ("batch_s2d_shaper", "BatchSparseToDense", [BL, BI, BV, f32(4, 7)], {}, [ref_batch_sparse_to_dense(BL, BI, BV, 7)]),
    ("batch_s2d_repeated", "BatchSparseToDense", [i32(3), i64(1, 1, 0), RV], {"dense_last_dim": 2},
     [ref_batch_sparse_to_dense([3], [1, 1, 0], RV, 2)]),
    ("batch_d2s", "BatchDenseToSparse", [BL, BI, DENSE], {}, [ref_batch_dense_to_sparse(BL, BI, DENSE)]),
    ("mask", "SparseToDenseMask", [MI, MV, MD], {"mask": MASK}, [ref_mask(MI, MV, MD, MASK)[0]]),
    ("mask_lengths", "SparseToDenseMask", [MI.astype(np.int32), MV, MD, ML], {"mask": MASK},
     [ref_mask(MI, MV, MD, MASK, ML)[0]]),
    ("mask_presence", "SparseToDenseMask", [MI, MV, MD, ML], {"mask": MASK, "return_presence_mask": 1},
     list(ref_mask(MI, MV, MD, MASK, ML))),
    ("mask_ints", "SparseToDenseMask", [i64(5, 3), i64(10, 20), np.array(-1)], {"mask": [3, 4, 5]},
     [ref_mask([5, 3], i64(10, 20), np.array(-1), [3, 4, 5])[0]]),
    ("mask_gradient", "SparseToDenseMaskGradient", [MI, MG], {"mask": MASK}, [ref_mask_gradient(MI, MG, MASK)]),
    ("mask_gradient_lengths", "SparseToDenseMaskGradient", [MI, MGL, ML], {"mask": MASK},
     [ref_mask_gradient(MI, MGL, MASK, ML)]),
    ("label_split", "SparseLabelSplit", [LL, LI, LV], {"num_labels": 4}, ref_label_split(LL, LI, LV, 4)),
    ("label_split_no_map", "SparseLabelSplit", [LL, LI, LV], {}, ref_label_split(LL, LI, LV, 4)[:8]),
    ("label_split_gradient", "SparseLabelSplitGradient", [LL, LI, *G], {"num_labels": 4},
     [ref_label_split_gradient(LI, G)]),
    ("label_split_gradient_map", "SparseLabelSplitGradient", [LL, LI, *G, ref_label_split(LL, LI, LV, 4)[8]],
     {"num_labels": 4}, [ref_label_split_gradient(LI, G)]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, expected = case
    check(op_type, inputs, args, expected, device)


def test_negative_ids_are_skipped_with_a_warning():
    with pytest.warns(StepnetWarning, match="skipped 1 invalid id"):
        got = run_op("SparseToDenseMask", [MI, MV, MD], mask=MASK)
    np.testing.assert_array_equal(got, ref_mask(MI, MV, MD, MASK)[0])


def test_invalid_ids_are_counted_one_by_one_up_to_five():
    """Caffe2 (2018) skips ids < 0 or equal to the index type's largest value and fails at the 5th in a run,
    whatever rows they are in; an id equal to the largest value fills no cell even when the mask holds it."""
    top = np.iinfo(np.int32).max
    values, default = np.arange(6, dtype=F32), np.array(-1, F32)
    got = run_op("SparseToDenseMask", [i32(top, 9, 2, -3, -4, -5), values, default], mask=[top, 2])
    np.testing.assert_array_equal(got, [-1, 2])
    with pytest.raises(ShapeError, match=r"5 INDICES are invalid"):
        run_op("SparseToDenseMask", [i32(-1, 9, -2, -3, -4, -5), values, default, i32(2, 4)], mask=[2])


# ------------------------------------------------------------------------------------------- gradients
GRADS = [   # (op, inputs, args, wrt, outputs, outputs with gradients)
    ("BatchSparseToDense", [BL, BI, BV.astype(np.float64)], {"dense_last_dim": 5}, [2], 1, None),
    ("BatchDenseToSparse", [BL, BI, DENSE.astype(np.float64)], {}, [2], 1, None),
    ("SparseToDenseMask", [MI, MV.astype(np.float64), MD.astype(np.float64)], {"mask": MASK}, [1], 1, None),
    ("SparseToDenseMask", [MI, MV.astype(np.float64), MD.astype(np.float64), ML], {"mask": MASK}, [1], 1, None),
    ("SparseLabelSplit", [LL, LI, LV.astype(np.float64)], {"num_labels": 4}, [2], 9, [0, 1, 2, 3]),
    ("SparseLabelSplit", [LL, LI, LV.astype(np.float64)], {"num_labels": 4}, [2], 8, [0, 1, 2, 3]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type, inputs, args, wrt, outputs, with_grads", GRADS,
                         ids=[f"{g[0]}-{i}" for i, g in enumerate(GRADS)])
def test_gradients_match_finite_differences(op_type, inputs, args, wrt, outputs, with_grads, device):
    check_gradient(op_type, inputs, outputs, wrt=wrt, outputs_with_grads=with_grads, device=device, **args)


def sig(ops):
    return [(o.type, list(o.input), list(o.output), {a.name: argument_value(a) for a in o.arg}) for o in ops]


def test_the_gradient_ops_are_caffe2s():
    ops, _ = backward_ops([make_op("BatchSparseToDense", ["l", "i", "v"], ["d"], dense_last_dim=3)], {"d": "dg"})
    assert sig(ops) == [("BatchDenseToSparse", ["l", "i", "dg"], ["v_grad"], {"dense_last_dim": 3})]
    ops, _ = backward_ops([make_op("BatchDenseToSparse", ["l", "i", "d"], ["v"])], {"v": "vg"})
    assert sig(ops) == [("BatchSparseToDense", ["l", "i", "vg", "d"], ["d_grad"], {})]
    ops, _ = backward_ops([make_op("SparseToDenseMask", ["i", "v", "dv", "l"], ["o"], mask=[3])], {"o": "og"})
    assert sig(ops) == [("SparseToDenseMaskGradient", ["i", "og", "l"], ["v_grad"], {"mask": [3]})]
    outs = ["v0", "v1", "e0", "e1", "map"]
    ops, grads = backward_ops([make_op("SparseLabelSplit", ["l", "i", "v"], outs, num_labels=2)],
                              {"v0": "g0", "v1": "g1"})
    assert sig(ops) == [("SparseLabelSplitGradient", ["l", "i", "g0", "g1", "map"], ["v_grad"], {"num_labels": 2})]
    assert grads["v"] == "v_grad"


def test_sparse_label_split_gradient_needs_num_labels():
    with pytest.raises(GradientError, match="needs its num_labels argument"):
        backward_ops([make_op("SparseLabelSplit", ["l", "i", "v"], ["v0", "e0"])], {"v0": "g0"})


# ------------------------------------------------------------------------------------------ bad inputs
BAD = [   # (op, inputs, args, outputs, error, message, found statically)
    ("BatchSparseToDense", [BL, BI, BV], {"dense_last_dim": 4}, 1, ShapeError,
     r"INDICES\[0\] = 4 is out of range for a dense last dimension of 4", False),
    ("BatchSparseToDense", [BL, i64(0, 1, 2, 3, 4, -1), BV], {"dense_last_dim": 6}, 1, ShapeError,
     r"INDICES\[5\] = -1 is out of range", False),
    ("BatchSparseToDense", [i32(2, 2), BI, BV], {"dense_last_dim": 5}, 1, ShapeError,
     r"LENGTHS \(2,\) sum to 4 but there are 6 indices", True),
    ("BatchSparseToDense", [BL, BI, BV], {}, 1, ArgumentError, "dense_last_dim must be >= 1", True),
    ("BatchSparseToDense", [BL, BI, BV[:5]], {"dense_last_dim": 5}, 1, ShapeError, "one value per index", True),
    ("BatchSparseToDense", [BL, BI, BV, f32(4, 7)], {"dense_last_dim": 5}, 1, ArgumentError,
     "dense_last_dim=5 differs", True),
    ("BatchSparseToDense", [BL, BI, BV.astype(np.int32)], {"dense_last_dim": 5}, 1, DTypeError,
     "VALUES must be a float tensor", True),
    ("BatchDenseToSparse", [BL, BI, DENSE[:3]], {}, 1, ShapeError, r"one row per length \(4 LENGTHS\)", True),
    ("SparseToDenseMask", [MI, MV, MD], {}, 1, ArgumentError, "must list at least one id", True),
    ("SparseToDenseMask", [MI, MV, MD], {"mask": [1, 2, 1]}, 1, ArgumentError, r"id 1 twice \(mask\[0\] and mask\[2\]",
     True),
    ("SparseToDenseMask", [MI, MV, MD], {"mask": [1, -2]}, 1, ArgumentError, r"mask\[1\] = -2", True),
    ("SparseToDenseMask", [MI, MV, MD[:1]], {"mask": MASK}, 1, ShapeError, r"DEFAULT \(1, 3\) must have the shape",
     True),
    ("SparseToDenseMask", [MI, MV[:6], MD], {"mask": MASK}, 1, ShapeError, r"one row per index \(7 INDICES\)", True),
    ("SparseToDenseMask", [MI, MV, MD.astype(np.float64)], {"mask": MASK}, 1, DTypeError, "must have one dtype", True),
    ("SparseToDenseMask", [MI, MV, MD, i32(4, 4)], {"mask": MASK}, 1, ShapeError, "sum to 8 but there are 7", True),
    ("SparseToDenseMask", [MI, MV, MD, ML], {"mask": MASK, "max_skipped_indices": 1}, 1, ShapeError,
     r"1 INDICES are invalid \(negative, or the largest int64\); max_skipped_indices=1", False),
    ("SparseToDenseMaskGradient", [MI, f32(3, 5, 2), ML], {"mask": MASK[:4]}, 1, ShapeError,
     r"must start with \(len\(LENGTHS\), len\(mask\)\) = \(3, 4\)", True),
    ("SparseLabelSplit", [LL, i64(3, 1, 2, 0, 0, 2, 1, 4), LV], {"num_labels": 4}, 9, ShapeError,
     r"label_index\[7\] = 4 is out of range for 4 labels", False),
    ("SparseLabelSplit", [i32(1, 3), LI, LV], {"num_labels": 4}, 9, ShapeError, "sum to 4 but there are 8 labels",
     True),
    ("SparseLabelSplit", [LL, LI, LV], {"num_labels": 3}, 8, ArgumentError, "num_labels=3 needs 6 outputs", False),
    ("SparseLabelSplitGradient", [LL, LI, *G[:3]], {"num_labels": 4}, 1, ArgumentError,
     "value gradients of 4 labels", False),
    ("SparseLabelSplitGradient", [LL, LI, G[0][:1], *G[1:]], {"num_labels": 4}, 1, ShapeError,
     "gradient of label 0 has 1 entries", False),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_type,inputs,args,n_out,error,message,static", BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, n_out, error, message, static, device):
    with pytest.raises(error, match=message):
        run_op(op_type, inputs, n_out, device=device, **args)


STATIC = [b for b in BAD if b[-1]]


@pytest.mark.parametrize("op_type,inputs,args,n_out,error,message,static", STATIC,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(STATIC)])
def test_bad_inputs_found_statically(op_type, inputs, args, n_out, error, message, static):
    with pytest.raises(error, match=message):
        infer_alone(op_type, inputs, n_out, **args)


# ------------------------------------------------------------------------------------------ test the tester
@pytest.mark.parametrize("case_id, wrong", [
    ("batch_s2d_repeated", lambda xp, l, i, v, **a: xp.stack([xp.asarray(np.array([v[2], v[0]]))])),  # first wins
    ("mask_lengths", lambda xp, i, v, d, l, **a: xp.zeros((3, 5, 2, 3), np.float32)),      # forgets the default
    ("label_split", lambda ctx, xp, l, i, v, num_labels: tuple(
        xp.asarray(r) for r in ref_label_split(l, i, v, 4)[:8]) + (xp.zeros(8, np.int32),)),   # no offset map
    ("mask_gradient", lambda xp, i, g, mask, **a: xp.zeros((7, 2, 3), np.float32)),
])
def test_reference_detects_broken_kernel(case_id, wrong, broken):
    _, op_type, inputs, args, expected = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, expected, "cpu")
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, expected, "cpu")


def test_finite_differences_detect_a_broken_gradient_kernel(broken):
    inputs = [MI, MV.astype(np.float64), MD.astype(np.float64), ML]
    check_gradient("SparseToDenseMask", inputs, wrt=[1], mask=MASK, op_args={"max_skipped_indices": 5})
    broken("SparseToDenseMaskGradient", lambda xp, i, g, *l, mask, **a: xp.zeros((7, 2, 3), g.dtype) + 1)
    with pytest.raises(AssertionError, match="gradient of input 1"):
        check_gradient("SparseToDenseMask", inputs, wrt=[1], mask=MASK, op_args={"max_skipped_indices": 5})


def test_label_split_gradient_needs_a_1d_label_index():
    with pytest.raises(ShapeError, match=r"label_index must be 1-D, got shape \(\)"):
        run_op("SparseLabelSplitGradient", [np.array([1], np.int32), np.float32(0.0), np.zeros(1, np.float32)],
               num_labels=1)
