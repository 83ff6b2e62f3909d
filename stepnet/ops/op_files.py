"""The files ops append a line to on every run when a model asks (`to_file`: Print's `<blob>.log`, Summarize's
`<blob>.summary`): named after the op's input, '/' as '#', in the workspace's root folder ('.' if none), emptied
when the bound op first runs (Caffe2 empties them when it constructs the op). Each is a model's write: the file
root and the write rules of the workspace's limits hold (a model file's writes there are refused under the
command line's limits; a Python program's limits are trusted), and every write is counted and recorded."""
from __future__ import annotations

import os

from ..core.errors import FileAccessError


def op_file(workspace, name: str, extension: str) -> str:
    """The file an op writes for its input `name`: '/' as '#', in the workspace's root folder ('.' if none)."""
    return os.path.join(getattr(workspace, "root_folder", None) or ".", name.replace("/", "#") + extension)


def append_line(ctx, extension: str, line: str) -> None:
    """Append the line to the op's file for its input 0 (emptied on the bound op's first run)."""
    ws = ctx.workspace
    path = ws.limits.confine(op_file(ws, ctx.opdef.input[0], extension), ctx.label, write=True)
    mode = "a" if ctx.state.get("opened") else "w"
    before = os.path.getsize(path) if mode == "a" and os.path.isfile(path) else 0
    ws.limits.check_write(ws.written, path, before + len(line) + 1, ctx.label)
    try:
        with open(path, mode) as f:
            f.write(line + "\n")
    except OSError as e:
        raise FileAccessError(f"{ctx.opdef.type}: cannot write the {extension} file of {ctx.opdef.input[0]!r} to "
                              f"{path!r}: {e.strerror}") from None
    ctx.state["opened"] = True
    ws.written.record(path, before + len(line) + 1, ctx.label)
