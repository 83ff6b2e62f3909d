"""Element-wise string ops (Caffe2's string_ops): StringPrefix, StringSuffix, StringStartsWith, StringEndsWith.
(StringJoin is in sampling.py.)

String tensors are object arrays of bytes (str elements are read as their UTF-8 bytes). Like Caffe2 the ops
work on bytes: a prefix or suffix of a given length counts bytes, so it may cut a multi-byte character."""
from __future__ import annotations

import numpy as np

from ..core.errors import ArgumentError, DTypeError
from .base import like
from .registry import SHOULD_NOT_DO_GRADIENT, op


def _strings(x) -> list[bytes]:
    """The elements of string tensor x, flat, as bytes."""
    if getattr(x, "dtype", None) is None or x.dtype.kind != "O":
        raise DTypeError(f"input 0 must be a string tensor, got {getattr(x, 'dtype', None) or type(x).__name__}")
    flat = np.asarray(x).reshape(-1).tolist()
    if not all(isinstance(s, (bytes, str)) for s in flat):
        bad = next(s for s in flat if not isinstance(s, (bytes, str)))
        raise DTypeError(f"input 0 must hold strings, but it holds {type(bad).__name__} values")
    return [s.encode("utf-8") if isinstance(s, str) else s for s in flat]


def _check_string_dtype(specs, **_):
    if specs[0].dtype is not None and specs[0].dtype != object:
        raise DTypeError(f"input 0 must be a string tensor, got {specs[0].dtype}")


def _same_shape(dtype):
    def shape(specs, **args):
        _check_string_dtype(specs)
        return [like(specs[0], dtype)]
    return shape


def _shaped(values: list, x, dtype) -> np.ndarray:
    out = np.empty(len(values), dtype)
    out[:] = values
    return out.reshape(x.shape)


def _check_length(length: int) -> None:
    if length < 0:
        raise ArgumentError(f"length must be >= 0 (a number of bytes), got {length}")


def _as_bytes(text) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8")


@op("StringPrefix", inputs=1, outputs=1, args={"length": 3}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_same_shape(object))
def string_prefix(xp, strings, *, length):
    """The first `length` bytes of each string (shorter strings whole), as a string tensor of the same shape."""
    _check_length(length)
    return _shaped([s[:length] for s in _strings(strings)], strings, object)


@op("StringSuffix", inputs=1, outputs=1, args={"length": 3}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_same_shape(object))
def string_suffix(xp, strings, *, length):
    """The last `length` bytes of each string (shorter strings whole), as a string tensor of the same shape."""
    _check_length(length)
    return _shaped([s[len(s) - min(length, len(s)):] for s in _strings(strings)], strings, object)


@op("StringStartsWith", inputs=1, outputs=1, args={"prefix": ""}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_same_shape(np.bool_))
def string_starts_with(xp, strings, *, prefix):
    """Whether each string starts with `prefix` (bool, the input's shape)."""
    prefix = _as_bytes(prefix)
    return _shaped([s.startswith(prefix) for s in _strings(strings)], strings, np.bool_)


@op("StringEndsWith", inputs=1, outputs=1, args={"suffix": ""}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_same_shape(np.bool_))
def string_ends_with(xp, strings, *, suffix):
    """Whether each string ends with `suffix` (bool, the input's shape)."""
    suffix = _as_bytes(suffix)
    return _shaped([s.endswith(suffix) for s in _strings(strings)], strings, np.bool_)
