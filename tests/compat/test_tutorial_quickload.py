"""caffe2/tutorials `py_gen/Model_Quickload.py` (vendored byte for byte in tests/compat/programs with the two files
it reads: `helpers.py` and `inference_codes.txt`) run unchanged with `python -m stepnet.compat`, on a SqueezeNet
installed as its users installed it: `python -m caffe2.python.models.download -i squeezenet` (here
`stepnet.compat.models.download`), from a local http.server standing in for Caffe2's model bucket
(STEPNET_MODELS_URL), into HOME/.cache/stepnet/models; the program then does `from caffe2.python.models import
squeezenet` and `workspace.Predictor(init_net, predict_net)`.

The predict net is the real SqueezeNet 1.1 one (tests/data/caffe2/squeeze_predict_net.pb); its weights are random
(He-scaled normals, shaped by `synth_init`; the trained ones are not here), served as GivenTensorFill ops. Its
notebook's output (daisy, 98.2%) needs the trained weights; what the program prints is checked against SqueezeNet
run in float64 by torch (its convolutions and poolings, Caffe2's legacy ceil-mode pooling) on the image the
program's own helpers make: the top-1 class and confidence, and the sentence helpers.parseResults builds (which
drops entry 1 and counts from 1, as the tutorial's helper does).
"""
import functools
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from stepnet import caffe2_pb2
from stepnet.builders.synth import synth_init
from stepnet.compat import core

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
SQUEEZENET = HERE.parent / "data" / "caffe2" / "squeeze_predict_net.pb"


def squeezenet_weights(predict: caffe2_pb2.NetDef) -> dict:
    """{parameter: float32 array}: synth_init's shapes, filled here (He normals, zero biases; the classifier's
    weights 50 times smaller, so that the softmax is spread rather than one-hot)."""
    rng = np.random.default_rng(7)
    weights = {}
    for op in synth_init(predict, {"data": (1, 3, 227, 227)}).op:
        args = {a.name: a for a in op.arg}
        shape = tuple(args["shape"].ints)
        if op.type == "GaussianFill":
            std = args["std"].f / (50 if op.output[0] == "conv10_w" else 1)
            weights[op.output[0]] = rng.normal(0, std, shape).astype(np.float32)
        else:
            assert op.type == "ConstantFill", op.type
            weights[op.output[0]] = np.full(shape, args["value"].f, np.float32)
    return weights


def squeezenet_reference(predict: caffe2_pb2.NetDef, weights: dict, x: np.ndarray) -> np.ndarray:
    """The predict net's output in float64 by torch, op by op (the ops SqueezeNet uses, with their arguments)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    blobs = {k: torch.tensor(v, dtype=torch.float64) for k, v in weights.items()}
    blobs["data"] = torch.tensor(x, dtype=torch.float64)
    for op in predict.op:
        a = {arg.name: arg for arg in op.arg}
        ins = [blobs[i] for i in op.input]
        if op.type == "Conv":
            out = F.conv2d(ins[0], ins[1], ins[2], stride=a["stride"].i, padding=a["pad"].i)
        elif op.type == "Relu":
            out = F.relu(ins[0])
        elif op.type == "MaxPool":
            assert a["legacy_pad"].i == 3 and a["pad"].i == 0           # Caffe's ceil-mode output size
            out = F.max_pool2d(ins[0], a["kernel"].i, a["stride"].i, ceil_mode=True)
        elif op.type == "Concat":
            out = torch.cat(ins, dim=1)
        elif op.type == "Dropout":
            assert a["is_test"].i == 1
            out = ins[0]
        elif op.type == "AveragePool":
            assert a["global_pooling"].i == 1
            out = ins[0].mean(dim=(2, 3), keepdim=True)
        elif op.type == "Softmax":
            out = F.softmax(ins[0].reshape(len(ins[0]), -1), dim=1).reshape(ins[0].shape)
        else:
            raise AssertionError(f"unexpected op {op.type}")
        blobs[op.output[0]] = out
    return blobs[predict.external_output[0]].numpy()


@pytest.fixture
def model_server(tmp_path):
    """A local server holding squeezenet/predict_net.pb (the real one) and squeezenet/init_net.pb (random
    weights); yields (its base URL, predict net, weights)."""
    site = tmp_path / "site" / "squeezenet"
    site.mkdir(parents=True)
    shutil.copy(SQUEEZENET, site / "predict_net.pb")
    predict = caffe2_pb2.NetDef.FromString(SQUEEZENET.read_bytes())
    weights = squeezenet_weights(predict)
    init = caffe2_pb2.NetDef(name="squeezenet_init")
    for name, value in weights.items():
        init.op.extend([core.CreateOperator("GivenTensorFill", [], [name], shape=list(value.shape),
                                            values=value.ravel().tolist())])
    (site / "init_net.pb").write_bytes(init.SerializeToString())

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(tmp_path / "site")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", predict, weights
    server.shutdown()
    server.server_close()


def helpers_module():
    spec = importlib.util.spec_from_file_location("tutorial_helpers", PROGRAMS / "helpers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_model_quickload_classifies_as_squeezenet_in_float64(model_server, tmp_path):
    pytest.importorskip("skimage")
    url, predict, weights = model_server
    env = {k: v for k, v in os.environ.items() if k not in ("STEPNET_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(HOME=str(tmp_path / "home"), STEPNET_MODELS_URL=url, MPLBACKEND="Agg")
    got = subprocess.run([sys.executable, "-m", "stepnet.compat.models.download", "-i", "squeezenet"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert got.returncode == 0, got.stdout + got.stderr
    assert (tmp_path / "home" / ".cache" / "stepnet" / "models" / "squeezenet" / "init_net.pb").is_file()

    # the program's working folder: images/flower.jpg (a synthetic 300×240 picture) and inference_codes.txt
    from PIL import Image
    work = tmp_path / "work"
    (work / "images").mkdir(parents=True)
    yy, xx = np.mgrid[0:240, 0:300]
    picture = np.stack([128 + 100 * np.sin(xx / 17.0), 128 + 100 * np.cos(yy / 11.0), (xx + yy) % 256], axis=-1)
    Image.fromarray(picture.astype(np.uint8)).save(work / "images" / "flower.jpg", quality=95)
    shutil.copy(PROGRAMS / "inference_codes.txt", work)
    out = subprocess.run([sys.executable, "-m", "stepnet.compat", str(PROGRAMS / "Model_Quickload.py")],
                         capture_output=True, text=True, timeout=300, cwd=work, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]

    previous = os.getcwd()
    os.chdir(work)
    try:
        x = helpers_module().loadToNCHW("images/flower.jpg", 128, 227)      # the program's own preprocessing
    finally:
        os.chdir(previous)
    assert x.shape == (1, 3, 227, 227) and x.dtype == np.float32
    probs = squeezenet_reference(predict, weights, x).ravel()
    assert probs.shape == (1000,) and abs(probs.sum() - 1) < 1e-9
    top = int(np.argmax(probs))
    assert np.sort(probs)[-1] - np.sort(probs)[-2] > 1e-4             # no near-tie to decide by rounding
    lines = out.stdout.splitlines()
    assert lines[0] == f"Top-1 Prediction: {top}"
    assert lines[1].startswith("Top-1 Confidence: ") and abs(float(lines[1].split(": ")[1]) - probs[top]) < 1e-5
    assert lines[2] == "" and lines[3].startswith("Raw top 3 results: [array([")
    assert 0.01 < probs[top] < 0.9, probs[top]                      # a spread softmax: the check means something

    kept = np.delete(probs, 1)                      # parseResults: entry 1 dropped, then numbered from 1
    index = int(np.argmax(kept)) + 1
    codes = dict(re.findall(r"^\s*\{?(\d+): '(.*)',?\}?$", (PROGRAMS / "inference_codes.txt").read_text(), re.M))
    sentence = re.fullmatch(r"The image contains a (.*) with a (\S+) percent probability\.", lines[4])
    assert sentence and sentence.group(1) == codes[str(index)] and len(lines) == 5
    assert abs(float(sentence.group(2)) - 100 * kept[index - 1]) < 1e-3
