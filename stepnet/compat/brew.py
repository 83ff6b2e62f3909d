"""Caffe2's brew: layer helpers called as `brew.fc(model, ...)`. Each call gets the model's arg_scope (filtered
to the helper's parameters unless it takes **kwargs), then what an enclosing `brew.arg_scope` sets for that
helper, then its own keywords."""
from __future__ import annotations

import copy
import functools
import inspect

from .helpers.algebra import batch_mat_mul, sum, transpose
from .helpers.arg_scope import arg_scope, get_current_scope
from .helpers.array_helpers import concat, depth_concat
from .helpers.control_ops import cond, loop
from .helpers.conv import conv, conv_nd, conv_transpose, group_conv
from .helpers.db_input import db_input
from .helpers.dropout import dropout
from .helpers.elementwise_linear import elementwise_linear
from .helpers.fc import fc
from .helpers.nonlinearity import prelu, relu, tanh
from .helpers.normalization import instance_norm, layer_norm, lrn, softmax, spatial_bn
from .helpers.pooling import average_pool, max_pool
from .helpers.tools import image_input, video_input
from .helpers.train import accuracy, add_weight_decay, iter

_registry: dict = {}


def _wrap(name: str, func):
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
    return helper


def Register(helper) -> None:
    """Add a helper of one's own (its name must be new): brew.<name>(model, ...) calls it with the scopes."""
    name = helper.__name__
    if name in _registry:
        raise AttributeError(f"Helper {name} already exists. Please change your helper name.")
    _registry[name] = helper
    globals()[name] = _wrap(name, helper)


def has_helper(helper_or_helper_name) -> bool:
    name = helper_or_helper_name if isinstance(helper_or_helper_name, str) else helper_or_helper_name.__name__
    return name in _registry


for _helper in (fc, dropout, max_pool, average_pool, lrn, softmax, instance_norm, spatial_bn, relu, prelu, tanh,
                concat, depth_concat, sum, transpose, iter, accuracy, conv, conv_nd, conv_transpose, group_conv,
                add_weight_decay, elementwise_linear, layer_norm, batch_mat_mul, db_input, cond, loop, image_input,
                video_input):
    Register(_helper)
_registry["arg_scope"] = arg_scope
del _helper
