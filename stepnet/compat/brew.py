"""Caffe2's brew: layer helpers called as `brew.fc(model, ...)`. Each call gets the model's arg_scope (filtered
to the helper's parameters unless it takes **kwargs), then what an enclosing `brew.arg_scope` sets for that
helper, then its own keywords.

The registry is Caffe2's HelperWrapper (its class attribute `_registry`, {name: helper}); `brew.Register`,
`brew.has_helper` and `brew.<helper>` go through the one wrapper of this module. Caffe2 put that wrapper in
sys.modules in place of the module; here the module stays a module (so `brew.HelperWrapper` is the class) and
each registered helper is also a function of the module.
"""
from __future__ import annotations

import copy
import functools
import inspect
import sys

from .helpers.algebra import batch_mat_mul, sum, transpose
from .helpers.arg_scope import arg_scope, get_current_scope
from .helpers.array_helpers import concat, depth_concat
from .helpers.control_ops import cond, loop
from .helpers.conv import conv, conv_nd, conv_transpose, group_conv, group_conv_deprecated
from .helpers.db_input import db_input
from .helpers.dropout import dropout
from .helpers.elementwise_linear import elementwise_linear
from .helpers.fc import fc, packed_fc
from .helpers.nonlinearity import prelu, relu, tanh
from .helpers.normalization import instance_norm, layer_norm, lrn, softmax, spatial_bn
from .helpers.pooling import average_pool, max_pool, max_pool_with_index
from .helpers.tools import image_input, video_input
from .helpers.train import accuracy, add_weight_decay, iter


def _scoped(name: str, func):
    """func called with the scopes (see the module docstring); arg_scope itself takes no model."""
    if name == "arg_scope":
        return func
    spec = inspect.getfullargspec(func)

    @functools.wraps(func)
    def helper(*args, **kwargs):
        model = args[0] if args else kwargs.get("model")
        if model is None or not hasattr(model, "arg_scope"):
            raise RuntimeError("The first input of helper function should be model. Or you can provide it in "
                               "kwargs as model=<your_model>.")
        new_kwargs = copy.deepcopy(model.arg_scope)
        if spec.varkw is None:
            new_kwargs = {k: v for k, v in new_kwargs.items() if k in spec.args}
        new_kwargs.update(get_current_scope().get(name, {}))
        new_kwargs.update(kwargs)
        return func(*args, **new_kwargs)
    helper.__name__ = name
    return helper


class HelperWrapper:
    """The helper registry over a module (`wrapped`): attribute `<name>` is the registered helper with the
    scopes applied; Register adds one, has_helper asks for one."""

    _registry: dict = {}

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def __getattr__(self, helper_name):
        if helper_name.startswith("__") or helper_name not in self._registry:
            raise AttributeError(f"Helper function {helper_name} not registered.")
        return _scoped(helper_name, self._registry[helper_name])

    def Register(self, helper) -> None:  # noqa: N802 - Caffe2's name
        """Add a helper of one's own (its name must be new): brew.<name>(model, ...) calls it with the scopes."""
        name = helper.__name__
        if name in self._registry:
            raise AttributeError(f"Helper {name} already exists. Please change your helper name.")
        self._registry[name] = helper
        if self.wrapped is not None:
            setattr(self.wrapped, name, _scoped(name, helper))

    def has_helper(self, helper_or_helper_name) -> bool:
        name = (helper_or_helper_name if isinstance(helper_or_helper_name, str)
                else helper_or_helper_name.__name__)
        return name in self._registry


_registry = HelperWrapper._registry   # (the same dict)
_wrapper = HelperWrapper(sys.modules[__name__])
Register = _wrapper.Register
has_helper = _wrapper.has_helper

for _helper in (arg_scope, fc, packed_fc, dropout, max_pool, average_pool, max_pool_with_index, lrn, softmax,
                instance_norm, spatial_bn, relu, prelu, tanh, concat, depth_concat, sum, transpose, iter, accuracy,
                conv, conv_nd, conv_transpose, group_conv, group_conv_deprecated, image_input, video_input,
                add_weight_decay, elementwise_linear, layer_norm, batch_mat_mul, cond, loop, db_input):
    Register(_helper)
del _helper
