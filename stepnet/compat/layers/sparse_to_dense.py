"""FeatureSparseToDense: sparse features keyed by feature id (FLOAT, ID_LIST, ID_SCORE_LIST, EMBEDDING) laid
out densely in the order of their FeatureSpec's feature_ids (SparseToDenseMask)."""
from __future__ import annotations

import numpy as np

from .. import schema
from .layers import ModelLayer

# per feature type: the output fields after 'ranges', as (name, dtype)
_RANGED_FIELDS = {"ID_LIST": (("values", np.int64),), "ID_SCORE_LIST": (("ids", np.int64), ("scores", np.float32)),
                  "EMBEDDING": (("values", np.float32),)}


class FeatureSparseToDense(ModelLayer):
    """input_specs: (field, FeatureSpec) pairs. A FLOAT field becomes a dense (len(feature_ids),) vector (0
    where absent); a list-valued one a (len(feature_ids), 2) ranges tensor into its values (aliased)."""

    def __init__(self, model, input_record, input_specs, name="feature_sparse_to_dense", **kwargs):
        super().__init__(model, name, input_record, **kwargs)
        self.input_specs = input_specs
        outputs = []
        for field, specs in self.input_specs:
            assert len(specs.feature_names) == len(specs.feature_ids)
            n = len(specs.feature_ids)
            if specs.feature_type == "FLOAT":
                outputs.append((field, schema.Scalar((np.float32, (n, )),
                                                     self.get_next_blob_reference(field + "_output"))))
            elif specs.feature_type in _RANGED_FIELDS:
                ranges = schema.Scalar((np.int32, (n, 2)), self.get_next_blob_reference(field + "_ranges"))
                fields = [("ranges", ranges)]
                fields += [(sub, schema.Scalar(dtype, self.get_next_blob_reference(f"{field}_{sub}")))
                           for sub, dtype in _RANGED_FIELDS[specs.feature_type]]
                outputs.append((field, schema.Struct(*fields)))
            else:
                raise TypeError(f"Unsupported input type: {specs.feature_type}")
        self.output_schema = schema.Struct(*outputs)
        for field, specs in input_specs:
            schema.attach_metadata_to_scalars(self.output_schema[field], schema.Metadata(feature_specs=specs))
        self.zero = model.global_constants["ZERO"]
        self.zero_range = model.global_constants["ZERO_RANGE"]

    def add_ops(self, net):
        record = self.input_record
        ranges_name = {"ID_LIST": "id_list_ranges", "ID_SCORE_LIST": "id_score_list_ranges",
                       "EMBEDDING": "embeddings_ranges"}
        for field, specs in self.input_specs:
            inp, out = record[field], self.output_schema[field]
            if specs.feature_type == "FLOAT":
                net.SparseToDenseMask([inp.keys(), inp.values(), self.zero, inp.lengths()], [out()],
                                      mask=specs.feature_ids)
                continue
            if specs.feature_type not in ranges_name:
                continue
            ranges = net.LengthsToRanges(inp.values.lengths(), net.NextScopedBlob(ranges_name[specs.feature_type]))
            net.SparseToDenseMask([inp.keys(), ranges, self.zero_range, inp.lengths()], out.ranges(),
                                  mask=specs.feature_ids)
            if specs.feature_type == "ID_SCORE_LIST":
                net.Alias(inp.values.keys(), out.ids())
                net.Alias(inp.values.values(), out.scores())
            else:
                net.Alias(inp.values.items(), out.values())

    def get_metadata(self) -> list:
        """Per field: ({type, names, ids[, cardinality]}, its output blobs, their types)."""
        metadata = []
        for field, specs in self.input_specs:
            info = {"type": specs.feature_type, "names": specs.feature_names, "ids": specs.feature_ids}
            if specs.feature_type == "FLOAT":
                info["cardinality"] = 1
            out = self.output_schema[field]
            metadata.append((info, out.field_blobs(), out.field_types()))
        return metadata
