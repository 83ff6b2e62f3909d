"""CollectRpnProposals, DistributeFpnProposals, CollectAndDistributeFpnRpnProposals and BatchPermutation (+
gradient) against loops written from Caffe2's definitions (collect_and_distribute_fpn_rpn_proposals_op.cc,
batch_permutation_op.cc and Detectron's fpn.map_rois_to_fpn_levels), on every device; a hand case of the FPN
level rule; static shapes (known counts, value-dependent levels); no gradients where Caffe2 has none; bad
inputs; broken kernels caught."""
import math

import numpy as np
import pytest

from stepnet.core.errors import ArgumentError, GradientError, ShapeError
from stepnet.passes.gradients import backward_ops
from stepnet.ops import REGISTRY
from stepnet.testing import DEVICES, check_gradient, infer_static, make_op, run_op

rng = np.random.default_rng(53)
F32 = np.float32


def level_inputs(counts, size=600.0):
    """Per RPN level: rois (n, 5) [image, x1, y1, x2, y2] of all sizes, probs (n,) (some equal)."""
    rois, probs = [], []
    for n in counts:
        xy = rng.uniform(0, size, (n, 2))
        side = np.exp(rng.uniform(np.log(4), np.log(900), (n, 2)))
        r = np.concatenate([rng.integers(0, 2, (n, 1)), xy, xy + side], axis=1).astype(F32)
        p = rng.uniform(0, 1, n).astype(F32)
        if n > 2:
            p[1] = p[0]
        rois.append(r)
        probs.append(p)
    return rois, probs


def ref_level(box, lo=2, hi=5, s0=224, k0=4, plus_one=1):
    area = (box[2] - box[0] + plus_one) * (box[3] - box[1] + plus_one)
    return int(min(max(math.floor(k0 + math.log2(math.sqrt(area) / s0 + 1e-6)), lo), hi))


def ref_collect(rois, probs, top):
    every = [(float(p), k, row) for k, (p, row) in enumerate(zip(np.concatenate(probs), np.concatenate(rois)))]
    every.sort(key=lambda e: (-e[0], e[1]))
    if 0 < top < len(every):
        every = every[:top]
    return np.array([e[2] for e in every], F32).reshape(-1, 5)


def ref_distribute(rois, lo=2, hi=5, **kw):
    lvls = [ref_level([float(v) for v in r[1:]], lo, hi, **kw) for r in rois]
    levels = [np.array([r for r, lv in zip(rois, lvls) if lv == k], F32).reshape(-1, 5) for k in range(lo, hi + 1)]
    order = [i for k in range(lo, hi + 1) for i, lv in enumerate(lvls) if lv == k]
    restore = [order.index(i) for i in range(len(rois))]
    return levels, np.array(restore, np.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("counts,args,top", [
    ([7, 5, 0, 6, 3], {}, 2000),
    ([9, 8, 7, 6, 5], {"rpn_post_nms_topN": 12}, 12),
    ([4, 4, 4], {"rpn_min_level": 3, "rpn_max_level": 5, "post_nms_topN": 5}, 5),   # the 2018 argument name
], ids=["all", "top-12", "2018-name"])
def test_collect(device, counts, args, top):
    rois, probs = level_inputs(counts)
    got = run_op("CollectRpnProposals", [*rois, *probs], 1, device=device, **args)
    np.testing.assert_array_equal(got, ref_collect(rois, probs, top))
    assert infer_static("CollectRpnProposals", [*rois, *probs], 1, **args)[0].shape == got.shape


DIST_CASES = [  # (id, args, reference keywords)
    ("default", {}, {}),
    ("levels-3-6", {"roi_min_level": 3, "roi_max_level": 6, "roi_canonical_scale": 160, "roi_canonical_level": 5},
     {"lo": 3, "hi": 6, "s0": 160, "k0": 5}),
    ("no-plus-one", {"legacy_plus_one": False}, {"plus_one": 0}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,args,kw", DIST_CASES, ids=[c[0] for c in DIST_CASES])
def test_distribute(device, cid, args, kw):
    rois = ref_collect(*level_inputs([30]), 0)
    levels = args.get("roi_max_level", 5) - args.get("roi_min_level", 2) + 1
    got = run_op("DistributeFpnProposals", [rois], levels + 1, device=device, **args)
    want, restore = ref_distribute(rois, **kw)
    for g, w in zip(got[:-1], want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[-1], restore)
    assert sum(len(w) > 0 for w in want) >= 3, "the case should fill several levels"
    np.testing.assert_array_equal(np.concatenate(got[:-1])[got[-1]], rois)   # restore undoes the split
    four = run_op("DistributeFpnProposals", [np.ascontiguousarray(rois[:, 1:])], levels + 1, device=device, **args)
    for g, w in zip(four[:-1], want):
        np.testing.assert_array_equal(g[:, 1:], w[:, 1:])
        assert (g[:, 0] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_collect_and_distribute(device):
    rois, probs = level_inputs([11, 9, 6, 4, 2])
    got = run_op("CollectAndDistributeFpnRpnProposals", [*rois, *probs], 6, device=device, rpn_post_nms_topN=20)
    top = ref_collect(rois, probs, 20)
    np.testing.assert_array_equal(got[0], top)
    want, restore = ref_distribute(top)
    for g, w in zip(got[1:5], want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[5], restore)
    specs = infer_static("CollectAndDistributeFpnRpnProposals", [*rois, *probs], 6, rpn_post_nms_topN=20)
    assert specs[0].shape == (20, 5) and specs[5].shape == (20,) and specs[5].dtype == np.int32
    assert all(s.shape is None and s.dtype == F32 for s in specs[1:5])   # counts depend on the values


def test_level_rule_hand_case():
    """Sides 224 -> level 4 (the canonical level), 112 -> 3, 448 -> 5, 56 -> 2, 20 -> 2 (clipped), 2000 -> 5."""
    sides = [224, 112, 448, 56, 20, 2000]
    rois = np.array([[0, 10, 10, 10 + s - 1, 10 + s - 1] for s in sides], F32)
    out = run_op("DistributeFpnProposals", [rois], 5)
    counts = [len(o) for o in out[:4]]
    assert counts == [2, 1, 1, 2]                       # levels 2, 3, 4, 5
    np.testing.assert_array_equal(out[0][:, 3] - out[0][:, 1] + 1, [56, 20])
    np.testing.assert_array_equal(out[4], [3, 2, 4, 0, 1, 5])


@pytest.mark.parametrize("device", DEVICES)
def test_batch_permutation(device):
    x = rng.standard_normal((5, 3, 2)).astype(F32)
    idx = np.array([2, 0, 4, 1, 3], np.int32)
    y = run_op("BatchPermutation", [x, idx], 1, device=device)
    np.testing.assert_array_equal(y, np.stack([x[i] for i in idx]))
    dy = rng.standard_normal(y.shape).astype(F32)
    dx = run_op("BatchPermutationGradient", [idx, dy], 1, device=device)
    want = np.zeros_like(dy)
    for i, j in enumerate(idx):
        want[j] = dy[i]
    np.testing.assert_array_equal(dx, want)
    check_gradient("BatchPermutation", [x.astype(float), idx], 1, wrt=[0], device=device)
    assert run_op("BatchPermutation", [np.zeros((0, 4), F32), np.zeros(0, np.int32)], 1, device=device).shape == (0, 4)


def test_batch_permutation_doc_example_and_caffe2s_non_permutation_gradient():
    x = np.array([[1, 5, 2, 3, 4, 6, 0], [4, 3, 3, 5, 2, 3, 1], [2, 2, 3, 6, 0, 0, 1], [0, 0, 1, 1, 2, 2, 3]], F32)
    y = run_op("BatchPermutation", [x, np.array([2, 0, 1, 3], np.int32)], 1)
    np.testing.assert_array_equal(y, x[[2, 0, 1, 3]])
    dx = run_op("BatchPermutationGradient", [np.array([1, 1, 3, 3], np.int32), x], 1)
    np.testing.assert_array_equal(dx, x[[0, 1, 0, 3]])   # rows 0 and 2 unnamed: dY[0]; repeats: the last wins


def test_gradients_as_caffe2_declares_them():
    (grad,), _ = backward_ops([make_op("BatchPermutation", ["X", "I"], ["Y"])], {"Y": "Y_grad"})
    assert (grad.type, list(grad.input), list(grad.output)) == ("BatchPermutationGradient", ["I", "Y_grad"],
                                                                 ["X_grad"])
    for op_type, n_in, n_out in [("CollectRpnProposals", 10, 1), ("DistributeFpnProposals", 1, 5),
                                 ("CollectAndDistributeFpnRpnProposals", 10, 6)]:
        forward = make_op(op_type, [f"i{k}" for k in range(n_in)], [f"o{k}" for k in range(n_out)])
        with pytest.raises(GradientError):
            backward_ops([forward], {"o0": "o0_grad"})


R, P = level_inputs([3, 3, 3, 3, 3])
BAD = [  # (id, op, inputs, outputs, args, error, match)
    ("inputs-count", "CollectRpnProposals", [*R, *P[:4]], 1, {}, ShapeError, "take 10 inputs"),
    ("rois-cols", "CollectRpnProposals", [R[0][:, :4], *R[1:], *P], 1, {}, ShapeError,
     r"level 2 rois must be \(count, 5\)"),
    ("probs-count", "CollectRpnProposals", [*R, P[0][:2], *P[1:]], 1, {}, ShapeError, "one score per roi"),
    ("rpn-levels", "CollectRpnProposals", [*R, *P], 1, {"rpn_min_level": 7}, ArgumentError, "rpn_max_level 6"),
    ("roi-levels", "DistributeFpnProposals", [R[0]], 5, {"roi_max_level": 1}, ArgumentError, "roi_max_level 1"),
    ("dist-cols", "DistributeFpnProposals", [R[0][:, :3]], 5, {}, ShapeError, r"\(count, 4\)"),
    ("perm-rows", "BatchPermutation", [np.zeros((3, 2), F32), np.arange(4, dtype=np.int32)], 1, {}, ShapeError,
     "as many rows"),
    ("perm-2d", "BatchPermutation", [np.zeros((3, 2), F32), np.zeros((3, 1), np.int32)], 1, {}, ShapeError, "1-d"),
    ("perm-float-idx", "BatchPermutation", [np.zeros((3, 2), F32), np.zeros(3, F32)], 1, {}, Exception, "integers"),
]
RUNTIME_ONLY = [
    ("outputs-count", "DistributeFpnProposals", [R[0]], 3, {}, ShapeError, "writes 5 outputs, got 3"),
    ("both-outputs", "CollectAndDistributeFpnRpnProposals", [*R, *P], 4, {}, ShapeError, "writes 6 outputs"),
    ("negative-area", "DistributeFpnProposals", [np.array([[0, 5, 5, 1, 9]], F32)], 5, {}, ShapeError,
     "negative area"),
    ("perm-range", "BatchPermutation", [np.zeros((3, 2), F32), np.array([0, 3, 1], np.int32)], 1, {}, ShapeError,
     "outside the 3 rows"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,op_type,inputs,n_out,args,err,match", BAD + RUNTIME_ONLY,
                         ids=[b[0] for b in BAD + RUNTIME_ONLY])
def test_bad_input(device, cid, op_type, inputs, n_out, args, err, match):
    with pytest.raises(err, match=match):
        run_op(op_type, inputs, n_out, device=device, **args)


@pytest.mark.parametrize("cid,op_type,inputs,n_out,args,err,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_found_statically(cid, op_type, inputs, n_out, args, err, match):
    with pytest.raises(err, match=match):
        infer_static(op_type, inputs, n_out, **args)


def test_reference_checks_catch_broken_kernels(broken):
    dist = REGISTRY.get("DistributeFpnProposals").kernel
    broken("DistributeFpnProposals", lambda ctx, xp, r, **k: dist(ctx, xp, r, **dict(k, roi_canonical_level=5)))
    with pytest.raises(AssertionError):
        test_distribute("cpu", *DIST_CASES[0])
    both = REGISTRY.get("CollectAndDistributeFpnRpnProposals").kernel
    broken("CollectAndDistributeFpnRpnProposals",
           lambda ctx, xp, *i, **k: both(ctx, xp, *i, **dict(k, rpn_post_nms_topN=19)))
    with pytest.raises(AssertionError):
        test_collect_and_distribute("cpu")
    collect = REGISTRY.get("CollectRpnProposals").kernel
    broken("CollectRpnProposals", lambda xp, *i, **k: collect(xp, *i, **dict(k, post_nms_topN=3)))
    with pytest.raises(AssertionError):
        test_collect("cpu", [4, 4, 4], {"rpn_min_level": 3, "rpn_max_level": 5, "post_nms_topN": 5}, 5)
    grad = REGISTRY.get("BatchPermutationGradient").kernel
    broken("BatchPermutationGradient", lambda xp, i, dy: grad(xp, i, dy)[::-1])
    with pytest.raises(AssertionError):
        test_batch_permutation("cpu")
