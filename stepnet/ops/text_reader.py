"""Reading tab-separated text files (Caffe2's text_file_reader): CreateTextFileReader, TextFileReaderRead.

A reader is an opaque blob value (TextFileReaderInstance) that streams its file in chunks. As in Caffe2 the
file is cut into tokens at '\\n' (which starts a row) and '\\t' (which starts the next field of the row); a NUL
byte makes the byte after it literal; text after the last delimiter of the file is not a token (a file should
end with a newline), and each new pass over the file starts afresh. Fields are STRING (bytes) or FLOAT (parsed
like C's strtof: the longest number at the start of the field, after blanks).

The filename may come from a model file, so it is confined to the workspace's file root (Limits.confine), as
db paths are; a row's text and each output are held to the workspace's max_blob_bytes."""
from __future__ import annotations

import re
import threading

import numpy as np

from ..core.errors import ArgumentError, DTypeError, FileFormatError, ResourceError
from ..io.files import open_regular, quoted
from ..io.proto import DataType
from .registry import NO_GRADIENT, Arg, op

CHUNK = 1 << 16
NEWLINE, TAB = 0, 1      # a token's start delimiter: what came before it (the start of the file counts as a newline)
FIELD_TYPES = {DataType.STRING: "STRING", DataType.FLOAT: "FLOAT"}
_SPECIAL = re.compile(rb"[\n\t\x00]")
_FLOAT = re.compile(rb"[ \t\n\v\f\r]*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))",
                    re.IGNORECASE)


class TextFileReaderInstance:
    """The state of one reader: the open file, the pass it is in, the tokenizer's partial token and the tokens
    cut but not yet read. Reads go one at a time (a lock), as in Caffe2."""

    def __init__(self, path: str, num_passes: int, field_types: list, max_bytes: int):
        self.path, self.num_passes, self.field_types, self.max_bytes = path, num_passes, field_types, max_bytes
        self.file = open_regular(path, "text file")
        self.lock = threading.Lock()
        self.rows_read = 0
        self.passes_done = 0
        self.tokens: list = []     # (start delimiter, bytes), in order; self.next_token indexes it
        self.next_token = 0
        self._restart_tokens()

    def _restart_tokens(self) -> None:
        self.partial, self.start_delim, self.escaped = bytearray(), NEWLINE, False

    def __repr__(self):
        return f"TextFileReaderInstance({self.path!r}, pass {self.passes_done + 1} of {self.num_passes})"

    def _cut(self, chunk: bytes) -> None:
        """Append the tokens that chunk completes to self.tokens, keeping the unfinished one in self.partial."""
        pos = 0
        if self.escaped and chunk:     # an escape ended the previous chunk: this chunk's first byte is literal
            self.partial += chunk[:1]
            pos, self.escaped = 1, False
        while True:
            m = _SPECIAL.search(chunk, pos)
            if m is None:
                self.partial += chunk[pos:]
                break
            at = m.start()
            self.partial += chunk[pos:at]
            if chunk[at] == 0:     # escape: the next byte is text whatever it is
                if at + 1 < len(chunk):
                    self.partial += chunk[at + 1:at + 2]
                    pos = at + 2
                else:
                    self.escaped, pos = True, len(chunk)
                continue
            self.tokens.append((self.start_delim, bytes(self.partial)))
            self.partial.clear()
            self.start_delim = NEWLINE if chunk[at] == 0x0A else TAB
            pos = at + 1
        if len(self.partial) > self.max_bytes:
            raise ResourceError(f"text file {quoted(self.path)} has a field of more than {self.max_bytes} bytes "
                                "(the workspace's max_blob_bytes)")

    def next(self):
        """(start delimiter, token bytes), or None when every pass is done."""
        while self.next_token >= len(self.tokens):
            self.tokens, self.next_token = [], 0
            chunk = b""
            while not chunk and self.passes_done < self.num_passes:
                try:
                    chunk = self.file.read(CHUNK)
                except OSError as e:
                    raise FileFormatError(f"{self.path}: cannot read text file ({e.strerror})") from None
                if not chunk:
                    self.passes_done += 1
                    if self.passes_done < self.num_passes:
                        self.file.seek(0)
                        self._restart_tokens()
            if not chunk:
                return None
            self._cut(chunk)
        token = self.tokens[self.next_token]
        self.next_token += 1
        return token


def _check_reader(value) -> TextFileReaderInstance:
    if not isinstance(value, TextFileReaderInstance):
        raise DTypeError(f"input 0 must be a text file reader made by CreateTextFileReader, got "
                         f"{'nothing (never written)' if value is None else type(value).__name__}")
    return value


@op("CreateTextFileReader", inputs=0, outputs=1, context=True, devices="any", gradient=NO_GRADIENT,
    args={"filename": Arg("str", "", "path of the file"), "num_passes": Arg("int", 1, "passes over the file"),
          "field_types": Arg("ints", [], "the core.DataType of each field (STRING or FLOAT)")})
def create_text_file_reader(ctx, xp, *, filename, num_passes, field_types):
    """Open filename (tab-separated fields, one row a line) for reading and put a reader in the output blob."""
    if not field_types:
        raise ArgumentError("field_types must be non-empty (the DataType of each field)")
    if not filename:
        raise ArgumentError("CreateTextFileReader needs the filename argument (the path of the file to read)")
    limits = ctx.workspace.limits
    path = limits.confine(filename, ctx.label)
    return TextFileReaderInstance(path, num_passes, list(field_types), limits.max_blob_bytes)


def _convert(kind: int, token: bytes, row: int, field: int):
    if kind == DataType.STRING:
        return token
    m = _FLOAT.match(token)     # FLOAT (the read checked the types)
    if m is None:
        raise FileFormatError(f"invalid float {token[:40]!r} in row {row}, field {field}")
    return float(m.group(1))


@op("TextFileReaderRead", inputs=1, outputs=(1, None), context=True, devices="any", gradient=NO_GRADIENT,
    args={"batch_size": Arg("int", 1, "the most rows to read")})
def text_file_reader_read(ctx, xp, reader, *, batch_size):
    """Read up to batch_size rows: output i is a 1-D tensor of field i of each row (bytes objects for STRING,
    float32 for FLOAT); fewer rows at the end of the last pass, and empty tensors after it."""
    reader = _check_reader(reader)
    n = len(ctx.outputs)
    if len(reader.field_types) != n:
        raise ArgumentError(f"the reader has {len(reader.field_types)} fields, the op {n} outputs: they must agree")
    if batch_size < 0:
        raise ArgumentError(f"batch_size must be >= 0, got {batch_size}")
    for field, kind in enumerate(reader.field_types):
        if kind not in FIELD_TYPES:
            raise ArgumentError(f"field {field} has DataType {kind}; a text file reader reads only STRING "
                                f"({int(DataType.STRING)}) and FLOAT ({int(DataType.FLOAT)}) fields")
    columns: list[list] = [[] for _ in range(n)]
    sizes = [0] * n
    with reader.lock:
        rows = 0
        while rows < batch_size:
            row = reader.rows_read + rows + 1
            token = reader.next()
            if token is None:
                break
            for field in range(n):
                if field > 0:
                    token = reader.next()
                    if token is None:
                        raise FileFormatError(f"text file {quoted(reader.path)} ends in the middle of row {row} "
                                              f"(after {field} of {n} fields)")
                if token[0] != (NEWLINE if field == 0 else TAB):
                    raise FileFormatError(f"text file {quoted(reader.path)}: row {row} does not have {n} fields")
                value = _convert(reader.field_types[field], token[1], row, field)
                columns[field].append(value)
                sizes[field] += len(value) + 8 if isinstance(value, bytes) else 4
                if sizes[field] > reader.max_bytes:
                    raise ResourceError(f"output {field} of the batch would take more than {reader.max_bytes} "
                                        "bytes (the workspace's max_blob_bytes); read smaller batches")
            rows += 1
        reader.rows_read += rows
    out = []
    for kind, values in zip(reader.field_types, columns):
        if kind == DataType.STRING:
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
        else:
            arr = np.asarray(values, dtype=np.float32).reshape(len(values))
        out.append(arr)
    return tuple(out)
