"""Checkpoints of a workspace as minidb files: every tensor and string blob (what `--checkpoint` and `--load`
move), and for resuming a plan also the plan's position, where each data reader stands and the state of the
workspace's random generator, in blobs under the reserved prefix `__stepnet__/`.

A run resumed from a checkpoint (`Resume`) continues the same run: plan.PlanRun re-runs the setup steps before
the step the checkpoint was taken in (steps with no iterations: fills, CreateDB, ...), restores the state,
then runs that step's remaining iterations and everything after it. Ops with their own
`device_option.random_seed` restart their random streams on resume; the workspace generator does not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core import backend
from ..core.errors import FileFormatError

PREFIX = "__stepnet__/"
POSITION = PREFIX + "plan_position"   # int64 [step path..., iterations done]; [-1] once the plan finished
READERS = PREFIX + "readers"          # JSON {blob: {"source": ..., "pos": record index}}
RNG = PREFIX + "rng"                  # JSON: the workspace generator's bit_generator.state
FINISHED = (-1,)


@dataclass(frozen=True)
class Position:
    """Where a plan run stands: the path of step indices (top-level index, then substep indices) of an
    outermost iterating step and how many of its iterations are done; FINISHED as path once the plan ran."""
    path: tuple[int, ...]
    done: int = 0

    @property
    def finished(self) -> bool:
        return self.path == FINISHED


def tensor_blobs(ws) -> dict[str, Any]:
    """Every tensor (as a host array) and string blob visible from ws, opaque objects left out."""
    blobs = {}
    for name in ws.blobs():
        value = ws.find(name).value
        if isinstance(value, (str, bytes)):
            blobs[name] = value
        elif hasattr(value, "dtype") and hasattr(value, "shape"):
            blobs[name] = backend.to_host(value)
    return blobs


def save(ws, path, position: Position | None = None) -> int:
    """Save ws's tensor and string blobs (and, with a position, the state a resumed run needs) atomically;
    returns the number of model blobs saved."""
    from .minidb import save_blobs
    from .dbreader import DBReader

    blobs = tensor_blobs(ws)
    count = len(blobs)
    if position is not None:
        readers = {}
        for name in ws.blobs():
            value = ws.find(name).value
            if isinstance(value, DBReader):
                readers[name] = {"source": value.source, "pos": value.pos}
        blobs[POSITION] = np.array([*position.path, position.done], np.int64)
        blobs[READERS] = json.dumps(readers)
        blobs[RNG] = json.dumps(ws.rng.bit_generator.state)
    save_blobs(path, blobs)
    return count


def load(ws, path) -> int:
    """Feed every model blob of a checkpoint into ws (the `__stepnet__/` state is left out); returns how many."""
    from .minidb import load_blobs

    blobs = {k: v for k, v in load_blobs(path, max_blob_bytes=ws.limits.max_blob_bytes).items()
             if not k.startswith(PREFIX)}
    for name, value in blobs.items():
        ws.feed(name, value)
    return len(blobs)


class Resume:
    """A checkpoint to continue a plan run from: its position, and `restore(ws)` for the moment the run
    reaches it."""

    def __init__(self, path, max_blob_bytes: int | None = None):
        from .minidb import load_blobs

        self.path = str(path)
        self.blobs = load_blobs(path, max_blob_bytes=max_blob_bytes)
        if POSITION not in self.blobs:
            raise FileFormatError(f"{self.path}: not a resumable checkpoint (it has no {POSITION!r}); it was not "
                                  "written during a plan run with --checkpoint-every or an interrupt. Feed its "
                                  "blobs with --load instead")
        raw = [int(v) for v in np.asarray(self.blobs[POSITION]).reshape(-1)]
        self.position = Position(FINISHED) if tuple(raw) == FINISHED else Position(tuple(raw[:-1]), raw[-1])
        if self.position.finished:
            raise FileFormatError(f"{self.path}: the run that wrote this checkpoint finished; there is nothing to "
                                  "resume (feed its blobs with --load to start a new run from them)")
        if not self.position.path or min(self.position.path) < 0 or self.position.done < 0:
            raise FileFormatError(f"{self.path}: {POSITION!r} holds {raw}, which is no plan position")

    def restore(self, ws) -> None:
        """Feed the saved blobs, move each data reader back to its record, restore the random generator."""
        from .dbreader import DBReader

        for name, value in self.blobs.items():
            if not name.startswith(PREFIX):
                ws.feed(name, value)
        for name, state in _json(self.blobs, READERS, self.path).items():
            reader = ws.find(name)
            if reader is None or not isinstance(reader.value, DBReader) or reader.value.source != state["source"]:
                raise FileFormatError(f"{self.path}: the checkpoint has reader {name!r} of {state['source']!r}, but "
                                      "the resumed run made no such reader before this step: resume with the same "
                                      "plan and data")
            reader.value.seek(int(state["pos"]))
        ws.rng.bit_generator.state = _json(self.blobs, RNG, self.path)


def _json(blobs: dict, name: str, where: str):
    raw = blobs.get(name)
    try:
        return json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except (TypeError, ValueError, UnicodeDecodeError):
        raise FileFormatError(f"{name!r} is missing or not valid JSON", at=where) from None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C reached a plan boundary: the checkpoint is saved and the run stops."""

    def __init__(self, path, position: Position):
        super().__init__(f"checkpoint saved to {path} at step path {list(position.path)} after {position.done} "
                         f"iteration(s); continue the run with --resume {path}")


class Checkpointer:
    """The plan boundary callback of `stepnet run --checkpoint PATH [--checkpoint-every N]`: saves every N
    iterations of an outermost iterating step and, once `interrupt()` was called (Ctrl-C, acknowledged at once),
    at the next boundary, then stops the run with Interrupted. Every save replaces PATH atomically; a Ctrl-C
    during a save lets it finish, and a second Ctrl-C before the save it asked for stops the run without it."""

    def __init__(self, path, every: int | None = None):
        self.path, self.every, self.interrupted = path, every, False
        self.saves = 0
        self.saving = False          # a save is under way (or done, and only Interrupted follows): Ctrl-C waits
        self.saved: Position | None = None

    def interrupt(self, *_signal) -> None:
        """The SIGINT handler: ask for a checkpoint at the next boundary and say so at once; a second Ctrl-C
        stops the run at once (KeyboardInterrupt, saying no checkpoint was written) unless a save is under way,
        which it lets finish."""
        if self.saving:
            self.interrupted = True
            say(f"stepnet: interrupted; finishing the checkpoint being written to {self.path}, then stopping")
        elif self.interrupted:
            held = (f"; {self.path} holds the checkpoint of step path {list(self.saved.path)} after "
                    f"{self.saved.done} iteration(s)" if self.saved else f"; {self.path} was not written")
            raise KeyboardInterrupt(f"stopped at once, without the checkpoint (Ctrl-C came again before its "
                                    f"save began){held}")
        else:
            self.interrupted = True
            say(f"stepnet: interrupted; saving a checkpoint to {self.path} at the end of this iteration (Ctrl-C "
                "again to stop without it)")

    def __call__(self, position: Position, ws) -> None:
        stop = self.interrupted and not position.finished
        if stop or (self.every and position.done and position.done % self.every == 0):
            self._save(ws, position)
            self.saves += 1
        if self.saving:   # still set after a save that a Ctrl-C asked for or came during: stop here
            raise Interrupted(self.path, position)

    def _save(self, ws, position: Position) -> None:
        """save(), which a Ctrl-C cannot break off (interrupt() lets it finish)."""
        self.saving = True
        try:
            save(ws, self.path, position)
            self.saved = position
        finally:
            self.saving = self.interrupted   # after a save a Ctrl-C asked for, only Interrupted follows


def say(line: str) -> None:
    """A line on stderr from a signal handler, written to the descriptor: the code interrupted may be inside a
    write to sys.stderr (a progress bar's), which a second write would enter again. On a terminal it starts on
    a line of its own."""
    import os

    try:
        os.write(2, (("\n" if os.isatty(2) else "") + line + "\n").encode(errors="backslashreplace"))
    except OSError:
        pass
