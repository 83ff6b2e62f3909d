"""What a compiled routine depends on from outside its net: the blobs a bound net reads before writing them,
and the signature of their values (StepCompiler.start compares it with the compiled program's)."""
from __future__ import annotations

import weakref

import numpy as np


def external_blobs(net) -> list:
    """The Blobs a bound net reads before any of its ops writes them."""
    written, external, seen = set(), [], set()
    for bop in net.ops:
        for blob in bop.inputs:
            if id(blob) not in written and id(blob) not in seen:
                seen.add(id(blob))
                external.append(blob)
        written.update(id(b) for b in bop.outputs)
    return external


_UNSEEN = object()     # no blob's value


def _UNSEEN_REF():   # noqa: N802 - stands where a weak reference to a checked value would
    return _UNSEEN


def _spec(value) -> tuple | None:
    """A value's part of a signature: shape and dtype of a numpy array; the type of a value that is no array
    (a mutex, a reader: only the kernels of the ops reading it look at it, as their results forms call them);
    None for no value and for an array of another kind (a CuPy array, an Int8 tensor): the net runs op by op."""
    if type(value) is np.ndarray:
        return value.shape, value.dtype
    return None if value is None or hasattr(value, "shape") else (type(value),)


class Inputs:
    """A bound net's external blobs and the signature of their values, rechecked per run: a value that is the
    same object as at the last check is not looked at again (no stepnet code changes an array's shape or dtype
    in place; a fed or newly computed value is a new array), so a run whose weights stay put checks only
    the inputs that were fed. The values checked are held by weak references: a check keeps no array alive
    (a replayed run does not check, and would otherwise keep its first run's inputs)."""
    __slots__ = ("net", "blobs", "values", "sig")

    def __init__(self, net):
        self.net, self.blobs = net, external_blobs(net)
        self.values, self.sig = [_UNSEEN_REF] * len(self.blobs), None

    def signature(self) -> tuple | None:
        values, changed, i = self.values, self.sig is None, 0
        for blob in self.blobs:
            v, seen = blob.value, values[i]()
            if v is not seen or seen is None:     # (a dead reference gives None)
                spec = _spec(v)
                if spec is None:
                    self.values, self.sig = [_UNSEEN_REF] * len(self.blobs), None
                    return None
                try:
                    values[i] = weakref.ref(v)
                except TypeError:                 # (None, a Python number: looked at every time)
                    values[i] = _UNSEEN_REF
                changed = changed or self.sig[i] != spec
            i += 1
        if changed:
            self.sig = tuple(_spec(blob.value) for blob in self.blobs)
        return self.sig
