"""What `stepnet run` prints and writes about its results and the model's files: the result line of a fetched
blob, `--save`'s .npz, the check that no database from before the run is replaced unasked, and the report of
every file the model wrote."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from ..core.errors import ArgumentError, one_line
from ..core.int8 import Int8Tensor
from ..core.limits import format_bytes
from ..io import proto


def format_blob(name: str, value, count: int = 6) -> str:
    """The result line of a fetched blob; its name and strings (from the model) with control and format
    characters escaped."""
    if isinstance(value, (str, bytes)):
        return one_line(f"{name}: string {value!r}")
    if isinstance(value, Int8Tensor):
        return one_line(f"{name}: Int8Tensor {value.summary(count)}")
    arr = np.asarray(value)
    if arr.size == 1 and arr.dtype.kind in "OSU" and isinstance(arr.reshape(-1)[0], (str, bytes)):
        item = arr.reshape(-1)[0]   # one string (a sampler's text): its lines as a block, escaped line by line
        text = item.decode("utf-8", "replace") if isinstance(item, bytes) else item
        return f"{one_line(name)}: shape {tuple(arr.shape)} text:\n" + "\n".join(map(one_line, text.split("\n")))
    flat = arr.reshape(-1)
    head = np.array2string(flat[:count], precision=5, separator=", ", max_line_width=200)
    more = f" ... ({flat.size} values)" if flat.size > count else ""
    return one_line(f"{name}: shape {tuple(arr.shape)} {arr.dtype} {head}{more}")


def save_npz(path: Path, arrays: dict) -> None:
    """--save: the blobs as an .npz (io.files.npz_bytes: safe member names, no pickles), written atomically."""
    from ..io.files import npz_bytes

    try:
        data = npz_bytes({k: v.dequantize() if isinstance(v, Int8Tensor) else np.asarray(v)
                          for k, v in arrays.items()})   # Int8: the real values
    except ArgumentError as e:
        raise e.located(f"--save {path}") from None
    proto.atomic_write(path, data)


def refuse_overwrites(ws, nets) -> None:
    """The first Save op of the model (nested nets too) whose database is there already: one error before the
    run starts, instead of a trained model replaced, or a refusal when the op runs at the end of training."""
    from ..graph.view import walk
    from ..ops.binding import op_label, parse_args
    from ..ops.db import full_path
    from ..ops.registry import REGISTRY

    for net in nets:
        for _, inner, index, op in walk(net, level=1):
            if op.type != "Save":
                continue
            label = op_label(inner.name, index, op)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                args = parse_args(REGISTRY.get("Save"), op, label, strict=False)
            path = full_path(ws, args["db"], args["absolute_path"])
            if args["db"] and os.path.lexists(path):
                raise ArgumentError(f"db {os.path.normpath(path)!r} is there already (a trained model, perhaps) and "
                                    "this run's Save op would replace it: pass --overwrite to replace it, or move "
                                    "the file", at=label)


def report_writes(ws) -> None:
    """One line per file the model's ops wrote this run (the write policy: none goes unsaid), quiet or not."""
    for w in ws.written:
        times = f", written {w.times} times" if w.times > 1 else ""
        by = f" by {w.by}" if w.by is not None else ""
        print(f"the model wrote {one_line(w.path)} ({format_bytes(w.size)}{times}){one_line(by)}", flush=True)
