"""Caffe2's caffe2.python.onnx.backend_rep: Caffe2Rep, a prepared ONNX model (an init net and a predict net in a
workspace of their own) that runs on inputs as an onnx.backend.base.BackendRep does."""
from __future__ import annotations

from onnx.backend.base import BackendRep

from ... import caffe2_pb2
from .. import core, workspace
from .helper import namedtupledict


class Caffe2Rep(BackendRep):
    """run(inputs): inputs a dict {blob: value}, a list or tuple of values for the uninitialized graph inputs in
    order, or one value for the first; returns the predict net's external outputs. The init net runs once, on
    the first run."""

    def __init__(self, init_net, predict_net, workspace, uninitialized):
        super().__init__()
        self.init_net = init_net
        self.predict_net = predict_net
        self.workspace = workspace
        self.uninitialized = uninitialized
        self.nets_created = False
        self.ran_init_net = False

    @property
    def _name_scope(self) -> str:
        option = self.predict_net.device_option
        return f"gpu_{option.device_id}" if option.device_type == caffe2_pb2.CUDA else ""

    def _feed(self, inputs) -> None:
        if isinstance(inputs, dict):
            with core.NameScope(self._name_scope):
                for name, value in inputs.items():
                    workspace.FeedBlob(name, value)
        elif isinstance(inputs, (list, tuple)):
            if len(self.uninitialized) != len(inputs):
                raise RuntimeError(f"Expected {len(self.uninitialized)} values for uninitialized graph inputs "
                                   f"({', '.join(self.uninitialized)}), but got {len(inputs)}.")
            for name, value in zip(self.uninitialized, inputs):
                workspace.FeedBlob(name, value)
        else:
            workspace.FeedBlob(self.uninitialized[0], inputs)

    def run(self, inputs, **kwargs):
        super().run(inputs, **kwargs)
        with self.workspace, core.DeviceScope(self.predict_net.device_option):
            self._feed(inputs)
            if not self.nets_created:
                workspace.CreateNet(self.init_net)
                workspace.CreateNet(self.predict_net)
                self.nets_created = True
            if not self.ran_init_net:
                workspace.RunNet(self.init_net.name)
                self.ran_init_net = True
            workspace.RunNet(self.predict_net.name)
            names = list(self.predict_net.external_output)
            return namedtupledict("Outputs", names)(*[workspace.FetchBlob(n) for n in names])
