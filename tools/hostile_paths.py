"""Surface 5 of the hostile campaign: the db paths of Save, Checkpoint (Snapshot), Load, CreateDB (+ a reader
op) and DBExists, built to escape the file root (.., absolute paths with and without absolute_path, symlinks
planted in the case folder that point outside, to a file, a folder, nowhere or themselves) or to write what no
model may (hidden names and folders, a folder holding pyvenv.cfg, site-packages, .pth/.py/.so and other code
suffixes, build file names, names over 255 bytes and paths over 4096, % patterns and {rank} placeholders,
controls and NULs), over files that are there already and are not dbs (a text file, a model, a folder, a FIFO,
a symlink), with odd db types; run as a net, an init/predict pair or a plan looping a Checkpoint, with or
without --file-root, --allow-any-path and --overwrite, or through the export commands (which may write
nothing). A one-op read of a path outside the root that exits 0 is a policy violation."""
from __future__ import annotations

import os
import random

import numpy as np

from stepnet.io import proto

import hostile_values as hv
from hostile_env import minidb_bytes

INSIDE = ["x.minidb", "sub/deep/er/x.minidb", "./x.db", "x", "ckpt.0001", "x.minidb/", "a b.minidb", "\u00e9.db",
          "in.ckpt", "x.minidb\n", "-o.minidb", "x.MINIDB"]
ESCAPES = ["../x.minidb", "../../x.minidb", "sub/../../x.minidb", "../cases/x.minidb", "..", "../../outside/new.minidb",
           "../../outside/secret.minidb", "../../outside/sub/old.minidb", "./../x.db", "sub/../../../x.minidb"]
FORBIDDEN = [".git/x.minidb", ".hidden.minidb", "a/.b/c.minidb", ".venv/x.minidb", "...minidb", "..minidb",
             "env/lib/x.minidb", "lib/python3/site-packages/evil.pth", "site-packages/x.minidb", "__pycache__/x.db",
             "dist-packages/x.db", "evil.pth", "evil.py", "evil.so", "x.sh", "x.pyc", "Makefile", "x.minidb.py",
             "setup.cfg", "x.toml", "conftest.py", "sitecustomize.py", "usercustomize.pth", "x.PTH", "x.Py",
             "Dockerfile.txt", "configure", ".bashrc", "x.desktop", "x.minidb;rm", "x.json", "BUILD"]
LONG = ["a" * 255 + ".minidb", "a" * 248 + ".minidb", "d/" * 2100 + "x.minidb", "\u00e9" * 125 + ".db"]
PATTERNS = ["ck%d.minidb", "ck%s.minidb", "%n%n.minidb", "%%.minidb", "ck%05d.minidb", "%(x)s.minidb",
            "%0100000000d.minidb", "%.99999999d.minidb", "%d%d.minidb", "%*d.minidb", "%c.minidb", "%x/%d.minidb",
            "{rank}.minidb", "{size}/x.minidb", "{rank:>999999}.minidb", "{0.__class__}.minidb",
            "{rank.__class__.__init__.__globals__}.minidb", "{}.minidb", "%d/../../x.minidb", "%255d.minidb",
            "%256d.minidb", "%1$d.minidb"]
SPECIAL = ["/dev/null", "/dev/full", "", " ", "\x00", "x\x00.minidb", "~/x.minidb", "$HOME/x.minidb",
           "file:///x.minidb", "C:\\x.minidb", ".", "/", "./", "//", "x/", "*", "?.minidb", "fifo.minidb",
           "existing_dir.minidb", "notes.minidb", "model.pb", "empty.db", "old.minidb", "inner_link.minidb"]
LINKS = ["link_dir/x.minidb", "link_dir/victim.txt", "link_file.minidb", "dangling.minidb", "loop.minidb",
         "link_up/x.minidb", "link_home/.bashrc", "link_home/x.minidb", "link_venv/x.minidb",
         "link_venv/lib/python3/site-packages/x.minidb", "link_dir", "link_sub/old.minidb"]
DB_TYPES = ["minidb"] * 6 + ["", "", "leveldb", "lmdb", "rocksdb", "../minidb", "MINIDB", "\x00", "minidb\x00",
                              "x" * 300]


def plant(rng: random.Random, case) -> None:
    """Symlinks to the outside, and files that are not dbs, in the case folder."""
    d, o = case.dir, case.env.outside
    links = {"link_dir": o / "dir", "link_file.minidb": o / "secret.minidb", "dangling.minidb": o / "nowhere",
             "loop.minidb": d / "loop.minidb", "link_up": d.parent, "link_home": o / "home", "link_venv": o / "venv",
             "link_sub": o / "sub", "inner_link.minidb": d / "old.minidb"}
    for name, target in links.items():
        os.symlink(target, d / name)
    case.write("notes.minidb", "my notes\n")
    case.write("model.pb", proto.NetDef(name="mine", op=[hv.op("Relu", ["x"], ["y"])]).SerializeToString())
    case.write("empty.db", b"")
    case.write("old.minidb", minidb_bytes({"old": np.ones(2, np.float32)}))
    case.write("env/pyvenv.cfg", "home = /usr\n")
    (d / "existing_dir.minidb").mkdir()
    os.mkfifo(d / "fifo.minidb")


def target(rng: random.Random, case) -> tuple[str, int]:
    """(db, absolute_path)."""
    group = rng.choice([INSIDE, ESCAPES, ESCAPES, FORBIDDEN, FORBIDDEN, LONG, PATTERNS, SPECIAL, SPECIAL, LINKS, LINKS,
                        "abs"])
    if group == "abs":
        o = case.env.outside
        db = str(rng.choice([o / "new.minidb", o / "victim.txt", o / "secret.minidb", o / "home/.bashrc",
                             o / "venv/lib/python3/site-packages/evil.pth", o / "venv/x.minidb", o / "sub/old.minidb",
                             o / "dir/x.minidb", case.dir / "abs_in.minidb", o / "dir"]))
        return db, rng.choice([1, 1, 0])
    return rng.choice(group), rng.choice([0, 0, 0, 1])


def fill_ops(names) -> list:
    return [hv.op("GivenTensorFill", [], [n], shape=[2], values=[1.0, 2.0]) for n in names] + \
        [hv.op("ConstantFill", [], ["iter"], shape=[1], value=0, dtype=10)]


def db_op(rng: random.Random, case, kind: str) -> tuple[list, str]:
    """The ops of one db access of `kind`, and whether it only reads."""
    db, absolute = target(rng, case)
    db_type = rng.choice(DB_TYPES)
    extra = rng.choice([{}, {}, {"strip_prefix": "a"}, {"blob_name_overrides": ["../x", ".hidden"]},
                        {"chunk_size": rng.choice([0, -1, 1, 2**40, -2])}])
    if kind == "Save":
        return [hv.op("Save", ["a", "b"], [], db=db, db_type=db_type, absolute_path=absolute, **extra)], db
    if kind == "Checkpoint":
        return [hv.op(rng.choice(["Checkpoint", "Snapshot"]), ["iter", "a"], [], db=rng.choice([db, *PATTERNS]),
                      db_type=db_type, absolute_path=absolute, every=rng.choice([1, 1, 2, 0, -1, 2**62]))], db
    if kind == "Load":
        more = rng.choice([{}, {"load_all": 1}, {"dbs": [db, "x.minidb"]}, {"keep_device": 1},
                           {"source_blob_names": ["secret"]}, {"add_prefix": "../"}])
        outputs = [] if more.get("load_all") else ["secret"]
        return [hv.op("Load", [], outputs, db=db, db_type=db_type, absolute_path=absolute, **more)], db
    if kind == "DBExists":
        return [hv.op("DBExists", [], ["exists"], db_name=db, absolute_path=absolute, db_type=db_type)], db
    ops = [hv.op("CreateDB", [], ["reader"], db=db, db_type=db_type)]
    if rng.random() < 0.7:
        ops.append(hv.op(rng.choice(["TensorProtosDBInput", "Load"]), ["reader"], ["secret"],
                         **({"batch_size": 1} if rng.random() < 0.5 else {})))
    return ops, db


def make(rng: random.Random, case) -> None:
    plant(rng, case)
    kinds = ["Save", "Save", "Checkpoint", "Load", "Load", "DBExists", "CreateDB"]
    ops, dbs = [], []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        more, db = db_op(rng, case, rng.choice(kinds))
        ops += more
        dbs.append(db)
    flags = rng.choice([[], [], [], ["--allow-any-path"], ["--overwrite"], ["--file-root", "sub"],
                        ["--file-root", "link_dir"], ["--allow-any-path", "--overwrite"], ["--file-root", ".."]])
    (case.dir / "sub").mkdir(exist_ok=True)
    shape = rng.random()
    if shape < 0.5:
        net = proto.NetDef(name="paths", op=fill_ops(["a", "b"]) + ops, external_output=[])
        name = case.write("net.pb", net.SerializeToString())
        case.argv = ["run", name, *rng.choice([[], ["-n", "2"], ["--fetch", "secret"], ["--fetch", "exists"]]),
                     *flags]
    elif shape < 0.75:   # a plan: the accesses in a loop (Checkpoint's pattern counts the iterations)
        body = proto.NetDef(name="body", op=[hv.op("Iter", ["iter"], ["iter"])] + ops)
        plan = proto.PlanDef(name="p", network=[proto.NetDef(name="init", op=fill_ops(["a", "b"])), body])
        plan.execution_step.add(name="init", network=["init"])
        plan.execution_step.add(name="loop", network=["body"], num_iter=rng.choice([1, 2, 3]))
        name = case.write("plan.pbtxt", proto.to_text(plan))
        case.argv = ["run", name, "-q", *flags]
    elif shape < 0.85:
        init = proto.NetDef(name="init", op=fill_ops(["a", "b"]) + ops)
        predict = proto.NetDef(name="predict", op=[hv.op("Relu", ["a"], ["y"])], external_input=["a"],
                               external_output=["y"])
        i, p = case.write("init.pb", init.SerializeToString()), case.write("predict.pb", predict.SerializeToString())
        case.argv = rng.choice([["run", i, p, "-q", *flags], ["export-onnx", i, p, "-o", "out.onnx", "--input", "a=2"],
                                ["synth-init", p, "-o", "synth.pb", "--input", "a=2"]])
    else:   # the export commands run a plan's setup and init nets: no op may write
        init = proto.NetDef(name="init", op=fill_ops(["a", "b"]) + ops)
        train = proto.NetDef(name="train", op=[hv.op("Relu", ["a"], ["y"]), hv.op("Iter", ["iter"], ["iter"])],
                             external_output=["y"])
        plan = proto.PlanDef(name="p", network=[init, train])
        plan.execution_step.add(name="init", network=["init"])
        plan.execution_step.add(name="train", network=["train"], num_iter=2)
        name = case.write("plan.pbtxt", proto.to_text(plan))
        case.argv = ["export-predict", name, "--load", str(case.env.assets / "ckpt" / "xor_done.minidb"), "-o",
                     "exported"]
    reads = [o for o in ops if o.type in ("Load", "DBExists", "CreateDB")]
    if len(ops) == 1 and reads and case.argv[0] == "run" and "--allow-any-path" not in flags:
        path = dbs[0]
        a = {x.name: x.i for x in ops[0].arg if x.name == "absolute_path"}
        full = path if a.get("absolute_path") or ops[0].type == "CreateDB" else "./" + path
        root = os.path.realpath(case.dir / (flags[1] if flags[:1] == ["--file-root"] else "."))
        real = os.path.realpath(os.path.join(case.dir, full)) if "\x00" not in full else root
        if not (real == root or real.startswith(root + os.sep)):
            case.expect_refusal = f"its one op read {path!r} (resolving to {real}) outside the root {root}"
