"""stepnet: a numpy/CuPy runtime for Caffe2 protobuf models with recurrent step nets."""
import importlib.util as _util
import os as _os

if _util.find_spec(f"{__name__}.caffe2_pb2") is None:   # a source checkout found before the installed package
    raise ImportError(
        f"stepnet's compiled schema is missing from {_os.path.dirname(__file__)}: Python imported that source "
        "folder (a checkout in the working directory shadows the installed package) and it has no caffe2_pb2.py, "
        "which installing compiles; run from another directory, or install this checkout with "
        "`pip install -e .` (it compiles the schema into it)")
from . import ops as _ops  # noqa: F401  (registers every operator)
from .core.errors import StepnetError, StepnetWarning
from .runtime.executor import Net
from .core.int8 import Int8Tensor
from .core.version import VERSION
from .core.limits import Limits
from .io.proto import (
    Argument, NetDef, OperatorDef, PlanDef, TensorProto, array_to_tensor, load, make_argument, save, tensor_to_array)
from .runtime.workspace import Blob, Workspace
from .builders.builder import BlobRef, NetBuilder
from .builders.model import ModelBuilder

__version__ = VERSION

__all__ = ["Argument", "Blob", "BlobRef", "Int8Tensor", "Limits", "ModelBuilder", "Net", "NetBuilder", "NetDef",
           "OperatorDef", "PlanDef", "StepnetError", "StepnetWarning", "TensorProto", "Workspace", "array_to_tensor",
           "load", "make_argument", "save", "tensor_to_array"]
