"""Caffe2's net_builder.NetBuilder (re-exported by net_builder): a context that collects the nets and nested
builders that `net_builder.ops` calls add, to become an ExecutionStep (core.to_execution_step) or, with
`_use_control_ops`, one net of If/While/Do ops.

Inside `with NetBuilder() as nb:` an op call goes to the builder's current net, a new core.Net made on first use
and after anything else was added (a nested builder, a stop). A builder's children run in order, as the
substeps of its step; `stop_if(blob)` ORs blob into the builder's stop blob, which ends the step after the net
that set it (Caffe2's plan executor checks it after every net and substep). The lexical scope is the set of blob
names the nets added so far use, which the control-op builders (If, While) take as the blobs of the outer
workspace that their nets may read and write.
"""
from __future__ import annotations

from . import core
from .context import define_context


@define_context()
class NetBuilder:
    """Scope-driven building of nets, loops and conditional blocks (see net_builder.ops).

    name: this builder's name (joined to its parent's with '/'); initial_scope: blob names its control-op
    blocks may use from outside (besides those of the nets added so far)."""

    def __init__(self, name=None, initial_scope=None, _stop_blob_required: bool = False, _stop_blob=None,
                 _fullname=None, _use_control_ops: bool = False):
        parent = NetBuilder.current(required=False)
        if _fullname and name:
            raise AssertionError("Cannot set both _fullname and name")
        if _use_control_ops and (_stop_blob_required or _stop_blob):
            raise AssertionError("Stop blobs are not used with control operators")
        self.name = _fullname or "/".join(n for n in (parent.name if parent else None, name) if n)
        self._frozen = False
        self._current_net = None
        self._children: list = []
        if parent:
            parent._update_lexical_scope()   # what the parent has added so far is visible here
        self._init_lexical_scope = set(parent._lexical_scope) if parent else set()
        if initial_scope:
            self._init_lexical_scope |= {str(b) for b in initial_scope}
        self._lexical_scope = set(self._init_lexical_scope)
        self._stop_blob = _stop_blob
        self._stop_blob_required = _stop_blob_required
        self._use_control_ops = _use_control_ops

    # ---------------------------------------------------------------------------------------- stopping
    def stop_blob(self):
        """The builder's stop blob (a bool), made on first use: set False by the builder's first net, so each
        run of the builder's step starts with it false."""
        if self._use_control_ops:
            raise AssertionError("Stop blobs are not used with control operators")
        if self._stop_blob is None:
            net = self.current_net()
            self._stop_blob = core.BlobReference(net.NextName("stop_blob"), net=net)
            net.Const(False, blob_out=self._stop_blob)
            if self._current_net is not self._children[0]:
                init = core.Net(_net_name("stop_blob_init"))
                init.Const(False, blob_out=self._stop_blob)
                self._children.insert(0, init)
        return self._stop_blob

    def stop_if(self, blob) -> None:
        """Stop this builder's step after the current net when `blob` (a scalar bool) is true."""
        if self._use_control_ops:
            raise AssertionError("Stop blobs are not used with control operators")
        stop = self.stop_blob()
        self.current_net().Or([stop, blob], [stop])
        self._current_net = None   # the stop takes effect between nets: later ops go to a new one

    # ---------------------------------------------------------------------------------------- children
    def _assert_mutable(self) -> None:
        if self._frozen:
            raise AssertionError(f"This NetBuilder ({self.name}) has been built already.")

    def _update_lexical_scope(self) -> None:
        """The blob names visible to this builder: its initial scope, those of its nets and of its control-op
        children."""
        self._lexical_scope = set(self._init_lexical_scope)
        for child in self._children:
            if isinstance(child, core.Net):
                self._lexical_scope |= child.UsedBlobNames()
            elif isinstance(child, NetBuilder) and child._use_control_ops:
                self._lexical_scope |= child._lexical_scope

    def _reset_children(self) -> None:
        self._current_net = None
        self._children = []
        self._lexical_scope = set(self._init_lexical_scope)

    def add(self, child):
        """Append a net (which becomes the current net), a nested builder or a TaskGroup; returns it."""
        self._assert_mutable()
        if self._use_control_ops and not (isinstance(child, core.Net) or (
                isinstance(child, NetBuilder) and child._use_control_ops)):
            raise AssertionError("Expected Net or NetBuilder with control ops")
        self._current_net = None
        self._children.append(child)
        if isinstance(child, core.Net):
            self._current_net = child
        self._update_lexical_scope()
        return child

    def current_net(self, name=None):
        """The net ops go to; a new one (named `name`, under this builder's name) when there is none or a name
        is given."""
        self._assert_mutable()
        if self._current_net is None or name is not None:
            self.add(core.Net(_net_name(name)))
        return self._current_net

    def freeze(self) -> None:
        for child in self._children:
            if hasattr(child, "freeze"):
                child.freeze()
        self._current_net = None
        self._frozen = True

    def get(self) -> list:
        """The children (nets, builders), frozen: nothing more can be added."""
        self.freeze()
        return self._children

    def __exit__(self, etype, *args):
        if self._use_control_ops and self._children:
            children = self._children
            self._reset_children()
            merged = NetBuilder.merge_nets(children, self._lexical_scope)
            if not merged:
                raise AssertionError("Expected a non-empty merge of children")
            self._children = [merged]
        self.freeze()
        if etype is not None:
            return
        if self._stop_blob_required and self._stop_blob is None:
            raise AssertionError(f"This NetBuilder ({self.name}) requires a stop condition to be set with `stop` "
                                 "or `stop_if`")

    @staticmethod
    def merge_nets(nets_or_builders, outer_blob_names):
        """One core.Net of the nets and control-op builders in order (each builder's single net appended), its
        external outputs cut to the blobs named in outer_blob_names (the others are local to the enclosing
        block); None when there are none."""
        net = None
        for n in nets_or_builders:
            if isinstance(n, NetBuilder):
                if not n._use_control_ops:
                    raise AssertionError("Merging of NetBuilder supported only for control ops")
                nets = n.get()
                if len(nets) != 1 or not isinstance(nets[0], core.Net):
                    raise AssertionError("Invalid control op net builder")
                cur = nets[0]
            elif isinstance(n, core.Net):
                cur = n
            else:
                raise AssertionError(f"cannot merge a {type(n).__name__} into a control-op net")
            if net is None:
                net = cur
            else:
                net.AppendNet(cur)
        if net is not None:
            proto = net.Proto()
            proto.external_output[:] = [o for o in proto.external_output if o in outer_blob_names]
        return net

    def __str__(self):
        return self.name or "Un-named NetBuilder"


def _net_name(name=None) -> str:
    """A new net's name before core.Net puts it under the active builder's name (Net.current_prefix): `name`, or
    "net_builder" where neither names it."""
    builder = NetBuilder.current(required=False)
    return name or ("" if builder is not None and builder.name else "net_builder")


def current_net():
    """The current net of the active builder (where `ops.X(...)` adds its op)."""
    return NetBuilder.current().current_net()
