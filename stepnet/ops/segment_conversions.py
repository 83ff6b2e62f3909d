"""Two more conversions of segment bookkeeping: SegmentIdsToRanges (sorted segment ids -> (offset, length) per
segment) and LengthsToWeights (lengths -> a weight 1 / length^power for every item of each segment).

Semantics from caffe2/operators/utility_ops.{h,cc}. SegmentIdsToRanges counts segments as SegmentIdsToLengths
does (last id + 1, or the second input's first dim) and writes int32 (offset, length) rows; a segment missing
between two present ids starts where the next present one does, and one before the first id or after the last
keeps offset 0, as Caffe2's loop leaves them. Caffe2 declares it SHOULD_NOT_DO_GRADIENT. LengthsToWeights
takes int32/int64 lengths and gives float32 weights (no gradient registered), computed in double as Caffe2
does (1/sqrt(l) for power 0.5, 1/l for 1, else 1/pow(l, power)).
"""
from __future__ import annotations

import numpy as np

from .base import host_ints, known_ints, on_device, out_spec
from .index import known_lengths, read_lengths, require_int, total
from .registry import SHOULD_NOT_DO_GRADIENT, op
from .segments import _segment_count


# --------------------------------------------------------------------------------------------- ranges
def _ranges(ids: list[int], count: int) -> np.ndarray:
    """int32 (count, 2) rows of (offset, length) for sorted ids."""
    out = np.zeros((count, 2), dtype=np.int64)
    if ids:
        values = np.asarray(ids, dtype=np.int64)
        upto = ids[-1] + 1
        out[:upto, 0] = np.searchsorted(values, np.arange(upto), side="left")
        out[:upto, 1] = np.bincount(values, minlength=upto)
    return out.astype(np.int32)


def _ids_to_ranges_shape(specs):
    require_int(specs[0], "SegmentIdsToRanges: segment_ids")
    count = _segment_count(specs[0], specs[1:], known_ints)
    return [out_spec((count, 2), np.int32)]


@op("SegmentIdsToRanges", inputs=(1, 2), outputs=1, inplace=(), shape=_ids_to_ranges_shape, grows="values",
    gradient=SHOULD_NOT_DO_GRADIENT)
def segment_ids_to_ranges(xp, segment_ids, *data):
    """Sorted segment ids -> int32 (offset, length) of every segment; the number of segments is the second
    input's first dimension when given, else last id + 1. [0, 0, 1, 3, 3] -> [[0, 2], [2, 1], [3, 0], [3, 2]]."""
    require_int(segment_ids, "SegmentIdsToRanges: segment_ids")
    count = _segment_count(segment_ids, data, host_ints)
    return on_device(xp, _ranges(host_ints(segment_ids, "segment_ids"), count), np.int32)


# --------------------------------------------------------------------------------------------- weights
def _weights_shape(specs, *, power):
    return [out_spec((total(known_lengths(specs[0], "lengths")),), np.float32)]


@op("LengthsToWeights", inputs=1, outputs=1, inplace=(), args={"power": 0.5}, shape=_weights_shape,
    grows="values")
def lengths_to_weights(xp, lengths, *, power):
    """int32/int64 lengths -> float32 weights: length l gives l copies of 1 / l^power. [2, 0, 1] with power
    1 -> [0.5, 0.5, 1.0]."""
    require_int(lengths, "LengthsToWeights: lengths")
    lens = np.asarray(read_lengths(lengths, "lengths"), dtype=np.int64)
    p, length = float(np.float32(power)), lens.astype(np.float64)    # Caffe2 keeps the argument as a float
    with np.errstate(divide="ignore"):
        per_segment = 1.0 / (np.sqrt(length) if p == 0.5 else length if p == 1 else np.power(length, p))
    return on_device(xp, np.repeat(per_segment, lens), np.float32)
