"""brew.conv, conv_nd, group_conv and conv_transpose: Conv / ConvTranspose with their weight and bias."""
from __future__ import annotations

from ..modeling import initializers
from ..modeling.parameter_info import ParameterTags


def _conv(model, is_nd, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
          WeightInitializer=None, BiasInitializer=None, group=1, transform_inputs=None, use_cudnn=False,
          order="NCHW", cudnn_exhaustive_search=False, ws_nbytes_limit=None, float16_compute=False, **kwargs):
    kernels = (kernel if isinstance(kernel, list) else [kernel]) if is_nd else (
        kernel if isinstance(kernel, list) else [kernel] * 2)
    if not is_nd and len(kernels) != 2:
        raise ValueError("Conv support only a 2D kernel.")
    engine = kwargs.get("engine")
    if engine is not None and (engine == "CUDNN") != bool(use_cudnn):
        raise ValueError('When use_cudnn=True, the only engine you can specify is "CUDNN"' if use_cudnn else
                         'When use_cudnn=False, the only engine you can specify is ""')
    if use_cudnn:
        kwargs.update(engine="CUDNN", exhaustive_search=cudnn_exhaustive_search)
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit
    use_bias = not kwargs.pop("no_bias", False)
    blob_out = blob_out or model.net.NextName()
    shape = [dim_out] + ([int(dim_in / group)] + kernels if order == "NCHW" else kernels + [int(dim_in / group)])
    w_init = initializers.update_initializer(WeightInitializer, weight_init, ("XavierFill", {}))
    b_init = initializers.update_initializer(BiasInitializer, bias_init, ("ConstantFill", {}))
    if not model.init_params:
        w_init = b_init = initializers.ExternalInitializer()
    inputs = [blob_in, model.create_param(blob_out + "_w", shape, w_init, ParameterTags.WEIGHT)]
    if use_bias:
        inputs.append(model.create_param(blob_out + "_b", [dim_out], b_init, ParameterTags.BIAS))
    if transform_inputs is not None:
        transform_inputs(model, blob_out, inputs)
    if float16_compute:
        kwargs["float16_compute"] = True
    if group != 1:
        kwargs["group"] = group
    if is_nd:
        kwargs["kernels"] = kernels
    elif isinstance(kernel, list):
        kwargs.update(kernel_h=kernel[0], kernel_w=kernel[1])
    else:
        kwargs["kernel"] = kernel
    return model.net.Conv(inputs, blob_out, order=order, **kwargs)


def conv(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
         WeightInitializer=None, BiasInitializer=None, group=1, transform_inputs=None, **kwargs):
    """2-D convolution: weight dim_out x dim_in/group x k x k (NCHW) or dim_out x k x k x dim_in/group (NHWC)."""
    return _conv(model, False, blob_in, blob_out, dim_in, dim_out, kernel, weight_init, bias_init,
                 WeightInitializer, BiasInitializer, group, transform_inputs, **kwargs)


def conv_nd(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
            WeightInitializer=None, BiasInitializer=None, group=1, transform_inputs=None, order="NCHW", **kwargs):
    """N-dimensional convolution (NCHW only); kernel: an int or one size per spatial axis."""
    if order != "NCHW":
        raise ValueError("ConvNd only supported for NCHW storage.")
    return _conv(model, True, blob_in, blob_out, dim_in, dim_out, kernel, weight_init, bias_init,
                 WeightInitializer, BiasInitializer, group, transform_inputs, order=order, **kwargs)


def group_conv(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None, group=1,
               **kwargs):
    """conv with group (the weight's second dimension is dim_in / group)."""
    return conv(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=weight_init, bias_init=bias_init,
                group=group, **kwargs)


def conv_transpose(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
                   use_cudnn=False, order="NCHW", cudnn_exhaustive_search=False, ws_nbytes_limit=None, **kwargs):
    """ConvTranspose: weight dim_in x dim_out x k x k (NCHW) or dim_in x k x k x dim_out (NHWC)."""
    weight_init = weight_init or ("XavierFill", {})
    bias_init = bias_init or ("ConstantFill", {})
    blob_out = blob_out or model.net.NextName()
    shape = [dim_in, dim_out, kernel, kernel] if order == "NCHW" else [dim_in, kernel, kernel, dim_out]
    if model.init_params:
        weight = getattr(model.param_init_net, weight_init[0])([], blob_out + "_w", shape=shape, **weight_init[1])
        bias = getattr(model.param_init_net, bias_init[0])([], blob_out + "_b", shape=[dim_out], **bias_init[1])
    else:
        from ..core import ScopedBlobReference
        weight = ScopedBlobReference(blob_out + "_w", model.param_init_net)
        bias = ScopedBlobReference(blob_out + "_b", model.param_init_net)
    model.AddParameter(weight, ParameterTags.WEIGHT)
    model.AddParameter(bias, ParameterTags.BIAS)
    if use_cudnn:
        kwargs.update(engine="CUDNN", exhaustive_search=cudnn_exhaustive_search)
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit
    return model.net.ConvTranspose([blob_in, weight, bias], blob_out, kernel=kernel, order=order, **kwargs)


def group_conv_deprecated(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
                          group=1, use_cudnn=False, order="NCHW", cudnn_exhaustive_search=False,
                          ws_nbytes_limit=None, **kwargs):
    """Caffe2's deprecated grouped convolution, built from ops that predate Conv's `group`: DepthSplit of the
    input into `group` parts (`_<out>_gconv_split_<i>`), one Conv per part (`<out>_gconv_<i>`, with weight
    `<out>_gconv_<i>_w` of dim_out/group x dim_in/group x k x k and bias `<out>_gconv_<i>_b`), and Concat of
    their outputs into blob_out (with `_<out>_concat_dims`). Use group_conv in new code."""
    from ..core import ScopedBlobReference
    weight_init = weight_init or ("XavierFill", {})
    bias_init = bias_init or ("ConstantFill", {})
    use_bias = not kwargs.get("no_bias", False)
    if use_cudnn:
        kwargs.update(engine="CUDNN", exhaustive_search=cudnn_exhaustive_search)
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit
            if dim_in % group:
                raise ValueError("dim_in should be divisible by group.")
    if dim_out % group:
        raise ValueError("dim_out should be divisible by group.")
    kwargs.pop("no_bias", None)
    parts = model.net.DepthSplit(blob_in, [f"_{blob_out}_gconv_split_{i}" for i in range(group)],
                                 dimensions=[int(dim_in / group)] * group, order=order)
    parts = [parts] if group == 1 else parts
    per_group_in, per_group_out = int(dim_in / group), int(dim_out / group)
    weight_shape = ([per_group_out, per_group_in, kernel, kernel] if order == "NCHW"
                    else [per_group_out, kernel, kernel, per_group_in])
    outputs = []
    for i, part in enumerate(parts):
        names = (f"{blob_out}_gconv_{i}_w", f"{blob_out}_gconv_{i}_b")
        if model.init_params:
            weight = getattr(model.param_init_net, weight_init[0])([], names[0], shape=weight_shape,
                                                                    **weight_init[1])
            bias = (getattr(model.param_init_net, bias_init[0])([], names[1], shape=[per_group_out], **bias_init[1])
                    if use_bias else None)
        else:
            weight = ScopedBlobReference(names[0], model.param_init_net)
            bias = ScopedBlobReference(names[1], model.param_init_net) if use_bias else None
        model.AddParameter(weight, ParameterTags.WEIGHT)
        if use_bias:
            model.AddParameter(bias, ParameterTags.BIAS)
        outputs.append(part.Conv([weight, bias] if use_bias else [weight], f"{blob_out}_gconv_{i}", kernel=kernel,
                                 order=order, **kwargs))
    concat, _ = model.net.Concat(outputs, [blob_out, f"_{blob_out}_concat_dims"], order=order)
    return concat
