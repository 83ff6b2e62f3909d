"""What can stop an export, each a StepnetError the CLI prints as one line naming the op or blob and the fix.

This module imports nothing from onnx, so the command line can catch these errors without the extra."""
from __future__ import annotations

from ...core.errors import StepnetError
from ...core.extras import install_hint


class ExportError(StepnetError):
    """A net that cannot be exported to ONNX (base of the errors below)."""


class UnsupportedOpError(ExportError):
    """An op that has no ONNX counterpart (at the chosen opset, or with these arguments)."""


class InputDimsError(ExportError):
    """A graph input whose dims were not given and cannot be inferred."""


class MissingWeightError(ExportError):
    """A weight the predict net reads that the init net does not fill."""


class OpsetError(ExportError):
    """An opset the exporter does not write, or one below what an op needs."""


class MissingExtraError(ExportError):
    """The `onnx` extra (onnx, onnxruntime) is not installed."""


def require(module: str):
    """Import onnx or onnxruntime, or say how to install them."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(f"this needs the {module} package: {install_hint('onnx')}") from None
