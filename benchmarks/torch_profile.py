"""Where the peer's training step goes: torch.profiler on targets.py's torch training step (nn.LSTM / GRU / RNN,
the output Linear, cross_entropy, SGD), the ops by their own CPU time, beside step_profile.py's table of
stepnet's step. Prints a markdown table; --write puts it into RESULTS.md.

    python benchmarks/torch_profile.py [--cell lstm] [--hidden 512] [--batch 32] [--threads 1] [--steps 20]
        [--top 12] [--write]
"""
from __future__ import annotations

import argparse
import time

from results import publish
from targets import torch_train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", default="lstm", choices=("lstm", "gru", "rnn"))
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(args.threads)
    T, V = 25, 65
    step = torch_train(args.cell, args.hidden, T, args.batch, V, loop=False)
    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    plain = 1000 * (time.perf_counter() - start) / args.steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    table = ["| op | calls/step | self ms/step | share |", "|---|---|---|---|"]
    for e in events[:args.top]:
        table.append(f"| {e.key} | {e.count / args.steps:g} | {e.self_cpu_time_total / 1000 / args.steps:.2f} | "
                     f"{100 * e.self_cpu_time_total / total:.0f} % |")
    header = (f"## Where torch's training step goes (nn.{args.cell.upper()}, H={args.hidden}, B={args.batch}, "
              f"torch.profiler)")
    facts = [f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), oneDNN (mkldnn) "
             f"{'enabled' if torch.backends.mkldnn.is_available() else 'not available'}; T={T}, V={V}, SGD",
             f"{plain:.2f} ms per step unprofiled (mean of {args.steps} after 3), "
             f"{total / 1000 / args.steps:.2f} ms of ops' own CPU time per step profiled; the top {args.top} ops "
             "by their own time"]
    publish(header, facts, table, args.write)


if __name__ == "__main__":
    main()
