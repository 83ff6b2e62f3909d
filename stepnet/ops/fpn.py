"""Routing proposals through a feature pyramid (Detectron's FPN nets), as
caffe2/operators/collect_and_distribute_fpn_rpn_proposals_op.cc and batch_permutation_op.cc define them:
CollectRpnProposals (the best proposals over every RPN level), DistributeFpnProposals (each RoI to the level
its size calls for), CollectAndDistributeFpnRpnProposals (both in one op) and BatchPermutation (rows in a
given order, used to put the per-level RoI features back in the RoIs' order) with its gradient.

The proposal ops sort and select on the host (Caffe2 has them on the CPU only) and put their results on the
op's device; none has a gradient (SHOULD_NOT_DO_GRADIENT). How many RoIs land on a level depends on their
values, so those outputs' leading dimension is known only when the op runs.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import ArgumentError, ShapeError
from .base import Meta, check_float, check_int_dtype, like, on_device, out_spec, single_gradient, value_dependent
from .registry import SHOULD_NOT_DO_GRADIENT, Arg, op

RPN_ARGS = {
    "rpn_min_level": Arg("int", 2, "first RPN level (the inputs hold one rois and one probs blob per level)"),
    "rpn_max_level": Arg("int", 6, "last RPN level"),
    "rpn_post_nms_topN": Arg("int", None, "proposals kept over all levels, best scored (<= 0: all; default 2000)"),
    "post_nms_topN": Arg("int", None, "the name Caffe2's first version (2018) read instead of rpn_post_nms_topN; "
                                      "used when rpn_post_nms_topN is not given"),
}
ROI_ARGS = {
    "roi_min_level": Arg("int", 2, "first RoI level (one output per level)"),
    "roi_max_level": Arg("int", 5, "last RoI level"),
    "roi_canonical_scale": Arg("int", 224, "s0 of the FPN paper's level rule"),
    "roi_canonical_level": Arg("int", 4, "k0 of the FPN paper's level rule: a RoI of side s0 goes to level k0"),
    "legacy_plus_one": Arg("bool", True, "the + 1 in box widths and heights (Caffe2's legacy_plus_one)"),
}


def _levels(lo: int, hi: int, what: str) -> int:
    if hi < lo:
        raise ArgumentError(f"{what}_max_level {hi} must be greater than or equal to {what}_min_level {lo}")
    return hi - lo + 1


def _collect_checks(specs, rpn_min_level, rpn_max_level):
    """Per level (rois, probs) specs after the checks; the rois count of each level."""
    n = _levels(rpn_min_level, rpn_max_level, "rpn")
    if len(specs) != 2 * n:
        raise ShapeError(f"{n} RPN levels ({rpn_min_level}..{rpn_max_level}) take {2 * n} inputs (each level's "
                         f"rois, then each level's probs), got {len(specs)}")
    counts = []
    for k, (rois, probs) in enumerate(zip(specs[:n], specs[n:])):
        level = rpn_min_level + k
        check_float("CollectRpnProposals", rois=rois, probs=probs)
        if len(rois.shape) != 2 or rois.shape[1] != 5:
            raise ShapeError(f"level {level} rois must be (count, 5) rows [image, x1, y1, x2, y2], got shape "
                             f"{tuple(rois.shape)}")
        if not probs.shape or probs.shape[0] != rois.shape[0] or int(np.prod(probs.shape)) != rois.shape[0]:
            raise ShapeError(f"level {level} probs must hold one score per roi ({rois.shape[0]}), got shape "
                             f"{tuple(probs.shape)}")
        counts.append(rois.shape[0])
    return counts


def _top(total: int, args) -> int:
    """How many proposals Collect keeps out of `total`."""
    top = next((args[k] for k in ("rpn_post_nms_topN", "post_nms_topN") if args[k] is not None), 2000)
    return top if 0 < top < total else total


def collect(rois_list, probs_list, keep: int) -> np.ndarray:
    """Host rois of every level, the `keep` best by probability (a stable sort: equal scores keep their
    order, as Caffe2's comparator breaks ties by position)."""
    rois = np.concatenate([np.asarray(r, np.float32).reshape(-1, 5) for r in rois_list])
    probs = np.concatenate([np.asarray(p, np.float32).reshape(-1) for p in probs_list])
    return rois[np.argsort(-probs, kind="stable")[:keep]]


def map_levels(boxes, lo, hi, scale, level, plus_one) -> np.ndarray:
    """The FPN level of each host box [x1, y1, x2, y2]: floor(k0 + log2(sqrt(area) / s0 + 1e-6)) clipped to
    [lo, hi], in float32 as Caffe2's Eigen code computes it."""
    one = np.float32(1 if plus_one else 0)
    area = (boxes[:, 2] - boxes[:, 0] + one) * (boxes[:, 3] - boxes[:, 1] + one)
    bad = np.flatnonzero(~(area >= 0))
    if bad.size:
        raise ShapeError(f"roi {bad[0]} {boxes[bad[0]].tolist()} has a negative area (x2 < x1 or y2 < y1)")
    s = np.sqrt(area)
    lvl = np.floor(np.float32(level) + np.log(s / np.float32(scale) + np.float32(1e-6)) / np.float32(np.log(2.0)))
    return np.clip(lvl, lo, hi).astype(np.int64)


def distribute(rois, args):
    """(per-level host rois, restore permutation int32) of host rois (n, 5)."""
    lo, hi = args["roi_min_level"], args["roi_max_level"]
    lvls = map_levels(rois[:, 1:5], lo, hi, args["roi_canonical_scale"], args["roi_canonical_level"],
                      args["legacy_plus_one"])
    picked = [np.flatnonzero(lvls == k) for k in range(lo, hi + 1)]
    order = np.concatenate(picked) if picked else np.zeros(0, np.int64)
    return [rois[p] for p in picked], np.argsort(order, kind="stable").astype(np.int32)


def _count_outputs(ctx, want: int, op_type: str, what: str) -> None:
    got = len(ctx.opdef.output)
    if got != want:
        raise ShapeError(f"{op_type} with {what} writes {want} outputs, got {got}")


def _host(x) -> np.ndarray:
    return np.asarray(backend.to_host(x))


# ------------------------------------------------------------------------------------------- the three ops
def _collect_shape(specs, **args):
    total = sum(_collect_checks(specs, args["rpn_min_level"], args["rpn_max_level"]))
    return [out_spec((_top(total, args), 5), np.float32)]


@op("CollectRpnProposals", inputs=(2, None), outputs=1, inplace=(), shape=_collect_shape, args=RPN_ARGS,
    gradient=SHOULD_NOT_DO_GRADIENT)
def collect_rpn_proposals(xp, *inputs, **args):
    """rpn_rois_fpn<k> (n_k, 5) for every RPN level, then rpn_roi_probs_fpn<k> (n_k,) -> rois (n, 5): the
    rpn_post_nms_topN best-scored rois over all levels, best first."""
    counts = _collect_checks([Meta(x) for x in inputs], args["rpn_min_level"], args["rpn_max_level"])
    n = len(counts)
    rois = collect([_host(x) for x in inputs[:n]], [_host(x) for x in inputs[n:]], _top(sum(counts), args))
    return xp.asarray(rois)


def _distribute_checks(rois, args):
    _levels(args["roi_min_level"], args["roi_max_level"], "roi")
    check_float("DistributeFpnProposals", rois=rois)
    if len(rois.shape) != 2 or rois.shape[1] not in (4, 5):
        raise ShapeError(f"rois must be (count, 5) [image, x1, y1, x2, y2] or (count, 4), got {tuple(rois.shape)}")


def _level_specs(count, args):
    levels = args["roi_max_level"] - args["roi_min_level"] + 1
    return [value_dependent((None, 5), np.float32)] * levels + [out_spec((count,), np.int32)]


def _distribute_shape(specs, **args):
    _distribute_checks(Meta(specs[0]), args)
    return _level_specs(specs[0].shape[0], args)


@op("DistributeFpnProposals", inputs=1, outputs=(2, None), inplace=(), shape=_distribute_shape, args=ROI_ARGS,
    context=True, gradient=SHOULD_NOT_DO_GRADIENT)
def distribute_fpn_proposals(ctx, xp, rois, **args):
    """rois (n, 5) or (n, 4) -> rois_fpn<k> (n_k, 5) for every RoI level, rois_idx_restore int32 (n,).

    A roi of area a goes to level floor(roi_canonical_level + log2(sqrt(a) / roi_canonical_scale + 1e-6)),
    clipped to [roi_min_level, roi_max_level]; each level keeps the rois' order (4-column rois get a batch
    index 0). rois_idx_restore is the permutation that puts the concatenated levels back in the input order.
    """
    _distribute_checks(rois, args)
    levels = _levels(args["roi_min_level"], args["roi_max_level"], "roi")
    _count_outputs(ctx, levels + 1, "DistributeFpnProposals", f"{levels} RoI levels")
    host = _host(rois).astype(np.float32)
    if host.shape[1] == 4:
        host = np.concatenate([np.zeros((len(host), 1), np.float32), host], axis=1)
    per_level, restore = distribute(host, args)
    return tuple(xp.asarray(r.reshape(-1, 5)) for r in per_level) + (xp.asarray(restore),)


def _both_shape(specs, **args):
    total = sum(_collect_checks(specs, args["rpn_min_level"], args["rpn_max_level"]))
    _levels(args["roi_min_level"], args["roi_max_level"], "roi")
    count = _top(total, args)
    return [out_spec((count, 5), np.float32)] + _level_specs(count, args)


@op("CollectAndDistributeFpnRpnProposals", inputs=(2, None), outputs=(3, None), inplace=(), shape=_both_shape,
    args={**RPN_ARGS, **ROI_ARGS}, context=True, gradient=SHOULD_NOT_DO_GRADIENT)
def collect_and_distribute(ctx, xp, *inputs, **args):
    """CollectRpnProposals then DistributeFpnProposals: rpn_rois_fpn<k>..., rpn_roi_probs_fpn<k>... -> rois
    (n, 5), rois_fpn<k> (n_k, 5) for every RoI level, rois_idx_restore int32 (n,)."""
    counts = _collect_checks([Meta(x) for x in inputs], args["rpn_min_level"], args["rpn_max_level"])
    levels = _levels(args["roi_min_level"], args["roi_max_level"], "roi")
    _count_outputs(ctx, levels + 2, "CollectAndDistributeFpnRpnProposals", f"{levels} RoI levels")
    n = len(counts)
    rois = collect([_host(x) for x in inputs[:n]], [_host(x) for x in inputs[n:]], _top(sum(counts), args))
    per_level, restore = distribute(rois, args)
    return (xp.asarray(rois),) + tuple(xp.asarray(r.reshape(-1, 5)) for r in per_level) + (xp.asarray(restore),)


# ------------------------------------------------------------------------------------------- BatchPermutation
def _perm_checks(x, indices, op_type):
    check_float(op_type, **{"X" if op_type == "BatchPermutation" else "dY": x})
    check_int_dtype(indices.dtype, "indices")
    if len(indices.shape) != 1:
        raise ShapeError(f"indices must be 1-d, got shape {tuple(indices.shape)}")
    if not x.shape or x.shape[0] != indices.shape[0]:
        raise ShapeError(f"{'X' if op_type == 'BatchPermutation' else 'dY'} {tuple(x.shape)} must have as many "
                         f"rows as indices has entries ({indices.shape[0]})")


def _host_indices(indices, n: int) -> np.ndarray:
    ids = _host(indices).astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= n))
    if bad.size:
        raise ShapeError(f"indices[{bad[0]}] = {ids[bad[0]]} is outside the {n} rows of X")
    return ids


@op("BatchPermutation", inputs=2, outputs=1, inplace=(), args={},
    shape=lambda specs: (_perm_checks(Meta(specs[0]), Meta(specs[1]), "BatchPermutation"), [like(specs[0])])[1],
    gradient=single_gradient("BatchPermutationGradient", ["I1", "GO0"]))
def batch_permutation(xp, x, indices):
    """X (N, ...), indices (N,) -> Y with Y[n] = X[indices[n]]. Caffe2 calls indices a permutation of N but
    does not check it; here they must lie in [0, N)."""
    _perm_checks(x, indices, "BatchPermutation")
    ids = _host_indices(indices, x.shape[0])
    return xp.take(x, on_device(xp, ids, np.int64), axis=0)


@op("BatchPermutationGradient", inputs=2, outputs=1, inplace=(), args={},
    shape=lambda specs: (_perm_checks(Meta(specs[1]), Meta(specs[0]), "BatchPermutationGradient"),
                         [like(specs[1])])[1])
def batch_permutation_gradient(xp, indices, dy):
    """indices (N,), dY (N, ...) -> dX with dX[indices[i]] = dY[i] (the inverse permutation). As in Caffe2, for
    indices that are no permutation the last i naming a row wins and a row no index names gets dY[0]."""
    _perm_checks(dy, indices, "BatchPermutationGradient")
    ids = _host_indices(indices, dy.shape[0])
    back = np.zeros(len(ids), np.int64)
    named, first_from_end = np.unique(ids[::-1], return_index=True)
    back[named] = len(ids) - 1 - first_from_end      # the last i with indices[i] = n
    return xp.take(dy, on_device(xp, back, np.int64), axis=0)
