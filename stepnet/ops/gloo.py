"""Caffe2's generic communication operators (caffe2/operators/communicator_op.cc) as its Gloo and MPI engines run them
(caffe2/contrib/gloo/*_ops.h, caffe2/mpi/mpi_ops.h): CreateCommonWorld, CloneCommonWorld, DestroyCommonWorld,
Broadcast, Allreduce, ReduceScatter, Allgather and Barrier (Gloo's), Reduce, SendTensor and ReceiveTensor
(registered only under engine MPI in Caffe2: the MPI ops' kernels, stepnet.ops.mpi, under the generic schemas),
mapped onto the same MPI transport as the MPI ops, so files written for any of them run.

Gloo's rendezvous (store handler, transport, interface, timeout) is MPI's here: those arguments are accepted and
ignored, and the rank is this process's MPI rank. `size`, when given, must be the job's number of processes.
Several tensors in one Broadcast / Allreduce / Allgather act as Gloo's several local buffers: Allreduce sums them
all, on every rank, into each; Broadcast copies root's first one into every one; Allgather returns a flat vector of
every rank's tensors in rank order. `engine` (GLOO, MPI) selects nothing: the ops read Caffe2's schema for their
type, as Caffe2 checks an op against it whatever its engine (so an Allreduce with engine MPI must still run in
place). ReduceScatter gives each rank its own part of the sum, as Gloo's halving-doubling does (here through one
MPI allreduce: the same values, more bytes moved).
"""
from __future__ import annotations

import math

from ..distributed import world as process
from ..distributed.collectives import ANY, Call, CommonWorld
from ..core import backend
from ..core.errors import ArgumentError, ArityError, CollectiveError, DTypeError, ShapeError
from .base import like, out_spec
from .mpi import comm_shape, common_world, like_input, mpi_receive_tensor, mpi_reduce, mpi_send_tensor, receive_shape
from .registry import SHOULD_NOT_DO_GRADIENT, op

MAX_BUFFERS = 256
IN_PLACE = [(i + 1, i) for i in range(MAX_BUFFERS)]   # output i is input i + 1
STATUS = {"status_blob": ""}
RENDEZVOUS = {"size": 0, "rank": 0, "sync": False, "transport": "tcp", "interface": "", "mpi_rendezvous": False,
              "timeout_ms": -1, **STATUS}


def _buffers(ctx, xs, outputs: bool = True) -> None:
    """Gloo's checks: one output per tensor (for the in-place ops), all of one size and type."""
    if outputs and len(ctx.opdef.output) != len(xs):
        raise ArityError(f"{ctx.opdef.type} writes one output per tensor input (in place): {len(xs)} tensors, "
                         f"{len(ctx.opdef.output)} outputs")
    for name, x in zip(ctx.opdef.input[2:], xs[1:]):
        if x.size != xs[0].size:
            raise ShapeError(f"{ctx.opdef.type}: {name!r} has {x.size} elements, {ctx.opdef.input[1]!r} "
                             f"{xs[0].size}; every tensor must have the same size")
        if x.dtype != xs[0].dtype:
            raise DTypeError(f"{ctx.opdef.type}: {name!r} is {x.dtype}, {ctx.opdef.input[1]!r} {xs[0].dtype}; "
                             "every tensor must have the same type")


def _call(ctx, x, root: int = 0) -> Call:
    return Call.of(ctx.opdef.type, ", ".join(ctx.opdef.input[1:]), x, root)


def _each(specs, **_):
    return [like(s) for s in specs[1:]]


def _local_sum(xs):
    """The sum of this rank's tensors, in the first one's shape (the first itself when it is alone)."""
    local = xs[0]
    for x in xs[1:]:
        local = local + x.reshape(local.shape)
    return local


def _into_each(value, xs) -> tuple:
    """value in each tensor's shape: the first as it is, copies for the others (Gloo's buffers are separate)."""
    return tuple(value.reshape(x.shape) if k == 0 else value.reshape(x.shape).copy() for k, x in enumerate(xs))


@op("CreateCommonWorld", inputs=(0, 1), outputs=1, context=True, devices="any", args=RENDEZVOUS,
    gradient=SHOULD_NOT_DO_GRADIENT, shape=comm_shape)
def create_common_world(ctx, xp, *kv_handler, size, rank, sync, transport, interface, mpi_rendezvous, timeout_ms,
                        status_blob):
    """A common world of every process of the job (the optional key/value handler input is not needed: MPI did
    the rendezvous). size > 0 must equal the number of processes; rank, if given with it, must be below it."""
    world = CommonWorld(ctx.opdef.output[0])
    if size > 0 and size != world.size:
        raise CollectiveError(f"the net was built for a common world of size={size} but this job has {world.size} "
                              f"process(es); run it with mpiexec -n {size}")
    if size > 0 and not 0 <= rank < size:
        raise ArgumentError(f"rank={rank} is not below size={size}")
    ctx.outputs[0].set(world)
    return (None,)


@op("CloneCommonWorld", inputs=1, outputs=1, context=True, devices="any", args={"sync": False, **STATUS},
    gradient=SHOULD_NOT_DO_GRADIENT, shape=comm_shape)
def clone_common_world(ctx, xp, existing, *, sync, status_blob):
    """Another common world of the same processes."""
    common_world(ctx, existing)
    ctx.outputs[0].set(CommonWorld(ctx.opdef.output[0]))
    return (None,)


@op("DestroyCommonWorld", inputs=1, outputs=1, inplace=(), enforce_inplace=[(0, 0)], context=True, devices="any",
    gradient=SHOULD_NOT_DO_GRADIENT)
def destroy_common_world(ctx, xp, existing):
    """Close the common world's connections: nothing to do over MPI (an empty blob is accepted, as in Caffe2)."""
    if existing is not None:
        common_world(ctx, existing)
    return (None,)


@op("Broadcast", inputs=(2, None), outputs=(1, None), inplace=(), enforce_inplace=IN_PLACE, context=True,
    devices="any", args={"root": 0, **STATUS}, gradient=SHOULD_NOT_DO_GRADIENT, shape=_each)
def broadcast(ctx, xp, comm, *xs, root, status_blob):
    """Every tensor (in place) becomes the first tensor of rank root; all must be pre-created with the same size
    and type on every rank."""
    world = common_world(ctx, comm)
    _buffers(ctx, xs)
    value = world.broadcast(xs[0], root, _call(ctx, xs[0], root))
    return _into_each(value, xs)


@op("Allreduce", inputs=(2, None), outputs=(1, None), inplace=(), enforce_inplace=IN_PLACE, context=True,
    devices="any", args={"gpu_direct": False, **STATUS}, gradient=SHOULD_NOT_DO_GRADIENT, shape=_each)
def allreduce(ctx, xp, comm, *xs, gpu_direct, status_blob):
    """Every tensor (in place) becomes the sum of all the tensors of every rank."""
    world = common_world(ctx, comm)
    _buffers(ctx, xs)
    local = _local_sum(xs)
    return _into_each(world.allreduce(local, _call(ctx, local)), xs)


@op("ReduceScatter", inputs=(3, None), outputs=(2, None), inplace=(), enforce_inplace=IN_PLACE, context=True,
    devices="any", args=STATUS, gradient=SHOULD_NOT_DO_GRADIENT, shape=_each)
def reduce_scatter(ctx, xp, comm, *xs_counts, status_blob):
    """comm, X_1..X_k, RECV_COUNTS -> X_1..X_k, RECV_COUNTS, all in place (Caffe2's schema: outputs = inputs -
    1). RECV_COUNTS (int32, one per rank) splits the sum of every tensor of every rank into consecutive parts:
    rank r's first RECV_COUNTS[r] elements become part r; the rest of its buffers keep the sum of its own tensors
    (Gloo leaves its algorithm's partial sums there). Float tensors, as Gloo's (float32, float16)."""
    *xs, counts = xs_counts
    world = common_world(ctx, comm)
    if len(ctx.opdef.output) != len(xs_counts):
        raise ArityError(f"ReduceScatter writes its {len(xs)} tensor(s) and the receive counts in place: "
                         f"{len(xs_counts)} outputs, got {len(ctx.opdef.output)}")
    _buffers(ctx, xs, outputs=False)
    if counts.dtype.kind not in "iu" or counts.ndim != 1 or counts.shape[0] != world.size:
        raise ShapeError(f"ReduceScatter: {ctx.opdef.input[-1]!r} must hold one integer receive count per rank "
                         f"({world.size}), got {counts.dtype} of shape {tuple(counts.shape)}")
    if xs[0].dtype.kind != "f":
        raise DTypeError(f"ReduceScatter sums float tensors (Gloo's float32 and float16), got {xs[0].dtype}")
    n = [int(c) for c in backend.to_host(counts)]
    if min(n) < 0 or sum(n) > xs[0].size:
        raise ShapeError(f"ReduceScatter: the receive counts {n} must be non-negative and add up to at most the "
                         f"{xs[0].size} elements of each tensor")
    local = _local_sum(xs)
    total = world.allreduce(local, _call(ctx, local))
    out = (local.copy() if local is xs[0] else local).reshape(-1)     # (written: never the input itself)
    start = sum(n[:world.rank])
    out[:n[world.rank]] = total.reshape(-1)[start:start + n[world.rank]]
    return (*_into_each(out, xs), counts)


def _allgather_shape(specs, **_):
    return [out_spec(((len(specs) - 1) * math.prod(specs[1].shape) * process.size(),), specs[1].dtype)]


@op("Allgather", inputs=(2, None), outputs=1, inplace=(), context=True, devices="any", args=STATUS,
    gradient=SHOULD_NOT_DO_GRADIENT, shape=_allgather_shape)
def allgather(ctx, xp, comm, *xs, status_blob):
    """A flat vector of every rank's tensors, in rank order (rank 0's tensors in input order, then rank 1's,
    ...); the tensors must have the same size and type."""
    world = common_world(ctx, comm)
    _buffers(ctx, xs, outputs=False)
    local = xp.concatenate([x.reshape(-1) for x in xs]) if len(xs) > 1 else xs[0].reshape(-1)
    out = world.allgather(local, _call(ctx, local))
    return out.copy() if out is local and len(xs) == 1 else out   # a lone process gets a view of its input


@op("Barrier", inputs=1, outputs=0, context=True, devices="any", args=STATUS, gradient=SHOULD_NOT_DO_GRADIENT)
def barrier(ctx, xp, comm, *, status_blob):
    """Wait until every rank of the common world reaches its Barrier."""
    common_world(ctx, comm).barrier(Call(ctx.opdef.type, ctx.opdef.input[0]))


# ----------------------------------------------------------------------------- the MPI engine's generic types
@op("Reduce", inputs=2, outputs=1, inplace=(), context=True, devices="any", args={"root": 0},
    gradient=SHOULD_NOT_DO_GRADIENT, shape=like_input(1))
def reduce_to_root(ctx, xp, comm, x, *, root):
    """Y = the sum of X over every rank, on rank root (the other ranks: a copy of their own X, where Caffe2
    leaves Y unset); MPIReduce's kernel."""
    return mpi_reduce(ctx, xp, comm, x, root=root)


@op("SendTensor", inputs=(2, 4), outputs=0, inplace=(), context=True, host_inputs=(2, 3),
    args={"dst": ANY, "tag": ANY, "raw_buffer": False}, gradient=SHOULD_NOT_DO_GRADIENT)
def send_tensor(ctx, xp, comm, x, *dst_tag, dst, tag, raw_buffer):
    """Send X's bytes to rank dst with tag (arguments, or int inputs 2 and 3, which win); raw_buffer must be set.
    MPISendTensor's kernel."""
    return mpi_send_tensor(ctx, xp, comm, x, *dst_tag, dst=dst, tag=tag, raw_buffer=raw_buffer)


@op("ReceiveTensor", inputs=(2, 4), outputs=3, inplace=[(2, 1), (3, 2)], enforce_inplace=[(1, 0)], context=True,
    host_inputs=(2, 3), args={"src": ANY, "tag": ANY, "raw_buffer": False}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=receive_shape)
def receive_tensor(ctx, xp, comm, y, *src_tag, src, tag, raw_buffer):
    """Receive into Y (in place: input 1 gives the shape and type) from rank src with tag (arguments, or int
    inputs 2 and 3, which may be outputs 1 and 2 in place; default: any sender, any tag); also the int32 source
    rank and tag. MPIReceiveTensor's kernel."""
    return mpi_receive_tensor(ctx, xp, comm, y, *src_tag, src=src, tag=tag, raw_buffer=raw_buffer)
