"""Fuzz campaign: mutate real model, minidb, feed and image files many times and run each case through the
command line (`stepnet.cli.run.main`, in worker processes, one alarm per case and a hard timeout from the parent).

Every case ends as one of:
  clean  `stepnet: error: ...` (a StepnetError) - what a bad file or value must give
  ran    exit status 0
  crash  anything else: `stepnet: internal error: ...`, an exception escaping main, a worker that died
  hang   still running after --timeout seconds
  wrapped  one `stepnet: error:` line, but the executor's last resort naming a kernel's stray Python exception
           ("op #3 (X) failed: TypeError: ..."): a bug no check caught, counted apart from clean errors

    python tools/fuzz_campaign.py                       # 10,000 cases, seed 0, 2 workers
    python tools/fuzz_campaign.py --cases 500 --seed 7 --workers 4
    python tools/fuzz_campaign.py --seed 7 --only 123 --keep /tmp/case   # one case again, its files kept
    python tools/fuzz_campaign.py --cases 3000 --families new           # only the newer surfaces' families
    python tools/fuzz_campaign.py --families draw,plot                  # chosen families

Families: the model, minidb, feed, image and one-op families here (a one-op net runs once or, for about half
the cases, three times: its third run is compiled), and (tools/fuzz_surfaces.py) draw,
export-onnx, onnx-engine, export-predict, plot, metrics, collective, control, int8-detection, special-out.

The mutators are tests/fuzzing.py's and tests/fuzzing_surfaces.py's (tests/test_fuzz.py runs them under
hypothesis in CI). A case is a pure
function of (seed, index), so any reported case is reproduced by --only. Not collected by pytest.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing as mp
import multiprocessing.connection
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

MEMORY_LIMIT = 6 << 30   # per worker: a runaway allocation is a MemoryError, not the OOM killer
XOR = "models/xor"
CRAYON = "models/style_transfer"


# The executor's last resort names a kernel's stray exception ("op #3 (X) failed: TypeError: ..."): one clean
# line, but a bug that no check caught; counted apart from clean errors.
WRAPPED = re.compile(r"\) failed: (AttributeError|TypeError|KeyError|IndexError|ValueError|ZeroDivisionError|"
                     r"OverflowError|RecursionError|AssertionError|NameError|UnboundLocalError|RuntimeError|"
                     r"NotImplementedError|UnicodeError|UnicodeDecodeError|UnicodeEncodeError|MemoryError|"
                     r"LinAlgError|AxisError|Exception|error):")


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so that no `except Exception` in stepnet swallows it."""


# ------------------------------------------------------------------------------------------- cases
OLD_FAMILIES = {"model-bytes": 20, "model-text": 15, "model-fields": 20, "minidb": 10, "literal": 8, "npy": 7,
                "image": 3, "special": 2, "one-op": 15}


def families(which: str) -> dict:
    """{family: weight} of --families: 'all' (the old ones, and the new surfaces' as much again), 'new', 'old', or
    a comma-separated list of names."""
    import fuzz_surfaces

    new = fuzz_surfaces.FAMILIES
    if which == "all":
        return {**OLD_FAMILIES, **new}
    if which in ("new", "old"):
        return dict(new if which == "new" else OLD_FAMILIES)
    names = [n.strip() for n in which.split(",") if n.strip()]
    every = {**OLD_FAMILIES, **new}
    unknown = [n for n in names if n not in every]
    if unknown or not names:
        raise SystemExit(f"--families: unknown {unknown or which!r}; choose all, new, old or from {', '.join(every)}")
    return {n: every[n] for n in names}


def make_case(seed: int, index: int, workdir: Path, which: str = "all") -> tuple[str, list[str]]:
    """Write case `index` of campaign `seed` into workdir (the case's working directory); return its family and
    argv."""
    rng = random.Random(f"{seed}:{index}")
    (workdir / "models").symlink_to(ROOT / "models")
    weights = families(which)
    family = rng.choices(list(weights), weights=list(weights.values()))[0]
    return family, _make(family, rng, workdir)


def _make(family: str, rng: random.Random, workdir: Path) -> list[str]:
    import fuzz_surfaces
    import fuzzing
    from stepnet.io import proto

    if family in fuzz_surfaces.FAMILIES:
        return fuzz_surfaces.make_case(family, rng, workdir)
    donors = [fuzzing.read(p) for p in fuzzing.BINARY_MODELS[:2] + fuzzing.TEXT_MODELS[:3]]
    if family == "model-bytes":
        seed_file = rng.choice(fuzzing.BINARY_MODELS + fuzzing.TEXT_MODELS)
        name = "model" + Path(seed_file).suffix
        (workdir / name).write_bytes(fuzzing.mutate_bytes(rng, fuzzing.read(seed_file), donors))
        return _model_command(rng, name, seed_file)
    if family == "model-text":
        seed_file = rng.choice(fuzzing.TEXT_MODELS)
        text = fuzzing.mutate_text(rng, fuzzing.read(seed_file).decode())
        (workdir / "model.pbtxt").write_bytes(text.encode("utf-8", "surrogatepass"))
        return _model_command(rng, "model.pbtxt", seed_file)
    if family == "model-fields":
        seed_file = rng.choice(fuzzing.BINARY_MODELS + fuzzing.TEXT_MODELS)
        model = proto.load(ROOT / seed_file)
        fuzzing.edit_message(rng, model)
        data, suffix = fuzzing.serialize(rng, model)
        (workdir / f"model{suffix}").write_bytes(data)
        return _model_command(rng, f"model{suffix}", seed_file)
    if family == "minidb":
        return _minidb_case(rng, workdir)
    if family == "literal":
        return ["run", f"{XOR}/init_net.pbtxt", f"{XOR}/predict_net.pbtxt", "--feed",
                "X=" + fuzzing.random_literal(rng), "-q"]
    if family == "npy":
        npz = rng.random() < 0.5
        name = "feed.npz" if npz else "feed.npy"
        (workdir / name).write_bytes(fuzzing.npz_bytes(rng) if npz else fuzzing.npy_bytes(rng))
        feed = name if npz and rng.random() < 0.5 else f"X={name}"
        return ["run", f"{XOR}/init_net.pbtxt", f"{XOR}/predict_net.pbtxt", "--feed", feed, "-q"]
    if family == "one-op":   # a random op of the registry on small blobs, as a predict net fed from an .npz
        import numpy as np
        op, pool = fuzzing.random_op(rng)
        net = proto.NetDef(name="one_op", op=[op], external_output=list(op.output)[:1])
        np.savez(workdir / "pool.npz", **pool)
        data, suffix = fuzzing.serialize(rng, net)
        (workdir / f"net{suffix}").write_bytes(data)
        repeat = ["-n", "3"] if len(data) % 2 else []    # (three runs: the third compiled; no rng draw, so
        return ["run", f"net{suffix}", "--feed", "pool.npz", *repeat,   # earlier seeds' cases stay the same)
                *rng.choice([[], ["--device", "emulate"], ["--strict"], ["--check-nan"]])]
    if family == "image":
        (workdir / "photo.png").write_bytes(fuzzing.mutate_bytes(rng, fuzzing.read(f"{CRAYON}/photo.png")))
        return ["run", f"{CRAYON}/crayon_init.pb", f"{CRAYON}/crayon_predict.pb", "--feed",
                rng.choice(["photo.png:bgra", "photo.png", "data_int8_bgra=photo.png:bgra"]), "-q"]
    return _special_case(rng, workdir)


def _model_command(rng: random.Random, name: str, seed_file: str) -> list[str]:
    choice = rng.random()
    if choice < 0.3:
        return ["inspect", name, *rng.choice([[], ["--shapes"], ["--kind", "net"], ["--kind", "plan"]])]
    if choice < 0.4:
        return ["convert", name, rng.choice(["out.pb", "out.pbtxt"])]
    if "squeeze" in seed_file and choice < 0.7:
        if rng.random() < 0.5:
            return ["synth-init", name, "-o", "init.pb", "--input", "data=1,3,32,32", "--classes", "10"]
        return ["inspect", name, "--shapes", "--input", rng.choice(["data=1,3,32,32", "data=0,3,8,8", "data=1,3,1,1"])]
    if seed_file.endswith("init_net.pbtxt"):
        return ["run", name, f"{XOR}/predict_net.pbtxt", "--feed", "X=[[1, 0]]", "-q"]
    if seed_file.endswith("predict_net.pbtxt") and "xor" in seed_file:
        return ["run", f"{XOR}/init_net.pbtxt", name, "--feed", "X=[[1, 0]]", "-q"]
    if "crayon_predict" in seed_file:
        return ["run", f"{CRAYON}/crayon_init.pb", name, "--feed", f"{CRAYON}/photo.png:bgra", "-q"]
    return ["run", name, "-n", "1", "-q"]


def _minidb_case(rng: random.Random, workdir: Path) -> list[str]:
    import numpy as np

    import fuzzing
    from stepnet.io import minidb

    kind = rng.choice(["checkpoint", "dataset"])
    if kind == "checkpoint":
        seed_path = workdir / "seed.minidb"
        minidb.save_blobs(seed_path, {"X": np.array([[0, 1], [1, 0]], np.float32), "W1": np.ones((2, 2), np.float32),
                                      "name": b"text", "n": np.arange(5, dtype=np.int64)}, chunk_size=3)
        (workdir / "ckpt.minidb").write_bytes(fuzzing.mutate_minidb(rng, seed_path.read_bytes()))
        return ["run", f"{XOR}/init_net.pbtxt", f"{XOR}/predict_net.pbtxt", "--load", "ckpt.minidb", "-q"]
    # the digits plan reads models/digits/{train,test}.minidb by relative path: give it a tree with one mutated
    (workdir / "models").unlink()
    digits = workdir / "models" / "digits"
    digits.mkdir(parents=True)
    for f in ("train.pbtxt", "train.minidb", "test.minidb"):
        (digits / f).symlink_to(ROOT / "models" / "digits" / f)
    victim = rng.choice(["train.minidb", "test.minidb"])
    (digits / victim).unlink()
    (digits / victim).write_bytes(fuzzing.mutate_minidb(rng, (ROOT / "models" / "digits" / victim).read_bytes()))
    return ["run", "models/digits/train.pbtxt", "-n", "1", "-q"]


def _special_case(rng: random.Random, workdir: Path) -> list[str]:
    target = rng.choice(["/dev/zero", "/dev/null", "/dev/urandom", "fifo", ".", "/proc/self/status", "missing",
                         "link"])
    if target == "fifo":
        os.mkfifo(workdir / "fifo")
    if target == "link":
        (workdir / "link").symlink_to("/dev/zero")
    where = rng.choice(["model", "load", "feed-npy", "feed-npz", "image", "predict"])
    xor = [f"{XOR}/init_net.pbtxt", f"{XOR}/predict_net.pbtxt"]
    return {"model": ["run", target], "predict": ["run", xor[0], target],
            "load": ["run", f"{XOR}/plan.pbtxt", "--load", target, "-q"],
            "feed-npy": ["run", *xor, "--feed", f"X={target}.npy" if target[0] != "/" else f"X={target}"],
            "feed-npz": ["run", *xor, "--feed", f"{target}.npz"],
            "image": ["run", *xor, "--feed", f"X={target}.png" if target != "fifo" else "X=fifo"]}[where]


# ------------------------------------------------------------------------------------------- running
def run_case(argv: list[str], timeout: float) -> tuple[str, str]:
    """(status, detail) of one command line, in this process."""
    from stepnet.cli.run import main

    err = io.StringIO()

    def expire(signum, frame):
        raise CaseTimeout()
    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), warnings.catch_warnings():
            rc = main(argv)
    except CaseTimeout:
        return "hang", f"still running after {timeout} s"
    except SystemExit as e:   # argparse refusing the command line it was given
        return ("clean", "usage") if e.code == 2 else ("crash", f"SystemExit({e.code})")
    except BaseException as e:  # noqa: BLE001 - anything escaping main is a crash
        return "crash", "escaped main: " + "".join(traceback.format_exception_only(type(e), e)).strip()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip() and not ln.startswith("stepnet: warning")]
    last = lines[-1] if lines else ""
    if rc == 0:
        return "ran", last
    if len(lines) == 1 and last.startswith("stepnet: error: "):
        if WRAPPED.search(last):   # a kernel's Python exception, named by the executor's last resort
            return "wrapped", last
        return "clean", last
    return "crash", " | ".join(lines[-3:]) or f"exit status {rc} and nothing on stderr"


def worker(conn, seed: int, timeout: float, which: str) -> None:
    import resource

    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    import stepnet.cli.run  # noqa: F401 - imported once, before the first case's clock starts
    import fuzz_surfaces
    fuzz_surfaces.assets()   # built once per worker, before the first case's clock starts
    base = Path(tempfile.mkdtemp(prefix="stepnet-fuzz-"))
    while True:
        index = conn.recv()
        if index is None:
            break
        workdir = base / str(index)
        workdir.mkdir()
        os.chdir(workdir)
        family = "?"
        try:
            family, argv = make_case(seed, index, workdir, which)
            conn.send((index, "started", family, argv))   # so that a case the parent kills is still named
            status, detail = run_case(argv, timeout)
        except BaseException as e:  # noqa: BLE001 - a broken case generator is reported, not fatal
            argv, status, detail = ["?"], "crash", f"case generation failed: {e!r}"
        os.chdir(base)
        shutil.rmtree(workdir, ignore_errors=True)
        conn.send((index, status, detail, [family, *argv]))
    shutil.rmtree(base, ignore_errors=True)


class Worker:
    def __init__(self, seed: int, timeout: float, which: str):
        self.conn, child = mp.Pipe()
        self.proc = mp.get_context("fork").Process(target=worker, args=(child, seed, timeout, which), daemon=True)
        self.proc.start()
        self.index, self.started, self.argv = None, 0.0, ["?"]

    def give(self, index: int) -> None:
        self.index, self.started, self.argv = index, time.monotonic(), ["?"]
        self.conn.send(index)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()


def campaign(seed: int, cases: int, workers: int, timeout: float, examples: int, which: str = "all") -> dict:
    counts: Counter = Counter()
    by_family: dict[str, Counter] = {}
    samples: dict[str, list] = {"crash": [], "hang": [], "wrapped": []}
    pool = [Worker(seed, timeout, which) for _ in range(workers)]
    todo = list(range(cases))
    started = time.monotonic()
    done, shown = 0, 0
    while done < cases:
        for w in pool:
            if w.index is None and todo:
                w.give(todo.pop(0))
        ready = multiprocessing.connection.wait([w.conn for w in pool if w.index is not None], timeout=1.0)
        for w in list(pool):
            if w.index is None:
                continue
            status = None
            if w.conn in ready:
                try:
                    index, status, detail, argv = w.conn.recv()
                except EOFError:
                    index, status, detail, argv = w.index, "crash", "the worker died", w.argv
                if status == "started":
                    w.argv = [detail, *argv]
                    continue
            elif time.monotonic() - w.started > timeout + 15:
                index, status, detail, argv = w.index, "hang", f"no answer after {timeout + 15} s", w.argv
            if status is None:
                continue
            counts[status] += 1
            by_family.setdefault(argv[0] if argv else "?", Counter())[status] += 1
            done += 1
            if status in samples and len(samples[status]) < examples:
                samples[status].append((index, argv, detail))
            if detail in ("the worker died", f"no answer after {timeout + 15} s"):
                w.kill()
                pool[pool.index(w)] = Worker(seed, timeout, which)
            else:
                w.index = None
        if done // 1000 > shown:
            shown = done // 1000
            print(f"  {done} cases, {time.monotonic() - started:.0f} s: {dict(counts)}", flush=True)
    for w in pool:
        w.conn.send(None)
        w.proc.join(5)
    return {"counts": counts, "families": by_family, "samples": samples, "seconds": time.monotonic() - started}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds a case may run before it is a hang")
    p.add_argument("--examples", type=int, default=5, help="cases shown per non-clean class")
    p.add_argument("--only", type=int, help="run just this case (in this process) and show it")
    p.add_argument("--keep", metavar="DIR", help="with --only: write the case's files here and keep them")
    p.add_argument("--families", default="all", help="all (default), new (the newer surfaces), old, or a "
                   "comma-separated list of family names")
    a = p.parse_args(argv)
    if a.only is not None:
        workdir = Path(a.keep or tempfile.mkdtemp(prefix="stepnet-case-")).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        os.chdir(workdir)
        family, args = make_case(a.seed, a.only, workdir, a.families)
        print(f"case {a.only} of seed {a.seed} ({family}) in {workdir}: stepnet {' '.join(args)}")
        print(*run_case(args, a.timeout), sep=": ")
        return 0
    print(f"fuzz campaign: {a.cases} cases, seed {a.seed}, {a.workers} workers, timeout {a.timeout} s, families "
          f"{a.families}")
    result = campaign(a.seed, a.cases, a.workers, a.timeout, a.examples, a.families)
    c = result["counts"]
    print(f"\n{a.cases} cases in {result['seconds']:.0f} s: clean errors {c['clean']}, ran {c['ran']}, "
          f"crashes {c['crash']}, hangs {c['hang']}, wrapped kernel exceptions {c['wrapped']}  (seed {a.seed})")
    for family, fc in sorted(result["families"].items()):
        print(f"  {family:<16} clean {fc['clean']:>5}  ran {fc['ran']:>5}  crashes {fc['crash']:>4}  "
              f"hangs {fc['hang']:>4}  wrapped {fc['wrapped']:>4}")
    for status, cases in result["samples"].items():
        for index, args, detail in cases:
            print(f"  {status}: case {index} (--seed {a.seed} --only {index} --families {a.families}): "
                  f"[{args[0]}] stepnet {' '.join(args[1:])[:200]}\n"
                  f"      {detail[:400]}")
    return 1 if c["crash"] or c["hang"] or c["wrapped"] else 0


if __name__ == "__main__":
    sys.exit(main())
