"""The process-wide state of the compat layer, as a fresh Caffe2 process has it (tests start each case from it)."""
from __future__ import annotations

import sys


def reset() -> None:
    """One empty "default" workspace, no name or device scope, no net, step or optimizer name used yet, no GlobalInit
    flags or engine preferences, no data or parallel worker running or numbered."""
    from . import _operators, _steps, control, core, engines, optimizer, session, task, workspace
    from .helpers import arg_scope
    from .scope import SCOPE

    workspace._reset_all()
    core.Net._net_names_used.clear()
    _operators._GLOBAL_INIT_ARGS.clear()
    engines._ENGINE_PREF.update(op={}, **{"global": {}})
    _steps.ExecutionStep._step_names_used.clear()
    optimizer._optimizer_instance_count.clear()
    SCOPE.names, SCOPE.device = [], None
    arg_scope.get_current_scope().clear()
    control._used_step_names.clear()
    task.Task._global_names_used.clear()
    session.Session._compiled_cache.clear()
    for name in ("stepnet.compat.parallel_workers", "stepnet.compat.data_workers"):   # no worker thread or id yet
        if name in sys.modules:
            sys.modules[name].global_coordinator._reset()
