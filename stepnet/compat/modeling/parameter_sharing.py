"""Caffe2's scope-driven parameter sharing: inside `with ParameterSharing({'scope_b': 'scope_a'})`, parameters
created under name scope .../scope_b/ are named as under .../scope_a/ (overrides apply recursively)."""
from __future__ import annotations

import contextlib
import logging

from .. import scope

logger = logging.getLogger(__name__)
_SEP = scope._NAMESCOPE_SEPARATOR


class ParameterSharingContext:
    """The active scope overrides (a stack of dicts 'scope/' -> 'other_scope/')."""

    def __init__(self):
        self._scope_overrides: dict = {}
        self._contexts: list = []

    def _resolve_scope_overrides(self, candidate_scope: str) -> str:
        """The scope candidate_scope's parameters live in: its longest overridden prefix replaced by the
        override (itself resolved again), the rest of the path kept."""
        parts = candidate_scope.split(_SEP)
        best, best_idx, prefix = candidate_scope, 0, ""
        for idx, part in enumerate(parts):
            prefix += part + _SEP
            if prefix in self._scope_overrides:
                best, best_idx = self._scope_overrides[prefix], idx
        if best == candidate_scope:
            return candidate_scope
        return self._resolve_scope_overrides(best) + _SEP.join(parts[best_idx + 1:])

    def get_parameter_name(self, name: str) -> str:
        """name in the current name scope, after the overrides."""
        current = scope.CurrentNameScope()
        resolved = self._resolve_scope_overrides(current)
        if resolved != current:
            logger.info("Overwiting scope %s with scope %s", current, resolved)
        return resolved + name

    def add_scope_overrides(self, shared_scopes: dict) -> None:
        self._contexts.append(shared_scopes)
        self._scope_overrides.update(shared_scopes)

    def pop(self) -> None:
        assert self._contexts, "no parameter sharing context to pop"
        self._contexts.pop()
        self._scope_overrides = {}
        for overrides in self._contexts:
            self._scope_overrides.update(overrides)


parameter_sharing_context = ParameterSharingContext()


def _normalize_namescope(namescope: str) -> str:
    return namescope + _SEP if namescope and not namescope.endswith(_SEP) else namescope


@contextlib.contextmanager
def ParameterSharing(shared_scopes: dict):
    """Share the parameters of scope k with scope v for each k: v (both relative to the current name scope)."""
    assert isinstance(shared_scopes, dict)
    current = scope.CurrentNameScope()
    overrides = {}
    for k, v in shared_scopes.items():
        assert not v.startswith(k), f"Illegal override for parameter sharing. {k} is prefix of {v}"
        overrides[_normalize_namescope(current + k)] = _normalize_namescope(current + v)
    parameter_sharing_context.add_scope_overrides(overrides)
    try:
        yield
    finally:
        parameter_sharing_context.pop()
