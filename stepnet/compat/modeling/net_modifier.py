"""Caffe2's NetModifier: the base of objects that add ops to a net they are called on (norms, statistics,
histograms of blobs; gradient clipping). `modifier(net, init_net=None, grad_map=None, blob_to_device=None)`
calls its `modify_net` with the same arguments."""
from __future__ import annotations

import abc

from .. import core, schema


class NetModifier(abc.ABC):
    """Adds ops to a net; subclasses define modify_net."""

    @abc.abstractmethod
    def modify_net(self, net, init_net=None, grad_map=None, blob_to_device=None):
        """Add this modifier's ops to net (init_net: its init net; grad_map: param -> gradient; blob_to_device:
        where each blob lives)."""

    def __call__(self, net, init_net=None, grad_map=None, blob_to_device=None):
        self.modify_net(net, init_net=init_net, grad_map=grad_map, blob_to_device=blob_to_device)


def defined_blob(net, blob_name):
    """blob_name as a BlobReference, which net must already define (Caffe2's modifiers raise a plain
    Exception otherwise)."""
    blob = core.BlobReference(blob_name)
    if not net.BlobIsDefined(blob):
        raise Exception(f"blob {blob} is not defined in net {net.Name()}")
    return blob


def add_output_field(net, field_name: str, scalar) -> None:
    """Record scalar under field_name in the net's output record (a new Struct when it has none)."""
    if net.output_record() is None:
        net.set_output_record(schema.Struct((field_name, scalar)))
    else:
        net.AppendOutputRecordField(field_name, scalar)
