"""Caffe2's layer tags: strings attached to a layer that decide in which nets it is instantiated (Tags) and the
scope-driven stack of tags new layers get (TagContext, entered with `with Tags(...)`)."""
from __future__ import annotations

import functools

from .. import context


@context.define_context(allow_default=True)
class TagContext:
    """The tags every layer created inside the current `with Tags(...)` blocks gets, in the order added."""

    def __init__(self, tags=None):
        self.tags = tags or []

    def add_tags(self, tags) -> None:
        self.tags.extend(tags)

    def remove_tags(self, tags) -> None:
        assert self.tags[-len(tags):] == tags, f"removing tags {tags} that were not the last added ({self.tags})"
        self.tags = self.tags[:-len(tags)]


class Tags:
    """Tag names, and a context manager / decorator adding tags to the layers created inside it."""

    EXCLUDE_FROM_TRAIN = "exclude_from_train"
    EXCLUDE_FROM_EVAL = "exclude_from_eval"
    EXCLUDE_FROM_PREDICTION = "exclude_from_prediction"
    EXCLUDE_FROM_ACCUMULATE_PRED = "exclude_from_accumulate_pred"
    PREPROCESSING = "preprocessing"
    HANDLE_AS_SPARSE_LAYER = "handle_as_sparse_layer"
    GRADIENT_FROM_PS = "gradient_from_ps"
    PREFER_GPU = "prefer_gpu"
    CPU_ONLY = "cpu_only"
    # hints to a distributed training framework: shard the layer's sparse parameter / keep them together /
    # place by component ('component:<name>')
    SPARSE_SHARDED = "sparse_sharded"
    SPARSE_DONT_SHARD = "sparse_dont_shard"
    COMPONENT = "component:"
    DT_TAGS = (SPARSE_SHARDED, SPARSE_DONT_SHARD, COMPONENT)
    # marks layers whose output overrides the schema predictors see
    PREDICTION_SCHEMA = "prediction_schema"

    def __init__(self, tags):
        self.tags = tags if isinstance(tags, list) else [tags]

    def __enter__(self):
        TagContext.current().add_tags(self.tags)
        return self

    def __exit__(self, exc_type, value, traceback):
        TagContext.current().remove_tags(self.tags)

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return wrapper


Tags.TRAIN_ONLY = [Tags.EXCLUDE_FROM_PREDICTION, Tags.EXCLUDE_FROM_EVAL, Tags.EXCLUDE_FROM_ACCUMULATE_PRED]
Tags.EVAL_ONLY = [Tags.EXCLUDE_FROM_PREDICTION, Tags.EXCLUDE_FROM_TRAIN, Tags.EXCLUDE_FROM_ACCUMULATE_PRED]
Tags.PREDICTION_ONLY = [Tags.EXCLUDE_FROM_TRAIN, Tags.EXCLUDE_FROM_EVAL, Tags.EXCLUDE_FROM_ACCUMULATE_PRED]
