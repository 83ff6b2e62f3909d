"""The batch rows whose sequence has ended by a timestep (t >= seq_lengths[n]), for the recurrent cells: such a
row carries its previous state through (or 0 with drop_states) and, backward, passes the state gradients
straight through with zero gate gradients."""
from __future__ import annotations

import numpy as np

_minimum = np.minimum.reduce


def timestep_of(timestep) -> int:
    return timestep.item() if timestep.size == 1 else int(timestep.reshape(-1)[0])


class Ended:
    """ended(seq, timestep) -> the indices of the ended rows of a host seq_lengths, or None when there are none.
    `begin(seq)`, called once per run with the run's seq_lengths (a compiled step's per-run setup), records the
    shortest length, so a timestep before it costs one comparison; without it every call checks the lengths."""
    __slots__ = ("before",)

    def __init__(self):
        self.before = 0

    def begin(self, seq) -> None:
        if seq.dtype != np.int32 or not seq.size:
            self.before = 0
        else:
            self.before = seq.item() if seq.size == 1 else int(_minimum(seq, axis=None))

    def __call__(self, seq, timestep):
        if seq is None or not seq.size:
            return None
        t = timestep_of(timestep)
        if t < self.before:
            return None
        if seq.size == 1:                     # B=1 (sampling): no temporary arrays
            return None if int(seq.flat[0]) > t else np.zeros(1, np.intp)
        if _minimum(seq, axis=None) > t:      # no sequence has ended: one reduction, no temporaries
            return None
        return np.flatnonzero(seq.reshape(-1) <= t)


class PastEnd:
    """The ended rows of one timestep. With seq_lengths on the host they are row indices, patched in place
    (cost: the ended rows only); with seq_lengths on a device a 1×N×1 mask selects there, with no
    synchronisation (a new array)."""
    __slots__ = ("index", "valid")

    def __init__(self, index=None, valid=None):
        self.index, self.valid = index, valid

    def patch(self, xp, out, other=None):
        """out with the ended rows taken from other, or zeroed."""
        if self.index is not None:
            out[:, self.index] = 0 if other is None else other[:, self.index]
            return out
        return xp.where(self.valid, out, out.dtype.type(0) if other is None else other)


def past_end(xp, seq, timestep, n: int, ended: Ended | None = None) -> PastEnd | None:
    """The rows past their length at this timestep, or None when there are none (always without seq). ended:
    the caller's Ended (a compiled step's, with its per-run begin) for a host seq."""
    if seq is None:
        return None
    if type(seq) is np.ndarray:               # a host array: decide here, skip the common all-valid step
        index = (ended or Ended())(seq, timestep)
        return None if index is None else PastEnd(index=xp.asarray(index) if xp is not np else index)
    return PastEnd(valid=xp.asarray(seq).reshape(1, n, 1) > timestep_of(timestep))


def hold(xp, ended: PastEnd | None, drop: bool, *pairs) -> list:
    """Each (out, prev) pair's out with the ended rows keeping prev (or 0 with drop_states); returns the outs
    (the same arrays on the host, new ones where a device mask selects)."""
    if ended is None:
        return [out for out, _ in pairs]
    return [ended.patch(xp, out, None if drop else prev) for out, prev in pairs]


def bound_step(kernel, args, ended_at: Ended, t: int, ends=None):
    """call(): kernel(*args) for timestep t, then ends() (the ended rows held) from the run's shortest sequence
    length on (ended_at.before: its per-run begin); ends None: no seq_lengths. A cell step bound to its arrays."""
    if ends is None:
        return lambda: kernel(*args)

    def call():
        kernel(*args)
        if t >= ended_at.before:
            ends()
    return call
