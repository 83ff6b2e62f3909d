"""Caffe2's ComputeNormForBlobs: a NetModifier adding, per blob, an LpNorm (p = 1 or 2: L1, or the squared L2
norm LpNorm computes; `compute_averaged_norm`: divided by the blob's size) into `<blob>_l<p>_norm` (or
`<blob>_averaged_l<p>_norm`, scoped), printed every `logging_frequency` runs when that is >= 1, and recorded as a
field of the net's output record."""
from __future__ import annotations

from .net_modifier import NetModifier, add_output_field, defined_blob
from .. import schema


class ComputeNormForBlobs(NetModifier):
    """Adds the norms of `blobs` to a net (see the module)."""

    def __init__(self, blobs, logging_frequency, p=2, compute_averaged_norm=False):
        self._blobs = blobs
        self._logging_frequency = logging_frequency
        self._p = p
        self._compute_averaged_norm = compute_averaged_norm
        self._field_name_suffix = ("_averaged" if compute_averaged_norm else "") + f"_l{p}_norm"

    def modify_net(self, net, init_net=None, grad_map=None, blob_to_device=None):
        for name in self._blobs:
            blob = defined_blob(net, name)
            norm = net.LpNorm(blob, net.NextScopedBlob(prefix=blob + self._field_name_suffix),
                              p=self._p, average=self._compute_averaged_norm)
            if self._logging_frequency >= 1:
                net.Print(norm, [], every_n=self._logging_frequency)
            add_output_field(net, str(blob) + self._field_name_suffix, schema.Scalar((float, (1,)), norm))

    def field_name_suffix(self) -> str:
        return self._field_name_suffix
