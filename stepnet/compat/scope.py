"""Caffe2's scope module: the name scope and device scope new ops get, per thread.

SCOPE is a stepnet.builders.builder.Scope whose prefix list and device live in thread-local storage, so every compat
net (a NetBuilder) scopes names and stamps devices from it exactly as Caffe2's CreateOperator does.
"""
from __future__ import annotations

import contextlib
import threading

from ..builders.builder import Scope
from ..io.proto import DeviceOption

_NAMESCOPE_SEPARATOR = "/"


class ThreadScope(Scope):
    """A Scope shared by all compat nets; `names` and `device` are per thread."""

    def __init__(self):
        self._local = threading.local()
        super().__init__()

    @property
    def names(self) -> list:
        if not hasattr(self._local, "names"):
            self._local.names = []
        return self._local.names

    @names.setter
    def names(self, value) -> None:
        self._local.names = list(value)

    @property
    def device(self):
        return getattr(self._local, "device", None)

    @device.setter
    def device(self, value) -> None:
        self._local.device = value

    def scoped(self, name) -> str:
        from ..builders.builder import BlobRef
        if isinstance(name, bytes):
            name = name.decode()
        return str(name) if isinstance(name, BlobRef) else CurrentNameScope() + str(name)


SCOPE = ThreadScope()


def CurrentNameScope() -> str:
    """The current prefix, '' or ending in '/' ('a/b/')."""
    return "".join(p + _NAMESCOPE_SEPARATOR for p in SCOPE.names)


def CurrentDeviceScope():
    """The DeviceOption new ops get, or None."""
    return SCOPE.device


@contextlib.contextmanager
def NameScope(prefix, reset: bool = False):
    """Names made inside get '<prefix>/' after the current prefix (in place of it with reset=True)."""
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"NameScope takes a string, got {type(prefix).__name__}")
    old = list(SCOPE.names)
    SCOPE.names = ([] if reset else old) + ([prefix] if prefix else [])
    try:
        yield
    finally:
        SCOPE.names = old


@contextlib.contextmanager
def DeviceScope(scope, node_name: str | None = None):
    """New ops get a copy of `scope` (a DeviceOption); node_name, if given, replaces its node_name, and a nested
    scope without one inherits the enclosing scope's."""
    new = DeviceOption()
    if scope:
        if not isinstance(scope, DeviceOption):
            raise TypeError(f"DeviceScope takes a caffe2_pb2.DeviceOption, got {type(scope).__name__}")
        new.CopyFrom(scope)
    elif not node_name:
        raise ValueError("DeviceScope needs a DeviceOption or a node_name")
    if node_name:
        new.node_name = node_name
    old = SCOPE.device
    if old is not None and old.HasField("node_name") and not new.HasField("node_name"):
        new.node_name = old.node_name
    SCOPE.device = new
    try:
        yield
    finally:
        SCOPE.device = old


@contextlib.contextmanager
def EmptyDeviceScope():
    """No device option on new ops inside (the net's decides)."""
    old, SCOPE.device = SCOPE.device, None
    try:
        yield
    finally:
        SCOPE.device = old
