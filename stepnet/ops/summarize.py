"""Summarize: four statistics of a float tensor (min, max, mean, standard deviation), returned and/or logged.

Semantics from caffe2/operators/summarize_op.{h,cc}: X must hold at least one float32 value; the mean is summed
in double precision, the standard deviation is the unbiased one (divided by N - 1; 0 for N = 1). The optional
output is a float32 vector [min, max, mean, std]. With to_file the op writes one line per run, "min max mean std"
as a C++ stream prints numbers (6 significant digits), to `<root folder>/<X's name with '/' as '#'>.summary`,
emptied when the bound op first runs (Caffe2 empties it when it constructs the op). Caffe2 declares
SHOULD_NOT_DO_GRADIENT.
"""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import DTypeError, ShapeError
from .base import on_device, out_spec, size_of
from .op_files import append_line
from .registry import SHOULD_NOT_DO_GRADIENT, op

SUMMARY_EXTENSION = ".summary"


def _check(x) -> None:
    if x.dtype is not None and np.dtype(x.dtype) != np.float32:
        raise DTypeError(f"Summarize: X has dtype {np.dtype(x.dtype).name}; Summarize takes float32 (use Cast)")
    if x.shape is not None and None not in x.shape and size_of(x) == 0:
        raise ShapeError(f"Summarize: X of shape {tuple(x.shape)} is empty; it needs at least one value")


def _summarize_shape(specs, *, to_file):
    _check(specs[0])
    return [out_spec((4,), np.float32)]


def statistics(x: np.ndarray) -> tuple[float, float, float, float]:
    """(min, max, mean, std) of a float32 array: min and max as float32 values, mean and the unbiased std in
    double precision."""
    flat = x.reshape(-1)
    n = flat.size
    mean = float(np.sum(flat, dtype=np.float64) / n)
    std = 0.0 if n == 1 else float(np.sqrt(np.sum((flat.astype(np.float64) - mean) ** 2) / (n - 1)))
    return float(flat.min()), float(flat.max()), mean, std


@op("Summarize", inputs=1, outputs=(0, 1), context=True, devices="any", args={"to_file": 0},
    shape=_summarize_shape, gradient=SHOULD_NOT_DO_GRADIENT)
def summarize(ctx, xp, x, *, to_file):
    """X (float32, not empty) -> [min, max, mean, std] (float32, 4), the output optional; to_file: also one line
    'min max mean std' per run appended to <root folder>/<X>.summary."""
    _check(x)
    host = np.asarray(backend.to_host(x))
    low, high, mean, std = statistics(host)
    if to_file:
        append_line(ctx, SUMMARY_EXTENSION, " ".join(f"{v:g}" for v in (low, high, mean, std)))
    if not ctx.opdef.output:
        return None
    return on_device(xp, [low, high, mean, std], np.float32)
