"""Caffe2's parameter initializers: an Initializer puts one fill op (its operator and arguments) for a parameter in
the init net; an ExternalInitializer puts none (the parameter is fed)."""
from __future__ import annotations

from ...io.proto import TensorProto
from .parameter_info import ParameterInfo


class Initializer:
    """Creates a parameter with `operator_name(shape=..., **kwargs)` in the init net."""

    def __init__(self, operator_name=None, **kwargs):
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def update(self, operator_name, kwargs) -> None:
        if self.operator_name is not None:
            raise ValueError("Operator name overwrites are not allowed")
        self.operator_name, self.operator_kwargs = operator_name, kwargs

    def create_param(self, param_name, init_net, shape) -> ParameterInfo:
        param = getattr(init_net, self.operator_name)([], param_name, shape=shape, **self.operator_kwargs)
        return ParameterInfo(param_id=None, param=param, shape=shape)


class PseudoFP16Initializer(Initializer):
    """A float16 parameter computed with, stored and optimized as float32 (mixed precision, arXiv:1710.03740): the
    fill makes `<param>_fp32`, FloatToHalf the parameter; blob_copy[FLOAT] is the float32 master copy, which
    MultiPrecisionSgdOptimizer updates."""

    def create_param(self, param_name, init_net, shape) -> ParameterInfo:
        master = getattr(init_net, self.operator_name)([], param_name + "_fp32", shape=shape, **self.operator_kwargs)
        param = init_net.FloatToHalf(master, param_name)
        return ParameterInfo(param_id=None, param=param, shape=shape, blob_copy={TensorProto.FLOAT: master})


class ReversePseudoFP16Initializer(Initializer):
    """PseudoFP16Initializer the other way round: the parameter is the float32 blob, blob_copy[FLOAT16] its
    float16 copy `<param>_fp16`."""

    def create_param(self, param_name, init_net, shape) -> ParameterInfo:
        param = getattr(init_net, self.operator_name)([], param_name, shape=shape, **self.operator_kwargs)
        half = init_net.FloatToHalf(param, param_name + "_fp16")
        return ParameterInfo(param_id=None, param=param, shape=shape, blob_copy={TensorProto.FLOAT16: half})


class ExternalInitializer:
    """No init op: the parameter blob is expected in the workspace when the init net runs."""

    def create_param(self, param_name, init_net, shape) -> ParameterInfo:
        from ..core import BlobReference, ScopedBlobReference
        param = (BlobReference(str(param_name), init_net) if isinstance(param_name, BlobReference)
                 else ScopedBlobReference(param_name, init_net))
        return ParameterInfo(param_id=None, param=param, shape=shape)


def update_initializer(initializer_class, operator_name_and_kwargs, default_operator_name_and_kwargs):
    """An Initializer (of initializer_class, default Initializer) for (operator, kwargs), else for the default."""
    chosen = operator_name_and_kwargs or default_operator_name_and_kwargs
    name, kwargs = chosen[0], chosen[1]     # as Caffe2 reads it: anything after the kwargs is ignored
    return (initializer_class or Initializer)(name, **kwargs)
