"""Jobs of 1, 2 and 3 processes started with mpiexec (the `mpi` extra: mpi4py and the mpich wheel, whose mpiexec
sits next to the interpreter): the collectives against numpy references, data-parallel training ≡ one process on
the concatenated batch, `mpiexec -n K stepnet run` (placeholders, rank 0 prints and writes), and jobs that must
fail fast: a failing rank, ranks that disagree, mpiexec without mpi4py. Skipped without the extra."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepnet import NetDef, save
from stepnet.io import minidb
from stepnet.testing import make_op

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "models"))
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
                                reason="needs the mpi extra: pip install '.[mpi]'")
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def job(k: int, *argv, cwd=None, env=None, timeout=180) -> subprocess.CompletedProcess:
    """`mpiexec -n k argv` (argv after the interpreter); a hang fails the test at `timeout` seconds."""
    return subprocess.run([MPIEXEC, "-n", str(k), sys.executable, *argv], capture_output=True, text=True,
                          cwd=cwd, env=env or ENV, timeout=timeout)


def stepnet(k: int, *argv, **kw) -> subprocess.CompletedProcess:
    return job(k, "-m", "stepnet", *argv, **kw)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_collectives_against_numpy_references(k):
    r = job(k, str(HERE / "worker.py"), "collectives")
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(f"ok collectives rank {i} of {k}" in r.stdout for i in range(k))


@pytest.mark.parametrize("k", [2, 3])
def test_k_ranks_train_as_one_process_on_the_whole_batch(k):
    r = job(k, str(HERE / "worker.py"), "dp")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("ok dp") == k


@pytest.fixture
def mlp_job(tmp_path):
    """A data-parallel MLP plan (Adam) and the plain one, per-rank data for 2 ranks and the whole batch."""
    from test_data_parallel import mlp

    save(mlp(False, "adam").to_plan(4), tmp_path / "dp.pbtxt")
    save(mlp(None, "adam").to_plan(4), tmp_path / "plain.pbtxt")
    rng = np.random.default_rng(5)
    x, label = rng.normal(size=(8, 5)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "label.npy", label)
    for r in range(2):
        np.save(tmp_path / f"x_{r}of2.npy", x[4 * r:4 * r + 4])
        np.save(tmp_path / f"label_{r}of2.npy", label[4 * r:4 * r + 4])
    return tmp_path


def test_stepnet_run_on_two_ranks(mlp_job):
    """Each rank reads its own files, only rank 0 prints and writes the shared --save, the rank checkpoints
    hold the same parameters, which one process on the whole batch also reaches."""
    feeds = ["--feed", "x=x_{rank}of{size}.npy", "--feed", "label=label_{rank}of{size}.npy"]
    r = stepnet(2, "run", "dp.pbtxt", *feeds, "--checkpoint", "ck_{rank}.minidb", "--fetch", "h_w", "--save",
                "out.npz", cwd=mlp_job)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("h_w: shape (7, 5) float32") == 1 and r.stdout.count("checkpoint:") == 1
    assert (mlp_job / "out.npz").is_file()
    one = subprocess.run([sys.executable, "-m", "stepnet", "run", "plain.pbtxt", "--feed", "x=x.npy", "--feed",
                          "label=label.npy", "--checkpoint", "one.minidb", "-q"], cwd=mlp_job, env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    ranks = [minidb.load_blobs(mlp_job / f"ck_{i}.minidb") for i in range(2)]
    alone = minidb.load_blobs(mlp_job / "one.minidb")
    for p in ("h_w", "h_b", "y_w", "y_b"):
        assert np.array_equal(ranks[0][p], ranks[1][p]), p
        assert np.abs(ranks[0][p] - alone[p]).max() <= 1e-6, p


def test_a_failing_rank_ends_the_job(mlp_job):
    (mlp_job / "x_1of2.npy").unlink()
    r = stepnet(2, "run", "dp.pbtxt", "--feed", "x=x_{rank}of{size}.npy", "--feed", "label=label_{rank}of{size}.npy",
                cwd=mlp_job, timeout=60)
    assert r.returncode != 0
    assert "stepnet: error: rank 1 of 2: --feed: no such file 'x_1of2.npy'" in r.stderr


def test_mismatched_shapes_name_the_blob(tmp_path):
    net = NetDef(name="sum")
    net.op.extend([make_op("MPICreateCommonWorld", [], ["comm"]), make_op("MPIAllreduce", ["comm", "x"], ["x"])])
    save(net, tmp_path / "sum.pbtxt")
    for r in range(2):
        np.save(tmp_path / f"x_{r}.npy", np.zeros(3 + r, np.float32))
    r = stepnet(2, "run", "sum.pbtxt", "--feed", "x=x_{rank}.npy", "--fetch", "x", cwd=tmp_path, timeout=60)
    assert r.returncode != 0
    assert ("the ranks disagree on the collective of blob 'x': rank 0 is at MPIAllreduce of blob 'x' (3,) float32; "
            "rank 1 is at MPIAllreduce of blob 'x' (4,) float32") in r.stderr


def test_without_mpi4py_under_mpiexec_the_error_names_the_extra(tmp_path):
    blocker = tmp_path / "blocker" / "mpi4py"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('mpi4py is blocked for this test')\n")
    net = NetDef(name="n")
    net.op.append(make_op("MPICreateCommonWorld", [], ["comm"]))
    save(net, tmp_path / "n.pbtxt")
    env = {**ENV, "PYTHONPATH": str(blocker.parent)}
    r = stepnet(2, "run", "n.pbtxt", cwd=tmp_path, env=env, timeout=60)
    assert r.returncode == 1
    assert r.stderr.count("mpi4py cannot be imported (mpi4py is blocked for this test); pip install 'mpi4py>=4' "
                          "mpich (stepnet's `mpi` extra)") == 2


def test_char_rnn_on_two_ranks_trains_as_one_process(tmp_path):
    """The char-rnn data-parallel plan (models/build_char_rnn_dp.py), small: 2 ranks of 2 streams each reach the
    parameters of one process (the same plan built for K=1, run without mpiexec) on the 4 streams: the losses to
    1e-5, 99 % of every parameter's elements to 1e-5 and all to 1e-3 (a fifth of Adam's learning rate)."""
    import build_char_rnn_dp as build

    (tmp_path / "text.txt").write_text(Path(build.single.ROOT / build.single.TEXT).read_text()[:30000])
    plans = {}
    for k in (1, 2):
        vocab = build.write_shards(4, 10, k, text=tmp_path / "text.txt", data=tmp_path)
        plans[k] = tmp_path / f"plan{k}.pbtxt"
        save(build.train_plan(vocab, 4, 10, 16, 40, 20, 5e-3, 5.0, k, data=str(tmp_path),
                              checkpoint=str(tmp_path / f"ck{k}.minidb")), plans[k])
    one = subprocess.run([sys.executable, "-m", "stepnet", "run", str(plans[1])], cwd=tmp_path, env=ENV,
                         capture_output=True, text=True, timeout=120)
    two = stepnet(2, "run", str(plans[2]), cwd=tmp_path)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert two.stdout.count("heldout_loss") == 1   # rank 0 prints
    losses = [[float(line.rsplit(" ", 1)[1]) for line in r.stdout.splitlines() if "_loss = " in line]
              for r in (one, two)]
    assert len(losses[0]) == 3 and np.allclose(losses[0], losses[1], rtol=1e-5), losses
    ck = [minidb.load_blobs(tmp_path / f"ck{k}.minidb") for k in (1, 2)]
    assert sorted(ck[0]) == sorted(ck[1]) and len(ck[0]) == 6
    for name, value in ck[0].items():   # Adam scales each element's step by its own gradient history: an element
        diff = np.abs(value - ck[1][name])   # of a rare character's column turns rounding into a step-size change
        assert (diff <= 1e-5).mean() >= 0.99 and diff.max() <= 1e-3, (name, diff.max(), (diff > 1e-5).mean())
