"""Caffe2's immediate mode (a debugging aid): between StartImmediate() and StopImmediate() every operator made
through core.CreateOperator or a core.Net op method also runs at once, in a workspace of its own
("_CAFFE2_IMMEDIATE", rooted in a fresh temporary folder), never in the current one. FetchImmediate,
FeedImmediate and ImmediateBlobs reach that workspace; StopImmediate empties it and removes its folder.
"""
from __future__ import annotations

import shutil
import tempfile

from . import c_api as C  # noqa: N812
from ._workspaces import ResetWorkspace, WorkspaceGuard, _ws

IMMEDIATE_WORKSPACE = "_CAFFE2_IMMEDIATE"
_state = {"on": False, "root_folder": ""}


def IsImmediate() -> bool:
    return _state["on"]


def root_folder() -> str:
    """The immediate workspace's temporary folder ('' when immediate mode is off): workspace's
    _immediate_root_folder."""
    return _state["root_folder"]


def StartImmediate(i_know: bool = False) -> None:
    """Enter immediate mode (leaving and re-entering it, emptied, if it was on)."""
    if IsImmediate():
        StopImmediate()
    _state["on"] = True
    with WorkspaceGuard(IMMEDIATE_WORKSPACE):
        _state["root_folder"] = tempfile.mkdtemp()
        ResetWorkspace(_state["root_folder"])
    if not i_know:
        print("Immediate mode is on: every operator you create also runs now, in a workspace of its own "
              "(FetchImmediate / FeedImmediate reach it). It is a debugging aid: ops must be runnable in the "
              "order they are made, and each one is slow. StopImmediate() ends it and frees that workspace.")


def StopImmediate() -> None:
    """Leave immediate mode: its workspace is emptied and its folder removed."""
    if not IsImmediate():
        return
    with WorkspaceGuard(IMMEDIATE_WORKSPACE):
        ResetWorkspace()
    shutil.rmtree(_state["root_folder"], ignore_errors=True)
    _state["root_folder"] = ""
    _state["on"] = False


def ImmediateBlobs() -> list:
    with WorkspaceGuard(IMMEDIATE_WORKSPACE):
        return _ws().blobs()


def RunOperatorImmediate(op) -> None:
    """Run one OperatorDef in the immediate workspace (Caffe2's RuntimeError when it fails)."""
    with WorkspaceGuard(IMMEDIATE_WORKSPACE):
        C.Workspace(_ws()).run(op)


def run_if_on(op) -> None:
    """Run op in the immediate workspace when immediate mode is on (what creating an op does then)."""
    if IsImmediate():
        RunOperatorImmediate(op)


def FetchImmediate(name):
    with WorkspaceGuard(IMMEDIATE_WORKSPACE):
        return C.Workspace(_ws()).fetch_blob(name)


def FeedImmediate(name, arr, device_option=None) -> bool:
    with WorkspaceGuard(IMMEDIATE_WORKSPACE):
        return C.Workspace(_ws()).feed_blob(name, arr, device_option)
