"""Two Caffe2 tutorials (caffe2/tutorials `py_gen/Python_Op.py` and `py_gen/MNIST.py`, vendored byte for byte in
tests/compat/programs) run unchanged with `python -m stepnet.compat`, checked against the outputs stored in their
notebooks (`Python_Op.ipynb`, `MNIST.ipynb` at the same commit; quoted below as NOTEBOOK_*).

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
    """The program run as its users ran it, with HOME in tmp_path, the stubs importable and a stand-in `dot`."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    dot = tmp_path / "bin" / "dot"
    dot.write_text("#!/bin/sh\ncat > /dev/null\nprintf '\\211PNG\\r\\n\\032\\n'\n")
    dot.chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(STUBS),
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run([sys.executable, "-m", "stepnet.compat", str(PROGRAMS / name)], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


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
    # Print(to_file=1) is not supported by stepnet: it prints these lines to stdout (Caffe2 writes <root>/loss.log)
    printed = [line for line in out.splitlines() if not line.startswith(("Tensor accuracy ", "Tensor loss "))]
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

    for name in PARAMS:
        lines = (root / f"{name}.summary").read_text().splitlines()
        assert len(lines) == 200 and len((root / f"{name}_grad.summary").read_text().splitlines()) == 200
        p = params[name].astype(np.float64)
        np.testing.assert_allclose([float(v) for v in lines[-1].split()],
                                   [p.min(), p.max(), p.mean(), p.std(ddof=1)], rtol=2e-5, atol=1e-9)
