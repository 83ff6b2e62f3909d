"""Caffe2's context module: classes that are context managers with a per-thread stack of active instances.

    @define_context()
    class Builder: ...

    with Builder() as b:
        assert Builder.current() is b

`define_context(allow_default=True)` makes `current()` create (and push) an instance when none is active;
otherwise `current()` fails unless `required=False`, which gives None. An object given to `current(value)` is
returned as it is (after a type check), as Caffe2 lets callers pass one explicitly.
"""
from __future__ import annotations

import functools
import threading


class ContextInfo:
    """The per-thread stack of active instances of one context class."""

    def __init__(self, cls, allow_default: bool, arg_name=None):
        self.cls = cls
        self.allow_default = allow_default
        self.arg_name = arg_name
        self._local = threading.local()

    @property
    def _stack(self) -> list:
        if not hasattr(self._local, "obj"):
            self._local.obj = []
        return self._local.obj

    def enter(self, value) -> None:
        self._stack.append(value)

    def exit(self, value) -> None:
        if not self._stack:
            raise AssertionError(f"Context {self.cls.__name__} is empty.")
        top = self._stack.pop()
        if top is not value:
            raise AssertionError(f"Context {self.cls.__name__}: leaving {value!r}, but {top!r} is the active one")

    def get_active(self, required: bool = True):
        if not self._stack:
            if not required:
                return None
            if not self.allow_default:
                raise AssertionError(f"Context {self.cls.__name__} is required but none is active.")
            self.enter(self.cls())
        return self._stack[-1]


class ContextManager:
    """The registry of context classes (one ContextInfo each)."""

    def __init__(self):
        self._ctxs: dict = {}

    def register(self, ctx_info: ContextInfo) -> None:
        if ctx_info.cls in self._ctxs:
            raise AssertionError(f"Context {ctx_info.cls.__name__} already registered")
        self._ctxs[ctx_info.cls] = ctx_info

    def get(self, cls) -> ContextInfo:
        if cls not in self._ctxs:
            raise AssertionError(f"Context {cls.__name__} not registered.")
        return self._ctxs[cls]


_CONTEXT_MANAGER = ContextManager()


def context_manager() -> ContextManager:
    return _CONTEXT_MANAGER


def get_active_context(cls, val=None, required: bool = True):
    info = context_manager().get(cls)
    if val is not None:
        if not isinstance(val, cls):
            raise AssertionError(f"Wrong context type. Expected: {cls.__name__}, got {type(val).__name__}.")
        return val
    return info.get_active(required=required)


def _enter(self):
    if self._prev_enter is not None:
        self._prev_enter()
    context_manager().get(self._ctx_class).enter(self)
    return self


def _exit(self, *args):
    context_manager().get(self._ctx_class).exit(self)
    if self._prev_exit is not None:
        return self._prev_exit(*args)
    return None


def _call(self, func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with self:
            return func(*args, **kwargs)
    return wrapper


@classmethod
def current(cls, value=None, required: bool = True):
    """The active instance of a context class (the classmethod define_context gives each class): `value` itself
    when given (type-checked), else the innermost active one (see get_active_context)."""
    return get_active_context(cls, value, required)


class define_context:  # noqa: N801 - Caffe2's name
    """Class decorator: the class's instances become a context (see the module docstring). Its own __enter__ and
    __exit__, if any, run inside the context's (enter: before it is pushed; exit: after it is popped)."""

    def __init__(self, arg_name=None, allow_default: bool = False):
        self.arg_name = arg_name
        self.allow_default = allow_default

    def __call__(self, cls):
        if hasattr(cls, "_ctx_class"):
            raise AssertionError(f"{cls.__name__} parent class ({cls._ctx_class.__name__}) already defines context.")
        context_manager().register(ContextInfo(cls, self.allow_default, self.arg_name))
        cls._prev_enter = cls.__enter__ if hasattr(cls, "__enter__") else None
        cls._prev_exit = cls.__exit__ if hasattr(cls, "__exit__") else None
        cls._ctx_class = cls
        cls.__enter__ = _enter
        cls.__exit__ = _exit
        cls.__call__ = _call
        cls.current = current
        return cls
