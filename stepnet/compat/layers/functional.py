"""The Functional layer: any function adding ops from an input record to an output record (LayerModelHelper
wraps an operator into one: `model.Relu(record, 1)`). The outputs' types and shapes are inferred by running the
function's ops on inputs of the input record's types (stepnet's shape inference), unless output_dtypes gives
them."""
from __future__ import annotations

import logging

import numpy as np

from ... import caffe2_pb2
from ...core.errors import StepnetError
from ...core.spec import spec
from ...io.tensors import data_type_of
from ...passes.shapes import infer_net
from .. import core, schema, scope
from ..workspace import CAFFE2_SHAPES
from .layers import ModelLayer

logger = logging.getLogger(__name__)

_NUMPY_OF = {caffe2_pb2.TensorProto.DOUBLE: np.float64, caffe2_pb2.TensorProto.FLOAT: np.float32,
             caffe2_pb2.TensorProto.INT32: np.int32, caffe2_pb2.TensorProto.INT64: np.int64,
             caffe2_pb2.TensorProto.FLOAT16: np.float16}


class Functional(ModelLayer):
    """function(net, input_record, output_record, **kwargs) as a layer; output_names_or_num: the number of
    outputs (1: a Scalar, else a RawTuple), their names (a Struct), or a ready output Field."""

    def __init__(self, model, input_record, output_names_or_num, function, name="functional",
                 output_dtypes=None, **kwargs):
        input_record = schema.as_record(input_record)
        super().__init__(model, name, input_record, **kwargs)
        self._function = function
        self._kwargs = kwargs
        return_struct = isinstance(output_names_or_num, list) or (
            isinstance(output_names_or_num, int) and output_names_or_num != 1)
        with scope.NameScope(self.name, reset=True):
            if isinstance(output_names_or_num, int):
                struct_output = schema.NewRecord(model.net, schema.RawTuple(output_names_or_num))
            elif isinstance(output_names_or_num, schema.Field):
                self.output_schema = output_names_or_num.clone(keep_blobs=True)
                return
            else:
                names = output_names_or_num if isinstance(output_names_or_num, list) else [output_names_or_num]
                struct_output = schema.NewRecord(model.net, schema.Struct(*[(n, np.void) for n in names]))
        num_outputs = len(struct_output.field_blobs())
        self.output_schema = struct_output if return_struct else struct_output[0]
        if output_dtypes is not None:
            if not isinstance(output_dtypes, list):
                output_dtypes = [output_dtypes] * num_outputs
            assert len(output_dtypes) == num_outputs
            for dtype, scalar in zip(output_dtypes, self.output_schema.all_scalars()):
                scalar.set_type(dtype)
            return
        self._infer_output_types(input_record, num_outputs, return_struct)

    def _infer_output_types(self, input_record, num_outputs, return_struct) -> None:
        """Type the outputs by inferring the function's net from empty inputs (a batch of 0) of the input
        record's types, as Caffe2 does by filling them; an output that cannot be typed keeps np.void."""
        had_issues = False
        try:
            known = {}
            for dtype, blob in zip(input_record.field_types(), input_record.field_blobs()):
                schema.data_type_for_dtype(dtype)          # TypeError for a type a tensor cannot have
                known[str(blob)] = spec((0,) + tuple(dtype.shape), dtype.base)
            type_net = core.Net("_temp_type_and_shape_inference_net")
            self._function(type_net, self.input_record, self.output_schema, **self._kwargs)
            specs = infer_net(type_net.Proto(), known, shapes=CAFFE2_SHAPES)
            for i in range(num_outputs):
                scalar = self.output_schema[i] if return_struct else self.output_schema
                out = specs.get(str(scalar()))
                if out is None or out.shape is None or None in out.shape or out.dtype is None:
                    had_issues = True
                    continue
                if len(out.shape) > 0 and out.shape[0] != 0:   # the batch dimension is not first
                    logger.warning("unexpeced shape: %s", list(out.shape))
                    had_issues = True
                    continue
                base = _NUMPY_OF.get(data_type_of(out.dtype))
                if base is not None:
                    scalar.set_type((base, tuple(out.shape[1:])))
        except (TypeError, StepnetError) as ex:
            had_issues = True
            logger.warning(str(ex))
        if had_issues:
            logger.warning("Type inference had problems for layer: %s", self.name)

    def add_ops(self, net):
        self._function(net, self.input_record, self.output_schema, **self._kwargs)
