"""Caffe2's text_file_reader module: TextFileReader, a dataio.Reader over the CreateTextFileReader and
TextFileReaderRead ops (stepnet/ops/text_reader.py): rows of tab-separated STRING or FLOAT fields."""
from __future__ import annotations

from . import core
from .dataio import Reader
from .schema import Scalar, Struct, data_type_for_dtype


class TextFileReader(Reader):
    """Reads batch_size rows at a time of filename, num_passes times over; schema: a Struct of Scalars (str or
    float32), one per column."""

    def __init__(self, init_net, filename, schema, num_passes=1, batch_size=1):
        if not isinstance(schema, Struct):
            raise TypeError("Schema must be a schema.Struct")
        for name, child in schema.get_children():
            if not isinstance(child, Scalar):
                raise TypeError(f"Only scalar fields are supported in TextFileReader; {name} is a "
                                f"{type(child).__name__}")
        super().__init__(schema)
        self._reader = init_net.CreateTextFileReader(
            [], filename=filename, num_passes=num_passes,
            field_types=[data_type_for_dtype(t) for t in schema.field_types()])
        self._batch_size = batch_size

    def read(self, net):
        """The read op (one blob per field) and should_stop: true when the batch came back empty."""
        blobs = net.TextFileReaderRead([self._reader], len(self.schema().field_names()),
                                       batch_size=self._batch_size)
        if isinstance(blobs, core.BlobReference):
            blobs = [blobs]
        should_stop = net.IsEmpty([blobs[0]], core.ScopedBlobReference(net.NextName("should_stop")))
        return should_stop, blobs
