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
    table = dict(re.findall(r"^\| `([\w./]+\.py)` \|.*\| `([0-9a-f]{64})` \|$", (PROGRAMS / "SOURCES.md").read_text(),
                            re.M))
    vendored = [*PROGRAMS.glob("*.py"), *(p for p in (PROGRAMS / "seq2seq").rglob("*.py") if p.name != "conftest.py"),
                *(PROGRAMS / "dlrm").rglob("*.py")]
    assert sorted(table) == sorted(p.relative_to(PROGRAMS).as_posix() for p in vendored)   # (conftest: stepnet's)
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


def test_resnet50_trainer_trains_saves_and_resumes(tmp_path, monkeypatch):
    """Caffe2's ResNet-50 trainer on its synthetic input (--train_data null: one Gaussian batch drawn by the init
    net, every label 1), on the CPU: 2 epochs of 2 iterations of 4 images, 32×32, 10 labels. The loss (logged on
    stderr) starts near ln 10 and falls to under a tenth of that. Each epoch the program saves a predictor-exporter
    db and removes the previous one; on the CPU (shared_model) Caffe2's checkpoint holds the batch-norm running
    statistics and the iteration counter, not the weights. Loading it back here gives the three nets and restores
    running means that training moved off their initial zeros; a second run resumes from it at epoch 2."""
    from stepnet.compat import state, workspace
    from stepnet.compat.predictor import predictor_exporter, predictor_py_utils
    from stepnet.compat.predictor_constants import predictor_constants as pc

    def train(*more):
        args = ["--train_data", "null", "--use_cpu", "True", "--batch_size", 4, "--epoch_size", 8, "--image_size", 32,
                "--num_labels", 10, "--file_store_path", tmp_path, *more]
        out = subprocess.run([sys.executable, "-m", "stepnet.compat", str(PROGRAMS / "resnet50_trainer.py"),
                              *map(str, args)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-4000:]
        return out.stderr

    log = train("--num_epochs", 2)
    losses = [float(v) for v in re.findall(r"Training loss: (\S+), accuracy", log)]
    assert len(losses) == 4 and 1.0 < losses[0] < 5.0 and losses[-1] < 0.1 * losses[0], losses
    assert (tmp_path / "resnet50_model_2.mdl").is_file() and not (tmp_path / "resnet50_model_1.mdl").exists()
    assert len(list(tmp_path.glob("resnet50_gpu1_b4_L10_lr0.10_v2_*.log"))) == 1    # experiment_util's log

    monkeypatch.chdir(tmp_path)
    state.reset()
    meta = predictor_exporter.load_from_db(str(tmp_path / "resnet50_model_2.mdl"), "minidb")
    assert {n.key for n in meta.nets} == {pc.GLOBAL_INIT_NET_TYPE, pc.PREDICT_INIT_NET_TYPE, pc.PREDICT_NET_TYPE}
    params = list(predictor_py_utils.GetBlobs(meta, pc.PARAMETERS_BLOB_TYPE))
    assert "cpu_0/conv1_spatbn_relu_rm" in params and "optimizer_iteration" in params
    workspace.RunNetOnce(predictor_py_utils.GetNet(meta, pc.GLOBAL_INIT_NET_TYPE))
    assert np.abs(workspace.FetchBlob("cpu_0/conv1_spatbn_relu_rm")).max() > 0
    assert int(workspace.FetchBlob("optimizer_iteration")[0]) == 4

    log = train("--num_epochs", 3, "--load_model_path", tmp_path / "resnet50_model_2.mdl")
    assert "Reset epoch to 2" in log and "Starting epoch 2/3" in log and "Starting epoch 1/" not in log
    assert (tmp_path / "resnet50_model_3.mdl").is_file() and not (tmp_path / "resnet50_model_2.mdl").exists()
