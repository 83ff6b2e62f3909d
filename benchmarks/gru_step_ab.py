"""The compiled GRU step (stepnet/compiled/gru_step.py: gru_cell's eleven step ops as one entry) against the
same nets compiled one entry per op (the FC + Sum pairs), paired in one process: targets.py's char-rnn GRU
models (T=25, V=65), forward-only and training, both with the fused (numba) kernels. Each round runs each net
`--reps` times, the order swapped every round; the ratio is the median of the per-round ratios.

    python benchmarks/gru_step_ab.py [--hidden 128 512] [--batch 32] [--rounds 40] [--threads 1] [--write]
"""
from __future__ import annotations

import argparse
import statistics
import time

from results import publish
from targets import stepnet_net

HEADER = "## Compiled GRU step: one entry against one per op (issue #28)"


def pair(H: int, B: int, train: bool, rounds: int, reps: int) -> tuple:
    """(median ratio one entry ÷ per op, its quartiles, ms per run of each)."""
    import stepnet.compiled.entries as entries

    layout = entries.gru_step.layout
    entries.gru_step.layout = lambda ops, i: None        # this net's program: one entry per op
    try:
        _, per_op, _ = stepnet_net("gru", H, 25, B, 65, train=train, fused=True)
        for _ in range(3):
            per_op.run()
    finally:
        entries.gru_step.layout = layout
    _, grouped, _ = stepnet_net("gru", H, 25, B, 65, train=train, fused=True)
    for _ in range(3):
        grouped.run()
    times = {id(per_op): [], id(grouped): []}
    for r in range(rounds):
        for net in (per_op, grouped) if r % 2 == 0 else (grouped, per_op):
            start = time.perf_counter()
            for _ in range(reps):
                net.run()
            times[id(net)].append(1000 * (time.perf_counter() - start) / reps)
    a, b = times[id(grouped)], times[id(per_op)]
    ratios = [x / y for x, y in zip(a, b)]
    q = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), (q[0], q[2]), statistics.median(a), statistics.median(b)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    import numpy  # noqa: F401 - loaded first, so that threadpoolctl finds its BLAS
    from threadpoolctl import threadpool_limits
    threadpool_limits(args.threads, user_api="blas")

    table = ["| net | H | one entry ms | one per op ms | one entry ÷ one per op (quartiles) |", "|---|---|---|---|---|"]
    for train in (False, True):
        for H in args.hidden:
            reps = max(1, round(10 * (128 / H) ** 2 / (3 if train else 1)))
            ratio, (q1, q3), a, b = pair(H, args.batch, train, args.rounds, reps)
            line = (f"| {'training step' if train else 'predict net'} | {H} | {a:.2f} | {b:.2f} | "
                    f"{ratio:.2f} ({q1:.2f}–{q3:.2f}) |")
            print(line, flush=True)
            table.append(line)
    publish(HEADER, [
        f"{args.threads} BLAS thread(s); B={args.batch}, T=25, V=65, fused (numba) kernels on both sides",
        f"{args.rounds} rounds, the two nets alternating in one process, the order swapped every round; the ratio "
        "is the median of the per-round ratios"], table, args.write)


if __name__ == "__main__":
    main()
