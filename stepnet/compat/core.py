"""Caffe2's core module: Net (a NetBuilder with Caffe2's method names), BlobReference, CreateOperator,
DeviceOption, the scopes, ExecutionStep and Plan, device inference and cross-device copies, net cloning and the
SSA analyses.

As in Caffe2: a string blob name is prefixed with the current NameScope, a BlobReference is used as it is; new
ops get the current DeviceScope; every registered operator is a method of a Net (`net.FC(...)`) and of a
BlobReference that knows its net (`x.Relu([], "y")`); net names are unique in the process (`net`, `net_1`, ...).

The names live in modules by topic, all re-exported here: _operators.py (CreateOperator, scoped names, the
registry and the process flags), _devices.py (DeviceOption, device inference), _device_copies.py
(InjectCrossDeviceCopies and its helpers), _net.py (Net; get_net_name, output_to_list, GetIndexFromGradientList),
_net_records.py (a Net's schema records), _clone.py (Clone, ClonePartial, clone_and_bind_net, the remap
functions), _ssa.py (get_ssa and its analyses), _steps.py (ExecutionStep, Plan, add_nets_in_order).
Not here: Caffe2's IR class (its gradient builder's internals; stepnet's backward pass is passes/gradients.py,
reached through AddGradientOperators and GradientRegistry).
"""
from __future__ import annotations

import importlib

from ..io.proto import TensorProto
from ..ops.base import GradientSlice  # noqa: F401 - Caffe2's core.GradientSlice
from . import _python_ops, _steps, _tracebacks, c_api as C, dyndep, immediate  # noqa: F401, N812 - core.C: Caffe2's
from ._clone import (DEFAULT_REMAP_FUNCS, clone_and_bind_net, control_op_remap,  # noqa: F401
                     recurrent_network_op_remap, remap_proto)
from ._device_copies import (InjectCrossDeviceCopies, InjectDeviceCopiesAmongNets,  # noqa: F401
                             InjectDeviceCopiesAmongNetsWithoutB2D, RemapEntry, copy_func_between_devices,
                             update_placeholder_op_output)
from ._devices import (DeviceOption, InferBlobDevices, InferOpBlobDevices, InferOpDeviceAsBlobDevices,  # noqa: F401
                       device_equal, device_option_equal)
from ._net import GetIndexFromGradientList, Net, get_net_name, output_to_list  # noqa: F401
from ._operators import (CreateOperator, CreatePythonOperator, GetGlobalInitArgs, GlobalInit,  # noqa: F401
                         IsOperator, RefreshRegisteredOperators, ScopedBlobReference, ScopedName)
from ._ssa import get_op_ids_in_path, get_output_producers, get_ssa, get_undefined_blobs  # noqa: F401
from ._steps import (ExecutionStep, Plan, add_nets_in_order, execution_step,  # noqa: F401
                     scoped_execution_step, to_execution_step)
from .blob_reference import BlobReference  # noqa: F401
from .engines import (IsOperatorWithEngine, SetEnginePref, SetGlobalEnginePref,  # noqa: F401 - Caffe2's core
                      SetOpEnginePref, SetPerOpEnginePref)
from .gradients import GradientRegistry, python_makers  # noqa: F401 - Caffe2's core has GradientRegistry
from .scope import SCOPE, CurrentDeviceScope, CurrentNameScope, DeviceScope, EmptyDeviceScope, NameScope  # noqa: F401

DataType = TensorProto.DataType


def __getattr__(name: str):
    """core.workspace, as Caffe2's core imports it (core.workspace.RunPlan); here workspace imports core."""
    if name == "workspace":
        return importlib.import_module(f"{__package__}.workspace")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
