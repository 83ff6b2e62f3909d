"""caffe_translator's translators of Caffe1's windowed and weighted layers: Convolution, Deconvolution, Pooling
(Caffe1's ceil-mode output size as `legacy_pad` CAFFE_LEGACY_POOLING), Convolution3D / Pooling3D (C3D's fork),
LRN, InnerProduct and Crop. Argument order and blob names are Caffe2's translator's; kernel, pad and stride given
as two values (h, w), which Caffe2's translator refused, become the _h/_w (pad_t/_b/_l/_r) forms.
"""
from __future__ import annotations

import numpy as np

from ..ops.window import CAFFE_LEGACY_POOLING
from . import utils
from ._caffe_layers import AddArgument, BaseTranslate, TranslatorRegistry, layer_error, mark_builtin, tensor, weights
from ._caffe_run import blob_shapes


def _values(layer, param, name: str, default: int) -> list:
    """A conv/pool field as a list: PoolingParameter's are scalars, ConvolutionParameter's repeated."""
    value = getattr(param, name)
    if isinstance(value, int):
        return [value]
    values = list(value) or [default]
    if len(values) > 2:
        raise layer_error(layer, f"{name} has {len(values)} values; only 2-D windows (1 or 2 values) are supported")
    return values


def _window(layer, param, caffe_op) -> None:
    """stride, pad and kernel arguments from a ConvolutionParameter or PoolingParameter."""
    stride, pad, kernel = (_values(layer, param, n, d) for n, d in (("stride", 1), ("pad", 0), ("kernel_size", 0)))
    _pair(caffe_op, param, "stride", stride)
    if param.HasField("pad_h") or param.HasField("pad_w"):
        pad = [param.pad_h, param.pad_w]
    if pad[0] == pad[-1]:
        AddArgument(caffe_op, "pad", pad[0])
    else:
        for name, value in (("pad_t", pad[0]), ("pad_b", pad[0]), ("pad_l", pad[1]), ("pad_r", pad[1])):
            AddArgument(caffe_op, name, value)
    _pair(caffe_op, param, "kernel", kernel)


def _pair(caffe_op, param, name: str, values: list) -> None:
    """`name` as one argument, or as name_h and name_w where they differ or the layer gives them apart."""
    apart = param.HasField(f"{name}_h") or param.HasField(f"{name}_w")
    if apart:
        values = [getattr(param, f"{name}_h"), getattr(param, f"{name}_w")]
    if apart or len(values) == 2 and values[0] != values[1]:
        AddArgument(caffe_op, f"{name}_h", values[0])
        AddArgument(caffe_op, f"{name}_w", values[-1])
    else:
        AddArgument(caffe_op, name, values[0])


def _filter(layer, pretrained_blobs, caffe_op, with_bias: bool):
    """`<top>_w` (and `<top>_b`) appended to the op's inputs, as TensorProtos."""
    blobs = weights(layer, pretrained_blobs, 1, 2)
    output = caffe_op.output[0]
    caffe_op.input.append(output + '_w')
    params = [tensor(blobs[0], output + '_w')]
    if with_bias:
        if len(blobs) < 2:
            raise layer_error(layer, "bias_term is set but the trained model has no bias blob")
        caffe_op.input.append(output + '_b')
        params.append(tensor(blobs[1].flatten(), output + '_b'))
    return params


@TranslatorRegistry.Register("Convolution")
def TranslateConv(layer, pretrained_blobs, is_test, **kwargs):
    param = layer.convolution_param
    caffe_op = BaseTranslate(layer, "Conv")
    params = _filter(layer, pretrained_blobs, caffe_op, len(pretrained_blobs) == 2)
    _window(layer, param, caffe_op)
    if param.group != 1:
        AddArgument(caffe_op, "group", param.group)
    if len(param.dilation) == 1:
        AddArgument(caffe_op, "dilation", param.dilation[0])
    elif len(param.dilation) == 2:
        AddArgument(caffe_op, "dilation_h", param.dilation[0])
        AddArgument(caffe_op, "dilation_w", param.dilation[1])
    elif len(param.dilation) > 2:
        raise layer_error(layer, "dilation has more than 2 values")
    return caffe_op, params


@TranslatorRegistry.Register("Deconvolution")
def TranslateDeconv(layer, pretrained_blobs, is_test, **kwargs):
    param = layer.convolution_param
    if param.group > 1:
        raise layer_error(layer, "group deconvolution is not supported")
    caffe_op = BaseTranslate(layer, "ConvTranspose")
    _window(layer, param, caffe_op)
    params = _filter(layer, pretrained_blobs, caffe_op, param.bias_term)
    AddArgument(caffe_op, "order", "NCHW")
    return caffe_op, params


@TranslatorRegistry.Register("Pooling")
def TranslatePool(layer, pretrained_blobs, is_test, **kwargs):
    """MaxPool / AveragePool with legacy_pad CAFFE_LEGACY_POOLING: Caffe1's output size rounds up
    (ceil((size + 2 pad - kernel) / stride) + 1, less one where that window would start in the end pad); Facebook's
    Caffe fork's torch_pooling (floor) needs none. Caffe1's AVE divides by the window clipped to size + pad, padding
    included; Caffe2's AveragePool counts only the pixels inside the image, so the two differ at padded borders."""
    param = layer.pooling_param
    kinds = {param.MAX: "MaxPool", param.AVE: "AveragePool"}
    if param.pool not in kinds:
        raise layer_error(layer, f"pool {type(param).PoolMethod.Name(param.pool)} is not supported (MAX or AVE)")
    caffe_op = BaseTranslate(layer, kinds[param.pool])
    _window(layer, param, caffe_op)
    AddArgument(caffe_op, "order", "NCHW")
    if not getattr(param, "torch_pooling", False):
        AddArgument(caffe_op, "legacy_pad", CAFFE_LEGACY_POOLING)
    if param.global_pooling:
        AddArgument(caffe_op, "global_pooling", 1)
    return caffe_op, []


def _param_3d(layer, field):
    param = getattr(layer, field, None)
    if param is None:
        raise layer_error(layer, f"this caffe.proto (BVLC's) has no {field}: {layer.type} layers come from C3D's fork "
                                 "of Caffe, whose schema is not the one compiled here")
    return param


def _args_3d(caffe_op, param):
    AddArgument(caffe_op, "kernels", [param.kernel_depth, param.kernel_size, param.kernel_size])
    AddArgument(caffe_op, "strides", [param.temporal_stride, param.stride, param.stride])
    temporal, spatial = getattr(param, "temporal_pad", 0), getattr(param, "pad", 0)
    AddArgument(caffe_op, "pads", [temporal, spatial, spatial] * 2)


@TranslatorRegistry.Register("Convolution3D")
def TranslateConvNd(layer, pretrained_blobs, is_test, **kwargs):
    param = _param_3d(layer, "convolution3d_param")
    caffe_op = BaseTranslate(layer, "Conv")
    caffe_op.input.append(caffe_op.output[0] + '_w')
    _args_3d(caffe_op, param)
    blobs = weights(layer, pretrained_blobs, 1, 2)
    params = [tensor(blobs[0], caffe_op.output[0] + '_w')]
    if len(blobs) == 2:
        caffe_op.input.append(caffe_op.output[0] + '_b')
        params.append(tensor(blobs[1].flatten(), caffe_op.output[0] + '_b'))
    return caffe_op, params


@TranslatorRegistry.Register("Pooling3D")
def TranslatePool3D(layer, pretrained_blobs, is_test, **kwargs):
    param = _param_3d(layer, "pooling3d_param")
    caffe_op = BaseTranslate(layer, "MaxPool" if param.pool == type(param).MAX else "AveragePool")
    AddArgument(caffe_op, "order", "NCHW")
    _args_3d(caffe_op, param)
    return caffe_op, []


@TranslatorRegistry.Register("LRN")
def TranslateLRN(layer, pretrained_blobs, is_test, **kwargs):
    param = layer.lrn_param
    if param.norm_region != param.ACROSS_CHANNELS:
        raise layer_error(layer, "norm_region WITHIN_CHANNEL is not supported (only ACROSS_CHANNELS)")
    caffe_op = BaseTranslate(layer, "LRN")
    caffe_op.output.extend(['_' + caffe_op.output[0] + '_scale'])
    AddArgument(caffe_op, "size", int(param.local_size))
    AddArgument(caffe_op, "alpha", float(param.alpha))
    AddArgument(caffe_op, "beta", float(param.beta))
    AddArgument(caffe_op, "bias", float(param.k))
    AddArgument(caffe_op, "order", "NCHW")
    return caffe_op, []


@TranslatorRegistry.Register("InnerProduct")
def TranslateInnerProduct(layer, pretrained_blobs, is_test, **kwargs):
    """FC over the dims from inner_product_param.axis (FC's `axis` where it is not 1); a transposed Caffe1
    weight (K x N) is stored as FC's N x K; without a bias term, `<top>_b` is zeros."""
    param = layer.inner_product_param
    blobs = weights(layer, pretrained_blobs, 1 if not param.bias_term else 2)
    w = blobs[0]
    if w.ndim not in (2, 4) or w.ndim == 4 and list(w.shape[:2]) != [1, 1]:
        raise layer_error(layer, f"weight of shape {list(w.shape)}: expected 2 dims, or 4 with the first two 1")
    w = w.reshape(-1, w.shape[-1])
    if param.transpose:
        w = w.T
    caffe_op = BaseTranslate(layer, "FC")
    output = caffe_op.output[0]
    caffe_op.input.extend([output + '_w', output + '_b'])
    if param.axis != 1:
        AddArgument(caffe_op, "axis", param.axis)
    bias = blobs[1].flatten() if param.bias_term else np.zeros(w.shape[0], np.float32)
    if bias.size != w.shape[0]:
        raise layer_error(layer, f"bias of {bias.size} values for {w.shape[0]} outputs")
    return caffe_op, [tensor(w, output + '_w'), tensor(bias, output + '_b')]


@TranslatorRegistry.Register("Crop")
def TranslateCrop(layer, pretrained_blobs, is_test, **kwargs):
    """Slice of bottom 0 to the shape of bottom 1 from crop_param.axis on, starting at the offsets (none: 0;
    one: every axis; else one per axis). The shape of bottom 1 comes from running the ops translated so far."""
    if len(layer.bottom) != 2:
        raise layer_error(layer, "Crop needs two bottoms (the blob to crop, the blob of the wanted shape)")
    shape_of = kwargs.get("shape_of")
    if shape_of is None:
        shapes = blob_shapes(kwargs["net"], kwargs["net_params"], kwargs.get("input_shapes") or {}, "size a Crop")
        shape_of = shapes.get
    ref = shape_of(layer.bottom[1])
    if ref is None:
        raise layer_error(layer, f"the shape of bottom {layer.bottom[1]!r} is unknown")
    param = layer.crop_param
    axis = param.axis + len(ref) if param.axis < 0 else param.axis
    offsets = list(param.offset) or [0]
    n = len(ref) - axis
    if not 0 <= axis < len(ref) or len(offsets) not in (1, n):
        raise layer_error(layer, f"axis {param.axis} with {len(param.offset)} offsets for a {len(ref)}-D blob")
    offsets = offsets * n if len(offsets) == 1 else offsets
    starts = [0] * axis + offsets
    ends = [-1] * axis + [int(o + d) for o, d in zip(offsets, ref[axis:])]
    caffe_op = BaseTranslate(layer, "Slice")
    del caffe_op.input[1:]
    caffe_op.arg.extend([utils.MakeArgument("starts", starts), utils.MakeArgument("ends", ends)])
    return caffe_op, []


mark_builtin()
