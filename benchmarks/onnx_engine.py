"""stepnet's engine vs `--engine onnxruntime` (the net exported by stepnet.export.onnx, run in onnxruntime) on
SqueezeNet 1.1, ResNet-50 and on LSTM and GRU inference, in one process.

SqueezeNet is the real Caffe2 predict net (tests/data/caffe2/squeeze_predict_net.pb) on synthesized weights of
SqueezeNet 1.1's widths; ResNet-50 the Caffe2 model zoo's predict net
(tests/data/models/resnet50_predict_net.pbtxt) on synthesized weights of ResNet-50's widths (25.6 M
parameters); the LSTM is char-rnn's forward net in Caffe2's layout (i2h FC, RecurrentNetwork with FC + Sum +
LSTMUnit, FC to the vocabulary, Softmax; T=25, B=32, V=65), exported both ways the exporter can: one ONNX LSTM
node (the default) and a Scan over the converted step net (--rnn scan); the GRU the same with gru_cell's layer
(one ONNX GRU node, or the Scan). Each configuration runs
--rounds rounds; a round times --reps runs of each engine back to back (the order alternating between rounds)
and gives the ratio of their medians. The report gives the median of those per-round ratios (with quartiles)
and the median times. Both engines use --threads threads (BLAS threads for numpy, set before numpy loads, and
onnxruntime's intra-op threads). The model is exported once; `stepnet run --engine onnxruntime` also exports
on every invocation, so its export time is shown.

    python benchmarks/onnx_engine.py [--rounds 15] [--reps 5] [--threads 2] [--write]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--reps", type=int, default=5, help="runs of each engine per round")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    p.add_argument("--wait-load", type=float, help="before each configuration, wait (up to --max-wait s) for the "
                                                   "1-minute load average to drop below this")
    p.add_argument("--max-wait", type=float, default=300)
    p.add_argument("--write", action="store_true", help="replace this benchmark's section of RESULTS.md")
    return p.parse_args()


ARGS = parse() if __name__ == "__main__" else None
if ARGS is not None:   # BLAS reads these when numpy loads
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import write_section  # noqa: E402
from squeezenet import real_params  # noqa: E402

from stepnet.io import proto  # noqa: E402
from stepnet.export.onnx import export_onnx  # noqa: E402
from stepnet.runtime.workspace import Workspace  # noqa: E402


def squeezenet(batch: int):
    """(init net, predict net, feeds) for SqueezeNet 1.1 on synthesized weights of its real widths."""
    from stepnet.builders.synth import synth_init

    net = proto.load(ROOT / "tests" / "data" / "caffe2" / "squeeze_predict_net.pb", kind="net")
    init = synth_init(net, {"data": (batch, 3, 224, 224)}, params=real_params())
    feeds = {"data": np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    return init, net, feeds


def resnet50_params(classes: int = 1000) -> dict:
    """Parameter dims of ResNet-50 by blob name of the Caffe2 zoo file: conv1 7×7×64, then the four stages'
    bottleneck blocks (1×1 to the stage's width, 3×3, 1×1 to four times it; a 1×1 shortcut in each first block),
    the FC to the classes (the batch norms' widths follow from the convolutions)."""
    p = "gpu_0/"
    dims, c = {p + "conv1_w": (64, 3, 7, 7)}, 64
    for stage, blocks, mid in ((2, 3, 64), (3, 4, 128), (4, 6, 256), (5, 3, 512)):
        for b in range(blocks):
            r = f"{p}res{stage}_{b}_"
            dims.update({r + "branch2a_w": (mid, c, 1, 1), r + "branch2b_w": (mid, mid, 3, 3),
                         r + "branch2c_w": (4 * mid, mid, 1, 1)})
            if b == 0:
                dims[r + "branch1_w"] = (4 * mid, c, 1, 1)
            c = 4 * mid
    dims.update({p + "pred_w": (classes, c), p + "pred_b": (classes,)})
    return dims


def resnet50(batch: int):
    """(init net, predict net, feeds) for ResNet-50 on synthesized weights of its real widths."""
    from stepnet.builders.synth import synth_init

    net = proto.load(ROOT / "tests" / "data" / "models" / "resnet50_predict_net.pbtxt", kind="net")
    init = synth_init(net, {"gpu_0/data": (batch, 3, 224, 224)}, params=resnet50_params())
    net.external_output.append("gpu_0/pred")      # the logits too: on these weights the softmax saturates
    feeds = {"gpu_0/data": np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    return init, net, feeds


def char_rnn_forward(H: int, cell: str = "lstm", T: int = 25, B: int = 32, V: int = 65):
    """char-rnn's forward net (Caffe2 layout) with an LSTM or GRU layer, its init net and one batch of one-hot
    input."""
    from stepnet.builders.model import ModelBuilder
    from stepnet.builders.rnn import gru, lstm

    m = ModelBuilder("char_rnn_forward")
    if cell == "lstm":
        h_all, h_last, _, c_last = lstm(m, "input_blob", "seq_lengths", ("hidden_init", "cell_init"), V, H,
                                        scope="LSTM", forward_only=True)
        finals = [h_last, c_last]
    else:
        h_all, h_last = gru(m, "input_blob", "seq_lengths", ("hidden_init",), V, H, scope="GRU", forward_only=True)
        finals = [h_last]
    logits = m.fc(h_all, "logits", H, V, axis=2)
    m.net.Softmax(logits, "softmax", axis=2)
    net = m.net.proto()
    net.external_output.extend(["softmax", *finals])
    rng = np.random.default_rng(0)
    onehot = np.eye(V, dtype=np.float32)[rng.integers(0, V, (T, B))]
    feeds = {"input_blob": onehot, "seq_lengths": np.full(B, T, np.int32),
             "hidden_init": np.zeros((1, B, H), np.float32)}
    if cell == "lstm":
        feeds["cell_init"] = np.zeros((1, B, H), np.float32)
    return m.init_net.proto(), net, feeds


def engines(init, net, feeds, threads: int, rnn: str = "auto"):
    """(stepnet run, onnxruntime run, export seconds, the largest difference of an output relative to its
    largest magnitude, ONNX node kinds)."""
    import onnxruntime as ort

    ws = Workspace(seed=0)
    ws.run_net_once(init)
    for k, v in feeds.items():
        ws.feed(k, v)
    bound = ws.create_net(net)
    params = {n: ws.fetch(n) for op in init.op for n in op.output}
    t = time.perf_counter()
    result = export_onnx(net, None, inputs=feeds, params=params, rnn=rnn)
    seconds = time.perf_counter() - t
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(result.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = list(result.outputs)
    bound.run()
    got = session.run([result.outputs[n] for n in names], feeds)
    want = [ws.fetch(n) for n in names]
    diff = max(float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)) for g, w in zip(got, want))
    kinds = sorted({n.op_type for n in result.model.graph.node} & {"LSTM", "GRU", "Scan"}) or ["—"]
    return bound.run, (lambda: session.run(None, feeds)), seconds, diff, kinds[0]


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def rounds(run_a, run_b, n: int, reps: int) -> dict:
    """Interleaved rounds: per round the median of reps runs of each (order alternating); their ratio a/b."""
    run_a(), run_b()   # warm up
    a, b, ratios = [], [], []
    for k in range(n):
        first, second = (run_a, run_b) if k % 2 == 0 else (run_b, run_a)
        t1, t2 = timed(first, reps), timed(second, reps)
        ta, tb = (t1, t2) if k % 2 == 0 else (t2, t1)
        a.append(ta)
        b.append(tb)
        ratios.append(ta / tb)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"stepnet": 1000 * statistics.median(a), "ort": 1000 * statistics.median(b),
            "ratio": statistics.median(ratios), "q1": q[0], "q3": q[2]}


def wait_for_quiet(limit: float | None, max_wait: float) -> float:
    """The 1-minute load average, after waiting up to max_wait seconds for it to fall below limit."""
    end = time.monotonic() + max_wait
    while limit is not None and os.getloadavg()[0] >= limit and time.monotonic() < end:
        time.sleep(5)
    return os.getloadavg()[0]


def blas() -> str:
    try:
        from threadpoolctl import threadpool_info
        return "; ".join(f"{i.get('internal_api')} {i.get('version')}, {i.get('num_threads')} threads"
                         for i in threadpool_info() if i.get("user_api") == "blas")
    except ImportError:
        return f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} (threadpoolctl not installed)"


def main(a) -> None:
    import onnxruntime as ort

    configs = [("SqueezeNet 1.1, batch 1", squeezenet(1), "auto"),
               ("SqueezeNet 1.1, batch 8", squeezenet(8), "auto"),
               ("ResNet-50, batch 1", resnet50(1), "auto"), ("ResNet-50, batch 8", resnet50(8), "auto")]
    for cell in ("lstm", "gru"):
        for H in a.hidden:
            data, title = char_rnn_forward(H, cell), f"char-rnn {cell.upper()} forward, H={H}"
            configs += [(title, data, "auto"), (title, data, "scan")]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    rows = ["| model | ONNX form | stepnet ms | onnxruntime ms | stepnet ÷ onnxruntime: median of per-round "
            "ratios (quartiles) | export s | max rel. Δ | load |", "|---|---|---|---|---|---|---|---|"]
    for title, (init, net, feeds), rnn in configs:
        run_a, run_b, seconds, diff, kind = engines(init, net, feeds, a.threads, rnn)
        before = wait_for_quiet(a.wait_load, a.max_wait)
        r = rounds(run_a, run_b, a.rounds, a.reps)
        form = {"—": "—", "LSTM": "LSTM node", "GRU": "GRU node", "Scan": "Scan"}[kind]
        rows.append(f"| {title} | {form} | {r['stepnet']:.1f} | {r['ort']:.1f} | {r['ratio']:.2f} "
                    f"({r['q1']:.2f}–{r['q3']:.2f}) | {seconds:.2f} | {diff:.1e} | {before:.1f} |")
        print(rows[-1], flush=True)
    command = " ".join(["python", f"benchmarks/{Path(__file__).name}", *sys.argv[1:]])
    text = "\n".join([
        f"## onnxruntime engine vs stepnet's engine (export-onnx), {a.threads} thread(s)", "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs (nproc), {platform.platform()}, "
        f"Python {platform.python_version()}",
        f"- threads: {a.threads} for both (numpy BLAS: {blas()}; onnxruntime intra-op {a.threads}, inter-op 1); "
        f"numpy {np.__version__}, onnxruntime {ort.__version__}",
        f"- load average before the run (1, 5, 15 min): {load}",
        f"- command: `{command}`",
        f"- one process; {a.rounds} rounds, each timing {a.reps} runs of each engine back to back (order "
        "alternating); 'stepnet ÷ onnxruntime' is the median over rounds of the ratio of the two medians (above "
        "1: onnxruntime is faster); times are medians over rounds; export s = exporting the net once (what "
        "`stepnet run --engine onnxruntime` adds per invocation); max rel. Δ = the largest difference of an "
        "output relative to its largest magnitude (over the outputs; ResNet-50's logits too, its softmax saturating on "
        "synthesized weights); "
        "load = 1-minute load average when the configuration started (2 CPUs shared with other work)",
        "", *rows, ""])
    print(text)
    if a.write:
        write_section(text, f"## onnxruntime engine vs stepnet's engine (export-onnx), {a.threads} thread(s)")


if __name__ == "__main__":
    main(ARGS)
