"""caffe2/tutorials `py_gen/CIFAR10_Part1.py` and `py_gen/CIFAR10_Part2.py` (vendored byte for byte in
tests/compat/programs) run unchanged with `python -m stepnet.compat`, one after the other in one HOME, as their
users ran them: Part 1 writes label files and three lmdbs from the PNG folders, trains the "quick" CIFAR CNN
(2000 iterations of 100 images, validating on 6000 images every 100, Checkpoint ops every 1000) and exports it with
mobile_exporter; Part 2 loads the two exported nets, tests them on the test lmdb (10000 single-image runs), trains
on for 3000 iterations and tests again, then stops where it stops on any Python 3 (its confusion-matrix cell uses
`xrange`).

The data is synthetic, in the layout the script expects after its download (so `requests` is imported but not
used): HOME/caffe2_notebooks/tutorial_data/cifar10/cifar/{labels.txt, train/N_CLASS.png, test/N_CLASS.png}, 7000
training PNGs (Part 1 keeps 6000 for validation) and 1000 test PNGs: 32×32 gratings whose orientation is the class,
of random phase and colour, plus pixel noise. matplotlib runs for real (Agg).

What is checked comes from the scripts' outputs: the label files, lmdb row counts, the lines of losses and
accuracies they print (the notebooks print the same lines), the checkpoints (the last one holds the exported
weights) and the exported nets; Part 2's accuracies are those of the exported model run in float64 by torch on the
test lmdb read back record by record, as the script's printed running means count them. How well they learn is not
asserted: at the tutorial's learning rate (0.01, momentum 0.9) this small data trains unsteadily, accuracy rising
and collapsing before it settles (one run here: 0.45 at iteration 200, 0.10 at 400, 1.0 from 700), as torch does
on the same batches.

These runs are long: on 2 cores shared with other jobs, Part 1 took 2311 s (6.3 GB at its peak: it validates on
6000 images in one batch) and Part 2 2917 s, so the test runs only with STEPNET_LONG_TUTORIALS=1 in the environment.
The default suite runs test_part1_training_steps_are_torchs: Part 1's own training functions for a few steps,
against torch.
"""
import ast
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepnet import caffe2_pb2

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
SEED = 7   # the initial weights' draws (param_init_net's ops get SEED + their index)
# float32 training against float64 over 6 momentum steps: a rounding difference can flip a ReLU or a max-pool's
# winner, whose gradient then differs; the biases start at 0, so their elements are the updates themselves.
# Measured over 36 draws of initial weights (seeds 0-35): the largest |stepnet - torch| beyond rtol 1e-3, as a
# share of the tensor's largest magnitude, was below 1e-6 for 26 draws (no flip), 1e-5 for one, 0.01 % to 0.76 %
# for seven, 1.9 % (seed 1) and 4.2 % (seed 29); the old atol of 1e-5 failed one CI draw at 0.5 %. Seed 7 is a
# draw with no flip here (1e-9). Each tensor is compared within 5 % of its own largest magnitude, plus rtol 1e-3.
# That is loose for the weights (their initial values set the scale) and tight for the biases (all update): with
# Nesterov left out of the update, the biases end 6-27 % of their scale away and the losses 1 % (the check below).
SCALE_TOLERANCE = 0.05
PARAMS = ["conv1_w", "conv1_b", "conv2_w", "conv2_b", "conv3_w", "conv3_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b"]
LONG = os.environ.get("STEPNET_LONG_TUTORIALS") == "1"


def make_cifar_pngs(cifar10: Path, n_train: int = 7000, n_test: int = 1000, seed: int = 0) -> None:
    """cifar10/cifar/{labels.txt, train/, test/} as the CIFAR-10 PNG tarball unpacks: N_CLASS.png pictures, each
    a grating whose orientation tells its class (class k: k·18°), of random phase and colour, plus pixel noise."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    cifar = cifar10 / "cifar"
    (cifar / "labels.txt").parent.mkdir(parents=True)
    (cifar / "labels.txt").write_text("".join(c + "\n" for c in CLASSES))
    yy, xx = np.mgrid[0:32, 0:32]
    for sub, n in (("train", n_train), ("test", n_test)):
        (cifar / sub).mkdir()
        for i, label in enumerate(rng.integers(0, 10, n)):
            angle, phase = np.pi * label / 10, rng.uniform(0, 2 * np.pi)
            grating = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 0.6 + phase)
            picture = rng.uniform(60, 196, 3) + 50 * grating[..., None] + rng.normal(0, 20, (32, 32, 3))
            Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8)).save(cifar / sub / f"{i}_{CLASSES[label]}.png")


def run(name: str, home: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STEPNET_CACHE_DIR", "STEPNET_SEED")}
    env.update(HOME=str(home), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "stepnet.compat", str(PROGRAMS / name)], capture_output=True,
                          text=True, timeout=timeout, cwd=home, env=env)


def lmdb_records(path: Path) -> list:
    """[(key, CHW float32 image, label)] of a Part 1 lmdb, in the cursor's (key byte) order, as Caffe2 reads it."""
    import lmdb
    env = lmdb.open(str(path), readonly=True, lock=False)
    out = []
    with env.begin() as txn:
        for key, value in txn.cursor():
            protos = caffe2_pb2.TensorProtos.FromString(value).protos
            image = np.array(protos[0].float_data, np.float32).reshape(tuple(protos[0].dims))
            out.append((key.decode(), image, int(protos[1].int32_data[0])))
    env.close()
    return out


def given_fills(net: caffe2_pb2.NetDef) -> dict:
    """{blob: float32 array} of a NetDef of GivenTensorFill ops."""
    out = {}
    for op in net.op:
        assert op.type == "GivenTensorFill", op.type
        a = {arg.name: arg for arg in op.arg}
        out[op.output[0]] = np.array(a["values"].floats, np.float32).reshape(tuple(a["shape"].ints))
    return out


def cifar_probabilities(weights: dict, images: np.ndarray) -> np.ndarray:
    """The tutorial's CNN in float64 (torch): /256, conv5-maxpool3/2-relu, conv5-relu-avgpool3/2 twice, fc, fc,
    softmax."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    w = {k: torch.tensor(v, dtype=torch.float64) for k, v in weights.items()}
    x = torch.tensor(images, dtype=torch.float64) / 256
    h = F.relu(F.max_pool2d(F.conv2d(x, w["conv1_w"], w["conv1_b"], padding=2), 3, 2))
    h = F.avg_pool2d(F.relu(F.conv2d(h, w["conv2_w"], w["conv2_b"], padding=2)), 3, 2)
    h = F.avg_pool2d(F.relu(F.conv2d(h, w["conv3_w"], w["conv3_b"], padding=2)), 3, 2)
    h = F.linear(F.linear(h.reshape(len(h), -1), w["fc1_w"], w["fc1_b"]), w["fc2_w"], w["fc2_b"])
    return F.softmax(h, dim=1).numpy()


def check_part1(out: str, home: Path) -> dict:
    """Part 1's printed lines and files; returns the exported nets' weights."""
    data = home / "caffe2_notebooks" / "tutorial_data" / "cifar10"
    lines = out.splitlines()
    assert lines[:2] == ["Necessities imported!", "Image directory already exists. Moving on..."]
    assert ast.literal_eval(lines[2].split("classes: ", 1)[1]) == {c: i for i, c in enumerate(CLASSES)}
    for name, rows in (("training", 1000), ("validation", 6000), ("testing", 1000)):
        labels = (data / f"{name}_dictionary.txt").read_text().splitlines()
        assert len(labels) == rows and all(CLASSES[int(ln.split()[1])] in ln.split()[0] for ln in labels)
        assert f"Inserted {rows} rows\n\nLMDB saved at {data / (name + '_lmdb')}\n" in out
    steps = re.findall(r"Training iter:  (\d+)\nLoss:  (\S+)\nValidation accuracy:  (\S+)\n", out)
    assert [int(s[0]) for s in steps] == list(range(0, 2000, 100))
    losses, accuracies = (np.array([float(s[k]) for s in steps]) for k in (1, 2))
    assert np.isfinite(losses).all() and ((0 <= accuracies) & (accuracies <= 1)).all()

    saved = re.findall(r"^Model saved as (\S+) and (\S+)$", out, re.M)
    assert len(saved) == 1
    init = caffe2_pb2.NetDef.FromString(Path(saved[0][0]).read_bytes())
    predict = caffe2_pb2.NetDef.FromString(Path(saved[0][1]).read_bytes())
    assert [op.output[0] for op in init.op] == PARAMS + ["data"]        # the deploy model's params, then its input
    weights = given_fills(init)
    assert weights["data"].tolist() == [[0.0]] and weights["fc1_w"].shape == (64, 576)
    assert list(predict.external_output) == ["softmax"] and predict.external_input[0] == "data"
    assert [op.type for op in predict.op] == ["Conv", "MaxPool", "Relu", "Conv", "Relu", "AveragePool", "Conv",
                                              "Relu", "AveragePool", "FC", "FC", "Softmax"]
    # Checkpoint ops (every 1000 iterations): lmdbs beside the exported nets, the last one the exported params
    run_dir = Path(saved[0][0]).parent
    assert sorted(p.name for p in run_dir.iterdir()) == ["cifar10_checkpoint_01000.lmdb",
                                                          "cifar10_checkpoint_02000.lmdb", "cifar10_init_net.pb",
                                                          "cifar10_predict_net.pb"]
    import lmdb
    env = lmdb.open(str(run_dir / "cifar10_checkpoint_02000.lmdb"), readonly=True, lock=False)
    with env.begin() as txn:
        saved_blobs = [caffe2_pb2.BlobProto.FromString(v) for _, v in txn.cursor()]    # keys: NAME#%CHUNK
    saved_blobs = {b.name: b for b in saved_blobs}
    env.close()
    assert sorted(saved_blobs) == sorted(PARAMS + ["iter"])
    assert list(saved_blobs["iter"].tensor.int64_data) == [2000]
    for name in PARAMS:
        np.testing.assert_array_equal(np.array(saved_blobs[name].tensor.float_data, np.float32),
                                      weights[name].ravel(), err_msg=name)
    return weights


def expected_running_accuracies(correct: np.ndarray, iters: int = 10000) -> dict:
    """Part 2's printed running means: at i = 500, 1000, ... the sum over runs 0..i divided by i."""
    hits = np.cumsum(correct[np.arange(iters) % len(correct)])
    return {i: hits[i] / i for i in range(500, iters, 500)}


def check_exported_model_test(section: str, final_line: str, home: Path, weights: dict) -> float:
    """Part 2's first test: the exported model on the test lmdb, one record a run (10000 runs: the reader starts
    the lmdb again after its last record), its running means and final accuracy printed."""
    records = lmdb_records(home / "caffe2_notebooks" / "tutorial_data" / "cifar10" / "testing_lmdb")
    probs = cifar_probabilities(weights, np.stack([r[1] for r in records]))
    labels = np.array([r[2] for r in records])
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    top2 = np.sort(probs, axis=1)[:, -2:]
    unsure = np.abs(top2[:, 1] - top2[:, 0]) < 1e-5                    # decided by float32 rounding
    printed = {int(i): float(v) for i, v in re.findall(r"Iter: (\d+), Current Accuracy: (\S+)\n", section)}
    want = expected_running_accuracies(correct)
    assert sorted(printed) == sorted(want)
    slack = (10000 // len(records) + 1) * unsure.sum()                 # runs decided by a near-tie
    for i, value in want.items():
        assert abs(printed[i] - value) <= (slack + 1e-3) / i, (i, printed[i], value)
    final = float(re.match(r"Final Test Accuracy:  (\S+)\n", final_line).group(1))
    assert abs(final - np.mean(correct[np.arange(10000) % len(correct)])) <= (slack + 1e-3) / 10000, final
    return correct.mean()


def check_part2(out: str, err: str, returncode: int, home: Path, weights: dict) -> None:
    assert out.startswith("Success, you may continue!\n")
    tests = out.split("*********************************************\n")
    assert len(tests) == 3, out[-3000:]
    check_exported_model_test(tests[0], tests[1], home, weights)

    # training on: every parameter optimized; the printed loss and accuracy every 100 iterations
    params = re.findall(r"^Param to be optimized:  (\S+)$", tests[1], re.M)
    assert sorted(params) == sorted(PARAMS)
    steps = re.findall(r"Iter: (\d+), Loss: (\S+), Accuracy: (\S+)\n", tests[1])
    assert [int(s[0]) for s in steps] == list(range(0, 3000, 100))
    assert all(math.isfinite(float(s[1])) and 0 <= float(s[2]) <= 1 for s in steps)
    retested = re.findall(r"Iter: (\d+), Current Accuracy: (\S+)\n", tests[1])
    assert [int(i) for i, _ in retested] == list(range(500, 10000, 500))
    final2 = float(re.fullmatch(r"Final Test Accuracy:  (\S+)\n", tests[2]).group(1))
    assert 0 <= final2 <= 1
    # then the confusion-matrix cell, which no Python 3 runs: Python 2's xrange
    assert returncode == 1 and err.rstrip().splitlines()[-1].startswith("NameError: name 'xrange' is not defined")


@pytest.mark.skipif(not LONG, reason="Part 1 and Part 2 train for about 90 minutes on 2 cores: "
                                     "set STEPNET_LONG_TUTORIALS=1 to run them")
def test_cifar10_part1_then_part2(tmp_path):
    pytest.importorskip("lmdb")
    pytest.importorskip("imageio")
    pytest.importorskip("requests")
    home = tmp_path / "home"
    make_cifar_pngs(home / "caffe2_notebooks" / "tutorial_data" / "cifar10")
    part1 = run("CIFAR10_Part1.py", home, timeout=4 * 3600)
    assert part1.returncode == 0, part1.stdout[-2000:] + part1.stderr[-4000:]
    weights = check_part1(part1.stdout, home)
    part2 = run("CIFAR10_Part2.py", home, timeout=6 * 3600)
    check_part2(part2.stdout, part2.stderr, part2.returncode, home, weights)


# --------------------------------------------------------------------------------------------- Part 1's training
def part1_functions() -> dict:
    """AddInput, update_dims, Add_Original_CIFAR10_Model and AddTrainingOperators, compiled from the vendored
    CIFAR10_Part1.py with stepnet's brew, core and optimizer."""
    import ast

    from stepnet.compat import brew, core, optimizer
    tree = ast.parse((PROGRAMS / "CIFAR10_Part1.py").read_text())
    wanted = {"AddInput", "update_dims", "Add_Original_CIFAR10_Model", "AddTrainingOperators"}
    module = ast.Module(body=[n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted],
                        type_ignores=[])
    namespace = {"brew": brew, "core": core, "optimizer": optimizer}
    exec(compile(module, str(PROGRAMS / "CIFAR10_Part1.py"), "exec"), namespace)
    assert wanted <= set(namespace)
    return namespace


def _part1_training_against_torch(tmp_path):
    """What Part 1 trains, in the default suite: its train model (its own functions: the lmdb input, the CNN,
    LabelCrossEntropy + AveragedLoss, build_sgd with momentum 0.9, Nesterov as Caffe2's default, and
    weight_decay=0.004, which this Caffe2's build_sgd hands to the LearningRate op, where it does nothing) for 6
    iterations of 20 images from an lmdb written as Part 1 writes it, against torch in float64 from the same
    initial weights on the same batches: the losses and the final weights agree."""
    lmdb = pytest.importorskip("lmdb")
    torch = pytest.importorskip("torch")
    from stepnet.compat import model_helper, workspace
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (40, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 10, 40)
    env = lmdb.open(str(tmp_path / "train_lmdb"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, (image, label) in enumerate(zip(images, labels)):
            protos = caffe2_pb2.TensorProtos()
            t = protos.protos.add(dims=image.shape, data_type=1)
            t.float_data.extend(image.ravel())
            protos.protos.add(data_type=2).int32_data.append(int(label))
            txn.put(f"{i}".encode("ascii"), protos.SerializeToString())
    env.close()
    order = [int(key) for key, _, _ in lmdb_records(tmp_path / "train_lmdb")]      # the cursor's order

    ns = part1_functions()
    workspace.ResetWorkspace()
    model = model_helper.ModelHelper(name="train_net", arg_scope={"order": "NCHW"})
    data, label = ns["AddInput"](model, batch_size=20, db=str(tmp_path / "train_lmdb"), db_type="lmdb")
    softmax = ns["Add_Original_CIFAR10_Model"](model, data, 10, 32, 32, 3)
    ns["AddTrainingOperators"](model, softmax, label)
    for i, op in enumerate(model.param_init_net.Proto().op):   # the same initial weights every run
        op.device_option.random_seed = SEED + i
    workspace.RunNetOnce(model.param_init_net)
    with pytest.warns(UserWarning, match="'weight_decay' is not used by LearningRate"):
        workspace.CreateNet(model.net, overwrite=True)
    initial = {p: workspace.FetchBlob(p).copy() for p in PARAMS}
    losses = []
    for _ in range(6):
        workspace.RunNet(model.net)
        losses.append(float(workspace.FetchBlob("loss")))

    F = torch.nn.functional
    w = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in initial.items()}
    sgd = torch.optim.SGD(list(w.values()), lr=0.01, momentum=0.9, nesterov=True)
    want = []
    for step in range(6):
        batch = [order[(20 * step + k) % 40] for k in range(20)]
        x = torch.tensor(images[batch], dtype=torch.float64) / 256
        h = F.relu(F.max_pool2d(F.conv2d(x, w["conv1_w"], w["conv1_b"], padding=2), 3, 2))
        h = F.avg_pool2d(F.relu(F.conv2d(h, w["conv2_w"], w["conv2_b"], padding=2)), 3, 2)
        h = F.avg_pool2d(F.relu(F.conv2d(h, w["conv3_w"], w["conv3_b"], padding=2)), 3, 2)
        h = F.linear(F.linear(h.reshape(len(h), -1), w["fc1_w"], w["fc1_b"]), w["fc2_w"], w["fc2_b"])
        loss = F.cross_entropy(h, torch.tensor(labels[batch]))
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        want.append(float(loss.detach()))
    np.testing.assert_allclose(losses, want, rtol=1e-4)
    assert abs(want[-1] - want[0]) > 1e-3                                           # the weights did move
    for name in PARAMS:    # (see SCALE_TOLERANCE)
        want_w = w[name].detach().numpy()
        np.testing.assert_allclose(workspace.FetchBlob(name), want_w, rtol=1e-3,
                                   atol=SCALE_TOLERANCE * np.abs(want_w).max(), err_msg=name)


def test_part1_training_steps_are_torchs(tmp_path):
    _part1_training_against_torch(tmp_path)


def test_the_comparison_fails_on_a_momentum_update_without_nesterov(tmp_path, patched):
    """The check above fails when stepnet's MomentumSGDUpdate ignores nesterov (plain momentum instead of
    Caffe2's default Nesterov): the weights move by more than its tolerance."""
    from stepnet.ops import REGISTRY
    kernel = REGISTRY.get("MomentumSGDUpdate").kernel
    patched("MomentumSGDUpdate", kernel=lambda xp, *a, momentum, nesterov: kernel(xp, *a, momentum=momentum,
                                                                                  nesterov=0),
            fused_kernel=None, inplace_kernel=None)
    with pytest.raises(AssertionError):
        _part1_training_against_torch(tmp_path)
