"""Char-rnn training step: stepnet vs a hand-written numpy LSTM vs PyTorch CPU; stepnet's LSTM memory vs T.

One training step of Caffe2's char_rnn example: one-hot input T×B×V, LSTM (i2h FC over all steps, then a
RecurrentNetwork of FC + Sum + LSTMUnit per step), output FC (axis 2), Softmax (axis 2), Reshape to (T·B)×V,
LabelCrossEntropy, AveragedLoss, the full backward pass and an update: char_rnn's SGD (lr 0.1·T, step policy,
γ = 0.9999) or Adam. Frameworks, each timed in its own child process:
  stepnet      that net built with ModelBuilder + stepnet.builders.rnn.lstm + add_gradient_ops + the optimizer,
               created once in a Workspace and run with net.run();
  numpy        benchmarks/numpy_lstm.py, forward, BPTT and update written by hand;
  pytorch      nn.LSTM + nn.Linear + cross_entropy + torch.optim (optional: pip install torch==2.13.0);
  pytorch-cell the same with an nn.LSTMCell Python loop over the T steps.
All start from stepnet's initial weights and the same data; each non-stepnet child also runs one stepnet step
and prints how far its first-step loss and gradients are from stepnet's. Times are the median (and minimum)
of --repeats steps after --warmup steps, pooled over --rounds. A further child alternates stepnet and numpy
steps in one process (--paired-steps pairs) and reports the median of the per-pair ratios: this VM's speed
drifts by tens of percent over seconds, which moves two processes' medians apart but both halves of a pair
alike. BLAS threads (numpy, via threadpoolctl) and
torch threads are both set to --threads; OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are recorded. `--memory`
measures the forward-only LSTM with tracemalloc at each T of --memory-steps; `--profile` breaks stepnet's step
down by op (and prints cProfile's top functions). --write replaces this configuration's section of
RESULTS.md (one per B, T, V, optimizer and thread count).

    python benchmarks/char_rnn.py [--repeats 20] [--warmup 3] [--hidden 128 512] [--optimizer sgd|adam]
        [--threads 2] [--rounds 1] [--paired-steps 60] [--wait-load 0.9] [--memory] [--profile] [--write]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from results import write_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
HEADER = "## Char-rnn training step"
ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
GAMMA = 0.9999
TARGETS = {512: 1.3, 128: 2.0}     # stepnet ÷ numpy the lead asked for, by hidden size
FRAMEWORKS = ("stepnet", "numpy", "pytorch", "pytorch-cell")


def make_data(T: int, B: int, V: int, seed: int = 0):
    """One-hot inputs T×B×V (float32) and the next character of each as int32 targets (T·B)."""
    ids = np.random.default_rng(seed).integers(0, V, (T + 1, B))
    x = np.zeros((T, B, V), np.float32)
    x[np.arange(T)[:, None], np.arange(B)[None, :], ids[:-1]] = 1
    return x, ids[1:].reshape(-1).astype(np.int32)


# --------------------------------------------------------------------------------------------- frameworks
def stepnet_model(cfg, H: int, T: int | None = None, lstm_only: bool = False, forward_only: bool = False):
    """(workspace, bound net, ModelBuilder) of the char-rnn step (or of the LSTM alone), init net run, fed."""
    from stepnet.builders.builder import BlobRef
    from stepnet.builders.model import ModelBuilder
    from stepnet.builders.rnn import lstm

    T, B, V = T or cfg.steps, cfg.batch, cfg.vocab
    m = ModelBuilder("char_rnn")
    states = (BlobRef("hidden_init"), BlobRef("cell_init"))
    h_all = lstm(m, BlobRef("input_blob"), BlobRef("seq_lengths"), states, V, H, scope="LSTM",
                 forward_only=forward_only)[0]
    if not lstm_only:
        add_head(m, h_all, H, V, train=True)
        if cfg.optimizer == "sgd":
            m.sgd(cfg.lr, policy="step", stepsize=1, gamma=GAMMA)
        else:
            m.adam(cfg.lr)
    ws = fed_workspace(m, T, B, V, H, getattr(cfg, "fused_cells", None))
    return ws, ws.create_net(m.net.proto()), m


def add_head(m, h_all, H: int, V: int, train: bool) -> None:
    """The output FC and Softmax (blob `softmax`) over the RNN's hidden states; with train, the averaged cross
    entropy against `target` and the gradient ops."""
    from stepnet.builders.builder import BlobRef

    probs = m.net.Softmax(m.fc(h_all, "output", H, V, axis=2), BlobRef("softmax"), axis=2)
    if train:
        flat, _ = m.net.Reshape(probs, [BlobRef("softmax_reshaped"), BlobRef("_")], shape=[-1, V])
        loss = m.net.AveragedLoss(m.net.LabelCrossEntropy([flat, BlobRef("target")], BlobRef("xent")),
                                  BlobRef("loss"))
        m.add_gradient_ops([loss])


def fed_workspace(m, T: int, B: int, V: int, H: int, fused_cells: bool | None = None):
    """A workspace with m's init net run (seed 0: the same initial weights in every process) and the char-rnn
    inputs fed: one-hot data, targets, full sequence lengths, zero initial states."""
    from stepnet.runtime.workspace import Workspace

    ws = Workspace(seed=0, fused_cells=fused_cells)
    ws.run_net_once(m.init_net.proto())
    x, target = make_data(T, B, V)
    zeros = np.zeros((1, B, H), np.float32)
    for name, value in (("input_blob", x), ("target", target), ("seq_lengths", np.full(B, T, np.int32)),
                        ("hidden_init", zeros), ("cell_init", zeros)):
        ws.feed(name, value)
    return ws


def roles(m) -> dict:
    """numpy_lstm's parameter roles -> stepnet blob names."""
    from numpy_lstm import ROLES

    found = {r: [p for p in m.params if str(p).endswith(r)] for r in ROLES}
    bad = {r: ps for r, ps in found.items() if len(ps) != 1}
    if bad:
        sys.exit(f"cannot map the model's parameters {m.params} to the roles {ROLES}: {bad}")
    return {r: str(ps[0]) for r, ps in found.items()}


def stepnet_timer(cfg, H: int):
    """(run, result, initial weights by role): result() -> (loss, gradients by role) of the last run."""
    ws, net, m = stepnet_model(cfg, H)
    names = roles(m)
    init = {r: ws.fetch(n) for r, n in names.items()}

    def result():
        return (float(ws.fetch("loss").reshape(-1)[0]),
                {r: ws.fetch(m.param_to_grad[n]) for r, n in names.items()})
    return net.run, result, init


def numpy_timer(cfg, H: int, init: dict):
    from numpy_lstm import CharRNN

    x, target = make_data(cfg.steps, cfg.batch, cfg.vocab)
    zeros = np.zeros((1, cfg.batch, H), np.float32)
    model = CharRNN(init, cfg.steps, cfg.batch, optimizer=cfg.optimizer, base_lr=cfg.lr, gamma=GAMMA)
    last = {}

    def run():
        last["loss"] = model.step(x, target, zeros, zeros)
    return run, lambda: (last["loss"], model.grads)


def _swap_gates(w, H: int):
    """Caffe2's gate blocks (i, f, o, g) <-> PyTorch's (i, f, g, o): the same swap both ways."""
    return np.concatenate([w[:2 * H], w[3 * H:], w[2 * H:3 * H]])


def torch_timer(cfg, H: int, init: dict, cell: bool):
    """nn.LSTM (or an nn.LSTMCell loop) + nn.Linear + cross_entropy + torch.optim, on stepnet's weights."""
    import torch
    from torch import nn

    torch.set_num_threads(cfg.threads)
    T, B, V = cfg.steps, cfg.batch, cfg.vocab
    rnn, sfx = (nn.LSTMCell(V, H), "") if cell else (nn.LSTM(V, H), "_l0")
    lin = nn.Linear(H, V)
    tensors = {"i2h_w": (rnn, "weight_ih" + sfx), "i2h_b": (rnn, "bias_ih" + sfx),
               "gates_t_w": (rnn, "weight_hh" + sfx), "gates_t_b": (rnn, "bias_hh" + sfx),
               "output_w": (lin, "weight"), "output_b": (lin, "bias")}
    with torch.no_grad():
        for r, (mod, name) in tensors.items():
            value = init[r] if mod is lin else _swap_gates(init[r], H)
            getattr(mod, name).copy_(torch.from_numpy(np.ascontiguousarray(value)))
    params = list(rnn.parameters()) + list(lin.parameters())
    opt = (torch.optim.SGD if cfg.optimizer == "sgd" else torch.optim.Adam)(params, lr=cfg.lr)
    x_np, target = make_data(T, B, V)
    x, tgt = torch.from_numpy(x_np), torch.from_numpy(target.astype(np.int64))
    h0 = torch.zeros(B, H) if cell else torch.zeros(1, B, H)
    state = {"it": 0}

    def forward():
        if cell:
            h, c, hs = h0, h0, []
            for t in range(T):
                h, c = rnn(x[t], (h, c))
                hs.append(h)
            out = torch.stack(hs)
        else:
            out, _ = rnn(x, (h0, h0))
        return nn.functional.cross_entropy(lin(out).reshape(-1, V), tgt)

    def run():
        state["it"] += 1
        if cfg.optimizer == "sgd":
            opt.param_groups[0]["lr"] = cfg.lr * GAMMA ** state["it"]
        opt.zero_grad(set_to_none=True)
        loss = forward()
        loss.backward()
        opt.step()
        state["loss"] = loss

    def result():
        grads = {}
        for r, (mod, name) in tensors.items():
            g = getattr(mod, name).grad.numpy()
            grads[r] = g if mod is lin else _swap_gates(g, H)
        return float(state["loss"]), grads
    return run, result


def sample_ms(fn, repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t))
    return times


def limit_blas(threads: int) -> str:
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    threadpool_limits(threads, user_api="blas")
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '')}, "
                     f"{i.get('num_threads')} threads" for i in blas)


def measure(framework: str, cfg) -> dict:
    """Step times (ms) per hidden size for one framework in this process, and its first step's distance from
    stepnet's (|Δloss|, max over parameters of max|Δgrad| / max|grad|)."""
    out = {"times": {}, "check": {}, "info": {"numpy BLAS": limit_blas(cfg.threads)}}
    for H in cfg.hidden:
        run, result, init = stepnet_timer(cfg, H)
        if framework != "stepnet":
            run()
            ref_loss, ref_grads = result()
            if framework == "numpy":
                run, result = numpy_timer(cfg, H, init)
            else:
                run, result = torch_timer(cfg, H, init, cell=framework == "pytorch-cell")
            run()
            loss, grads = result()
            rel = max(float(np.abs(grads[r] - g).max() / max(np.abs(g).max(), 1e-30))
                      for r, g in ref_grads.items())
            out["check"][H] = (abs(loss - ref_loss), rel)
        out["times"][H] = sample_ms(run, cfg.repeats, cfg.warmup)
        if not np.isfinite(result()[0]):
            out["info"]["warning"] = f"non-finite loss after the timed steps at H={H}"
    if framework == "stepnet":
        out["info"]["numpy"] = np.__version__
    elif framework.startswith("pytorch"):
        import torch
        out["info"].update({"torch": torch.__version__, "torch threads": torch.get_num_threads()})
    return out


def paired(cfg) -> dict:
    """stepnet and numpy steps alternating in one process (the order swapped every pair): per hidden size, the
    (stepnet ms, numpy ms) pairs. Machine drift hits both sides of a pair alike, so their ratio is steadier
    than the ratio of two processes' medians."""
    limit_blas(cfg.threads)
    out = {}
    for H in cfg.hidden:
        run_s, _, init = stepnet_timer(cfg, H)
        run_n, _ = numpy_timer(cfg, H, init)
        for _ in range(cfg.warmup):
            run_s()
            run_n()
        pairs, order = [], [("stepnet", run_s), ("numpy", run_n)]
        for _ in range(cfg.paired_steps):
            ms = {}
            order.reverse()
            for name, fn in order:
                t = time.perf_counter()
                fn()
                ms[name] = 1000 * (time.perf_counter() - t)
            pairs.append((ms["stepnet"], ms["numpy"]))
        out[H] = pairs
    return out


# ------------------------------------------------------------------------------------ memory, profile
class OpHook:
    """Routes every bound op's call of the nets it is attached to through `around(key, call, args)`."""

    def __init__(self, around):
        self.around = around

    def attach(self, net, where: str) -> None:
        for bop in net.ops:
            bop.call = self._wrapped(bop.call, (where, bop.opdef.type))

    def _wrapped(self, call, key):
        return lambda *args: self.around(key, call, args)


def step_nets(ws):
    """(name, Net) of every step net created inside the RecurrentNetwork ops of ws."""
    from stepnet.ops.recurrent import StepWorkspaces

    for blob in ws.blobs():
        value = ws.find(blob).value
        if isinstance(value, StepWorkspaces):
            for step in value.steps:
                for name in step.nets():
                    yield name, step.net(name)


class PeakMemory:
    """tracemalloc per op: (peak above the traced memory at the op's start, what is left after it)."""

    def __init__(self):
        self.peaks = {}

    def __call__(self, key, call, args):
        import tracemalloc

        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = call(*args)
        now, peak = tracemalloc.get_traced_memory()
        self.peaks[key[1]] = (peak - start, now - start)
        return result


def memory_row(cfg, H: int, T: int, forward_only: bool) -> dict:
    """The LSTM alone (i2h FC + RecurrentNetwork) run once in a fresh workspace, under tracemalloc."""
    import gc

    from stepnet.ops.recurrent import StepWorkspaces

    ws, net, _ = stepnet_model(cfg, H, T=T, lstm_only=True, forward_only=forward_only)
    hook = PeakMemory()
    OpHook(hook).attach(net, "main")
    gc.collect()           # no garbage of an earlier model may be freed inside the measured ops
    gc.disable()
    try:
        net.run()
    finally:
        gc.enable()
    values = [ws.find(b).value for b in ws.blobs()]
    steps = next(v for v in values if isinstance(v, StepWorkspaces))
    mb, states = 1 / 2 ** 20, 2 * (T + 1) * cfg.batch * H * 4
    rnn_peak, rnn_kept = hook.peaks["RecurrentNetwork"]
    return {"mode": "forward-only" if forward_only else "with backward step net", "T": T,
            "workspaces": len(steps.steps), "states": states * mb, "rnn_peak": rnn_peak * mb,
            "rnn_extra": (rnn_kept - states) * mb, "rnn_peak_extra": (rnn_peak - states) * mb,
            "i2h": T * cfg.batch * 4 * H * 4 * mb, "fc_peak": hook.peaks["FC"][0] * mb}


def memory(cfg) -> list[dict]:
    """memory_row per T: forward-only (rotating step workspaces) and, for contrast, with a backward step
    net (one workspace kept per timestep), at the largest hidden size."""
    import tracemalloc

    tracemalloc.start()
    rows = [memory_row(cfg, max(cfg.hidden), T, fo) for fo in (True, False) for T in cfg.memory_steps]
    tracemalloc.stop()
    return rows


class OpTimes:
    """Wall time and calls per (net, op type); also times Blob.set while installed."""

    def __init__(self):
        self.spent, self.calls, self.set_time = defaultdict(float), Counter(), 0.0

    def __call__(self, key, call, args):
        t = time.perf_counter()
        result = call(*args)
        self.spent[key] += time.perf_counter() - t
        self.calls[key] += 1
        return result

    def timed_runs(self, run, n: int) -> float:
        """Mean ms of n runs with Blob.set timed."""
        from stepnet.runtime import workspace as wsmod

        plain_set = wsmod.Blob.set

        def timed_set(blob, value):
            t = time.perf_counter()
            plain_set(blob, value)
            self.set_time += time.perf_counter() - t
        wsmod.Blob.set = timed_set
        try:
            return sum(sample_ms(run, n, 0)) / n
        finally:
            wsmod.Blob.set = plain_set


def profile_one(cfg, H: int) -> dict:
    import cProfile
    import io
    import pstats

    ws, net, _ = stepnet_model(cfg, H)
    for _ in range(max(cfg.warmup, 1)):
        net.run()
    times, n = OpTimes(), cfg.repeats
    hook = OpHook(times)
    hook.attach(net, "main net")
    for name, step_net in step_nets(ws):
        hook.attach(step_net, f"step net {name}")
    total = times.timed_runs(net.run, n)
    ops = [(w, t, times.calls[(w, t)] // n, 1000 * s / n)
           for (w, t), s in sorted(times.spent.items(), key=lambda kv: -kv[1])]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        net.run()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    return {"total": total, "ops": ops, "set": 1000 * times.set_time / n, "cprofile": text.getvalue(),
            "leaf": sum(ms for _, t, _, ms in ops if not t.startswith("RecurrentNetwork"))}


def profile(cfg) -> dict:
    """stepnet's step broken down by op (ms per step, instrumented) and cProfile's top functions."""
    limit_blas(cfg.threads)
    return {H: profile_one(cfg, H) for H in cfg.hidden}


# ------------------------------------------------------------------------------------ report
def available() -> list[str]:
    import importlib.util

    return list(FRAMEWORKS if importlib.util.find_spec("torch") else FRAMEWORKS[:2])


def wait_for_quiet(limit: float | None, max_wait: float) -> float:
    """Wait (up to max_wait s) for the 1-minute load average to drop under limit; return the load."""
    end = time.time() + max_wait
    while limit is not None and os.getloadavg()[0] >= limit and time.time() < end:
        time.sleep(5)
    return os.getloadavg()[0]


def _busy_seconds() -> float | None:
    """CPU seconds spent busy by the whole machine so far (Linux /proc/stat), or None."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]  # guest time is in user
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def child(what: str, env, args, foreign: list | None = None):
    """Run one measurement in a fresh process; append to `foreign` how many CPUs other processes kept busy
    on average meanwhile (machine busy time minus the child's own CPU time, over the wall time)."""
    cmd = [sys.executable, __file__, "--child", what, *args.passthrough]
    busy, own, wall = _busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if r.returncode:
        sys.exit(f"benchmark child ({what}) failed:\n{r.stderr}")
    if foreign is not None and busy is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - own.ru_utime - own.ru_stime
        foreign.append(max(0.0, (_busy_seconds() - busy - cpu) / (time.perf_counter() - wall)))
    return json.loads(r.stdout.strip().splitlines()[-1])


def table(results: dict, hidden, pairs: dict | None = None) -> list[str]:
    base = {H: statistics.median(results["stepnet"]["times"][str(H)]) for H in hidden}
    head = ("| framework | " + " | ".join(f"H={H}: median (min) ms | stepnet ÷ this" for H in hidden)
            + " | first step vs stepnet: \\|Δloss\\|, rel. \\|Δgrad\\| |")
    rows = [head, "|" + "---|" * (2 * len(hidden) + 2)]
    for name, res in results.items():
        cells = []
        for H in hidden:
            times = res["times"][str(H)]
            med = statistics.median(times)
            cells += [f"{med:.1f} ({min(times):.1f})", f"{base[H] / med:.2f}"]
        check = "; ".join(f"H={H}: {d:.0e}, {g:.0e}" for H, (d, g) in res["check"].items()) or "—"
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {check} |")
    targets = [H for H in hidden if H in TARGETS and "numpy" in results]
    rows += [""] if targets else []
    for H in targets:
        ratio = base[H] / statistics.median(results["numpy"]["times"][str(H)])
        best = min(results["stepnet"]["times"][str(H)]) / min(results["numpy"]["times"][str(H)])
        verdict = "met" if ratio <= TARGETS[H] else "MISSED"
        line = (f"- target at H={H}: stepnet ÷ numpy ≤ {TARGETS[H]}: {ratio:.2f} (medians), {verdict}; "
                f"{best:.2f} from the minima")
        if pairs and str(H) in pairs:
            ratios = [s / n for s, n in pairs[str(H)]]
            q = statistics.quantiles(ratios, n=4)
            verdict = "met" if statistics.median(ratios) <= TARGETS[H] else "MISSED"
            line += (f"; same process, alternating steps: {statistics.median(ratios):.2f} (median of "
                     f"{len(ratios)} per-pair ratios, quartiles {q[0]:.2f}–{q[2]:.2f}), {verdict}")
        rows.append(line)
    return rows


def memory_table(rows) -> list[str]:
    lines = ["| mode | T | step workspaces | state tensors 2·(T+1)·B·H | RecurrentNetwork: peak | "
             "peak − states | kept − states | i2h output T·B·4H | i2h FC peak |", "|" + "---|" * 9]
    for r in rows:
        nums = " | ".join(f"{r[k]:.2f}" for k in ("states", "rnn_peak", "rnn_peak_extra", "rnn_extra", "i2h",
                                                  "fc_peak"))
        lines.append(f"| {r['mode']} | {r['T']} | {r['workspaces']} | {nums} |")
    return lines


def profile_lines(prof: dict) -> list[str]:
    lines = []
    for H, p in prof.items():
        lines += [f"#### H={H}: {p['total']:.1f} ms per step while instrumented", "",
                  "| where | op | calls/step | ms/step | share |", "|---|---|---|---|---|"]
        lines += [f"| {w} | {t} | {c} | {ms:.2f} | {100 * ms / p['total']:.0f} % |"
                  for w, t, c, ms in p["ops"]]
        other = p["total"] - p["leaf"] - p["set"]
        lines += [f"| — | Blob.set (after each op; write-through copies) | | {p['set']:.2f} | "
                  f"{100 * p['set'] / p['total']:.0f} % |",
                  f"| — | executor loops + RecurrentNetwork Python outside kernels | | {other:.2f} | "
                  f"{100 * other / p['total']:.0f} % |", ""]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("repeats", 20), ("warmup", 3), ("batch", 32), ("steps", 25), ("vocab", 65),
                          ("threads", os.cpu_count() or 1), ("rounds", 1)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    p.add_argument("--paired-steps", type=int, default=60,
                   help="stepnet/numpy step pairs alternating in one process (0: skip)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--lr", type=float, help="base learning rate (default: sgd 0.1·T as char_rnn, adam 1e-3)")
    p.add_argument("--wait-load", type=float, help="before each child, wait for a 1-min load average below")
    p.add_argument("--max-wait", type=float, default=600, help="seconds to wait for --wait-load at most")
    p.add_argument("--memory", action="store_true", help="also measure forward-only memory vs T")
    p.add_argument("--memory-steps", type=int, nargs="+", default=[25, 100, 400])
    p.add_argument("--profile", action="store_true", help="also break stepnet's step down by op")
    p.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, help="default: all that are installed")
    p.add_argument("--write", action="store_true", help=f"replace this configuration's section of {RESULTS}")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.lr = args.lr if args.lr is not None else (0.1 * args.steps if args.optimizer == "sgd" else 1e-3)
    if args.child:
        work = {"memory": memory, "profile": profile, "paired": paired}.get(args.child)
        print(json.dumps(work(args) if work else measure(args.child, args)))
        return
    keys = ("repeats", "warmup", "batch", "steps", "vocab", "optimizer", "lr", "threads", "paired_steps")
    args.passthrough = [a for k in keys for a in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]
    args.passthrough += ["--hidden", *map(str, args.hidden), "--memory-steps", *map(str, args.memory_steps)]
    lines = report(args)
    text = "\n".join(lines).rstrip("\n") + "\n"
    print(text)
    if args.write:
        write_section(text, lines[0] + "\n")


def report(args) -> list[str]:
    env = dict(os.environ)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    setting = ", ".join(f"{v}={env[v]!r}" if v in env else f"{v} unset" for v in ENV_VARS)
    command = " ".join(["python", f"benchmarks/{Path(__file__).name}", *sys.argv[1:]])
    frameworks = args.frameworks or available()
    results = {fw: {"times": defaultdict(list), "check": {}, "info": {}} for fw in frameworks}
    loads, foreign = [], []
    for _ in range(args.rounds):
        for fw in frameworks:
            loads.append(wait_for_quiet(args.wait_load, args.max_wait))
            res = child(fw, env, args, foreign)
            for H, times in res["times"].items():
                results[fw]["times"][H] += times
            results[fw]["check"] = {int(H): v for H, v in res["check"].items()}
            results[fw]["info"].update(res["info"])
    info = {k: v for res in results.values() for k, v in res["info"].items()}
    pairs = None
    if {"stepnet", "numpy"} <= set(frameworks) and args.paired_steps:
        loads.append(wait_for_quiet(args.wait_load, args.max_wait))
        pairs = child("paired", env, args)
    lines = [f"{HEADER} (B={args.batch}, T={args.steps}, V={args.vocab}, {args.optimizer}, {args.threads} "
             f"thread{'s' if args.threads > 1 else ''})", "",
             f"- date: {datetime.date.today().isoformat()}",
             f"- machine: {platform.machine()}, {os.cpu_count()} CPUs (nproc), {platform.platform()}, "
             f"Python {platform.python_version()}",
             f"- OpenBLAS environment: {setting}; BLAS and torch threads: {args.threads}",
             "- " + ", ".join(f"{k} {v}" for k, v in info.items()),
             f"- load average before the run (1, 5, 15 min): {load}; 1-min load before each child: "
             + ", ".join(f"{x:.2f}" for x in loads),
             "- CPUs kept busy by other processes during each child (in the order "
             f"{', '.join(frameworks)}, per round): " + (", ".join(f"{x:.2f}" for x in foreign) or "unknown"),
             f"- command: `{command}`",
             f"- one step = forward, full backward and the {args.optimizer} update; median (min) of "
             f"{args.repeats} steps after {args.warmup} warm-up steps × {args.rounds} round(s), each "
             "framework in its own process; 'stepnet ÷ this' = stepnet's median over the framework's "
             "(above 1: the framework is faster); the last column compares each framework's first step with "
             "stepnet's from the same weights and data (max over parameters of max|Δgrad| / max|grad|)", "",
             *table(results, args.hidden, pairs), ""]
    if args.memory:
        lines += ["### stepnet forward-only memory vs T", "",
                  f"LSTM alone (i2h FC + RecurrentNetwork), B={args.batch}, H={max(args.hidden)}, "
                  "float32, first run in a fresh workspace, tracemalloc (MiB) above the traced memory at the "
                  "op's start; 'kept' is what remains after the op.", "",
                  *memory_table(child("memory", env, args)), ""]
    if args.profile:
        prof = {int(k): v for k, v in child("profile", env, args).items()}
        for H, v in prof.items():
            print(f"cProfile of stepnet's step, H={H}, {args.repeats} steps:\n{v['cprofile']}")
        lines += ["### where stepnet's step goes", "",
                  "Every bound op's call timed (main net and the step nets inside RecurrentNetwork / "
                  "RecurrentNetworkGradient, whose times include their step nets). The timing wrappers make "
                  "the step slower than in the table above; their cost lands mostly in the last row.", "",
                  *profile_lines(prof)]
    return lines


if __name__ == "__main__":
    main()
