"""Build nets from Python, close to Caffe2's core.Net: `net.FC(["x", "w", "b"], "y", axis=1)`.

Every registered operator is a method (checked against the registry when the op is added: unknown types get a
did-you-mean, wrong arity and argument types are errors right away). Scopes belong to the builder (no global
state): `with net.name_scope("LSTM"):` prefixes string blob names, `with net.device_scope(option):` stamps a
DeviceOption on new ops. Outputs left out are named as Caffe2 names them (`<net>/<OpType>`, `_2`, ...).
As in Caffe2's CreateOperator, keyword arguments whose value is None are left out and `random_seed=` goes to
the op's device_option.
"""
from __future__ import annotations

import contextlib
import warnings

from ..core.errors import ArgumentError, StepnetError, did_you_mean
from ..ops.binding import check_arity, check_inplace, parse_args
from ..graph.view import Graph
from ..ops import REGISTRY
from ..io.proto import DeviceOption, NetDef, OperatorDef, make_argument, to_text

SPECIAL = ("name", "control_input", "device_option", "engine", "arg", "random_seed")


class BlobRef(str):
    """A blob name that is used as given (not scoped again), like Caffe2's BlobReference."""


class Scope:
    """The name prefix and device option that new ops get; shared by the nets of one model."""

    def __init__(self):
        self.names: list[str] = []
        self.device: DeviceOption | None = None

    def scoped(self, name: str) -> str:
        if isinstance(name, BlobRef) or not self.names:
            return str(name)
        return "/".join(self.names) + "/" + name

    @contextlib.contextmanager
    def name_scope(self, prefix: str):
        """Nested scopes join with '/'; an empty prefix adds nothing (Caffe2's NameScope(''))."""
        prefix = prefix.rstrip("/")
        if prefix:
            self.names.append(prefix)
        try:
            yield
        finally:
            if prefix:
                self.names.pop()

    @contextlib.contextmanager
    def device_scope(self, option: DeviceOption | None):
        old, self.device = self.device, option
        try:
            yield
        finally:
            self.device = old


class NetBuilder:
    """A NetDef under construction; every registered op type is a method."""

    def __init__(self, name: str = "net", scope: Scope | None = None, proto: NetDef | None = None):
        self._net = NetDef()
        if proto is not None:
            self._net.CopyFrom(proto)
        else:
            self._net.name = name
        self.scope = scope or Scope()
        self._defined: set[str] = set(Graph.of(self._net).final)   # external inputs and every op output
        self._blob_counter = 0

    # ------------------------------------------------------------------------------------ naming
    @property
    def name(self) -> str:
        return self._net.name

    def next_name(self, prefix: str | None = None, output_id: int | None = None) -> BlobRef:
        """A fresh blob name: <net>/<prefix>[:<id>] made unique, or <net>_blob_<k> without a prefix."""
        if prefix is None:
            while True:
                name = f"{self.name}_blob_{self._blob_counter}"
                self._blob_counter += 1
                if name not in self._defined:
                    return BlobRef(name)
        base = self.scope.scoped(f"{self.name}/{prefix}")
        suffix = f":{output_id}" if output_id is not None else ""
        name, k = base + suffix, 2
        while name in self._defined:
            name, k = f"{base}_{k}{suffix}", k + 1
        return BlobRef(name)

    def name_scope(self, prefix: str):
        return self.scope.name_scope(prefix)

    def device_scope(self, option: DeviceOption | None):
        return self.scope.device_scope(option)

    # ------------------------------------------------------------------------------------ ops
    def __getattr__(self, op_type: str):
        if op_type.startswith("_") or op_type not in REGISTRY:
            raise AttributeError(f"{type(self).__name__} has no operator or attribute {op_type!r}"
                                 f"{did_you_mean(op_type, list(REGISTRY))}")
        def add(inputs=(), outputs=None, **kwargs):
            return self.add_op(op_type, inputs, outputs, **kwargs)
        add.__name__, add.__doc__ = op_type, REGISTRY.get(op_type).doc
        return add

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(REGISTRY))

    def add_op(self, op_type: str, inputs=(), outputs=None, **kwargs):
        """Add an op; returns its output BlobRef (or a list of them for several or no outputs). outputs=None
        names one output (none for an op that has no outputs, e.g. Print); an int k names k outputs."""
        schema = REGISTRY.get(op_type)
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        inputs = [BlobRef(self.scope.scoped(x)) for x in inputs]
        if outputs is None or isinstance(outputs, int):
            count = (0 if schema.outputs[1] == 0 else 1) if outputs is None else outputs
            outs = [self.next_name(op_type, None if outputs is None else i) for i in range(count)]
        else:
            outputs = [outputs] if isinstance(outputs, str) else outputs
            outs = [BlobRef(self.scope.scoped(o)) for o in outputs]
        opdef = OperatorDef(type=op_type, input=inputs, output=outs)
        if kwargs.get("name"):
            opdef.name = kwargs.pop("name")
        kwargs.pop("name", None)
        if kwargs.get("engine"):
            opdef.engine = kwargs.pop("engine")
        kwargs.pop("engine", None)
        opdef.control_input.extend(kwargs.pop("control_input", []) or [])
        device = kwargs.pop("device_option", None) or self.scope.device
        if device is not None:
            opdef.device_option.CopyFrom(device)
        seed = kwargs.pop("random_seed", None)
        if seed is not None:
            opdef.device_option.random_seed = int(seed)
        opdef.arg.extend(kwargs.pop("arg", []) or [])
        for key, value in kwargs.items():
            if value is not None:
                opdef.arg.append(make_argument(key, value))
        self._check(opdef)
        for name in inputs:
            if name not in self._defined:
                self.add_external_inputs(name)
        self._net.op.append(opdef)
        self._defined.update(outs)
        return outs[0] if len(outs) == 1 else outs

    # an argument the op does not declare is an error here; compat.core.Net keeps it (warned about when the net
    # is bound), as Caffe2 does
    undeclared_args_are_errors = True

    def _check(self, opdef: OperatorDef) -> None:
        """Arity, in-place rules and argument types, when the op is added."""
        label = f"net {self.name!r}, new op #{len(self._net.op)} ({opdef.type})"
        schema = REGISTRY.get(opdef.type)
        check_arity(schema, opdef, label)
        check_inplace(schema, opdef, label)
        with warnings.catch_warnings():
            warnings.simplefilter("error" if self.undeclared_args_are_errors else "ignore")
            try:
                parse_args(schema, opdef, label, strict=False)
            except Warning as w:
                raise ArgumentError(str(w)) from None

    # ------------------------------------------------------------------------------------ net
    def add_external_inputs(self, *names) -> None:
        for name in names:
            if name not in self._net.external_input:
                self._net.external_input.append(str(name))
                self._defined.add(str(name))

    def add_external_outputs(self, *names) -> None:
        for name in names:
            if name not in self._defined:
                raise StepnetError(f"net {self.name!r}: external output {name!r} is produced by no op of the "
                                   "net")
            if name not in self._net.external_output:
                self._net.external_output.append(str(name))

    @property
    def external_inputs(self) -> list[str]:
        return list(self._net.external_input)

    @property
    def external_outputs(self) -> list[str]:
        return list(self._net.external_output)

    def is_defined(self, name: str) -> bool:
        return name in self._defined

    def proto(self) -> NetDef:
        """The NetDef being built (live: later ops appear in it)."""
        return self._net

    def replace(self, netdef: NetDef) -> None:
        """Continue building from netdef (a rewrite of this net), in this builder and its scope."""
        self._net.CopyFrom(netdef)
        self._defined = set(Graph.of(self._net).final)

    def add_gradient_ops(self, losses):
        """Append the backward pass of losses; returns {blob: gradient}."""
        from ..passes.gradients import add_gradient_ops
        if isinstance(losses, str):
            losses = [losses]
        if isinstance(losses, dict):  # given output gradients are fed: they are inputs of the net
            self.add_external_inputs(*(g for g in losses.values()
                                       if isinstance(g, str) and not self.is_defined(g)))
        grads = add_gradient_ops(self._net, losses)
        self._defined.update(Graph.of(self._net).final)
        return grads

    def __str__(self):
        return to_text(self._net)

    def __repr__(self):
        return f"NetBuilder({self.name!r}, {len(self._net.op)} ops)"
