"""Caffe2's seq2seq_model_helper: the ModelHelper the seq2seq programs build on."""
from __future__ import annotations

from ... import scope
from ...model_helper import ModelHelper


class Seq2SeqModelHelper(ModelHelper):
    """A ModelHelper with the NHWC argument scope (cuDNN flags from the keywords use_cudnn,
    cudnn_exhaustive_search, ws_nbytes_limit) and a list of parameters that are not trained: AddParam(...,
    trainable=False) blobs, saved and loaded with the others (GetAllParams) but never given a gradient."""

    def __init__(self, init_params=True, **kwargs):
        arg_scope = {"use_cudnn": kwargs.pop("use_cudnn", True),
                     "cudnn_exhaustive_search": kwargs.pop("cudnn_exhaustive_search", False), "order": "NHWC"}
        limit = kwargs.pop("ws_nbytes_limit", None)
        if limit:
            arg_scope["ws_nbytes_limit"] = limit
        super().__init__(init_params=init_params, arg_scope=arg_scope, **kwargs)
        self.non_trainable_params = []

    def AddParam(self, name, init=None, init_value=None, trainable=True):
        """The parameter `name`: made by init, an (operator type, keyword arguments) pair run in param_init_net,
        or by init_value (an int, float or str: a ConstantFill of shape [1]); an external input of net when the
        model does not initialize its parameters. trainable=False keeps it out of `params`."""
        if init_value is not None:
            if init is not None:
                raise ValueError(f"AddParam {name!r}: give init or init_value, not both")
            if type(init_value) not in (int, float, str):
                raise TypeError(f"AddParam {name!r}: init_value must be an int, float or str, "
                                f"got {type(init_value).__name__}")
            init = ("ConstantFill", {"shape": [1], "value": init_value})
        if self.init_params:
            if init is None:
                raise ValueError(f"AddParam {name!r}: give init or init_value to initialize it")
            op_type, kwargs = init
            param = getattr(self.param_init_net, op_type)([], name, **kwargs)
        else:
            param = self.net.AddExternalInput(name)
        (self.params if trainable else self.non_trainable_params).append(param)
        return param

    def GetNonTrainableParams(self, namescope=None):
        """The parameters added with trainable=False in namescope (default: the current name scope; '' is all)."""
        if namescope is None:
            namescope = scope.CurrentNameScope()
        elif not namescope.endswith(scope._NAMESCOPE_SEPARATOR):
            namescope += scope._NAMESCOPE_SEPARATOR
        if namescope == "":
            return list(self.non_trainable_params)
        return [p for p in self.non_trainable_params if p.GetNameScope() == namescope]

    def GetAllParams(self, namescope=None):
        """Trained, computed and non-trainable parameters, in that order."""
        return (self.GetParams(namescope) + self.GetComputedParams(namescope)
                + self.GetNonTrainableParams(namescope))
