"""Softmax's arithmetic, once: each row of an M×K matrix shifted by its max, exponentiated and divided by its
sum (the interpreted kernel and its per-signature specialization both call it; the jitted row kernel,
kernels/jitted.py softmax_rows, is the variant a workspace may choose instead)."""
from __future__ import annotations

import contextlib


def rows(xp, x2, out=None):
    """softmax of each row of x2 (M×K, M·K > 0) into out (M×K, C-contiguous; a new array when None). A row
    spanning more than the float range shifts to -inf, whose exp is an exact 0 (no warning)."""
    errstate = getattr(xp, "errstate", None)
    with errstate(over="ignore") if errstate is not None else contextlib.nullcontext():
        e = xp.subtract(x2, x2.max(axis=1, keepdims=True), out=out)
    xp.exp(e, out=e)
    e /= e.sum(axis=1, keepdims=True)
    return e
