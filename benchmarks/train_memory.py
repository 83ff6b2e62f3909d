"""Peak memory of an LSTM training step: stepnet vs torch nn.LSTM, each in its own process (issue #28).

Each child first trains a toy model of the same cell (code loaded and compiled: torch's libraries, numba's
kernels; --cold skips this), builds the char-rnn training step (one-hot input T×B×V, LSTM, output FC, Softmax,
cross entropy, SGD; as targets.py) with its weights and data, and reads its RSS (the base: interpreter, imports,
model, data); it resets the kernel's peak-RSS mark (writing 5 to /proc/self/clear_refs resets VmHWM), runs
--steps training steps and reports, in MiB above the base, the peak (VmHWM) and what stays resident after them
(what a framework keeps between steps: stepnet's step workspaces and state tensors, torch's freed autograd graph).

    python benchmarks/train_memory.py [--hidden 512] [--steps-T 100 400] [--batch 32] [--threads 1] [--cold]
        [--write]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = "## Training step peak memory (issue #28)"
WARM = ("each framework first trains a toy model of the same cell (T=2, B=2, H=8) for three steps, so that its "
        "code is loaded and compiled before the base (torch: its libraries; stepnet with the fast extra: numba and "
        "its compiled kernels, about 118 MiB);")
COLD = "no warm-up (--cold: loading numba and compiling its kernels fall in stepnet's peak);"


def status(field: str) -> float:
    """A field of /proc/self/status in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def child(args) -> dict:
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads, user_api="blas")
    sys.path.insert(0, str(HERE))
    from targets import FUSED_CELLS, stepnet_net, torch_train

    T, B, V, H = args.T, args.batch, 65, args.H

    def model(T, B, H):
        if args.framework == "stepnet":
            return stepnet_net(args.cell, H, T, B, V, train=True, fused=FUSED_CELLS[args.fused_cells])[1].run
        import torch
        torch.set_num_threads(args.threads)
        return torch_train(args.cell, H, T, B, V, loop=False)
    if args.warm:        # each framework's code loaded and compiled on a toy model first (numba's kernels, torch's)
        toy = model(2, 2, 8)
        for _ in range(3):
            toy()
        del toy
    step = model(T, B, H)
    Path("/proc/self/clear_refs").write_text("5")
    base = status("VmRSS")
    for _ in range(args.steps):
        step()
    return {"base": base, "peak": status("VmHWM") - base, "kept": status("VmRSS") - base}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[512])
    p.add_argument("--steps-T", type=int, nargs="+", default=[100, 400])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--cell", default="lstm", choices=("lstm", "gru"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    from targets import add_fused_cells
    add_fused_cells(p)
    p.add_argument("--cold", dest="warm", action="store_false",
                   help="no toy-model warm-up: the peak includes loading numba and compiling its kernels")
    p.add_argument("--write", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--framework", help=argparse.SUPPRESS)
    p.add_argument("--T", type=int, help=argparse.SUPPRESS)
    p.add_argument("--H", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    table = ["| H | T | stepnet peak, MiB | torch peak | stepnet ÷ torch | stepnet kept | torch kept | bases |",
             "|---|---|---|---|---|---|---|---|"]
    for H in args.hidden:
        for T in args.steps_T:
            got = {}
            for fw in ("stepnet", "torch"):
                cmd = [sys.executable, __file__, "--child", "--framework", fw, "--T", str(T), "--H", str(H),
                       "--batch", str(args.batch), "--cell", args.cell, "--threads", str(args.threads),
                       "--steps", str(args.steps), "--fused-cells", args.fused_cells,
                       *([] if args.warm else ["--cold"])]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                got[fw] = json.loads(out.strip().splitlines()[-1])
            s, t = got["stepnet"], got["torch"]
            line = (f"| {H} | {T} | {s['peak']:.0f} | {t['peak']:.0f} | {s['peak'] / t['peak']:.2f} | "
                    f"{s['kept']:.0f} | {t['kept']:.0f} | {s['base']:.0f}, {t['base']:.0f} |")
            print(line, flush=True)
            table.append(line)
    command = " ".join(["python", "benchmarks/train_memory.py", *sys.argv[1:]])
    text = "\n".join([
        HEADER, "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        f"- command: `{command}`",
        f"- {args.cell.upper()} char-rnn training step, B={args.batch}, V=65, SGD, {args.threads} thread(s), stepnet's "
        f"fused (numba) cells {args.fused_cells}; each "
        f"framework in its own process: {WARM if args.warm else COLD} model built and fed, the peak-RSS mark reset, "
        f"{args.steps} steps; 'peak' = VmHWM over those steps − VmRSS before them (MiB), 'kept' = VmRSS after them "
        "− the same base, 'bases' = that VmRSS (stepnet, torch)",
        "", *table, ""])
    print(text)
    if args.write:
        sys.path.insert(0, str(HERE))
        from results import write_section
        write_section(text, HEADER + "\n")


if __name__ == "__main__":
    main()
