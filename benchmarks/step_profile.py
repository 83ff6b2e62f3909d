"""Where one char-rnn training step goes, with the step nets compiled: every main-net op timed through its
entry in the main net's compiled program, and every op of the compiled step-net routines through its compiled
form (the RecurrentNetwork rows include their step ops). Prints a markdown table; --write puts it into RESULTS.md.

    python benchmarks/step_profile.py [--cell lstm] [--hidden 128] [--batch 32] [--threads 1] [--forward]
        [--steps 20] [--write]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

from results import write_section
from targets import FUSED_CELLS, add_fused_cells, stepnet_net


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", default="lstm", choices=("lstm", "gru", "rnn"))
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--forward", action="store_true", help="the predict net (forward only) instead of training")
    p.add_argument("--steps", type=int, default=20)
    add_fused_cells(p)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    import numpy  # noqa: F401 - loaded first, so that threadpoolctl finds its BLAS
    from threadpoolctl import threadpool_limits
    threadpool_limits(args.threads, user_api="blas")

    import stepnet.compiled.program as program

    spent, calls = defaultdict(float), defaultdict(int)
    plain = program.compiled_form

    def timed(fn, key):
        def run(*args):
            start = time.perf_counter()
            fn(*args)
            spent[key] += time.perf_counter() - start
            calls[key] += 1
        return run

    def timed_form(fast, key):     # fn, and the bound calls of its prebind (compiled.prebound), in a timer
        def bind(ins, outs, fresh, _prebind=fast.prebind):
            call = _prebind(ins, outs, fresh)
            return None if call is None else timed(call, key)
        return fast._replace(fn=timed(fast.fn, key), prebind=None if fast.prebind is None else bind)

    def compiled_form(bop, ins, outs, fused=False, main=False, steps=8):   # every compiled step op in a timer
        fast = plain(bop, ins, outs, fused, main, steps)
        if fast is None or main:          # (the main net's entries are timed below, in its program)
            return fast
        key = ("step net", bop.opdef.type)
        rebind = None if fast.rebind is None else (lambda b, r=fast.rebind: timed(r(b), key))

        def fuse(*args, _fuse=fast.fuse):              # a fused pair (FC bias + Sum) timed as "FC+Sum"
            pair = _fuse(*args)
            return None if pair is None else timed_form(pair, ("step net", "FC+Sum"))
        return timed_form(fast, key)._replace(rebind=rebind, fuse=None if fast.fuse is None else fuse)
    program.compiled_form = compiled_form

    import stepnet.compiled.entries as entries
    group = entries.gru_step.form

    def gru_step(*args, **kwargs):        # the GRU step's one entry (compiled.gru_step) timed as "GRU step"
        fast = group(*args, **kwargs)
        return None if fast is None else timed_form(fast, ("step net", "GRU step (11 ops)"))
    entries.gru_step.form = gru_step

    _, net, _ = stepnet_net(args.cell, args.hidden, 25, args.batch, 65, train=not args.forward,
                            fused=FUSED_CELLS[args.fused_cells])
    for _ in range(3):
        net.run()
    program = net.compiler.program       # the main net's own program: each entry in a timer
    if program is None:
        sys.exit("the main net did not compile: nothing to time per op")
    for k, (fast, kinds, at) in enumerate(program.ops):
        program.ops[k] = (fast._replace(fn=timed(fast.fn, ("main net", net.ops[at[0]].opdef.type))), kinds, at)
    net.compiler.routines = {}
    net.run()
    spent.clear()
    calls.clear()
    n = args.steps
    start = time.perf_counter()
    for _ in range(n):
        net.run()
    total = 1000 * (time.perf_counter() - start) / n
    rows = sorted(((w, t, calls[(w, t)] // n, 1000 * s / n) for (w, t), s in spent.items()), key=lambda r: -r[3])
    main_ops = sum(ms for w, _, _, ms in rows if w == "main net")
    inner = sum(ms for w, _, _, ms in rows if w == "step net")
    rnn = sum(ms for w, t, _, ms in rows if w == "main net" and t.startswith("RecurrentNetwork"))
    what = "forward pass" if args.forward else "training step"
    title = (f"## Where the {what} goes ({args.cell.upper()}, H={args.hidden}, B={args.batch}, "
             "compiled step nets)")
    lines = [title, "",
             f"- command: `python benchmarks/step_profile.py {' '.join(sys.argv[1:])}`; {args.threads} BLAS "
             f"thread(s); load average {', '.join(f'{v:.2f}' for v in os.getloadavg())}",
             f"- {total:.2f} ms per step while instrumented (mean of {n} steps after 3); the RecurrentNetwork rows "
             "include their step ops (the 'step net' rows)", "",
             "| where | op | calls/step | ms/step | share |", "|---|---|---|---|---|"]
    lines += [f"| {w} | {t} | {c} | {ms:.2f} | {100 * ms / total:.0f} % |" for w, t, c, ms in rows]
    lines += [f"| — | RecurrentNetwork ops outside their step ops (links bookkeeping, zeroing, weight GEMM, "
              f"state setup) | | {rnn - inner:.2f} | {100 * (rnn - inner) / total:.0f} % |",
              f"| — | the main net outside its entries (signature check, buffer checkout) | | {total - main_ops:.2f} | "
              f"{100 * (total - main_ops) / total:.0f} % |", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section(text, lines[0] + "\n")


if __name__ == "__main__":
    main()
