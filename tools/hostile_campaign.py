"""Hostile campaign (#24): new mutators over five surfaces, every case run through the command line in a fresh
process forked from a worker that imported stepnet once, in a fresh case folder as its working directory.

    python tools/hostile_campaign.py                                   # 10,000 cases, seed 1, 2 workers
    python tools/hostile_campaign.py --cases 3000 --seed 7 --surfaces proto,ops
    python tools/hostile_campaign.py --seed 7 --only 123               # one case again, shown in full
    python tools/hostile_campaign.py --seed 7 --only 123 --keep /tmp/c # ... its files kept under /tmp/c

Surfaces (tools/hostile_*.py, each a family of mutators written for this campaign):
  proto        structure-aware protobuf edits through the descriptors (hostile_proto.py; the models it starts
               from: hostile_models.py)
  ops          the op argument storm: 1-3 ops of every registered type, adversarial inputs and arguments
               (hostile_ops.py)
  checkpoints  hostile --resume / --load minidb files (hostile_data.py)
  feeds        --feed .npy/.npz files, literals and images (hostile_feeds.py)
  paths        db paths of Save/Checkpoint/Load/CreateDB/DBExists built to escape or to write what no model
               may write (hostile_paths.py)

A case is a pure function of (seed, index): --only reproduces it. Every case gets --max-blob-bytes 64M where
its command takes the flag. Outcomes:
  clean        exit 1 with a `stepnet: error:` line and no internal error
  ran          exit 0
  usage        argparse refused the command line (exit 2)
  wrapped      a clean line that is the executor's last resort naming a kernel's stray exception
  crash        an internal error, an exception escaping main, a child dead by a signal, any other exit
  hang         still running after --timeout seconds (killed with its process group)
  over-memory  a MemoryError (the child's address space is capped at 3 GiB above the worker's), an array "of
               impossible size", a blob stored larger than 64M (every Blob.value store is watched) by a
               command that takes --max-blob-bytes, or a peak RSS more than RSS_MARGIN x 64M (512 MiB) above
               the RSS the child was forked with
  policy       a file written, changed or removed outside the case folder (a per-worker `outside` folder with
               a db holding a sentinel, symlinks point there) or outside the file root, a forbidden write
               inside it (hidden, Python environment, a suffix that is not a db's, a build file name, a file
               that was not a db or empty, a db from before the run without --overwrite), the sentinel
               printed (a read outside the root), or a one-op read outside the root that exited 0
Not collected by pytest (tools/ is not a test path).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import random
import re
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import hostile_env  # noqa: E402 - after the path above

warnings.filterwarnings("ignore", "Duplicate name", UserWarning)   # .npz members named twice on purpose

LIMIT, LIMIT_BYTES = "64M", 64 << 20
RSS_MARGIN = 8                       # peak RSS may pass the RSS at fork by this many max-blob-bytes
AS_HEADROOM = 3 << 30                # address space a case may add to the worker's
FSIZE = 1 << 30                      # the largest file a case may write
CLASSES = ["clean", "ran", "usage", "wrapped", "crash", "hang", "over-memory", "policy"]
BAD = {"wrapped", "crash", "hang", "over-memory", "policy"}
WRAPPED = re.compile(r"\) failed: [A-Za-z]*(Error|Exception|error)\b:")


def surfaces(which: str) -> dict:
    import hostile_data
    import hostile_feeds
    import hostile_ops
    import hostile_paths
    import hostile_proto

    every = {"proto": (30, hostile_proto.make), "ops": (30, hostile_ops.make),
             "checkpoints": (12, hostile_data.make_checkpoint), "feeds": (14, hostile_feeds.make_feed),
             "paths": (14, hostile_paths.make)}
    names = list(every) if which == "all" else [n.strip() for n in which.split(",") if n.strip()]
    unknown = [n for n in names if n not in every]
    if unknown or not names:
        raise SystemExit(f"--surfaces: unknown {unknown or which!r}; choose all or from {', '.join(every)}")
    return {n: every[n] for n in names}


def make_case(seed: int, index: int, env, which: str):
    """Case `index` of campaign `seed`, its files written into a fresh case folder of env."""
    rng = random.Random(f"hostile:{seed}:{index}")
    table = surfaces(which)
    name = rng.choices(list(table), weights=[w for w, _ in table.values()])[0]
    case = env.new_case(index, name)
    table[name][1](rng, case)
    case.finish(LIMIT)
    return case


# ------------------------------------------------------------------------------------------- one case
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _vm() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _watch_blobs(result: dict) -> None:
    """Every store into a Blob's value is measured: the largest is reported."""
    from stepnet.runtime.workspace import Blob

    slot = Blob.__dict__["value"]

    def size(v) -> int:
        if isinstance(v, (bytes, str)):
            return len(v)
        n = getattr(v, "nbytes", None)
        if isinstance(n, int):
            return n
        data = getattr(v, "data", None)    # an Int8Tensor
        return getattr(data, "nbytes", 0) if not isinstance(data, memoryview) else 0

    class Watched:
        def __get__(self, obj, cls=None):
            return self if obj is None else slot.__get__(obj, cls)

        def __set__(self, obj, value):
            n = size(value)
            if n > result["max_blob"]:
                result["max_blob"], result["max_blob_name"] = n, str(obj.name)[:80]
            slot.__set__(obj, value)

    Blob.value = Watched()


def _child(case, w: int, timeout: float, vm: int) -> None:
    """The forked child: run the case's command line, report (rc, exception, largest blob) through w."""
    result = {"rc": None, "exc": None, "max_blob": 0, "max_blob_name": ""}
    try:
        os.setpgid(0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (vm + AS_HEADROOM, vm + AS_HEADROOM))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ["HOME"] = str(case.env.outside / "home")
        os.environ["STEPNET_CACHE_DIR"] = str(case.env.io / "cache")   # the tool's own cache: not a model's write
        for fd, name in ((1, "stdout"), (2, "stderr")):
            out = os.open(case.env.io / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        os.chdir(case.dir)
        import faulthandler
        tb = open(case.env.io / "traceback", "w")
        faulthandler.dump_traceback_later(max(1.0, timeout - 2), file=tb)
        _watch_blobs(result)
        from stepnet.cli.run import main
        try:
            result["rc"] = main(case.argv)
        except SystemExit as e:
            result["rc"] = "usage" if e.code == 2 else f"SystemExit({e.code!r})"
        except BaseException as e:  # noqa: BLE001 - anything escaping main is a crash
            result["exc"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
        faulthandler.cancel_dump_traceback_later()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException as e:  # noqa: BLE001
        result["exc"] = f"harness: {e!r}"
    try:
        os.write(w, json.dumps(result).encode())
    finally:
        os._exit(0)


def run_case(case, timeout: float) -> dict:
    """Fork, run, classify: {"class", "detail", ...}."""
    env = case.env
    before = env.snapshot()
    r, w = os.pipe()
    rss, vm = _rss(), _vm()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(case, w, timeout, vm)
    os.close(w)
    data, hung, deadline = b"", False, time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            hung = True
            break
        ready, _, _ = select.select([r], [], [], left)
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    if hung:
        for target in (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.close(r)
    _, status, usage = os.wait4(pid, 0)
    if not hung:   # a process the case started (dot) still in its group
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    result = json.loads(data) if data else {}
    result.update(status=status, growth=usage.ru_maxrss * 1024 - rss, hung=hung)
    result["stderr"] = env.read_io("stderr", 200_000)
    result["stdout_tail"] = env.read_io("stdout", 1_000_000, tail=True)
    result["traceback"] = env.read_io("traceback", 20_000) if hung else ""
    result["violations"] = env.violations(case, before, hung)
    return classify(case, result)


def classify(case, res: dict) -> dict:
    err, rc = res["stderr"], res.get("rc")
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("stepnet: warning")]
    errors = [ln for ln in lines if ln.startswith("stepnet: error: ")]
    internal = [ln for ln in lines if ln.startswith("stepnet: internal error") or ln.startswith("Traceback")]
    memory = []
    if "MemoryError" in err or "MemoryError" in (res.get("exc") or ""):
        memory.append("MemoryError")
    if "of impossible size" in err:
        memory.append("an array of impossible size")
    if res["growth"] > RSS_MARGIN * LIMIT_BYTES:
        memory.append(f"peak RSS {res['growth'] >> 20} MiB above the fork's")
    if case.argv[0] in ("run", "inspect", "export-predict") and res.get("max_blob", 0) > LIMIT_BYTES:
        memory.append(f"blob {res['max_blob_name']!r} of {res['max_blob']} bytes stored")
    detail = (errors or internal or lines or [""])[-1][:400]
    if res["violations"]:
        cls, detail = "policy", "; ".join(res["violations"])[:600]
    elif memory:
        cls, detail = "over-memory", ", ".join(memory) + " | " + detail
    elif res["hung"]:
        tb = res["traceback"].strip().splitlines()
        cls, detail = "hang", " / ".join(tb[-6:])[-600:] or "no traceback"
    elif res.get("exc"):
        cls, detail = "crash", "escaped main: " + res["exc"].strip().splitlines()[-1][:400]
    elif rc is None:
        cls, detail = "crash", f"child died: wait status {res['status']:#x} (signal {res['status'] & 0x7f}) | " + detail
    elif rc == 0:
        cls = "ran"
    elif rc == "usage":
        cls = "usage"
    elif rc == 1 and errors and not internal:
        cls = "wrapped" if WRAPPED.search(errors[-1]) else "clean"
    else:
        cls, detail = "crash", f"exit {rc}: " + " | ".join((internal or lines)[-3:])[:500]
    if cls == "ran" and case.expect_refusal:
        cls, detail = "policy", f"exited 0, but {case.expect_refusal}"
    return {"class": cls, "detail": detail, "stderr": err, "growth": res["growth"],
            "max_blob": res.get("max_blob", 0)}


# ------------------------------------------------------------------------------------------- campaign
def worker(conn, seed: int, timeout: float, which: str) -> None:
    import stepnet.cli.run  # noqa: F401 - imported once; every case's child is forked from here
    import stepnet.export.onnx  # noqa: F401
    env = hostile_env.Env(Path(tempfile.mkdtemp(prefix="stepnet-hostile-")))
    while True:
        index = conn.recv()
        if index is None:
            break
        try:
            case = make_case(seed, index, env, which)
            conn.send((index, "started", case.surface, case.argv))
            out = run_case(case, timeout)
            conn.send((index, out["class"], out["detail"], [case.surface, *case.argv], out["growth"]))
        except BaseException:  # noqa: BLE001 - a broken generator is reported, not fatal
            conn.send((index, "generator", traceback.format_exc()[-800:], ["?"], 0))
        env.end_case()
    env.close()


class Worker:
    def __init__(self, seed, timeout, which):
        self.conn, child = mp.Pipe()
        self.proc = mp.get_context("fork").Process(target=worker, args=(child, seed, timeout, which), daemon=True)
        self.proc.start()
        self.index, self.started, self.argv = None, 0.0, ["?"]

    def give(self, index):
        self.index, self.started, self.argv = index, time.monotonic(), ["?"]
        self.conn.send(index)


def campaign(a) -> tuple[dict, list, float]:
    by_surface: dict[str, Counter] = {}
    bad: list = []
    growths: list = []
    pool = [Worker(a.seed, a.timeout, a.surfaces) for _ in range(a.workers)]
    todo, done, shown, start = list(range(a.start, a.start + a.cases)), 0, 0, time.monotonic()
    while done < a.cases:
        for w in pool:
            if w.index is None and todo:
                w.give(todo.pop(0))
        ready = multiprocessing.connection.wait([w.conn for w in pool if w.index is not None], timeout=1.0)
        for i, w in enumerate(pool):
            if w.index is None:
                continue
            msg = None
            if w.conn in ready:
                try:
                    msg = w.conn.recv()
                except EOFError:
                    msg = (w.index, "crash", "the worker died", w.argv, 0)
                if msg[1] == "started":
                    w.argv = [msg[2], *msg[3]]
                    continue
            elif time.monotonic() - w.started > a.timeout + 120:
                msg = (w.index, "hang", "the worker gave no answer", w.argv, 0)
            if msg is None:
                continue
            index, cls, detail, argv, growth = msg
            by_surface.setdefault(argv[0], Counter())[cls] += 1
            growths.append((growth, index))
            if cls in BAD or cls in ("generator", "usage"):
                bad.append((index, cls, argv, detail))
                print(f"  {cls}: --seed {a.seed} --only {index} [{argv[0]}] stepnet {' '.join(argv[1:])[:160]}\n"
                      f"      {detail[:300]}", flush=True)
            done += 1
            if detail in ("the worker died", "the worker gave no answer"):
                w.proc.kill()
                pool[i] = Worker(a.seed, a.timeout, a.surfaces)
            else:
                w.index = None
        if done // 500 > shown:
            shown = done // 500
            total = sum(by_surface.values(), Counter())
            print(f"  {done} cases, {time.monotonic() - start:.0f} s: {dict(total)}", flush=True)
    for w in pool:
        w.conn.send(None)
        w.proc.join(10)
    growths.sort(reverse=True)
    return by_surface, bad, time.monotonic() - start, growths[:5]


def table(by_surface: dict) -> str:
    cols = CLASSES + sorted({c for fc in by_surface.values() for c in fc} - set(CLASSES))
    rows = [f"  {'surface':<12}" + "".join(f"{c:>12}" for c in cols) + f"{'total':>9}"]
    total = Counter()
    for name, fc in sorted(by_surface.items()):
        total.update(fc)
        rows.append(f"  {name:<12}" + "".join(f"{fc[c]:>12}" for c in cols) + f"{sum(fc.values()):>9}")
    rows.append(f"  {'all':<12}" + "".join(f"{total[c]:>12}" for c in cols) + f"{sum(total.values()):>9}")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--start", type=int, default=0, help="the first case index (default 0)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a case may run before it is a hang")
    p.add_argument("--surfaces", default="all", help="all, or a comma-separated list of surfaces")
    p.add_argument("--only", type=int, help="run just this case and show it")
    p.add_argument("--keep", metavar="DIR", help="with --only: build the case under DIR and keep its files")
    a = p.parse_args(argv)
    if a.only is not None:
        base = Path(a.keep).resolve() if a.keep else Path(tempfile.mkdtemp(prefix="stepnet-hostile-case-"))
        base.mkdir(parents=True, exist_ok=True)
        env = hostile_env.Env(base)
        case = make_case(a.seed, a.only, env, a.surfaces)
        print(f"case {a.only} of seed {a.seed} ({case.surface}) in {case.dir}:\n  stepnet {' '.join(case.argv)}")
        out = run_case(case, a.timeout)
        print(f"{out['class']}: {out['detail']}\npeak RSS growth {out['growth'] >> 20} MiB, largest blob "
              f"{out['max_blob']} bytes\n--- stderr ---\n{out['stderr'][-4000:]}")
        if not a.keep:
            env.end_case()
            env.close()
        return 0
    print(f"hostile campaign: {a.cases} cases from {a.start}, seed {a.seed}, {a.workers} workers, timeout "
          f"{a.timeout} s, --max-blob-bytes {LIMIT}, address space +{AS_HEADROOM >> 30} GiB, RSS margin "
          f"{RSS_MARGIN} x {LIMIT}, surfaces {a.surfaces}", flush=True)
    by_surface, bad, seconds, growths = campaign(a)
    print(f"\n{a.cases} cases in {seconds:.0f} s (seed {a.seed}):\n{table(by_surface)}")
    print("  largest peak RSS growths: " + ", ".join(f"case {i}: {g >> 20} MiB" for g, i in growths))
    return 1 if any(cls in BAD for _, cls, _, _ in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
