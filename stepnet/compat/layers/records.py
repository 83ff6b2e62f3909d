"""Layers that rearrange records: Concat, Split, GatherRecord (rows of every field, nested lists included),
SelectRecordByContext (a different input per instantiation context) and PairwiseDotProduct."""
from __future__ import annotations

import logging

import numpy as np

from .. import core, schema
from .layers import InstantiationContext, ModelLayer

logger = logging.getLogger(__name__)


class Concat(ModelLayer):
    """Concatenate the Scalars of a Struct along `axis` (axis 0 is the batch; add_axis stacks them along a new
    axis instead)."""

    def __init__(self, model, input_record, axis=1, add_axis=0, name="concat", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        self.axis = axis
        self.add_axis = add_axis
        assert not (axis == 0 and add_axis == 1), "It's not allowed to add axis=0"
        assert isinstance(input_record, schema.Struct), \
            f"Incorrect input type. Excpected Struct, but received: {input_record}"
        shapes = []
        for field_name, field in input_record.fields.items():
            assert isinstance(field, schema.Scalar), \
                f"Incorrect input type for {field_name}. Excpected Scalar, but got: {field}"
            shape = list(field.field_type().shape)    # without the batch dimension: axis - 1 there
            if add_axis:
                shape.insert(axis - 1, 1)
            assert len(shape) >= axis, "Concat expects that limited dimensions of the input tensor"
            shapes.append(shape)
        logger.info("Concat Layer input shapes: %s", shapes)
        if axis == 0:
            self.output_schema = schema.from_blob_list(input_record[0], [self.get_next_blob_reference("output")])
            return
        concat_dim = 0
        for shape in shapes:
            concat_dim += shape[axis - 1]
            shape[axis - 1] = 0
            assert shape == shapes[0], f"Shapes {shape} and {shapes[0]} are not compatible for Concat"
        output_dims = shapes[0]
        output_dims[axis - 1] = concat_dim
        logger.info("Concat Layer output_dims: %s", output_dims)
        self.output_schema = schema.Scalar((np.float32, output_dims), self.get_next_blob_reference("output"))

    def add_ops(self, net):
        out = self.output_schema.field_blobs()[0]
        net.Concat(self.input_record.field_blobs(), [out, out + "_concat_dims"], axis=self.axis,
                   add_axis=self.add_axis)


class Split(ModelLayer):
    """Split a Scalar into num_splits equal parts along axis (axis 0 is the batch): a Tuple."""

    def __init__(self, model, input_record, num_splits, axis=1, name="split", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        self.axis = axis
        axis -= 1
        assert axis >= 0
        assert isinstance(input_record, schema.Scalar), \
            f"Incorrect input type. Excpected Scalar, but received: {input_record}"
        input_shape = input_record.field_type().shape
        assert len(input_shape) >= axis
        assert input_shape[axis] % num_splits == 0
        output_shape = list(input_shape)
        output_shape[axis] = int(output_shape[axis] / num_splits)
        base = input_record.field_type().base
        self.output_schema = schema.Tuple(*[
            schema.Scalar((base, output_shape), self.get_next_blob_reference(f"output_{i}"))
            for i in range(num_splits)])

    def add_ops(self, net):
        net.Split(self.input_record.field_blobs(), self.output_schema.field_blobs(), axis=self.axis)


class GatherRecord(ModelLayer):
    """The rows `indices` of every field of input_record.record: a list's values follow its lengths (nested
    lists too, through the summed lengths of the inner level)."""

    def __init__(self, model, input_record, name="gather_record", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert "indices" in input_record
        assert "record" in input_record
        self.output_schema = schema.NewRecord(model.net, input_record.record.clone_schema())
        self._indices = self.input_record.indices()

    def _gather_scalar(self, net, record, lengths_blob, output_record):
        if lengths_blob is None:
            net.Gather([record(), self._indices], output_record())
        else:
            net.LengthsGather([record(), lengths_blob, self._indices], output_record())

    def _gather_struct(self, net, record, lengths_blob, output_record):
        for name, field in record.get_children():
            self._dispatch(net, field, lengths_blob, output_record[name])

    def _gather_list(self, net, record, lengths_blob, output_record):
        self._gather_scalar(net, record.lengths, lengths_blob, output_record.lengths)
        if lengths_blob is None:
            lengths_blob = record.lengths()
        else:   # the inner lengths summed per outer row (LengthsSum on floats)
            name = str(record.lengths())
            as_float = net.Cast(record.lengths(), net.NextScopedBlob(name + "_float"), to=core.DataType.FLOAT)
            summed = net.LengthsSum([as_float, lengths_blob], net.NextScopedBlob(name + "_nested_float"))
            lengths_blob = net.Cast(summed, net.NextScopedBlob(name + "_nested"), to=core.DataType.INT32)
        self._dispatch(net, record._items, lengths_blob, output_record._items)

    def _dispatch(self, net, record, lengths_blob, output_record):
        if isinstance(record, schema.Scalar):
            self._gather_scalar(net, record, lengths_blob, output_record)
        elif isinstance(record, schema.Struct):
            self._gather_struct(net, record, lengths_blob, output_record)
        elif isinstance(record, schema.List):
            self._gather_list(net, record, lengths_blob, output_record)
        else:
            raise NotImplementedError(f"GatherRecord: unsupported field {record}")

    def add_ops(self, net):
        self._dispatch(net, self.input_record.record, None, self.output_schema)


class SelectRecordByContext(ModelLayer):
    """Output the field of input_record named after the instantiation context (prediction, eval, training,
    accumulate_pred; else default_output_record_field), through Alias (or Copy) onto fixed blobs."""

    def __init__(self, model, input_record, name="select_record_by_context", check_field_metas=True,
                 use_copy=False, default_output_record_field=None, **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert isinstance(input_record, schema.Struct)
        assert len(input_record) > 1
        self.use_copy = use_copy
        self.default_output_record = (input_record[default_output_record_field]
                                      if default_output_record_field is not None else None)
        ref_record = input_record[0]
        for record in input_record:
            assert schema.equal_schemas(record, ref_record, check_field_metas=check_field_metas)
        self.output_schema = schema.NewRecord(model.net, ref_record)

    def _set_output_blobs(self, net, context):
        record = self.input_record.get(context, self.default_output_record)
        assert record is not None, f"{context} context is not in input record without providing default output"
        for in_blob, out_blob in zip(record.field_blobs(), self.output_schema.field_blobs()):
            (net.Copy if self.use_copy else net.Alias)(in_blob, out_blob)

    def add_ops(self, net):
        self._set_output_blobs(net, InstantiationContext.PREDICTION)

    def add_eval_ops(self, net):
        self._set_output_blobs(net, InstantiationContext.EVAL)

    def add_train_ops(self, net):
        self._set_output_blobs(net, InstantiationContext.TRAINING)

    def add_ops_to_accumulate_pred(self, net):
        self._set_output_blobs(net, InstantiationContext.ACCUMULATE_PRED)


class PairwiseDotProduct(ModelLayer):
    """The dot products of every x embedding with every y embedding (all_embeddings: x = y), flattened, and
    then only the entries indices_to_gather names when given."""

    def __init__(self, model, input_record, output_dim, name="pairwise_dot_product", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        assert isinstance(input_record, schema.Struct), \
            f"Incorrect input type. Excpected Struct, but received: {input_record}"
        assert ("all_embeddings" in input_record) ^ (
            "x_embeddings" in input_record and "y_embeddings" in input_record), \
            "either (all_embeddings) xor (x_embeddings and y_embeddings) should be given."
        if "all_embeddings" in input_record:
            x_embeddings = y_embeddings = input_record["all_embeddings"]
        else:
            x_embeddings, y_embeddings = input_record["x_embeddings"], input_record["y_embeddings"]
        assert isinstance(x_embeddings, schema.Scalar), \
            f"Incorrect input type for x. Expected Scalar, but received: {x_embeddings}"
        assert isinstance(y_embeddings, schema.Scalar), \
            f"Incorrect input type for y. Expected Scalar, but received: {y_embeddings}"
        self.indices_to_gather = None
        if "indices_to_gather" in input_record:
            self.indices_to_gather = input_record["indices_to_gather"]
            assert isinstance(self.indices_to_gather, schema.Scalar), \
                f"Incorrect type of indices_to_gather. Expected Scalar, but received: {self.indices_to_gather}"
        self.x_embeddings = x_embeddings
        self.y_embeddings = y_embeddings
        dtype = x_embeddings.field_types()[0].base
        self.output_schema = schema.Scalar((dtype, (output_dim,)), self.get_next_blob_reference("output"))

    def add_ops(self, net):
        products = net.BatchMatMul([self.x_embeddings(), self.y_embeddings()],
                                   [self.x_embeddings() + "_matmul"], trans_b=1)
        if self.indices_to_gather:
            flattened = net.Flatten(products, products + "_flatten")
            net.BatchGather([flattened, self.indices_to_gather()], self.output_schema())
        else:
            net.Flatten(products, self.output_schema())
