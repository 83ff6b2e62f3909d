"""Caffe2's caffe2.python.onnx.bin.conversion: the click commands caffe2_to_onnx (a Caffe2 net, with its init net
and the inputs' value info as JSON, to an ONNX model) and onnx_to_caffe2 (an ONNX model to a predict net and an
init net). They need the click package, as Caffe2's did (stepnet does not depend on it)."""
from __future__ import annotations

import json

try:
    import click
except ImportError:   # pragma: no cover - depends on the environment
    raise ImportError("caffe2.python.onnx.bin.conversion needs the click package: pip install click") from None
from onnx import ModelProto

from .... import caffe2_pb2
from .. import frontend as c2_onnx
from ..backend import Caffe2Backend as c2


@click.command(help="convert caffe2 net to onnx model", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("caffe2_net", type=click.File("rb"))
@click.option("--caffe2-net-name", type=str, help="Name of the caffe2 net")
@click.option("--caffe2-init-net", type=click.File("rb"), help="Path of the caffe2 init net pb file")
@click.option("--value-info", type=str, help="A json string providing the type and shape information of the inputs")
@click.option("-o", "--output", required=True, type=click.File("wb"), help="Output path for the onnx model pb file")
def caffe2_to_onnx(caffe2_net, caffe2_net_name, caffe2_init_net, value_info, output):
    net = caffe2_pb2.NetDef()
    net.ParseFromString(caffe2_net.read())
    if not net.name and not caffe2_net_name:
        raise click.BadParameter("The input caffe2 net does not have name, --caffe2-net-name must be provided")
    net.name = caffe2_net_name or net.name
    init_net = None
    if caffe2_init_net:
        init_net = caffe2_pb2.NetDef()
        init_net.ParseFromString(caffe2_init_net.read())
        init_net.name = f"{caffe2_net_name}_init"
    model = c2_onnx.caffe2_net_to_onnx_model(predict_net=net, init_net=init_net,
                                             value_info=json.loads(value_info) if value_info else None)
    output.write(model.SerializeToString())


@click.command(help="convert onnx model to caffe2 net", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("onnx_model", type=click.File("rb"))
@click.option("-o", "--output", required=True, type=click.File("wb"), help="Output path for the caffe2 net file")
@click.option("--init-net-output", required=True, type=click.File("wb"),
              help="Output path for the caffe2 init net file")
def onnx_to_caffe2(onnx_model, output, init_net_output):
    model = ModelProto()
    model.ParseFromString(onnx_model.read())
    init_net, predict_net = c2.onnx_graph_to_caffe2_net(model)
    init_net_output.write(init_net.SerializeToString())
    output.write(predict_net.SerializeToString())
