"""Predict nets run by onnxruntime: exported once, kept by content, run many times (`stepnet run --engine
onnxruntime` / `--engine auto`, and OnnxNet in Python).

An export depends on the predict net, the weights it takes, the inputs' names, dtypes and shapes, the outputs, the
opset and the versions of stepnet, onnx and onnxruntime: their sha256 is its key. A model is exported once per
key and kept in memory for the process and as `<key>.onnx` in the cache directory ($STEPNET_CACHE_DIR, else
$XDG_CACHE_HOME/stepnet/onnx, else ~/.cache/stepnet/onnx; at most CACHE_ENTRIES files, the least recently used
go first), so a second run of a model with the same weights and input shapes loads it instead of exporting it
again. Models whose weights must go to external data (over 2 GiB) are kept in memory only.

threads: onnxruntime's intra-op threads (one inter-op thread: a predict net is run op after op, as stepnet runs
it); 0 or None leaves onnxruntime's default (every core), as `--threads 0` leaves BLAS's.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ...core.errors import FileFormatError
from ...core.version import VERSION
from ...io import proto
from .errors import ExportError, require

CACHE_ENTRIES = 32
_SESSIONS: dict = {}      # key -> (session, [(blob, graph output)]): this process's exports, by content


def cache_dir() -> Path:
    """Where exported models are kept between runs."""
    explicit = os.environ.get("STEPNET_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stepnet" / "onnx"


def content_key(predict, params: dict, inputs: dict, outputs, opset: int) -> str:
    """sha256 of everything an export of the predict net depends on."""
    onnx, ort = require("onnx"), require("onnxruntime")
    h = hashlib.sha256()
    for part in (f"stepnet {VERSION} onnx {onnx.__version__} onnxruntime {ort.__version__} opset {opset}",
                 f"outputs {list(outputs or [])}"):
        h.update(part.encode() + b"\0")
    h.update(predict.SerializeToString(deterministic=True))
    for kind, values in (("input", inputs), ("param", params)):
        for name in sorted(values):
            a = np.ascontiguousarray(values[name])
            h.update(f"{kind} {name!r} {a.dtype.str} {a.shape}".encode() + b"\0")
            if kind == "param":
                h.update(memoryview(a).cast("B") if a.dtype != object else repr(a.tolist()).encode())
    return h.hexdigest()


def session_options(threads: int | None):
    ort = require("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 4   # fatal only: its own error log would be a second line on stderr
    options.inter_op_num_threads = 1
    if threads:
        options.intra_op_num_threads = threads
    return options


class OnnxNet:
    """A predict net run by onnxruntime over a workspace's blobs: run() reads the inputs from the workspace, runs
    the exported model and stores the outputs there, as Net.run does. The weights are the workspace's values of
    every other blob the net reads, when the net is first run with a given set of input shapes. cache: whether to
    keep exports on disk (cache_dir()). Raises ExportError when the net cannot be exported (callers fall back to
    stepnet's engine), RuntimeError (onnxruntime's) when the exported model fails to run."""

    def __init__(self, ws, predict, inputs, outputs=None, threads: int | None = None, cache: bool = True):
        from ...graph.view import blob_names, walk
        self.ws, self.predict, self.inputs = ws, predict, list(inputs)
        self.outputs, self.threads, self.cache = list(outputs or []), threads, cache
        nets = {id(n): n for _, n, _, _ in walk(predict)}
        read, made = set(), set()      # blobs the net's ops read so far; those it makes before any op reads them
        for _, _, _, op in walk(predict):
            read.update(op.input)
            made.update(o for o in op.output if o not in read)
        self._weights = [n for n in sorted(blob_names(predict, *nets.values())) if n not in made]
        self.loaded_from = None      # "memory", "disk" or "export": where the last bound model came from

    def _params(self) -> dict:
        """The workspace's values of the blobs the net reads but does not make (a previous run's outputs are
        not weights)."""
        return {n: self.ws.fetch(n) for n in self._weights
                if n not in self.inputs and self.ws.has(n) and _is_tensor(self.ws.get_blob(n).value)}

    def _bind(self, feeds: dict):
        from .exporter import _opset, export_onnx
        params, opset = self._params(), _opset(None)
        key = content_key(self.predict, params, feeds, self.outputs, opset)
        if key in _SESSIONS:
            self.loaded_from = "memory"
            return _SESSIONS[key]
        ort = require("onnxruntime")
        path = cache_dir() / f"{key}.onnx" if self.cache else None
        blobs = None
        if path is not None and path.is_file():
            try:
                session = ort.InferenceSession(str(path), session_options(self.threads),
                                               providers=["CPUExecutionProvider"])
                blobs = _read_outputs(path.with_suffix(".outputs"))
                os.utime(path)
                self.loaded_from = "disk"
            except Exception:  # noqa: BLE001 - a damaged cache entry: export again
                blobs = None
        if blobs is None:
            result = export_onnx(self.predict, None, inputs=feeds, outputs=self.outputs or None, params=params,
                                 opset=opset)
            data = result.model.SerializeToString()
            session = ort.InferenceSession(data, session_options(self.threads), providers=["CPUExecutionProvider"])
            blobs = [(b, result.outputs[b]) for b in result.outputs]
            self.loaded_from = "export"
            if path is not None and not result.external_data:
                _keep(path, data, blobs)
        _SESSIONS[key] = (session, blobs)
        return session, blobs

    def run(self) -> None:
        feeds = {n: np.asarray(self.ws.fetch(n)) for n in self.inputs}
        session, blobs = self._bind(feeds)
        values = session.run([out for _, out in blobs], feeds)
        for (blob, _), value in zip(blobs, values):
            self.ws.feed(blob, value)


def _is_tensor(v) -> bool:
    return hasattr(v, "shape") and getattr(v, "dtype", None) is not None and v.dtype != object


def _read_outputs(path: Path) -> list[tuple[str, str]]:
    pairs = json.loads(path.read_text(encoding="utf-8"))
    if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
        raise ValueError(f"{path}: damaged")
    return [tuple(p) for p in pairs]


def _keep(path: Path, data: bytes, blobs) -> None:
    """Write a cache entry (the model and its output map), then drop the least recently used past
    CACHE_ENTRIES. A cache that cannot be written is skipped: the run goes on."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        proto.atomic_write(path.with_suffix(".outputs"), json.dumps(blobs).encode())
        proto.atomic_write(path, data)
        entries = sorted(path.parent.glob("*.onnx"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[CACHE_ENTRIES:]:
            old.unlink(missing_ok=True)
            old.with_suffix(".outputs").unlink(missing_ok=True)
    except (OSError, ExportError, FileFormatError):
        pass
