"""Where each operator was created, as Caffe2 records it: core.Net's op methods note the Python stack of the
call that added the op (`operator_tracebacks`, Caffe2's workspace.operator_tracebacks: {net name: {op index:
[(file, line, function), ...], innermost first}}); Net.PopulateProtoWithFileName names ops by it; and when a
net created or run through the workspace module fails at an op, that op's creation stack is printed after the
error, as Caffe2's CallWithExceptionIntercept prints it."""
from __future__ import annotations

import functools
from collections import defaultdict

operator_tracebacks: dict = defaultdict(dict)


def stack_of(frame) -> list:
    """(file, line, function) of frame and each frame below it, read from the frames (no source file access)."""
    found = []
    while frame is not None:
        found.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return found


def record(net_name: str, index: int, frame) -> None:
    operator_tracebacks[net_name][index] = stack_of(frame)


def report(error: Exception) -> None:
    """Print where the op an error names was created, when a Net method made it (Caffe2's message; nothing for
    other errors and ops)."""
    at = getattr(error, "op", None)
    stack = operator_tracebacks.get(at.net, {}).get(at.index) if at is not None and at.net is not None else None
    if not stack:
        return
    print(f"Original python traceback for operator {at.index} in network `{at.net}` in exception above "
          "(most recent call last):")
    for file, line, function in reversed(stack):
        print(f'  File "{file}", line {line}, in {function}')


def intercepted(fn):
    """fn, printing the failing op's creation stack (report) before its exception goes on."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            report(e)
            raise
    return call
