"""Caffe2's ComputeHistogramForBlobs: a NetModifier adding, per blob, its histogram over `num_buckets` equal
buckets of [lower_bound, upper_bound) plus one bucket below and one above (num_buckets + 2 in all), as
fractions of the values counted: Cast to float, AccumulateHistogram (this run's counts and the counts of every
run so far), Cast of the one kept (`accumulate`: the running counts) to float, NormalizeL1 into
`<blob>_curr_normalized_hist` (or `_acc_normalized_hist`, scoped), printed every `logging_frequency` runs when
that is >= 1, and recorded as a field of the net's output record."""
from __future__ import annotations

import numpy as np

from .net_modifier import NetModifier, add_output_field, defined_blob
from .. import core, schema


class ComputeHistogramForBlobs(NetModifier):
    """Adds the normalized histograms of `blobs` to a net (see the module)."""

    def __init__(self, blobs, logging_frequency, num_buckets=30, lower_bound=0.0, upper_bound=1.0,
                 accumulate=False):
        self._blobs = blobs
        self._logging_frequency = logging_frequency
        self._accumulate = accumulate
        self._field_name_suffix = "_acc_normalized_hist" if accumulate else "_curr_normalized_hist"
        self._num_buckets = int(num_buckets)
        assert self._num_buckets > 0, f"num_buckets need to be greater than 0, got {num_buckets}"
        self._lower_bound = float(lower_bound)
        self._upper_bound = float(upper_bound)

    def modify_net(self, net, init_net=None, grad_map=None, blob_to_device=None):
        for name in self._blobs:
            blob = defined_blob(net, name)
            as_float = net.Cast(blob, net.NextScopedBlob(prefix=blob + "_float"), to=core.DataType.FLOAT)
            current, running = net.AccumulateHistogram(
                [as_float], [net.NextScopedBlob(prefix=blob + "_curr_hist"),
                             net.NextScopedBlob(prefix=blob + "_acc_hist")],
                num_buckets=self._num_buckets, lower_bound=self._lower_bound, upper_bound=self._upper_bound)
            counts = net.Cast(running if self._accumulate else current,
                              net.NextScopedBlob(prefix=blob + "_cast_hist"), to=core.DataType.FLOAT)
            normalized = net.NormalizeL1(counts, net.NextScopedBlob(prefix=blob + self._field_name_suffix))
            if self._logging_frequency >= 1:
                net.Print(normalized, [], every_n=self._logging_frequency)
            add_output_field(net, str(blob) + self._field_name_suffix,
                             schema.Scalar((np.float32, (self._num_buckets + 2,)), normalized))

    def field_name_suffix(self) -> str:
        return self._field_name_suffix
