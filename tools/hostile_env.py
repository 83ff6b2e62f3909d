"""The hostile campaign's places (tools/hostile_campaign.py): per worker a base folder holding
  outside/   what no case may change: a text file, a db holding the sentinel blob `secret` (31337), a fake home
             with a .bashrc, a Python environment (pyvenv.cfg, site-packages); symlinks in case folders point here
  assets/    data and checkpoints built once (models/ with the digits and binary-adder data, ckpt/ with
             checkpoints of the xor, digits and adder plans: finished, and taken at the first iteration boundary)
  cases/N/   the case folder: the working directory of case N and its default file root
  io/        the child's stdout, stderr and hang traceback
and the policy check: a snapshot of the base before and after a case, and the rules its changes must keep.

    python tools/hostile_env.py --assets DIR    # (run by Env in a subprocess: builds assets/ in DIR)
"""
from __future__ import annotations

import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ["models/digits/train.minidb", "models/digits/test.minidb", "models/binary_adder/train.minidb",
        "models/binary_adder/test.minidb"]
MODELS = ["models/xor/plan.pbtxt", "models/xor/init_net.pbtxt", "models/xor/predict_net.pbtxt",
          "models/digits/train.pbtxt", "models/binary_adder/binary_adder.pbtxt"]
SENTINEL = 31337
# The write rules, restated here (not imported) so that the check is independent of the code it checks.
DB_SUFFIXES = {"", ".minidb", ".db", ".ckpt", ".checkpoint", ".pb", ".bin", ".dat", ".data", ".mdb", ".lmdb",
               ".leveldb", ".ldb", ".snapshot", ".model", ".weights", ".save"}
RUN_NAMES = {"makefile", "gnumakefile", "dockerfile", "containerfile", "vagrantfile", "rakefile", "gemfile",
             "justfile", "procfile", "brewfile", "jenkinsfile", "sconstruct", "sconscript", "configure", "build",
             "workspace", "pipfile", "snakefile", "tiltfile", "earthfile", "caddyfile"}


def minidb_bytes(blobs: dict) -> bytes:
    """A minidb file of {name: numpy array} (through stepnet's serializer)."""
    from stepnet.io import minidb
    return minidb.pack_records(r for name, v in blobs.items() for r in minidb.serialize_blob(name, v))


def is_minidb(data: bytes) -> bool:
    """Records that cover the file exactly (Caffe2's layout), read without stepnet."""
    pos = 0
    while pos < len(data):
        if len(data) - pos < 8:
            return False
        k, v = struct.unpack_from("<ii", data, pos)
        if k <= 0 or v <= 0 or pos + 8 + k + v > len(data):
            return False
        pos += 8 + k + v
    return bool(data)


def _library_file_of_a_db(path: Path) -> bool:
    """A file lmdb or leveldb made inside the db directory a model named (the directory meets the rules as a
    write of its own; the names inside it are the library's: data.mdb, CURRENT, 000003.log, ...)."""
    from stepnet.io import kvdb
    parent, name = path.parent, path.name
    if name in kvdb.LMDB_FILES:
        return (parent / "data.mdb").exists()
    return kvdb.is_leveldb_file(name) and kvdb.looks_like(str(parent), "leveldb")


class Case:
    """One case: its folder, command line, the files its command line writes, what it must refuse."""

    def __init__(self, env, index: int, surface: str):
        self.env, self.index, self.surface = env, index, surface
        self.dir = env.cases / str(index)
        self.dir.mkdir(parents=True)
        self.argv: list[str] = []
        self.outputs: list[str] = []
        self.expect_refusal = ""     # what a run that exits 0 would have done wrong (a read outside the root)

    def write(self, name: str, data: bytes | str) -> str:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
        return name

    def link(self, *relative: str) -> None:
        """Hard links of asset files at the same relative paths (models/digits/train.minidb, ...)."""
        for rel in relative:
            (self.dir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(self.env.assets / rel, self.dir / rel)

    def finish(self, limit: str) -> None:
        argv = self.argv
        if argv[0] in ("run", "inspect", "export-predict") and "--max-blob-bytes" not in argv:
            argv += ["--max-blob-bytes", limit]
        flags = {"run": ("--checkpoint", "--save", "--save-image", "--metrics")}.get(argv[0], ("-o", "--output",
                                                                                              "--output-file"))
        for i, word in enumerate(argv[:-1]):
            if word in flags:
                self.outputs.append(argv[i + 1].split(":")[0] if word == "--save-image" else argv[i + 1])
        if argv[0] == "convert" and len(argv) > 2:
            self.outputs.append(argv[2])
        if argv[0] == "draw":     # without Graphviz's dot, a picture's dot text goes to OUT with suffix .dot
            self.outputs += [os.path.splitext(o)[0] + ".dot" for o in self.outputs]
        self.any_path = "--allow-any-path" in argv
        self.overwrite = "--overwrite" in argv or argv[0] != "run"
        root = argv[argv.index("--file-root") + 1] if "--file-root" in argv[:-1] else "."
        self.root = os.path.realpath(self.dir / root)


class Env:
    def __init__(self, base: Path):
        self.base = base.resolve()
        self.outside, self.assets, self.io, self.cases = (self.base / n for n in ("outside", "assets", "io", "cases"))
        for d in (self.io, self.cases):
            d.mkdir(parents=True, exist_ok=True)
        self.build_outside()
        if not (self.assets / "ok").exists():
            subprocess.run([sys.executable, __file__, "--assets", str(self.assets)], check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
        self.case = None
        self.dirty = False

    def build_outside(self) -> None:
        shutil.rmtree(self.outside, ignore_errors=True)
        o = self.outside
        for d in ("home", "dir", "venv/lib/python3/site-packages", "sub"):
            (o / d).mkdir(parents=True)
        (o / "victim.txt").write_text("precious\n")
        (o / "home" / ".bashrc").write_text("# precious\n")
        ort = o / "home/.cache/Microsoft/DeveloperTools/.onnxruntime"   # onnxruntime's import writes it if missing
        ort.mkdir(parents=True)
        (ort / "deviceid").write_text("00000000-0000-4000-8000-000000000000")
        (o / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
        import numpy as np
        (o / "secret.minidb").write_bytes(minidb_bytes({"secret": np.array([SENTINEL], np.int64)}))
        (o / "sub" / "old.minidb").write_bytes((o / "secret.minidb").read_bytes())

    def new_case(self, index: int, surface: str) -> Case:
        self.case = Case(self, index, surface)
        return self.case

    def end_case(self) -> None:
        if self.case is not None:
            shutil.rmtree(self.case.dir, ignore_errors=True)
            if self.case.dir.exists():     # a folder a case made unwritable
                subprocess.run(["chmod", "-R", "u+rwx", str(self.case.dir)], check=False)
                shutil.rmtree(self.case.dir, ignore_errors=True)
        for stray in self.cases.iterdir():
            shutil.rmtree(stray, ignore_errors=True) if stray.is_dir() and not stray.is_symlink() else stray.unlink()
        if self.dirty:
            self.build_outside()
            self.dirty = False
        self.case = None

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def read_io(self, name: str, limit: int, tail: bool = False) -> str:
        try:
            with open(self.io / name, "rb") as f:
                if tail:
                    f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
                return f.read(limit).decode("utf-8", "replace")
        except OSError:
            return ""

    # --------------------------------------------------------------------------------------- the policy
    def snapshot(self) -> dict:
        out = {}
        for top, dirs, files in os.walk(self.base):
            if Path(top) == self.base:
                dirs[:] = [d for d in dirs if d != "io"]
            if Path(top) == self.outside / "home/.cache":   # onnxruntime's own files (its device id, a db)
                dirs[:] = [d for d in dirs if d != "Microsoft"]
            for name in dirs + files:
                path = os.path.join(top, name)
                st = os.lstat(path)
                kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else \
                    "file" if stat.S_ISREG(st.st_mode) else "special"
                replaceable = False
                if kind == "file" and st.st_size <= 16 << 20:
                    try:
                        data = Path(path).read_bytes()
                        replaceable = not data or is_minidb(data)
                    except OSError:
                        pass
                out[os.path.relpath(path, self.base)] = (kind, st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode,
                                                         replaceable, kind == "file" and st.st_size > 0)
        return out

    def violations(self, case: Case, before: dict, hung: bool) -> list[str]:
        after = self.snapshot()
        case_rel = os.path.relpath(case.dir, self.base)
        out = []
        for rel in sorted(set(before) | set(after)):
            b, a = before.get(rel), after.get(rel)
            if b is not None and a is not None and b[:5] == a[:5]:
                continue
            if b is not None and a is not None and b[0] == a[0] == "dir":
                continue              # a folder whose entries changed: its entries are judged
            inside = rel == case_rel or rel.startswith(case_rel + os.sep)
            sub = os.path.relpath(rel, case_rel) if inside else None
            if inside and self._output(sub, case.outputs, hung):
                continue
            why = self._judge(case, self.base / rel, b, a)
            if why:
                out.append(f"{rel!r} {'new' if b is None else 'removed' if a is None else 'changed'}: {why}")
                if not inside:
                    self.dirty = True
        if case.env.outside.exists() and str(SENTINEL) in self.read_io("stdout", 1_000_000, tail=True) and \
                str(SENTINEL) not in " ".join(case.argv) and "--allow-any-path" not in case.argv:   # the user's choice
            out.append(f"the sentinel {SENTINEL} of {self.outside}/secret.minidb was printed: a read outside the root")
        return out

    @staticmethod
    def _output(sub: str, outputs: list[str], hung: bool) -> bool:
        name = os.path.basename(sub)
        if hung and name.startswith(".") and name.endswith(".tmp"):
            return True
        for o in outputs:
            o = os.path.normpath(o)
            if sub == o or sub.startswith(o + os.sep) or (sub.startswith(o) and sub[len(o):].startswith(".")):
                return True
        return False

    def _judge(self, case: Case, path: Path, b, a) -> str | None:
        if a is None:
            return "a file or folder from before the run was removed"
        if a[0] == "link":
            return "a symbolic link was made"
        real = str(path)
        under = real == case.root or real.startswith(case.root + os.sep)
        if not under and not case.any_path:
            return f"written outside the file root {case.root}"
        parts = os.path.relpath(real, case.root).split(os.sep) if under else real.split(os.sep)
        parts = [p for p in parts if p not in ("", ".")]
        if any(p.startswith(".") for p in parts):
            return "hidden"
        if any(p.lower() in ("site-packages", "dist-packages", "__pycache__") for p in parts[:-1]):
            return "in a Python package folder"
        up = path.parent
        while up != up.parent:
            if (up / "pyvenv.cfg").exists() and (up / "pyvenv.cfg") != path:
                return f"in a Python environment ({up})"
            up = up.parent
        if a[0] == "dir" or _library_file_of_a_db(path):
            return None
        name = path.name
        stem, suffix = os.path.splitext(name)
        if name.lower() in RUN_NAMES or (stem.lower() in RUN_NAMES and suffix.lower() in ("", ".txt", ".in", ".am")):
            return "a build file name"
        if suffix.lower() not in DB_SUFFIXES and not suffix[1:].isdigit():
            return f"suffix {suffix!r} is not a db's"
        if b is not None:
            if b[0] != "file":
                return f"replaced a {b[0]}"
            if not b[5]:
                return "replaced a file that was not a db nor empty"
            if b[6] and not case.overwrite:
                return "replaced a db from before the run without --overwrite"
        return None


# ------------------------------------------------------------------------------------------- assets
def build_assets(d: Path) -> None:
    """Data, model copies and checkpoints (run once per worker, in its own process)."""
    import contextlib
    import io

    from stepnet import Workspace
    from stepnet.cli.run import main
    from stepnet.core.limits import Limits
    from stepnet.io import checkpoints, proto

    for rel in DATA + MODELS:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, d / rel)
    (d / "ckpt").mkdir(exist_ok=True)
    os.chdir(d)
    with contextlib.redirect_stdout(io.StringIO()):
        for name, plan in (("digits", "models/digits/train.pbtxt"),
                           ("adder", "models/binary_adder/binary_adder.pbtxt")):
            saver = checkpoints.Checkpointer(f"ckpt/{name}_mid.minidb", 1)
            saver.interrupted = True
            try:
                Workspace(seed=0, limits=Limits(file_root=d)).run_plan(proto.load(plan), boundary=saver)
            except checkpoints.Interrupted:
                pass
            if main(["run", plan, "-q", "-n", "1", "--checkpoint", f"ckpt/{name}_done.minidb"]) != 0:
                raise RuntimeError(f"building {name}_done failed")
        if main(["run", "models/xor/plan.pbtxt", "-q", "--checkpoint", "ckpt/xor_done.minidb"]) != 0:
            raise RuntimeError("building xor_done failed")
    (d / "ok").write_text("")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--assets"]:
        build_assets(Path(sys.argv[2]))
