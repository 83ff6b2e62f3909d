"""Gradient ops of the gathers (index.py, where the makers are), which emit what Caffe2's makers emit
(gather_op.cc, batch_gather_ops.cc):

- Gather along axis 0: no op, DATA's gradient is the sparse GradientSlice (INDICES, dY), rows of dY for the
  rows of DATA the indices name (repeats included; whoever applies it adds them up). With dense_gradient=1:
  SparseToDense([INDICES, dY, DATA]) -> dDATA, Gather's arguments copied.
- Gather along another axis (the later era): BatchGatherGradient([DATA, INDICES, dY]) -> dDATA with that axis;
  an explicit dense_gradient=0 is an error there, as in Caffe2.
- BatchGather -> BatchGatherGradient([DATA, INDICES, dY]) -> dDATA (axis 1).

OneHot and BatchOneHot (NO_GRADIENT), ArgMax and ArgMin (SHOULD_NOT_DO_GRADIENT in the later era; the 2017
arg_ops.cc said NO_GRADIENT) are declared with their ops. GatherRanges has none: Caffe2 registers its
SHOULD_NOT_DO_GRADIENT under the misspelt name GatherRangesOp, so asking for its gradient is an error.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from .index import NOT_IN_PLACE, check_bounds, require_int
from .base import canonical_axis, host_ints, out_spec
from .registry import Arg, op
from .segments import scatter_rows


# ------------------------------------------------------------------------------------- BatchGatherGradient
def _batch_gather_grad_geometry(data, indices, grad, axis, match_outer) -> tuple[int, int]:
    """(axis, indices per outer slice) after BatchGatherGradient's checks (index values aside)."""
    require_int(indices, "INDICES")
    ds, ids, gs = tuple(data.shape), tuple(indices.shape), tuple(grad.shape)
    if len(ds) < 2:
        raise ShapeError(f"DATA must be at least 2-D, got shape {ds}")
    ax = canonical_axis(axis, len(ds))
    if gs[:ax] != ds[:ax]:
        raise ShapeError(f"dY {gs} and DATA {ds} must agree in the dimensions before axis {ax}")
    if match_outer:
        if ax < 1 or ids[:ax] != ds[:ax]:
            raise ShapeError(f"match_outer needs axis >= 1 and INDICES {ids} to share DATA's dimensions "
                             f"before axis {ax} {ds[:ax]}")
        per = math.prod(ids[ax:])
    else:
        per = math.prod(ids)
    want = math.prod(ds[:ax]) * per * math.prod(ds[ax + 1:])
    if math.prod(gs) != want:
        raise ShapeError(f"dY {gs} must hold {want} elements: DATA {ds} gathered along axis {ax} by INDICES "
                         f"{ids}; pass the gradient of the gather's output")
    return ax, per


def _batch_gather_grad_shape(specs, *, axis, match_outer, **_gather):
    data, indices, grad = specs
    _batch_gather_grad_geometry(data, indices, grad, axis, match_outer)
    return [out_spec(data.shape, data.dtype)]


# Gather's other arguments are accepted and ignored: Gather's gradient along axis > 0 carries them.
@op("BatchGatherGradient", inputs=3, outputs=1, inplace=NOT_IN_PLACE,
    args={"axis": 1, "match_outer": False, "dense_gradient": Arg("bool", None),
          "wrap_indices": Arg("bool", None)},
    shape=_batch_gather_grad_shape)
def batch_gather_gradient(xp, data, indices, grad, axis, match_outer, **_gather):
    """[DATA, INDICES, dY] -> dDATA: zeros like DATA with each gathered slice of dY added back where it came
    from along `axis` (repeated indices add up). Indices must lie in [0, dim): Caffe2 does not wrap
    negative ones here."""
    ax, per = _batch_gather_grad_geometry(data, indices, grad, axis, match_outer)
    outer, dim, inner = math.prod(data.shape[:ax]), data.shape[ax], math.prod(data.shape[ax + 1:])
    check_bounds(xp, indices, dim, "INDICES", f" along axis {ax} of DATA {tuple(data.shape)}")
    ids = np.asarray(host_ints(indices, "INDICES"), dtype=np.int64).reshape(outer if match_outer else 1, per)
    targets = (np.arange(outer).reshape(-1, 1) * dim + ids).reshape(-1)   # rows of DATA seen as (outer*dim)
    rows = xp.reshape(grad, (outer * per, inner)).astype(data.dtype, copy=False)
    return xp.reshape(scatter_rows(xp, targets, rows, outer * dim), data.shape)
