"""brew.fc: FC with a weight (dim_out x dim_in, XavierFill) and a bias (dim_out, ConstantFill 0); brew.packed_fc:
the same parameters for MKL's PackedFC (inference only)."""
from __future__ import annotations

from ..modeling import initializers
from ..modeling.parameter_info import ParameterTags


def fc(model, blob_in, blob_out, dim_in, dim_out, weight_init=None, bias_init=None, WeightInitializer=None,
       BiasInitializer=None, enable_tensor_core=False, float16_compute=False, **kwargs):
    """`<blob_out>` = FC(blob_in, `<blob_out>_w`, `<blob_out>_b`); weight_init / bias_init are (operator, kwargs)."""
    return _fc_or_packed_fc(model, model.net.FC, blob_in, blob_out, dim_in, dim_out, weight_init, bias_init,
                            WeightInitializer, BiasInitializer, enable_tensor_core, float16_compute, **kwargs)


def packed_fc(model, blob_in, blob_out, dim_in, dim_out, weight_init=None, bias_init=None, WeightInitializer=None,
              BiasInitializer=None, enable_tensor_core=False, float16_compute=False, **kwargs):
    """`<blob_out>` = PackedFC(blob_in, `<blob_out>_w`, `<blob_out>_b`), parameters as brew.fc's."""
    return _fc_or_packed_fc(model, model.net.PackedFC, blob_in, blob_out, dim_in, dim_out, weight_init, bias_init,
                            WeightInitializer, BiasInitializer, enable_tensor_core, float16_compute, **kwargs)


def _fc_or_packed_fc(model, op_call, blob_in, blob_out, dim_in, dim_out, weight_init, bias_init, WeightInitializer,
                     BiasInitializer, enable_tensor_core, float16_compute, **kwargs):
    w_init = initializers.update_initializer(WeightInitializer, weight_init, ("XavierFill", {}))
    b_init = initializers.update_initializer(BiasInitializer, bias_init, ("ConstantFill", {}))
    if not model.init_params:
        w_init = b_init = initializers.ExternalInitializer()
    blob_out = blob_out or model.net.NextName()
    bias_tags = [ParameterTags.BIAS] + ([ParameterTags.COMPUTED_PARAM] if "freeze_bias" in kwargs else [])
    weight = model.create_param(blob_out + "_w", [dim_out, dim_in], w_init, ParameterTags.WEIGHT)
    bias = model.create_param(blob_out + "_b", [dim_out], b_init, bias_tags)
    if enable_tensor_core:
        kwargs["engine"] = "TENSORCORE"
    if float16_compute:
        kwargs["float16_compute"] = True
    return op_call([blob_in, weight, bias], blob_out, **kwargs)
