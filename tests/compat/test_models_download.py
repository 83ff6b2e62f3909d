"""caffe2.python.models.download against a local http.server (no network here): Caffe2's command line
(`-i`, `-f`, its prompts and messages, its URL scheme base + MODEL/FILE), installation into the user folder
(HOME/.cache/stepnet/models, or $STEPNET_CACHE_DIR/models) from which `caffe2.python.models.MODEL` imports with
`init_net` / `predict_net` NetDefs, and downloads that fail (404, a body cut short, bytes that are no NetDef)
leaving nothing written and an installed model untouched. The base URL is redirected with STEPNET_MODELS_URL."""
import functools
import http.server
import importlib
import io
import os
import signal
import subprocess
import sys
import threading
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from stepnet import caffe2_pb2
from stepnet.compat import core
from stepnet.compat import models
from stepnet.compat.models import download

W = np.array([[1.0, 2.0], [3.0, -4.0], [0.5, 0.25]], np.float32)
B = np.array([0.5, -1.0, 2.0], np.float32)


def tiny_nets(scale: float = 1.0) -> tuple[bytes, bytes]:
    """(init_net, predict_net) bytes of y = x W'ᵀ + b with W' = scale·W."""
    init = caffe2_pb2.NetDef(name="tiny_init")
    for name, value in (("w", W * scale), ("b", B)):
        init.op.extend([core.CreateOperator("GivenTensorFill", [], [name], shape=list(value.shape),
                                            values=[float(v) for v in value.ravel()])])
    predict = caffe2_pb2.NetDef(name="tiny")
    predict.op.extend([core.CreateOperator("FC", ["x", "w", "b"], ["y"])])
    predict.external_input.extend(["x", "w", "b"])
    predict.external_output.extend(["y"])
    return init.SerializeToString(), predict.SerializeToString()


class Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the site folder; /cut/... announces 1000 bytes and sends 10 before closing."""

    def do_GET(self):
        if self.path.startswith("/cut/"):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"\x0a" * 10)
            self.close_connection = True
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def site(tmp_path):
    """(folder served, base URL): tiny/ and garbage/ hold a model's two files; cut/ is a body cut short."""
    root = tmp_path / "site"
    init, predict = tiny_nets()
    for model, files in (("tiny", (init, predict)), ("garbage", (b"\xff" * 40, b"\xff" * 40))):
        (root / model).mkdir(parents=True)
        (root / model / "init_net.pb").write_bytes(files[0])
        (root / model / "predict_net.pb").write_bytes(files[1])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class Result:
    def __init__(self, returncode, stdout):
        self.returncode, self.stdout = returncode, stdout


@pytest.fixture
def cli(monkeypatch, capsys):
    """Runs the command line in this process: `download.main(ARGS)` with HOME in tmp_path, in tmp_path/work,
    stdin given; the SIGINT handler it installs is put back."""
    monkeypatch.setattr(models, "__path__", list(models.__path__))

    def run(tmp_path, url, *args, stdin=""):
        for name in ("STEPNET_CACHE_DIR", "XDG_CACHE_HOME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.setenv(download.URL_ENV, url)
        (tmp_path / "work").mkdir(exist_ok=True)
        monkeypatch.chdir(tmp_path / "work")
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        handler = signal.getsignal(signal.SIGINT)
        capsys.readouterr()
        try:
            code = download.main(list(args))
        except SystemExit as e:
            code = e.code
        finally:
            signal.signal(signal.SIGINT, handler)
        return Result(code, capsys.readouterr().out)
    return run


def listing(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def test_install_then_import_as_caffe2_python_models(site, tmp_path):
    """Caffe2's command line, `python -m ...download -i tiny`, then another process imports the model."""
    root, url = site
    env = {k: v for k, v in os.environ.items() if k not in ("STEPNET_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(HOME=str(tmp_path / "home"), STEPNET_MODELS_URL=url)
    r = subprocess.run([sys.executable, "-m", "stepnet.compat.models.download", "-i", "tiny"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    installed = tmp_path / "home" / ".cache" / "stepnet" / "models" / "tiny"
    assert listing(installed.parent) == ["tiny", "tiny/__init__.py", "tiny/init_net.pb", "tiny/predict_net.pb"]
    for f in ("init_net.pb", "predict_net.pb"):
        assert (installed / f).read_bytes() == (root / "tiny" / f).read_bytes()
        assert f"Downloading from {url}tiny/{f}\n" in r.stdout and f"Writing to {installed / f}\n" in r.stdout
    assert "\u001b[1000D[" + 70 * "#" + "] 100%" in r.stdout             # Caffe2's progress bar, full
    program = ("import numpy as np\nfrom stepnet.compat import alias\nalias.install()\n"
               "from caffe2.python.models import tiny\nimport caffe2.python.models.tiny as same\n"
               "import stepnet.compat.models.tiny as also\nfrom caffe2.python import workspace\n"
               "assert tiny is same is also\n"
               "p = workspace.Predictor(tiny.init_net, tiny.predict_net)\n"
               "print(type(tiny.init_net).__name__, tiny.predict_net.name, p.run({'x': np.float32([[1, 2]])})[0])\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    y = np.float32([[1, 2]]) @ W.T + B                                  # [5.5, -6, 3]
    assert out.stdout == f"NetDef tiny {y}\n" and y.tolist() == [[5.5, -6.0, 3.0]]


def test_download_into_the_current_folder_and_replace_it(site, tmp_path, cli):
    root, url = site
    r = cli(tmp_path, url, "tiny")
    assert r.returncode == 0, r.stderr
    work = tmp_path / "work"
    assert listing(work) == ["tiny", "tiny/init_net.pb", "tiny/predict_net.pb"]
    assert "Writing to tiny/predict_net.pb\n" in r.stdout and not (tmp_path / "home").exists()
    init, predict = tiny_nets(scale=2.0)                 # a newer model on the server
    (root / "tiny" / "init_net.pb").write_bytes(init)
    r = cli(tmp_path, url, "tiny", stdin="\n")           # the prompt's default: no
    assert r.stdout.endswith("Model already exists, continue? [y/N] Cancelling download...\n")
    assert (work / "tiny" / "init_net.pb").read_bytes() == tiny_nets()[0]
    r = cli(tmp_path, url, "tiny", stdin="y\n")
    assert "Overwriting existing folder! (tiny)\n" in r.stdout and r.returncode == 0
    assert (work / "tiny" / "init_net.pb").read_bytes() == init
    (root / "tiny" / "init_net.pb").write_bytes(tiny_nets(scale=3.0)[0])
    r = cli(tmp_path, url, "-f", "tiny")
    assert "continue?" not in r.stdout and (work / "tiny" / "init_net.pb").read_bytes() == tiny_nets(3.0)[0]
    assert listing(work) == ["tiny", "tiny/init_net.pb", "tiny/predict_net.pb"]


@pytest.mark.parametrize("model, reason", [
    ("missing", "Could not download model. [HTTP Error] 404: File not found."),
    ("cut", "Could not download model. [Incomplete] 10 of 1000 bytes."),
    ("garbage", "garbage/predict_net.pb: the value is not a serialized NetDef"),
])
def test_a_failed_download_leaves_nothing_and_keeps_the_installed_model(site, tmp_path, cli, model, reason):
    root, url = site
    assert cli(tmp_path, url, "-i", "tiny").returncode == 0
    models = tmp_path / "home" / ".cache" / "stepnet" / "models"
    before = {p: (models / p).read_bytes() for p in listing(models) if (models / p).is_file()}
    r = cli(tmp_path, url, "-i", model)
    assert r.returncode == 1 and "\nAbort: " in r.stdout and r.stdout.endswith(f"{reason}\nCleaning up...\n")
    assert listing(models) == ["tiny", "tiny/__init__.py", "tiny/init_net.pb", "tiny/predict_net.pb"]
    # the same failure replacing an installed model (-f): the old one stays as it was
    os.rename(root / "tiny", root / "tiny_ok")
    os.rename(root / ("garbage" if model == "garbage" else "tiny_ok"), root / "tiny")
    target = url if model != "cut" else url + "cut/"
    r = cli(tmp_path, target, "-i", "-f", "tiny")
    if model == "missing":
        os.rename(root / "tiny", root / "tiny_ok")
        r = cli(tmp_path, url, "-i", "-f", "tiny")
    assert r.returncode == 1 and "Abort: " in r.stdout and "Overwriting existing folder!" in r.stdout
    assert {p: (models / p).read_bytes() for p in listing(models) if (models / p).is_file()} == before
    assert listing(tmp_path / "work") == []


def test_functions_and_the_url_override(site, tmp_path, monkeypatch):
    root, url = site
    monkeypatch.delenv(download.URL_ENV, raising=False)
    assert download.getURLFromName("squeezenet", "init_net.pb") == (
        "https://s3.amazonaws.com/download.caffe2.ai/models/squeezenet/init_net.pb")
    monkeypatch.setenv(download.URL_ENV, url.rstrip("/"))
    assert download.getURLFromName("tiny", "init_net.pb") == url + "tiny/init_net.pb"
    assert [download.validModelName(n) for n in ("squeezenet", "style_transfer/crayon", "__init__", "a.b",
                                                 "../x", "", "/etc")] == [True, True, False, False, False, False,
                                                                          False]
    target = tmp_path / "f.pb"
    download.downloadFromURLToFile(url + "tiny/predict_net.pb", target, show_progress=False)
    assert target.read_bytes() == (root / "tiny" / "predict_net.pb").read_bytes()
    with pytest.raises(Exception, match=r"^Could not download model. \[HTTP Error\] 404"):
        download.downloadFromURLToFile(url + "nope/x.pb", tmp_path / "g.pb")
    with pytest.raises(Exception, match=r"^Could not download model. \[URL Error\]"):
        download.downloadFromURLToFile("http://127.0.0.1:9/x.pb", tmp_path / "g.pb")
    assert listing(tmp_path) == listing(tmp_path) and not (tmp_path / "g.pb").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_install_in_process_then_import(site, tmp_path, monkeypatch, capsys):
    """A program that installs and imports in one process: the models package looks in the install folder
    ($STEPNET_CACHE_DIR/models here) from then on."""
    _, url = site
    monkeypatch.setenv(download.URL_ENV, url)
    monkeypatch.setenv("STEPNET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "__path__", list(models.__path__))
    download.downloadModel("tiny", Namespace(install=True, force=False))
    name = "stepnet.compat.models.tiny"
    sys.modules.pop(name, None)
    try:
        module = importlib.import_module(name)
        assert Path(module.__file__) == tmp_path / "cache" / "models" / "tiny" / "__init__.py"
        assert module.predict_net.SerializeToString() == tiny_nets()[1]
        assert module.init_net.SerializeToString() == tiny_nets()[0]
    finally:
        sys.modules.pop(name, None)
    assert "Writing to " + str(tmp_path / "cache" / "models" / "tiny" / "init_net.pb") in capsys.readouterr().out
