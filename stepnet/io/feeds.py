"""What `stepnet run` feeds: --feed values (.npy/.npz files, literals, images) and --input shapes."""
from __future__ import annotations

import ast
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import images
from ..core.errors import ArgumentError, FileFormatError, StepnetError, did_you_mean
from ..core.limits import check_blob
from .files import open_regular
from .tensors import MAX_DIMS

DTYPES = ("float32", "float64", "float16", "int32", "int64", "int16", "int8", "uint8", "uint16", "bool")
DEFLATE_RATIO = 1032       # the most a DEFLATE stream expands: an .npz member claiming more lies


# --------------------------------------------------------------------------------------------- feeds
def parse_feed(spec: str, max_blob_bytes: int | None = None) -> dict:
    """NAME=FILE.npy | NAME=FILE.npz | FILE.npz | NAME=VALUE[:dtype] | [NAME=]IMAGE[:layout] -> {name: array}.
    An image without a name is keyed None: it feeds the predict net's first external input. With
    max_blob_bytes, an array of a .npy/.npz file or an image whose header says it is larger is refused before
    loading."""
    name, sep, value = spec.partition("=")
    if not sep:
        if spec.endswith(".npz"):
            return dict(_load_npz(Path(spec), max_blob_bytes))
        if images.is_image_path(spec):
            return {None: images.read_image(*images.split_layout(spec), max_blob_bytes)}
        raise ArgumentError(f"--feed {spec!r}: expected NAME=FILE.npy, NAME=FILE.npz, FILE.npz, NAME=VALUE "
                            "or [NAME=]IMAGE.png[:layout]")
    if not name:
        raise ArgumentError(f"--feed {spec!r}: the blob name before '=' is empty")
    if images.is_image_path(value):
        return {name: images.read_image(*images.split_layout(value), max_blob_bytes, name)}
    if value.endswith((".npy", ".npz")) or Path(value).suffix in {".npy", ".npz"}:
        path = Path(value)
        if value.endswith(".npz"):
            arrays = dict(_load_npz(path, max_blob_bytes))
            if name in arrays:
                return {name: arrays[name]}
            if len(arrays) == 1:
                return {name: next(iter(arrays.values()))}
            raise ArgumentError(f"--feed {spec!r}: {path} holds {sorted(arrays)}; none is named {name!r}")
        return {name: _load_npy(path, max_blob_bytes, name)}
    return {name: _literal(name, value)}


def _open_feed(path: Path, kind: str):
    if not path.exists() and not path.is_symlink():
        raise FileFormatError(f"--feed: no such file {str(path)!r}")
    return open_regular(path, f"the {kind} feed")


def _npy_header(f, size: int, where: str, limit: int | None = None, name: str = "") -> None:
    """Check an .npy header (read from f, `size` bytes from f's position on) against the data that follows it
    and against the blob limit, before anything is allocated: a header may claim a shape the file does not
    hold."""
    fmt = np.lib.format
    version = fmt.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = fmt.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _, dtype = fmt.read_array_header_2_0(f)
    else:  # 3.0: the 2.0 layout with UTF-8 field names
        shape, _, dtype = fmt._read_array_header(f, version) if hasattr(fmt, "_read_array_header") else (
            np.lib._format_impl._read_array_header(f, version))
    if dtype.hasobject:
        raise FileFormatError(f"--feed: {where} holds Python objects ({dtype}), which stepnet does not unpickle")
    if any(d < 0 for d in shape) or len(shape) > MAX_DIMS:
        raise FileFormatError(f"--feed: {where}: its header gives an impossible shape {shape}")
    if dtype.itemsize == 0 and math.prod(shape):   # numpy makes '<U0' '<U1': 4 bytes an element from none in the file
        raise FileFormatError(f"--feed: {where}: its header gives the empty dtype {dtype.str} for shape {shape}, "
                              "which numpy would read as one character an element that the file does not hold")
    need = math.prod(shape) * dtype.itemsize
    have = size - f.tell()
    if need > have:
        raise FileFormatError(f"--feed: {where}: its header claims shape {shape} {dtype} ({need} bytes of data) but "
                              f"only {have} bytes follow it; the file is truncated or its header lies")
    if limit is not None:
        from ..core.limits import check_blob
        check_blob(limit, name, shape, dtype, f"--feed {where}")


def _read_failure(e: Exception, path: Path, kind: str) -> StepnetError:
    if isinstance(e, StepnetError):
        return e
    return FileFormatError(f"--feed: {path} is not a readable {kind} file ({type(e).__name__}: {e})")


def _load_npy(path: Path, limit: int | None = None, name: str = "") -> np.ndarray:
    with _open_feed(path, ".npy") as f:
        try:
            size = f.seek(0, 2)
            f.seek(0)
            _npy_header(f, size, str(path), limit, name)
            f.seek(0)
            return np.load(f, allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - numpy's reader meeting a bad file raises many kinds
            raise _read_failure(e, path, ".npy") from None


def _load_npz(path: Path, limit: int | None = None) -> list:
    """(name, array) of every member of an .npz archive, each member's header checked against its size and
    each size against what its compressed bytes can expand to, before anything is allocated."""
    out = []
    with _open_feed(path, ".npz") as f:
        try:
            with zipfile.ZipFile(f) as z:
                for info in z.infolist():
                    _check_member(info, path)
                    with z.open(info) as m:
                        if not info.filename.endswith(".npy"):   # numpy hands such a member over as its bytes
                            if limit is not None:
                                check_blob(limit, info.filename, (info.file_size,), np.uint8,
                                           f"--feed {path} member {info.filename!r}")
                            out.append((info.filename, m.read(info.file_size + 1)))
                            continue
                        _npy_header(m, info.file_size, f"{path} member {info.filename!r}", limit, info.filename[:-4])
                    with z.open(info) as m:
                        out.append((info.filename[:-4], np.lib.format.read_array(m, allow_pickle=False)))
        except Exception as e:  # noqa: BLE001 - zipfile and numpy meeting a bad archive raise many kinds
            raise _read_failure(e, path, ".npz") from None
    return out


def _check_member(info: zipfile.ZipInfo, path: Path) -> None:
    where = f"--feed: {path} member {info.filename!r}"
    if info.compress_type == zipfile.ZIP_STORED:
        if info.file_size != info.compress_size:
            raise FileFormatError(f"{where} is stored uncompressed yet claims {info.file_size} bytes from "
                                  f"{info.compress_size}: the archive is corrupt")
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        if info.file_size > DEFLATE_RATIO * info.compress_size + 1024:
            raise FileFormatError(f"{where} claims {info.file_size} bytes from {info.compress_size} compressed, more "
                                  "than DEFLATE can expand to: the archive is corrupt")
    else:
        raise FileFormatError(f"{where} uses zip compression method {info.compress_type}; numpy writes .npz "
                              "members stored or deflated only")


def _literal(name: str, text: str) -> np.ndarray:
    body, _, dtype = text.rpartition(":") if ":" in text else (text, "", "")
    if dtype and dtype not in DTYPES:
        raise ArgumentError(f"--feed {name}: unknown dtype {dtype!r}{did_you_mean(dtype, DTYPES)}; "
                            f"choose one of {', '.join(DTYPES)}")
    what = f"--feed {name}={text if len(text) <= 80 else text[:77] + '...'!r}"
    depth = _bracket_depth(body)
    if depth > MAX_DIMS:
        raise ArgumentError(f"{what}: brackets nested {depth} deep; an array has at most {MAX_DIMS} dims")
    try:
        value = ast.literal_eval(body.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, OverflowError):
        raise ArgumentError(f"{what}: not a file (.npy/.npz) nor a number or list literal") from None
    shape, flat = _shape_of(value, what)
    dtype = dtype or ("bool" if flat and all(isinstance(v, bool) for v in flat) else "float32")
    _check_range(flat, np.dtype(dtype), what)
    try:
        return np.array(value, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError, TypeError) as e:
        raise ArgumentError(f"{what}: cannot be stored as {dtype} ({e})") from None


def _bracket_depth(text: str) -> int:
    depth = deepest = 0
    for c in text:
        if c in "[({":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "])}":
            depth -= 1
    return deepest


def _shape_of(value, what: str) -> tuple[tuple, list]:
    """(shape, elements in order) of a number or rectangular nested list of numbers; ArgumentError otherwise."""
    if isinstance(value, (bool, int, float)):
        return (), [value]
    if not isinstance(value, (list, tuple)):
        raise ArgumentError(f"{what}: {repr(value)[:60]} is not a number; a value is a number or a nested list of "
                            "numbers")
    if not value:
        return (0,), []
    parts = [_shape_of(v, what) for v in value]
    inner = parts[0][0]
    for i, (shape, _) in enumerate(parts):
        if shape != inner:
            raise ArgumentError(f"{what}: the list is ragged: item 0 has shape {inner} but item {i} has {shape}; "
                                "every row must have the same length")
    return (len(value), *inner), [x for _, flat in parts for x in flat]


def _check_range(flat: list, dtype: np.dtype, what: str) -> None:
    """ArgumentError for an element the dtype cannot hold (numpy would wrap it around or make it inf)."""
    if dtype.kind in "iu":
        lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
        bad = next((v for v in flat if not lo <= v <= hi), None)
    elif dtype.kind == "f":
        hi = float(np.finfo(dtype).max)
        lo = -hi
        bad = next((v for v in flat if (isinstance(v, int) or math.isfinite(v)) and not lo <= v <= hi), None)
    else:
        return
    if bad is not None:
        shown = str(bad) if len(str(bad)) <= 40 else f"{str(bad)[:20]}...({len(str(bad))} digits)"
        raise ArgumentError(f"{what}: {shown} does not fit {dtype} ({lo} to {hi})")


@dataclass(frozen=True)
class Dims:
    """A parsed NAME=DIMS[:dtype] option value; dtype is None when the option gave none."""
    name: str
    shape: tuple[int, ...]
    dtype: str | None = None


def parse_dims(spec: str, option: str = "--input") -> Dims:
    """NAME=D1,D2,...[:dtype] -> Dims: the one grammar of `inspect --input` and `synth-init --input/--param`.

    The name is everything before the last '='; dims are non-negative integers separated by ',' (or 'x', as
    in 2x3x8x8), none for a scalar (NAME= or NAME=:int32); dtype is one of DTYPES. Errors name the option.
    """
    name, sep, rest = spec.rpartition("=")
    dims, _, dtype = rest.partition(":")
    try:
        shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
    except ValueError:
        shape = None
    if not sep or not name or shape is None or any(d < 0 for d in shape):
        raise ArgumentError(f"{option} {spec!r}: expected NAME=D1,D2,...[:dtype], dims being non-negative "
                            "integers separated by ',' or 'x', e.g. data=1,3,224,224")
    if dtype and dtype not in DTYPES:
        raise ArgumentError(f"{option} {spec!r}: unknown dtype {dtype!r}{did_you_mean(dtype, DTYPES)}; "
                            f"choose one of {', '.join(DTYPES)}")
    return Dims(name, shape, dtype or None)
