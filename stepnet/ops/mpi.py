"""Caffe2's MPI operators (caffe2/mpi/mpi_ops.h): MPICreateCommonWorld, then MPIBroadcast, MPIReduce (sum),
MPIAllgather and MPIAllreduce (sum) over the common world, and raw-buffer MPISendTensor / MPIReceiveTensor, on the
MPI transport of mpi4py (stepnet.distributed.collectives; NCCL for arrays on CUDA devices).

Under `mpiexec -n K` every process runs its copy of the net and these ops meet across the K processes; outside
mpiexec the common world is the process alone and each collective is the identity. Caffe2 registers the
reductions and allgather for float32 only; here every numeric dtype works (float16 is summed in float32, bool
as "any"), and broadcast/allgather/send move raw bytes of any dtype (strings too, except send).
"""
from __future__ import annotations

import numpy as np

from ..distributed import world as process
from ..distributed.collectives import ANY, Call, CommonWorld
from ..core.errors import ArgumentError, ArityError, CollectiveError
from .base import host_ints, like, out_spec
from .registry import SHOULD_NOT_DO_GRADIENT, op

COMM_SPEC = out_spec((), object)   # what shape inference knows of a common-world blob: an opaque scalar


def comm_shape(specs, **_):
    return [COMM_SPEC]


def like_input(i: int):
    """A shape function: output 0 shaped and typed like input i."""
    def shape(specs, **_):
        return [like(specs[i])]
    return shape


def receive_shape(specs, **_):
    return [like(specs[1]), out_spec((), np.int32), out_spec((), np.int32)]


def common_world(ctx, value) -> CommonWorld:
    """Input 0 of a collective, which must be a common world."""
    if not isinstance(value, CommonWorld):
        what = "nothing" if value is None else (f"a {tuple(value.shape)} {value.dtype} tensor"
                                                if hasattr(value, "shape") else type(value).__name__)
        raise CollectiveError(f"input 0 ({ctx.opdef.input[0]!r}) must be a common world made by "
                              f"MPICreateCommonWorld or CreateCommonWorld, got {what}: a collective runs only "
                              "inside a common world")
    return value


def call_of(ctx, x, index: int = 1, root: int = 0) -> Call:
    return Call.of(ctx.opdef.type, ctx.opdef.input[index], x, root)


def fresh(ctx, x, result, index: int = 1, output: int = 0):
    """result, copied when it is the input array itself and the op writes it to another blob (a lone process's
    collectives return their input)."""
    if result is x and ctx.opdef.output[output] != ctx.opdef.input[index]:
        return x.copy()
    return result


def _allgather_shape(specs, **_):
    x = specs[1]
    if not x.shape:
        raise CollectiveError("MPIAllgather joins along the first axis; X is a scalar")
    return [out_spec((process.size() * x.shape[0], *x.shape[1:]), x.dtype)]


# --------------------------------------------------------------------------------------------- collectives
@op("MPICreateCommonWorld", inputs=0, outputs=1, context=True, gradient=SHOULD_NOT_DO_GRADIENT, shape=comm_shape)
def mpi_create_common_world(ctx, xp):
    """A common world of every process of the job (Caffe2 splits MPI's world communicator with one color, which
    is the same group), stored as an opaque object in the output blob."""
    ctx.outputs[0].set(CommonWorld(ctx.opdef.output[0]))
    return (None,)


@op("MPIBroadcast", inputs=2, outputs=1, inplace=(), enforce_inplace=[(1, 0)], context=True, args={"root": 0},
    gradient=SHOULD_NOT_DO_GRADIENT, shape=like_input(1))
def mpi_broadcast(ctx, xp, comm, x, *, root):
    """X (in place) becomes rank root's X on every rank; X must already hold a tensor of the same shape and type
    on every rank."""
    world = common_world(ctx, comm)
    return world.broadcast(x, root, call_of(ctx, x, root=root))


@op("MPIReduce", inputs=2, outputs=1, inplace=(), context=True, args={"root": 0}, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=like_input(1))
def mpi_reduce(ctx, xp, comm, x, *, root):
    """Y = the sum of X over every rank, on rank root. Caffe2 leaves Y unset on the other ranks; here they get a
    copy of their own X."""
    world = common_world(ctx, comm)
    return fresh(ctx, x, world.reduce(x, root, call_of(ctx, x, root=root)))


@op("MPIAllgather", inputs=2, outputs=1, inplace=(), context=True, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=_allgather_shape)
def mpi_allgather(ctx, xp, comm, x):
    """Y = every rank's X joined along the first axis in rank order (first dim × size); X must have the same
    shape on every rank."""
    world = common_world(ctx, comm)
    return fresh(ctx, x, world.allgather(x, call_of(ctx, x)))


@op("MPIAllreduce", inputs=2, outputs=1, inplace=[(1, 0)], context=True, gradient=SHOULD_NOT_DO_GRADIENT,
    shape=like_input(1))
def mpi_allreduce(ctx, xp, comm, x):
    """Y = the element-wise sum of X over every rank, the same on all of them (Y may be X: in place)."""
    world = common_world(ctx, comm)
    return fresh(ctx, x, world.allreduce(x, call_of(ctx, x)))


# --------------------------------------------------------------------------------------------- point to point
def _peer(ctx, given, rank: int, tag: int, what: str) -> tuple[int, int]:
    """(rank, tag) from the int inputs 2 and 3 when given (they override the arguments), else the arguments."""
    if len(given) == 1:
        raise ArityError(f"{ctx.opdef.type} takes 2 or 4 inputs (comm, X[, {what}, tag]), got 3")
    if given:
        values = [host_ints(v, name) for v, name in zip(given, (what, "tag"))]
        if any(len(v) != 1 for v in values):
            raise ArgumentError(f"inputs {what} and tag must each hold one integer")
        rank, tag = values[0][0], values[1][0]
    return rank, tag


def _check_raw(raw_buffer: bool, op_type: str) -> None:
    if not raw_buffer:
        raise ArgumentError(f"{op_type}: raw_buffer=0 is not supported (nor is it in Caffe2): set raw_buffer=1; "
                            "the receiver must know the tensor's shape and type")


@op("MPISendTensor", inputs=(2, 4), outputs=0, inplace=(), context=True, host_inputs=(2, 3),
    args={"dst": ANY, "tag": ANY, "raw_buffer": False}, gradient=SHOULD_NOT_DO_GRADIENT)
def mpi_send_tensor(ctx, xp, comm, x, *dst_tag, dst, tag, raw_buffer):
    """Send X's bytes to rank dst with tag (arguments, or int inputs 2 and 3, which win); raw_buffer must be
    set."""
    world = common_world(ctx, comm)
    _check_raw(raw_buffer, ctx.opdef.type)
    dst, tag = _peer(ctx, dst_tag, dst, tag, "dst")
    if dst < 0 or tag < 0:
        raise ArgumentError(f"{ctx.opdef.type} needs the destination rank and the tag: give the dst and tag "
                            "arguments or the dst and tag inputs")
    world.send(x, dst, tag, call_of(ctx, x))


@op("MPIReceiveTensor", inputs=(2, 4), outputs=3, inplace=(), context=True, host_inputs=(2, 3),
    args={"src": ANY, "tag": ANY, "raw_buffer": False}, gradient=SHOULD_NOT_DO_GRADIENT, shape=receive_shape)
def mpi_receive_tensor(ctx, xp, comm, like_x, *src_tag, src, tag, raw_buffer):
    """Receive a tensor shaped and typed like input 1 from rank src with tag (arguments or int inputs 2 and 3;
    default: any sender, any tag) into Y; also the int32 source rank and tag. Caffe2 receives into Y's existing
    buffer (its schema allows no in-place output, so Y is a second pre-filled blob); here input 1 gives the
    shape and type. A message of another size is an error naming the blob."""
    world = common_world(ctx, comm)
    _check_raw(raw_buffer, ctx.opdef.type)
    src, tag = _peer(ctx, src_tag, src, tag, "src")
    y, source, got_tag = world.receive(like_x, src, tag, call_of(ctx, like_x))
    return y, np.array(source, np.int32), np.array(got_tag, np.int32)
