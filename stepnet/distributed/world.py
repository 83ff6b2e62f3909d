"""The processes of one job: this process's rank among the `size` processes `mpiexec` started, through mpi4py
(the `mpi` extra). Outside mpiexec the world is this process alone (rank 0 of 1): mpi4py is not imported and
every collective is the identity, so a data-parallel plan runs anywhere.

`{rank}` and `{size}` in a path expand to this process's rank and the world's size (`expand`); a file whose
path names no `{rank}` is written by rank 0 only (`writes`).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from ..core.errors import ArgumentError, CollectiveError
from ..core.extras import install_hint

EXTRA = install_hint("mpi")
# What launchers set in every process they start: MPICH and Intel MPI (Hydra), Open MPI, PMIx, MVAPICH2.
LAUNCH_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
FORCE = "STEPNET_MPI"  # "1": use MPI without a launcher's variables (a singleton MPI process); "0": never use MPI
PLACEHOLDERS = ("{rank}", "{size}")


@dataclass(frozen=True)
class ProcessWorld:
    """Every process of the job. comm: mpi4py's COMM_WORLD, None for a process on its own; mpi: mpi4py.MPI."""
    rank: int = 0
    size: int = 1
    comm: Any = None
    mpi: Any = None

    @property
    def uses_mpi(self) -> bool:
        return self.comm is not None


def launcher() -> str | None:
    """The environment variable saying that a launcher (mpiexec) started this process, or None."""
    forced = os.environ.get(FORCE, "").strip()
    if forced in ("0", "1"):
        return FORCE if forced == "1" else None
    return next((name for name in LAUNCH_VARIABLES if name in os.environ), None)


@functools.lru_cache(maxsize=1)
def process_world() -> ProcessWorld:
    """This job's processes (initialising MPI on first use under mpiexec). Under a launcher without mpi4py it is
    a CollectiveError naming the extra: running alone would train K unsynchronised copies."""
    variable = launcher()
    if variable is None:
        return ProcessWorld()
    try:
        from mpi4py import MPI  # noqa: PLC0415 - MPI starts here, and only under a launcher
    except ImportError as e:
        raise CollectiveError(f"this process was started by mpiexec ({variable}={os.environ.get(variable)!r}) but "
                              f"mpi4py cannot be imported ({e}); {EXTRA}") from None
    comm = MPI.COMM_WORLD
    return ProcessWorld(comm.Get_rank(), comm.Get_size(), comm, MPI)


def rank() -> int:
    return process_world().rank


def size() -> int:
    return process_world().size


def expand(path: str) -> str:
    """path with `{rank}` and `{size}` replaced by this process's rank and the world's size (0 and 1 outside
    mpiexec); other braces are left alone. A path from a model file that is bytes, not UTF-8 text, names no
    file: an ArgumentError."""
    if isinstance(path, bytes):
        raise ArgumentError(f"the db path {path!r} is not UTF-8 text; give the file's name as UTF-8")
    if "{" not in path:
        return path
    world = process_world()
    return path.replace("{rank}", str(world.rank)).replace("{size}", str(world.size))


def writes(path: str) -> bool:
    """Whether this process writes the file at path (before expansion): every rank writes its own `{rank}` file,
    rank 0 alone the others."""
    return "{rank}" in path or process_world().rank == 0


def abort(code: int = 1) -> None:
    """End every process of the job (MPI_Abort) when there are others; a lone process just returns."""
    world = process_world()
    if world.uses_mpi and world.size > 1:
        world.comm.Abort(code)
