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
from .files import quoted

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
    reaches it. A checkpoint may come from anyone: its position, readers and generator state are checked in
    full (types, keys, ranges) here, before the run starts."""

    def __init__(self, path, max_blob_bytes: int | None = None):
        from .minidb import load_blobs

        self.path = str(path)
        self.blobs = load_blobs(path, max_blob_bytes=max_blob_bytes)
        if POSITION not in self.blobs:
            raise FileFormatError(f"not a resumable checkpoint (it has no {POSITION!r}); it was not written during "
                                  "a plan run with --checkpoint-every or an interrupt. Feed its blobs with --load "
                                  "instead", at=self.path)
        self.position = _position(self.blobs[POSITION], self.path)
        self.readers: dict[str, dict] = _json(self.blobs, READERS, {str: READER}, self.path)
        self.rng_state = _json(self.blobs, RNG, PCG64, self.path)

    def restore(self, ws) -> None:
        """Feed the saved blobs, move each data reader back to its record, restore the random generator."""
        from .dbreader import DBReader

        for name, value in self.blobs.items():
            if not name.startswith(PREFIX):
                ws.feed(name, value)
        for name, state in self.readers.items():
            reader = ws.find(name)
            if reader is None or not isinstance(reader.value, DBReader) or reader.value.source != state["source"]:
                raise FileFormatError(f"the checkpoint has reader {quoted(name)} of {quoted(state['source'])}, but "
                                      "the resumed run made no such reader before this step: resume with the same "
                                      "plan and data", at=self.path)
            try:
                reader.value.seek(state["pos"])
            except FileFormatError as e:   # a position past the db's end
                raise e.located(self.path) from None
        ws.rng.bit_generator.state = self.rng_state


# What the JSON blobs must hold: a dict maps its keys to forms (`str` as a key: any number of text keys), a range
# holds an int (never a bool) in it, a type an instance, any other value itself.
READER = {"source": str, "pos": range(2**63)}
PCG64 = {"bit_generator": "PCG64", "state": {"state": range(2**128), "inc": range(2**128)},
         "has_uint32": range(2), "uinteger": range(2**32)}   # numpy's default_rng, the workspace generator


def _check(value, form, what: str, where: str) -> None:
    """FileFormatError naming `what` (the path to value) unless value has `form`."""
    if isinstance(form, dict):
        if not isinstance(value, dict):
            raise FileFormatError(f"{what} is {quoted(value)}, not a JSON object", at=where)
        if str in form:
            for key, item in value.items():
                _check(item, form[str], f"{what}[{quoted(key)}]", where)
            return
        if value.keys() != form.keys():
            raise FileFormatError(f"{what} has the keys {quoted(sorted(value))}; a checkpoint's has exactly "
                                  f"{sorted(form)}", at=where)
        for key, item in form.items():
            _check(value[key], item, f"{what}[{key!r}]", where)
    elif isinstance(form, range):
        if type(value) is not int or value not in form:
            top = f"2**{form.stop.bit_length() - 1}" if form.stop > 2**32 else form.stop   # powers of two
            raise FileFormatError(f"{what} is {quoted(value)}, not an integer in [{form.start}, {top})", at=where)
    elif isinstance(form, type):
        if not isinstance(value, form):
            raise FileFormatError(f"{what} is {quoted(value)}, not a {form.__name__}", at=where)
    elif type(value) is not type(form) or value != form:
        raise FileFormatError(f"{what} is {quoted(value)}; stepnet writes {form!r}", at=where)


def _position(value, where: str) -> Position:
    """The Position a POSITION blob holds: a 1-D integer tensor of a step path (at most MAX_DEPTH + 1 indices,
    none negative) and the iterations done; FileFormatError for anything else, or a finished run."""
    from .validate import MAX_DEPTH

    if not (isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.ndim == 1
            and 0 < value.size <= MAX_DEPTH + 2):
        shown = f"a {value.dtype} tensor of shape {list(value.shape)}" if isinstance(value, np.ndarray) else \
            f"a {type(value).__name__}"
        raise FileFormatError(f"{POSITION!r} is {shown}, not a plan position (a step path and a count of "
                              "iterations, as int64)", at=where)
    raw = [int(v) for v in value]
    if tuple(raw[:len(FINISHED)]) == FINISHED and len(raw) <= len(FINISHED) + 1:
        raise FileFormatError("the run that wrote this checkpoint finished; there is nothing to resume (feed its "
                              "blobs with --load to start a new run from them)", at=where)
    if len(raw) < 2 or min(raw) < 0:
        raise FileFormatError(f"{POSITION!r} holds {quoted(raw)}, which is no plan position", at=where)
    return Position(tuple(raw[:-1]), raw[-1])


def _json(blobs: dict, name: str, form, where: str):
    """The JSON value blob `name` holds, of `form` (_check); FileFormatError when it is missing, not JSON (NaN
    and Infinity included) or of another form."""
    raw = blobs.get(name)
    try:
        if not isinstance(raw, (str, bytes)):
            raise TypeError
        value = json.loads(raw.decode() if isinstance(raw, bytes) else raw, parse_constant=_no_constant)
    except (TypeError, ValueError, RecursionError):   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise FileFormatError(f"{name!r} is missing or not valid JSON", at=where) from None
    _check(value, form, name, where)
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


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
