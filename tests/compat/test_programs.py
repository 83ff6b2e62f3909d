"""Third-party Caffe2 programs, vendored unchanged (tests/compat/programs, provenance in its SOURCES.md), run as
their users ran them: `python -m stepnet.compat PROGRAM.py ARGS`."""
import hashlib
import os
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
    table = dict(re.findall(r"^\| `([\w./-]+\.py)` \|.*\| `([0-9a-f]{64})` \|$", (PROGRAMS / "SOURCES.md").read_text(),
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
        # seeded (STEPNET_SEED): unseeded, about one run in five drew initial weights whose first loss was over 5
        out = subprocess.run([sys.executable, "-m", "stepnet.compat", str(PROGRAMS / "resnet50_trainer.py"),
                              *map(str, args)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                             env={**os.environ, "STEPNET_SEED": "1"})
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


# ------------------------------------------------------------------------------------------------------ DLRM
# facebookresearch/dlrm (programs/dlrm, MIT): one recommendation model written for Caffe2 and for PyTorch, built
# from the same numpy seed, weights and data. The repo's check, test/dlrm_s_test.sh, runs both programs on four
# configurations and diffs what they print. torch is a test reference here (it runs the PyTorch program, and the
# Caffe2 program's data loader), never a stepnet dependency.
DLRM = PROGRAMS / "dlrm"
STUBS = Path(__file__).resolve().parent / "stubs"
NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?")
ONE_SIDED = ("Unable to import", "world size:", "WARNING: non default")   # lines only one of the programs prints
# The PyTorch program, run unchanged; where the tensorboard package is missing, torch.utils.tensorboard is the
# stand-in stubs/torch_tensorboard.py (a writer of event files: it prints nothing either way).
PYTORCH = """import importlib.util, os, runpy, sys
if importlib.util.find_spec("tensorboard") is None:
    spec = importlib.util.spec_from_file_location("torch.utils.tensorboard", os.environ["DLRM_TENSORBOARD_STANDIN"])
    sys.modules["torch.utils.tensorboard"] = standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""
SH = " --arch-interaction-op=dot --learning-rate=0.1 --debug-mode"   # test/dlrm_s_test.sh's common flags
DLRM_RUNS = {   # test/dlrm_s_test.sh's four configurations, then more of what the Caffe2 program offers
    "repo-1": "--mini-batch-size=1 --data-size=1 --nepochs=1" + SH,
    "repo-2": "--mini-batch-size=2 --data-size=4 --nepochs=1" + SH,
    "repo-3": "--mini-batch-size=2 --data-size=5 --nepochs=1" + SH,
    "repo-4": "--mini-batch-size=2 --data-size=5 --nepochs=3" + SH,
    "cat": "--mini-batch-size=2 --data-size=5 --nepochs=1 --arch-interaction-op=cat --learning-rate=0.1 --debug-mode",
    "test-evaluation": "--mini-batch-size=2 --data-size=8 --nepochs=1 --num-batches=4 --data-generation=random "
                       "--test-freq=2 --print-freq=1 --test-mini-batch-size=3 --round-targets=True "
                       "--loss-function=bce --arch-interaction-op=dot --learning-rate=0.1",
    # without --debug-mode: in that mode the PyTorch program leaves the per-sample weights out of its optimizer
    # (extend_distributed.my_size stays -1, so it builds parameter groups of the tables and MLPs only)
    "learned-pooling": "--mini-batch-size=2 --data-size=6 --nepochs=2 --weighted-pooling=learned "
                       "--arch-interaction-op=dot --learning-rate=0.1",
}


def dlrm_env() -> dict:
    import importlib.util
    import os
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               DLRM_TENSORBOARD_STANDIN=str(STUBS / "torch_tensorboard.py"))
    if any(importlib.util.find_spec(m) is None for m in ("sklearn", "tqdm")):   # imported, unused by these runs
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUBS), env.get("PYTHONPATH")) if p)
    return env


def run_dlrm(args: str, cwd: Path, sides=("caffe2", "pytorch")) -> dict:
    """{side: stdout} of dlrm_s_caffe2.py on stepnet and dlrm_s_pytorch.py on torch, run at once, each in its own
    folder under cwd."""
    commands = {"caffe2": [sys.executable, "-m", "stepnet.compat", str(DLRM / "dlrm_s_caffe2.py")],
                "pytorch": [sys.executable, "-c", PYTORCH, str(DLRM / "dlrm_s_pytorch.py")]}
    env, procs = dlrm_env(), {}
    for side in sides:
        (cwd / side).mkdir()
        procs[side] = subprocess.Popen([*commands[side], *args.split()], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, cwd=cwd / side, env=env)
    outs = {side: p.communicate(timeout=600) for side, p in procs.items()}
    for side, p in procs.items():
        assert p.returncode == 0, f"{side}: " + outs[side][0][-2000:] + outs[side][1][-4000:]
    return {side: out for side, (out, _) in outs.items()}


def dlrm_printout(text: str) -> tuple[list[str], list[str], list[float]]:
    """(its lines with each number as #, the numbers as printed, the test losses) of one program's output, with
    what only one program prints taken out: the lines of ONE_SIDED, and the test loss the Caffe2 program prints
    on its test lines (the PyTorch one prints its test accuracy only, on a line of its own)."""
    lines, losses = [], []
    for line in text.splitlines():
        if line.startswith(ONE_SIDED):
            continue
        if line.startswith(" accuracy") and lines and lines[-1].startswith("Testing at"):
            lines[-1] += line
            continue
        m = re.fullmatch(r"(Testing at - .*,) loss (\S+),( accuracy .*)", line)
        if m:
            losses.append(float(m.group(2)))
            line = m.group(1) + m.group(3)
        lines.append(line)
    return [NUMBER.sub("#", ln) for ln in lines], [t for ln in lines for t in NUMBER.findall(ln)], losses


def last_place(token: str) -> float | None:
    """The value of one unit in the last printed digit of a number with a fraction (None: printed as an
    integer)."""
    mantissa, _, exponent = token.partition("e")
    places = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - places) if places else None


def assert_same_printout(caffe2: str, pytorch: str) -> int:
    """The two programs' outputs print the same lines and the same numbers; returns how many numbers differ.

    A number may differ by one unit in its last printed digit, and at most one number in 50 may differ at all:
    both programs compute in float32, and their matrix products (FC, BatchMatMul and their gradients) sum the
    same K ≤ 8 products in the same order, but numpy's OpenBLAS kernel fuses each multiply into the add (FMA)
    while torch's MKL kernel rounds the product first, so an element can differ by one float32 ulp (measured:
    FC and BatchMatMul outputs off by 1 ulp; with torch's own FC in stepnet the outputs of the `cat` run become
    identical). Printed with 5 decimals (weights, about 1e-5/6e-8 ≈ 100 ulps per unit) or 6 (losses, 10-100 ulps),
    a difference of a few ulps changes a printed digit only for a value that lies that close to a rounding
    boundary, and then by one unit. Integers (iteration counts, data, indices) must be equal."""
    (lines_c, nums_c, _), (lines_p, nums_p, _) = dlrm_printout(caffe2), dlrm_printout(pytorch)
    assert lines_c == lines_p, "\n".join(f"{a!r} | {b!r}" for a, b in zip(lines_c, lines_p) if a != b)
    differ = 0
    for a, b in zip(nums_c, nums_p, strict=True):
        if a != b:
            places = [p for p in (last_place(a), last_place(b)) if p is not None]
            assert places and abs(float(a) - float(b)) <= 1.001 * min(places), (a, b)
            differ += 1
    assert differ <= len(nums_c) // 50, f"{differ} of {len(nums_c)} numbers differ"
    return differ


SAMPLE = """Using CPU...
WARNING: non default ----test-mini-batch-size option is not supported and will be ignored
[[-0.15724 -0.19588]
 [ 0.16931  0.08594]]
Finished training it 1/2 of epoch 0, -1.00 ms/it, loss 0.085764
Testing at - 2/2 of epoch 0, loss 0.156005, accuracy 37.500 %, best 37.500 %
"""


@pytest.mark.parametrize("change, fails", [
    (("0.085764", "0.085765"), False),             # one unit in the last digit
    (("0.085764", "0.085766"), True),              # two
    (("-0.19588", "-0.19587"), False), (("-0.19588", "-0.19586"), True),
    (("it 1/2", "it 2/2"), True),                  # an integer
    (("ms/it, loss", "ms/it, Loss"), True),        # the text
    (("37.500 %, best", "37.501 %, best"), False), (("37.500 %, best", "37.502 %, best"), True),
])
def test_the_dlrm_printouts_compare_as_stated(change, fails):
    """The comparison can fail: SAMPLE four times (56 numbers) against its PyTorch form (its own test line, no
    test loss, no warning) with one change to a number or the text; the same one-unit change in all four
    copies is more numbers than one in 50."""
    pytorch = SAMPLE.replace("WARNING: non default ----test-mini-batch-size option is not supported and will be "
                             "ignored\n", "world size: 1, current rank: 0, local rank: 0\n")
    pytorch = 4 * pytorch.replace("epoch 0, loss 0.156005, accuracy", "epoch 0,\n accuracy")
    assert assert_same_printout(4 * SAMPLE, pytorch) == 0
    if fails:
        with pytest.raises(AssertionError):
            assert_same_printout(4 * SAMPLE, pytorch.replace(*change, 1))
    else:
        assert assert_same_printout(4 * SAMPLE, pytorch.replace(*change, 1)) == 1
        with pytest.raises(AssertionError, match="4 of 56 numbers differ"):
            assert_same_printout(4 * SAMPLE, pytorch.replace(*change))


def test_the_dlrm_files_are_the_originals():
    table = dict(re.findall(r"^\| `dlrm/([\w./]+)` \|.*\| `([0-9a-f]{64})` \|$", (PROGRAMS / "SOURCES.md").read_text(),
                            re.M))
    assert sorted(table) == sorted(p.relative_to(DLRM).as_posix() for p in DLRM.rglob("*") if p.is_file())
    for name, digest in table.items():
        assert hashlib.sha256((DLRM / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("run", list(DLRM_RUNS))
def test_dlrm_caffe2_prints_what_dlrm_pytorch_prints(run, tmp_path):
    """dlrm_s_caffe2.py on stepnet against dlrm_s_pytorch.py on torch, as test/dlrm_s_test.sh compares them (the
    first four are its configurations): every line and number the same (see assert_same_printout for the one
    tolerance). Besides the losses, a --debug-mode run prints the data, the initial weights and the trained ones;
    the test-evaluation run prints the test accuracies (and, the Caffe2 program only, test losses)."""
    pytest.importorskip("torch")
    out = run_dlrm(DLRM_RUNS[run], tmp_path)
    assert_same_printout(out["caffe2"], out["pytorch"])
    caffe2 = out["caffe2"]
    assert caffe2.count("Finished training it") >= 1
    if "--debug-mode" in DLRM_RUNS[run]:
        assert "updated parameters (weights and bias):" in caffe2
    if run == "test-evaluation":
        losses = dlrm_printout(caffe2)[2]
        assert len(losses) == 2 and all(0 < x < 10 for x in losses), caffe2
        assert re.findall(r"accuracy (\S+) %", caffe2) == ["37.500", "37.500"]


def test_dlrm_save_onnx_writes_a_model_onnxruntime_runs_as_stepnet(tmp_path):
    """--save-onnx --save-proto-types-shapes (cat interaction: with dot, the tril indices the program feeds have
    no entry in its value_info, and Caffe2's frontend refuses such a net, as stepnet's does). The program hands
    its training net and value_info to caffe2.python.onnx.frontend and writes the model as text; the frontend
    exports the forward part (warning that it left the training part out). onnxruntime then runs the model on
    random inputs (valid indices and lengths), and stepnet runs the program's net (saved with
    --save-proto-types-shapes, the types and shapes in its input_shape_info argument) on the same inputs: the
    loss agrees to 1e-6 relative (onnxruntime's GEMM sums in its own order: a few float32 ulps)."""
    pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from google.protobuf import text_format

    from stepnet import Workspace, caffe2_pb2
    args = ("--mini-batch-size=2 --data-size=4 --nepochs=1 --arch-interaction-op=cat --learning-rate=0.1 "
            "--save-onnx --save-proto-types-shapes")
    proc = subprocess.run([sys.executable, "-m", "stepnet.compat", str(DLRM / "dlrm_s_caffe2.py"), *args.split()],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=dlrm_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "has a training part: exported its forward part" in proc.stderr
    model = text_format.Parse((tmp_path / "dlrm_s_caffe2.onnx").read_text(), onnx.ModelProto())
    net = text_format.Parse((tmp_path / "dlrm_s_caffe2.proto").read_text(), caffe2_pb2.NetDef())
    info = {t.name: (list(t.dims), t.data_type) for a in net.arg if a.name == "input_shape_info" for t in a.tensors}
    inputs = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert {n: dims for n, (dims, _) in info.items() if n not in ("const_one", "optim_it")} == inputs
    assert [o.name for o in model.graph.output] == ["interaction_info", "loss"]
    rng = np.random.default_rng(0)
    feeds = {}
    for name, dims in inputs.items():
        if name.endswith("_l"):       # lengths of the bags: they sum to the number of indices
            k = inputs[name[:-1] + "i"][0]
            feeds[name] = np.diff(np.r_[0, np.sort(rng.integers(0, k + 1, dims[0] - 1)), k]).astype(np.int32)
        elif name.endswith("_i"):
            feeds[name] = rng.integers(0, inputs[name[:-1] + "w"][0], dims).astype(np.int32)
        else:
            feeds[name] = rng.uniform(0.1, 1.0, dims).astype(np.float32)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    ws = Workspace()
    for name, value in {**feeds, "const_one": np.ones(1, np.float32), "optim_it": np.zeros(1, np.int64)}.items():
        ws.feed(name, value)
    ws.run_net_once(net)     # the whole training step: its forward part writes both outputs before any update
    np.testing.assert_array_equal(got[0], ws.fetch("interaction_info"))
    np.testing.assert_allclose(got[1], ws.fetch("loss"), rtol=1e-6)
    assert 0 < float(got[1]) < 10
