"""caffe2.python.models.download: Caffe2's model-zoo downloader.

    python -m stepnet.compat.models.download [-i] [-f] MODEL [MODEL...]

fetches MODEL/predict_net.pb and MODEL/init_net.pb from DOWNLOAD_BASE_URL (Caffe2's, an S3 bucket) into the folder
./MODEL, or with -i (--install) installs the model, so that `from caffe2.python.models import MODEL` gives its
`init_net` and `predict_net` NetDefs. Caffe2 installed into its own package; stepnet installs into a user folder
(models._installed.install_dir(): $STEPNET_CACHE_DIR/models, else ~/.cache/stepnet/models) that the models package
imports from. An existing model is replaced after asking ("Model already exists, continue? [y/N] "), or without
asking with -f (--force).

The base URL is DOWNLOAD_BASE_URL unless the environment sets STEPNET_MODELS_URL (a mirror, or a local server for
tests): getURLFromName(name, filename) is base + name + "/" + filename.

Downloaded files are untrusted: each is written beside its destination and renamed into place only once complete
(as many bytes as the server announced); the two nets must parse as NetDefs; and a model folder (an existing one
included) is replaced only once both nets are in. A failed download prints "Abort: <reason>" and leaves nothing
behind. Differences from Caffe2: no SIGINT handler is installed on import (only by the command line); a failed
download exits with status 1 (Caffe2's exit(0)); the old model stays until the new one is complete (Caffe2
deleted it first); a name that is an absolute path is refused.
"""
from __future__ import annotations

import argparse
import http.client
import importlib
import os
import re
import shutil
import signal
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from . import _installed

DOWNLOAD_BASE_URL = "https://s3.amazonaws.com/download.caffe2.ai/models/"
DOWNLOAD_COLUMNS = 70
URL_ENV = "STEPNET_MODELS_URL"       # overrides DOWNLOAD_BASE_URL when set
TIMEOUT_S = 60                       # for each connect and read (Caffe2 waited forever)
HTTPError, URLError = urllib.error.HTTPError, urllib.error.URLError


def base_url() -> str:
    """The URL models are fetched under: $STEPNET_MODELS_URL if set, else DOWNLOAD_BASE_URL; ends with '/'."""
    url = os.environ.get(URL_ENV) or DOWNLOAD_BASE_URL
    return url if url.endswith("/") else url + "/"


def signalHandler(signal, frame):  # noqa: ARG001 - a signal handler's signature
    """Caffe2's SIGINT handler for the command line: stop the download at once."""
    print("Killing download...")
    sys.exit(0)


def deleteDirectory(top_dir) -> None:
    """Remove a folder and everything under it (links are removed, not followed)."""
    shutil.rmtree(top_dir)


def progressBar(percentage) -> None:
    """Caffe2's progress bar: back to column 0, then [####   ] N%."""
    full = int(DOWNLOAD_COLUMNS * percentage / 100)
    sys.stdout.write("\u001b[1000D[" + full * "#" + (DOWNLOAD_COLUMNS - full) * " " + "] " + str(percentage) + "%")
    sys.stdout.flush()


def _announced_size(response) -> int | None:
    value = response.info().get("Content-Length")
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None


def _fetch(url: str, filename, show_progress: bool, shown_as=None) -> None:
    """url's body into filename through a temporary file beside it, renamed into place once complete."""
    print("Downloading from {url}".format(url=url))
    try:
        response = urllib.request.urlopen(url, timeout=TIMEOUT_S)
    except HTTPError as e:
        raise Exception("Could not download model. [HTTP Error] {code}: {reason}."
                        .format(code=e.code, reason=e.reason)) from None
    except URLError as e:
        raise Exception("Could not download model. [URL Error] {reason}.".format(reason=e.reason)) from None
    filename = Path(filename)
    with response:
        size = _announced_size(response)
        print("Writing to {filename}".format(filename=shown_as or filename))
        fd, partial = tempfile.mkstemp(prefix=f".{filename.name}.", suffix=".part", dir=filename.parent)
        try:
            done = 0
            if show_progress and size:
                progressBar(0)
            with os.fdopen(fd, "wb") as local_file:
                while True:
                    try:
                        data_chunk = response.read(8192)
                    except (OSError, http.client.HTTPException) as e:
                        raise Exception("Could not download model. [Read Error] {reason} after {n} bytes."
                                        .format(reason=e.__class__.__name__, n=done)) from None
                    if not data_chunk:
                        break
                    local_file.write(data_chunk)
                    done += len(data_chunk)
                    if show_progress and size:
                        progressBar(int(100 * done / size))
            if size is not None and done != size:
                raise Exception("Could not download model. [Incomplete] {n} of {size} bytes."
                                .format(n=done, size=size))
            os.replace(partial, filename)
        except Exception:
            if show_progress and size:
                print("")           # ends the progress bar's line before the caller reports
            raise
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    print("")  # ends the progress bar's line


def downloadFromURLToFile(url, filename, show_progress=True) -> None:
    """Download url into the file filename (created or replaced only once the whole body has arrived). Raises
    Exception("Could not download model. ...") on an HTTP, network or incomplete-body error."""
    _fetch(str(url), filename, show_progress)


def getURLFromName(name, filename) -> str:
    """The URL of one file of a model: base_url() + name + '/' + filename."""
    return "{base_url}{name}/{filename}".format(base_url=base_url(), name=name, filename=filename)


def _abort(reason, staging: Path) -> None:
    print("Abort: {reason}".format(reason=reason))
    print("Cleaning up...")
    shutil.rmtree(staging, ignore_errors=True)
    sys.exit(1)


def _confirm_replace(target: Path, force: bool) -> None:
    """Caffe2's checks before replacing what is at target (a file needs -f; a folder needs -f or a yes)."""
    if target.exists() and not target.is_dir():
        if not force:
            raise Exception("Cannot create folder for storing the model, there exists a file of the same name.")
        print("Overwriting existing file! ({filename})".format(filename=target))
    elif target.is_dir():
        if not force:
            try:
                response = input("Model already exists, continue? [y/N] ")
            except EOFError:
                response = ""
            if response.upper() == "N" or not response:
                print("Cancelling download...")
                sys.exit(0)
        print("Overwriting existing folder! ({filename})".format(filename=target))


def _put_in_place(staging: Path, target: Path) -> None:
    """staging renamed to target; what target held is moved aside first and removed after."""
    old = None
    if os.path.lexists(target):
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.rename(target, old / target.name)
    os.rename(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def downloadModel(model, args) -> None:
    """Download model's two nets into ./model, or with args.install into the install folder as an importable
    model (args: a namespace with install and force, as the command line makes)."""
    if Path(model).is_absolute():
        print("'{}' is not a valid model name.".format(model))
        return
    target = (_installed.install_dir() / model) if args.install else Path(model)
    _confirm_replace(target, args.force)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    for f in _installed.NET_FILES:
        try:
            _fetch(getURLFromName(model, f), staging / f, True, shown_as=target / f)
            _installed.read_net(staging / f, shown_as=target / f)
        except Exception as e:  # noqa: BLE001 - Caffe2 reports any failure as an abort (StepnetErrors included)
            _abort(e, staging)
    if args.install:
        (staging / "__init__.py").write_text(_installed.PACKAGE_INIT)
    _put_in_place(staging, target)
    if args.install:
        package = importlib.import_module(__package__)
        _installed.add_to_path(package.__path__)
        importlib.invalidate_caches()


def validModelName(name) -> bool:
    """Caffe2's check: letters, digits, '_', '-' and '/' only, and not '__init__'; and (stepnet) a name within
    the models folder, not an absolute path such as "/etc", which the download would replace."""
    if name in ["__init__"] or name.startswith("/"):
        return False
    return bool(re.match("^[/0-9a-zA-Z_-]+$", name))


def main(argv=None) -> int:
    """The command line (Caffe2's arguments)."""
    parser = argparse.ArgumentParser(description="Download or install pretrained models.")
    parser.add_argument("model", nargs="+", help="Model to download/install.")
    parser.add_argument("-i", "--install", action="store_true", help="Install the model.")
    parser.add_argument("-f", "--force", action="store_true", help="Force a download/installation.")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signalHandler)
    for model in args.model:
        if validModelName(model):
            downloadModel(model, args)
        else:
            print("'{}' is not a valid model name.".format(model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
