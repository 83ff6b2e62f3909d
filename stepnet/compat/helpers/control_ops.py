"""Caffe2's brew helpers cond and loop: an If or a While op in model.net running other models' nets
(control_ops_util)."""
from __future__ import annotations

from ..control_ops_util import add_if_op, add_while_op


def cond(model, cond_blob, external_blobs, then_model, else_model=None) -> None:
    """If cond_blob: then_model.net, else else_model.net (when given); external_blobs are the outer blobs their
    nets may use."""
    add_if_op(model.net, cond_blob, external_blobs, then_model.net, else_model.net if else_model else None)


def loop(model, cond_blob, external_blobs, loop_model, cond_model=None) -> None:
    """While cond_blob: loop_model.net; cond_model.net (when given) recomputes cond_blob before each
    iteration."""
    add_while_op(model.net, cond_blob, external_blobs, loop_model.net, cond_model.net if cond_model else None)
