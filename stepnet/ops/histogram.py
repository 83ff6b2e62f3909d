"""AccumulateHistogram: the histogram of a tensor's values, and the histogram of every tensor the op has seen.

Semantics from caffe2/operators/utility_ops.{h,cc} (AccumulateHistogramOp): num_buckets equal buckets over
[lower_bound, upper_bound) plus two more, bucket 0 for values below lower_bound and bucket num_buckets + 1 for
values at or above upper_bound; a value x in range goes to bucket int((x - lower_bound) / width) + 1, width =
(upper_bound - lower_bound) / num_buckets, in float32 arithmetic as Caffe2's. Both outputs are int64 vectors of
num_buckets + 2 counts: CUR_HIST of this run's input, ACC_HIST of all runs of this op (its state, kept by the
bound op as Caffe2 keeps it in the operator). A NaN falls in no bucket and is an error here (Caffe2's cast is
undefined). Caffe2 declares SHOULD_NOT_DO_GRADIENT.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, OpError
from .base import check_float, on_device, out_spec
from .registry import SHOULD_NOT_DO_GRADIENT, op

HISTOGRAM_ARGS = {"lower_bound": 0.0, "upper_bound": 1.0, "num_buckets": 1}


def _check_buckets(num_buckets: int) -> None:
    if num_buckets <= 0:
        raise ArgumentError(f"AccumulateHistogram argument num_buckets must be > 0, got {num_buckets}")


def _histogram_shape(specs, *, lower_bound, upper_bound, num_buckets):
    check_float("AccumulateHistogram", X=specs[0])
    _check_buckets(num_buckets)
    return [out_spec((num_buckets + 2,), np.int64)] * 2


def bucket_counts(xp, x, lower_bound: float, upper_bound: float, num_buckets: int):
    """The num_buckets + 2 counts of x's values (a device int64 vector)."""
    flat = x.reshape(-1).astype(np.float32)
    if flat.size and bool(xp.isnan(flat).any()):
        i = int(xp.argmax(xp.isnan(flat)))
        raise OpError(f"AccumulateHistogram: X has a NaN at flat position {i}; a NaN falls in no bucket")
    lo, hi = np.float32(lower_bound), np.float32(upper_bound)
    width = np.float32(hi - lo) / np.float32(num_buckets)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inside = (flat - lo) / width
    inside = xp.where((flat >= lo) & (flat < hi), inside, 0).astype(np.int64) + 1
    index = xp.where(flat < lo, 0, xp.where(flat >= hi, num_buckets + 1, inside))
    return xp.bincount(index, minlength=num_buckets + 2).astype(np.int64)


@op("AccumulateHistogram", inputs=1, outputs=2, inplace=(), context=True, args=HISTOGRAM_ARGS,
    shape=_histogram_shape, shapes_from_inputs=True, grows="shapes", gradient=SHOULD_NOT_DO_GRADIENT)
def accumulate_histogram(ctx, xp, x, *, lower_bound, upper_bound, num_buckets):
    """X (float) -> CUR_HIST, ACC_HIST (int64, num_buckets + 2 each): the counts of X's values below
    lower_bound, in each of num_buckets equal buckets of [lower_bound, upper_bound), and at or above
    upper_bound; ACC_HIST sums CUR_HIST over every run of this op."""
    check_float("AccumulateHistogram", X=x)
    _check_buckets(num_buckets)
    current = bucket_counts(xp, x, lower_bound, upper_bound, num_buckets)
    host = np.asarray(current.get() if hasattr(current, "get") else current, dtype=np.int64)
    acc = ctx.state.get("histogram")
    acc = ctx.state["histogram"] = host if acc is None else acc + host
    return current, on_device(xp, acc, np.int64)
