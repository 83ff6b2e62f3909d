"""Third-party Caffe2 programs, vendored unchanged (tests/compat/programs, provenance in its SOURCES.md), run as
their users ran them: `python -m stepnet.compat PROGRAM.py ARGS`."""
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PROGRAMS = Path(__file__).resolve().parent / "programs"


def run_program(name: str, *args, cwd, timeout=600) -> str:
    out = subprocess.run([sys.executable, "-m", "stepnet.compat", str(PROGRAMS / name), *map(str, args)],
                         capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def test_the_programs_are_byte_for_byte_the_originals():
    table = dict(re.findall(r"^\| `([\w.]+\.py)` \|.*\| `([0-9a-f]{64})` \|$", (PROGRAMS / "SOURCES.md").read_text(),
                            re.M))
    assert sorted(table) == sorted(p.name for p in PROGRAMS.glob("*.py"))
    for name, digest in table.items():
        assert hashlib.sha256((PROGRAMS / name).read_bytes()).hexdigest() == digest, name


def test_lmdb_create_example_reads_back_what_it_wrote(tmp_path):
    """It writes 128 random 3×64×32 images with labels j % 10 into an lmdb with the lmdb package, then reads them
    back with Caffe2's TensorProtosDBInput (db_type lmdb), 4 batches of 32, and prints both checksums
    Σ sum(image)·label, truncated to integers. The program's own assert only catches a read checksum that is too
    small; here they must agree to 1: the write sums float64 pixels, the read float32 ones (the TensorProto holds
    float32), about 1e-7 relative of a checksum near 1.4e6."""
    pytest.importorskip("lmdb")
    out = run_program("lmdb_create_example.py", "--output_file", tmp_path / "random.lmdb", cwd=tmp_path)
    wrote = int(re.search(r"^Checksum/write: (-?\d+)$", out, re.M).group(1))
    read = int(re.search(r"^Checksum/read: (-?\d+)$", out, re.M).group(1))
    assert abs(wrote - read) <= 1 and wrote > 100_000, out
    assert "Inserted 112 rows" in out


def test_a_db_read_back_in_a_different_order_fails_the_checksum(tmp_path):
    """The check above can fail: the same 128 records read from an lmdb whose labels were shifted by one give
    another checksum (what a reader that skipped or repeated a record would print)."""
    lmdb = pytest.importorskip("lmdb")
    from stepnet.io import kvdb, minidb
    rng = np.random.default_rng(0)
    images = rng.random((128, 3, 64, 32))
    env = lmdb.open(str(tmp_path / "a.lmdb"), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for j in range(128):
            txn.put(str(j).encode(), minidb.tensor_protos_record([images[j].astype(np.float32),
                                                                  np.array([(j + 1) % 10], np.int32)]))
    env.close()
    db = kvdb.open_db(str(tmp_path / "a.lmdb"), "lmdb")
    read = sum(float(np.sum(arrays[0])) * int(arrays[1][0]) for arrays in
               (minidb.parse_tensor_protos(db.value(i), db.where(i)) for i in range(len(db))))
    wrote = sum(float(np.sum(images[j])) * (j % 10) for j in range(128))
    assert abs(read - wrote) > 1
