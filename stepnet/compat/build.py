"""Caffe2's build module: the facts of the build, as a CPU-only Caffe2 build reports them.

CAFFE2_NO_OPERATOR_SCHEMA is False (every stepnet operator has its record, which is its schema); build_options
holds Caffe2's CAFFE2_BUILD_STRINGS keys with the values of a CPU build without CUDA, MKL or NNPACK (strings,
as Caffe2 gives them; "" for a flag that is off, "ON"/"OFF" for the USE_ options).
"""
from __future__ import annotations

from ..core.version import VERSION
from . import c_api

CAFFE2_NO_OPERATOR_SCHEMA = False


def _on(flag: bool) -> str:
    return "ON" if flag else "OFF"


def _defined(flag: bool) -> str:
    return "1" if flag else ""


build_options = {
    "GIT_VERSION": f"stepnet-{VERSION}",
    "CXX_FLAGS": "",
    "BUILD_TYPE": "Release",
    "BLAS": "numpy",
    "USE_ATEN": "OFF",
    "USE_CUDA": _on(c_api.has_cuda_support),
    "USE_NCCL": "OFF",
    "USE_MPI": "OFF",
    "USE_GFLAGS": "OFF",
    "USE_GLOG": "OFF",
    "USE_GLOO": "OFF",
    "USE_NNPACK": "OFF",
    "USE_OPENMP": "OFF",
    "FORCE_FALLBACK_CUDA_MPI": "",
    "HAS_MKL_DNN": _defined(c_api.has_mkldnn),
    "HAS_MKL_SGEMM_PACK": "",
    "PERF_WITH_AVX": "",
    "PERF_WITH_AVX2": "",
    "UNIQUE_LONG_TYPEMETA": "",
    "USE_EXCEPTION_PTR": "1",
    "USE_ACCELERATE": "",
    "USE_EIGEN_FOR_BLAS": "",
    "USE_LITE_PROTO": "",
    "USE_MKL": "",
    "USE_NVTX": "",
    "DISABLE_NUMA": "1",
}
