"""LengthsGather, LengthsTopK (+ LengthsTopKGradient), GatherRangesToDense and RemoveDataBlocks
(stepnet/ops/lengths_gather.py) against hand-computed cases and loop references written here, on every
device; LengthsTopK's gradient against float64 finite differences; bad inputs; broken kernels caught."""
import numpy as np
import pytest
from reference_check import check

from stepnet.core.errors import ArgumentError, DTypeError, ShapeError
from stepnet.ops import REGISTRY
from stepnet.passes.gradients import backward_ops
from stepnet.testing import DEVICES, check_gradient, infer_alone, make_op, run_op

rng = np.random.default_rng(11)
ITEMS = np.arange(12, dtype=np.float32).reshape(6, 2)
LENS = np.array([2, 0, 3, 1], np.int32)


def ref_top_k(x, lens, k):
    """Per run: sort positions by value, largest first, ties by position; pad with 0 / -1."""
    values, where, at = [], [], 0
    for n in lens.tolist():
        order = sorted(range(n), key=lambda j: (-float(x[at + j]), j))[:k]
        values.append([float(x[at + j]) for j in order] + [0.0] * (k - len(order)))
        where.append(order + [-1] * (k - len(order)))
        at += n
    return np.array(values, np.float32).reshape(-1, k), np.array(where, np.int32).reshape(-1, k)


X = np.array([0.5, 2.0, 2.0, -1.0, 7.0, 3.0, 3.0], np.float32)
XL = np.array([3, 0, 1, 3], np.int32)
DATA = np.arange(1, 9, dtype=np.float32)
RANGES = np.array([[[2, 4], [0, 2]], [[0, 0], [6, 2]]], np.int32)
KEY = np.array([0, 1, 3, 2, 1, 0, 1, 0], np.int64)

CASES = [
    ("lengths_gather", "LengthsGather", [ITEMS, LENS, np.array([2, 0, 1, 2], np.int64)], {},
     [ITEMS[[2, 3, 4, 0, 1, 2, 3, 4]]]),
    ("lengths_gather_none", "LengthsGather", [ITEMS, LENS, np.zeros(0, np.int32)], {}, [ITEMS[:0]]),
    ("top_k", "LengthsTopK", [X, XL], {"k": 2}, list(ref_top_k(X, XL, 2))),
    ("top_k_hand", "LengthsTopK", [X, XL], {"k": 2},
     [np.array([[2, 2], [0, 0], [-1, 0], [7, 3]], np.float32),
      np.array([[1, 2], [-1, -1], [0, -1], [0, 1]], np.int32)]),
    ("top_k_empty", "LengthsTopK", [X[:0], np.zeros(3, np.int32)], {"k": 3},
     [np.zeros((3, 3), np.float32), np.full((3, 3), -1, np.int32)]),
    ("top_k_grad", "LengthsTopKGradient",
     [XL, ref_top_k(X, XL, 2)[1], np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.float32)], {"k": 2},
     [np.array([0, 1, 2, 5, 7, 8, 0], np.float32)]),
    # Caffe2's doc examples
    ("to_dense", "GatherRangesToDense", [DATA, RANGES], {"lengths": [4, 2]},
     [np.array([[3, 4, 5, 6], [0, 0, 0, 0]], np.float32), np.array([[1, 2], [7, 8]], np.float32)]),
    ("to_dense_key", "GatherRangesToDense", [DATA, RANGES, KEY], {"lengths": [4, 2]},
     [np.array([[6, 5, 4, 3], [0, 0, 0, 0]], np.float32), np.array([[1, 2], [8, 7]], np.float32)]),
    ("remove_blocks", "RemoveDataBlocks", [ITEMS, np.array([4, 0, 4], np.int64)], {}, [ITEMS[[1, 2, 3, 5]]]),
    ("remove_none", "RemoveDataBlocks", [ITEMS, np.zeros(0, np.float32)], {}, [ITEMS]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_reference(case, device):
    _, op_type, inputs, args, want = case
    check(op_type, inputs, args, want, device)


def test_random_top_k_against_the_reference():
    lens = rng.integers(0, 6, 8).astype(np.int32)
    x = rng.integers(-3, 3, int(lens.sum())).astype(np.float32)        # many ties
    for k in (1, 3, 7):
        check("LengthsTopK", [x, lens], {"k": k}, list(ref_top_k(x, lens, k)), "cpu")


def test_shapes():
    assert infer_alone("LengthsTopK", [X, XL], 2, k=3)["out1"].shape == (4, 3)
    assert infer_alone("GatherRangesToDense", [DATA, RANGES], 2, lengths=[4, 2])["out1"].shape == (2, 2)
    assert infer_alone("LengthsGather", [ITEMS, LENS, np.array([2, 2])])["out0"].shape == (6, 2)


def test_top_k_gradient():
    x = rng.standard_normal(9)
    check_gradient("LengthsTopK", [x, np.array([4, 2, 3], np.int32)], outputs=2, wrt=[0], outputs_with_grads=[0], k=2)
    ops, grads = backward_ops([make_op("LengthsTopK", ["x", "l"], ["v", "i"], k=2)], {"v": "v_grad"})
    assert [(o.type, list(o.input)) for o in ops] == [("LengthsTopKGradient", ["l", "i", "v_grad"])]
    assert grads["x"] == "x_grad"


BAD = [
    ("LengthsGather", [ITEMS, LENS, np.array([4])], {}, ShapeError, r"INDICES\[0\] = 4 is out of range 0..3"),
    ("LengthsGather", [ITEMS, np.array([2, 2], np.int32), np.array([0])], {}, ShapeError, "sum to 4"),
    ("LengthsTopK", [X, XL], {}, ArgumentError, "k >= 1"),
    ("LengthsTopK", [X, XL[:2]], {"k": 1}, ShapeError, "sum to 3 but DATA has 7"),
    ("GatherRangesToDense", [DATA, RANGES], {"lengths": [4, 3]}, ShapeError, "must have length 3"),
    ("GatherRangesToDense", [DATA, RANGES[:, :, :1]], {"lengths": [4, 2]}, ShapeError, r"\(N, M, 2\)"),
    ("GatherRangesToDense", [DATA, RANGES, KEY.astype(np.int32)], {"lengths": [4, 2]}, DTypeError, "int64"),
    ("RemoveDataBlocks", [ITEMS, np.array([1, 6])], {}, ShapeError, r"INDICES\[1\] = 6 is out of range"),
]


@pytest.mark.parametrize("op_type, inputs, args, error, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs(op_type, inputs, args, error, match):
    n_out = 2 if op_type in ("LengthsTopK", "GatherRangesToDense") else 1
    with pytest.raises(error, match=match):
        run_op(op_type, inputs, n_out, **args)


@pytest.mark.parametrize("case_id, op_type, wrong", [
    ("top_k_hand", "LengthsTopK", lambda xp, x, lens, *, k: (  # the smallest, not the largest
        xp.asarray(ref_top_k(-x, lens, k)[0]) * -1, xp.asarray(ref_top_k(-x, lens, k)[1]))),
    ("to_dense_key", "GatherRangesToDense",
     lambda ctx, xp, data, ranges, key, *, lengths: REGISTRY.registered("GatherRangesToDense").kernel(
         ctx, xp, data, ranges, lengths=lengths)),                                       # KEY ignored
    ("top_k_grad", "LengthsTopKGradient", lambda xp, lens, idx, dv, *, k: xp.zeros(7, np.float32)),
])
def test_reference_catches_a_broken_kernel(case_id, op_type, wrong, broken):
    _, _, inputs, args, want = CASES[[c[0] for c in CASES].index(case_id)]
    check(op_type, inputs, args, want, "cpu")
    broken(op_type, wrong)
    with pytest.raises(AssertionError):
        check(op_type, inputs, args, want, "cpu")


def test_caffe2_shape_answers_leave_stepnets_alone():
    """compat's InferShapesAndTypes gives Caffe2's GatherRanges bound (DATA's size) through infer_net's `shapes`
    override; stepnet's own inference still gives the exact size the known ranges select."""
    from stepnet.compat import workspace
    from stepnet.core.spec import TensorSpec
    from stepnet.io.proto import NetDef
    from stepnet.passes.shapes import infer_net

    net = NetDef(name="g")
    net.op.append(make_op("GatherRanges", ["values", "ranges"], ["out", "lengths"]))
    known = {"values": TensorSpec((64,), np.dtype(np.int64)),
             "ranges": TensorSpec((3, 5, 2), np.dtype(np.int32), np.zeros((3, 5, 2), np.int32))}
    assert infer_net(net, known)["out"].shape == (0,)
    caffe2 = infer_net(net, known, shapes=workspace.CAFFE2_SHAPES)
    assert caffe2["out"].shape == (64,) and caffe2["out"].dtype == np.int64 and caffe2["lengths"].shape == (3,)
