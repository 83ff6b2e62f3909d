"""The collective ops against numpy references, for any number of ranks. Every rank's data is a function of its
rank, so each rank computes the expected result of each collective by itself. test_mpi.py and test_gloo.py run
these checks in one process (K = 1); tests/mpi/worker.py runs them under `mpiexec -n 2` and `-n 3`."""
import numpy as np

from stepnet import Workspace
from stepnet.core.backend import device_of
from stepnet.io.proto import DeviceOption
from stepnet.testing import GPU_MODE, make_op

DTYPES = (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_)
SHAPES = ((), (5,), (3, 4), (2, 3, 2), (0, 3))
GPU = DeviceOption(device_type=1)


def data(rank: int, shape, dtype, salt: int = 0) -> np.ndarray:
    """Rank `rank`'s tensor: small values, so sums over 3 ranks stay exact in every dtype."""
    rng = np.random.default_rng(1000 * salt + rank)
    if np.dtype(dtype) == np.bool_:
        return np.asarray(rng.random(shape) < 0.3)
    values = rng.integers(0, 10, shape) if np.dtype(dtype).kind in "iu" else rng.uniform(-2, 2, shape)
    return np.asarray(values).astype(dtype)


def workspace(device: str = "cpu") -> Workspace:
    """A workspace with a common world in blob 'comm'."""
    ws = Workspace(gpu=GPU_MODE[device])
    ws.run_operator_once(make_op("MPICreateCommonWorld", [], ["comm"]))
    return ws


def run(ws, op_type: str, inputs: dict, outputs, device: str = "cpu", **args) -> list:
    """Feed inputs (name -> array), run op_type(comm, *inputs) -> outputs, return the outputs as numpy arrays;
    the op's inputs must be unchanged except those it writes in place."""
    for name, value in inputs.items():
        ws.feed(name, value, device_option=GPU if device != "cpu" else None)
    before = {n: ws.fetch(n) for n in inputs if n not in outputs}
    ws.run_operator_once(make_op(op_type, ["comm", *inputs], outputs, device=device, **args))
    for name, value in before.items():
        assert np.array_equal(ws.fetch(name), value), f"{op_type} changed its input {name!r}"
    for name in outputs[:1]:
        where = device_of(ws.get_blob(name).value)
        assert where is not None and where.is_cpu == (device == "cpu"), f"{op_type}: {name} is on {where}"
    return [ws.fetch(n) for n in outputs]


def close(got, want, dtype, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype}, want " \
                                                                 f"{want.shape} {want.dtype}"
    tol = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-12}.get(np.dtype(dtype).type, 0)
    assert np.allclose(got, want, rtol=tol, atol=tol), f"{what}: max |diff| {np.abs(got - want).max()}"


def total(size: int, shape, dtype, salt: int = 0) -> np.ndarray:
    """The sum of every rank's data (float16 summed in float32, bools as 'any')."""
    parts = [data(r, shape, dtype, salt) for r in range(size)]
    if np.dtype(dtype) == np.bool_:
        return np.logical_or.reduce(parts)
    acc = np.float32 if np.dtype(dtype) == np.float16 else dtype
    return np.sum([p.astype(acc) for p in parts], axis=0).astype(dtype).reshape(shape)


def check_mpi_ops(rank: int, size: int, device: str = "cpu") -> int:
    """MPIAllreduce (also in place), MPIBroadcast and MPIReduce from every root, MPIAllgather; returns the count."""
    ws, n = workspace(device), 0
    for dtype in DTYPES:
        for shape in SHAPES:
            what = f"{np.dtype(dtype)} {shape} on {device}, rank {rank} of {size}"
            x = data(rank, shape, dtype)
            close(run(ws, "MPIAllreduce", {"x": x}, ["y"], device)[0], total(size, shape, dtype), dtype,
                  "MPIAllreduce " + what)
            close(run(ws, "MPIAllreduce", {"x": x}, ["x"], device)[0], total(size, shape, dtype), dtype,
                  "MPIAllreduce in place " + what)
            for root in range(size):
                got = run(ws, "MPIBroadcast", {"b": x}, ["b"], device, root=root)[0]
                close(got, data(root, shape, dtype), dtype, f"MPIBroadcast root {root} " + what)
                got = run(ws, "MPIReduce", {"x": x}, ["r"], device, root=root)[0]
                want = total(size, shape, dtype) if rank == root else x
                close(got, want, dtype, f"MPIReduce root {root} " + what)
            if shape:
                got = run(ws, "MPIAllgather", {"x": x}, ["g"], device)[0]
                want = np.concatenate([data(r, shape, dtype) for r in range(size)])
                close(got, want, dtype, "MPIAllgather " + what)
            n += 1
    return n


def check_gloo_ops(rank: int, size: int, device: str = "cpu") -> int:
    """Allreduce, Broadcast and Allgather over two local tensors of one size and two shapes, Reduce from every
    root; Barrier."""
    ws, n = workspace(device), 0
    for dtype in (np.float32, np.int64, np.float16):
        what = f"{np.dtype(dtype)} on {device}, rank {rank} of {size}"
        a, b = data(rank, (3, 4), dtype), data(rank, (12,), dtype, salt=1)
        got = run(ws, "Allreduce", {"a": a, "b": b}, ["a", "b"], device)
        want = (total(size, (3, 4), dtype).astype(np.float32) + total(size, (12,), dtype, 1).astype(np.float32)
                .reshape(3, 4)).astype(dtype)
        close(got[0], want, dtype, "Allreduce " + what)
        close(got[1], want.reshape(12), dtype, "Allreduce, second tensor, " + what)
        for root in range(size):
            got = run(ws, "Broadcast", {"a": a, "b": b}, ["a", "b"], device, root=root)
            close(got[0], data(root, (3, 4), dtype), dtype, f"Broadcast root {root} " + what)
            close(got[1], data(root, (3, 4), dtype).reshape(12), dtype, f"Broadcast root {root}, second, " + what)
            got = run(ws, "Reduce", {"a": a}, ["r"], device, root=root)[0]
            close(got, total(size, (3, 4), dtype) if rank == root else a, dtype, f"Reduce root {root} " + what)
        if dtype != np.int64:    # (Gloo's ReduceScatter sums float32 and float16)
            check_reduce_scatter(ws, rank, size, a, b, dtype, device, what)
        got = run(ws, "Allgather", {"a": a, "b": b}, ["g"], device)[0]
        want = np.concatenate([np.concatenate([data(r, (3, 4), dtype).reshape(-1), data(r, (12,), dtype, 1)])
                               for r in range(size)])
        close(got, want, dtype, "Allgather " + what)
        n += 1
    ws.run_operator_once(make_op("Barrier", ["comm"], []))
    return n


def receive_counts(size: int, count: int) -> np.ndarray:
    """Uneven parts: rank r gets count // size elements, one more for the first count % size ranks, and rank 0
    two fewer (so that the parts add up to less than the whole)."""
    counts = np.array([count // size + (r < count % size) for r in range(size)], np.int32)
    counts[0] = max(counts[0] - 2, 0)
    return counts


def check_reduce_scatter(ws, rank: int, size: int, a, b, dtype, device: str, what: str) -> None:
    """ReduceScatter of two local tensors: this rank's first counts[rank] elements are its consecutive part of
    the sum over every tensor of every rank, the rest the sum of its own two tensors; both buffers alike, and
    the counts written back unchanged."""
    counts = receive_counts(size, a.size)
    got = run(ws, "ReduceScatter", {"a": a, "b": b, "counts": counts}, ["a", "b", "counts"], device)
    acc = np.float32 if np.dtype(dtype) == np.float16 else dtype
    whole = (total(size, (3, 4), dtype).astype(acc).reshape(-1) + total(size, (12,), dtype, 1).astype(acc))
    want = (a.astype(acc).reshape(-1) + b.astype(acc)).astype(dtype)
    start, n = int(counts[:rank].sum()), int(counts[rank])
    want[:n] = whole[start:start + n].astype(dtype)
    close(got[0], want.reshape(3, 4), dtype, "ReduceScatter " + what)
    close(got[1], want, dtype, "ReduceScatter, second tensor, " + what)
    assert np.array_equal(got[2], counts), f"ReduceScatter changed the counts: {got[2]}"


def check_strings(rank: int, size: int) -> None:
    ws = workspace()
    words = np.array([f"rank{rank}", "x" * rank], dtype=object)
    got = run(ws, "MPIBroadcast", {"s": words}, ["s"], root=size - 1)[0]
    assert got.tolist() == [f"rank{size - 1}", "x" * (size - 1)], got
    got = run(ws, "MPIAllgather", {"s": words}, ["all"])[0]
    assert got.tolist() == [w for r in range(size) for w in (f"rank{r}", "x" * r)], got


def check_send_receive(rank: int, size: int, device: str = "cpu", generic: bool = False) -> None:
    """A ring: every rank sends to the next one and receives from the previous one, by arguments and by the
    int inputs, and the receive reports the sender and the tag. generic: SendTensor / ReceiveTensor (the MPI
    engine's, under the generic schema: Y received in place, the int inputs src and tag overwritten in place,
    as Caffe2's mpi_test writes them) instead of MPISendTensor / MPIReceiveTensor."""
    ws = workspace(device)
    send, receive = ("SendTensor", "ReceiveTensor") if generic else ("MPISendTensor", "MPIReceiveTensor")
    y = "y" if generic else "like"
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    x = data(rank, (2, 3), np.float32)
    run(ws, send, {"x": x}, [], device, dst=nxt, tag=7, raw_buffer=1)
    got, src, tag = run(ws, receive, {y: np.zeros((2, 3), np.float32)}, ["y", "src", "tag"], device,
                        src=prev, tag=7, raw_buffer=1)
    close(got, data(prev, (2, 3), np.float32), np.float32, receive)
    assert (int(src), int(tag)) == (prev, 7) and src.dtype == np.int32
    ints = {"dst": np.array([nxt], np.int32), "tg": np.array([3], np.int32)}
    run(ws, send, {"x": x.astype(np.int64), **ints}, [], device, raw_buffer=1)
    if generic:     # the sender and tag given as inputs, and written back over them
        peer = {"src": np.array([prev], np.int32), "tag": np.array([3], np.int32)}
        got, src, tag = run(ws, receive, {y: np.zeros((2, 3), np.int64), **peer}, ["y", "src", "tag"], device,
                            src=size + 5, tag=99, raw_buffer=1)    # (the inputs win over the arguments)
    else:
        got, src, tag = run(ws, receive, {y: np.zeros((2, 3), np.int64)}, ["y", "src", "tag"], device,
                            raw_buffer=1)   # any sender, any tag
    close(got, data(prev, (2, 3), np.float32).astype(np.int64), np.int64, f"{receive}, second message")
    assert (int(src), int(tag)) == (prev, 3)


def check_all(rank: int, size: int) -> int:
    count = 0
    for device in ("cpu", "emulated"):
        count += check_mpi_ops(rank, size, device) + check_gloo_ops(rank, size, device)
        check_send_receive(rank, size, device)
        check_send_receive(rank, size, device, generic=True)
    check_strings(rank, size)
    return count
