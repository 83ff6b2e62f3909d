"""`mpiexec -n K stepnet run ...`: every rank runs the same command on its share of the data.

- `{rank}` and `{size}` expand in every path the command is given (--feed, --load, --checkpoint, --resume,
  --save, --save-image), so each rank can read and write its own files; outside mpiexec they are 0 and 1.
- Only rank 0 prints (the others' stdout goes nowhere; errors still reach stderr) and writes the files whose
  paths name no `{rank}`.
- A rank that fails prints its error and aborts the whole job (MPI_Abort), so no other rank waits forever; a
  rank that finishes checks that every other one finished too (see collectives.CommonWorld.finish). On Ctrl-C
  the ranks without a checkpoint of their own ignore the signal: rank 0 saves (with --checkpoint) and ends the job.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
import traceback
from typing import Callable

from ..core.errors import StepnetError
from .world import expand, process_world

PATHS = ("feed", "load", "checkpoint", "resume", "save", "save_image")
WRITTEN = ("checkpoint", "save", "save_image")
# MPICH's launcher drops output still in its pipes when a job aborts (seen once under load: an empty stderr)
ABORT_GRACE_S = 1.0


def per_rank(command: Callable) -> Callable:
    """Wrap a CLI command (a function of the parsed arguments) to run as one rank of a job."""
    @functools.wraps(command)
    def run(a) -> int:
        world = process_world()
        mine = _for_rank(a, world.rank)
        if world.size == 1:
            return command(mine)
        if world.rank != 0 and not mine.checkpoint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C: rank 0 saves its checkpoint, then ends the job
        try:
            with _quiet(world.rank != 0):
                code = command(mine)
            from .collectives import CommonWorld
            CommonWorld("finish").finish()
        except BaseException as e:  # noqa: BLE001 - any failure of one rank ends every rank
            _report(e, world, getattr(a, "debug", False))
            code = 130 if isinstance(e, KeyboardInterrupt) else 1
            time.sleep(ABORT_GRACE_S)   # let mpiexec forward the error line before MPI_Abort ends every process
            world.comm.Abort(code)
            os._exit(code)  # MPICH's MPI_Abort may return before the launcher ends this process
        return code
    return run


def _for_rank(a, rank: int):
    """A copy of the parsed arguments with placeholders expanded; on ranks other than 0 the files that are not
    rank-specific are not written and nothing is printed."""
    import copy

    mine = copy.copy(a)
    for name in PATHS:
        value = getattr(a, name, None)
        if isinstance(value, list):
            setattr(mine, name, [expand(v) for v in value])
        elif isinstance(value, str):
            shared = name in WRITTEN and "{rank}" not in value
            setattr(mine, name, None if shared and rank != 0 else expand(value))
    if rank != 0:
        mine.quiet = True
        if getattr(a, "checkpoint", None) and mine.checkpoint is None:
            mine.checkpoint_every = None
    return mine


@contextlib.contextmanager
def _quiet(silent: bool):
    """stdout to nowhere while silent (ops such as Print write there too)."""
    if not silent:
        yield
        return
    saved = sys.stdout
    with open(os.devnull, "w") as null:
        sys.stdout = null
        try:
            yield
        finally:
            sys.stdout = saved


def _report(e: BaseException, world, debug: bool) -> None:
    who = f"rank {world.rank} of {world.size}"
    if isinstance(e, StepnetError) and not debug:
        print(f"stepnet: error: {who}: {e}", file=sys.stderr)
    elif isinstance(e, KeyboardInterrupt):
        print(f"stepnet: interrupted ({who})", file=sys.stderr)
    else:
        print(f"stepnet: error: {who} failed:", file=sys.stderr)
        traceback.print_exception(e)
    sys.stderr.flush()
