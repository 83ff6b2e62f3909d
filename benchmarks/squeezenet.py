"""SqueezeNet 1.1 forward time: stepnet vs PyTorch CPU vs onnxruntime, at 224×224, batch 1 and 8.

stepnet runs the real Caffe2 predict net (tests/data/caffe2/squeeze_predict_net.pb) on weights from
stepnet.builders.synth, shaped to SqueezeNet 1.1's real widths through `params`. PyTorch runs a hand-written module
of the same layers (torchvision does not work with the pinned torch) holding the very same weights, and
onnxruntime runs that module exported to ONNX; the largest difference of their probabilities from stepnet's
is printed as a cross-check. PyTorch and onnxruntime are optional (pip install torch==2.13.0 onnxruntime
onnx); without them only stepnet is timed.

Each configuration is timed in a fresh child process: once with the environment as it is and, when
OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE is set (they can slow numpy's OpenBLAS), once with them removed.
Times are the median of --repeats runs after --warmup runs. Results go to stdout and, with --write, to
benchmarks/RESULTS.md (the SqueezeNet section is replaced).

Every framework gets the same number of threads (--threads, default 1): stepnet's BLAS (Workspace(threads=)),
torch.set_num_threads, onnxruntime's intra-op threads (one inter-op thread); the table states them.

    python benchmarks/squeezenet.py [--repeats 20] [--warmup 3] [--batches 1 8] [--threads 1] [--env NAME=VALUE]
        [--write]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

from results import write_section

ROOT = Path(__file__).resolve().parent.parent
NET = ROOT / "tests" / "data" / "caffe2" / "squeeze_predict_net.pb"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# SqueezeNet 1.1 fire modules (fire2..fire9): squeeze width, expand width (1×1 and 3×3 each).
FIRES = [(16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192), (64, 256), (64, 256)]
POOL_AFTER = {"conv1", "fire3", "fire5"}  # 3×3/2 max pools, ceil mode (Caffe's legacy pooling)
THREADS = {"n": 1}   # the child's thread count for every framework (--threads)


def real_params(classes: int = 1000) -> dict:
    """Parameter dims of SqueezeNet 1.1 by blob name of the Caffe2 file."""
    dims = {"conv1_w": (64, 3, 3, 3), "conv1_b": (64,)}
    c = 64
    for k, (s, e) in enumerate(FIRES, start=2):
        f = f"fire{k}/"
        dims.update({f + "squeeze1x1_w": (s, c, 1, 1), f + "squeeze1x1_b": (s,),
                     f + "expand1x1_w": (e, s, 1, 1), f + "expand1x1_b": (e,),
                     f + "expand3x3_w": (e, s, 3, 3), f + "expand3x3_b": (e,)})
        c = 2 * e
    dims.update({"conv10_w": (classes, c, 1, 1), "conv10_b": (classes,)})
    return dims


def median_ms(fn, repeats: int, warmup: int) -> tuple[float, float]:
    """(median, minimum) wall time of fn in ms over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times), 1000 * min(times)


# --------------------------------------------------------------------------------------------- frameworks
def stepnet_model(batch: int, seed: int = 0):
    """(run, fetch output, weights by blob name) for the Caffe2 file on synthesized weights."""
    import numpy as np

    from stepnet.io import proto
    from stepnet.builders.synth import synth_init
    from stepnet.runtime.workspace import Workspace

    net = proto.load(NET, kind="net")
    init = synth_init(net, {"data": (batch, 3, 224, 224)}, params=real_params(), seed=seed)
    ws = Workspace(threads=THREADS["n"])
    ws.run_net_once(init)
    ws.feed("data", np.random.default_rng(seed).standard_normal((batch, 3, 224, 224)).astype(np.float32))
    bound = ws.create_net(net)
    weights = {n: ws.fetch(n) for n in init.external_output}
    return bound.run, lambda: ws.fetch("softmaxout").reshape(batch, -1), weights, ws.fetch("data")


def torch_module(weights):
    """SqueezeNet 1.1 in PyTorch holding the given weights."""
    import torch
    from torch import nn

    class Fire(nn.Module):
        def __init__(self, c, s, e):
            super().__init__()
            self.squeeze = nn.Conv2d(c, s, 1)
            self.expand1x1 = nn.Conv2d(s, e, 1)
            self.expand3x3 = nn.Conv2d(s, e, 3, padding=1)

        def forward(self, x):
            x = torch.relu(self.squeeze(x))
            return torch.cat([torch.relu(self.expand1x1(x)), torch.relu(self.expand3x3(x))], 1)

    class SqueezeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, stride=2)
            c, fires = 64, []
            for s, e in FIRES:
                fires.append(Fire(c, s, e))
                c = 2 * e
            self.fires = nn.ModuleList(fires)
            self.conv10 = nn.Conv2d(c, weights["conv10_w"].shape[0], 1)

        def forward(self, x):
            x = torch.relu(self.conv1(x))
            x = nn.functional.max_pool2d(x, 3, 2, ceil_mode=True)
            for k, fire in enumerate(self.fires, start=2):
                x = fire(x)
                if f"fire{k}" in POOL_AFTER:
                    x = nn.functional.max_pool2d(x, 3, 2, ceil_mode=True)
            x = torch.relu(self.conv10(x))
            return torch.softmax(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1), 1)

    model = SqueezeNet().eval()
    convs = {"conv1": model.conv1, "conv10": model.conv10}
    for k, fire in enumerate(model.fires, start=2):
        convs.update({f"fire{k}/squeeze1x1": fire.squeeze, f"fire{k}/expand1x1": fire.expand1x1,
                      f"fire{k}/expand3x3": fire.expand3x3})
    with torch.no_grad():
        for name, conv in convs.items():
            conv.weight.copy_(torch.from_numpy(weights[name + "_w"]))
            conv.bias.copy_(torch.from_numpy(weights[name + "_b"]))
    return model


def torch_timer(weights, x):
    """A run function of the PyTorch module on x, and its output."""
    import torch

    torch.set_num_threads(THREADS["n"])
    model, xt = torch_module(weights), torch.from_numpy(x)

    def run():
        with torch.inference_mode():
            return model(xt).numpy()
    return run, run, {"torch threads": torch.get_num_threads()}


def onnxruntime_timer(weights, x):
    """A run function of the module exported to ONNX (TorchScript exporter) in onnxruntime, and its output."""
    import io

    import onnxruntime as ort
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch_module(weights), (torch.from_numpy(x),), buf, input_names=["data"],
                          output_names=["prob"], dynamo=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS["n"], 1
    sess = ort.InferenceSession(buf.getvalue(), options, providers=["CPUExecutionProvider"])
    feed = {"data": x}
    return ((lambda: sess.run(None, feed)), (lambda: sess.run(None, feed)[0]),
            {"onnxruntime threads": f"{THREADS['n']} intra-op, 1 inter-op"})


def measure(framework, batches, repeats, warmup) -> dict:
    """Times (ms) and differences from stepnet's output per batch size, for one framework in this process.
    The weights and the images come from stepnet_model (deterministic), so every process sees the same."""
    import numpy as np

    out = {"times": {}, "maxdiff": {}, "info": {}}
    for b in batches:
        run, fetch, weights, x = stepnet_model(b)
        if framework != "stepnet":
            run()
            ref = fetch()
            make = torch_timer if framework == "pytorch" else onnxruntime_timer
            run, fetch, info = make(weights, x)
            out["info"].update(info)
        out["times"][b] = median_ms(run, repeats, warmup)
        if framework != "stepnet":
            out["maxdiff"][b] = float(np.abs(fetch() - ref).max())
    out["info"].update(versions(framework))
    return out


def versions(framework) -> dict:
    import numpy as np

    v = {"numpy": np.__version__} if framework == "stepnet" else {}
    if framework == "stepnet":
        try:
            from threadpoolctl import threadpool_info
            v["numpy BLAS"] = "; ".join(f"{i.get('internal_api')} {i.get('version')} "
                                        f"{i.get('architecture', '')}, {i.get('num_threads')} threads"
                                        for i in threadpool_info() if i.get("user_api") == "blas")
        except ImportError:
            v["numpy BLAS"] = "unknown (threadpoolctl not installed)"
    else:
        for mod in ("torch", "onnxruntime") if framework == "onnxruntime" else ("torch",):
            v[mod] = __import__(mod).__version__
    return v


def available() -> list[str]:
    import importlib.util

    have = {m: importlib.util.find_spec(m) is not None for m in ("torch", "onnxruntime", "onnx")}
    names = ["stepnet"] + (["pytorch"] if have["torch"] else [])
    return names + (["onnxruntime"] if all(have.values()) else [])


# --------------------------------------------------------------------------------------------- report
def child(framework, env, args) -> dict:
    """measure() in a fresh process, so that no framework's thread pool competes with another's."""
    cmd = [sys.executable, __file__, "--child", framework, "--repeats", str(args.repeats), "--warmup",
           str(args.warmup), "--threads", str(args.threads), "--batches", *map(str, args.batches)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if r.returncode:
        sys.exit(f"benchmark child ({framework}) failed:\n{r.stderr}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["times"] = {int(k): v for k, v in res["times"].items()}
    res["maxdiff"] = {int(k): v for k, v in res["maxdiff"].items()}
    return res


def table(results, batches) -> list[str]:
    base = results["stepnet"]["times"]
    head = ("| framework | " + " | ".join(f"batch {b}: median (min) ms | stepnet ÷ this" for b in batches)
            + " | max abs Δp vs stepnet |")
    rows = [head, "|" + "---|" * (2 * len(batches) + 2)]
    for name, res in results.items():
        cells = []
        for b in batches:
            (med, low), ref = res["times"][b], base[b][0]
            cells += [f"{med:.1f} ({low:.1f})", f"{ref / med:.2f}"]
        diff = ", ".join(f"{d:.1e}" for d in res["maxdiff"].values()) or "—"
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {diff} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--threads", type=int, default=1, help="threads for every framework (default 1)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="also run with this variable set (repeatable; all given ones form one extra run)")
    p.add_argument("--write", action="store_true", help=f"replace the SqueezeNet section of {RESULTS}")
    p.add_argument("--child", choices=("stepnet", "pytorch", "onnxruntime"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        THREADS["n"] = args.threads
        print(json.dumps(measure(args.child, args.batches, args.repeats, args.warmup)))
        return
    env = dict(os.environ)
    runs = [("environment as is", env)]
    if any(v in env for v in ENV_VARS):
        runs.append((f"{' and '.join(ENV_VARS)} unset", {k: v for k, v in env.items() if k not in ENV_VARS}))
    if args.env:
        extra = dict(item.split("=", 1) for item in args.env)
        runs.append((f"with {', '.join(args.env)}", {**env, **extra}))
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    setting = ", ".join(f"{v}={env[v]!r}" if v in env else f"{v} unset" for v in ENV_VARS)
    command = " ".join(["python", f"benchmarks/{Path(__file__).name}", *sys.argv[1:]])
    lines = ["## SqueezeNet 1.1 forward, 224×224", "",
             f"- date: {datetime.date.today().isoformat()}",
             f"- machine: {platform.machine()}, {os.cpu_count()} CPUs (nproc), {platform.platform()}, "
             f"Python {platform.python_version()}",
             f"- OpenBLAS environment: {setting}",
             f"- load average before the run (1, 5, 15 min): {load}",
             f"- command: `{command}`",
             f"- threads: {args.threads} for every framework (stepnet's BLAS, torch, onnxruntime intra-op)",
             f"- median of {args.repeats} runs after {args.warmup} warm-up runs, each framework in its own "
             "process; 'stepnet ÷ this' = stepnet's median over the framework's (above 1: the framework is "
             "faster); max abs Δp = largest difference of its softmax outputs from stepnet's, per batch size "
             "(same weights and images)", ""]
    frameworks = available()
    for title, e in runs:
        results = {fw: child(fw, e, args) for fw in frameworks}
        info = {k: v for res in results.values() for k, v in res["info"].items()}
        lines += [f"### {title}", "", "- " + ", ".join(f"{k} {v}" for k, v in info.items()), "",
                  *table(results, args.batches), ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section(text, "## SqueezeNet")


if __name__ == "__main__":
    main()
