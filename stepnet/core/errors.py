"""The errors a user can cause, each naming what went wrong and where."""
from __future__ import annotations

import difflib
import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True)
class OpAt:
    """Where in a model something happened: op `index` of net `net` (None: an op the backward pass names by
    its index alone), of type `type` and, when it has one, name `name`. str() is how messages name it."""
    net: str | None
    index: int
    type: str
    name: str = ""

    def __str__(self):
        op = f"op #{self.index} ({self.type}{f' {self.name!r}' if self.name else ''})"
        return op if self.net is None else f"net {self.net!r}, {op}"


class StepnetError(Exception):
    """Base of every error stepnet raises for bad models, inputs or arguments. Where it happened is data:
    `at` (an OpAt, or a text such as a file's name, or None), and str() puts it before the message (joined by
    `sep`), with `detail` (the op's inputs, described) after it."""

    def __init__(self, message: str = "", *, at=None, detail: str = "", sep: str = ": "):
        super().__init__(message)
        self.message, self.at, self.detail, self.sep = message, at, detail, sep

    def __str__(self):
        where = "" if self.at is None else f"{self.at}{self.sep}"
        return f"{where}{self.message}{self.detail}"

    @property
    def op(self) -> OpAt | None:
        """The op it happened at, when that is known."""
        return self.at if isinstance(self.at, OpAt) else None

    def located(self, at, detail: str = "") -> "StepnetError":
        """This error, placed at `at` (with `detail` after the message) unless it has a place already."""
        if self.at is None:
            self.at, self.detail = at, self.detail + detail
        return self


class FileFormatError(StepnetError):
    """A model or data file that cannot be read (truncated, garbage, syntax error, wrong kind)."""


class UnknownOpError(StepnetError):
    """An operator type that this build does not implement."""


class ArityError(StepnetError):
    """Wrong number of inputs or outputs for an operator."""


class ArgumentError(StepnetError):
    """An operator argument that is missing, of the wrong type or out of range."""


class MissingBlobError(StepnetError):
    """A blob that an operator or a call needs does not exist or has no value."""


NO_VALUE = "holds no value (never written or fed, or emptied by Free)"   # what MissingBlobError says of an empty blob


class ShapeError(StepnetError):
    """Inputs whose shapes do not fit together."""


class DTypeError(StepnetError):
    """Inputs of a data type the operator does not accept."""


class DeviceError(StepnetError):
    """Data on one device given to an operator running on another."""


class NetError(StepnetError):
    """A net that cannot be created (duplicate name, unknown source of an input, ...)."""


class PlanError(StepnetError):
    """A plan whose execution steps are malformed."""


class OpError(StepnetError):
    """An operator failed while running; the message names the net, op and inputs."""


class FileAccessError(StepnetError):
    """A file path in a model that lies outside the directory models may read and write (Limits.file_root)."""


class ResourceError(StepnetError):
    """A blob that would take more memory than the limit (Limits.max_blob_bytes)."""


class GradientError(StepnetError):
    """A gradient that cannot be built: a non-differentiable op on the path, an overwritten blob version, ..."""


class CollectiveError(StepnetError):
    """A collective or point-to-point op across processes that cannot run: no common world, ranks that disagree
    on the op or its blob's shape, MPI unavailable under mpiexec."""


class StepnetWarning(UserWarning):
    """Something in a model that stepnet ignores, said once so it is never silent."""


def did_you_mean(name: str, choices, n: int = 3) -> str:
    """' (did you mean A, B?)' for the nearest names, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in choices}
        close = [lowered[name.lower()]] if name.lower() in lowered else []
    return f" (did you mean {', '.join(close)}?)" if close else ""


class _Escapes(dict):
    """str.translate's table for one_line, filled as characters are met: each control or format character
    (Unicode categories Cc, Cf, Zl, Zp: C0 but tab, DEL, C1, zero-width and bidi marks, the BOM, line and
    paragraph separators) maps to its escape as repr writes it ('\\x1b', '\\u202e'), any other to itself
    (remembered for the first 65536 characters met: text of every code point cannot grow it without bound)."""

    def __missing__(self, code: int):
        c = chr(code)
        escape = repr(c)[1:-1] if c != "\t" and unicodedata.category(c) in _ESCAPED else code
        if escape != code or len(self) < 65536:
            self[code] = escape
        return escape


_ESCAPED = {"Cc", "Cf", "Zl", "Zp"}
_CONTROLS = _Escapes()


def one_line(text: str) -> str:
    """text with every character that would break the line, reach the terminal as a control, or hide or reorder
    text (zero-width, bidi) escaped: names and text quoted from a file can hold any of them."""
    return text.translate(_CONTROLS)
