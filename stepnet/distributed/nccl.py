"""NCCL collectives on CuPy arrays (`cupy.cuda.nccl`), for collective ops on CUDA devices.

stepnet.distributed.collectives imports this module only when a collective's array lives on a CUDA device, after the
ranks agreed on the call over MPI. One NCCL communicator per common world and device: rank 0 makes the unique id and
MPI broadcasts it. Each rank drives one GPU (give each process its own, e.g. with CUDA_VISIBLE_DEVICES). Sums run in
the array's dtype (bool as uint8); broadcast and allgather move raw bytes, so any dtype goes."""
from __future__ import annotations

import numpy as np

from ..core import backend
from ..core.errors import CollectiveError

# numpy dtype name -> name of the cupy.cuda.nccl constant
NCCL_TYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
              "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32",
              "float64": "NCCL_FLOAT64", "bool": "NCCL_UINT8"}


def _nccl():
    from cupy.cuda import nccl  # noqa: PLC0415 - only for ops on CUDA devices
    return nccl


def nccl_type(nccl, dtype) -> int:
    """The NCCL data type of a numpy dtype (a CollectiveError for those NCCL has none of)."""
    name = NCCL_TYPES.get(np.dtype(dtype).name)
    if name is None:
        raise CollectiveError(f"NCCL has no data type for {np.dtype(dtype)} tensors")
    return getattr(nccl, name)


def communicator(world, device: int):
    """world's NCCL communicator on CUDA device `device`, made on first use (a collective call on every rank)."""
    comm = world.nccl.get(device)
    if comm is None:
        nccl, cp = _nccl(), backend.cupy_module()
        uid = nccl.get_unique_id() if world.rank == 0 else None
        if world.comm is not None:
            uid = world.comm.bcast(uid, root=0)
        with cp.cuda.Device(device):
            comm = world.nccl[device] = nccl.NcclCommunicator(world.size, uid, world.rank)
    return comm


def _setup(world, x):
    cp = backend.cupy_module()
    device = x.device.id
    return _nccl(), cp, communicator(world, device), cp.cuda.Device(device)


def allreduce(world, x):
    nccl, cp, comm, device = _setup(world, x)
    with device:
        src = cp.ascontiguousarray(x.view(cp.uint8) if x.dtype == np.bool_ else x)
        out = cp.empty_like(src)
        comm.allReduce(src.data.ptr, out.data.ptr, src.size, nccl_type(nccl, src.dtype), nccl.NCCL_SUM,
                       cp.cuda.get_current_stream().ptr)
        return out != 0 if x.dtype == np.bool_ else out


def broadcast(world, x, root: int):
    nccl, cp, comm, device = _setup(world, x)
    with device:
        src = cp.ascontiguousarray(x)
        out = cp.empty_like(src)
        comm.broadcast(src.data.ptr, out.data.ptr, src.nbytes, nccl.NCCL_UINT8, root,
                       cp.cuda.get_current_stream().ptr)
        return out


def reduce(world, x, root: int):
    nccl, cp, comm, device = _setup(world, x)
    with device:
        src = cp.ascontiguousarray(x.view(cp.uint8) if x.dtype == np.bool_ else x)
        out = cp.empty_like(src)
        comm.reduce(src.data.ptr, out.data.ptr, src.size, nccl_type(nccl, src.dtype), nccl.NCCL_SUM, root,
                    cp.cuda.get_current_stream().ptr)
        if world.rank != root:
            return x
        return out != 0 if x.dtype == np.bool_ else out


def allgather(world, x):
    nccl, cp, comm, device = _setup(world, x)
    with device:
        src = cp.ascontiguousarray(x)
        out = cp.empty((world.size * src.shape[0], *src.shape[1:]), src.dtype)
        comm.allGather(src.data.ptr, out.data.ptr, src.nbytes, nccl.NCCL_UINT8, cp.cuda.get_current_stream().ptr)
        return out
