"""Training metrics as a CSV file, and `stepnet plot`.

The file is long format, one row per reported value: `iteration,name,value` (the overall training iteration
when the value was reported, the blob's name, its value). A name is the model's: its control characters are
escaped, and one a spreadsheet would evaluate (`=`, `+`, `-`, `@` first) starts with `'`, which `read` drops.
Rows are flushed as they are written, so a run that crashes keeps the rows written so far (so the file is
written in place, not replaced atomically as stepnet's other outputs are; like them, it must be a regular file
or new). `plot` draws one curve per name with matplotlib (the `plots` extra, imported only there).
"""
from __future__ import annotations

import csv
import errno
import io
import math
import os
import stat
from pathlib import Path

from ..core.errors import StepnetError, one_line
from ..core.extras import install_hint

HEADER = ("iteration", "name", "value")
MAX_FILE_BYTES = 1 << 30   # a metrics file larger than this is not one a run wrote
MAX_ITERATION = 2**53     # iterations a float (matplotlib's axes) holds exactly
MAX_CURVES = 40            # curves drawn at once (each one a legend entry)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "'")   # what a spreadsheet evaluates (OWASP); "'": uncell stays exact


def cell(name: str) -> str:
    """A name from the model as a CSV cell: control and format characters escaped (one_line), and a cell a
    spreadsheet would take for a formula quoted with a leading "'" (OWASP's advice; one starting with "'"
    too, so that `uncell` gives the name back)."""
    name = one_line(name)
    return "'" + name if name.startswith(FORMULA_STARTS) else name


def uncell(text: str) -> str:
    """The name a cell of `cell` holds."""
    return text[1:] if text.startswith("'") else text


class MetricsWriter:
    """Appends `iteration,name,value` rows to a new CSV file, flushing each."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        refused = StepnetError(f"--metrics {path}: it exists and is not a regular file (a symlink, FIFO, device or "
                               "directory); give a new path")
        if os.path.lexists(self.path) and (self.path.is_symlink() or not self.path.is_file()):
            raise refused
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:   # O_NOFOLLOW, O_NONBLOCK and the fstat: what lstat saw above cannot have been swapped since
            fd = os.open(self.path, flags, 0o666)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise refused from None
            raise StepnetError(f"--metrics {path}: cannot write it: {e.strerror or e}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise refused
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        self.file = open(fd, "w", newline="", encoding="utf-8")
        self.csv = csv.writer(self.file, lineterminator="\n")
        self.csv.writerow(HEADER)
        self.file.flush()

    def write(self, iteration: int, name: str, value: float) -> None:
        self.csv.writerow((iteration, cell(name), repr(float(value))))
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def read(path: str | Path) -> dict[str, tuple[list[int], list[float]]]:
    """name -> (iterations, values), in file order."""
    from ..io.files import read_regular

    text = read_regular(path, "metrics file", MAX_FILE_BYTES).decode("utf-8", "replace")
    rows = csv.reader(io.StringIO(text, newline=""))
    curves: dict[str, tuple[list[int], list[float]]] = {}
    try:
        header = next(rows, None)
        if header is None or tuple(h.strip() for h in header) != HEADER:
            raise StepnetError(f"{path}: not a metrics file (its first line must be {','.join(HEADER)})")
        for row in rows:
            if not row:
                continue
            try:
                iteration, name, value = int(row[0]), uncell(row[1]), float(row[2])
            except (ValueError, IndexError):
                shown = ",".join(row)
                shown = shown if len(shown) <= 80 else shown[:80] + "..."
                raise StepnetError(f"{path}, line {rows.line_num}: expected iteration,name,value, got "
                                   f"{shown!r}") from None
            if not 0 <= iteration <= MAX_ITERATION:
                raise StepnetError(f"{path}, line {rows.line_num}: iteration {iteration} is not between 0 and "
                                   f"{MAX_ITERATION}; a run numbers its iterations from 0")
            its, values = curves.setdefault(name, ([], []))
            its.append(iteration)
            values.append(value)
    except csv.Error as e:   # a NUL, a field over the csv module's limit, a stray quote
        raise StepnetError(f"{path}, line {rows.line_num}: not a metrics file ({e})") from None
    return curves


def _literal(text: str) -> str:
    """text as matplotlib shows it literally: '$' would start mathtext (and fail on '$x'), a leading '_' would
    hide the curve from the legend."""
    text = one_line(text).replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _names(names) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:10])
    return shown + (f", ... ({len(names) - 10} more)" if len(names) > 10 else "")


def plot(path: str | Path, output: str | Path, names: list[str] | None = None, title: str | None = None) -> int:
    """Draw the curves of a metrics file into an image (format by extension: a regular file or a new one,
    written atomically); returns the number drawn."""
    try:
        import matplotlib
    except ImportError:
        raise StepnetError(f"stepnet plot needs matplotlib: {install_hint('plots')}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io.proto import atomic_write, check_replaceable

    output = Path(output)
    fmt = output.suffix.lower().lstrip(".")
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if fmt not in formats:
        raise StepnetError(f"{output}: the image's format comes from its suffix; use one of "
                           f"{', '.join('.' + f for f in sorted(formats))}")
    check_replaceable(output)
    curves = read(path)
    if names:
        unknown = [n for n in names if n not in curves]
        if unknown:
            have = _names(curves) if curves else "none"
            raise StepnetError(f"{path} has no values named {_names(unknown)} (it has {have})")
        curves = {n: curves[n] for n in names}
    if not curves:
        raise StepnetError(f"{path} holds no values to plot")
    if len(curves) > MAX_CURVES:
        raise StepnetError(f"{path} holds values of {len(curves)} names, more than the {MAX_CURVES} one plot "
                           f"draws ({_names(curves)}); choose some with --name NAME (repeatable)")
    finite = [v for _, values in curves.values() for v in values if math.isfinite(v)]
    if finite and not math.isfinite(max(finite) - min(finite)):
        raise StepnetError(f"{path}: its values span {min(finite):g} to {max(finite):g}, a range wider than a float "
                           "holds, so no axis can show them; plot the names apart with --name NAME")
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (its, values) in curves.items():
        ax.plot(its, values, marker="o", markersize=3 if len(its) > 1 else 6, label=_literal(name))
    ax.set_xlabel("iteration")
    ax.set_ylabel("value")
    ax.set_title(_literal(title or Path(path).name), usetex=False)
    ax.grid(True, alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buf, format=fmt, dpi=100)
    except (ValueError, OverflowError, RuntimeError) as e:   # mathtext a title cannot parse, values past float
        raise StepnetError(f"cannot draw {path} into {output}: {' '.join(str(e).split())[:200]}") from None
    finally:
        plt.close(fig)
    atomic_write(output, buf.getvalue())
    return len(curves)
