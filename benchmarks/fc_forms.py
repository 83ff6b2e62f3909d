"""The ways a compiled step may compute an FC's product (stepnet.kernels.fc_forms: the kernel's own computation,
W·Xᵀ then a transposed add, X·Wᵀ in column blocks from a per-run Wᵀ copy), at given sizes M×K by K×N: which of
them give the FC kernel's bits on this machine (`same_sums`, what a compiled step may take) and each one's time
alone, one thread, best of --repeats batches of --calls products (its per-run Wᵀ copy made once, outside).

    python benchmarks/fc_forms.py [--sizes 32x512x512 32x128x512] [--calls 500] [--repeats 7] [--write]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from results import publish

HEADER = "## The step FC's forms alone (issue #28)"


def best_us(fn, calls: int, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return 1e6 * best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["32x512x512", "32x128x512", "32x128x128", "32x512x2048"],
                   help="M x K x N: X is M×K, W is N×K")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    from threadpoolctl import threadpool_info, threadpool_limits
    threadpool_limits(args.threads, user_api="blas")
    from stepnet.kernels.fc_forms import fastest, forms, same_sums

    blas = "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '')}"
                     for i in threadpool_info() if i.get("user_api") == "blas")
    table = ["| M×K by K×N | form | the kernel's bits here | µs a product | the trial's choice |",
             "|---|---|---|---|---|"]
    for size in args.sizes:
        m, k, n = (int(v) for v in size.split("x"))
        rng = np.random.default_rng(0)
        x, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
        candidates = forms(m, k, n, np.float32)
        same = same_sums(m, k, n, np.float32, candidates)
        chosen = fastest(m, k, n, np.float32, candidates, 25)
        for key, form in candidates.items():
            if form.begin is not None:
                form.begin(w)
            us = best_us(lambda f=form, x=x, w=w: f.product(x, w), args.calls, args.repeats)
            line = (f"| {m}×{k} by {k}×{n} | {key} | {'yes' if key in same else 'no'} | {us:.1f} | "
                    f"{'yes' if key == chosen else ''} |")
            print(line, flush=True)
            table.append(line)
    publish(HEADER, [
        f"numpy {np.__version__} ({blas}); {args.threads} thread(s)",
        f"each form's product alone (`Form.product`), best of {args.repeats} × {args.calls} calls; 'the kernel's "
        "bits here': stepnet.kernels.fc_forms.same_sums on random data of these sizes (the forms a compiled step "
        "FC may take); 'the trial's choice': fastest() for runs of 25 products"], table, args.write)


if __name__ == "__main__":
    main()
