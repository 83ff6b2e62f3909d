"""Running Graphviz's `dot` for `stepnet draw`: the dot text in, the picture's bytes out. `dot` runs in its own
process group, ended with stepnet: on an error, Ctrl-C or its timeout, and (Linux) when stepnet itself is
killed, so no dot outlives stepnet."""
from __future__ import annotations

import os
import shutil
import subprocess

from ..core.errors import StepnetError

RENDER_TIMEOUT_S = 300


def render(dot_text: str, fmt: str) -> bytes:
    """dot_text laid out by Graphviz's `dot -T<fmt>` (found on PATH); a StepnetError if it fails or takes more than
    RENDER_TIMEOUT_S. dot runs in a process group of its own, killed on any way out of here but success (an
    error, Ctrl-C, the timeout), and on Linux also when this process dies (PR_SET_PDEATHSIG), so no dot outlives
    stepnet."""
    exe = shutil.which("dot")
    if exe is None:
        raise StepnetError("Graphviz's dot is not installed")
    posix = os.name == "posix"
    proc = subprocess.Popen([exe, f"-T{fmt}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=posix, preexec_fn=_die_with_parent())
    try:
        out, err = proc.communicate(dot_text.encode(), timeout=RENDER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StepnetError(f"dot -T{fmt} took more than {RENDER_TIMEOUT_S} s; draw fewer ops or edges (--max-ops N, "
                           "--max-edges N)") from None
    finally:
        if proc.returncode is None:     # still running: the timeout, an error or Ctrl-C
            _kill_group(proc)
    if proc.returncode != 0:
        err = " ".join(err.decode(errors="replace").split())[:300]
        raise StepnetError(f"dot -T{fmt} failed (exit {proc.returncode}): {err}")
    return out


def _die_with_parent():
    """On Linux, a function for the child to call before exec (Popen's preexec_fn) that has the kernel SIGKILL it
    when its parent dies (prctl PR_SET_PDEATHSIG, looked up here, before the fork); elsewhere None."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG = 1


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill dot and whatever it started (its process group, on POSIX), and reap it."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL) if os.name == "posix" else proc.kill()
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
