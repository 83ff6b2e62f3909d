"""Caffe2's engine preferences (core.SetEnginePref and the like): recorded, with no effect on how an op runs."""
from __future__ import annotations

_ENGINE_PREF: dict = {"op": {}, "global": {}}
# Engines Caffe2 registers ops under; hints here: a registered op runs the same way under any engine.
CAFFE2_ENGINES = frozenset({"CUDNN", "NNPACK", "EIGEN", "MKLDNN", "GLOO", "MPI", "NCCL", "SIMD", "THNN", "NVRTC",
                            "PACKED", "MOBILE", "NERVANA", "TENSORCORE", "DEPTHWISE_3x3", "MIOPEN", "QNNPACK"})


def IsOperatorWithEngine(op_type: str, engine: str) -> bool:
    """Whether Caffe2's registry would hold op_type under engine ("", "DEFAULT" or one of CAFFE2_ENGINES)."""
    from ..ops import REGISTRY
    return op_type in REGISTRY and (engine in ("", "DEFAULT") or engine in CAFFE2_ENGINES)


def SetEnginePref(op_engine_pref, global_engine_pref) -> None:
    """Caffe2's engine preferences ({device type: {op type: [engines]}}, {device type: [engines]}): recorded;
    engines are hints in stepnet, which runs an op the same way whatever engine is named."""
    _ENGINE_PREF["op"], _ENGINE_PREF["global"] = dict(op_engine_pref), dict(global_engine_pref)


def SetOpEnginePref(op_type, op_pref) -> None:
    """Record {device type: [engines]} for one op type (see SetEnginePref)."""
    for device, engines in dict(op_pref).items():
        _ENGINE_PREF["op"].setdefault(device, {})[op_type] = list(engines)


def SetGlobalEnginePref(global_engine_pref) -> None:
    _ENGINE_PREF["global"] = dict(global_engine_pref)


def SetPerOpEnginePref(op_engine_pref) -> None:
    """Record {device type: {op type: [engines]}} as the per-op preferences, replacing them (see SetEnginePref)."""
    _ENGINE_PREF["op"] = {device: {op: list(engines) for op, engines in dict(prefs).items()}
                          for device, prefs in dict(op_engine_pref).items()}
