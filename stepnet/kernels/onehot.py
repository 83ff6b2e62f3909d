"""FC and its gradient on one-hot rows (a char-rnn's input: each row of X one 1, the rest 0), without the GEMM.

Y = X·Wᵀ + b then is row idx[r] of Wᵀ + b: one gather instead of an M×K×N product (a quarter of the
GEMM's time at M=800, K=65, N=512). The product over a one-hot row adds exact zeros to the one weight it
picks, so the gather gives the GEMM's values bit for bit whenever W + b is finite (a 0·inf in the GEMM would
make a NaN the gather cannot see: then the GEMM runs). Only the sign of an exact zero can differ.

The weight gradient dW = dYᵀ·X is a sum of dY's rows per column of X (a scatter-add, numba's, so only with
the fused kernels on: Workspace.fused_cells). Its summation order differs from the GEMM's, so its results
agree within float rounding; a non-finite sum falls back to the GEMM, whose 0·inf NaNs it would miss.
The detection reads X once (about 5 % of the GEMM it saves) and rejects a dense X on its first row.
"""
from __future__ import annotations

import numpy as np

ONE_HOT_ROWS = 64      # below this the gather's W + b pass costs more than the GEMM it saves
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def one_hot_columns(X2) -> np.ndarray | None:
    """idx with X2[r, idx[r]] the only nonzero of row r, and 1, for every row of the M×K float matrix X2
    (a C-contiguous host array with at least ONE_HOT_ROWS rows); None otherwise. Counted on the bits (a -0.0
    counts as nonzero: such an X takes the GEMM), whose integer count and argmax are the fast ones."""
    if (type(X2) is not np.ndarray or X2.shape[0] < ONE_HOT_ROWS or X2.shape[1] < 2 or X2.dtype.kind != "f"
            or X2.itemsize not in _BITS or not X2.flags.c_contiguous):
        return None
    first = X2[0]
    if np.count_nonzero(first) != 1 or not first.max() == 1:      # a NaN max is not 1
        return None
    bits = X2.view(_BITS[X2.itemsize])
    if np.count_nonzero(bits) != X2.shape[0]:
        return None
    idx = bits.argmax(axis=1)                      # each row's one nonzero, when it has one
    return idx if (X2[np.arange(X2.shape[0]), idx] == 1).all() else None


def gather_fc(X2, Wt, b, out=None) -> np.ndarray | None:
    """X2·Wt + b for one-hot rows of X2 (Wt: the K×N weight, a view of any layout), or None where X2 is not
    one-hot, Wt + b is not finite, or the K×N table would be larger than the M×N result (a vocabulary wider
    than the batch: the GEMM then, whose memory is the result's). out: an M×N array to write it into."""
    if not X2.dtype == Wt.dtype == b.dtype or X2.shape[1] > X2.shape[0]:
        return None
    idx = one_hot_columns(X2)
    if idx is None:
        return None
    table = Wt + b
    if not np.isfinite(table).all():
        return None
    if out is None:
        return table.take(idx, axis=0)
    return table.take(idx, axis=0, out=out, mode="clip")   # (idx are in range; "raise" would buffer out)


def scatter_weight_grad(X2, G, kernels, transpose: bool = False) -> np.ndarray | None:
    """X2ᵀ·G (K×N) for one-hot rows of X2 as a per-column sum of G's rows, by the numba kernel module's
    `add_rows` (transpose: its transpose Gᵀ·X2, N×K, FC's weight layout, written so by the kernel); None where
    X2 is not one-hot, the dtypes are not float32 or the sum is not finite."""
    if kernels is None or not X2.dtype == G.dtype == np.float32 or not G.flags.c_contiguous:
        return None
    idx = one_hot_columns(X2)
    if idx is None:
        return None
    out = kernels.add_rows(G, idx, X2.shape[1], transpose)
    return out if np.isfinite(out).all() else None
