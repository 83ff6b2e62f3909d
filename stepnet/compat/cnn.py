"""Caffe2's cnn module: CNNModelHelper, the older model class whose layer methods (`model.Conv(...)`,
`model.FC(...)`) call the brew helpers with the model's storage order and cuDNN settings. Caffe2 deprecated it in
favour of ModelHelper with brew, and warns when one is made; so does stepnet.
"""
from __future__ import annotations

import logging

from ..io.proto import DeviceOption
from . import brew
from .model_helper import ModelHelper

log = logging.getLogger(__name__)

# method -> (brew helper, which of the model's settings it is given): "conv" order, use_cudnn,
# cudnn_exhaustive_search and ws_nbytes_limit; "order+cudnn", "order", "cudnn", or "" for none.
_METHODS = {
    "ImageInput": ("image_input", "order"), "VideoInput": ("video_input", ""),
    "ConvNd": ("conv_nd", "conv"), "Conv": ("conv", "conv"), "ConvTranspose": ("conv_transpose", "conv"),
    "GroupConv": ("group_conv", "conv"), "GroupConv_Deprecated": ("group_conv_deprecated", "conv"),
    "FC": ("fc", ""), "PackedFC": ("packed_fc", ""), "FC_Prune": ("fc_prune", ""), "FC_Decomp": ("fc_decomp", ""),
    "FC_Sparse": ("fc_sparse", ""), "Dropout": ("dropout", "order+cudnn"), "LRN": ("lrn", "order+cudnn"),
    "Softmax": ("softmax", "cudnn"), "SpatialBN": ("spatial_bn", "order"), "InstanceNorm": ("instance_norm", "order"),
    "Relu": ("relu", "order+cudnn"), "PRelu": ("prelu", ""), "Concat": ("concat", "order"), "Sum": ("sum", ""),
    "Transpose": ("transpose", "cudnn"), "Iter": ("iter", ""), "Accuracy": ("accuracy", ""),
    "MaxPool": ("max_pool", "order+cudnn"), "MaxPoolWithIndex": ("max_pool_with_index", "order"),
    "AveragePool": ("average_pool", "order+cudnn"),
}


def _layer(method: str, helper: str, settings: str):
    def call(self, *args, **kwargs):
        fn = getattr(brew, helper, None)
        if fn is None:
            raise AttributeError(f"CNNModelHelper.{method} calls brew.{helper}, which stepnet does not have")
        given = {}
        if settings in ("conv", "order", "order+cudnn"):
            given["order"] = self.order
        if settings in ("conv", "cudnn", "order+cudnn"):
            given["use_cudnn"] = self.use_cudnn
        if settings == "conv":
            given.update(cudnn_exhaustive_search=self.cudnn_exhaustive_search, ws_nbytes_limit=self.ws_nbytes_limit)
        return fn(self, *args, **given, **kwargs)
    call.__name__ = call.__qualname__ = method
    call.__doc__ = f"brew.{helper}(model, ...)" + (" with the model's settings" if settings else "")
    return call


class CNNModelHelper(ModelHelper):
    """ModelHelper with the storage order ("NCHW" or "NHWC") and cuDNN settings as its argument scope, and the
    layers as methods."""

    def __init__(self, order="NCHW", name=None, use_cudnn=True, cudnn_exhaustive_search=False,
                 ws_nbytes_limit=None, init_params=True, skip_sparse_optim=False, param_model=None):
        log.warning("[====DEPRECATE WARNING====]: you are creating an object from CNNModelHelper class which will "
                    "be deprecated soon. Please use ModelHelper object with brew module.")
        scope = {"order": order, "use_cudnn": use_cudnn, "cudnn_exhaustive_search": cudnn_exhaustive_search}
        if ws_nbytes_limit:
            scope["ws_nbytes_limit"] = ws_nbytes_limit
        super().__init__(skip_sparse_optim=skip_sparse_optim, name="CNN" if name is None else name,
                         init_params=init_params, param_model=param_model, arg_scope=scope)
        self.order = order
        self.use_cudnn = use_cudnn
        self.cudnn_exhaustive_search = cudnn_exhaustive_search
        self.ws_nbytes_limit = ws_nbytes_limit
        if order not in ("NHWC", "NCHW"):
            raise ValueError(f"Cannot understand the CNN storage order {order}.")

    def PadImage(self, blob_in, blob_out, **kwargs):
        self.net.PadImage(blob_in, blob_out, **kwargs)

    def DepthConcat(self, *args, **kwargs):
        """Concat (Caffe2 kept this older name, deprecated)."""
        log.warning("DepthConcat is deprecated. use Concat instead.")
        return self.Concat(*args, **kwargs)

    @property
    def XavierInit(self):
        return ("XavierFill", {})

    def ConstantInit(self, value):
        return ("ConstantFill", dict(value=value))

    @property
    def MSRAInit(self):
        return ("MSRAFill", {})

    @property
    def ZeroInit(self):
        return ("ConstantFill", {})

    def AddWeightDecay(self, weight_decay):
        return brew.add_weight_decay(self, weight_decay)

    @property
    def CPU(self):
        return DeviceOption(device_type=0)

    @property
    def GPU(self, gpu_id=0):
        return DeviceOption(device_type=1, device_id=gpu_id)


for _method, (_helper, _settings) in _METHODS.items():
    setattr(CNNModelHelper, _method, _layer(_method, _helper, _settings))
del _method, _helper, _settings
