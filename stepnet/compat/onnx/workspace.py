"""Caffe2's caffe2.python.onnx.workspace: a Workspace object standing for one Caffe2 workspace of its own.

    ws = Workspace()
    ws.FeedBlob("x", array)          # any caffe2.python.workspace function, run in ws's workspace
    with ws:                         # ws is the current workspace inside the block (reentrant)
        workspace.RunNetOnce(net)

The workspace is named by a fresh uuid; it is dropped when the object is collected.
"""
from __future__ import annotations

import uuid

from .. import workspace


class Workspace:
    """A Caffe2 workspace of its own: a context manager making it current, and every function of
    caffe2.python.workspace as a method that runs in it."""

    def __init__(self):
        self.workspace_id = str(uuid.uuid4())
        self.workspace_stack: list[str] = []

    def __getattr__(self, attr):
        function = getattr(workspace, attr)

        def run_here(*args, **kwargs):
            with self:
                return function(*args, **kwargs)
        return run_here

    def __enter__(self):
        self.workspace_stack.append(workspace.CurrentWorkspace())
        workspace.SwitchWorkspace(self.workspace_id, create_if_missing=True)

    def __exit__(self, exc_type, exc_value, traceback):
        workspace.SwitchWorkspace(self.workspace_stack.pop(), create_if_missing=True)

    def __del__(self):
        # The workspace (its blobs and nets) is dropped; unless current, it is also forgotten (Caffe2 left an
        # empty one under the name). Nothing else is run here: a finalizer may run inside any allocation, e.g.
        # while NumPy sets a context variable, where running ops (NumPy's errstate) crashes CPython.
        try:
            from .. import _workspaces
            if _workspaces._current[0] != self.workspace_id:
                _workspaces._workspaces.pop(self.workspace_id, None)
        except Exception:   # interpreter shutdown: the modules may be gone
            pass
