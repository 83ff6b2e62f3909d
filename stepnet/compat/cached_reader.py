"""Caffe2's cached_reader module: CachedReader, a reader whose data is read once from another reader and kept in
a db file (one blob per field of the schema, saved under the field's name); later readers with the same cache
path read the file and never touch their own source.

    reader = CachedReader(source_reader)
    session.run(reader.build_cache("/tmp/cache.db"))   # fills the file unless it exists
    ... pipe(reader, ...)                              # reads from the file, 100 records a batch
"""
from __future__ import annotations

import os

from . import core
from .dataio import Reader
from .dataset import Dataset
from .pipeline import pipe
from .task import Cluster, TaskGroup


class CachedReader(Reader):
    """A reader of `reader`'s records through a cache file of db_type; build_cache must run before setup_ex."""

    def __init__(self, reader, db_type="leveldb", name="cached_reader"):
        super().__init__(reader.schema())
        self.original_reader = reader
        self.cache_path = None
        self.ds_reader = None
        self.ds = Dataset(self._schema, name)
        self.db_type = db_type
        self.name = name
        self.field_names = self._schema.field_names()

    def setup_ex(self, init_net, finish_net) -> None:
        if not self.cache_path:
            raise AssertionError("build_cache must be called first")
        self._init_dataset(init_net)
        self._load_from_file(init_net)
        self.ds_reader = self.ds.reader(init_net, batch_size=100)

    def read(self, read_net):
        if not self.ds_reader:
            raise AssertionError("setup must be called first")
        return self.ds_reader.read(read_net)

    def has_cache(self) -> bool:
        return bool(self.cache_path and os.path.exists(self.cache_path))

    def build_cache(self, cache_path, overwrite=False):
        """A step that reads the whole source into the dataset and saves it to cache_path; an empty step when
        the file is there already (and overwrite is false)."""
        if not self.has_cache() or overwrite:
            self.cache_path = cache_path
        if self.has_cache() and not overwrite:
            return core.execution_step("build_step", [])
        init_net = core.Net("init")
        self._init_dataset(init_net)
        with Cluster(), core.NameScope(self.name), TaskGroup() as copy_tg:
            pipe(self.original_reader, self.ds.writer(), num_threads=16)
            copy_step = copy_tg.to_task().get_step()
        save_net = core.Net("save")
        self._save_to_file(save_net)
        return core.execution_step("build_cache", [init_net, copy_step, save_net])

    def _init_dataset(self, init_net) -> None:
        with core.NameScope(self.name):
            self.ds.init_empty(init_net)

    def _save_to_file(self, net) -> None:
        net.Save(self.ds.content().field_blobs(), [], db=self.cache_path, db_type=self.db_type,
                 blob_name_overrides=self.field_names, absolute_path=True)

    def _load_from_file(self, net) -> None:
        net.Load([], self.ds.content().field_blobs(), db=self.cache_path, db_type=self.db_type,
                 absolute_path=True, source_blob_names=self.field_names)
