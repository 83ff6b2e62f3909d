"""The schema records a compat Net carries (Caffe2's Net.set_input_record / input_record / set_output_record /
output_record / AppendOutputRecordField / recover_input_record_by_prefix / recover_output_record_by_prefix): the
input record's blobs become external inputs, the output record's external outputs; Clone(keep_schema=True) copies
them over the renamed blobs. (The field types and _schema_columns are used here: compat.schema imports the
workspace, which imports core.)"""
from __future__ import annotations

from . import scope
from ._schema_columns import from_blob_list, from_column_list
from ._schema_fields import Struct
from .blob_reference import BlobReference


def _record_by_prefix(names, prefix: str = ""):
    """The record whose columns are the names starting with prefix (the prefix cut off), each leaf the blob of
    its whole name; None when no name has the prefix."""
    columns = [name[len(prefix):] for name in names if name.startswith(prefix)]
    if not columns:
        return None
    return from_column_list(columns, col_blobs=[BlobReference(prefix + c) for c in columns])


class NetRecords:
    """Mixed into core.Net."""

    _input_record = None
    _output_record = None

    def set_input_record(self, input_record):
        """Use input_record (a schema record) as the net's input; one without blobs gets new blobs of the net
        (in the net's name scope)."""
        assert self._input_record is None or (
            input_record.has_blobs()
            and set(input_record.field_blobs()) == set(self._input_record.field_blobs())), \
            "Input schema cannot be reset"
        if not input_record.has_blobs():
            record = input_record.clone_schema()
            with scope.NameScope(self.Name()):
                for scalar, name in zip(record.all_scalars(), record.field_names()):
                    scalar.set_value(self.NextScopedBlob(name or "unnamed_scalar"), unsafe=True)
            self._input_record = record
        else:
            self._input_record = input_record
            self._add_external(input_record.field_blobs(), self.Proto().external_input, self.AddExternalInput)
        return self._input_record

    @staticmethod
    def _add_external(blobs, existing, add) -> None:
        known = set(existing)
        for blob in blobs:
            if str(blob) not in known:
                add(blob)
                known.add(str(blob))

    def set_output_record(self, record) -> None:
        """Use record as the net's output: each blob must be defined by the net; they become external outputs."""
        assert self._output_record is None or (
            record.has_blobs() and set(record.field_blobs()) == set(self._output_record.field_blobs())), \
            "Output schema cannot be reset"
        for blob in record.field_blobs():
            assert self.BlobIsDefined(blob), f"{blob} is not defined"
        self._add_external(record.field_blobs(), self.Proto().external_output, self.AddExternalOutput)
        self._output_record = record

    def AppendOutputRecordField(self, field_name, record) -> None:
        assert self._output_record is not None, "Tried to append to missing output record"
        for blob in record.field_blobs():
            assert self.BlobIsDefined(blob), f"{blob} is not defined"
        self._add_external(record.field_blobs(), self.Proto().external_output, self.AddExternalOutput)
        self._output_record = self._output_record + Struct((field_name, record))

    def recover_input_record_by_prefix(self, prefix) -> None:
        """Set the input record to the one whose columns are the external inputs named `prefix<column>`
        (nothing when none is)."""
        record = _record_by_prefix(self.Proto().external_input, prefix)
        if record:
            self.set_input_record(record)

    def recover_output_record_by_prefix(self, prefix) -> None:
        """Set the output record to the one whose columns are the external outputs named `prefix<column>`
        (nothing when none is)."""
        record = _record_by_prefix(self.Proto().external_output, prefix)
        if record:
            self.set_output_record(record)

    def _copy_records_to(self, net, blob_remap: dict) -> None:
        """Give `net` (a clone of this net) this net's records over the renamed blobs (Clone's keep_schema)."""
        for attr in ("_input_record", "_output_record"):
            record = getattr(self, attr)
            if record:
                blobs = [BlobReference(blob_remap.get(str(b), str(b)), net) for b in record.field_blobs()]
                setattr(net, attr, from_blob_list(record, blobs))

    def input_record(self):
        return self._input_record

    def output_record(self):
        return self._output_record

    def has_input_record(self) -> bool:
        return self._input_record is not None

    def has_output_record(self) -> bool:
        return self._output_record is not None
