"""Caffe2's modifier contexts: a stack of {name: modifier} dicts (later ones override earlier), entered with a
UseModifierBase subclass (e.g. regularizer_context.UseRegularizer)."""
from __future__ import annotations

DEFAULT_MODIFIER = "DEFAULT"


class ModifierContext:
    """The modifiers of the active `with Use...(...)` blocks."""

    def __init__(self):
        self._modifiers: dict = {}
        self._modifiers_list: list = []

    def _rebuild_modifiers(self) -> None:
        self._modifiers = {}
        for modifiers in self._modifiers_list:
            self._modifiers.update(modifiers)

    def _has_modifier(self, name) -> bool:
        return name in self._modifiers

    def _get_modifier(self, name):
        return self._modifiers.get(name)

    def push_modifiers(self, modifiers: dict) -> None:
        self._modifiers_list.append(modifiers)
        self._modifiers.update(modifiers)

    def pop_modifiers(self) -> None:
        assert self._modifiers_list, "no modifiers to pop"
        self._modifiers_list.pop()
        self._rebuild_modifiers()


class UseModifierBase:
    """`with Use...(modifier_or_dict):` pushes the modifiers (a single one under DEFAULT_MODIFIER) on the
    context class's current context."""

    def __init__(self, modifier_or_dict):
        self._modifiers = (modifier_or_dict if isinstance(modifier_or_dict, dict)
                           else {DEFAULT_MODIFIER: modifier_or_dict})

    def _context_class(self):
        raise NotImplementedError

    def __enter__(self):
        self._context_class().current().push_modifiers(self._modifiers)
        return self

    def __exit__(self, exc_type, value, traceback):
        self._context_class().current().pop_modifiers()
