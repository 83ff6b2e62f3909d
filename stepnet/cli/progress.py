"""What `stepnet run` shows while a plan trains: progress and labeled results.

`Monitor` is both the plan run's progress callback (overall training iterations done, of the total) and the
workspace's reporter (the scalars Print ops print). On a terminal it keeps one updating bar on stderr; not on
a terminal (CI logs), or with stdout piped (`| tee`), it writes a plain line every `interval` seconds. Both
show the overall count, the rate over the last `window` seconds, the ETA and the latest loss. Each reported
scalar becomes a labeled line on stdout (`iteration 250/2000: train_loss = 1.98`) and, with a metrics writer,
a CSV row.
"""
from __future__ import annotations

import os
import stat
import sys
import time
from collections import deque
from typing import Callable, TextIO

import numpy as np

from ..core.errors import one_line
from .metrics import MetricsWriter


def duration(seconds: float) -> str:
    """'42 s', '3 min 05 s', '1 h 02 min'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def scalar(value) -> float | None:
    """A numeric value with one element as a float, else None (strings, arrays, opaque objects, Int8)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or getattr(value, "size", 0) != 1 or dtype.kind not in "biuf" or not hasattr(value, "reshape"):
        return None
    try:
        from ..core import backend
        return float(np.asarray(backend.to_host(value)).reshape(-1)[0])
    except (TypeError, ValueError):
        return None


def _text(value) -> str | None:
    """A string, or a tensor of one string, as text; else None."""
    if isinstance(value, (str, bytes)):
        item = value
    elif getattr(value, "dtype", None) is not None and value.dtype.kind in "OSU" and getattr(value, "size", 0) == 1:
        item = value.reshape(-1)[0]
    else:
        return None
    if isinstance(item, bytes):
        return item.decode("utf-8", "replace")
    return item if isinstance(item, str) else None


def bar_fits(err: TextIO, out: TextIO) -> bool:
    """Whether a redrawn bar suits the streams: err is a terminal and out is not a pipe. Under `| tee` the result
    lines reach the screen through tee, after the bar was redrawn, and would land on its line: plain progress
    lines then, as in a log."""
    if not err.isatty():
        return False
    try:
        mode = os.fstat(out.fileno()).st_mode
    except (AttributeError, OSError, ValueError):   # not a file descriptor (a StringIO): nothing can interleave
        return True
    return not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode))


class Monitor:
    """Progress and results of one run. `show`: progress at all (False for --quiet; results are still printed
    and written to the metrics file)."""

    def __init__(self, *, show: bool = True, metrics: MetricsWriter | None = None, err: TextIO | None = None,
                 out: TextIO | None = None, tty: bool | None = None, interval: float = 10.0, window: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.err = err if err is not None else sys.stderr
        self.out = out if out is not None else sys.stdout
        self.show, self.metrics, self.clock = show, metrics, clock
        self.tty = bar_fits(self.err, self.out) if tty is None else tty
        self.interval, self.window = interval, window
        self.done = self.total = 0
        self.step = ""
        self.loss: tuple[str, float] | None = None
        self.samples: deque[tuple[float, int]] = deque()
        self.last_draw = -1e18
        self.bar_shown = False

    # ------------------------------------------------------------------------------------ progress
    def __call__(self, step: str, done: int, total: int) -> None:
        """The plan run's progress callback: `done` of `total` training iterations."""
        now = self.clock()
        self.step, self.done, self.total = step, done, total
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()            # keep one sample at least `window` old: the rate's start
        if not self.show:
            return
        if self.tty:
            if done >= total or now - self.last_draw >= 0.1:
                self._draw(now)
        elif done == 1 or done >= total or now - self.last_draw >= self.interval:
            self.last_draw = now
            self.err.write(f"progress: {self.status()}\n")
            self.err.flush()

    def rate(self) -> float | None:
        """Iterations per second over the recent window (None until two samples)."""
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else None

    def status(self) -> str:
        """'750/2000 iterations (37 %), 12.3 it/s, ETA 1 min 42 s, train_loss 1.98'."""
        parts = [f"{self.done}/{self.total} iterations ({100 * self.done // max(self.total, 1)} %)"]
        rate = self.rate()
        if rate:
            parts.append(f"{rate:.1f} it/s")
            if self.done < self.total:
                parts.append(f"ETA {duration((self.total - self.done) / rate)}")
        if self.loss is not None:
            parts.append(f"{one_line(self.loss[0])} {self.loss[1]:.4g}")
        return ", ".join(parts)

    def _draw(self, now: float) -> None:
        self.last_draw = now
        width = 24
        filled = width * self.done // max(self.total, 1)
        self.err.write(f"\r\033[K{one_line(self.step)} [{'#' * filled}{'.' * (width - filled)}] {self.status()}")
        self.err.flush()
        self.bar_shown = True

    def _clear(self) -> None:
        if self.bar_shown:
            self.err.write("\r\033[K")
            self.err.flush()
            self.bar_shown = False

    def close(self) -> None:
        """End the bar's line (the run is over, or failed)."""
        if self.bar_shown:
            self.err.write("\n")
            self.err.flush()
            self.bar_shown = False

    # ------------------------------------------------------------------------------------ results
    def report(self, name: str, value) -> bool:
        """The workspace reporter: a scalar a Print op prints becomes a labeled line and a metrics row, one
        string a labeled block of text (True); anything else is left to Print (False)."""
        x = scalar(value)
        if x is None:
            text = _text(value)
            if text is None:
                return False
            lines = "\n".join(map(one_line, text.split("\n")))   # generated text: its lines, no escapes
            self.note(f"{self.label()}{one_line(name)}:\n{lines}")
            return True
        if self.metrics is not None:
            self.metrics.write(self.done, name, x)
        if "loss" in name.lower() or self.loss is None:
            self.loss = (name, x)
        self.note(f"{self.label()}{one_line(name)} = {x:.6g}")   # what the model prints: shown even when quiet
        return True

    def label(self) -> str:
        return f"iteration {self.done}/{self.total}: " if self.total else ""

    def note(self, line: str, stream: TextIO | None = None) -> None:
        """A line above the bar (which is redrawn after it)."""
        self._clear()
        stream = stream or self.out
        stream.write(line + "\n")
        stream.flush()
        if self.tty and self.show and 0 < self.done < self.total:
            self._draw(self.clock())
