"""Caffe2's ComputeStatisticsForBlobs: a NetModifier adding, per blob, a Cast to float and a Summarize into
`<blob>_summary` (scoped: min, max, mean, standard deviation), printed every `logging_frequency` runs and
recorded as a field of the net's output record."""
from __future__ import annotations

from .net_modifier import NetModifier, add_output_field, defined_blob
from .. import core, schema


class ComputeStatisticsForBlobs(NetModifier):
    """Adds the statistics of `blobs` to a net (see the module)."""

    def __init__(self, blobs, logging_frequency):
        self._blobs = blobs
        self._logging_frequency = logging_frequency
        self._field_name_suffix = "_summary"

    def modify_net(self, net, init_net=None, grad_map=None, blob_to_device=None):
        for name in self._blobs:
            blob = defined_blob(net, name)
            as_float = net.Cast(blob, to=core.DataType.FLOAT)
            stats = net.Summarize(as_float, net.NextScopedBlob(prefix=blob + self._field_name_suffix), to_file=0)
            net.Print(stats, [], every_n=self._logging_frequency)
            add_output_field(net, str(blob) + self._field_name_suffix, schema.Scalar((float, (1,)), stats))

    def field_name_suffix(self) -> str:
        return self._field_name_suffix
