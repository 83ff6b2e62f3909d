"""Caffe2's timeout_guard: a watchdog for a call that may hang.

    with timeout_guard.CompleteInTimeOrDie(10.0):
        workspace.RunNet(...)

A daemon thread waits for the block to finish; if it has not after `timeout_secs`, it logs an error, prints
every thread's stack and interrupts the process (SIGINT, a KeyboardInterrupt in the main thread); if the block
has still not ended 10 s later (the interrupt did not get through), it aborts the process.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback

log = logging.getLogger("timeout_guard")
FORCE_AFTER_SECS = 10.0


def _stacks(only=None) -> str:
    """The stack of every thread (or of the thread with ident `only`), one frame a line."""
    lines = []
    for ident, frame in sys._current_frames().items():
        if only is not None and ident != only:
            continue
        lines.append(f"\n# ThreadID: {ident}")
        for filename, lineno, name, line in traceback.extract_stack(frame):
            lines.append(f'File: "{filename}", line {lineno}, in {name}')
            if line:
                lines.append(f"  {line.strip()}")
    return "\n".join(lines)


class WatcherThread(threading.Thread):
    """Waits up to timeout_secs for `completed`; then interrupts the process, and aborts it if that fails."""

    def __init__(self, timeout_secs: float):
        super().__init__(daemon=True)
        self.timeout_secs = float(timeout_secs)
        self.completed = False
        self.condition = threading.Condition()
        self.caller_thread = threading.current_thread()
        self.force_after = FORCE_AFTER_SECS

    def finish(self) -> None:
        with self.condition:
            self.completed = True
            self.condition.notify_all()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_secs
        with self.condition:
            while not self.completed and time.monotonic() < deadline:
                self.condition.wait(deadline - time.monotonic())
        if self.completed:
            return
        log.error("Call did not finish in time. Timeout:%ss PID: %d", self.timeout_secs, os.getpid())
        threading.Thread(target=self._force_quit, daemon=True).start()
        print(f"Caller thread was: {self.caller_thread}\n-----Before forcing------\n{_stacks()}")
        os.kill(os.getpid(), signal.SIGINT)

    def _force_quit(self) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.completed, self.force_after)
        if self.completed:   # the interrupt ended the block: the program handles it
            return
        print(f"Caller thread was: {self.caller_thread}\n-----After force------\n"
              f"{_stacks(self.caller_thread.ident)}")
        log.error("Process did not terminate cleanly in %s s, forcing", self.force_after)
        os.abort()


@contextlib.contextmanager
def CompleteInTimeOrDie(timeout_secs: float):
    """Run the block under a watchdog of timeout_secs (see the module's doc)."""
    watcher = WatcherThread(timeout_secs)
    watcher.start()
    try:
        yield
    finally:
        watcher.finish()


def EuthanizeIfNecessary(timeout_secs: float = 120) -> None:
    """Start a watchdog that is never told to stop: the process is interrupted after timeout_secs if it is still
    running (for a process that hangs at shutdown)."""
    WatcherThread(timeout_secs).start()
