"""Data and checkpoint operators: CreateDB, TensorProtosDBInput, Save, Load, Checkpoint (Snapshot), DBExists.

db types: "minidb" (stepnet/io/minidb.py), and "lmdb" and "leveldb" through their libraries (io/kvdb.py, the
`databases` extra); other types are a clear error.
Paths: with absolute_path=0 (the default) Save/Load/Checkpoint/DBExists open "<root folder>/<db>", as Caffe2
does. Caffe2 takes the root folder from the workspace (default "."); stepnet uses the workspace attribute
`root_folder` when it has one, else ".", so relative paths resolve against the current working directory.
Like Caffe2 an absolute db with absolute_path=0 is still prefixed ("./" + "/x" is "x" under the cwd): pass
absolute_path=1 for absolute paths. CreateDB uses its db path as given. Every path must lie under the
workspace's file root (Limits.confine); loaded tensors and batches are held to its max_blob_bytes.
"""
from __future__ import annotations

import os
import re

import numpy as np

from ..core import backend
from ..io import kvdb, minidb
from ..distributed import world
from ..core.errors import (ArgumentError, DTypeError, FileAccessError, FileFormatError, MissingBlobError, ShapeError,
                           did_you_mean)
from ..io import proto
from ..io.files import quoted
from ..core.limits import blob_bytes, over_limit
from ..io.tensors import check_tensor_proto
from ..core.spec import spec
from .registry import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, Arg, op
from ..io.dbreader import DBReader, check_db_type
from .util import Mutex

MAX_NAME, MAX_PATH = 255, 4096   # bytes in one name of a path and in a path (Linux's NAME_MAX and PATH_MAX)


def full_path(workspace, db: str, absolute_path) -> str:
    """Caffe2's rule: the db as given with absolute_path, else '<root folder>/<db>' ({rank}, {size} expanded);
    an ArgumentError for a path no file system takes (a name over MAX_NAME bytes, a path over MAX_PATH)."""
    path = world.expand(db) if absolute_path else f"{getattr(workspace, 'root_folder', None) or '.'}/{world.expand(db)}"
    longest = max(len(name.encode("utf-8", "surrogateescape")) for name in path.split("/"))
    if longest > MAX_NAME or len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise ArgumentError(f"db path {quoted(path)} is {len(path)} characters long with a name of {longest} bytes; "
                            f"file systems take at most {MAX_NAME} bytes a name and {MAX_PATH} a path")
    return path


def _missing_file_hint(db: str, absolute_path) -> str:
    if not absolute_path and os.path.isabs(db):
        return (f" (db {db!r} is absolute but absolute_path=0 puts it under the root folder; "
                "set absolute_path=1)")
    return ""


minidb.register_blob_type(Mutex, "std::unique_ptr<std::mutex>", lambda m, name: b"", lambda content: Mutex())


def _check_reader(reader, i: int, ctx) -> DBReader:
    if not isinstance(reader, DBReader):
        raise DTypeError(f"input {i} must be a DB reader made by CreateDB, got {type(reader).__name__}")
    return reader.open(ctx.workspace.limits, ctx.label)


@op("CreateDB", inputs=0, outputs=1, context=True, devices="any", gradient=NO_GRADIENT,
    args={"db": Arg("str"), "db_type": "leveldb", "num_shards": 1, "shard_id": 0})
def create_db(ctx, xp, *, db, db_type, num_shards, shard_id):
    """Open db (a path, used as given) for reading and put a DBReader in the output blob."""
    if not db:
        raise ArgumentError("CreateDB needs the db argument (the path of the db to read)")
    check_db_type(db_type, f"db_type{' (CreateDB defaults to leveldb)' if db_type == 'leveldb' else ''}")
    return DBReader(world.expand(db), db_type, num_shards, shard_id).open(ctx.workspace.limits, ctx.label)


@op("TensorProtosDBInput", inputs=1, outputs=(1, None), context=True, devices="any", gradient=NO_GRADIENT,
    args={"batch_size": 0})
def tensor_protos_db_input(ctx, xp, reader, *, batch_size):
    """Read batch_size records (each a TensorProtos of one tensor per output) from the reader and stack them
    along a new first axis; batch_size=0 reads one record and outputs its tensors as they are. The reader
    wraps around at the end of the db. Reads happen when the op runs (Caffe2 prefetches one batch ahead
    in a thread; the sequence of batches an op sees is the same)."""
    reader = _check_reader(reader, 0, ctx)
    if batch_size < 0:
        raise ArgumentError(f"batch_size must be >= 0, got {batch_size}")
    n_out = len(ctx.opdef.output)
    rows, wheres = [], []
    sizes = [0] * n_out
    for _ in range(max(batch_size, 1)):
        _, value, where = reader.read()
        arrays = minidb.parse_tensor_protos(value, where)
        if len(arrays) != n_out:
            raise ShapeError(f"{where} holds {len(arrays)} tensors but the op has {n_out} outputs; give one "
                             "output per tensor of the records")
        _check_batch(ctx, arrays, sizes, batch_size, where)
        rows.append(arrays)
        wheres.append(where)
    if batch_size == 0:
        return tuple(xp.asarray(a) for a in rows[0])
    outs = []
    for i in range(n_out):
        first = rows[0][i]
        for row, where in zip(rows, wheres, strict=True):
            if row[i].shape != first.shape or row[i].dtype != first.dtype:
                raise ShapeError(f"tensor {i} of {where} is {row[i].shape} {row[i].dtype}, but the batch "
                                 f"started with {first.shape} {first.dtype}; every record must hold "
                                 "same-shaped tensors")
        outs.append(xp.asarray(np.stack([row[i] for row in rows])))
    return tuple(outs)


def _check_batch(ctx, arrays, sizes: list[int], batch_size: int, where: str) -> None:
    """Stop before a batch passes the blob limit: the bytes read so far plus, from the first record on, what
    batch_size records of that size would take."""
    limit = ctx.workspace.limits.max_blob_bytes
    for i, a in enumerate(arrays):
        sizes[i] += a.nbytes
        shape = (batch_size, *a.shape) if batch_size else a.shape
        nbytes = max(sizes[i], blob_bytes(shape, a.dtype))
        if nbytes > limit:
            raise over_limit(ctx.opdef.output[i], shape, a.dtype, nbytes, limit, f"batch_size {batch_size}")


# --------------------------------------------------------------------------------------------- Save
SAVE_ARGS = {"db": Arg("str"), "db_type": Arg("str"), "absolute_path": 0, "strip_prefix": "",
             "blob_name_overrides": Arg("strs", []), "chunk_size": minidb.CHUNK_DEFAULT}


def _save_names(inputs: list[str], strip_prefix: str, overrides: list[str]) -> list[str]:
    if overrides:
        if len(overrides) != len(inputs):
            raise ArgumentError(f"blob_name_overrides has {len(overrides)} names for {len(inputs)} inputs")
        if strip_prefix:
            raise ArgumentError("strip_prefix and blob_name_overrides cannot be used together")
        return list(overrides)
    names = []
    for name in inputs:
        pos = name.find(strip_prefix) if strip_prefix else -1
        stored = name[pos + len(strip_prefix):] if pos >= 0 else name
        if stored in names:
            raise ArgumentError(f"two inputs are saved under the name {stored!r}; give "
                                "blob_name_overrides or another strip_prefix")
        names.append(stored)
    return names


def _save(ctx, values, db, db_type, absolute_path, strip_prefix, blob_name_overrides, chunk_size) -> None:
    kind = check_db_type(db_type)
    if not db:
        raise ArgumentError("the db argument (the file to write) is empty")
    if chunk_size < minidb.CHUNK_DEFAULT:
        raise ArgumentError(f"chunk_size must be > 0, 0 (no chunking) or -1 (default), got {chunk_size}")
    names = _save_names(list(ctx.opdef.input), strip_prefix, blob_name_overrides)
    records = []
    for name, value in zip(names, values, strict=True):
        records.extend(minidb.serialize_blob(name, value, chunk_size))
    ws, limits = ctx.workspace, ctx.workspace.limits
    path = limits.confine(full_path(ws, db, absolute_path), ctx.label, write=True)
    if not world.writes(db):   # under mpiexec only rank 0 writes a file whose path names no {rank}
        return
    data = minidb.pack_records(records) if kind == "minidb" else None
    if not limits.overwrite and os.path.lexists(path) and not ws.written.has(path):
        raise FileAccessError(f"db {path!r} was there before this run (a trained model, perhaps): a model replaces "
                              "such a file only when asked; pass --overwrite (Python: Limits(overwrite=True)), or "
                              "move the file", at=ctx.label)
    if not limits.trusted and not (minidb.replaceable(path) if data is not None else kvdb.replaceable(path, kind)):
        what = "a stepnet database (minidb) or an empty file" if data is not None else f"an {kind} db or empty"
        raise FileAccessError(f"db {path!r} exists and is not {what}: a model replaces no other file; give the db "
                              "another name", at=ctx.label)
    size = len(data) if data is not None else sum(len(k) + len(v) for k, v in records)
    limits.check_write(ws.written, path, size, ctx.label)
    try:
        if data is not None:
            proto.atomic_write(path, data)
        else:
            size = kvdb.write_db(path, kind, records)
    except FileFormatError as e:
        raise FileFormatError(f"{e}{_missing_file_hint(db, absolute_path)}") from None
    ws.written.record(path, size, ctx.label)


@op("Save", inputs=(1, None), outputs=0, context=True, devices="any", gradient=SHOULD_NOT_DO_GRADIENT,
    args=SAVE_ARGS)
def save(ctx, xp, *values, db, db_type, absolute_path, strip_prefix, blob_name_overrides, chunk_size):
    """Write the input blobs to the db file (atomically: the old file or the whole new one). Keys are the
    input names (less strip_prefix, or blob_name_overrides); tensors go in chunks of chunk_size elements
    (-1: 1,000,000; 0: one chunk)."""
    _save(ctx, values, db, db_type, absolute_path, strip_prefix, blob_name_overrides, chunk_size)


_FORMAT = re.compile(r"%([-+ #0]*)(\d*)(?:\.(\d*))?(?:hh|h|ll|l|j|z|t|q|L)?([diouxX])")


def format_db_pattern(pattern: str, iteration: int) -> str:
    """Caffe2's sprintf(pattern, iteration) for Checkpoint's db pattern (e.g. 'ckpt_%08d.minidb'); a width or
    precision over MAX_NAME (more than a file name holds) is an ArgumentError."""
    if not isinstance(pattern, str) or "%" not in pattern:    # (bytes: refused by world.expand)
        return pattern

    def conversion(m: re.Match) -> str:
        flags, width, precision, kind = m.groups()
        for digits in (width, precision):
            if digits and (len(digits) > 3 or int(digits) > MAX_NAME):
                raise ArgumentError(f"db pattern {quoted(pattern)}: {quoted(m[0], 20)} pads the iteration to more "
                                    f"than the {MAX_NAME} bytes a file name holds")
        return f"%{flags}{width}{'' if precision is None else '.' + precision}{kind}"
    try:
        return _FORMAT.sub(conversion, pattern) % iteration
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"db pattern {quoted(pattern)} must hold one integer conversion such as %d "
                            f"({e})") from None


@op("Checkpoint", inputs=(1, None), outputs=0, context=True, devices="any", gradient=SHOULD_NOT_DO_GRADIENT,
    args={**SAVE_ARGS, "every": 1}, aliases=("Snapshot",))
def checkpoint(ctx, xp, iteration, *values, db, db_type, absolute_path, strip_prefix, blob_name_overrides,
               chunk_size, every):
    """Save every input (the int64 iteration counter first) to db % iteration when iteration % every == 0."""
    if every <= 0:
        raise ArgumentError(f"every must be > 0, got {every}")
    counter = np.asarray(backend.to_host(iteration))
    if counter.dtype != np.int64 or counter.size < 1:
        raise DTypeError(f"input 0 must be the int64 iteration counter, got {counter.shape} {counter.dtype}")
    it = int(counter.reshape(-1)[0])
    if it % every:
        return None
    _save(ctx, (iteration, *values), format_db_pattern(db, it), db_type, absolute_path, strip_prefix,
          blob_name_overrides, chunk_size)
    return None


# --------------------------------------------------------------------------------------------- Load
def key_to_name(key: str, strip_prefix: str, add_prefix: str) -> str:
    """Caffe2's blob name for a db key: cut at '#%', drop everything through strip_prefix, add add_prefix."""
    name = minidb.blob_name_of_key(key)
    if strip_prefix:
        pos = name.find(strip_prefix)
        if pos >= 0:
            name = name[pos + len(strip_prefix):]
    return add_prefix + name


def _load_sources(ctx, readers, db, dbs, db_type, absolute_path):
    """[(label, iterator of (key, value, where))] for the readers given as inputs, or the db/dbs files."""
    if readers:
        return [(r.source, r.rest()) for r in (_check_reader(r, i, ctx) for i, r in enumerate(readers))]
    kind = check_db_type(db_type)
    names = list(dbs) or [db]
    if not all(names):
        raise ArgumentError("Load needs the db argument (or dbs), and no db name may be empty")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ArgumentError(f"dbs names {', '.join(map(repr, dupes))} more than once")
    sources = []
    for name in names:
        path = ctx.workspace.limits.confine(full_path(ctx.workspace, name, absolute_path), ctx.label)
        try:
            f = kvdb.open_db(path, kind)
        except FileFormatError as e:
            raise FileFormatError(f"{e}{_missing_file_hint(name, absolute_path)}") from None
        sources.append((f.path, _file_records(f)))
    return sources


def _file_records(f):
    for i in range(len(f)):
        yield f.key(i), f.value(i), f.where(i)


@op("Load", inputs=(0, None), outputs=(0, None), context=True, devices="any", gradient=NO_GRADIENT,
    args={"db": "", "dbs": Arg("strs", []), "db_type": "", "absolute_path": 0, "keep_device": 0,
          "load_all": 0, "allow_incomplete": False, "source_blob_names": Arg("strs", []), "add_prefix": "",
          "strip_prefix": "", "shape": Arg("ints", []), "dtype": 1}, writes_unnamed=True)
def load(ctx, xp, *readers, db, dbs, db_type, absolute_path, keep_device, load_all, allow_incomplete,
         source_blob_names, add_prefix, strip_prefix, shape, dtype):
    """Load blobs saved by Save into the outputs (matched by name, or by source_blob_names), or every blob of
    the db(s) with load_all=1. Inputs, if any, are DB readers to read from instead of db/dbs. Tensors land
    on the op's device, or with keep_device=1 on the device they were saved from. Nothing is written unless
    every requested blob is found (allow_incomplete=1 loads those present and leaves the others as they are).
    shape/dtype only describe the output for shape inference."""
    outputs = list(ctx.opdef.output)
    if source_blob_names and len(source_blob_names) != len(outputs):
        raise ArgumentError(f"source_blob_names has {len(source_blob_names)} names for {len(outputs)} "
                            "outputs")
    if source_blob_names and strip_prefix:
        raise ArgumentError("strip_prefix and source_blob_names cannot be used together")
    if source_blob_names and load_all:
        raise ArgumentError("load_all cannot be used with source_blob_names")
    wanted = {}
    if not load_all:
        for i, name in enumerate(source_blob_names or outputs):
            if name in wanted:
                raise ArgumentError(f"blob {name!r} is asked for twice")
            wanted[name] = i
    assembler = minidb.BlobAssembler()
    origin: dict[str, str] = {}
    seen: set[str] = set()
    sources = _load_sources(ctx, readers, db, dbs, db_type, absolute_path)
    for label, records in sources:
        for key, value, where in records:
            name = key_to_name(key, strip_prefix, add_prefix)
            seen.add(name)
            if not load_all and name not in wanted:
                continue
            if origin.setdefault(name, label) != label:
                raise FileFormatError(f"blob {name!r} is in both {origin[name]} and {label}")
            proto = minidb.parse_blob_proto(value, where)
            check_tensor_proto(ctx.workspace.limits.max_blob_bytes, name, proto, where)
            assembler.add(name, proto, where)
            if not load_all and all(assembler.complete(n) for n in wanted):
                break
    labels = ", ".join(label for label, _ in sources)
    loaded = assembler.finish(labels)
    missing = [n for n in (outputs if load_all else wanted) if n not in loaded]
    if missing and (load_all or not allow_incomplete):
        held = ", ".join(sorted(seen)[:20]) + (", ..." if len(seen) > 20 else "") if seen else "no blobs"
        raise MissingBlobError(
            f"blob {', '.join(map(repr, missing))} not found in {labels}{did_you_mean(missing[0], seen)} "
            f"(it holds {held}){'' if load_all else '; pass allow_incomplete=1 to load the blobs present'}")
    for name, (value, detail) in loaded.items():
        if isinstance(value, DBReader):  # a saved reader opens its file under this workspace's limits
            value.open(ctx.workspace.limits, ctx.label)
        blob = ctx.workspace.create_blob(name) if load_all else ctx.outputs[wanted[name]]
        blob.set(_place(value, detail, ctx, keep_device))
    return None


def _place(value, detail, ctx, keep_device):
    """A loaded host value on the op's device, or (keep_device) on the device it was saved from."""
    if not isinstance(value, np.ndarray) or value.dtype.kind == "O":  # strings stay on the host
        return value
    device = ctx.device
    if keep_device and detail is not None:
        device = backend.resolve(detail, ctx.workspace.gpu)
    return value if device.is_cpu else backend.to_device(value, device)


# --------------------------------------------------------------------------------------------- DBExists
@op("DBExists", inputs=0, outputs=1, context=True, gradient=SHOULD_NOT_DO_GRADIENT,
    args={"absolute_path": 0, "db_name": "", "db_type": ""}, shape=lambda specs, **_: [spec((), np.bool_)])
def db_exists(ctx, xp, *, absolute_path, db_name, db_type):
    """A bool scalar: whether the db can be opened for reading (path rule as Load's)."""
    kind = check_db_type(db_type)
    path = ctx.workspace.limits.confine(full_path(ctx.workspace, db_name, absolute_path), ctx.label)
    return xp.asarray(np.array(kvdb.exists(path, kind)))
