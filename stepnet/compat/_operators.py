"""Caffe2's core functions about operators (re-exported by core): the registry questions (IsOperator,
RefreshRegisteredOperators), the process flags (GlobalInit, GetGlobalInitArgs), scoped names and CreateOperator /
CreatePythonOperator, which make OperatorDefs (nothing runs, unless immediate mode is on)."""
from __future__ import annotations

from ..io.proto import OperatorDef, make_argument
from ..ops import REGISTRY
from . import _python_ops, immediate
from .blob_reference import BlobReference
from .scope import SCOPE, CurrentDeviceScope, CurrentNameScope

_GLOBAL_INIT_ARGS: list = []


def GlobalInit(args) -> None:
    """Caffe2's flag parsing (args as sys.argv: the program's name first): the flags (`--caffe2_log_level=0`,
    ...) are recorded for GetGlobalInitArgs and have no effect here."""
    _GLOBAL_INIT_ARGS.extend(args[1:])


def GetGlobalInitArgs() -> list:
    """A copy of every flag given to GlobalInit so far (the program names left out)."""
    return _GLOBAL_INIT_ARGS[:]


def IsOperator(op_type: str) -> bool:
    return op_type in REGISTRY


def RefreshRegisteredOperators() -> None:
    """Caffe2 re-read its C++ operator registry into a cached set after loading an ops library. stepnet's
    registry is complete once stepnet.ops is imported and IsOperator reads it directly, so the answers are
    always current and there is nothing to re-read."""


# ----------------------------------------------------------------------------------------------- names
def ScopedName(name) -> str:
    """name prefixed with the current name scope."""
    return CurrentNameScope() + (name.decode() if isinstance(name, bytes) else name)


def ScopedBlobReference(name, *args, **kwargs) -> BlobReference:
    return BlobReference(ScopedName(name), *args, **kwargs)


def _names(blobs, what: str) -> list[str]:
    """Caffe2's _RectifyInputOutput: strings get the name scope, BlobReferences are used as they are."""
    if isinstance(blobs, (str, bytes)):
        blobs = [blobs]
    if not isinstance(blobs, (list, tuple)):
        raise TypeError(f"Unknown {what} type: {blobs!r} of type {type(blobs).__name__}")
    for b in blobs:
        if not isinstance(b, (str, bytes)):
            raise TypeError(f"{what} blob {b!r} of unsupported type {type(b).__name__}")
    return [SCOPE.scoped(b) for b in blobs]


# ----------------------------------------------------------------------------------------------- operators
def CreateOperator(operator_type, inputs, outputs, name="", control_input=None, device_option=None, arg=None,
                   engine=None, **kwargs) -> OperatorDef:
    """An OperatorDef (nothing runs): names scoped, the current device scope unless device_option is given,
    random_seed into the device option, the other keywords as arguments."""
    op = OperatorDef(type=operator_type, name=name, input=_names(inputs, "input"), output=_names(outputs, "output"))
    if control_input:
        op.control_input.extend(_names(control_input, "control input"))
    device = device_option if device_option is not None else CurrentDeviceScope()
    if device is not None:
        op.device_option.CopyFrom(device)
    if engine is not None:
        op.engine = engine
    if "random_seed" in kwargs:
        op.device_option.random_seed = kwargs.pop("random_seed")
    if arg is not None:
        op.arg.extend(arg)
    for key, value in kwargs.items():
        if value is None:   # Caffe2's MakeArgument refuses it (no argument type holds None)
            raise ValueError(f"argument {key!r} of {operator_type} is None: give it a value or leave it out")
        op.arg.append(make_argument(key, value))
    immediate.run_if_on(op)
    return op


def CreatePythonOperator(f, inputs, outputs, grad_f=None, pass_workspace=False, python_func_type=None, *args,
                         **kwargs) -> OperatorDef:
    """A Python op of f(inputs, outputs[, workspace]), f registered in this process under the op's token."""
    kwargs["token"] = _python_ops.register(f, grad_f, python_func_type, pass_workspace)
    return CreateOperator("Python", inputs, outputs, *args, **kwargs)
