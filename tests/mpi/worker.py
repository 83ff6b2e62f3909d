"""What each rank of the multi-process tests runs (started by tests/mpi/test_jobs.py as `mpiexec -n K python
tests/mpi/worker.py CHECK`). Prints 'ok' and exits 0 when every check passed; any failure prints its traceback and
aborts the whole job, so no rank is left waiting.

    collectives  the collective ops against numpy references (tests/ops/collective_checks.py), then ranks that
                 disagree (shapes, ops, one finishing early): a CollectiveError naming the blob on every rank
    dp           data-parallel models: K ranks each on its share of every batch ≡ one process on the whole batch
                 (parameters to 1e-6 after several SGD / Adam steps, dense fused or not, and sparse), and the
                 parameters are the same on every rank
"""
import sys
import traceback
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS.parent), str(TESTS / "ops"), str(TESTS)]

from stepnet import Workspace  # noqa: E402
from stepnet.distributed.collectives import CommonWorld  # noqa: E402
from stepnet.core.errors import CollectiveError  # noqa: E402
from stepnet.testing import make_op  # noqa: E402
from stepnet.distributed.world import process_world  # noqa: E402

BATCH, STEPS = 6, 5


def expect_disagreement(ws, op_type, blob, value, *pieces, **args):
    """The op must fail on this rank with a CollectiveError whose message holds every piece."""
    ws.feed(blob, value)
    try:
        ws.run_operator_once(make_op(op_type, ["comm", blob], [blob], **args))
    except CollectiveError as e:
        missing = [p for p in pieces if p not in str(e)]
        assert not missing, f"{missing} not in: {e}"
        return
    raise AssertionError(f"{op_type} of {blob!r} ran although the ranks disagree")


def collectives(rank: int, size: int) -> None:
    from collective_checks import check_all, workspace

    check_all(rank, size)
    if size == 1:
        return
    ws = workspace()
    shapes = [f"rank {r} is at MPIAllreduce of blob 'q' ({2 + r},) float32" for r in range(size)]
    expect_disagreement(ws, "MPIAllreduce", "q", np.zeros(2 + rank, np.float32), *shapes)
    other = "MPIBroadcast of blob 'b'" if rank else "MPIAllreduce of blob 'a'"
    expect_disagreement(ws, "MPIBroadcast" if rank else "MPIAllreduce", "b" if rank else "a",
                        np.zeros(3, np.float32), "rank 0 is at MPIAllreduce of blob 'a'",
                        "rank 1 is at MPIBroadcast of blob 'b' (3,) float32 (root 0)", other)
    if rank == 0:   # rank 0 finishes while the others still reduce
        try:
            CommonWorld().finish()
            raise AssertionError("finish passed while the other ranks were in a collective")
        except CollectiveError as e:
            assert "rank 0 is at the end of its run; rank 1 is at MPIAllreduce of blob 'late'" in str(e), e
    else:
        expect_disagreement(ws, "MPIAllreduce", "late", np.zeros(1, np.float32), "rank 0 is at the end of its run")
    CommonWorld().finish()   # and then all of them agree again


def batches(size: int):
    rng = np.random.default_rng(11)
    for _ in range(STEPS):
        yield {"x": rng.normal(size=(BATCH, 5)).astype(np.float32),
               "label": rng.integers(0, 3, BATCH).astype(np.int32), "ids": rng.integers(0, 9, BATCH).astype(np.int32)}


def train(model, rank: int, size: int, share: bool) -> dict:
    ws = Workspace(seed=rank)   # different initial weights on every rank: the broadcast makes them rank 0's
    ws.run_net_once(model.init_net.proto())
    net = None
    for batch in batches(size):
        for name, value in batch.items():
            part = BATCH // size
            ws.feed(name, value[rank * part:(rank + 1) * part] if share else value)
        net = net or ws.create_net(model.net.proto())
        net.run()
    return {p: ws.fetch(p) for p in model.params}


def dp(rank: int, size: int) -> None:
    from test_data_parallel import embedding, mlp

    comm = process_world().comm
    cases = [(f"mlp {opt} fuse={fuse}", lambda f, o=opt, u=fuse: mlp(u if f else None, o))
             for opt in ("sgd", "adam") for fuse in (False, True)]
    cases.append(("embedding, sparse gradient", lambda f: embedding(False if f else None)))
    for what, build in cases:
        alone = train(build(False), 0, 1, share=False)    # one process, the whole batch, rank 0's weights
        parallel = train(build(True), rank, size, share=True)
        for p, value in parallel.items():
            diff = float(np.abs(value - alone[p]).max())
            assert diff <= 1e-6, f"{what}: {p} differs from one process on the whole batch by {diff}"
            others = comm.allgather(value)
            assert all(np.array_equal(o, value) for o in others), f"{what}: {p} differs between ranks"


def main(check: str) -> None:
    world = process_world()
    try:
        {"collectives": collectives, "dp": dp}[check](world.rank, world.size)
    except BaseException:  # noqa: BLE001 - one failing rank ends the job
        traceback.print_exc()
        sys.stderr.flush()
        if world.comm is not None:
            world.comm.Abort(1)
        raise SystemExit(1) from None
    print(f"ok {check} rank {world.rank} of {world.size}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
