"""Caffe2's ParameterInfo and ParameterTags: what a model knows of each parameter (blob, shape, gradient)."""
from __future__ import annotations

import numpy as np


class ParameterTags:
    BIAS = "BIAS"
    WEIGHT = "WEIGHT"
    COMPUTED_PARAM = "COMPUTED_PARAM"


class ParameterType:
    DENSE = "dense"
    SPARSE = "sparse"


class ParameterInfo:
    """A parameter blob, its shape and (after AddGradientOperators) its gradient."""

    def __init__(self, param_id, param, key=None, shape=None, length=None, grad=None, blob_copy=None):
        self.param_id = param_id
        self.name = str(param)
        self.blob = param
        self.key = key
        self.shape = shape
        self.size = None if shape is None else int(np.prod(shape))
        self.length = max(1, length if length is not None else 1)
        self.grad = grad
        self.blob_copy = blob_copy
        self._optimizer = None   # an optimizer of this parameter's own (OptimizerContext, layers)

    def grad_type(self):
        from ...ops.base import GradientSlice
        if self.grad is None:
            return None
        return ParameterType.SPARSE if isinstance(self.grad, GradientSlice) else ParameterType.DENSE

    @property
    def parameter(self):
        return self.blob

    @property
    def optimizer(self):
        """The optimizer of this parameter's own (None: the model's); it can be set once."""
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value) -> None:
        if self._optimizer is not None:
            raise AssertionError("optimizer has already been set")
        self._optimizer = value

    def __str__(self):
        return self.name
