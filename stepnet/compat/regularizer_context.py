"""Caffe2's regularizer context: `with UseRegularizer({'WEIGHT': reg})`, then
`RegularizerContext.current().get_regularizer('WEIGHT')`."""
from __future__ import annotations

from . import context
from .modifier_context import ModifierContext, UseModifierBase


@context.define_context(allow_default=True)
class RegularizerContext(ModifierContext):
    """The regularizers of the active UseRegularizer blocks, by name."""

    def has_regularizer(self, name) -> bool:
        return self._has_modifier(name)

    def get_regularizer(self, name):
        assert self.has_regularizer(name), f"{name} regularizer is not provided!"
        return self._get_modifier(name)


class UseRegularizer(UseModifierBase):
    def _context_class(self):
        return RegularizerContext
