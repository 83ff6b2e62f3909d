"""Caffe2's older field name `DeviceOption.cuda_gpu_id`, on stepnet's DeviceOption messages.

Field 2 of DeviceOption was `cuda_gpu_id` in Caffe2 until 2018-08, then `device_id` (the same number on the
wire). stepnet's schema names it device_id and its text reader takes either name (io/proto.py); protobuf's
Python messages know one name per field, so Caffe2 programs of the older API (`option.cuda_gpu_id = 1`,
`DeviceOption(cuda_gpu_id=1)`, `HasField("cuda_gpu_id")`) would fail. install() gives the message class the
older name too, reading and writing device_id. It changes that class for the whole process, as the compat layer
does (Caffe2's API is process-wide); stepnet's core never uses the name.
"""
from __future__ import annotations

from ..io.proto import DeviceOption

OLD, NEW = "cuda_gpu_id", "device_id"


def _name(name: str) -> str:
    return NEW if name == OLD else name


def install(cls=DeviceOption) -> None:
    """Give `cls` (a DeviceOption message class) the attribute, constructor keyword and field name cuda_gpu_id;
    idempotent."""
    if getattr(cls, "_stepnet_legacy_names", False):
        return
    init, setattr_, has_field, clear_field = cls.__init__, cls.__setattr__, cls.HasField, cls.ClearField

    def __init__(self, *args, **kwargs):
        if OLD in kwargs:
            if NEW in kwargs:
                raise ValueError(f"DeviceOption: both {OLD} and {NEW} given (they are one field)")
            kwargs[NEW] = kwargs.pop(OLD)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    cls.__setattr__ = lambda self, name, value: setattr_(self, _name(name), value)
    cls.HasField = lambda self, name: has_field(self, _name(name))
    cls.ClearField = lambda self, name: clear_field(self, _name(name))
    setattr(cls, OLD, property(lambda self: getattr(self, NEW), lambda self, value: setattr_(self, NEW, value),
                               doc=f"Caffe2's name (until 2018-08) for {NEW}"))
    cls._stepnet_legacy_names = True
