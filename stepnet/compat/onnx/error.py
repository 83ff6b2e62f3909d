"""Caffe2's caffe2.python.onnx.error: the exceptions of the ONNX backend."""
from __future__ import annotations


class BaseException(Exception):  # noqa: A001 - Caffe2's name, shadowing the builtin inside this module only
    """The base of the ONNX backend's errors."""


class Unsupported(BaseException):
    """An ONNX model, node or attribute the backend cannot convert to Caffe2 operators."""
