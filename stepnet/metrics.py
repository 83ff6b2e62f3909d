"""Training metrics as a CSV file, and `stepnet plot`.

The file is long format, one row per reported value: `iteration,name,value` (the overall training iteration
when the value was reported, the blob's name, its value). Rows are flushed as they are written, so a run that
crashes keeps the rows written so far (so the file is written in place, not replaced atomically as stepnet's
other outputs are; like them, it must be a regular file or new). `plot` draws one curve per name with
matplotlib (the `plots` extra, imported only there).
"""
from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from .errors import StepnetError

HEADER = ("iteration", "name", "value")


class MetricsWriter:
    """Appends `iteration,name,value` rows to a new CSV file, flushing each."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if os.path.lexists(self.path) and (self.path.is_symlink() or not self.path.is_file()):
            raise StepnetError(f"--metrics {path}: it exists and is not a regular file (a symlink, FIFO, device "
                               "or directory); give a new path")
        try:
            self.file = open(self.path, "w", newline="", encoding="utf-8")
        except OSError as e:
            raise StepnetError(f"--metrics {path}: cannot write it: {e.strerror or e}") from None
        self.csv = csv.writer(self.file, lineterminator="\n")
        self.csv.writerow(HEADER)
        self.file.flush()

    def write(self, iteration: int, name: str, value: float) -> None:
        self.csv.writerow((iteration, name, repr(float(value))))
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def read(path: str | Path) -> dict[str, tuple[list[int], list[float]]]:
    """name -> (iterations, values), in file order."""
    from .files import read_regular

    text = read_regular(path).decode("utf-8", "replace")
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None or tuple(h.strip() for h in header) != HEADER:
        raise StepnetError(f"{path}: not a metrics file (its first line must be {','.join(HEADER)})")
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for n, row in enumerate(rows, start=2):
        if not row:
            continue
        try:
            iteration, name, value = int(row[0]), row[1], float(row[2])
        except (ValueError, IndexError):
            raise StepnetError(f"{path}, line {n}: expected iteration,name,value, got {','.join(row)!r}") from None
        its, values = curves.setdefault(name, ([], []))
        its.append(iteration)
        values.append(value)
    return curves


def plot(path: str | Path, output: str | Path, names: list[str] | None = None, title: str | None = None) -> int:
    """Draw the curves of a metrics file into an image (format by extension); returns the number drawn."""
    try:
        import matplotlib
    except ImportError:
        raise StepnetError("stepnet plot needs matplotlib: pip install 'stepnet[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read(path)
    if names:
        unknown = [n for n in names if n not in curves]
        if unknown:
            have = ", ".join(curves) or "none"
            raise StepnetError(f"{path} has no values named {', '.join(unknown)} (it has {have})")
        curves = {n: curves[n] for n in names}
    if not curves:
        raise StepnetError(f"{path} holds no values to plot")
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (its, values) in curves.items():
        ax.plot(its, values, marker="o", markersize=3 if len(its) > 1 else 6, label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("value")
    ax.set_title(title or Path(path).name)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return len(curves)
