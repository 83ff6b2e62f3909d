"""The GEMM floor of an LSTM training step (issue #28): the recurrent products alone, timed with numpy's BLAS
(what stepnet calls, each product in the fastest of the ways numpy can compute it) and with torch's, beside the
whole step of each framework (targets.py's models).

Per step of T timesteps at batch B and hidden H (gates 4H): the forward product h·W_hhᵀ (B×H · H×4H) and the
input gradient dgates·W_hh (B×4H · 4H×H) once per timestep, and the weight gradient dgatesᵀ·h (4H×TB · TB×H)
once; the floor is their sum, each the median of --rounds timings in one process, both libraries alternating.
'step ÷ floor' says how close each framework's training step comes to its own library's floor.

With --forward, the predict net instead (targets.py's forward row): the floor is the T forward products alone,
with numpy's BLAS and with onnxruntime's (T MatMul nodes on a constant W, which it packs once for its MLAS
GEMM, as its RNN nodes do), beside stepnet's whole predict net and onnxruntime's on stepnet's export of it (one
ONNX LSTM node): each engine's forward over its own library's floor says how much each spends beyond its
products, and the two floors how much of the gap between the engines is their GEMM libraries'.
--cell gru: the same for Caffe2's GRU layer (one ONNX GRU node), whose step needs two products one after the
other: h·[W_r; W_u]ᵀ (2H wide), then (σ(r)·h)·W_oᵀ (H wide).

    python benchmarks/gemm_floor.py [--batch 1 8 32 128] [--hidden 128 512 1024] [--steps 25] [--threads 1]
        [--rounds 15] [--forward [--cell lstm|gru]] [--write]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np

HEADER = "## GEMM floor of the LSTM training step (issue #28)"
FORWARD_HEADER = "## GEMM floor of the LSTM forward (issue #28)"


def timed(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _ort_products(h, w, T: int, threads: int):
    """T products h·Wᵀ (B×H · H×N) as T MatMul nodes of one onnxruntime graph, W a constant initializer (which
    onnxruntime packs once, at session creation, for its MLAS GEMM, as its LSTM and GRU nodes pack their
    weights), each node fed by a graph input of its own (so that no two are the same expression), bound once:
    the products as onnxruntime's RNN nodes compute them, plus its per-node dispatch (an upper bound)."""
    import onnx
    from onnx import TensorProto, helper

    from targets import ort_session

    B, (N, H) = h.shape[0], w.shape
    nodes = [helper.make_node("MatMul", [f"h{t}", "wt"], [f"y{t}"]) for t in range(T)]
    graph = helper.make_graph(
        nodes, "products", [helper.make_tensor_value_info(f"h{t}", TensorProto.FLOAT, [B, H]) for t in range(T)],
        [helper.make_tensor_value_info(f"y{t}", TensorProto.FLOAT, [B, N]) for t in range(T)],
        [onnx.numpy_helper.from_array(np.ascontiguousarray(w.T), "wt")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort_session(model.SerializeToString(), threads)
    binding, outs = sess.io_binding(), [np.empty((B, N), np.float32) for _ in range(T)]
    for t in range(T):
        binding.bind_cpu_input(f"h{t}", h)
        binding.bind_output(f"y{t}", "cpu", 0, np.float32, [B, N], outs[t].ctypes.data)
    kept = (h, outs)        # (the bound buffers: onnxruntime holds only their addresses)
    return lambda: sess.run_with_iobinding(binding) or kept


def _ort_version() -> str:
    import onnxruntime
    return f", onnxruntime {onnxruntime.__version__}"


def products(lib: str, B: int, H: int, T: int, widths=(4,), threads: int = 1) -> list:
    """One training step's recurrent products with `lib`'s GEMM (numpy or torch; onnxruntime: the forward parts
    alone, _ort_products), as parts: T forward products
    h·Wᵀ (B×H · H×wH) for each gate width w in `widths` (the LSTM's 4; Caffe2's GRU's 2 then 1: its reset and
    update products, then the output product of the reset hidden state), then T input-gradient products and the
    weight gradient (of the 4H LSTM). Each part is a list of callables computing it in different ways; the floor
    takes each part's fastest. numpy's ways: one GEMM as written, W·Xᵀ (the other operand order), X·Wᵀ from a
    contiguous copy of Wᵀ (kept, as a careful user would), and the blocks for OpenBLAS's small-matrix kernel
    (stepnet.kernels.fc.block_rows, where numpy's BLAS has that kernel and the rule blocks these sizes)."""
    rng = np.random.default_rng(0)
    h, w = rng.standard_normal((B, H), np.float32), rng.standard_normal((4 * H, H), np.float32)
    dg, hs = rng.standard_normal((B, 4 * H), np.float32), rng.standard_normal((T * B, H), np.float32)
    dgs = rng.standard_normal((T * B, 4 * H), np.float32)
    if lib == "numpy":
        from stepnet.kernels.blas import small_matrix_kernels
        from stepnet.kernels.fc import block_rows

        out_h, out_w = np.empty((B, H), np.float32), np.empty((4 * H, H), np.float32)
        h_t = np.empty((H, B), np.float32)

        def repeat(fn):
            def run():
                for _ in range(T):
                    fn()
            return run

        def blocks(a, bt, out, rows):
            def run():
                for i in range(0, a.shape[0], rows):
                    np.matmul(a[i:i + rows], bt, out=out[i:i + rows])
            return run
        def forward(n):
            wn = np.ascontiguousarray(w[:n])
            wt, w_t = wn.T, np.ascontiguousarray(wn.T)   # Wᵀ kept contiguous (a row-major product of two)
            out_g, g_t = np.empty((B, n), np.float32), np.empty((n, B), np.float32)
            ways = [repeat(lambda: np.matmul(h, wt, out=out_g)), repeat(lambda: np.matmul(wn, h.T, out=g_t)),
                    repeat(lambda: np.matmul(h, w_t, out=out_g))]
            if small_matrix_kernels() and block_rows(B, H, n):
                ways.append(repeat(blocks(wn, h.T, g_t, block_rows(B, H, n))))
            return ways
        backward = [repeat(lambda: np.matmul(dg, w, out=out_h)), repeat(lambda: np.matmul(w.T, dg.T, out=h_t))]
        if small_matrix_kernels() and block_rows(B, 4 * H, H):
            backward.append(repeat(blocks(w.T, dg.T, h_t, block_rows(B, 4 * H, H))))
        return [*(forward(k * H) for k in widths), backward, [lambda: np.matmul(dgs.T, hs, out=out_w)]]
    if lib == "onnxruntime":
        return [[_ort_products(h, w[:k * H], T, threads)] for k in widths]
    import torch
    h, w, dg, hs, dgs = map(torch.from_numpy, (h, w, dg, hs, dgs))
    out_h, out_w = torch.empty(B, H), torch.empty(4 * H, H)

    def forward(n):
        wn, out_g = w[:n], torch.empty(B, n)

        def run():
            for _ in range(T):
                torch.mm(h, wn.t(), out=out_g)
        return run

    def backward():
        for _ in range(T):
            torch.mm(dg, w, out=out_h)
    return [*([forward(k * H)] for k in widths), [backward], [lambda: torch.mm(dgs.t(), hs, out=out_w)]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 512, 1024])
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--forward", action="store_true", help="the predict net against onnxruntime (see above)")
    p.add_argument("--cell", choices=("lstm", "gru"), default="lstm", help="with --forward: the layer's cell")
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(args.threads, user_api="blas")
    import torch
    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from targets import onnx_forward_stepnet, stepnet_net, torch_train

    blas = "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '')}"
                     for i in threadpool_info() if i.get("user_api") == "blas")
    T, V = args.steps, 65
    if args.cell != "lstm" and not args.forward:
        p.error("--cell gru is for --forward (the training floor is the LSTM's)")
    widths = (2, 1) if args.cell == "gru" else (4,)
    what, peer = ("forward", "onnxruntime") if args.forward else ("step", "torch")
    second = "onnxruntime" if args.forward else "torch"     # (the other library's floor: the peer's own)
    table = [f"| B | H | numpy floor ms | {second} floor ms | stepnet {what} ms | {peer} {what} ms | stepnet ÷ "
             f"numpy floor | {peer} ÷ {second} floor | stepnet ÷ {peer} |", "|---|---|---|---|---|---|---|---|---|"]
    for H in args.hidden:
        for B in args.batch:
            floors = [products(lib, B, H, T, widths, args.threads)[:len(widths) if args.forward else 3]
                      for lib in ("numpy", second)]
            if args.forward:
                ws, net, _ = stepnet_net(args.cell, H, T, B, V, train=False)
                step_s, step_t = net.run, onnx_forward_stepnet(ws, net, args.threads)[0]
            else:
                step_s = stepnet_net("lstm", H, T, B, V, train=True)[1].run
                step_t = torch_train("lstm", H, T, B, V, loop=False)
            entries = [*floors, step_s, step_t]      # a floor: its parts' ways, timed each round, the fastest summed
            times = [[] for _ in entries]
            for entry in entries:
                for fn in ([f for part in entry for f in part] if isinstance(entry, list) else [entry]):
                    fn()
            for r in range(args.rounds):
                order = range(len(entries)) if r % 2 == 0 else reversed(range(len(entries)))
                for i in order:
                    entry = entries[i]
                    times[i].append(sum(min(timed(fn, 1) for fn in part) for part in entry)
                                    if isinstance(entry, list) else timed(entry, 1))
            fn_, ft, ss, st = (statistics.median(t) for t in times)
            line = (f"| {B} | {H} | {fn_:.2f} | {ft:.2f} | {ss:.2f} | {st:.2f} | {ss / fn_:.2f} | "
                    f"{st / ft:.2f} | {ss / st:.2f} |")
            print(line, flush=True)
            table.append(line)
    command = " ".join(["python", "benchmarks/gemm_floor.py", *sys.argv[1:]])
    cell = args.cell.upper()
    header = (FORWARD_HEADER if args.cell == "lstm" else FORWARD_HEADER.replace("LSTM", cell)) if args.forward \
        else HEADER
    products_of = ("the T forward products h·W_hhᵀ" if args.cell == "lstm" else
                   "the T reset-and-update products h·[W_r; W_u]ᵀ and the T output products (r·h)·W_oᵀ")
    described = (f"char-rnn {cell} predict net (T={T}, V={V}: the {cell}, the output FC, Softmax) against "
                 f"onnxruntime ({args.threads} intra-op thread) on stepnet's export of it (one ONNX {cell} node); "
                 f"floors: {products_of} alone (onnxruntime's: T MatMul nodes on a constant W, which it packs "
                 f"once for its MLAS GEMM as its RNN nodes do)" if args.forward else
                 f"char-rnn LSTM training step, T={T}, V={V}, SGD (targets.py's models); floors: the recurrent "
                 f"products alone (T forward and T input-gradient GEMMs, one weight-gradient GEMM)")
    text = "\n".join([
        header, "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__} ({blas}), torch "
        f"{torch.__version__}{_ort_version() if args.forward else ''}; {args.threads} thread(s) for both",
        f"- command: `{command}`",
        f"- {described} with each library, numpy's in the fastest of its ways per part each round (one GEMM as "
        f"written, W·Xᵀ, X·Wᵀ from a contiguous Wᵀ, blocks for OpenBLAS's small-matrix kernel); every column "
        f"the median of {args.rounds} rounds, the four "
        f"alternating in one process", "", *table, ""])
    print(text)
    if args.write:
        from results import write_section
        write_section(text, header + "\n")


if __name__ == "__main__":
    main()
