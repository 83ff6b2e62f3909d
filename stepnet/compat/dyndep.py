"""Caffe2's dyndep module: loading a shared library of C++ operators into the process.

stepnet runs no C++ operator library: its operators are its own records (stepnet.ops). InitOpsLibrary records
the name the script gave and returns, as Caffe2 does for a name that is not a file; the ops the script meant
to get from it are those stepnet implements (MPI, Gloo, ...) or, where it has none, an unknown-operator error
when a net uses one, which then names the libraries recorded here (`unloaded_note`).
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)
_IMPORTED_DYNDEPS: set = set()


def InitOpsLibrary(name, trigger_lazy: bool = True) -> None:
    """Record `name` (a .so path or a build target such as "@/caffe2/caffe2/mpi:mpi_ops") as loaded; nothing is
    loaded: stepnet cannot run Caffe2's C++ op libraries."""
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name not in _IMPORTED_DYNDEPS:
        log.info("dyndep: %s is a Caffe2 C++ op library; stepnet does not load it and uses its own operators",
                 name)
    _IMPORTED_DYNDEPS.add(name)


def GetImportedOpsLibraries() -> set:
    """The library names InitOpsLibrary was given in this process."""
    return _IMPORTED_DYNDEPS


def unloaded_note() -> str:
    """What to add to an unknown-operator message when the script asked for C++ op libraries ("" if it did not)."""
    if not _IMPORTED_DYNDEPS:
        return ""
    names = ", ".join(repr(n) for n in sorted(_IMPORTED_DYNDEPS))
    return (f" (the script loaded the Caffe2 op librar{'ies' if len(_IMPORTED_DYNDEPS) > 1 else 'y'} {names} "
            "with dyndep.InitOpsLibrary, which stepnet cannot load: their ops exist only where stepnet has them)")
