"""Data-parallel char-rnn training step over K processes (mpiexec), and what the fused gradient buffer saves.

One training step of the char-rnn model of models/char_rnn_dp.pbtxt (global batch B=32 streams, T=25, V=65, Adam
with global-norm clipping) at each hidden size: K=1 is the plain model on the whole batch; K=2 is the
data-parallel model (ModelBuilder.data_parallel) with B/K streams per rank, gradients reduced unfused (one
MPIAllreduce per parameter) or fused (one buffer, one MPIAllreduce). Each configuration is a child job
(`mpiexec -n K`); every rank times its steps after a barrier and rank 0 reports the median (and minimum) step time
and, separately, the median time of the gradient collectives alone (the ops the rewrite inserted, run on their
own after the steps). BLAS threads: K=1 is run with 2 and with 1, each K=2 rank with 1 (this VM has 2 CPUs).
Because this VM's speed drifts over seconds, a further K=2 job holds both the unfused and the fused model and
alternates their steps (--paired pairs): the median per-pair ratio fused ÷ unfused is what decides the default of
ModelBuilder.data_parallel(fuse=...).

The paper estimate gives, for H=512, the bytes one allreduce of all gradients moves per rank with the ring
algorithm (2(K-1)/K of the gradient bytes, in 2(K-1) messages per tensor) and its time at 8 and 64 ranks for two
networks, fused (one tensor) and unfused (one per parameter).

    python benchmarks/data_parallel.py [--hidden 128 512] [--repeats 20] [--warmup 3] [--rounds 3]
        [--paired 40] [--wait-load 1.5] [--max-wait 300] [--write]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from results import write_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
HEADER = "## Data-parallel char-rnn step (mpiexec, K = 1, 2)"
B, T, V = 32, 25, 65
NETWORKS = {"100 Gb/s InfiniBand (α 5 µs, 12.5 GB/s)": (5e-6, 12.5e9),
            "10 Gb/s Ethernet, TCP (α 50 µs, 1.25 GB/s)": (50e-6, 1.25e9)}


def build(H: int, ranks: int, fuse: bool | None):
    """(ModelBuilder, indices of the collective ops in its net) for the char-rnn step at batch B/ranks;
    fuse None: the plain model."""
    from stepnet.builders.builder import BlobRef
    from stepnet.builders.model import ModelBuilder
    from stepnet.builders.rnn import lstm

    b = B // ranks
    m = ModelBuilder("char_rnn")
    h_all = lstm(m, BlobRef("input_blob"), BlobRef("seq_lengths"), (BlobRef("hidden_init"), BlobRef("cell_init")),
                 V, H, scope="LSTM")[0]
    probs = m.net.Softmax(m.fc(h_all, "logits", H, V, axis=2), BlobRef("softmax"), axis=2)
    flat, _ = m.net.Reshape(probs, [BlobRef("softmax_reshaped"), BlobRef("_shape")], shape=[-1, V])
    m.net.AveragedLoss(m.net.LabelCrossEntropy([flat, BlobRef("target")], BlobRef("xent")), BlobRef("loss"))
    m.add_gradient_ops(["loss"])
    before = len(m.net.proto().op)
    last = max(i for i, op in enumerate(m.net.proto().op) if op.is_gradient_op)
    if fuse is not None:
        m.data_parallel(fuse=fuse)
    comm = list(range(last + 1, last + 1 + len(m.net.proto().op) - before))
    m.adam(2e-3, clip_gradient_norm=5.0)
    return m, comm, b


def setup(H: int, ranks: int, fuse, rank: int):
    """(ModelBuilder, bound step net, bound net of the collectives alone or None) with data fed."""
    from stepnet import NetDef, Workspace

    m, comm_ops, b = build(H, ranks, fuse)
    ws = Workspace(seed=0)
    ws.run_net_once(m.init_net.proto())
    rng = np.random.default_rng(rank)
    ids = rng.integers(0, V, (T + 1, b))
    x = np.zeros((T, b, V), np.float32)
    x[np.arange(T)[:, None], np.arange(b)[None, :], ids[:-1]] = 1
    zeros = np.zeros((1, b, H), np.float32)
    for name, value in (("input_blob", x), ("target", ids[1:].reshape(-1).astype(np.int32)),
                        ("seq_lengths", np.full(b, T, np.int32)), ("hidden_init", zeros), ("cell_init", zeros)):
        ws.feed(name, value)
    net = ws.create_net(m.net.proto())
    only = None
    if comm_ops:
        collectives = NetDef(name="collectives")
        collectives.op.extend(m.net.proto().op[i] for i in comm_ops)
        only = ws.create_net(collectives)
    return m, net, only, sum(m.net.proto().op[i].type == "MPIAllreduce" for i in comm_ops)


def timed(runs, repeats: int, warmup: int, barrier) -> list[list[float]]:
    """Seconds of each run function, alternated, after a barrier each: one list per function."""
    times = [[] for _ in runs]
    for k in range(warmup + repeats):
        for run, out in zip(runs, times):
            barrier()
            t0 = time.perf_counter()
            run()
            if k >= warmup:
                out.append(time.perf_counter() - t0)
    return times


def child(H: int, ranks: int, fuse, repeats: int, warmup: int) -> None:
    """One rank of a configuration: time the steps, then the collectives alone, then the fingerprint exchange
    that precedes each collective; rank 0 prints JSON. fuse "paired": the unfused and the fused model in one
    process, their steps (and collectives) alternated, for the per-pair ratios."""
    from stepnet.distributed.collectives import Call, CommonWorld
    from stepnet.distributed.world import process_world

    world = process_world()
    barrier = world.comm.Barrier if world.comm is not None else (lambda: None)
    if fuse == "paired":
        models = [setup(H, ranks, f, world.rank) for f in (False, True)]
        steps = timed([mod[1].run for mod in models], repeats, warmup, barrier)
        comm = timed([mod[2].run for mod in models], repeats, warmup, barrier)
        if world.rank == 0:
            print(json.dumps({"step_ratio": [f / u for u, f in zip(*steps)],
                              "comm_ratio": [f / u for u, f in zip(*comm)]}))
        return
    m, net, only, calls = setup(H, ranks, fuse, world.rank)
    steps = timed([net.run], repeats, warmup, barrier)[0]
    comm = timed([only.run], repeats, warmup, barrier)[0] if only is not None else []
    agree = []
    if world.comm is not None:
        cw, call = CommonWorld(), Call("MPIAllreduce", "bench", (3, 4), "float32")
        agree = [t / 100 for t in timed([lambda: [cw.agree(call) for _ in range(100)]], repeats, warmup,
                                        lambda: None)[0]]
    grads = [m.param_to_grad[p] for p in m.params]
    if world.rank == 0:
        nbytes = sum(net.workspace.get_blob(str(g)).value.nbytes for g in grads)
        print(json.dumps({"steps": steps, "comm": comm, "agree": agree, "allreduces": calls,
                          "grad_bytes": nbytes, "tensors": len(grads)}))


def run_child(H: int, ranks: int, fuse, threads: int, a, repeats: int | None = None) -> dict:
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    cmd = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--child", json.dumps([H, ranks, fuse]),
           "--repeats", str(repeats or a.repeats), "--warmup", str(a.warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if out.returncode:
        sys.exit(f"child {H, ranks, fuse} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


CONFIGS = (("K=1, plain model, B=32, 2 BLAS threads", 1, None, 2),
           ("K=1, plain model, B=32, 1 BLAS thread", 1, None, 1),
           ("K=2, unfused (one MPIAllreduce per parameter)", 2, False, 1),
           ("K=2, fused (one buffer, one MPIAllreduce)", 2, True, 1))


def wait_for_quiet(limit: float | None, max_wait: float) -> float:
    """Wait (up to max_wait s) until the 1-minute load average is under limit; returns it."""
    start = time.monotonic()
    while limit is not None and os.getloadavg()[0] >= limit and time.monotonic() - start < max_wait:
        time.sleep(5)
    return os.getloadavg()[0]


def measure(a) -> dict:
    results = {}
    for _ in range(a.rounds):
        for H in a.hidden:
            for name, ranks, fuse, threads in CONFIGS:
                a.loads.append(wait_for_quiet(a.wait_load, a.max_wait))
                r = run_child(H, ranks, fuse, threads, a)
                slot = results.setdefault((H, name), {"steps": [], "comm": [], "agree": [], **r})
                for key in ("steps", "comm", "agree"):
                    slot[key] += r[key]
            if a.paired:
                a.loads.append(wait_for_quiet(a.wait_load, a.max_wait))
                r = run_child(H, 2, "paired", 1, a, repeats=a.paired)
                slot = a.pairs.setdefault(H, {"step_ratio": [], "comm_ratio": []})
                for key in slot:
                    slot[key] += r[key]
    return results


def ring(grad_bytes: int, tensors: int, K: int, alpha: float, beta: float) -> tuple[float, float, float]:
    """(bytes sent per rank, seconds fused, seconds unfused) of a ring allreduce of grad_bytes over K ranks."""
    sent = 2 * (K - 1) / K * grad_bytes
    fused = 2 * (K - 1) * alpha + sent / beta
    return sent, fused, fused + (tensors - 1) * 2 * (K - 1) * alpha


def report(a, results, load) -> list[str]:
    ms = lambda xs: f"{1e3 * statistics.median(xs):.1f} ({1e3 * min(xs):.1f})"  # noqa: E731
    lines = [HEADER, "", f"- date: {datetime.date.today()}",
             f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}, Python "
             f"{platform.python_version()}; MPI: mpi4py + {mpi_version()}",
             f"- load average before the run (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in load)}",
             f"- command: `python benchmarks/data_parallel.py {' '.join(sys.argv[1:])}`",
             f"- one step = forward, backward, gradient collectives (K=2), global-norm clipping and Adam; global batch "
             f"B={B} (B/K streams per rank), T={T}, V={V}; median (min) of {a.repeats} steps after {a.warmup} warm-up "
             f"steps × {a.rounds} round(s); 'collectives' = the ops the rewrite inserted (with their fingerprint "
             "exchanges), timed alone on the same gradients; 'fingerprint exchange' = the agreement check one "
             "collective makes before moving data (one 16-int64 MPI_Allgather)",
             f"- 1-minute load average before each child: {', '.join(f'{x:.2f}' for x in a.loads)}", "",
             "| H | configuration | step ms | collectives ms | allreduce calls | fingerprint exchange µs | gradients |",
             "|---|---|---|---|---|---|---|"]
    for (H, name), r in results.items():
        comm = ms(r["comm"]) if r["comm"] else "—"
        agree = f"{1e6 * statistics.median(r['agree']):.1f}" if r["agree"] else "—"
        lines.append(f"| {H} | {name} | {ms(r['steps'])} | {comm} | {r['allreduces']} | {agree} | {r['tensors']} "
                     f"tensors, {r['grad_bytes'] / 1e6:.2f} MB |")
    if a.pairs:
        lines += ["", f"Paired, K=2: the unfused and the fused model in the same two processes, their steps alternated "
                  f"({a.paired} pairs × {a.rounds} round(s)); median (quartiles) of the per-pair ratio fused ÷ unfused "
                  "(under 1: fusing is faster):", "", "| H | whole step | collectives alone |", "|---|---|---|"]
        for H, r in a.pairs.items():
            cells = [f"{statistics.median(v):.3f} ({np.percentile(v, 25):.3f}–{np.percentile(v, 75):.3f})"
                     for v in (r["step_ratio"], r["comm_ratio"])]
            lines.append(f"| {H} | {cells[0]} | {cells[1]} |")
        from stepnet.passes.data_parallel import FUSE_DEFAULT
        lines += ["", f"ModelBuilder.data_parallel's default when this ran: fuse={FUSE_DEFAULT} "
                  "(stepnet.passes.data_parallel.FUSE_DEFAULT: on a network one allreduce a step saves a latency per "
                  "gradient, the estimate below; on one machine the paired ratios above)."]
    big = next((r for (H, _), r in results.items() if H == 512), None)
    if big:
        lines += ["", f"Paper estimate for H=512 ({big['tensors']} gradient tensors, {big['grad_bytes'] / 1e6:.2f} MB "
                  "per step): ring allreduce, each rank sends 2(K−1)/K of the bytes in 2(K−1) steps of latency α "
                  "per tensor; time = 2(K−1)·α·tensors + bytes sent / bandwidth.", "",
                  "| network | K | MB sent per rank per step | fused ms | unfused ms |", "|---|---|---|---|---|"]
        for net, (alpha, beta) in NETWORKS.items():
            for K in (8, 64):
                sent, fused, unfused = ring(big["grad_bytes"], big["tensors"], K, alpha, beta)
                lines.append(f"| {net} | {K} | {sent / 1e6:.2f} | {1e3 * fused:.2f} | {1e3 * unfused:.2f} |")
    return lines


def mpi_version() -> str:
    from mpi4py import MPI
    return " ".join(MPI.Get_library_version().splitlines()[0].split())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--paired", type=int, default=40, help="pairs of alternated unfused / fused steps (0: none)")
    p.add_argument("--wait-load", type=float, help="before each child, wait until the 1-minute load is under this")
    p.add_argument("--max-wait", type=float, default=300, help="the longest wait for --wait-load, in seconds")
    p.add_argument("--write", action="store_true", help="replace this section of benchmarks/RESULTS.md")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(*json.loads(a.child), a.repeats, a.warmup)
        return
    load, a.loads, a.pairs = os.getloadavg(), [], {}
    lines = report(a, measure(a), load)
    print("\n".join(lines))
    if a.write:
        write_section("\n".join(lines) + "\n", HEADER)


if __name__ == "__main__":
    main()
