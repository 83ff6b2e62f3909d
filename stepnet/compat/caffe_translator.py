"""Caffe2's caffe_translator: a Caffe (Caffe1) model -- its NetParameter (deploy.prototxt) and trained
NetParameter (.caffemodel) -- as a Caffe2 NetDef and its weights (TensorProtos), and the command line

    python -m stepnet.compat.caffe_translator deploy.prototxt model.caffemodel --init_net init.pb \\
        --predict_net predict.pb [--remove_legacy_pad] [--input_dims N C H W]

(`python -m caffe2.python.caffe_translator ...` where the caffe2 alias is installed). The layers' translators are
in _caffe_layers.py and _caffe_window_layers.py; Caffe1's schema is stepnet.caffe_pb2, compiled from BVLC's
caffe.proto (`from caffe.proto import caffe_pb2` under the alias). A layer that cannot be translated raises
TranslationError (a FileFormatError; through this module also a RuntimeError), an unknown layer type
UnknownLayerError, which is also the KeyError Caffe2 raised: one line naming the layer.
"""
from __future__ import annotations

import argparse
import logging
import sys

from google.protobuf import text_format
from google.protobuf.message import DecodeError

try:
    from .. import caffe_pb2
except ImportError:     # a tree installed before proto/caffe.proto was added to the build
    raise ImportError("stepnet's compiled Caffe1 schema (stepnet/caffe_pb2.py, from proto/caffe.proto) is missing: "
                      "reinstall stepnet (`pip install -e .` in a checkout) to compile it") from None
from ..core.errors import FileFormatError, StepnetError
from ..io.files import read_regular
from ..io.proto import NetDef, OperatorDef, TensorProtos
from . import (
    _caffe_run,
    _caffe_window_layers,  # noqa: F401  (registers the windowed layers' translators)
    utils,
)
from ._caffe_layers import AddArgument, BaseTranslate, TranslationError, UnknownLayerError, caffe_blob_array
from ._caffe_layers import TranslatorRegistry as _LayerRegistry
from .errors import caffe2_errors

__all__ = ["AddArgument", "BaseTranslate", "ConvertTensorProtosToInitNet", "TranslateModel", "TranslationError",
           "TranslatorRegistry", "UnknownLayerError", "main"]

# Caffe2's module held every layer's translator by its function name (TranslateConv, TranslatePool, ...)
globals().update({f.__name__: f for f in _LayerRegistry.registry_.values()})
TranslateVideoData = TranslateData = _LayerRegistry.registry_["Input"]

log = logging.getLogger("caffe_translator")
log.setLevel(logging.INFO)


def _StateMeetsRule(state, rule) -> bool:
    """Caffe's StateMeetsRule: whether a NetState meets one NetStateRule."""
    if rule.HasField('phase') and rule.phase != state.phase:
        return False
    if rule.HasField('min_level') and state.level < rule.min_level:
        return False
    if rule.HasField('max_level') and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    return all(s in stages for s in rule.stage) and not any(s in stages for s in rule.not_stage)


def _ShouldInclude(net_state, layer) -> bool:
    """Caffe's include/exclude rules: no include rule and no exclude rule met, or an include rule met."""
    if layer.include:
        return any(_StateMeetsRule(net_state, rule) for rule in layer.include)
    return not any(_StateMeetsRule(net_state, rule) for rule in layer.exclude)


def _GetInputDims(caffe_net) -> list:
    """The first input's dims as the prototxt gives them (input_dim, input_shape, or the first layer's
    input_param), or []."""
    if caffe_net.input_dim:
        return list(caffe_net.input_dim)
    if caffe_net.input_shape:
        return list(caffe_net.input_shape[0].dim)
    if caffe_net.layer and caffe_net.layer[0].input_param.shape:
        return list(caffe_net.layer[0].input_param.shape[0].dim)
    return []


def _input_shapes(caffe_net, net_state, input_dims) -> dict:
    """Every net input with the shape the prototxt gives it; the first one's is input_dims where given."""
    shapes = {}
    legacy = list(caffe_net.input_dim)
    for i, name in enumerate(caffe_net.input):
        if caffe_net.input_shape:
            shapes[name] = list(caffe_net.input_shape[min(i, len(caffe_net.input_shape) - 1)].dim)
        elif len(legacy) >= 4 * (i + 1):
            shapes[name] = legacy[4 * i:4 * i + 4]
    for layer in caffe_net.layer:
        if layer.type == "Input" and _ShouldInclude(net_state, layer) and layer.input_param.shape:
            given = layer.input_param.shape
            for i, top in enumerate(layer.top):
                shapes[top] = list(given[min(i, len(given) - 1)].dim)
    if input_dims:
        first = next(iter(shapes), None) or next((l.top[0] for l in caffe_net.layer if l.top), None)
        if first is not None:
            shapes[first] = list(input_dims)
    return shapes


def _pretrained_blobs(layer, pretrained_net) -> list:
    found = [p for p in pretrained_net.layer if p.name == layer.name]
    found += [p for p in pretrained_net.layers if p.name == layer.name]
    where = f"layer {layer.name!r} ({layer.type})"
    if len(found) > 1:
        raise TranslationError(f"the trained model has {len(found)} layers of this name", at=where)
    return [caffe_blob_array(blob, where) for blob in found[0].blobs] if found else []


class TranslatorRegistry(_LayerRegistry):
    """The translators by Caffe1 layer type (Register, TranslateLayer) and the translation of a whole model."""

    @classmethod
    def TranslateModel(cls, caffe_net, pretrained_net, is_test=False, net_state=None, remove_legacy_pad=False,
                       input_dims=None):
        """(NetDef, TensorProtos): the layers net_state includes (Caffe's rules; default: the TEST phase),
        translated in order, their trained blobs from pretrained_net by layer name. remove_legacy_pad replaces
        Caffe1's ceil-mode pooling by explicit pads, running the net on random inputs of input_dims (default: the
        prototxt's input shape)."""
        net_state = caffe_pb2.NetState() if net_state is None else net_state
        net = NetDef()
        net.name = caffe_net.name
        net_params = TensorProtos()
        if len(caffe_net.layers) > 0:
            raise TranslationError("the prototxt uses the V1 `layers` field; this translator reads the `layer` "
                                   "field only (upgrade it with Caffe's upgrade_net_proto_text)", at=caffe_net.name)
        if not input_dims:
            input_dims = _GetInputDims(caffe_net)
        shapes = _input_shapes(caffe_net, net_state, input_dims)
        data_dims = []
        for layer in caffe_net.layer:
            if not _ShouldInclude(net_state, layer):
                log.info('Current net state does not need layer {}'.format(layer.name))
                continue
            if layer.type == 'Input' and layer.input_param.shape:
                data_dims = list(layer.input_param.shape[0].dim)
            log.info('Translate layer {}'.format(layer.name))

            def shape_of(name, net=net, net_params=net_params, why=f"size layer {layer.name!r}"):
                return _caffe_run.blob_shapes(net, net_params, shapes, why).get(name)
            operators, params = cls.TranslateLayer(
                layer, _pretrained_blobs(layer, pretrained_net), is_test, net=net, net_params=net_params,
                input_dims=input_dims, data_dims=data_dims, input_shapes=shapes, shape_of=shape_of)
            net.op.extend(operators)
            net_params.protos.extend(params)
        if remove_legacy_pad:
            if not shapes:
                raise TranslationError("remove_legacy_pad needs the input's dims: give input_dims (--input_dims N C "
                                       "H W) or a prototxt whose input has a shape", at=caffe_net.name)
            net = _caffe_run.remove_legacy_pad(net, net_params, shapes)
        return net, net_params


@caffe2_errors
def TranslateModel(*args, **kwargs):
    """TranslatorRegistry.TranslateModel: (NetDef, TensorProtos) of a Caffe1 model."""
    return TranslatorRegistry.TranslateModel(*args, **kwargs)


def ConvertTensorProtosToInitNet(net_params, input_name):
    """An init net of GivenTensorFill ops, one per (float) tensor of net_params, and a ConstantFill of shape [1]
    for the input blob `input_name`."""
    init_net = NetDef()
    for t in net_params.protos:
        if len(t.float_data) == 0:
            raise RuntimeError("Only float tensors are supported in this util.")
        init_net.op.extend([OperatorDef(type="GivenTensorFill", output=[t.name], arg=[
            utils.MakeArgument("shape", list(t.dims)), utils.MakeArgument("values", list(t.float_data))])])
    init_net.op.extend([OperatorDef(type="ConstantFill", output=[input_name],
                                    arg=[utils.MakeArgument("shape", [1])])])
    return init_net


def _read_models(prototxt: str, caffemodel: str):
    caffenet, pretrained = caffe_pb2.NetParameter(), caffe_pb2.NetParameter()
    try:
        text_format.Merge(read_regular(prototxt, "prototxt").decode("utf-8"), caffenet)
    except (text_format.ParseError, UnicodeDecodeError) as e:
        raise FileFormatError(f"not a Caffe NetParameter in text form: {e}", at=prototxt) from None
    try:
        pretrained.ParseFromString(read_regular(caffemodel, "caffemodel"))
    except DecodeError as e:
        raise FileFormatError(f"not a binary Caffe NetParameter (.caffemodel): {e}", at=caffemodel) from None
    return caffenet, pretrained


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Utilitity to convert pretrained caffe models to Caffe2 models.")
    parser.add_argument("prototext", help="Caffe prototext.")
    parser.add_argument("caffemodel", help="Caffe trained model.")
    parser.add_argument("--init_net", help="Caffe2 initialization net.", default="init_net.pb")
    parser.add_argument("--predict_net", help="Caffe2 prediction net.", default="predict_net.pb")
    parser.add_argument("--remove_legacy_pad", help="Remove legacy pad (Only works for nets with one input blob)",
                        action="store_true", default=False)
    parser.add_argument("--input_dims", help="Dimension of input blob", nargs='+', type=int, default=[])
    return parser


def main(argv=None) -> int:
    """The command line: writes the predict net (binary, and as text to `<predict_net>txt`) and the init net."""
    args = build_parser().parse_args(argv)
    logging.basicConfig()
    try:
        caffenet, pretrained = _read_models(args.prototext, args.caffemodel)
        net, params = TranslateModel(caffenet, pretrained, is_test=True, remove_legacy_pad=args.remove_legacy_pad,
                                     input_dims=args.input_dims)
        if not net.op:
            raise TranslationError("the translated net has no operators", at=args.prototext)
    except StepnetError as e:
        print(f"caffe_translator: error: {e}", file=sys.stderr)
        return 1
    external_input, external_output = net.op[0].input[0], net.op[-1].output[0]   # one input, one output
    net.external_input.extend([external_input] + [p.name for p in params.protos])
    net.external_output.extend([external_output])
    init_net = ConvertTensorProtosToInitNet(params, external_input)
    with open(args.predict_net, 'wb') as f:
        f.write(net.SerializeToString())
    with open(args.predict_net + 'txt', 'w') as f:
        f.write(str(net))
    with open(args.init_net, 'wb') as f:
        f.write(init_net.SerializeToString())
    return 0


if __name__ == '__main__':
    sys.exit(main())
