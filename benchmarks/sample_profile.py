"""Where one character of greedy sampling goes (B=1, the char-rnn LSTM predict net at T=1, compiled): each
piece called on its own in a tight loop (best of 5 × --calls calls, µs): the net's run, its signature check,
each entry of its compiled routine, the RecurrentNetwork's replay and the entries of its step routine, and the
feeds and fetches of the sampling loop around it. Prints a markdown table; --write puts it into RESULTS.md.

    python benchmarks/sample_profile.py [--hidden 128] [--threads 1] [--calls 20000] [--write]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from results import write_section


def best(fn, calls: int) -> float:
    """Best of 5 rounds of `calls` calls, µs per call."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times)


def entries(program, net):
    """(label, fn) per entry of a compiled program over a bound net, each calling the entry's form on the
    blobs' current values."""
    for fast, _, at in program.ops:
        bops = [net.ops[k] for k in at]
        ins = [b for bop in bops for b in bop.inputs]
        outs = tuple(b for bop in bops for b in bop.outputs)
        label = "+".join(bop.opdef.type for bop in bops)
        if fast.blobs:
            yield label, lambda f=fast.fn, i=ins, o=outs: f([b.value for b in i], o)
        else:
            yield label, lambda f=fast.fn, i=ins, o=outs: f([b.value for b in i], [b.value for b in o])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    from threadpoolctl import threadpool_limits
    threadpool_limits(args.threads, user_api="blas")
    from targets import stepnet_net

    V, H = 65, args.hidden
    ws, net, outs = stepnet_net("lstm", H, 1, 1, V, train=False)
    for _ in range(5):
        net.run()
    compiler = net.compiler
    assert compiler.program is not None, "the predict net did not compile"
    rnn = next(b for b in net.ops if b.opdef.type == "RecurrentNetwork")
    fwd = rnn.call.args[0].state["forward"]
    replay, rnn_inputs = fwd.loop.replay, [b.value for b in rnn.inputs]
    step_net = replay.steps[0][1]
    x = np.eye(V, dtype=np.float32)[3].reshape(1, 1, V)
    rows = [("net", "net.run() (compiled)", best(net.run, args.calls)),
            ("net", "signature check (StepCompiler.start)", best(lambda: compiler.start(net), args.calls)),
            ("net", "BLAS thread check (Workspace.blas_threads)", best(ws.blas_threads, args.calls))]
    rows += [("net entry", label, best(fn, args.calls)) for label, fn in entries(compiler.program, net)]
    rows += [("RecurrentNetwork", "replay (whole op)", best(lambda: replay.run(rnn_inputs, checked=True), args.calls)),
             ("RecurrentNetwork", "step routine (one timestep)", best(fwd.loop.compiler.routine(step_net), args.calls))]
    rows += [("step entry", label, best(fn, args.calls)) for label, fn in entries(fwd.loop.compiler.program, step_net)]
    rows += [("loop", "ws.feed of one input (×3 a character)", best(lambda: ws.feed("input_blob", x), args.calls)),
             ("loop", "ws.fetch of one output (×3 a character)", best(lambda: ws.fetch("softmax"), args.calls))]
    table = ["| where | piece | µs |", "|---|---|---|"] + [f"| {w} | {what} | {t:.2f} |" for w, what, t in rows]
    print("\n".join(table))
    if args.write:
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        text = "\n".join([f"## Where a sampled character goes (LSTM, H={H}, B=1, compiled predict net)", "",
                          f"- command: `python benchmarks/sample_profile.py --hidden {H} --write`; "
                          f"{args.threads} BLAS thread(s); load average {load}",
                          "- each piece alone in a loop, best of 5 × "
                          f"{args.calls} calls; entries include their own argument lists", "", *table, ""])
        write_section(text, f"## Where a sampled character goes (LSTM, H={H}, B=1")


if __name__ == "__main__":
    main()
