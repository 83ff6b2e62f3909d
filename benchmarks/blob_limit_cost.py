"""What `--max-blob-bytes` costs while nets run (issue #24 §2): the char-rnn training step with the blob-limit
checks on (as shipped) and off, in one process.

The checks are bound once per op (runtime.executor._size_check: before the kernels of ops whose output size
comes from arguments or values) plus one comparison of each stored array's bytes with the limit. "Off" binds
the same step with _size_check returning None and the limit at 2**62, so only that one comparison stays (it is
inline in the run loop, ~30 ns an op; the difference measured is what the checks cost over it). Both nets are
built from the same ModelBuilder model (benchmarks/char_rnn.py), seeded alike; each round runs one step of
each in turn (the order swapped every round) and the figure is the median of the per-round ratios on / off,
with its quartiles. BLAS threads are set to --threads.

    python benchmarks/blob_limit_cost.py [--hidden 128 512] [--rounds 200] [--warmup 5] [--threads 1] [--write]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from char_rnn import GAMMA, limit_blas, stepnet_model  # noqa: E402
from results import write_section  # noqa: E402

HEADER = "## Cost of the blob-limit checks while nets run (char-rnn training step)"


@contextlib.contextmanager
def binding(on: bool, counts: list):
    """Bind nets with the size checks before kernels (on) or none (off: what stepnet did before #24 §2);
    counts gets one bool per op bound: whether it has a check."""
    from stepnet.runtime import executor

    saved = executor._size_check

    def size_check(*a, **k):
        check = saved(*a, **k) if on else None
        counts.append(check is not None)
        return check
    executor._size_check = size_check
    try:
        yield
    finally:
        executor._size_check = saved


def step(cfg, H: int, on: bool):
    """(workspace, net, checks bound, ops bound) of the char-rnn step, bound with or without checks (step nets
    included: the first run binds them)."""
    counts: list = []
    with binding(on, counts):
        ws, net, _ = stepnet_model(cfg, H)
        if not on:
            ws.limits = dataclasses.replace(ws.limits, max_blob_bytes=2 ** 62)   # step workspaces inherit it
        net.run()
    return ws, net, sum(counts), len(counts)


def measure(cfg, H: int) -> dict:
    (ws_on, on, checked, ops), (ws_off, off, none, _) = step(cfg, H, True), step(cfg, H, False)
    assert none == 0, none
    for _ in range(cfg.warmup):
        on.run()
        off.run()
    ratios, ms = [], {"on": [], "off": []}
    order = [("on", on), ("off", off)]
    for _ in range(cfg.rounds):
        order.reverse()
        t = {}
        for name, net in order:
            start = time.perf_counter()
            net.run()
            t[name] = 1000 * (time.perf_counter() - start)
            ms[name].append(t[name])
        ratios.append(t["on"] / t["off"])
    same = np.array_equal(ws_on.fetch("loss"), ws_off.fetch("loss"))
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    return {"H": H, "ratio": med, "q1": q1, "q3": q3, "on": statistics.median(ms["on"]),
            "off": statistics.median(ms["off"]), "same": same, "checked": checked, "ops": ops}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--write", action="store_true")
    a = p.parse_args()
    cfg = argparse.Namespace(steps=25, batch=32, vocab=65, optimizer="sgd", lr=0.1 * 25, fused_cells=None,
                             warmup=a.warmup, rounds=a.rounds)
    blas = limit_blas(a.threads)
    rows = [measure(cfg, H) for H in a.hidden]
    lines = [HEADER, "",
             f"- date: {datetime.date.today()}; machine: {platform.machine()}, {platform.platform()}, "
             f"Python {platform.python_version()}; numpy BLAS {blas}",
             f"- command: `python benchmarks/blob_limit_cost.py {' '.join(sys.argv[1:])}`",
             f"- B=32, T=25, V=65, sgd (γ={GAMMA}); {a.rounds} rounds after {a.warmup} warm-up steps, one step "
             "of each net per round in alternating order; ratio = median of per-round (on ÷ off), quartiles in "
             "brackets; 'same loss' = both nets' losses equal bit for bit after the run", "",
             "| H | ops bound, init net included (with a size check) | checks on: median ms | checks off: median ms "
             "| on ÷ off (quartiles) | same loss |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['H']} | {r['ops']} ({r['checked']}) | {r['on']:.2f} | {r['off']:.2f} "
                     f"| {r['ratio']:.3f} ({r['q1']:.3f}–{r['q3']:.3f}) | {'yes' if r['same'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.write:
        write_section(text, HEADER + "\n")


if __name__ == "__main__":
    main()
