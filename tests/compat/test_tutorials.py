"""Caffe2 tutorials (caffe2/tutorials `py_gen/Python_Op.py`, `py_gen/MNIST.py`, `py_gen/Control_Ops.py` and
`py_gen/Multi-GPU_Training.py`, vendored byte for byte in tests/compat/programs) run unchanged with
`python -m stepnet.compat`, checked against the outputs stored in their notebooks (`Python_Op.ipynb`, `MNIST.ipynb`,
`Control_Ops.ipynb` at the same commit; quoted below as NOTEBOOK_*). `Multi-GPU_Training.ipynb` stores no outputs
and its py_gen file stops at its own stubs: its solution functions run on CPU devices (see its section below).

MNIST downloads its lmdbs only when they are missing from ~/caffe2_notebooks/tutorial_data/mnist; the test puts
them there (HOME is a temporary folder), written as Caffe2's make_mnist_db writes MNIST (a BYTE 1×28×28 tensor and
an INT32 label per record, keys %08d) from synthetic digits: seven-segment strokes drawn with a random slant,
scale, offset and pen width, plus pixel noise. matplotlib and IPython are stood in for by tests/compat/stubs, and
Graphviz's `dot` by a script answering with a PNG signature.
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
from stepnet.io import minidb

HERE = Path(__file__).resolve().parent
PROGRAMS, STUBS = HERE / "programs", HERE / "stubs"

# What the notebooks show (stdout only: both also show Caffe2's stderr warning that it runs without GPU support).
NOTEBOOK_PYTHON_OP = ["[6.]\n", "[6.]\n", "[6.]\n", "[2.]\n"]           # cells 1-4
NOTEBOOK_HOME = "/Users/nathaninkawhich"
NOTEBOOK_PROTOS = (                                                        # cell 13
    '*******train_model.net.Proto()*******\n\nname: "mnist_train"\nop {\n  input: "dbreader_/Users/nathaninkawhich/'
    'caffe2_notebooks/tutorial_data/mnist/mnist-train-nchw-lmdb"\n  output: "data_uint8"\n  output: "label"\n  name: '
    '""\n  type: "TensorProtosDBInput"\n  arg {\n    name: "batch_size"\n    i: 64\n  }\n}\nop {\n  input: "data_uint8"'
    '\n  output: "data"\n  name: ""\n  type: "Cast"\n  arg {\n    name: "to"\n    i: 1\n  }\n}\nop {\n  input: "data"\n'
    '  output: "data\n...\n\n*******train_model.param_init_net.Proto()*******\n\nname: "mnist_train_init"\nop {\n'
    '  output: "dbreader_/Users/nathaninkawhich/caffe2_notebooks/tutorial_data/mnist/mnist-train-nchw-lmdb"\n'
    '  name: ""\n  type: "CreateDB"\n  arg {\n    name: "db_type"\n    s: "lmdb"\n  }\n  arg {\n    name: "db"\n'
    '    s: "/Users/nathaninkawhich/caffe2_notebooks/tutorial_data/mnist/mnist-train-nchw-lmdb"\n  }\n}\nop {\n'
    '  output: "conv1_w"\n  name: ""\n  type: "XavierFill"\n  arg {\n    na\n...\n')
NOTEBOOK_TRAINING = [(0, 2.41657829285, 0.03125), (25, 0.419774413109, 0.875), (50, 0.313294112682, 0.890625),
                     (75, 0.285170167685, 0.90625), (100, 0.200987011194, 0.90625), (125, 0.207681715488, 0.921875),
                     (150, 0.0973892956972, 0.984375), (175, 0.209523797035, 0.9375)]        # cell 14
NOTEBOOK_TEST_ACCURACY = 0.950600                                                            # cell 17
NOTEBOOK_LOADED = ("[u'!!META_NET_DEF', u'!!PREDICTOR_DBREADER', u'conv1', u'conv1_b', u'conv1_w', u'conv2', "
                   "u'conv2_b', u'conv2_w', u'data', u'fc3', u'fc3_b', u'fc3_w', u'pool1', u'pool2', u'pred', "
                   "u'pred_b', u'pred_w', u'relu3', u'softmax']")                             # cell 19
PARAMS = ["conv1_w", "conv1_b", "conv2_w", "conv2_b", "fc3_w", "fc3_b", "pred_w", "pred_b"]


def run_tutorial(name: str, tmp_path) -> str:
    """What the program prints when run as its users ran it (see tutorial_process); it must succeed."""
    out = tutorial_process(name, tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def tutorial_process(name: str, tmp_path) -> subprocess.CompletedProcess:
    """The program run as its users ran it, with HOME in tmp_path, the stubs importable and a stand-in `dot` (which
    keeps each graph it is given as tmp_path/graphs/<k>.dot)."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "graphs").mkdir(exist_ok=True)
    dot = tmp_path / "bin" / "dot"
    dot.write_text(f"#!/bin/sh\nk=$(ls '{tmp_path / 'graphs'}' | wc -l)\ncat > '{tmp_path / 'graphs'}'/$((k)).dot\n"
                   "printf '\\211PNG\\r\\n\\032\\n'\n")
    dot.chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(STUBS),
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "stepnet.compat", str(PROGRAMS / name)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env=env)


# --------------------------------------------------------------------------------------------- Python_Op
def test_python_op_tutorial_prints_what_the_notebook_shows(tmp_path):
    """net.Python(f) with feed, with reshape + .data, with pass_workspace, and with grad_f through
    AddGradientOperators (PythonGradient gets x, y and y_grad, writes x_grad = 2 * y_grad = 2)."""
    assert run_tutorial("Python_Op.py", tmp_path) == "".join(NOTEBOOK_PYTHON_OP)


def test_python_op_gradient_is_caffe2s():
    """The gradient op AddGradientOperators adds, as Caffe2's GetPythonGradient makes it: inputs, outputs, output
    gradients in, input gradients out, the forward op's arguments (its token) copied; and it runs grad_f."""
    from stepnet.compat import core, workspace

    def f(inputs, outputs):
        outputs[0].feed(inputs[0].data * inputs[1].data)

    def grad_f(inputs, outputs):                  # [a, b, y, dy] -> [da, db]
        outputs[0].feed(inputs[3].data * inputs[1].data)
        outputs[1].feed(inputs[3].data * inputs[0].data * 10)   # (a wrong gradient, to see whose it is)

    workspace.ResetWorkspace()
    net = core.Net("python_grad")
    net.Python(f, grad_f)(["a", "b"], ["y"])
    net.AddGradientOperators(["y"])
    grad = net.Proto().op[-1]
    assert grad.type == "PythonGradient" and list(grad.input) == ["a", "b", "y", "y_autogen_grad"]
    assert list(grad.output) == ["a_grad", "b_grad"]
    assert {a.name: a.s for a in grad.arg}["token"] == {a.name: a.s for a in net.Proto().op[0].arg}["token"]
    workspace.FeedBlob("a", np.array([3.0], np.float32))
    workspace.FeedBlob("b", np.array([5.0], np.float32))
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob("y").tolist() == [15.0]
    assert workspace.FetchBlob("a_grad").tolist() == [5.0] and workspace.FetchBlob("b_grad").tolist() == [30.0]


# --------------------------------------------------------------------------------------------- the modules MNIST uses
def small_model():
    """A two-layer net y = softmax(W2 relu(W1 x + b1) + b2) with random parameters in the current workspace."""
    from stepnet.compat import core, workspace
    rng = np.random.default_rng(3)
    params = {"w1": rng.standard_normal((5, 4)), "b1": rng.standard_normal(5), "w2": rng.standard_normal((3, 5)),
              "b2": rng.standard_normal(3)}
    for name, value in params.items():
        workspace.FeedBlob(name, value.astype(np.float32))
    net = core.Net("small")
    net.Softmax(net.Relu(net.FC(["x", "w1", "b1"], "h"), "r").FC(["w2", "b2"], "z"), "y")
    return net, params


def test_predictor_export_round_trip(tmp_path):
    """save_to_db then prepare_prediction_net in a reset workspace gives the same outputs as the net it saved, and
    a float64 reference of it; the MetaNetDef holds Caffe2's keys, lists and nets."""
    from stepnet.compat import workspace
    from stepnet.compat.predictor import predictor_exporter as pe
    from stepnet.compat.predictor import predictor_py_utils as utils
    from stepnet.compat.predictor_constants import predictor_constants as pc

    net, params = small_model()
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(net)
    trained = workspace.FetchBlob("y")
    meta = pe.PredictorExportMeta(predict_net=net, parameters=list(params), inputs=["x"], outputs=["y"])
    path = str(tmp_path / "model.minidb")
    pe.save_to_db("minidb", path, meta)

    workspace.ResetWorkspace()
    loaded = pe.load_from_db(path, "minidb")
    assert utils.GetBlobs(loaded, pc.PARAMETERS_BLOB_TYPE) == list(params)
    assert list(utils.GetBlobs(loaded, pc.INPUTS_BLOB_TYPE)) == ["x"] and utils.GetBlobs(loaded, "none") == []
    init = utils.GetNet(loaded, pc.PREDICT_INIT_NET_TYPE)
    assert [(op.type, list(op.output)) for op in init.op] == [("ConstantFill", ["x"]), ("ConstantFill", ["y"])]
    assert [list(a.ints) for op in init.op for a in op.arg if a.name == "shape"] == [[2, 4], [2, 3]]
    load = utils.GetNet(loaded, pc.GLOBAL_INIT_NET_TYPE).op[0]
    assert (load.type, list(load.input), list(load.output)) == ("Load", ["!!PREDICTOR_DBREADER"], list(params))
    predict = utils.GetNet(loaded, pc.PREDICT_NET_TYPE)
    assert list(predict.external_input) == ["x", *params] and list(predict.external_output) == ["y"]

    workspace.ResetWorkspace()
    predict_net = pe.prepare_prediction_net(path, "minidb")
    assert workspace.FetchBlob("x").tolist() == np.zeros((2, 4)).tolist()          # the predict-init net's zeros
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(predict_net)
    got = workspace.FetchBlob("y")
    np.testing.assert_array_equal(got, trained)
    z = np.maximum(x.astype(np.float64) @ params["w1"].T + params["b1"], 0) @ params["w2"].T + params["b2"]
    np.testing.assert_allclose(got, np.exp(z) / np.exp(z).sum(axis=1, keepdims=True), rtol=1e-5)


def test_predictor_export_meta_checks_and_names():
    from stepnet.compat import core
    from stepnet.compat.predictor import predictor_exporter as pe

    net = core.Net("n")
    with pytest.raises(AssertionError, match="unique"):
        pe.PredictorExportMeta(net, [], ["a", "a"], [])
    with pytest.raises(AssertionError, match="Parameters and inputs are required to be disjoint"):
        pe.PredictorExportMeta(net, ["w"], ["w"], [])
    with pytest.raises(AssertionError, match="Parameters and outputs"):
        pe.PredictorExportMeta(net, [core.BlobReference("w")], [], ["w"])
    helper = pe.get_predictor_exporter_helper("sub")
    assert (helper.predict_net_name(), helper.parameters_name()) == ("PREDICT_NET_TYPE_sub", "PARAMETERS_BLOB_TYPE_sub")
    assert pe.PredictorExportMeta(net, [], [], []).global_init_name() == "GLOBAL_INIT_NET_TYPE"
    meta = pe.get_meta_net_def(pe.PredictorExportMeta(net, [], ["a"], ["b"], shapes={"a": [1], "b": [2, 2]}))
    pe.set_model_info(meta, "project", "class", "1")
    assert (meta.modelInfo.project, meta.modelInfo.predictorType) == ("project", "SINGLE_PREDICTOR")
    with pytest.raises(Exception, match="c not in workspace but needed for shape"):
        pe.get_meta_net_def(pe.PredictorExportMeta(net, [], ["c"], []))


def test_visualize_tiles_patches(monkeypatch):
    """NCHW.ShowMultiple of three 1×2×2 patches: a 2×2 grid of 2×2 tiles one pixel apart, on the patches' mean."""
    import types

    from stepnet.compat import visualize
    shown = []
    pyplot = types.SimpleNamespace(imshow=lambda image, **kw: shown.append((image, kw)), axis=lambda *a: None)
    monkeypatch.setitem(sys.modules, "matplotlib", types.SimpleNamespace(cm=types.SimpleNamespace(gray="gray"),
                                                                         pyplot=pyplot))
    patches = np.arange(12, dtype=np.float32).reshape(3, 1, 2, 2)
    visualize.NCHW.ShowMultiple(patches)
    (image, kw), = shown
    m = 5.5
    assert image.tolist() == [[0, 1, m, 4, 5], [2, 3, m, 6, 7], [m] * 5, [8, 9, m, m, m], [10, 11, m, m, m]]
    assert kw == {"cmap": "gray", "interpolation": "nearest"}
    color = visualize.PatchVisualizer(gap=0).ShowMultiple(np.ones((2, 2, 2, 3)), ncols=2)
    assert color.shape == (2, 4, 3)
    assert visualize.ChannelFirst(np.zeros((4, 5, 3))).shape == (3, 4, 5)
    assert visualize.PatchVisualizer().get_patch_shape(np.zeros(27)) == (3, 3, 3)
    with pytest.raises(ValueError, match="patch shape"):
        visualize.PatchVisualizer().get_patch_shape(np.zeros(10))


# --------------------------------------------------------------------------------------------- MNIST
SEGMENTS = {"a": ((0, 0), (1, 0)), "b": ((1, 0), (1, 1)), "c": ((1, 1), (1, 2)), "d": ((0, 2), (1, 2)),
            "e": ((0, 1), (0, 2)), "f": ((0, 0), (0, 1)), "g": ((0, 1), (1, 1))}
DIGITS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def digit_images(n: int, seed: int):
    """n 28×28 uint8 digits (white strokes on black, as MNIST) and their labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    yy, xx = np.mgrid[0:28, 0:28].astype(np.float64)
    images = np.zeros((n, 28, 28), np.uint8)
    for k, label in enumerate(labels):
        angle, shear = rng.uniform(-0.2, 0.2), rng.uniform(-0.25, 0.25)
        rotate = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        m = rotate @ np.array([[1.0, shear], [0.0, 1.0]]) @ np.diag([rng.uniform(7, 10), rng.uniform(6, 8)])
        center, pen = np.array([14.0, 14.0]) + rng.uniform(-2, 2, 2), rng.uniform(1.0, 2.0)
        ink = np.zeros((28, 28))
        for segment in DIGITS[label]:
            p, q = (m @ (np.array(end, float) - (0.5, 1.0)) + center for end in SEGMENTS[segment])
            d = q - p
            t = np.clip(((xx - p[0]) * d[0] + (yy - p[1]) * d[1]) / (d @ d), 0, 1)
            ink = np.maximum(ink, np.clip(pen + 0.5 - np.hypot(xx - p[0] - t * d[0], yy - p[1] - t * d[1]), 0, 1))
        images[k] = np.round(np.clip(ink + rng.normal(0, 0.05, ink.shape), 0, 1) * 255)
    return images, labels


def write_mnist_lmdb(path: Path, images, labels) -> None:
    """Records as Caffe2's make_mnist_db writes them (--channel_first)."""
    import lmdb
    env = lmdb.open(str(path), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for k, (image, label) in enumerate(zip(images, labels)):
            protos = caffe2_pb2.TensorProtos()
            data = protos.protos.add(data_type=caffe2_pb2.TensorProto.BYTE, dims=[1, 28, 28])
            data.byte_data = image.tobytes()
            protos.protos.add(data_type=caffe2_pb2.TensorProto.INT32, int32_data=[int(label)])
            txn.put(b"%08d" % k, protos.SerializeToString())
    env.close()


def lenet_softmax(p: dict, images) -> np.ndarray:
    """LeNet as the tutorial builds it, in float64 numpy: conv 5×5 (20), max pool 2, conv 5×5 (50), max pool 2,
    FC 500, ReLU, FC 10, softmax; the input cast and scaled by 1/256 as AddInput does."""
    def conv(x, w, b):
        windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))   # N C H W kh kw
        return np.einsum("nchwij,ocij->nohw", windows, w, optimize=True) + b[None, :, None, None]

    def pool(x):
        n, c, h, w = x.shape
        return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))

    p = {k: v.astype(np.float64) for k, v in p.items()}
    x = images.astype(np.float64)[:, None] / 256
    x = pool(conv(pool(conv(x, p["conv1_w"], p["conv1_b"])), p["conv2_w"], p["conv2_b"]))
    x = np.maximum(x.reshape(len(x), -1) @ p["fc3_w"].T + p["fc3_b"], 0) @ p["pred_w"].T + p["pred_b"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def proto_lines(part: str, home: str) -> list:
    """A printed `str(proto)[:400] + '\\n...'` as lines to compare: the home folder as <HOME>, `name: ""` lines
    dropped (see the test), the cut line and '...' dropped, and each run of complete `arg {}` blocks in sorted
    order (Python 2 gave an op's keyword arguments in hash order)."""
    lines = [line for line in part.strip().replace(home, "<HOME>").split("\n")[:-2] if line != '  name: ""']
    out, i = [], 0
    while i < len(lines):
        blocks = []
        while i < len(lines) and lines[i] == "  arg {" and "  }" in lines[i:]:
            end = lines.index("  }", i) + 1
            blocks.append(lines[i:end])
            i = end
        if blocks:
            out += [line for block in sorted(blocks) for line in block]
        else:
            out.append(lines[i])
            i += 1
    return out


def test_mnist_tutorial_trains_exports_and_reloads_lenet(tmp_path):
    """What the notebook shows, on synthetic digits in place of MNIST (the notebook's numbers are real MNIST's):

    - the protos printed: the same lines as the notebook's, but for the ops' `name: ""` (Caffe2's CreateOperator
      always sets the name; stepnet's leaves it unset) and its home folder;
    - training: the same report lines; as in the notebook the loss starts near ln 10 with accuracy near chance
      and falls to the notebook's level or below (these digits are easier than MNIST);
    - the test pass reaches at least the notebook's 95.06%, and its accuracy is the one a float64 LeNet computes
      with the parameters in the exported minidb (so the export holds the trained net);
    - the predictor (predictor_exporter.save_to_db, prepare_prediction_net) loads the blobs the notebook lists and
      gives the reference's prediction and confidence for the first image of the last test batch;
    - Summarize(to_file=1) wrote 200 lines a parameter and gradient, the last one the exported parameter's.
    """
    pytest.importorskip("lmdb")
    home = tmp_path / "home"
    data_folder = home / "caffe2_notebooks" / "tutorial_data" / "mnist"
    data_folder.mkdir(parents=True)
    write_mnist_lmdb(data_folder / "mnist-train-nchw-lmdb", *digit_images(1000, 1))
    test_images, test_labels = digit_images(500, 2)     # the test pass reads 100 batches of 100: this set 20 times
    write_mnist_lmdb(data_folder / "mnist-test-nchw-lmdb", test_images, test_labels)
    root = home / "caffe2_notebooks" / "tutorial_files" / "tutorial_mnist"

    out = run_tutorial("MNIST.py", tmp_path)
    printed = out.splitlines()     # (Print(to_file=1) writes accuracy and loss to <root>/accuracy.log, loss.log)
    assert not [line for line in printed if line.startswith(("Tensor accuracy ", "Tensor loss "))]
    assert printed[:5] == ["Necessities imported!", "lmdb train db found!", "lmdb test db found!",
                           f"training data folder:{data_folder}", f"workspace root folder:{root}"]
    text = "\n".join(printed) + "\n"
    section = text.split("*******train_model.", 1)[1].split("\nIter: 0,", 1)[0]
    parts = zip(section.split("*******train_model."), NOTEBOOK_PROTOS.split("*******train_model.")[1:], strict=True)
    for our_part, their_part in parts:
        mine, notebook = proto_lines(our_part, str(home)), proto_lines(their_part, NOTEBOOK_HOME)   # (home: a longer
        # path here than the notebook's cuts the 400 characters printed earlier)
        common = min(len(mine), len(notebook))
        assert common >= 10 and mine[:common] == notebook[:common], (mine, notebook)

    training = [(int(i), float(loss), float(acc)) for i, loss, acc in
                re.findall(r"^Iter: (\d+), Loss: ([0-9.e-]+), Accuracy: ([0-9.e-]+)$", text, re.M)]
    assert [t[0] for t in training] == [t[0] for t in NOTEBOOK_TRAINING]
    (_, loss0, acc0), (_, nb_loss0, nb_acc0) = training[0], NOTEBOOK_TRAINING[0]
    assert abs(loss0 - math.log(10)) < 0.5 and abs(nb_loss0 - math.log(10)) < 0.5 and acc0 < 0.3 and nb_acc0 < 0.3
    assert max(loss for _, loss, _ in training[4:]) <= max(loss for _, loss, _ in NOTEBOOK_TRAINING[4:])
    assert min(acc for _, _, acc in training[4:]) >= min(acc for _, _, acc in NOTEBOOK_TRAINING[4:])

    test_accuracy = float(re.search(r"^test_accuracy: ([0-9.]+)$", text, re.M).group(1))
    assert test_accuracy >= NOTEBOOK_TEST_ACCURACY
    model = root / "mnist_model.minidb"
    assert f"Deploy model saved to: {model}\n" in text
    keys = [key for key, _ in minidb.read_records(model)]     # a tensor's records are named <blob>#%<chunk>
    assert [key.split("#%")[0] for key in keys] == ["!!META_NET_DEF", *PARAMS]
    meta = caffe2_pb2.MetaNetDef.FromString(minidb.load_blobs(model, ["!!META_NET_DEF"])["!!META_NET_DEF"])
    assert {b.key: list(b.value) for b in meta.blobs} == {
        "PARAMETERS_BLOB_TYPE": PARAMS, "INPUTS_BLOB_TYPE": ["data"], "OUTPUTS_BLOB_TYPE": ["softmax"]}
    assert sorted(n.key for n in meta.nets) == ["GLOBAL_INIT_NET_TYPE", "PREDICT_INIT_NET_TYPE", "PREDICT_NET_TYPE"]
    params = minidb.load_blobs(model, PARAMS)
    reference = lenet_softmax(params, test_images)
    assert abs(np.mean(reference.argmax(axis=1) == test_labels) - test_accuracy) <= 1 / 500

    after = text.split("Deploy model saved to:", 1)[1].splitlines()[1:]
    assert after[0] == "The blobs in the workspace after reset: []"
    loaded = after[1].split("The blobs in the workspace after loading the model: ", 1)[1]
    assert ast.literal_eval(loaded) == ast.literal_eval(NOTEBOOK_LOADED)
    assert after[2] == "Shape of softmax:  (100, 10)"
    first = reference[400]                             # batch 100 of 100 is images 400-499 of the 500
    assert after[3] == f"Prediction:  {first.argmax()}"
    assert abs(float(after[4].split("Confidence:  ", 1)[1]) - first.max()) < 1e-5

    losses = (root / "loss.log").read_text().splitlines()       # one line a training iteration, Caffe2's format
    assert len(losses) == 200 and len((root / "accuracy.log").read_text().splitlines()) == 200
    logged = [float(line.split("Tensor loss of type float32. Dims: (): ", 1)[1]) for line in losses]
    np.testing.assert_allclose([logged[i] for i, _, _ in training], [loss for _, loss, _ in training],
                               rtol=1e-5)      # the loss the script reported, as C++ prints it: 6 significant digits
    for name in PARAMS:
        lines = (root / f"{name}.summary").read_text().splitlines()
        assert len(lines) == 200 and len((root / f"{name}_grad.summary").read_text().splitlines()) == 200
        p = params[name].astype(np.float64)
        np.testing.assert_allclose([float(v) for v in lines[-1].split()],
                                   [p.min(), p.max(), p.mean(), p.std(ddof=1)], rtol=2e-5, atol=1e-9)


# --------------------------------------------------------------------------------------------- Control_Ops
NOTEBOOK_CONTROL_OPS = [                                              # the stdout of cells 3, 5, 9, 11, 14, 16, 17, 19
    "x =  0.5\ny =  1.0\n", "x =  1.5\ny =  2.0\n", "x =  [0.5]\ny =  [1.]\n", "i =  8\ny =  28\n",
    "i =  [8]\ny =  [28]\n", "x =  0.5\ny =  4.0\nz =  16.0\ny_grad =  8.0\n",
    "x =  -0.5\ny =  4.0\nz =  64.0\ny_grad =  48.0\n",
    "x =  16.0\nx_grad =  32.0\ny =  9.0\ny_grad =  6.0\nz =  8.0\nz_grad =  12.0\n"]
# The graphs of cells 8 and 13 (PNGs made by Graphviz from net_drawer.GetPydotGraph), read off the images:
# (from, to) for every arrow, by the nodes' labels.
IF_SCOPES, LOOP_SCOPES = ("test_if_model/workspace_if_then", "test_if_model/workspace_if_else"), \
    ("test_while_model/workspace_loop_body", "test_while_model/workspace_loop_cond")
NOTEBOOK_IF_GRAPH = {("CreateScope (op#0)", IF_SCOPES[0]), ("CreateScope (op#1)", IF_SCOPES[1]),
                     *((b, "If (op#2)") for b in (*IF_SCOPES, "cond", "zero", "one")),
                     *(("If (op#2)", b) for b in ("y", *IF_SCOPES))}
NOTEBOOK_WHILE_GRAPH = {("CreateScope (op#0)", LOOP_SCOPES[0]), ("CreateScope (op#1)", LOOP_SCOPES[1]),
                        *((b, "While (op#2)") for b in (*LOOP_SCOPES, "cond", "i", "y", "seven", "one")),
                        *(("While (op#2)", b) for b in ("y", "i", "cond", *LOOP_SCOPES))}


def dot_arrows(text: str) -> set:
    """{(from label, to label)} of a digraph as net_drawer writes it (a node's label is its id unless given)."""
    labels = dict(re.findall(r'^\s*"([^"]+)" \[label="([^"]+)"', text, re.M))
    return {(labels.get(a, a), labels.get(b, b)) for a, b in re.findall(r'^\s*"([^"]+)" -> "([^"]+)";$', text, re.M)}


def test_control_ops_tutorial_prints_what_the_notebook_shows(tmp_path):
    """NetBuilder's IfNet/Else and WhileNet/Condition in a Plan run by workspace.C.Workspace (block-local blobs gone
    afterwards: the program asserts it), brew.cond and brew.loop (CreateScope + If/While over Do-wrapped nets), and
    the gradients of If and While through AddGradientOperators (y_grad 2y or 3y², x_grad 4x³ through a loop):
    stdout is exactly the notebook's, character for character, and the two drawn graphs have the notebook's
    arrows (its PNGs' nodes and edges; Graphviz's placement is not compared). The notebook's other output, Caffe2's
    stderr warning that it was built without GPU support, is not stepnet's to print."""
    out = run_tutorial("Control_Ops.py", tmp_path)
    assert out == "".join(NOTEBOOK_CONTROL_OPS)
    graphs = [dot_arrows((tmp_path / "graphs" / f"{k}.dot").read_text()) for k in range(2)]
    assert graphs == [NOTEBOOK_IF_GRAPH, NOTEBOOK_WHILE_GRAPH]
    assert not (tmp_path / "graphs" / "2.dot").exists()


# --------------------------------------------------------------------------------------------- Multi-GPU_Training
# The notebook stores no outputs (it was saved unexecuted: every cell's execution_count is null), so there is nothing
# of its to compare with. Its py_gen file is not a program that runs: its lab cells (Parts 3-10) are stubs, and cell 15
# calls add_image_input_ops(train_model) before any cell defines train_model (NameError at line 441, on Caffe2 too);
# the solution cells after them hard-code two GPUs (gpus = [0, 1], DeviceOption(CUDA), Parallelize_GPU) with no
# switch, the reporting reads gpu_<k>/ blobs, the test loop is Python 2's range(96 / 64), and an epoch is 1,280
# ResNet-50 images at 224×224. So the tests below run its solution functions, compiled from the vendored file, on CPU
# devices (data_parallel_model's cpu_device=True), on small image dbs laid out as the tutorial expects them.
RESNET_DATA = Path("caffe2_notebooks", "tutorial_data", "resnet_trainer")     # under HOME; the dbs' names below
SOLUTIONS = ("add_image_input_ops", "create_resnet50_model_ops", "add_parameter_update_ops", "optimize_gradient_memory")


def write_image_db(path: Path, n: int, seed: int) -> np.ndarray:
    """n JPEG images, 40-63 pixels a side, of sine stripes in a random period, phase and colour: horizontal for label
    0, vertical for label 1; stored as Caffe2's make_image_db stores an image list (a TensorProtos of the encoded file,
    STRING dims [1], and the label, INT32 dims [1]; keys %08d_<file>). The labels, in db order."""
    import io

    import lmdb
    from PIL import Image
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for k, label in enumerate(labels):
            yy, xx = np.mgrid[0:rng.integers(40, 64), 0:rng.integers(40, 64)]
            wave = np.sin(2 * np.pi * (xx if label else yy) / rng.uniform(8, 12) + rng.uniform(0, 2 * np.pi))
            pixels = (128 + 90 * wave[..., None] * rng.uniform(0.6, 1.0, 3)).astype(np.uint8)
            encoded = io.BytesIO()
            Image.fromarray(pixels).save(encoded, format="JPEG")
            protos = caffe2_pb2.TensorProtos()
            protos.protos.add(data_type=caffe2_pb2.TensorProto.STRING, dims=[1], string_data=[encoded.getvalue()])
            protos.protos.add(data_type=caffe2_pb2.TensorProto.INT32, dims=[1], int32_data=[int(label)])
            txn.put(b"%08d_%s.jpg" % (k, (b"boat" if label else b"car")), protos.SerializeToString())
    env.close()
    return labels


def tutorial_solutions(**settings) -> dict:
    """The namespace of the tutorial's solution functions (the last definition of each name in the vendored file:
    the cells 'SOLUTION for Part 4-7'), compiled from its source, with the program's imports and `settings` (its
    Part 2 configuration, and `reader` once made) as their globals."""
    import ast

    from stepnet.compat import brew, core, memonger, model_helper, workspace
    from stepnet.compat.models import resnet
    path = PROGRAMS / "Multi-GPU_Training.py"
    source = path.read_text()
    first_solution = source[:source.index("# SOLUTION for Part 1")].count("\n") + 1
    defs = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    namespace = dict(core=core, workspace=workspace, model_helper=model_helper, memonger=memonger, brew=brew,
                     resnet=resnet, np=np, **settings)
    for name in SOLUTIONS:
        assert defs[name].lineno > first_solution, name
        exec(compile(ast.Module(body=[defs[name]], type_ignores=[]), str(path), "exec"), namespace)   # noqa: S102
    return namespace


def seeded_workspace(monkeypatch, seed: int = 0):
    """A fresh default workspace whose random ops (fills, ImageInput's crops and mirrors) draw from `seed`."""
    from stepnet import Workspace
    from stepnet.compat import workspace
    from stepnet.core.limits import Limits
    workspace.SwitchWorkspace("default", True)
    monkeypatch.setitem(workspace._workspaces, "default", Workspace(seed=seed, limits=Limits(trusted=True)))


def test_multi_gpu_tutorial_file_stops_where_its_lab_cells_leave_off(tmp_path):
    """Run unchanged, with its dbs in place (so it downloads nothing), the program gets through its imports,
    GlobalInit and the data folder check, then fails where it would on Caffe2: the Part 8 lab cell uses train_model,
    which only the (stubbed) Part 3 lab cell was to define."""
    data = tmp_path / "home" / RESNET_DATA
    data.mkdir(parents=True)
    write_image_db(data / "imagenet_cars_boats_train", 4, 1)
    write_image_db(data / "imagenet_cars_boats_val", 4, 2)
    out = tutorial_process("Multi-GPU_Training.py", tmp_path)
    assert out.returncode == 1 and out.stdout == f"Data folder found at {data}\n"
    assert out.stderr.splitlines()[-1] == "NameError: name 'train_model' is not defined"
    assert 'Multi-GPU_Training.py", line 441, in <module>' in out.stderr


def test_multi_gpu_tutorial_solutions_build_resnet50_on_cpu_devices(tmp_path, monkeypatch):
    """The solution cells' own functions, as the tutorial calls them (one image a device in place of 32):
    - Part 8 (one device, under NameScope 'imonaboat', here DeviceOption(CPU, 0) for CUDA 0): ImageInput with its
      scale 256 / crop 224 / mirror, ResNet-50, weight decay, step learning rate, Nesterov momentum, and its
      memonger.share_grad_blobs call; the shared net takes one training step to the very loss and parameters the
      net without it does, and passes gradients between layers in fewer blobs, parameter gradients untouched;
    - Parts 9 and 10: data_parallel_model on two CPU devices (cpu_device=True) builds the train model (memonger
      on, as Parallelize_GPU's optimize_gradient_memory=True) and the test model (no update) on one set of
      parameter blobs. The train init net gives both devices the same parameters (device 0's, broadcast). The
      tutorial then runs the test model's init net, which fills them again, each device its own: Caffe2's
      Parallelize returns before it syncs anything when there is no update function, so the tutorial's two
      devices train different weights from then on (the same averaged gradient step on each: a training step
      moves each device's parameters by the same amount, up to weight decay's share), as on Caffe2. The test net
      reads 224×224 crops scaled to [-1, 1], as the tutorial's display code assumes."""
    pytest.importorskip("lmdb")
    from stepnet.compat import core, model_helper, workspace
    from stepnet.compat import data_parallel_model as dpm
    train_db, test_db = tmp_path / "imagenet_cars_boats_train", tmp_path / "imagenet_cars_boats_val"
    write_image_db(train_db, 8, 1)
    write_image_db(test_db, 4, 2)
    settings = dict(batch_per_device=1, num_labels=2, base_learning_rate=0.0004 * 2, stepsize=int(10 * 8 / 2),
                    weight_decay=1e-4)

    def part8(optimize: bool):
        seeded_workspace(monkeypatch)
        ns = tutorial_solutions(**settings)
        train_model = model_helper.ModelHelper(name="train")
        ns["reader"] = train_model.CreateDB("train_reader", db=str(train_db), db_type="lmdb")
        with core.NameScope("imonaboat"):
            with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU, 0)):
                ns["add_image_input_ops"](train_model)
                losses = ns["create_resnet50_model_ops"](train_model)
                blobs_to_gradients = train_model.AddGradientOperators(losses)
                ns["add_parameter_update_ops"](train_model)
            if optimize:
                ns["optimize_gradient_memory"](train_model, [blobs_to_gradients[losses[0]]])
        workspace.RunNetOnce(train_model.param_init_net)
        workspace.CreateNet(train_model.net, overwrite=True)
        workspace.RunNet(train_model.net.Proto().name)
        blobs = {b for op in train_model.net.Proto().op for b in [*op.input, *op.output]}
        prefix = train_model.net.Proto().name          # train, then train_1: net names are unique in a process
        return (float(workspace.FetchBlob(f"imonaboat/{prefix}_loss")),
                {str(p): workspace.FetchBlob(str(p)) for p in train_model.GetParams()}, blobs, train_model)

    loss, params, blobs, _ = part8(False)
    shared_loss, shared_params, shared_blobs, model = part8(True)
    # 53 convolutions (weight, bias: no_bias=0), 53 spatial batch norms (scale, bias), the FC (weight, bias)
    assert len(params) == 214 and shared_loss == loss and 0 < loss < 5
    for name, value in params.items():
        np.testing.assert_array_equal(shared_params[name], value, err_msg=name)
    param_grads = {str(g) for g in model.param_to_grad.values()}
    assert param_grads <= shared_blobs
    gradients, shared_gradients = ({b for b in bs if b.endswith("_grad")} - param_grads for bs in (blobs, shared_blobs))
    assert len(gradients) > 100 and len(shared_gradients) < len(gradients) // 4

    seeded_workspace(monkeypatch)
    ns = tutorial_solutions(**settings)
    train_model = model_helper.ModelHelper(name="train")
    ns["reader"] = train_model.CreateDB("train_reader", db=str(train_db), db_type="lmdb")
    dpm.Parallelize(train_model, input_builder_fun=ns["add_image_input_ops"],
                    forward_pass_builder_fun=ns["create_resnet50_model_ops"],
                    param_update_builder_fun=ns["add_parameter_update_ops"], devices=[0, 1],
                    optimize_gradient_memory=True, cpu_device=True)
    workspace.RunNetOnce(train_model.param_init_net)
    workspace.CreateNet(train_model.net)
    names = [str(p).split("/", 1)[1] for p in train_model.GetParams() if str(p).startswith("cpu_0/")]
    assert len(names) == 214 and train_model._devices == [0, 1]
    for n in names:
        np.testing.assert_array_equal(workspace.FetchBlob(f"cpu_1/{n}"), workspace.FetchBlob(f"cpu_0/{n}"), err_msg=n)
    test_model = model_helper.ModelHelper(name="test")
    ns["reader"] = test_model.CreateDB("test_reader", db=str(test_db), db_type="lmdb")
    dpm.Parallelize(test_model, input_builder_fun=ns["add_image_input_ops"],
                    forward_pass_builder_fun=ns["create_resnet50_model_ops"], param_update_builder_fun=None,
                    devices=[0, 1], cpu_device=True)
    workspace.RunNetOnce(test_model.param_init_net)
    workspace.CreateNet(test_model.net)
    before = {(d, n): workspace.FetchBlob(f"cpu_{d}/{n}").copy() for d in (0, 1) for n in names}
    assert not np.array_equal(before[0, "conv1_w"], before[1, "conv1_w"])
    workspace.RunNet(train_model.net.Proto().name)
    moved = set()
    for n in names:
        step = [workspace.FetchBlob(f"cpu_{d}/{n}") - before[d, n] for d in (0, 1)]
        np.testing.assert_allclose(step[1], step[0], rtol=0, atol=1e-6, err_msg=n)   # (float32 rounding)
        moved |= {n} if np.abs(step[0]).max() > 0 else set()
    assert {n for n in names if n.endswith("_w")} <= moved and len(moved) > 100      # every weight, and more
    workspace.RunNet(test_model.net.Proto().name)
    for d in (0, 1):
        data = workspace.FetchBlob(f"cpu_{d}/data")
        assert data.shape == (1, 3, 224, 224) and -1 <= data.min() < data.max() <= 1
        assert workspace.FetchBlob(f"cpu_{d}/softmax").shape == (1, 2)
        assert float(workspace.FetchBlob(f"cpu_{d}/{test_model.net.Proto().name}_accuracy")) in (0.0, 1.0)


def test_multi_gpu_tutorial_model_learns_on_two_cpu_devices(tmp_path, monkeypatch):
    """What Parts 9-11 do (Parallelize with the tutorial's settings and its parameter update function; train,
    reading the accuracy of every device; then the test net), on two CPU devices, with 8 images a device, cropped to
    32×32 (scale 36) so that ResNet-50's final pool is 1×1 (final_avg_kernel=1) in place of 224×224 and 7: 24
    iterations (6 epochs of 64 stripe images) at the tutorial's learning rate, 0.0004 × the total batch. The
    training accuracy starts at chance; the loss (the devices' mean) falls, after early steps that overshoot (as with
    a batch of 16), to under a quarter of its first six iterations' mean and half its first value; the accuracy of
    the last six iterations is 85% or more, and so is the test net's on 32 unseen images. (Seeded; with workspace
    seeds 0-4 the last six iterations' loss was 2-17% of the first six's and the test accuracy 91-100%.)"""
    pytest.importorskip("lmdb")
    from stepnet.compat import brew, model_helper, workspace
    from stepnet.compat import data_parallel_model as dpm
    from stepnet.compat.models import resnet
    write_image_db(tmp_path / "train", 64, 1)
    test_labels = write_image_db(tmp_path / "val", 32, 2)
    gpus, batch_per_device, train_data_count = [0, 1], 8, 64
    total_batch_size = batch_per_device * len(gpus)
    ns = tutorial_solutions(batch_per_device=batch_per_device, num_labels=2,
                            base_learning_rate=0.0004 * total_batch_size,
                            stepsize=int(10 * train_data_count / total_batch_size), weight_decay=1e-4)

    def add_image_input_ops(model):                 # the tutorial's, but for scale and crop
        data, label = brew.image_input(model, ns["reader"], ["data", "label"], batch_size=batch_per_device,
                                       mean=128., std=128., scale=36, crop=32, is_test=False, mirror=1)
        model.net.StopGradient(data, data)

    def create_resnet50_model_ops(model, loss_scale=1.0):    # the tutorial's, but for the final pool
        [softmax, loss] = resnet.create_resnet50(model, "data", num_input_channels=3, num_labels=2, label="label",
                                                 final_avg_kernel=1)
        prefix = model.net.Proto().name
        loss = model.net.Scale(loss, prefix + "_loss", scale=loss_scale)
        brew.accuracy(model, [softmax, "label"], prefix + "_accuracy")
        return [loss]

    seeded_workspace(monkeypatch)
    models = {}
    # the test model's init net first: run after the train model's (as the tutorial runs them), it would give the
    # two devices different weights (see the test above)
    for name, db, update in (("test", "val", None), ("train", "train", ns["add_parameter_update_ops"])):
        model = models[name] = model_helper.ModelHelper(name=name)
        ns["reader"] = model.CreateDB(f"{name}_reader", db=str(tmp_path / db), db_type="lmdb")
        dpm.Parallelize(model, input_builder_fun=add_image_input_ops,
                        forward_pass_builder_fun=create_resnet50_model_ops, param_update_builder_fun=update,
                        devices=gpus, optimize_gradient_memory=update is not None, cpu_device=True)
        workspace.RunNetOnce(model.param_init_net)
        workspace.CreateNet(model.net)

    def run(model) -> tuple:
        workspace.RunNet(model.net.Proto().name)
        prefix = model.net.Proto().name
        return tuple(np.mean([float(workspace.FetchBlob(f"cpu_{d}/{prefix}_{what}")) for d in gpus])
                     for what in ("loss", "accuracy"))

    losses, accuracies = zip(*(run(models["train"]) for _ in range(24)))
    curve = ([round(float(v), 3) for v in losses], [float(v) for v in accuracies])
    assert accuracies[0] <= 0.75 and np.mean(accuracies[:6]) <= 0.7, curve
    assert np.mean(losses[-6:]) < min(0.25 * np.mean(losses[:6]), 0.5 * losses[0]), curve
    assert np.mean(accuracies[-6:]) >= 0.85, curve
    test_accuracy = np.mean([run(models["test"])[1] for _ in range(2)])      # the 32 test images, once
    assert test_accuracy >= 0.85 and 0.3 < np.mean(test_labels) < 0.7
