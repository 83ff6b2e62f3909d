"""The process-wide named workspaces behind Caffe2's workspace module: stepnet Workspaces by name, one of them
current. As Caffe2's extension does when it loads, "default" exists from the start and is current; a reset
replaces the current workspace by an empty one under the same name. This is the compat layer's convenience
only: stepnet's core keeps no global state. (Kept apart from workspace.py so that modules below it, such as
the immediate mode that core.CreateOperator calls, can reach the workspaces.)
"""
from __future__ import annotations

import contextlib
import os

from ..core.limits import Limits
from ..runtime.workspace import Workspace

_workspaces: dict = {}
_current = ["default"]


def _seed() -> int | None:
    """STEPNET_SEED, when set: the seed of every workspace made here (random fills drawn the same on every run,
    for a reproducible run of a Caffe2 program); unset, each workspace draws its own, as Caffe2 does."""
    value = os.environ.get("STEPNET_SEED")
    return None if value in (None, "") else int(value)


def _ws() -> Workspace:
    """The current workspace (made when first asked for)."""
    name = _current[0]
    if name not in _workspaces:
        _workspaces[name] = Workspace(limits=Limits(trusted=True), seed=_seed())   # paths: the script's choice
    return _workspaces[name]


def CurrentWorkspace() -> str:
    return _current[0]


def Workspaces() -> list:
    _ws()
    return sorted(_workspaces)


def SwitchWorkspace(name, create_if_missing: bool = False) -> None:
    """Make `name` current; it must exist unless create_if_missing ("default" always does, as in Caffe2, even
    before anything has used it)."""
    if name not in _workspaces and not create_if_missing and name != "default":
        raise RuntimeError(f"Workspace {name} does not exist (pass create_if_missing=True to create it)")
    _current[0] = name
    _ws()


def ResetWorkspace(root_folder=None) -> bool:
    """Replace the current workspace with an empty one (blobs and nets gone); root_folder (created if missing)
    is where db ops with relative paths read and write, as in Caffe2; without one the current one is kept."""
    old = _ws()
    ws = _workspaces[_current[0]] = Workspace(gpu=old.gpu, strict=old.strict, check_nan=old.check_nan,
                                              limits=old.limits, seed=_seed())
    ws.root_folder = getattr(old, "root_folder", None) if root_folder is None else str(root_folder)
    if root_folder is not None:
        os.makedirs(root_folder, exist_ok=True)
    return True


def RootFolder() -> str:
    return getattr(_ws(), "root_folder", None) or "."


@contextlib.contextmanager
def WorkspaceGuard(workspace_name):
    """Switch to workspace_name (created if missing) for the block, then back."""
    current = CurrentWorkspace()
    SwitchWorkspace(workspace_name, True)
    try:
        yield
    finally:
        SwitchWorkspace(current)


def reset_all() -> None:
    """Drop every workspace and start again from an empty "default", current (a fresh process's state)."""
    _workspaces.clear()
    _current[0] = "default"
    _ws()
