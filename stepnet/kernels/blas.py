"""Facts of the BLAS that numpy calls, read once per process: threadpoolctl's controller of it, and whether
its kernels include OpenBLAS's small-matrix GEMM (the SkylakeX-family cores), which the FC products are
blocked for (stepnet.kernels.fc)."""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Callable

import numpy as np

#: OpenBLAS cores (its names, as threadpoolctl reports them) whose SGEMM has the small-matrix kernel: products
#: with M·N ≤ 1200 and M·N·K ≤ 10⁶ (BLAS's column-major sizes) run straight from the operands, skipping the
#: packing of B that dominates a product with a few rows. Measured on SkylakeX (AVX-512); Cooperlake and
#: SapphireRapids build the same kernel.
SMALL_MATRIX_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


def numpy_blas():
    """threadpoolctl's controller of numpy's BLAS: the BLAS libraries numpy ships (in numpy.libs or numpy/.dylibs),
    or every BLAS library loaded where numpy ships none (a numpy linked to a system BLAS)."""
    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController().select(user_api="blas")
    package = os.path.dirname(np.__file__)
    shipped = [lib.filepath for lib in controller.lib_controllers
               if lib.filepath.startswith((package + os.sep, package + ".libs" + os.sep))]
    return controller.select(filepath=shipped) if shipped else controller


@functools.cache
def small_matrix_kernels() -> bool:
    """Whether numpy's BLAS is one OpenBLAS whose core has the small-matrix SGEMM kernel (SMALL_MATRIX_CORES;
    OPENBLAS_CORETYPE, read when the library loads, can pick another core). A fact of the process, asked once."""
    libs = numpy_blas().lib_controllers
    return (len(libs) == 1 and libs[0].internal_api == "openblas"
            and str(getattr(libs[0], "architecture", "")).lower() in SMALL_MATRIX_CORES)


def thread_count(lib) -> Callable[[], int]:
    """A call giving threadpoolctl's controller `lib`'s thread count, as its get_num_threads gives it (which
    looks the library's function up by name on every call: 0.6 µs, where the function itself takes 0.17): for an
    OpenBLAS with its own threads, that function found once in the library threadpoolctl found, under the
    names OpenBLAS builds export (plain, scipy-openblas's prefix, the 64-bit interface's suffix) and kept only
    when it reads what threadpoolctl reads; threadpoolctl's own call otherwise (another BLAS, OpenMP threads)."""
    if lib.internal_api == "openblas" and lib.threading_layer != "openmp":
        try:
            dll = ctypes.CDLL(lib.filepath)
        except OSError:
            return lib.get_num_threads
        for prefix in ("", "scipy_"):
            for suffix in ("", "64_"):
                get = getattr(dll, f"{prefix}openblas_get_num_threads{suffix}", None)
                if get is not None and get() == lib.get_num_threads():
                    return get
    return lib.get_num_threads


class ThreadHold:
    """Holds numpy's BLAS libraries at `threads` while the context lasts and gives each back the count it had
    (`before`, read by the caller): threadpoolctl's own per-library calls alone, without its
    ThreadpoolController.limit, which reads every library's description on entry (about 10 µs to enter and
    leave, where this takes about 3.5: a top-level net run enters one when BLAS runs another count)."""
    __slots__ = ("libs", "threads", "before")

    def __init__(self, libs: tuple, threads: int, before: list):
        self.libs, self.threads, self.before = libs, threads, before

    def __enter__(self) -> "ThreadHold":
        for lib in self.libs:
            lib.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc) -> None:
        for lib, n in zip(self.libs, self.before):
            lib.set_num_threads(n)
