"""Segment reductions by segment ids with Caffe2's plain reducers: {Sparse}{Sorted,Unsorted}Segment{Sum,Mean,
WeightedSum} and their gradient ops {Sorted,Unsorted}Segment{Sum,Mean,WeightedSum}Gradient.

Semantics follow Caffe2's segment_reduction_op.{h,cc} (AbstractSortedSegmentOp, AbstractUnsortedSegmentOp) and
reducer_functors.h. The inputs are DATA, then SCALARS (WeightedSum: one weight per id, a vector), then INDICES
(the Sparse forms: the DATA row each id reduces, a gathered lookup fused in), then SEGMENT_IDS. Sorted ids start
at 0 and step by 0 or 1 (ids[-1] + 1 rows out); unsorted ids come in any order, with num_segments rows out
(default max id + 1). A segment without rows gives 0, its Mean too.

Gradients, as Caffe2's SegmentOpGetGradient emits them: [SCALARS,] dY, SEGMENT_IDS -> <Sorted|Unsorted>Segment
<R>Gradient -> the gradient of every reduced position (dY of its segment; / length for Mean; * its weight for
WeightedSum). The dense forms' DATA gradient is that; the Sparse forms' is the slice (INDICES, those values),
named <DATA>_grad_values. The weights get no gradient (grad_on_weights=1 is refused, as Caffe2 refuses it).
"""
from __future__ import annotations

import numpy as np

from ..core.errors import GradientError, ShapeError
from .base import check_float, host_ints, known_ints, on_device, out_spec, value_dependent
from .index import check_bounds, require_int, spec_value
from .registry import op
from .segment_ranges import data_rows, grad_checks, segment_id_values, sorted_lengths, unsorted_count
from .segments import reduce_rows, segment_layout

REDUCERS = ("Sum", "Mean", "WeightedSum")


def _split(kind: str, sparse: bool, inputs):
    """(DATA, SCALARS or None, INDICES or None, SEGMENT_IDS) from an op's inputs."""
    data, *rest = inputs
    weights = rest.pop(0) if kind == "WeightedSum" else None
    indices = rest.pop(0) if sparse else None
    return data, weights, indices, rest[0]


def _checks(op_type, kind, sorted_ids, inputs, read, num_segments):
    """Every check of a forward op; (ids or None, the number of segments or None, DATA, SCALARS, INDICES)."""
    data, weights, indices, segment_ids = _split(kind, indices_in(op_type), inputs)
    rows = data_rows(data, op_type)
    if indices is not None:
        require_int(indices, f"{op_type}: INDICES")
        if len(indices.shape) != 1:
            raise ShapeError(f"{op_type}: INDICES must be a vector, got shape {tuple(indices.shape)}")
    ids = segment_id_values(segment_ids, rows if indices is None else indices.shape[0], read, op_type)
    if weights is not None:
        check_float(op_type, DATA=data, SCALARS=weights)
        if tuple(weights.shape) != (segment_ids.shape[0],):
            raise ShapeError(f"{op_type}: SCALARS {tuple(weights.shape)} must be a vector with one weight per "
                             f"segment id ({segment_ids.shape[0]})")
    if ids is None:
        count = None if sorted_ids or num_segments == -1 else num_segments
    else:
        count = len(sorted_lengths(ids, op_type)) if sorted_ids else unsorted_count(ids, num_segments, op_type)
    return ids, count, data, weights, indices


def indices_in(op_type: str) -> bool:
    return op_type.startswith("Sparse")


def _forward(op_type: str, kind: str, sorted_ids: bool):
    sparse = indices_in(op_type)

    def shape(specs, *, num_segments=-1, grad_on_weights=0):
        ids, count, data, _, indices = _checks(op_type, kind, sorted_ids, specs, known_ints, num_segments)
        if indices is not None:
            check_bounds(np, spec_value(indices), data.shape[0], f"{op_type}: INDICES",
                         f" for DATA of shape {tuple(data.shape)}")
        return [value_dependent((count, *data.shape[1:]), data.dtype)]

    def kernel(xp, *inputs, num_segments=-1, grad_on_weights=0):
        ids, count, data, weights, indices = _checks(op_type, kind, sorted_ids, inputs, host_ints, num_segments)
        ids = np.asarray(ids, dtype=np.int64)
        order = np.argsort(ids, kind="stable")          # the positions of each segment, in order
        pos, mask = segment_layout(xp, np.bincount(ids, minlength=count).tolist())
        at = xp.take(on_device(xp, order, np.int64), pos, axis=0) if order.size else pos
        rows = at
        if indices is not None:
            check_bounds(xp, indices, data.shape[0], f"{op_type}: INDICES", f" for DATA of shape {tuple(data.shape)}")
            rows = xp.take(indices.astype(np.int64), at, axis=0) if order.size else at
        w = None if weights is None else xp.take(weights, at, axis=0)
        return reduce_rows(xp, data, rows, mask, "mean" if kind == "Mean" else "sum", data.dtype, w)

    kernel.__name__ = kernel.__qualname__ = op_type
    ins = ["DATA"] + (["SCALARS"] if kind == "WeightedSum" else []) + (["INDICES"] if sparse else []) + ["SEGMENT_IDS"]
    what = {"Sum": "sum", "Mean": "mean", "WeightedSum": "sum, each row scaled by its SCALARS weight,"}[kind]
    order = "sorted from 0 without gaps" if sorted_ids else "in any order (num_segments rows out, default max + 1)"
    rows = "DATA[INDICES[k]]" if sparse else "DATA row k"
    args = ({} if sorted_ids else {"num_segments": -1}) | ({"grad_on_weights": 0} if kind == "WeightedSum" else {})
    op(op_type, inputs=len(ins), outputs=1, inplace=(), args=args, shape=shape, grows="values",
       gradient=_maker(op_type, kind, sorted_ids, len(ins)),
       doc=f"{', '.join(ins)} -> the {what} of the {rows} of each segment, SEGMENT_IDS[k] naming row k's segment "
           f"({order}); an empty segment gives 0.")(kernel)


def _maker(op_type: str, kind: str, sorted_ids: bool, n_inputs: int):
    grad_type = f"{'Sorted' if sorted_ids else 'Unsorted'}Segment{kind}Gradient"

    def maker(g):
        if kind == "WeightedSum" and g.arg("grad_on_weights", 0):
            raise GradientError(f"{op_type} has no gradient for its weights (grad_on_weights=1), as in Caffe2; "
                                "use SparseLengthsWeightedSum for that", at=g.label)
        ins = ([g.I(1)] if kind == "WeightedSum" else []) + [g.GO(0), g.I(n_inputs - 1)]
        if indices_in(op_type):
            values = g.I(0) + "_grad_values"
            g.op(grad_type, ins, [values])
            g.set_sparse(0, g.I(n_inputs - 2), values)
        else:
            g.op(grad_type, ins, [g.GI(0)])
    maker.__name__ = maker.__qualname__ = f"{op_type}_gradient"
    return maker


def _grad_checks(op_type, kind, sorted_ids, inputs, read):
    """The gradient ops' checks; (ids or None, segment lengths or None, dY, SCALARS or None)."""
    weights = inputs[0] if kind == "WeightedSum" else None
    dy, segment_ids = inputs[-2:]
    ids, lengths = grad_checks(dy, segment_ids, read, op_type, sorted_ids)
    if weights is not None:
        check_float(op_type, SCALARS=weights, dY=dy)
        if tuple(weights.shape) != (segment_ids.shape[0],):
            raise ShapeError(f"{op_type}: SCALARS {tuple(weights.shape)} must be a vector with one weight per "
                             f"segment id ({segment_ids.shape[0]})")
    if ids is not None and lengths is None:
        lengths = np.bincount(np.asarray(ids, dtype=np.int64), minlength=dy.shape[0]).tolist()
    return ids, lengths, dy, weights


def _backward(kind: str, sorted_ids: bool):
    op_type = f"{'Sorted' if sorted_ids else 'Unsorted'}Segment{kind}Gradient"

    def shape(specs, **_):
        _, _, dy, _ = _grad_checks(op_type, kind, sorted_ids, specs, known_ints)
        return [out_spec((specs[-1].shape[0], *dy.shape[1:]), dy.dtype)]

    def kernel(xp, *inputs, **_):
        ids, lengths, dy, weights = _grad_checks(op_type, kind, sorted_ids, inputs, host_ints)
        ids = np.asarray(ids, dtype=np.int64)
        out = xp.take(dy, on_device(xp, ids, np.int64), axis=0)
        scale = weights
        if kind == "Mean":
            scale = on_device(xp, 1.0 / np.maximum(np.asarray(lengths, dtype=np.float64)[ids], 1.0), dy.dtype)
        if scale is not None:
            out = out * xp.reshape(scale.astype(dy.dtype, copy=False), (-1,) + (1,) * (dy.ndim - 1))
        return out.astype(dy.dtype, copy=False)

    kernel.__name__ = kernel.__qualname__ = op_type
    ins = (["SCALARS"] if kind == "WeightedSum" else []) + ["dY", "SEGMENT_IDS"]
    what = {"Sum": "dY[SEGMENT_IDS[k]]", "Mean": "dY[SEGMENT_IDS[k]] / the segment's length",
            "WeightedSum": "SCALARS[k] * dY[SEGMENT_IDS[k]]"}[kind]
    args = ({} if sorted_ids else {"num_segments": -1}) | ({"grad_on_weights": 0} if kind == "WeightedSum" else {})
    op(op_type, inputs=len(ins), outputs=1, inplace=(), args=args, shape=shape,
       doc=f"{', '.join(ins)} -> the gradient of each reduced position k: {what}.")(kernel)


for _kind in REDUCERS:
    for _sorted in (True, False):
        for _prefix in ("", "Sparse"):
            _forward(f"{_prefix}{'Sorted' if _sorted else 'Unsorted'}Segment{_kind}", _kind, _sorted)
        _backward(_kind, _sorted)
