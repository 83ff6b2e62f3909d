"""Issue #28's speed targets (stepnet at or below each peer), every row measured in one process with interleaved
rounds.

Each row times stepnet and one peer alternately (the order swapped every round) and reports the median of the
per-round ratios stepnet ÷ peer (with quartiles) and both medians in ms: a machine shared with other busy
processes slows both halves of a round alike, so the ratio is far steadier than two separate medians. numpy's
BLAS (threadpoolctl), torch and onnxruntime all get --threads threads.

Rows (B=32, T=25, V=65 unless said; one-hot input, SGD):
  train    one char-rnn training step (forward, BPTT, SGD) of LSTM / GRU / basic RNN vs torch nn.LSTM/GRU/RNN,
           vs an nn.LSTMCell/GRUCell/RNNCell loop, and (LSTM) vs the hand-written numpy BPTT (numpy_lstm.py);
           'pytorch (as run)' (no target): the same step as `stepnet run` runs it, without the gradient values
           nothing reads (the one-hot input's dX, which Caffe2's backward computes and torch's does not)
  forward  the predict net (RNN over T steps, output FC, Softmax), forward-only, vs onnxruntime running
           stepnet's own export of that net (`export_onnx`: the LSTM or GRU layer as one ONNX LSTM / GRU node), or,
           where that export has no single RNN node (basic RNN: a Scan), the same torch module exported to ONNX;
           for the GRU also ORT on torch's export without a target (torch's GRU is another cell: the reset gate
           applied after the output product, linear_before_reset=1, where Caffe2's GRU applies it before)
  sample   sampling at B=1: per character feed the one-hot char and the states, run the T=1 predict net,
           fetch the probabilities and states; vs the same step written in numpy (outputs compared)
  squeeze  SqueezeNet 1.1 forward at 224×224, batch 1 and 8, vs torch (squeezenet.py's models)

    python benchmarks/targets.py [--threads 1] [--rounds 20] [--rows train forward sample squeeze]
        [--cells lstm gru rnn] [--hidden 128 512] [--fused-cells auto|on|off] [--write]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np
from char_rnn import GAMMA, add_head, fed_workspace, make_data
from results import write_section

from stepnet.cli.run import FUSED_CELLS

HEADER = "## Speed targets (issue #28)"
TORCH_CELLS = {"lstm": ("LSTM", "LSTMCell"), "gru": ("GRU", "GRUCell"), "rnn": ("RNN", "RNNCell")}
# issue #28: at or below nn.LSTM/GRU/RNN, onnxruntime's RNN node and the numpy sampling loop; the native CNN
# path at least at torch's level (the numpy BPTT and the cell loops are reported without a target)


def add_fused_cells(p) -> None:
    """The --fused-cells auto|on|off option of the benchmarks that run stepnet's training step (FUSED_CELLS)."""
    p.add_argument("--fused-cells", choices=tuple(FUSED_CELLS), default="auto",
                   help="stepnet's numba kernels: cells, Softmax, one-row FC, one-hot FC gradient "
                        "(Workspace.fused_cells; auto: when installed; off: what the default install runs)")


TARGETS = {("train", "pytorch"): 1.0, ("forward", "onnxruntime"): 1.0, ("sample", "numpy"): 1.0,
           ("squeeze", "pytorch"): 1.0}


# --------------------------------------------------------------------------------------------- stepnet
def stepnet_net(cell: str, H: int, T: int, B: int, V: int, train: bool, fused: bool | None = None,
                as_run: bool = False):
    """(workspace, bound net) of the char-rnn model with this cell: the training step or the predict net;
    as_run: without the gradient values nothing reads (passes.unread, as `stepnet run` runs a plan: the one-hot
    input's dX, which Caffe2's backward computes and a torch input without requires_grad does not)."""
    from stepnet.builders.builder import BlobRef
    from stepnet.builders.model import ModelBuilder
    from stepnet.builders.rnn import basic_rnn, gru, lstm

    m = ModelBuilder("char_rnn")
    x, h0, c0 = BlobRef("input_blob"), BlobRef("hidden_init"), BlobRef("cell_init")
    if cell == "lstm":
        outs = lstm(m, x, BlobRef("seq_lengths"), (h0, c0), V, H, scope="LSTM", forward_only=not train)
    elif cell == "gru":
        outs = gru(m, x, BlobRef("seq_lengths"), (h0,), V, H, scope="GRU", forward_only=not train)
    else:
        outs = basic_rnn(m, x, None, (h0,), V, H, scope="RNN", forward_only=not train)
    add_head(m, outs[0], H, V, train)
    if train:
        m.sgd(0.1 * T, policy="step", stepsize=1, gamma=GAMMA)
    ws, net = fed_workspace(m, T, B, V, H, fused), m.net.proto()
    if as_run:
        from stepnet.passes.unread import drop_unread_gradients
        net, dropped = drop_unread_gradients(net)
        assert dropped, "passes.unread found nothing to leave out"
    return ws, ws.create_net(net), [str(o) for o in outs]


# --------------------------------------------------------------------------------------------- torch, ORT
def torch_model(cell: str, H: int, V: int, loop: bool):
    from torch import nn

    whole, step = TORCH_CELLS[cell]
    rnn = getattr(nn, step if loop else whole)(V, H)
    return rnn, nn.Linear(H, V)


def torch_train(cell: str, H: int, T: int, B: int, V: int, loop: bool):
    import torch
    from torch import nn

    rnn, lin = torch_model(cell, H, V, loop)
    opt = torch.optim.SGD(list(rnn.parameters()) + list(lin.parameters()), lr=0.1 * T)
    xs, target = make_data(T, B, V)
    x, tgt = torch.from_numpy(xs), torch.from_numpy(target.astype(np.int64))
    h0 = torch.zeros(B, H) if loop else torch.zeros(1, B, H)
    it = [0]

    def forward():
        if not loop:
            out, _ = rnn(x, (h0, h0) if cell == "lstm" else h0)
        else:
            state, hs = ((h0, h0) if cell == "lstm" else h0), []
            for t in range(T):
                state = rnn(x[t], state)
                hs.append(state[0] if cell == "lstm" else state)
            out = torch.stack(hs)
        return nn.functional.cross_entropy(lin(out).reshape(-1, V), tgt)

    def run():
        it[0] += 1
        opt.param_groups[0]["lr"] = 0.1 * T * GAMMA ** it[0]
        opt.zero_grad(set_to_none=True)
        loss = forward()
        loss.backward()
        opt.step()
    return run


def ort_session(model_bytes: bytes, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def onnx_forward_stepnet(ws, net, threads: int):
    """onnxruntime on stepnet's own export of the predict net (export_onnx: the LSTM layer as one ONNX LSTM node),
    fed the same arrays, and the largest difference of its probabilities from stepnet's; None where the export
    has no single RNN node for the layer (then torch's export, which has one, is the stronger peer)."""
    from stepnet.export.onnx.exporter import export_onnx

    read = {n for op in net.netdef.op for n in op.input}
    feeds = {n: ws.fetch(n) for n in ("input_blob", "seq_lengths", "hidden_init", "cell_init") if n in read}
    params = {n: ws.fetch(n) for n in ws.blobs() if n not in feeds and hasattr(ws.find(n).value, "shape")}
    result = export_onnx(net.netdef, None, inputs=feeds, outputs=["softmax"], params=params)
    if not any(n.op_type in ("LSTM", "GRU", "RNN") for n in result.model.graph.node):
        return None
    sess = ort_session(result.model.SerializeToString(), threads)
    feed = {k: feeds[k] for k in result.inputs}
    net.run()
    diff = float(np.abs(sess.run(None, feed)[0] - ws.fetch("softmax")).max())
    return (lambda: sess.run(None, feed)), diff


def onnx_forward(cell: str, H: int, T: int, B: int, V: int, threads: int):
    """onnxruntime on torch's export of the same architecture (an ONNX LSTM/GRU/RNN node)."""
    import io

    import torch

    rnn, lin = torch_model(cell, H, V, loop=False)

    class Predict(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.lin = rnn, lin

        def forward(self, x):
            return torch.softmax(self.lin(self.rnn(x)[0]), dim=2)

    xs, _ = make_data(T, B, V)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Predict().eval(), (torch.from_numpy(xs),), buf, input_names=["x"], output_names=["p"],
                          dynamo=False)
    sess = ort_session(buf.getvalue(), threads)
    feed = {"x": xs}
    return lambda: sess.run(None, feed)


# --------------------------------------------------------------------------------------------- sampling
def sampler_pair(H: int, V: int, chars: int, fused: bool | None = None):
    """(stepnet sampler, numpy sampler): each draws `chars` characters at B=1 from the same LSTM weights,
    feeding the previous character and states back (greedy: the most likely next character)."""
    ws, net, outs = stepnet_net("lstm", H, 1, 1, V, train=False, fused=fused)
    p = {k: ws.fetch(f"LSTM/{k}") for k in ("i2h_w", "i2h_b", "gates_t_w", "gates_t_b")}
    p.update({k: ws.fetch(k) for k in ("output_w", "output_b")})
    h_last, c_last = outs[1], outs[3]
    eye = np.eye(V, dtype=np.float32)

    def stepnet_sample(first=0):
        ch, h, c = first, np.zeros((1, 1, H), np.float32), np.zeros((1, 1, H), np.float32)
        for _ in range(chars):
            ws.feed("input_blob", eye[ch].reshape(1, 1, V))
            ws.feed("hidden_init", h)
            ws.feed("cell_init", c)
            net.run()
            probs, h, c = ws.fetch("softmax"), ws.fetch(h_last), ws.fetch(c_last)
            ch = int(probs.argmax())
        return probs

    wi, wh, wo = p["i2h_w"].T.copy(), p["gates_t_w"].T.copy(), p["output_w"].T.copy()
    bias, bo = p["i2h_b"] + p["gates_t_b"], p["output_b"]

    def numpy_sample(first=0):
        ch, h, c = first, np.zeros((1, H), np.float32), np.zeros((1, H), np.float32)
        for _ in range(chars):
            g = wi[ch] + bias + h @ wh
            s = 0.5 * np.tanh(0.5 * g[:, :3 * H]) + 0.5
            c = s[:, H:2 * H] * c + s[:, :H] * np.tanh(g[:, 3 * H:])
            h = s[:, 2 * H:] * np.tanh(c)
            logits = h @ wo + bo
            e = np.exp(logits - logits.max())
            probs = e / e.sum()
            ch = int(probs.argmax())
        return probs

    diff = float(np.abs(stepnet_sample().reshape(-1) - numpy_sample().reshape(-1)).max())
    return stepnet_sample, numpy_sample, diff


# --------------------------------------------------------------------------------------------- rounds
def interleaved(a, b, rounds: int, warmup: int) -> dict:
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for r in range(rounds):
        for fn, times in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
            start = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - start))
    ratios = [x / y for x, y in zip(ta, tb)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"ratio": statistics.median(ratios), "q1": q[0], "q3": q[2], "a": statistics.median(ta),
            "b": statistics.median(tb)}


def rows(args):
    """(row, peer, size label, stepnet fn, peer fn, note) for every requested row."""
    T, B, V = 25, 32, 65
    for H in args.hidden:
        for cell in args.cells:
            if "train" in args.rows:
                _, net, _ = stepnet_net(cell, H, T, B, V, train=True, fused=args.fused)
                yield "train", "pytorch", cell, H, net.run, torch_train(cell, H, T, B, V, loop=False), ""
                yield "train", "pytorch-cell", cell, H, net.run, torch_train(cell, H, T, B, V, loop=True), ""
                _, run_net, _ = stepnet_net(cell, H, T, B, V, train=True, fused=args.fused, as_run=True)
                yield ("train", "pytorch (as run)", cell, H, run_net.run, torch_train(cell, H, T, B, V, loop=False),
                       "stepnet's net as `stepnet run` runs it: without the one-hot input's dX (passes.unread)")
                if cell == "lstm":
                    from char_rnn import numpy_timer, stepnet_timer
                    cfg = argparse.Namespace(batch=B, steps=T, vocab=V, optimizer="sgd", lr=0.1 * T,
                                             fused_cells=args.fused)
                    run, _, init = stepnet_timer(cfg, H)
                    yield "train", "numpy", cell, H, run, numpy_timer(cfg, H, init)[0], ""
            if "forward" in args.rows:
                ws, net, _ = stepnet_net(cell, H, T, B, V, train=False, fused=args.fused)
                own = onnx_forward_stepnet(ws, net, args.threads)
                peer = own[0] if own else onnx_forward(cell, H, T, B, V, args.threads)
                yield ("forward", "onnxruntime", cell, H, net.run, peer,
                       f"ORT on stepnet's export, max |Δp| {own[1]:.0e}" if own
                       else "ORT on torch's export (a single RNN node)")
                if own and cell == "gru":     # torch's GRU: another cell (linear_before_reset=1), for reference
                    yield ("forward", "onnxruntime-torch", cell, H, net.run,
                           onnx_forward(cell, H, T, B, V, args.threads),
                           "ORT on torch's export: torch's GRU cell (linear_before_reset=1: one 3H product a step)")
    if "sample" in args.rows:
        for H in args.hidden:
            a, b, diff = sampler_pair(H, V, args.chars, args.fused)
            yield ("sample", "numpy", "lstm", H, a, b, f"{args.chars} chars per call, times per char; "
                   f"max |Δp| after {args.chars} chars {diff:.0e}")
    if "squeeze" in args.rows:
        from squeezenet import stepnet_model, torch_timer
        for batch in (1, 8):
            run, out, weights, x = stepnet_model(batch)
            peer = torch_timer(weights, x)[0]
            run()
            diff = float(np.abs(out() - peer()).max())
            yield "squeeze", "pytorch", "squeezenet", f"batch {batch}", run, peer, f"max |Δp| {diff:.0e}"


def cells_of(fused: bool | None) -> str:
    from stepnet.kernels.jit import installed

    if fused is False or not installed():
        return "numpy (fused_cells off)" if fused is False else "numpy (numba not installed)"
    import numba
    return f"fused, numba {numba.__version__} (the fast extra)"


def target_of(row, peer, size):
    return TARGETS.get((row, peer, size), TARGETS.get((row, peer)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--chars", type=int, default=20, help="characters per sampling call")
    p.add_argument("--rows", nargs="+", default=["train", "forward", "sample", "squeeze"])
    p.add_argument("--cells", nargs="+", default=["lstm", "gru", "rnn"])
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    add_fused_cells(p)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    args.fused = FUSED_CELLS[args.fused_cells]
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(args.threads, user_api="blas")
    import torch
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    blas = "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '')} "
                     f"{i.get('num_threads')} threads" for i in threadpool_info() if i.get("user_api") == "blas")
    table = ["| row | cell | size | peer | stepnet ms | peer ms | stepnet ÷ peer (quartiles) | target | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row, peer, cell, size, a, b, note in rows(args):
        rounds = args.rounds if row != "squeeze" or size == "batch 1" else max(5, args.rounds // 3)
        r = interleaved(a, b, rounds, args.warmup)
        scale = 1 / args.chars if row == "sample" else 1
        target = target_of(row, peer, size)
        verdict = "—" if target is None else f"≤ {target}: {'met' if r['ratio'] <= target else 'MISSED'}"
        line = (f"| {row} | {cell} | {f'H={size}' if isinstance(size, int) else size} | {peer} | "
                f"{r['a'] * scale:.3f} | {r['b'] * scale:.3f} | {r['ratio']:.2f} ({r['q1']:.2f}–{r['q3']:.2f}) | "
                f"{verdict} | {note} |")
        print(line, flush=True)
        table.append(line)
    command = " ".join(["python", "benchmarks/targets.py", *sys.argv[1:]])
    text = "\n".join([
        f"{HEADER}", "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}",
        f"- threads: {args.threads} (numpy BLAS: {blas}; torch {torch.get_num_threads()}; onnxruntime intra-op "
        f"{args.threads})",
        f"- stepnet's LSTM/GRU cell, Softmax, one-row FC and one-hot FC gradient arithmetic: {cells_of(args.fused)}",
        f"- load average at the start (1, 5, 15 min): {load}; at the end: "
        + ", ".join(f"{v:.2f}" for v in os.getloadavg()),
        f"- command: `{command}`",
        f"- every row: stepnet and the peer alternately in one process, {args.rounds} rounds "
        f"({max(5, args.rounds // 3)} for SqueezeNet batch 8) after {args.warmup} warm-up calls each, the order "
        "swapped every round; the ratio is the median of the per-round ratios (quartiles in brackets), the ms "
        "columns each side's median", "",
        *table, ""])
    print(text)
    if args.write:
        write_section(text, HEADER + "\n")


if __name__ == "__main__":
    main()
