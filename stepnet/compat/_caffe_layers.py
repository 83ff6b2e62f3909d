"""caffe_translator's registry and the translators of Caffe1's plain layers (no geometry, no weights beyond a
vector): what each Caffe1 layer type becomes in Caffe2 ops, with Caffe2's op types, argument order and blob names
(`<top>_w`, `<top>_b`, `_<top>_mask`, ...), so a translation gives the NetDef Caffe2's translator gave.

A translator is `fn(layer, pretrained_blobs, is_test, **kwargs) -> (ops, TensorProtos)`, registered by type with
`TranslatorRegistry.Register`. A Caffe1 file is untrusted: a layer this module cannot translate raises
TranslationError (a FileFormatError) naming the layer; an unknown type raises UnknownLayerError, which is also
the KeyError Caffe2 raised. Where Caffe2's translator refused a Caffe1 setting that Caffe2's ops can express
(ReLU's negative_slope, Eltwise's PROD/MAX and coefficients, Concat's axis, Reduction over all axes and its
coeff), the translation here follows Caffe1's semantics; with Caffe1's defaults the ops are Caffe2's.
"""
from __future__ import annotations

import copy

import numpy as np

from ..core.errors import FileFormatError
from ..io.proto import OperatorDef
from . import utils


class TranslationError(FileFormatError):
    """A Caffe1 layer that cannot be translated (a setting no Caffe2 op expresses, or weights that do not fit)."""


class UnknownLayerError(TranslationError, KeyError):
    """A Caffe1 layer type no translator is registered for (a KeyError too, as in Caffe2)."""


def layer_error(layer, message: str, cls=TranslationError) -> TranslationError:
    """The error for `layer`, one line naming it: layer 'name' (Type): message."""
    return cls(message, at=f"layer {layer.name!r} ({layer.type})")


class TranslatorRegistry:
    """Caffe1 layer type -> its translator."""
    registry_: dict = {}

    @classmethod
    def Register(cls, op_name):
        """A decorator registering a translator for the Caffe1 layer type `op_name`."""
        def wrapper(func):
            cls.registry_[op_name] = func
            return func
        return wrapper

    @classmethod
    def TranslateLayer(cls, layer, pretrained_blobs, is_test, **kwargs):
        """(list of OperatorDefs, list of TensorProtos) for one Caffe1 layer."""
        translate = cls.registry_.get(layer.type)
        if translate is None:
            known = ", ".join(sorted(cls.registry_))
            raise layer_error(layer, f"no translator is registered for layer type {layer.type!r} (known: {known})",
                              UnknownLayerError)
        if translate in _NEED_BOTTOM_AND_TOP and not (layer.bottom and layer.top):
            raise layer_error(layer, f"a {layer.type} layer needs a bottom and a top (it has {len(layer.bottom)} "
                                     f"and {len(layer.top)})")
        caffe_ops, params = translate(layer, pretrained_blobs, is_test, **kwargs)
        if caffe_ops is None:
            caffe_ops = []
        if not isinstance(caffe_ops, list):
            caffe_ops = [caffe_ops]
        return caffe_ops, params


def BaseTranslate(layer, caffe2_type):
    """An op of type caffe2_type reading the layer's bottoms and writing its tops."""
    caffe2_op = OperatorDef()
    caffe2_op.type = caffe2_type
    caffe2_op.input.extend(layer.bottom)
    caffe2_op.output.extend(layer.top)
    return caffe2_op


def AddArgument(op, key, value):
    """Adds argument `key` (its kind from the value's type) to op."""
    op.arg.extend([utils.MakeArgument(key, value)])


def caffe_blob_array(blob, where=None):
    """utils.CaffeBlobToNumpyArray, its error a TranslationError placed at `where`."""
    try:
        return utils.CaffeBlobToNumpyArray(blob)
    except FileFormatError as e:
        raise TranslationError(e.message.replace("a Caffe blob", "a weight blob"), at=where) from None


def weights(layer, blobs, least: int, most: int | None = None) -> list:
    """The layer's trained blobs, checked to number least..most (most=None: exactly least)."""
    most = least if most is None else most
    if not least <= len(blobs) <= most:
        want = f"{least}" if least == most else f"{least} to {most}"
        raise layer_error(layer, f"the trained model has {len(blobs)} weight blob(s) for it, it needs {want} (is the "
                                 "caffemodel the one of this prototxt?)")
    return blobs


def tensor(array, name):
    return utils.NumpyArrayToCaffe2Tensor(np.asarray(array, dtype=np.float32), name)


@TranslatorRegistry.Register("Input")
@TranslatorRegistry.Register("VideoData")
@TranslatorRegistry.Register("Data")
def TranslateInput(layer, pretrained_blobs, is_test, **kwargs):
    """Data layers become the net's external inputs: no op."""
    return [], []


@TranslatorRegistry.Register("ReLU")
def TranslateRelu(layer, pretrained_blobs, is_test, **kwargs):
    slope = layer.relu_param.negative_slope
    if slope == 0:
        return BaseTranslate(layer, "Relu"), []
    caffe_op = BaseTranslate(layer, "LeakyRelu")      # Caffe1's leaky form: x > 0 ? x : slope * x
    AddArgument(caffe_op, "alpha", float(slope))
    return caffe_op, []


def _simple(caffe1_type, caffe2_type):
    def translate(layer, pretrained_blobs, is_test, **kwargs):
        return BaseTranslate(layer, caffe2_type), []
    translate.__name__ = f"Translate{caffe1_type}"
    TranslatorRegistry.Register(caffe1_type)(translate)
    return translate


TranslateSoftmax = _simple("Softmax", "Softmax")
TranslateTanH = _simple("TanH", "Tanh")
TranslateSigmoid = _simple("Sigmoid", "Sigmoid")


@TranslatorRegistry.Register("Dropout")
def TranslateDropout(layer, pretrained_blobs, is_test, **kwargs):
    caffe_op = BaseTranslate(layer, "Dropout")
    caffe_op.output.extend(['_' + caffe_op.output[0] + '_mask'])
    AddArgument(caffe_op, "ratio", layer.dropout_param.dropout_ratio)
    if is_test:
        AddArgument(caffe_op, "is_test", 1)
    return caffe_op, []


@TranslatorRegistry.Register("SoftmaxWithLoss")
def TranslateSoftmaxWithLoss(layer, pretrained_blobs, is_test, **kwargs):
    if len(layer.bottom) < 2 or not layer.top:
        raise layer_error(layer, "SoftmaxWithLoss needs two bottoms (scores, labels) and a top")
    scores = layer.bottom[0]
    softmax = OperatorDef(type="Softmax", input=[scores], output=[scores + "_translator_autogen_softmax"])
    xent = OperatorDef(type="LabelCrossEntropy", input=[softmax.output[0], layer.bottom[1]],
                       output=[scores + "_translator_autogen_xent"])
    loss = OperatorDef(type="AveragedLoss", input=[xent.output[0]], output=[layer.top[0]])
    return [softmax, xent, loss], []


@TranslatorRegistry.Register("Accuracy")
def TranslateAccuracy(layer, pretrained_blobs, is_test, **kwargs):
    caffe_op = BaseTranslate(layer, "Accuracy")
    if layer.accuracy_param.top_k != 1:
        AddArgument(caffe_op, "top_k", layer.accuracy_param.top_k)
    return caffe_op, []


@TranslatorRegistry.Register("Concat")
def TranslateConcat(layer, pretrained_blobs, is_test, **kwargs):
    caffe_op = BaseTranslate(layer, "Concat")
    caffe_op.output.extend(['_' + caffe_op.output[0] + '_dims'])
    param = layer.concat_param
    axis = param.concat_dim if param.HasField("concat_dim") else param.axis
    if axis == 1:
        AddArgument(caffe_op, "order", "NCHW")
    else:
        AddArgument(caffe_op, "axis", axis)
    return caffe_op, []


@TranslatorRegistry.Register("InstanceNorm")
def TranslateInstanceNorm(layer, pretrained_blobs, is_test, **kwargs):
    scale, bias = weights(layer, pretrained_blobs, 2)
    caffe_op = BaseTranslate(layer, "InstanceNorm")
    output = caffe_op.output[0]
    caffe_op.input.extend([output + '_w', output + '_b'])
    AddArgument(caffe_op, "order", "NCHW")
    return caffe_op, [tensor(scale.flatten(), output + '_w'), tensor(bias.flatten(), output + '_b')]


@TranslatorRegistry.Register("BatchNorm")
def TranslateBatchNorm(layer, pretrained_blobs, is_test, **kwargs):
    """SpatialBN with scale 1 and bias 0; Caffe1 stores mean and variance multiplied by its third blob, the
    moving-average factor, which is divided out here."""
    mean, var, factor = weights(layer, pretrained_blobs, 3)
    if factor.size != 1:
        raise layer_error(layer, f"the scale-factor blob has {factor.size} values, Caffe1 writes one")
    if factor.flat[0] == 0:
        raise layer_error(layer, "the scale-factor blob is zero (a BatchNorm layer that never saw data)")
    caffe_op = BaseTranslate(layer, "SpatialBN")
    output = caffe_op.output[0]
    AddArgument(caffe_op, "is_test", is_test)
    AddArgument(caffe_op, "epsilon", layer.batch_norm_param.eps)
    AddArgument(caffe_op, "order", "NCHW")
    caffe_op.input.extend([output + "_scale", output + "_bias", output + "_mean", output + "_var"])
    if not is_test:
        caffe_op.output.extend([output + "_mean", output + "_var", output + "_saved_mean", output + "_saved_var"])
    n = mean.shape[0]
    inverse = np.float32(1.0) / factor.flat[0]
    return caffe_op, [tensor(np.ones(n), output + '_scale'), tensor(np.zeros(n), output + '_bias'),
                      tensor(inverse * mean, output + '_mean'), tensor(inverse * var, output + '_var')]


@TranslatorRegistry.Register("Eltwise")
def TranslateElementWise(layer, pretrained_blobs, is_test, **kwargs):
    """SUM is Sum (each bottom first multiplied by its coefficient with Scale where it is not 1), PROD a chain of
    Mul, MAX is Max."""
    param = layer.eltwise_param
    if len(param.coeff) not in (0, len(layer.bottom)):
        raise layer_error(layer, f"{len(param.coeff)} coefficients for {len(layer.bottom)} bottoms")
    if param.operation == param.SUM:
        caffe_op, ops = BaseTranslate(layer, "Sum"), []
        for i, c in enumerate(param.coeff):
            if c != 1:
                scaled = f"{caffe_op.output[0]}_coeff_{i}"
                ops.append(OperatorDef(type="Scale", input=[caffe_op.input[i]], output=[scaled],
                                       arg=[utils.MakeArgument("scale", float(c))]))
                caffe_op.input[i] = scaled
        return ops + [caffe_op], []
    if len(param.coeff):
        raise layer_error(layer, "coefficients are for the SUM operation only")
    if param.operation == param.MAX:
        return BaseTranslate(layer, "Max"), []
    if len(layer.bottom) < 2:
        raise layer_error(layer, "PROD needs at least two bottoms")
    ops, left = [], layer.bottom[0]
    for i, right in enumerate(layer.bottom[1:], 1):
        out = layer.top[0] if i == len(layer.bottom) - 1 else f"{layer.top[0]}_prod_{i}"
        ops.append(OperatorDef(type="Mul", input=[left, right], output=[out]))
        left = out
    return ops, []


@TranslatorRegistry.Register("Scale")
def TranslateScale(layer, pretrained_blobs, is_test, **kwargs):
    """Mul by the trained `<top>_w` broadcast from scale_param.axis, then, with a bias term, Add of `<top>_b`."""
    mul_op = BaseTranslate(layer, "Mul")
    param = layer.scale_param
    AddArgument(mul_op, "axis", param.axis)
    AddArgument(mul_op, "broadcast", True)
    if len(mul_op.input) != 1:
        raise layer_error(layer, "a Scale layer whose scale is a second bottom is not supported (Caffe2's "
                                 "translator refused it too)")
    if param.num_axes != 1:
        raise layer_error(layer, f"num_axes {param.num_axes} is not supported (only 1)")
    blobs = weights(layer, pretrained_blobs, 1, 2)
    output = mul_op.output[0]
    mul_op.input.append(output + '_w')
    params = [tensor(blobs[0].flatten(), output + '_w')]
    if len(blobs) == 1:
        return [mul_op], params
    add_op = copy.deepcopy(mul_op)
    add_op.type = "Add"
    del mul_op.output[:]
    mul_op.output.append(output + "_internal")
    del add_op.input[:]
    add_op.input.extend([output + "_internal", output + '_b'])
    params.append(tensor(blobs[1].flatten(), output + '_b'))
    return [mul_op, add_op], params


@TranslatorRegistry.Register("Reshape")
def TranslateReshape(layer, pretrained_blobs, is_test, **kwargs):
    param = layer.reshape_param
    if param.axis != 0 or param.num_axes != -1:
        raise layer_error(layer, "reshape_param axis/num_axes other than 0/-1 are not supported")
    caffe_op = BaseTranslate(layer, "Reshape")
    caffe_op.output.append("_" + caffe_op.input[0] + "_dims")
    AddArgument(caffe_op, 'shape', list(param.shape.dim))
    return caffe_op, []


@TranslatorRegistry.Register("Flatten")
def TranslateFlatten(layer, pretrained_blobs, is_test, **kwargs):
    param = layer.flatten_param
    if param.end_axis != -1:
        raise layer_error(layer, "flatten_param.end_axis other than -1 is not supported")
    if param.axis not in (0, 1):
        raise layer_error(layer, f"flatten_param.axis {param.axis} is not supported (only 0 and 1)")
    return BaseTranslate(layer, "FlattenToVec" if param.axis == 0 else "Flatten"), []


@TranslatorRegistry.Register("ROIPooling")
def TranslateROIPooling(layer, pretrained_blobs, is_test, **kwargs):
    """RoIPool; roi_pooling_param is py-faster-rcnn's field: with BVLC's caffe.proto (no such field) the op keeps
    its defaults."""
    caffe_op = BaseTranslate(layer, "RoIPool")
    AddArgument(caffe_op, "order", "NCHW")
    if is_test:
        AddArgument(caffe_op, "is_test", is_test)
    else:
        caffe_op.output.append(caffe_op.output[0] + '_argmaxes')
    param = getattr(layer, "roi_pooling_param", None)
    for name in ("pooled_h", "pooled_w", "spatial_scale"):
        if param is not None and param.HasField(name):
            AddArgument(caffe_op, name, getattr(param, name))
    return caffe_op, []


@TranslatorRegistry.Register("PReLU")
def TranslatePRelu(layer, pretrained_blobs, is_test, **kwargs):
    (slope,) = weights(layer, pretrained_blobs, 1)
    caffe_op = BaseTranslate(layer, "PRelu")
    output = caffe_op.output[0]
    caffe_op.input.extend([output + '_Slope'])
    return caffe_op, [tensor(slope, output + '_Slope')]


@TranslatorRegistry.Register("Reduction")
def TranslateReduction(layer, pretrained_blobs, is_test, **kwargs):
    """Caffe1 reduces every axis from `axis` on: ReduceBack{Sum,Mean} over -axis trailing dims, SumElements for
    axis 0 (all of them); a coeff other than 1 is a Scale after it."""
    param = layer.reduction_param
    kinds = {param.SUM: ("ReduceBackSum", False), param.MEAN: ("ReduceBackMean", True)}
    if param.operation not in kinds:
        name = type(param).ReductionOp.Name(param.operation)
        raise layer_error(layer, f"operation {name} is not supported (only SUM and MEAN)")
    if param.axis > 0:
        raise layer_error(layer, f"axis {param.axis} > 0 is not supported (the number of trailing dims to reduce "
                                 "is unknown here; give it as a negative axis)")
    kind, mean = kinds[param.operation]
    caffe_op = BaseTranslate(layer, kind if param.axis < 0 else "SumElements")
    if param.axis < 0:
        AddArgument(caffe_op, "num_reduce_dim", -param.axis)
    elif mean:
        AddArgument(caffe_op, "average", True)
    if param.coeff == 1:
        return caffe_op, []
    top = caffe_op.output[0]
    caffe_op.output[0] = top + "_uncoeffed"
    scale = OperatorDef(type="Scale", input=[caffe_op.output[0]], output=[top],
                        arg=[utils.MakeArgument("scale", float(param.coeff))])
    return [caffe_op, scale], []


_NEED_BOTTOM_AND_TOP: set = set()


def mark_builtin() -> None:
    """Marks the translators registered so far (but the data layers') as reading layer.bottom[0] and layer.top[0],
    checked before they run. Called at the end of each module of translators."""
    _NEED_BOTTOM_AND_TOP.update(f for f in TranslatorRegistry.registry_.values() if f is not TranslateInput)


mark_builtin()
