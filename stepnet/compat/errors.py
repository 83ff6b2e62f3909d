"""Errors as a Caffe2 program expects them: a StepnetError raised through the compat layer is also a RuntimeError
(Caffe2's C++ errors reach Python as RuntimeError), keeping its stepnet class and message; an op's failed check
says "[enforce fail]" first, as Caffe2's EnforceNotMet does."""
from __future__ import annotations

import functools

from ..core.errors import StepnetError, UnknownOpError
from . import dyndep

_RUNTIME_ERRORS: dict = {}


def runtime_error(e: StepnetError) -> Exception:
    """The same error as a Caffe2 user expects it: a RuntimeError that is also its StepnetError subclass (for an
    unknown op, naming the op libraries the program asked dyndep to load)."""
    cls = type(e)
    if cls not in _RUNTIME_ERRORS:
        _RUNTIME_ERRORS[cls] = type(cls.__name__, (cls, RuntimeError), {"__module__": cls.__module__})
    message = e.message + (dyndep.unloaded_note() if isinstance(e, UnknownOpError) else "")
    if not isinstance(e, UnknownOpError) and " op #" in str(e.at or ""):
        message = f"[enforce fail] {message}"   # an op's check, Caffe2's EnforceNotMet ("[enforce fail at ...]")
    return _RUNTIME_ERRORS[cls](message, at=e.at, detail=e.detail, sep=e.sep)


def caffe2_errors(fn):
    """fn with its StepnetErrors raised as runtime_error makes them."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except StepnetError as e:
            if isinstance(e, RuntimeError):
                raise
            raise runtime_error(e).with_traceback(e.__traceback__) from None
    return call
