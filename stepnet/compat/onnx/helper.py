"""Caffe2's caffe2.python.onnx.helper: fresh blob names for converted ops (dummy_name), running one Caffe2 op or
net in a workspace of its own (c2_native_run_op / c2_native_run_net), loading and saving NetDefs, timing a model.

Outputs are returned as ONNX backends return them: a namedtuple whose fields are the output blobs, which can also
be indexed by blob name (`outputs["Y"]`, `outputs.Y`, `outputs[0]`).
"""
from __future__ import annotations

import logging
import time

from ... import caffe2_pb2
from ..functional import namedtupledict
from .workspace import Workspace

log = logging.getLogger(__name__)
DUMMY_PREFIX = "OC2_DUMMY_"


class _DummyNames:
    """Caffe2's DummyName: OC2_DUMMY_<n> for n = 0, 1, ..., skipping the names in use (and those given out)."""

    def __init__(self):
        self.counter = 0
        self.used: set[str] = set()

    def reset(self, used) -> None:
        self.used = {str(n) for n in used}
        self.counter = 0

    def new(self) -> str:
        while True:
            name = f"{DUMMY_PREFIX}{self.counter}"
            self.counter += 1
            if name not in self.used:
                self.used.add(name)
                return name

    def add(self, name: str) -> None:
        self.used.add(name)


_dummy = _DummyNames()


def dummy_name(used_names=None):
    """With no argument, a new name no op of the graph being converted uses; with a collection of names, start
    the numbering again with those names taken (returns None)."""
    if used_names is None:
        return _dummy.new()
    _dummy.reset(used_names)
    return None


def _outputs(ws, names):
    names = list(names)
    return namedtupledict("Outputs", names)(*[ws.FetchBlob(n) for n in names])


def c2_native_run_op(op_def, inputs):
    """Run one OperatorDef in a new workspace fed with inputs (a dict, or values for op_def's inputs in order):
    (the workspace, its outputs)."""
    ws = Workspace()
    if isinstance(inputs, dict):
        feeds = list(inputs.items())
    else:
        if len(op_def.input) != len(inputs):
            raise AssertionError(f"{op_def.type} has {len(op_def.input)} inputs, {len(inputs)} values given")
        feeds = list(zip(op_def.input, inputs))
    for name, value in feeds:
        ws.FeedBlob(name, value, op_def.device_option)
    ws.RunOperatorOnce(op_def)
    return ws, _outputs(ws, op_def.output)


def c2_native_run_net(init_net, predict_net, inputs):
    """Run init_net (if any) then predict_net in a new workspace: (the workspace, predict_net's external outputs).
    inputs: a dict, or values for the external inputs init_net left unset (or, when every one is set, for the
    first len(inputs) external inputs)."""
    ws = Workspace()
    if init_net:
        ws.RunNetOnce(init_net)
    option = predict_net.device_option
    if isinstance(inputs, dict):
        feeds = list(inputs.items())
    else:
        missing = [n for n in predict_net.external_input if not ws.HasBlob(n)]
        if len(missing) == len(inputs):
            feeds = list(zip(missing, inputs))
        else:
            if len(inputs) > len(predict_net.external_input):
                raise AssertionError(f"{len(inputs)} inputs given for {len(predict_net.external_input)} "
                                     "external inputs")
            feeds = list(zip(predict_net.external_input, inputs))
    for name, value in feeds:
        ws.FeedBlob(name, value, option)
    ws.RunNetOnce(predict_net)
    return ws, _outputs(ws, predict_net.external_output)


def load_caffe2_net(file) -> caffe2_pb2.NetDef:
    """The NetDef in binary protobuf file `file`."""
    net = caffe2_pb2.NetDef()
    with open(file, "rb") as f:
        net.ParseFromString(f.read())
    return net


def save_caffe2_net(net, file, output_txt: bool = False) -> None:
    """Write net to `file` (binary); with output_txt also its text form to `file` + "txt"."""
    with open(file, "wb") as f:
        f.write(net.SerializeToString())
    if output_txt:
        with open(file + "txt", "w") as f:
            f.write(str(net))


def benchmark_caffe2_model(init_net, predict_net, warmup_iters: int = 3, main_iters: int = 10,
                           layer_details: bool = True) -> float:
    """Milliseconds per run of predict_net (after init_net), timed with workspace.BenchmarkNet."""
    ws = Workspace()
    if init_net:
        ws.RunNetOnce(init_net)
    ws.CreateNet(predict_net)
    results = ws.BenchmarkNet(predict_net.name, warmup_iters, main_iters, layer_details)
    del ws
    return results[0]


def benchmark_pytorch_model(model, inputs, training: bool = False, warmup_iters: int = 3, main_iters: int = 10,
                            verbose: bool = False) -> float:
    """Milliseconds per call of model(*inputs) (any callable), after warmup_iters calls."""
    for _ in range(warmup_iters):
        model(*inputs)
    total = 0.0
    for _ in range(main_iters):
        start = time.time()
        model(*inputs)
        total += time.time() - start
    log.info("The PyTorch model execution time per iter is %s milliseconds, %s iters per second.",
             total / main_iters * 1000, main_iters / total)
    return total * 1000 / main_iters
