"""Collectives over a common world (the opaque value MPICreateCommonWorld / CreateCommonWorld put in a blob):
allreduce (sum), broadcast, reduce (sum), allgather, barrier, and raw-buffer send / receive, on MPI through mpi4py.
Arrays on CUDA devices go through NCCL (`stepnet.distributed.nccl`, imported only then); the emulated device's go
through the host.

Before each collective the ranks exchange a fingerprint of the call (op, blob, shape, dtype, root): ranks that reach
different collectives, or the same one with blobs of different shapes or types, get a CollectiveError that names
every rank's blob and shape, instead of waiting forever or mixing bytes. A process alone (outside mpiexec) is rank 0
of 1: every collective returns its input. A message a rank sends itself waits in a mailbox for its receive (MPI_Send
to oneself would block)."""
from __future__ import annotations

import zlib
from typing import NamedTuple

import numpy as np

from ..core import backend
from ..core.errors import CollectiveError
from .world import process_world

FINGERPRINT = 16   # int64 entries exchanged before every collective
MAX_DIMS = 10      # dims written out in full (the shape's checksum covers the rest)
TAG_MAX = 2**31 - 1   # a tag is a C int
ANY = -1           # src / tag: any sender, any tag


class Call(NamedTuple):
    """What one rank is about to do: op type, blob name, its shape and dtype, the root (broadcast, reduce)."""
    op: str
    blob: str
    shape: tuple | None = None
    dtype: str = ""
    root: int = 0

    @classmethod
    def of(cls, op: str, blob: str, x, root: int = 0) -> "Call":
        return cls(op, blob, tuple(int(d) for d in x.shape), str(x.dtype), root)

    def fingerprint(self) -> np.ndarray:
        dims = list(self.shape or ())[:MAX_DIMS]
        ndim = -1 if self.shape is None else len(self.shape)
        row = [_crc(self.op), _crc(self.blob), _crc(self.dtype), _crc(repr(self.shape)), self.root, ndim, *dims]
        return np.array(row + [0] * (FINGERPRINT - len(row)), np.int64)

    def __str__(self):
        if self.op == "finish":
            return "the end of its run"
        what = f" {self.shape} {self.dtype}" if self.shape is not None else ""
        root = f" (root {self.root})" if self.op.endswith(("Broadcast", "Reduce")) else ""
        return f"{self.op} of blob {self.blob!r}{what}{root}"


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogateescape"))


def _host(x) -> np.ndarray:
    return np.asarray(backend.to_host(x))


def _like(x, host: np.ndarray):
    """host on x's device (x's own kind of array)."""
    dev = backend.device_of(x)
    return host if dev is None or dev.is_cpu else backend.to_device(host, dev)


def _bytes(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes as a flat uint8 view (what raw-buffer transfers move)."""
    return a.reshape(-1).view(np.uint8)


def _on_cuda(x) -> bool:
    dev = backend.device_of(x)
    return dev is not None and dev.kind == "cuda"


def summable(dtype: np.dtype) -> np.dtype:
    """The dtype MPI sums in: float16 in float32, bool as uint8 (then any nonzero is True, as numpy adds bools);
    others as they are. Strings cannot be summed."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSUV":
        raise CollectiveError(f"{dtype} tensors cannot be summed")
    return {"e": np.dtype(np.float32), "?": np.dtype(np.uint8)}.get(dtype.char, dtype)


def _cast_back(summed: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if summed.dtype == dtype:
        return summed
    return summed != 0 if dtype == np.bool_ else summed.astype(dtype)


class CommonWorld:
    """Every process of the job as one group: rank and size (from MPI under mpiexec, else 0 and 1). Created by
    the common-world ops; the collectives take the array and a Call describing it, never change the array, and
    may return it as it is when the world is this process alone."""

    def __init__(self, name: str = ""):
        world = process_world()
        self.process, self.rank, self.size, self.name = world, world.rank, world.size, name
        self.mailbox: list[tuple[int, np.ndarray]] = []   # messages this process sent itself: (tag, bytes)
        self.nccl: dict = {}                               # NCCL communicators by CUDA device (distributed.nccl)

    def __repr__(self):
        return f"CommonWorld({self.name!r}, rank {self.rank} of {self.size})"

    @property
    def comm(self):
        return self.process.comm

    # ------------------------------------------------------------------------------------------ agreement
    def agree(self, call: Call) -> None:
        """Exchange the call's fingerprint with every rank; any difference is a CollectiveError on all of them."""
        if self.comm is None:
            return
        mine = call.fingerprint()
        rows = np.empty((self.size, FINGERPRINT), np.int64)
        self.comm.Allgather(mine, rows)
        if (rows == mine).all():
            return
        calls = self.comm.allgather(str(call))   # every rank saw the same rows: all of them come here
        listing = "; ".join(f"rank {r} is at {c}" for r, c in enumerate(calls))
        subject = "whether the run is over" if call.op == "finish" else f"the collective of blob {call.blob!r}"
        raise CollectiveError(f"the ranks disagree on {subject}: {listing}; every rank must run the same "
                              "collectives, in the same order, on blobs of one shape and type")

    def max_tag(self) -> int:
        """The largest tag a message may carry: MPI's TAG_UB under mpiexec, a C int's largest alone."""
        if self.comm is None:
            return TAG_MAX
        bound = self.comm.Get_attr(self.process.mpi.TAG_UB)
        return int(bound) if bound is not None else 32767   # 32767: the least TAG_UB the MPI standard allows

    def check_tag(self, tag: int, call: Call, any_ok: bool) -> None:
        low = ANY if any_ok else 0
        if not low <= tag <= self.max_tag():
            what = "-1 (any tag) or " if any_ok else ""
            raise CollectiveError(f"{call.op}: tag {tag} is out of range; a tag is {what}0 to {self.max_tag()}")

    def check_root(self, root: int, call: Call) -> None:
        if not 0 <= root < self.size:
            raise CollectiveError(f"{call.op}: root {root} is not a rank of the common world (size {self.size})")

    # ------------------------------------------------------------------------------------------ collectives
    def allreduce(self, x, call: Call):
        """The element-wise sum of x over every rank."""
        self.agree(call)
        if self.comm is None:
            summable(x.dtype)
            return x
        if _on_cuda(x):
            from . import nccl
            return nccl.allreduce(self, x)
        host = _host(x)
        work = np.asarray(host, dtype=summable(host.dtype), order="C")
        out = np.empty_like(work)
        self.comm.Allreduce(work, out, op=self.process.mpi.SUM)
        return _like(x, _cast_back(out, host.dtype))

    def broadcast(self, x, root: int, call: Call):
        """Rank root's x, on every rank (x's shape and dtype must be the same everywhere)."""
        self.check_root(root, call)
        self.agree(call)
        if self.comm is None:
            return x
        if _on_cuda(x):
            from . import nccl
            return nccl.broadcast(self, x, root)
        host = _host(x)
        if host.dtype == object:
            return np.asarray(self.comm.bcast(host, root=root))
        buf = np.array(host, order="C", copy=True)
        self.comm.Bcast([_bytes(buf), self.process.mpi.BYTE], root=root)
        return _like(x, buf)

    def reduce(self, x, root: int, call: Call):
        """The sum of x over every rank on rank root; the other ranks get x back."""
        self.check_root(root, call)
        self.agree(call)
        if self.comm is None:
            summable(x.dtype)
            return x
        if _on_cuda(x):
            from . import nccl
            return nccl.reduce(self, x, root)
        host = _host(x)
        work = np.asarray(host, dtype=summable(host.dtype), order="C")
        out = np.empty_like(work) if self.rank == root else None
        self.comm.Reduce(work, out, op=self.process.mpi.SUM, root=root)
        return _like(x, _cast_back(out, host.dtype)) if self.rank == root else x

    def allgather(self, x, call: Call):
        """Every rank's x concatenated along the first axis, in rank order."""
        if x.ndim < 1:
            raise CollectiveError(f"{call.op}: blob {call.blob!r} is a scalar; allgather joins along the first "
                                  "axis, so it needs at least one dimension")
        self.agree(call)
        if self.comm is None:
            return x
        if _on_cuda(x):
            from . import nccl
            return nccl.allgather(self, x)
        host = _host(x)
        if host.dtype == object:
            return np.concatenate(self.comm.allgather(host))
        host = np.asarray(host, order="C")
        out = np.empty((self.size * host.shape[0], *host.shape[1:]), host.dtype)
        byte = self.process.mpi.BYTE
        self.comm.Allgather([_bytes(host), byte], [_bytes(out), byte])
        return _like(x, out)

    def barrier(self, call: Call) -> None:
        """Wait until every rank is here (the fingerprint exchange is that wait)."""
        self.agree(call)

    # ------------------------------------------------------------------------------------------ point to point
    def send(self, x, dst: int, tag: int, call: Call) -> None:
        """x's raw bytes to rank dst with tag (the receiver knows the shape and dtype)."""
        if not 0 <= dst < self.size:
            raise CollectiveError(f"{call.op}: destination rank {dst} is not in the common world (size {self.size})")
        self.check_tag(tag, call, any_ok=False)
        host = np.array(_host(x), order="C", copy=True)
        if host.dtype == object:
            raise CollectiveError(f"{call.op}: blob {call.blob!r} holds strings; only raw buffers can be sent")
        if dst == self.rank:   # to itself: MPI_Send would wait for a receive this process cannot post yet
            self.mailbox.append((tag, _bytes(host)))
        else:
            self.comm.Send([_bytes(host), self.process.mpi.BYTE], dest=dst, tag=tag)

    def receive(self, like, src: int, tag: int, call: Call):
        """(array shaped and typed like `like`, source rank, tag) of the next message from src with tag
        (ANY: any); a message of another size than `like`'s bytes is a CollectiveError."""
        if src != ANY and not 0 <= src < self.size:
            raise CollectiveError(f"{call.op}: source rank {src} is not in the common world (size {self.size}); give "
                                  f"a rank from 0 to {self.size - 1}, or -1 for any sender")
        self.check_tag(tag, call, any_ok=True)
        template = np.array(_host(like), order="C", copy=True)
        if template.dtype == object:
            raise CollectiveError(f"{call.op}: blob {call.blob!r} holds strings; only raw buffers can be received")
        if src in (ANY, self.rank):
            mine = self._receive_own(like, template, tag, call)
            if mine is not None:
                return mine
            if self.comm is None or src == self.rank:
                sender = "any rank" if src < 0 else f"rank {src}"
                raise CollectiveError(f"{call.op}: nothing was sent to this process from {sender} with "
                                      f"{'any tag' if tag < 0 else f'tag {tag}'}, and only this process could send "
                                      "it, so the receive would wait forever")
        mpi = self.process.mpi
        status = mpi.Status()
        self.comm.Probe(source=mpi.ANY_SOURCE if src < 0 else src, tag=mpi.ANY_TAG if tag < 0 else tag,
                        status=status)
        source, got_tag = status.Get_source(), status.Get_tag()
        self._check_size(status.Get_count(mpi.BYTE), template, source, got_tag, call)
        self.comm.Recv([_bytes(template), mpi.BYTE], source=source, tag=got_tag)
        return _like(like, template), source, got_tag

    def _receive_own(self, like, template, tag: int, call: Call):
        """The first message this process sent itself with tag (ANY: any), or None."""
        for k, (sent_tag, data) in enumerate(self.mailbox):
            if tag in (ANY, sent_tag):
                self._check_size(data.size, template, self.rank, sent_tag, call)
                del self.mailbox[k]
                _bytes(template)[...] = data
                return _like(like, template), self.rank, sent_tag
        return None

    @staticmethod
    def _check_size(nbytes: int, template: np.ndarray, source: int, tag: int, call: Call) -> None:
        if nbytes != template.nbytes:
            raise CollectiveError(f"{call.op}: rank {source} sent {nbytes} bytes (tag {tag}) but blob {call.blob!r} "
                                  f"receives {tuple(template.shape)} {template.dtype} = {template.nbytes} bytes; "
                                  "give the receiving blob the sent tensor's shape and type")

    def finish(self) -> None:
        """The end of a run: a rank still in a collective learns that another one finished (no silent hang)."""
        self.agree(Call("finish", ""))
