"""The char-rnn job end to end (issue #28): `stepnet run models/char_rnn.pbtxt` against the same job written
as a PyTorch script, CPU time of each whole process (interpreter start, imports, data, 2,000 training
iterations, the held-out pass, the checkpoint), alternating the two for --rounds rounds.

The PyTorch script does what the plan does (models/build_char_rnn.py): the same batches of the same text
(B=32 streams, T=25, truncated BPTT: each batch's last states start the next), one-hot input into nn.LSTM
(H=256), a Linear to the vocabulary, softmax cross entropy, Adam (lr 2e-3, Caffe2's defaults) with the
learning rate scaled by clip / max(global gradient norm, clip) as Caffe2's clip_gradient_norm does, the
mean loss printed every 250 iterations, the mean held-out loss at the end, the weights saved. Both use one
BLAS / intra-op thread.

--fused-cells off runs stepnet's job as `pip install .` has it, without the fast extra's numba kernels
(`stepnet run --fused-cells off`).

    python benchmarks/char_rnn_e2e.py [--rounds 3] [--iterations 2000] [--fused-cells auto|on|off] [--write]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = "## char-rnn end to end (issue #28)"


def torch_job(iterations: int, threads: int) -> None:
    """The char-rnn plan as a PyTorch script (run in a child process)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    sys.path.insert(0, str(ROOT / "models"))
    from build_char_rnn import batches, vocabulary

    torch.set_num_threads(threads)
    B, T, H, lr, clip, report = 32, 25, 256, 2e-3, 5.0, 250
    text = (ROOT / "models/data/tinyshakespeare.txt").read_text()
    vocab = vocabulary(text)
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.array([index[c] for c in text], np.int64)
    cut = int(len(ids) * 0.9)
    train = [torch.from_numpy(b) for b in batches(ids[:cut], B, T)]
    heldout = [torch.from_numpy(b) for b in batches(ids[cut:], B, T)]
    V = len(vocab)
    lstm, head = nn.LSTM(V, H), nn.Linear(H, V)
    params = [*lstm.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=lr)
    eye = torch.eye(V)

    def loss_of(batch, state):
        out, state = lstm(eye[batch[:-1]], state)
        return F.cross_entropy(head(out).reshape(-1, V), batch[1:].reshape(-1)), state

    state = (torch.zeros(1, B, H), torch.zeros(1, B, H))
    total = 0.0
    for it in range(iterations):
        loss, state = loss_of(train[it % len(train)], state)
        state = (state[0].detach(), state[1].detach())
        opt.zero_grad()
        loss.backward()
        norm = torch.sqrt(sum((p.grad * p.grad).sum() for p in params)).item()
        opt.param_groups[0]["lr"] = lr * clip / max(norm, clip)
        opt.step()
        total += loss.item()
        if (it + 1) % report == 0 or it + 1 == iterations:
            print(f"train_loss {total / ((it % report) + 1):.5f}", flush=True)
            total = 0.0
    with torch.no_grad():
        state = (torch.zeros(1, B, H), torch.zeros(1, B, H))
        losses = []
        for batch in heldout:
            loss, state = loss_of(batch, state)
            losses.append(loss.item())
    print(f"heldout_loss {sum(losses) / len(losses):.5f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"lstm": lstm.state_dict(), "head": head.state_dict()}, Path(tmp) / "checkpoint.pt")


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, the held-out loss line of stdout) of one child process, run in a directory
    of its own holding a copy of the plan's databases (its checkpoint is written there)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "models").mkdir()
        shutil.copytree(ROOT / "models/data", Path(tmp) / "models/data")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=tmp, check=True, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}).stdout
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, next((line for line in reversed(out.splitlines()) if "heldout" in line), "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fused-cells", choices=("auto", "on", "off"), default="auto",
                   help="stepnet run's --fused-cells (off: what the default install runs, without numba)")
    p.add_argument("--write", action="store_true")
    p.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_child:
        torch_job(args.iterations, args.threads)
        return
    stepnet = [sys.executable, "-m", "stepnet", "run", str(ROOT / "models/char_rnn.pbtxt"), "-q",
               "--threads", str(args.threads), "--iterations", str(args.iterations),
               "--fused-cells", args.fused_cells]
    torch = [sys.executable, __file__, "--torch-child", "--iterations", str(args.iterations),
             "--threads", str(args.threads)]
    runs = {"stepnet": [], "torch": []}
    for r in range(args.rounds):
        for name in (("stepnet", "torch") if r % 2 == 0 else ("torch", "stepnet")):
            cpu, wall, last = timed(stepnet if name == "stepnet" else torch)
            runs[name].append((cpu, wall, last))
            print(f"round {r + 1} {name}: {cpu:.1f} s CPU, {wall:.1f} s wall ({last})", flush=True)
    ratios = [s[0] / t[0] for s, t in zip(runs["stepnet"], runs["torch"])]
    med = {k: statistics.median(c for c, _, _ in v) for k, v in runs.items()}
    header = HEADER if args.fused_cells == "auto" else f"{HEADER[:-1]}, --fused-cells {args.fused_cells})"
    lines = [header, "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: "
             f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
             f"{args.threads} thread(s) for both",
             f"- command: `python benchmarks/char_rnn_e2e.py {' '.join(sys.argv[1:])}`",
             f"- {args.iterations} training iterations and the held-out pass, each job a whole process; the two "
             f"alternate for {args.rounds} rounds; stepnet's fused (numba) kernels: {args.fused_cells}", "",
             "| job | CPU s (median) | CPU s per round | held-out loss (last round) |", "|---|---|---|---|"]
    for name, v in runs.items():
        lines.append(f"| {name} | {med[name]:.1f} | {', '.join(f'{c:.1f}' for c, _, _ in v)} | {v[-1][2]} |")
    lines += ["", f"stepnet ÷ torch, CPU time: median of the per-round ratios {statistics.median(ratios):.2f} "
              f"({', '.join(f'{x:.2f}' for x in ratios)})", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from results import write_section
        write_section(text, header + "\n")


if __name__ == "__main__":
    main()
