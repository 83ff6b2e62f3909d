"""numba's jitted kernels (kernels/jitted.py, the `fast` extra): whether they are installed, loading them once,
and the helpers every runner uses to call them. A workspace picks them (`Workspace(fused_cells=)`; None, the
default: whenever numba is installed) for the LSTM/GRU cells, Softmax and its gradient, Sigmoid, FC of one row,
the one-hot FC weight gradient and Adam, interpreted and compiled alike, so a net gives the same bits whichever
way its timesteps run. They agree with the numpy arithmetic within float32 rounding (Adam's bit for bit);
fused_cells=False keeps numpy."""
from __future__ import annotations

import functools
import importlib.util
import warnings

import numpy as np

F32 = np.dtype(np.float32)


@functools.cache
def installed() -> bool:
    """Whether numba can be imported (without importing it; asked once)."""
    return importlib.util.find_spec("numba") is not None


@functools.cache
def load():
    """The jitted kernel module, or None without a working numba (imported once, on the first call that needs
    it; then every op keeps the numpy arithmetic, interpreted and compiled alike)."""
    if not installed():
        return None
    try:
        from . import jitted
    except Exception as e:  # noqa: BLE001 - a numba that cannot compile or cache here: warn, run numpy
        warnings.warn(f"the fused cell kernels are unavailable ({type(e).__name__}: {e}); the LSTM/GRU cells run "
                      "in numpy", RuntimeWarning, stacklevel=2)
        return None
    return jitted


def rows(name: str, *matrices) -> np.ndarray | None:
    """The jitted row kernel `name` (softmax_grad_rows, ...) over float32 host matrices of one shape (m × k)
    into a new m × k array; None without numba or for other arrays (then the numpy kernel runs)."""
    k = load()
    if k is None or any(type(a) is not np.ndarray or a.dtype != F32 for a in matrices):
        return None
    out = np.empty(matrices[0].shape, F32)
    getattr(k, name)(*(np.ascontiguousarray(a) for a in matrices), out)
    return out


def via_scratch(run, ins, outs) -> None:
    """run into contiguous scratch, then copy into outputs that are not C-contiguous (the kernels write flat)."""
    scratch = [np.empty(o.shape, o.dtype) for o in outs]
    run(ins, scratch)
    for o, s in zip(outs, scratch):
        np.copyto(o, s)


def flat_views(arrays) -> list | None:
    """The arrays as flat views of their memory (what the jitted kernels take), or None when one is not
    C-contiguous (its ravel would be a copy)."""
    return [a.ravel() for a in arrays] if all(a.flags.c_contiguous for a in arrays) else None
