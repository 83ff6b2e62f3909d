"""Waiting between the threads of a run: Caffe2's blocking queue operations, with stepnet's no-hang rule.

A queue op that cannot go on (a read from an empty open queue, a write to a full one) waits on its queue's
Signal, but only while another thread of its group could still make progress: when every thread of the group
waits (or the op's thread is the only one), nothing can ever wake it, and the wait is a Deadlock, one error line
naming the queue and what the other threads wait for, where Caffe2 would wait forever.

A Group is the threads of one plan run (runtime.concurrent forks and joins them, and stops them all when one
fails: a waiting thread then raises Stopped). Threads, one per workspace tree (Workspace.waits), says which group
the calling thread belongs to; a thread outside any plan run is in the tree's free group, whose other members are
the process's other live non-daemon threads (a Python program's own threads) and the threads of plan runs, less
those waiting. A wait with a timeout ends by itself, so it always waits (up to its timeout) and never counts as
waiting for the rule. Waiters poll every POLL seconds as well, so a stopped group or a thread that ended is seen
without a notification."""
from __future__ import annotations

import threading
import time

from .errors import OpError

POLL = 0.05   # seconds between a waiter's looks at its group when nothing notifies it


class Deadlock(OpError):
    """A wait no thread could ever end: every thread of the run waits, or none other runs."""


class Stopped(BaseException):
    """Raised in a thread of a group another thread's failure (or Ctrl-C) stopped; not an error of its own. A
    BaseException, so that the run loop's `except Exception` passes it through unchanged."""


class Token:
    """One thread's wait: who (the op's place), what blocks it, the action another thread would have to take and
    a hint for the error; woken when a notify counted it out."""
    __slots__ = ("ident", "label", "blocked", "action", "hint", "timed", "woken")

    def __init__(self, label, blocked: str, action: str, hint: str, timed: bool):
        self.ident, self.label, self.blocked = threading.get_ident(), label, blocked
        self.action, self.hint = action, hint
        self.timed, self.woken = timed, False

    def __str__(self):
        return f"{self.label}: {self.blocked}" if self.label is not None else self.blocked


class Group:
    """The threads of one run: `running` counts those not finished and not joining others, `waiting` those of
    them in an untimed wait; `failure` is the first exception of any of them (the run stops)."""

    def __init__(self, threads: "Threads | None" = None):
        self._lock = threading.Lock()
        self.threads = threads
        self.running, self.waiting = 1, 0          # the thread that made the group
        self.tokens: list[Token] = []
        self.failure: BaseException | None = None

    def fork(self, k: int) -> list:
        """The calling thread starts k > 0 threads and joins them: they run in its place. Returns the fork's count
        of threads left, for finish()."""
        with self._lock:
            self.running += k - 1
        return [k]

    def finish(self, fork: list) -> None:
        """A forked thread ended; the last one hands its place back to the joining thread, which runs on
        without ever being counted out in between."""
        with self._lock:
            fork[0] -= 1
            if fork[0] > 0:
                self.running -= 1

    def resume(self) -> None:
        """The joining thread runs for a while (the report net): counted as running until pause()."""
        with self._lock:
            self.running += 1

    def pause(self) -> None:
        with self._lock:
            self.running -= 1

    def fail(self, error: BaseException) -> None:
        """Stop the group: the first failure is kept; the other threads raise Stopped at their next check."""
        with self._lock:
            if self.failure is None and not isinstance(error, Stopped):
                self.failure = error

    def check(self) -> None:
        if self.failure is not None:
            raise Stopped()

    def begin(self, token: Token) -> None:
        """Count the calling thread as waiting, or raise Deadlock when nothing could end its wait."""
        with self._lock:
            if self.failure is not None:
                raise Stopped()
            if not token.timed:
                if self._stuck(token):
                    raise Deadlock(self._message(token))
                self.waiting += 1
            self.tokens.append(token)
        if self.threads is not None:
            self.threads.waiting_add(token.ident)

    def end(self, token: Token) -> None:
        """The wait of token is over (it was notified, timed out, or polls again)."""
        with self._lock:
            if token in self.tokens:
                self.tokens.remove(token)
                if not token.timed:
                    self.waiting -= 1
        if self.threads is not None:
            self.threads.waiting_remove(token.ident)

    def _stuck(self, token: Token) -> bool:
        return self.waiting + 1 >= self.running

    def _message(self, token: Token) -> str:
        others = [str(t) for t in self.tokens if t.ident != token.ident and not t.timed]
        if not others:
            return (f"{token.blocked}, and no other thread of this run can {token.action}: Caffe2 would wait "
                    f"forever; {token.hint}")
        shown = "; ".join(others[:3]) + ("; ..." if len(others) > 3 else "")
        return (f"{token.blocked}, and every other thread of this run waits too ({shown}), so none can "
                f"{token.action}: a deadlock, where Caffe2 would wait forever; {token.hint}")


class FreeGroup(Group):
    """The threads outside plan runs: a wait goes on while another live thread could progress (a non-daemon
    thread, a daemon thread marked `counts_for_waits = True` such as compat's data workers, or a thread of a
    plan run, that is not waiting)."""

    def _stuck(self, token: Token) -> bool:
        idle = self.threads.idle()
        return not any(t.ident != token.ident and t.ident not in idle and
                       (not t.daemon or getattr(t, "counts_for_waits", False) or self.threads.member(t.ident))
                       for t in threading.enumerate())


class Threads:
    """Per workspace tree: the group each thread belongs to while it runs a plan, and the threads waiting."""

    def __init__(self):
        self._lock = threading.Lock()
        self._groups: dict[int, Group] = {}
        self._waiting: dict[int, int] = {}
        self.free = FreeGroup(self)

    def group(self) -> Group:
        """The calling thread's group (the free group outside plan runs)."""
        return self._groups.get(threading.get_ident(), self.free)

    def enter(self, group: Group) -> Group | None:
        """The calling thread joins group; returns its group before (for leave)."""
        with self._lock:
            return self._swap(group)

    def leave(self, previous: Group | None) -> None:
        with self._lock:
            self._swap(previous)

    def _swap(self, group: Group | None) -> Group | None:
        ident = threading.get_ident()
        previous = self._groups.pop(ident, None)
        if group is not None:
            self._groups[ident] = group
        return previous

    def member(self, ident: int) -> bool:
        return ident in self._groups

    def waiting_add(self, ident: int) -> None:
        with self._lock:
            self._waiting[ident] = self._waiting.get(ident, 0) + 1

    def waiting_remove(self, ident: int) -> None:
        with self._lock:
            left = self._waiting.get(ident, 0) - 1
            if left > 0:
                self._waiting[ident] = left
            else:
                self._waiting.pop(ident, None)

    def idle(self) -> frozenset:
        with self._lock:
            return frozenset(self._waiting)


class Signal:
    """A queue's lock and condition (`with signal:` holds the lock) whose waiters are counted by their groups:
    notify() counts every waiter out before it wakes, so a woken thread is never taken for a waiting one."""

    def __init__(self):
        self.cond = threading.Condition()
        self._tokens: list[tuple[Group, Token]] = []

    def __enter__(self):
        self.cond.acquire()
        return self

    def __exit__(self, *exc):
        self.cond.release()
        return False

    def notify(self) -> None:
        """The queue changed: every waiter looks again (call it holding the lock)."""
        for group, token in self._tokens:
            token.woken = True
            group.end(token)
        self._tokens.clear()
        self.cond.notify_all()

    def wait(self, ready, group: Group, label, blocked: str, action: str, hint: str,
             timeout: float | None = None) -> bool:
        """Wait (holding the lock) until ready() is true: True then; False when timeout seconds (> 0) passed
        first. Raises Deadlock when no thread of the group could make ready() true, Stopped when the group
        stopped. blocked says what holds the op up, action what another thread would do to end it, hint what the
        model could do instead."""
        deadline = time.monotonic() + timeout if timeout else None
        while not ready():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            token = Token(label, blocked, action, hint, timed=deadline is not None)
            group.begin(token)
            self._tokens.append((group, token))
            try:
                self.cond.wait(POLL if left is None else min(POLL, left))
            finally:
                if not token.woken:
                    self._tokens.remove((group, token))
                    group.end(token)
        return True
