"""The blocks net_builder.ops opens (Caffe2's net_builder private builders): loops, stop guards and
conditionals built from stop blobs (each block one ExecutionStep), and IfNet/Else/WhileNet/Condition built from
If and While ops (each block one net, control_ops_util).

A block that runs once (_RunOnce) ends with a stop when it has a stop blob, so its step does not iterate. A
conditional (_RunIf) stops at its start when its condition is false or an earlier branch of the same chain ran.
"""
from __future__ import annotations

from . import core
from ._netbuilder import NetBuilder, current_net
from .control_ops_util import add_if_op, add_while_op


def _const(value, blob_out=None):
    return current_net().Const(value, blob_out=blob_out)


def stop() -> None:
    """Stop the active builder's step here (ops.stop)."""
    NetBuilder.current().stop_if(_const(True))


class _RunOnce(NetBuilder):
    def __init__(self, name=None):
        NetBuilder.__init__(self, name)

    def __exit__(self, etype, *args):
        if etype is None and self._stop_blob is not None:
            stop()
        return NetBuilder.__exit__(self, etype, *args)


class _StopGuard(_RunOnce):
    """Runs once; has_stopped() is a bool blob, True when the block was stopped before its end."""

    def __init__(self, has_stopped_blob=None, name=None):
        _RunOnce.__init__(self, name)
        self._stopped = has_stopped_blob
        self._ran = False

    def __enter__(self):
        r = _RunOnce.__enter__(self)
        self._stopped = _const(True, self._stopped)
        return r

    def __exit__(self, etype, *args):
        if etype is None:
            self._ran = True
            _const(False, self._stopped)
        return _RunOnce.__exit__(self, etype, *args)

    def has_stopped(self):
        if not self._ran:
            raise AssertionError("Context not used yet.")
        return self._stopped


class _Loop(NetBuilder):
    """Runs until stopped; with iters (a number or a blob), iters times, iter() counting from 0."""

    def __init__(self, iters=None, name=None):
        NetBuilder.__init__(self, name, _stop_blob_required=True)
        self._iter = None
        if iters is not None:   # made in the enclosing builder's net: reset each time the loop starts
            self._inc = _const(1)
            self._iter = _const(0)
            self._num_iters = iters if isinstance(iters, core.BlobReference) else _const(iters)
        else:
            self._num_iters = None

    def iter(self):
        if self._num_iters is None:
            raise AssertionError("This loop does not have a number of iterations.")
        return self._iter

    def __enter__(self):
        builder = NetBuilder.__enter__(self)
        if self._num_iters is not None:
            self.stop_if(current_net().GE([self._iter, self._num_iters]))
        return builder

    def __exit__(self, etype, *args):
        if etype is None and self._num_iters is not None:
            self.current_net().Add([self._iter, self._inc], [self._iter])
        return NetBuilder.__exit__(self, etype, *args)


class _RunIf(_RunOnce):
    """One branch of an If/Elif/Else chain (stop blobs): runs when its condition holds and no earlier branch
    of the chain ran (`_already_ran`, shared by the chain)."""

    def __init__(self, cond_blob=None, name=None, _already_ran=None):
        _RunOnce.__init__(self, name)
        if cond_blob is None and _already_ran is None:
            raise AssertionError("an If needs a condition blob")
        self._is_else = cond_blob is None
        net = current_net()
        if _already_ran is None:
            self._else_blob = net.Not(cond_blob)
            self._already_ran = net.Const(False)
        else:
            self._already_ran = _already_ran
            self._else_blob = _already_ran if cond_blob is None else net.Or([_already_ran, net.Not(cond_blob)])

    def __enter__(self):
        r = _RunOnce.__enter__(self)
        self.stop_if(self._else_blob)
        _const(True, self._already_ran)
        return r

    def Elif(self, cond, name=None):
        if self._is_else:
            raise AssertionError("Elif not allowed for an Else.")
        return NetBuilder.current().add(_RunIf(cond, name=name or self.name, _already_ran=self._already_ran))

    def Else(self, name=None):
        if self._is_else:
            raise AssertionError("Else not allowed for an Else.")
        return NetBuilder.current().add(_RunIf(name=name or self.name, _already_ran=self._already_ran))


class _RunIfNet(NetBuilder):
    """A block that becomes one net with an If op (then: this block; else: a following ops.Else())."""

    def __init__(self, cond_blob, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        if not cond_blob:
            raise AssertionError("Conditional blob is not specified for an If net")
        self._cond_blob = cond_blob
        self._then_net = None
        self._else_net = None

    def __exit__(self, etype, *args):
        if etype is None:
            then_nets = self._children
            self._reset_children()
            self._then_net = NetBuilder.merge_nets(then_nets, self._lexical_scope) or core.Net("empty_then_net")
            if_net = core.Net(self.name + "/if_net")
            add_if_op(if_net, self._cond_blob, self._lexical_scope, self._then_net, self._else_net)
            self._current_net = if_net
            self._children = [if_net]
        return NetBuilder.__exit__(self, etype, *args)


class _RunElseNet(NetBuilder):
    """The else branch of the IfNet just before it: rebuilds that block's net as an If with both branches."""

    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        parent = NetBuilder.current(required=False)
        if not (parent and parent._children and isinstance(parent._children[-1], _RunIfNet)):
            raise AssertionError("Invalid use of Else builder: it must follow an IfNet block")
        self._if_builder = parent._children[-1]

    def __exit__(self, etype, *args):
        if etype is None:
            else_nets = self._children
            self._reset_children()
            if_builder = self._if_builder
            if_builder._else_net = NetBuilder.merge_nets(else_nets, self._lexical_scope)
            if if_builder._else_net:
                if_else_net = core.Net(self.name + "/if_else_net")
                add_if_op(if_else_net, if_builder._cond_blob, self._lexical_scope, if_builder._then_net,
                          if_builder._else_net)
                if_builder._current_net = if_else_net
                if_builder._children = [if_else_net]
        return NetBuilder.__exit__(self, etype, *args)


class _RunWhileNet(NetBuilder):
    """A block that becomes one net with a While op; its condition comes from an ops.Condition() block opened
    first inside it."""

    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        self._cond_builder = None

    def __exit__(self, etype, *args):
        if etype is None:
            if not self._cond_builder:
                raise AssertionError("Condition builder must be specified in While op")
            cond_blob, cond_net = self._cond_builder._cond_blob, self._cond_builder._cond_net
            body = self._children   # (the Condition block is not a child: its net is the While's cond_net)
            self._reset_children()
            body_net = NetBuilder.merge_nets(body, self._lexical_scope) or core.Net("empty_loop_body_net")
            while_net = core.Net(self.name + "/while_net")
            add_while_op(while_net, cond_blob, self._lexical_scope, body_net, cond_net)
            self._current_net = while_net
            self._children = [while_net]
        return NetBuilder.__exit__(self, etype, *args)


class _RunWhileCondition(NetBuilder):
    """The condition of the enclosing WhileNet: its last op's single output is the condition blob; nothing
    else it makes is seen outside."""

    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        parent = NetBuilder.current(required=False)
        if not (parent and isinstance(parent, _RunWhileNet)):
            raise AssertionError("Invalid use of loop condition builder")
        if parent._cond_builder:
            raise AssertionError("Multiple loop condition builders specified")
        if parent._children:
            raise AssertionError("Condition definition must be specified before the loop's body")
        parent._cond_builder = self
        self._cond_blob = None
        self._cond_net = None

    def __exit__(self, etype, *args):
        if etype is None:
            body = self._children
            self._reset_children()
            self._cond_net = NetBuilder.merge_nets(body, self._lexical_scope)
            if not self._cond_net or not self._cond_net.Proto().op:
                raise AssertionError("Invalid loop condition specified: the condition block has no op")
            last_op = self._cond_net.Proto().op[-1]
            if len(last_op.output) != 1:
                raise AssertionError("Invalid condition net: its last op must have a single (bool) output")
            self._cond_blob = core.BlobReference(last_op.output[0])
            self._current_net = self._cond_net
            self._children = [self._cond_net]
        return NetBuilder.__exit__(self, etype, *args)
