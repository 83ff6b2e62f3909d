"""Export Caffe2 nets to ONNX, and run predict nets in onnxruntime (the optional `onnx` extra).

`export_onnx(predict, init, inputs=..., outputs=..., opset=...)` returns an ExportResult (`.model`, `.save(path)`);
`stepnet export-onnx` is the command. onnx and onnxruntime are imported only when an export or a run happens,
so this package imports without them.
"""
from __future__ import annotations

from .errors import ExportError, InputDimsError, MissingWeightError, OpsetError, UnsupportedOpError

__all__ = ["ExportError", "InputDimsError", "MissingWeightError", "OpsetError", "UnsupportedOpError",
           "export_onnx", "default_opset", "exportable_ops"]


def export_onnx(predict, init=None, **options):
    """Export a predict net (NetDef or path) and its init net to ONNX; returns an ExportResult. Options:
    inputs, outputs, params, opset, rnn, check, external_data (see stepnet.export.onnx.exporter.export_onnx)."""
    from .exporter import export_onnx as export
    return export(predict, init, **options)


def default_opset() -> int:
    from .exporter import default_opset as newest
    return newest()


def exportable_ops() -> list[str]:
    from .table import exportable_ops as ops
    return ops()
