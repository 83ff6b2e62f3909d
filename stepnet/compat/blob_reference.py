"""Caffe2's core.BlobReference: a blob name and the net it came from, whose ops are its methods."""
from __future__ import annotations

from ..builders.builder import BlobRef
from ..core.errors import did_you_mean
from ..ops import REGISTRY
from . import dyndep


class BlobReference(BlobRef):
    """A blob name (a str, used as given: no scope is added) and the net it came from, whose ops are its
    methods: `x.FC([w, b], "y")` is `net.FC([x, w, b], "y")`."""

    __module__ = "stepnet.compat.core"   # where programs meet it (and pickles find it): Caffe2's core.BlobReference

    def __new__(cls, name, net=None):
        if isinstance(name, bytes):
            name = name.decode("utf-8")
        ref = super().__new__(cls, str(name))
        ref._from_net = net
        ref.meta = {}
        return ref

    def __reduce__(self):
        return (BlobReference, (str(self), None))

    def __repr__(self):
        return f'BlobReference("{self}")'

    def __add__(self, other):
        if not isinstance(other, str):
            raise RuntimeError("Cannot add BlobReference to a non-string.")
        return BlobReference(str(self) + other, self._from_net)

    def __radd__(self, other):
        if not isinstance(other, str):
            raise RuntimeError("Cannot add a non-string to BlobReference.")
        return BlobReference(other + str(self), self._from_net)

    def Net(self):
        return self._from_net

    def GetNameScope(self) -> str:
        return self[:self.rfind("/") + 1]

    def __getattr__(self, op_type):
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        if self._from_net is None:
            raise RuntimeError("You cannot use a blob reference that does not have a net source to create "
                               "operators. Create the operator from an explicit net object.")
        if op_type not in REGISTRY:
            raise AttributeError(f"Method {op_type} is not a registered operator{did_you_mean(op_type, REGISTRY)}"
                                 f"{dyndep.unloaded_note()}")

        def add(inputs=None, *args, **kwargs):
            inputs = [] if inputs is None else [inputs] if isinstance(inputs, str) else list(inputs)
            return getattr(self._from_net, op_type)([self] + inputs, *args, **kwargs)
        return add

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(REGISTRY))
