"""Caffe2's dataset module: an in-memory dataset of a fixed schema, stored as one tensor per leaf field, with
readers (sequential and by indices) and a writer made of Caffe2's dataset ops: CreateTreeCursor, ReadNextBatch,
ReadRandomBatch, ResetCursor, ComputeOffset, SortAndShuffle, CheckDatasetConsistency, AtomicAppend (under a
CreateMutex lock) and TrimDataset; Const feeds a value as an external input of a net."""
from __future__ import annotations

import numpy as np

from . import core, workspace
from .dataio import Reader, Writer
from .schema import InitEmptyRecord, Struct, from_blob_list, from_column_list


class _DatasetReader(Reader):
    """Reads the dataset in order, batch_size top-level entries a read, through a tree cursor."""

    def __init__(self, dataset, name, batch_size=1, enforce_batch_size=False):
        super().__init__(dataset.content())
        self.dataset, self.name = dataset, name or dataset.name + "_cursor"
        self.batch_size, self.enforce_batch_size = batch_size, enforce_batch_size
        self.cursor = None

    def setup_ex(self, init_net, exit_net) -> None:
        if self.cursor is None:
            self.cursor = init_net.CreateTreeCursor([], init_net.NextScopedBlob(self.name),
                                                    fields=self.dataset.fields)

    def read(self, read_net):
        if self.cursor is None:
            raise AssertionError("setup not called: give reader() an init_net or call setup_ex")
        content = self.dataset.content()
        with core.NameScope(read_net.NextName(self.name)):
            fields = read_net.ReadNextBatch([self.cursor] + content.field_blobs(), content.field_names(),
                                            batch_size=self.batch_size, enforce_batch_size=self.enforce_batch_size)
            fields = [fields] if isinstance(fields, core.BlobReference) else list(fields)
            return read_net.IsEmpty([fields[0]]), fields

    def reset(self, net) -> None:
        net.ResetCursor([self.cursor], [])


class _DatasetRandomReader(Reader):
    """Reads the dataset's entries in the order of an indices blob (batch by batch, through offsets computed by
    computeoffset); loop_over starts over at the end."""

    def __init__(self, dataset, name, indices, batch_size=1, loop_over=False, enforce_batch_size=False):
        super().__init__(dataset.content())
        self.dataset, self.name, self.indices = dataset, name or dataset.name + "_cursor", indices
        self.batch_size, self.loop_over, self.enforce_batch_size = batch_size, loop_over, enforce_batch_size
        self.cursor = self.offsets = None

    def setup_ex(self, init_net, exit_net) -> None:
        if self.cursor is None:
            self.cursor = init_net.CreateTreeCursor([], [self.name], fields=self.dataset.fields)

    def reset(self, net) -> None:
        net.ResetCursor([self.cursor], [])

    def computeoffset(self, net) -> None:
        """Add to net the ops that reset the cursor and compute every entry's offsets (needed before reading)."""
        self.reset(net)
        self.offsets = net.ComputeOffset([self.cursor] + self.dataset.content().field_blobs(), "offsets")

    def sort_and_shuffle(self, net, sort_by_field=None, shuffle_size=1, batch_size=1) -> None:
        """Make the indices: the entries sorted by sort_by_field (a field name, or none), shuffled in chunks of
        batch_size * shuffle_size, the chunks shuffled."""
        content = self.dataset.content()
        index = -1
        if sort_by_field:
            if sort_by_field not in content.field_names():
                raise ValueError(f"Must be valid field: {sort_by_field!r} is not one of {content.field_names()}")
            index = content.field_names().index(sort_by_field)
        self.reset(net)
        self.indices = net.SortAndShuffle([self.cursor] + content.field_blobs(), "indices",
                                          sort_by_field_idx=index, shuffle_size=shuffle_size,
                                          batch_size=batch_size)

    def read(self, read_net):
        content = self.dataset.content()
        with core.NameScope(read_net.NextName(self.name)):
            fields = read_net.ReadRandomBatch([self.cursor, self.indices, self.offsets] + content.field_blobs(),
                                              content.field_names(), batch_size=self.batch_size,
                                              enforce_batch_size=self.enforce_batch_size, loop_over=self.loop_over)
            fields = [fields] if isinstance(fields, core.BlobReference) else list(fields)
            return read_net.IsEmpty([fields[0]]), fields


class _DatasetWriter(Writer):
    """Appends records to the dataset (checked against its schema), under a mutex made by setup_ex."""

    def __init__(self, content):
        self._content, self.mutex = content, None

    def setup_ex(self, init_net, exit_net) -> None:
        if self.mutex is None:
            self.mutex = init_net.CreateMutex([])

    def write(self, writer_net, fields) -> None:
        if self.mutex is None:
            raise AssertionError("setup not called: give writer() an init_net or call setup_ex")
        field_blobs = self._content.field_blobs()
        if len(fields) != len(field_blobs):
            raise ValueError(f"Expected {len(field_blobs)} fields, got {len(fields)}.")
        writer_net.CheckDatasetConsistency(fields, [], fields=self._content.field_names())
        writer_net.AtomicAppend([self.mutex] + field_blobs + list(fields), field_blobs)

    def commit(self, finish_net) -> None:
        """Nothing to do for an in-memory dataset."""


def Const(net, value, dtype=None, name=None):
    """A new external input of net (named after `name`) fed now, in the current workspace, with value."""
    if not isinstance(net, core.Net):
        raise TypeError("net must be a core.Net instance.")
    blob = net.AddExternalInput(net.NextName(prefix=name))
    workspace.FeedBlob(str(blob), np.array(value, dtype=dtype))
    return blob


def execution_step_with_progress(name, init_net, substeps, rows_read):
    """A step running substeps concurrently that prints rows_read every 5 seconds."""
    report_net = core.Net("report_net")
    report_net.Print([rows_read], [])
    return core.execution_step(name, substeps, report_net=report_net, concurrent_substeps=True,
                               report_interval=5)


class Dataset:
    """An in-memory dataset of schema `fields` (a schema.Struct, or a list of field names), one blob per leaf;
    init_empty or init_from_dataframe makes its blobs."""

    def __init__(self, fields, name=None):
        if not isinstance(fields, (list, Struct)):
            raise TypeError("fields must be either a Struct or a list of raw field names.")
        if isinstance(fields, list):
            fields = from_column_list(fields)
        self.schema = fields
        self.fields = fields.field_names()
        self.field_types = fields.field_types()
        self.name = name or "dataset"
        self.field_blobs = fields.field_blobs() if fields.has_blobs() else None

    def trim(self, net, multiple_of) -> None:
        """Add to net a TrimDataset dropping the last entries so that their number is a multiple of multiple_of."""
        net.TrimDataset(self.field_blobs, self.field_blobs, fields=self.fields, multiple_of=multiple_of)

    def init_empty(self, init_net) -> None:
        """init_net fills every field's blob with an empty tensor."""
        self.field_blobs = InitEmptyRecord(init_net, self.schema.clone_schema()).field_blobs()

    def init_from_dataframe(self, net, dataframe) -> None:
        """The fields' blobs fed now with the dataframe's columns, in order (external inputs of net)."""
        if len(self.fields) != len(dataframe.columns):
            raise ValueError(f"the dataframe has {len(dataframe.columns)} columns, the dataset {len(self.fields)} "
                             "fields")
        self.field_blobs = [Const(net, np.asarray(dataframe.iloc[:, col]).flatten(), name=field)
                            for col, field in enumerate(self.fields)]

    def _initialized(self) -> None:
        if not self.field_blobs:
            raise AssertionError("Dataset not initialized.")

    def get_blobs(self) -> list:
        return self.field_blobs

    def content(self):
        """The record of the dataset's blobs."""
        return from_blob_list(self.schema, self.field_blobs)

    def field_names(self) -> list:
        return self.fields

    def field_types(self) -> list:
        """The fields' dtypes (np.void for a field given by name only). As in Caffe2, the instance attribute of
        the same name set by __init__ (that list) hides this method: `dataset.field_types` is the list."""
        return self.__dict__["field_types"]

    def reader(self, init_net=None, cursor_name=None, batch_size=1, enforce_batch_size=False):
        """A reader in order (its cursor made by init_net when given, else by a later setup_ex)."""
        self._initialized()
        reader = _DatasetReader(self, cursor_name, batch_size, enforce_batch_size)
        if init_net is not None:
            reader.setup_ex(init_net, None)
        return reader

    def random_reader(self, init_net=None, indices=None, cursor_name=None, batch_size=1, loop_over=False,
                      enforce_batch_size=False):
        """A reader in the order of the indices blob (or of sort_and_shuffle's)."""
        self._initialized()
        reader = _DatasetRandomReader(self, cursor_name, indices, batch_size, loop_over, enforce_batch_size)
        if init_net is not None:
            reader.setup_ex(init_net, None)
        return reader

    def writer(self, init_net=None):
        """A writer appending to the dataset (its mutex made by init_net when given)."""
        self._initialized()
        writer = _DatasetWriter(self.content())
        if init_net is not None:
            writer.setup_ex(init_net, None)
        return writer
