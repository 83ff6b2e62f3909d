"""Caffe2's optimizer_context: choosing the optimizer of the parameters a block of layers creates.

    with UseOptimizer(optim):                                    # every parameter made here
        brew.conv(model, ...)
    with UseOptimizer({"WEIGHT": w_optim, "BIAS": b_optim}):      # by the parameter's tag, DEFAULT for the rest
        brew.fc(model, ...)

Blocks nest (an inner one overrides the names it gives). OptimizerContext.current() is the context of this
thread; the model helper asks it, when a parameter is created, for the optimizer under the parameter's tag or
DEFAULT, and optimizer._build uses that one for the parameter instead of the one it was given.
"""
from __future__ import annotations

import threading

DEFAULT_OPTIM = "DEFAULT"


class OptimizerContext:
    """The optimizers in force: a stack of {name: optimizer} dicts, later ones overriding earlier ones."""

    _local = threading.local()

    def __init__(self):
        self._stack: list[dict] = []

    @classmethod
    def current(cls) -> "OptimizerContext":
        """This thread's context (made empty the first time)."""
        if not hasattr(cls._local, "context"):
            cls._local.context = cls()
        return cls._local.context

    def _merged(self) -> dict:
        merged: dict = {}
        for optimizers in self._stack:
            merged.update(optimizers)
        return merged

    def has_optimizer(self, name) -> bool:
        return name in self._merged()

    def get_optimizer(self, name):
        merged = self._merged()
        if name not in merged:
            raise KeyError(f"{name} optimizer is not provided!")
        return merged[name]

    def push_optimizers(self, optimizers: dict) -> None:
        self._stack.append(dict(optimizers))

    def pop_optimizers(self) -> None:
        if not self._stack:
            raise RuntimeError("no UseOptimizer block to leave")
        self._stack.pop()


class UseOptimizer:
    """A block in which the parameters made get `optimizer` (or, for a dict, the optimizer of their tag)."""

    def __init__(self, optimizer_or_dict):
        self._optimizers = (dict(optimizer_or_dict) if isinstance(optimizer_or_dict, dict)
                            else {DEFAULT_OPTIM: optimizer_or_dict})

    def __enter__(self):
        OptimizerContext.current().push_optimizers(self._optimizers)
        return self

    def __exit__(self, *exc) -> None:
        OptimizerContext.current().pop_optimizers()
